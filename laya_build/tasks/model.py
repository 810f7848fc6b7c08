"""Model stage tasks: model -> export -> aoti_package -> verify, latency.

Each stage runs in a child forked from the pre-imported fork server (:mod:`laya_build.runner`);
what initialises CUDA or compiles, verifies or times a package runs in a fresh interpreter the
stage starts for it (:mod:`laya_build.stages.children`; a CUDA export:
:func:`laya_build.stages.export.run_export`), only once the stage knows it will run (a skip is
decided in the forked child).  One folder per (target, dtype) build (per target for
``latency``, which measures every package of a target in one process), emptied before the
stage writes into it.
"""
from __future__ import annotations

import json

from laya_build import config as config_mod
from laya_build import release, runner
from laya_build.layout import build_name
from laya_build.log import get_logger
from laya_build.tasks.common import reported, stage_env, stage_task

log = get_logger(__name__)


def model_builds(p) -> list[tuple[str, str]]:
    """(target, dtype) of every package the config asks for."""
    return config_mod.model_builds(p.data)


def verify_spec(p, cfg: dict, runtime_cfg: dict, target: str, dtype: str) -> dict:
    """run_verify's arguments for one build of ``p``'s version folder."""
    v = p.layout
    return {"verify_cfg": cfg, "runtime_cfg": runtime_cfg,
            "package_record_path": str(v.build_record("aoti_package", target, dtype)),
            "inputs_path": str(v.inputs), "eager_path": str(v.eager(target, dtype))}


def model_tasks(p):
    """The decision-model checkpoint (generated from a seed, or a local one) and inputs.pt."""
    v = p.layout
    cfg = p.section("model")
    local = cfg.get("path")
    # a local checkpoint: every file of its folder (weights, configs, tokenizer) is an input
    inputs = sorted(f.resolve() for f in (p.root / local).rglob("*") if f.is_file()) if local else []
    yield {"name": None, "doc": "decision-model checkpoint and the saved, tokenised inputs"}
    yield stage_task(p, basename="model", name="build", doc="checkpoint (generated or local) + inputs.pt",
                     module="laya_build.stages.model", function="run_model",
                     spec={"model_cfg": cfg, "out_dir": str(v.model_dir)}, kwargs=True, label="model",
                     record=v.model_record, dirs=[v.model_dir], inputs=inputs, fork=True,
                     schemas=("model", "model_sections"), config={"model": cfg})


def _build_task(p, stage: str, module: str, function: str, target: str, dtype: str | None, spec: dict, *,
                config_key: str, doc: str, inputs, schemas, always: bool = False, config: dict | None = None) -> dict:
    """One model-stage sub-task for a (target, dtype) build, or for a whole target (``dtype``
    None: a stage of :data:`laya_build.layout.TARGET_STAGES`): its record is ``<stage>.json``
    in ``artifacts/<version>/<stage>/<target>-<dtype>/`` (``<stage>/<target>/``); long, so its
    progress lines are shown.  ``config``: further keys of its up-to-date check."""
    out = p.layout.build_dir(stage, target, dtype)
    name = build_name(target, dtype)
    return stage_task(p, basename=stage, name=name, doc=f"{doc} ({', '.join(filter(None, (target, dtype)))})",
                      module=f"laya_build.stages.{module}", function=function,
                      spec={**spec, "out_dir": str(out)}, kwargs=True, label=f"{stage} {name}",
                      record=p.layout.build_record(stage, target, dtype), dirs=[out], inputs=inputs,
                      schemas=(stage, *schemas, "model_sections"),
                      config={config_key: spec[config_key], "target": target,
                              **({"dtype": dtype} if dtype is not None else {}),
                              **({"runtime": spec["runtime_cfg"]} if "runtime_cfg" in spec else {}),
                              **(config or {})},
                      always=always, verbosity=2, fork=True)


def export_tasks(p):
    """torch.export of the decision model per target x dtype, and eager.pt."""
    v = p.layout
    cfg = p.section("export")
    for target, dtype in model_builds(p):
        spec = {"export_cfg": cfg, "checkpoint_dir": str(v.checkpoint_dir), "inputs_path": str(v.inputs),
                "target": target, "dtype": dtype}
        yield _build_task(p, "export", "export", "run_export", target, dtype, spec, config_key="export_cfg",
                          doc="torch.export of the decision model", inputs=[v.model_record, v.inputs],
                          schemas=("model",))


