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

from laya_build import config as config_mod
from laya_build import release
from laya_build.errors import ManifestMismatch
from laya_build.layout import build_name, record_name
from laya_build.native import CUDA_SOURCE as NATIVE_CUDA_SOURCE
from laya_build.native import SOURCE as NATIVE_SOURCE
from laya_build.native import cutlass_identity as native_cutlass_identity
from laya_build.stage import Stage
from laya_build.stages.common import verify_spec
from laya_build.tasks.build import doit_task, failure, stage_env, version_stage


def model_builds(p) -> list[tuple[str, str]]:
    """(target, dtype) of every package the config asks for."""
    return config_mod.model_builds(p.data)


def model_tasks(p):
    """The decision-model checkpoint (generated from a seed, or a local one) and inputs.pt."""
    v = p.layout
    cfg = p.data["model"]
    local = cfg.get("path")
    # a local checkpoint: every file of its folder (weights, configs, tokenizer) is an input
    inputs = tuple(sorted(f.resolve() for f in (p.root / local).rglob("*") if f.is_file())) if local else ()
    yield {"name": None, "doc": "decision-model checkpoint and the saved, tokenised inputs"}
    yield doit_task(
        p,
        version_stage(
            p,
            "model",
            "build",
            doc="checkpoint (generated or local) + inputs.pt",
            entry="laya_build.stages.model:run_model",
            spec={"model_cfg": cfg, "out_dir": str(v.model_dir)},
            record=v.model_record,
            dirs=(v.model_dir,),
            inputs=inputs,
            schemas=("model", "model_sections"),
            config={"model": cfg},
        ),
    )


def _build_stage(
    p,
    stage: str,
    target: str,
    dtype: str | None,
    spec: dict,
    *,
    config_key: str,
    doc: str,
    inputs,
    schemas,
    always: bool = False,
    config: dict | None = None,
    process: str = "fork",
    tools: tuple[str, ...] = (),
) -> Stage:
    """One model-stage sub-task for a (target, dtype) build, or for a whole target (``dtype``
    None: a stage of :data:`laya_build.layout.TARGET_STAGES`): its record is ``<stage>.json``
    in ``artifacts/<version>/<stage>/<target>-<dtype>/`` (``<stage>/<target>/``); long, so its
    progress lines are shown.  ``config``: further keys of its up-to-date check; ``tools``:
    compilers it runs beyond its module's ``TOOLS``."""
    out = p.layout.build_dir(stage, target, dtype)
    module = {"aoti_package": "package"}.get(stage, stage)
    return version_stage(
        p,
        stage,
        build_name(target, dtype),
        doc=f"{doc} ({', '.join(filter(None, (target, dtype)))})",
        entry=f"laya_build.stages.{module}:run_{module}",
        spec={**spec, "out_dir": str(out)},
        record=p.layout.build_record(stage, target, dtype),
        dirs=(out,),
        inputs=tuple(inputs),
        schemas=(stage, *schemas, "model_sections"),
        config={
            config_key: spec[config_key],
            "target": target,
            **({"dtype": dtype} if dtype is not None else {}),
            **({"runtime": spec["runtime_cfg"]} if "runtime_cfg" in spec else {}),
            **(config or {}),
        },
        always=always,
        verbose=True,
        tools=tools,
        process=process,
    )