def aoti_package_tasks(p):
    """AOTInductor .pt2 package per target x dtype (explicit skip record where unsupported)."""
    v = p.layout
    cfg = p.section("package")
    for target, dtype in model_builds(p):
        spec = {"package_cfg": cfg, "export_dir": str(v.build_dir("export", target, dtype)), "target": target}
        yield _build_task(p, "aoti_package", "package", "run_package", target, dtype, spec,
                          config_key="package_cfg", doc="AOTInductor package",
                          inputs=[v.build_record("export", target, dtype)], schemas=("export",))


def verify_tasks(p):
    """Each package, alone, in a fresh process: sha256 first, then parity with eager.pt.

    Never answered from doit's cache: the package's bytes are checked every time verify is
    asked for.  For a released version: every file against the manifest first, then the
    same verification of each package with the release's own configuration; results go to
    ``artifacts/verifications/<version>/`` (a release is never written to).  A damaged
    release (release files, no manifest) is refused."""
    kind = release.state(p.version_dir)
    if kind == "released":
        yield _verify_release_task(p)
        return
    if kind == "damaged":
        message = f"verify {p.version}: {release.damaged_message(p.version_dir)}"
        yield {"name": "release", "doc": f"verify version {p.version} (damaged release)",
               "actions": [lambda: _failed(message)], "uptodate": [False]}
        return
    v = p.layout
    cfg = p.section("verify")
    for target, dtype in model_builds(p):
        spec = verify_spec(p, cfg, p.section("runtime"), target, dtype)
        yield _build_task(p, "verify", "verify", "run_verify", target, dtype, spec, config_key="verify_cfg",
                          doc="fresh-process verification of the package", always=True,
                          inputs=[spec["package_record_path"], v.inputs], schemas=("aoti_package", "export"))


def _failed(message: str):
    from doit.exceptions import TaskFailed

    return TaskFailed(message)


def _verify_release_task(p) -> dict:
    vdir, out_root = p.version_dir, p.artifacts.verifications(p.version)

    @reported(f"verify {p.version}: ")
    def act():
        manifest = release.check_files(vdir)
        log.info(f"verify {p.version}: {manifest['totals']['files']} files match {release.MANIFEST}")
        config = json.loads((vdir / manifest["pipeline"]["effective"]).read_text())
        packages = sorted(f["path"] for f in manifest["files"] if f["path"].endswith("/aoti_package.json"))
        for rel in packages:
            build = rel.split("/")[1]
            target, dtype = build.split("-", 1)
            spec = {**verify_spec(p, config.get("verify", {}), config.get("runtime", {}), target, dtype),
                    "out_dir": str(out_root / build)}
            runner.run("laya_build.stages.verify", "run_verify", spec, label=f"verify {p.version} {build}",
                        env=stage_env(p), kwargs=True, fork=True, task="verify:release")
            result = json.loads((out_root / build / "verify.json").read_text())
            log.info(f"verify {p.version} {build}: {result['status']}"
                  + (f" ({result['reason']})" if result["status"] == "skipped" else ""))
        return None

    return {"name": "release", "doc": f"verify released version {p.version}: manifest, then every package",
            "actions": [act], "uptodate": [False], "verbosity": 2}


def builds_by_target(p) -> dict[str, list[str]]:
    """target -> the dtypes of its packages, in the config's order."""
    out: dict[str, list[str]] = {}
    for target, dtype in model_builds(p):
        out.setdefault(target, []).append(dtype)
    return out


def latency_tasks(p):
    """Per target: the eager (and, on cuda by default, torch.compile) variants once, then every
    package of the target (and each behind the runtime's runner), on the saved inputs."""
    v = p.layout
    cfg = p.section("latency")
    for target, dtypes in builds_by_target(p).items():
        packages = [v.build_record("aoti_package", target, dtype) for dtype in dtypes]
        spec = {"latency_cfg": cfg, "runtime_cfg": p.section("runtime"), "checkpoint_dir": str(v.checkpoint_dir),
                "inputs_path": str(v.inputs), "package_record_paths": [str(r) for r in packages], "target": target}
        yield _build_task(p, "latency", "latency", "run_latency", target, None, spec, config_key="latency_cfg",
                          doc="latency table of the target's packages", inputs=[*packages, v.model_record],
                          schemas=("aoti_package", "model"), config={"dtypes": dtypes})