def export_tasks(p):
    """torch.export of the decision model per target x dtype, and eager.pt."""
    v = p.layout
    for target, dtype in model_builds(p):
        spec = {
            "export_cfg": p.data["export"],
            "checkpoint_dir": str(v.checkpoint_dir),
            "inputs_path": str(v.inputs),
            "target": target,
            "dtype": dtype,
            "root": str(p.root),
        }
        export = p.data["export"]
        geglu = bool(export["native_geglu"].get(target))
        native = [NATIVE_SOURCE] if export["native_linears"].get(target) or geglu else []
        cuda_kernels = target == "cuda" and (geglu or bool(export["native_cutlass"].get(target)))  # by nvcc
        native += [NATIVE_CUDA_SOURCE] if cuda_kernels else []
        algorithms = export["native_algorithms"].get(build_name(target, dtype))
        yield doit_task(
            p,
            _build_stage(
                p,
                "export",
                target,
                dtype,
                spec,
                config_key="export_cfg",
                doc="torch.export of the decision model",
                inputs=[v.model_record, v.inputs, *native, *([p.root / algorithms] if algorithms else [])],
                tools=("cxx", *(("nvcc",) if cuda_kernels else ())) if native else (),  # the native library's compilers
                config={"cutlass": native_cutlass_identity()} if cuda_kernels else None,  # the headers of its kernels
                schemas=("model",),
            ),
        )


def aoti_package_tasks(p):
    """AOTInductor .pt2 package per target x dtype (explicit skip record where unsupported)."""
    v = p.layout
    for target, dtype in model_builds(p):
        spec = {
            "package_cfg": p.data["package"],
            "export_dir": str(v.build_dir("export", target, dtype)),
            "target": target,
            "root": str(p.root),
        }
        tuning = p.data["package"]["tuning"].get(build_name(target, dtype))
        yield doit_task(
            p,
            _build_stage(
                p,
                "aoti_package",
                target,
                dtype,
                spec,
                config_key="package_cfg",
                doc="AOTInductor package",
                inputs=[v.build_record("export", target, dtype), *([p.root / tuning] if tuning else [])],
                schemas=("export",),
            ),
        )


# A verification's own process only starts the fresh verification process and reads its result
# (no torch): it runs in doit's process, so that a build whose other stages are all up to date or
# fetched from the cache starts no fork server for it.
VERIFY_PROCESS = "inline"


def verify_tasks(p):
    """Each package, alone, in a fresh process: sha256 first, then parity with eager.pt.

    Never answered from doit's cache: the package's bytes are checked every time verify is
    asked for.  For a released version (or a release folder given as ``release=``): every file
    against the manifest first (``verify:manifest``), then the same verification of each
    package with the release's own configuration; results go to
    ``artifacts/verifications/<version>/`` (a release is never written to).  A damaged release
    (release files, no manifest) is refused."""
    kind = release.state(p.verify_dir)
    if kind in ("released", "damaged") or p.release_folder is not None:
        yield from _release_verify_tasks(p)
        return
    v = p.layout
    for target, dtype in model_builds(p):
        spec = verify_spec(v, p.data["verify"], p.data["runtime"], target, dtype)
        yield doit_task(
            p,
            _build_stage(
                p,
                "verify",
                target,
                dtype,
                spec,
                config_key="verify_cfg",
                doc="fresh-process verification of the package",
                always=True,
                process=VERIFY_PROCESS,
                inputs=[spec["package_record_path"], v.inputs],
                schemas=("aoti_package", "export"),
            ),
        )


def missing_packages(p, version_dir, builds: set[str] | None = None) -> dict[str, str]:
    """The builds of ``p`` (or those of them named ``<target>-<dtype>`` in ``builds``) whose
    package record a version folder lacks: build name -> the record's relative path."""
    from laya_build.layout import VersionLayout

    layout = VersionLayout(version_dir)
    return {
        f"{t}-{d}": layout.rel(r)
        for t, d in model_builds(p)
        if (builds is None or f"{t}-{d}" in builds) and not (r := layout.build_record("aoti_package", t, d)).is_file()
    }


def check_verifiable(p, selected: list[str]) -> None:
    """When only ``verify`` is asked for: the version must be a release or a complete build;
    ``verify:<build>`` alone needs only that build's package (``verify`` never builds;
    :mod:`laya_build.tasks.run`)."""
    from laya_build.errors import UsageError
    from laya_build.tasks.run import only

    if not only(selected, "verify") or p.release_folder is not None:
        return
    if release.state(p.version_dir) in ("released", "damaged"):
        return
    asked = None if "verify" in selected else {name.split(":", 1)[1] for name in selected}
    missing = missing_packages(p, p.version_dir, asked)
    if not missing:
        return
    what = "nothing of it is built" if not p.version_dir.is_dir() else f"it lacks {', '.join(missing.values())}"
    if asked is not None:
        raise UsageError(
            f"{' '.join(sorted(selected))} version={p.version}: the package it verifies is not built ({what}); "
            "verify checks what exists and builds nothing",
            hint=f"build it first: `doit version={p.version} {' '.join(f'aoti_package:{b}' for b in missing)}`",
        )
    released = release.released_versions(p.output_root)
    built = (
        [
            v.name
            for v in sorted(p.output_root.iterdir())
            if v.is_dir()
            and v.name not in released
            and release.state(v) == "build"
            and v.name[:1].isdigit()
            and not missing_packages(p, v)
        ]
        if p.output_root.is_dir()
        else []
    )
    raise UsageError(
        f"verify version={p.version}: version {p.version} is neither a release nor a complete build "
        f"({what}); verify checks what exists and builds nothing",
        hint=f"versions that can be verified here: released {', '.join(released) or 'none'}; "
        f"built {', '.join(built) or 'none'}.  To build this one first: "
        f"`doit version={p.version} aoti_package`, or `doit version={p.version} release`",
    )


def _release_verify_tasks(p):
    """``verify:manifest`` (the release's files against its manifest), then ``verify:<build>``
    for every package the manifest lists."""
    vdir = p.verify_dir
    check = Stage(
        basename="verify",
        name="manifest",
        doc=f"files of release {p.version} against its manifest",
        entry="laya_build.release:check_release",
        process="inline",
        spec={"version_dir": str(vdir), "trust": p.data.get("trust"), "root": str(p.root)},
        always=True,
        verbose=True,
    )
    yield doit_task(p, check)
    try:
        builds = release.listed_builds(vdir)
    except ManifestMismatch:
        return  # verify:manifest fails, naming what is wrong
    except Exception as exc:  # an unreadable manifest: the same task fails with the reason
        message = ManifestMismatch(vdir, [f"{release.MANIFEST} cannot be read ({type(exc).__name__}: {exc})"])
        yield {
            "name": "manifest-read",
            "doc": "the release's manifest",
            "actions": [lambda: failure(message)],
            "uptodate": [False],
        }
        return
    for build in builds:
        out = p.artifacts.verification(p.version, build)
        yield doit_task(
            p,
            Stage(
                basename="verify",
                name=build,
                doc=f"verification of released package {build} ({p.version})",
                entry="laya_build.stages.verify:verify_released",
                spec={"release_dir": str(vdir), "build": build, "out_dir": str(out)},
                record=out / record_name("verify"),
                dirs=(out,),
                schemas=("verify", "aoti_package", "export", "model_sections"),
                env=stage_env(p),
                always=True,
                task_dep=("verify:manifest",),
                verbose=True,
                process=VERIFY_PROCESS,
            ),
        )


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
    for target, dtypes in builds_by_target(p).items():
        packages = [v.build_record("aoti_package", target, dtype) for dtype in dtypes]
        spec = {
            "latency_cfg": p.data["latency"],
            "runtime_cfg": p.data["runtime"],
            "checkpoint_dir": str(v.checkpoint_dir),
            "inputs_path": str(v.inputs),
            "package_record_paths": [str(r) for r in packages],
            "target": target,
        }
        yield doit_task(
            p,
            _build_stage(
                p,
                "latency",
                target,
                None,
                spec,
                config_key="latency_cfg",
                doc="latency table of the target's packages",
                inputs=[*packages, v.model_record],
                schemas=("aoti_package", "model"),
                config={"dtypes": dtypes},
            ),
        )
