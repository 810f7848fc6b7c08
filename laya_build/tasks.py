"""The doit task graph, built from a validated :class:`~laya_build.config.Pipeline`.

This is the only module that knows doit.  Each ``*_tasks`` generator yields sub-task dicts
with ``name``, ``file_dep``, ``targets``, ``uptodate=[config_changed(<the config slice the
task reads>)]`` and ``clean``; the actions call stage functions of :mod:`laya_build.stages`,
compiling ones in a fresh process (:mod:`laya_build.isolate`).  Building the graph imports
no torch, tilelang or transformers.
"""
from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

from doit import get_var
from doit.exceptions import TaskFailed
from doit.tools import config_changed

from . import PROJECT_ROOT, config as config_mod, gitrev, isolate, release
from .records import RecordError, write_record
from .stages._kernel_common import tir_flavour
from .stages.cuda_diff import CudaSourceMismatch, run_cuda_diff

# Failures a task reports by their own message (a TaskFailed), not with a traceback.
EXPECTED_FAILURES = (isolate.StageFailed, release.ReleasedVersionError, release.ManifestMismatch, RecordError,
                     gitrev.GitRefError, CudaSourceMismatch)


def _reported(prefix: str = "", *extra: type[BaseException]):
    """Decorate a doit python-action so that an expected failure becomes ``TaskFailed``."""
    errors = EXPECTED_FAILURES + extra

    def wrap(fn):
        @functools.wraps(fn)
        def action(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except errors as exc:
                return TaskFailed(f"{prefix}{exc}")

        return action

    return wrap

KERNEL_COMMON_DEPS = ("kernels/__init__.py", "kernels/_common.py")


def load_pipeline(root: Path = PROJECT_ROOT) -> config_mod.Pipeline:
    """The pipeline of ``root``, with ``doit config=... version=...`` applied."""
    return config_mod.load(get_var("config", None), root=root, overrides={"version": get_var("version", None)})


def doit_config(p: config_mod.Pipeline) -> dict:
    p.output_root.mkdir(exist_ok=True)  # for doit's database
    return {
        # sqlite3: transactional, unlike dbm (locks and corrupts under concurrent runs) and json
        # (rewritten whole with a plain open(): an interrupted dump leaves it truncated).
        "backend": "sqlite3",
        "dep_file": str(p.output_root / ".doit-db.sqlite3"),
        "default_tasks": ["tir", "probe_c", "lower_c", "cuda_source", "cuda_diff"],
    }


# ---------------------------------------------------------------------------------------------
# helpers


def _rel(p: config_mod.Pipeline, path: Path) -> str:
    return path.relative_to(p.version_dir).as_posix()


def _deps(p: config_mod.Pipeline, *paths: str) -> list[str]:
    return [str(p.root / path) for path in paths]


def _factory_module(p: config_mod.Pipeline, factory: str) -> str:
    return config_mod.kernel_factories(p.root / "kernels")[factory].module


# What every stage process runs besides its own module: a change re-runs the stages.
RUNNER_DEPS = ("laya_build/isolate.py", "laya_build/records.py", "laya_build/atomic.py", "schemas/common.schema.json")


def _stage_deps(p: config_mod.Pipeline, stage: str, *extra: str) -> list[str]:
    return _deps(p, f"laya_build/stages/{stage}.py", "laya_build/stages/_kernel_common.py",
                 f"schemas/{stage}.schema.json", *RUNNER_DEPS, *extra)


def _isolated(p: config_mod.Pipeline, module: str, function: str, spec: dict, record: Path | None,
              extra_path=None, label=None, kwargs: bool = False, fresh: Path | None = None):
    """A doit python-action: run a stage in its own process; a failure is a TaskFailed with
    the stage's own message (no traceback of the runner).  Refuses to write into a released
    version.  ``fresh``: a folder the stage owns, emptied first so that no file of an earlier
    run (of another configuration) survives into a release."""
    env = _stage_env(p)

    @_reported()
    def action():
        release.refuse_if_released(p.version_dir, label or module)
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)
        isolate.run(module, function, spec, record=record, extra_path=extra_path, label=label, env=env,
                    kwargs=kwargs)

    action.__name__ = f"{module.rsplit('.', 1)[-1]}:{label or function}"
    return action


def _stage_env(p: config_mod.Pipeline) -> dict:
    # TileLang's compile cache lives beside the versions, never inside a release.
    return {"TILELANG_CACHE_DIR": str(p.output_root / ".cache" / "tilelang")}


def _variants(p: config_mod.Pipeline):
    return p.data["kernels"]["variants"].items()


# ---------------------------------------------------------------------------------------------
# kernel stages


def tir_tasks(p: config_mod.Pipeline):
    """TileLang TIR of every kernel variant: GPU dtypes and the fp32 CPU specialisation."""
    for variant, vspec in _variants(p):
        kdeps = [_factory_module(p, vspec["factory"]), *KERNEL_COMMON_DEPS]
        flavours = [(d, False) for d in p.data["cuda"]["dtypes"]] + [("float32", True)]
        for dtype, cpu in flavours:
            flavour = tir_flavour(dtype, cpu)
            script = p.version_dir / "tir" / variant / f"{flavour}.tir.py"
            record = script.with_name(f"{flavour}.json")
            target = "c" if cpu else p.data["cuda"]["archs"][0]
            spec = {"variant": variant, **vspec, "dtype": dtype, "cpu": cpu, "target": target,
                    "script": str(script), "script_rel": _rel(p, script)}
            yield {
                "name": f"{variant}.{flavour}",
                "doc": f"TIR of {variant} ({flavour})",
                "actions": [_isolated(p, "laya_build.stages.tir", "run_tir", spec, record)],
                "file_dep": _stage_deps(p, "tir", *kdeps),
                "targets": [str(script), str(record)],
                "uptodate": [config_changed({"variant": vspec, "dtype": dtype, "cpu": cpu, "target": target})],
                "clean": _clean(p),
            }


def probe_c_tasks(p: config_mod.Pipeline):
    """The GPU specialisation compiled for target c (and cpu=True in 16-bit): diagnostics as data."""
    probe = p.data["probe"]
    for variant, vspec in _variants(p):
        kdeps = [_factory_module(p, vspec["factory"]), *KERNEL_COMMON_DEPS, "kernels/probe.py", "kernels/probe_pins.json"]
        flavours = [(d, False) for d in probe["dtypes"]] + [(d, True) for d in probe.get("cpu_dtypes", [])]
        for dtype, cpu in flavours:
            flavour = f"{'cpu' if cpu else 'gpu'}-{dtype}"
            record = p.version_dir / "probe_c" / variant / f"{flavour}.json"
            spec = {"variant": variant, **vspec, "dtype": dtype, "cpu": cpu}
            yield {
                "name": f"{variant}.{flavour}",
                "doc": f"probe {variant} for target c ({flavour})",
                "actions": [_isolated(p, "laya_build.stages.probe_c", "run_probe_c", spec, record)],
                "file_dep": _stage_deps(p, "probe_c", *kdeps),
                "targets": [str(record)],
                "uptodate": [config_changed({"variant": vspec, "dtype": dtype, "cpu": cpu})],
                "clean": _clean(p),
            }


def lower_c_tasks(p: config_mod.Pipeline):
    """compile_cpu: generated C source plus the numerical check against the torch reference."""
    checks = p.data["cpu_checks"]
    for variant, vspec in _variants(p):
        kdeps = [_factory_module(p, vspec["factory"]), *KERNEL_COMMON_DEPS, "kernels/reference.py"]
        source = p.version_dir / "lower_c" / f"{variant}.c"
        record = source.with_suffix(".json")
        check = {"seed": checks["seed"], "atol": checks.get("atol_overrides", {}).get(variant, checks["atol"]),
                 "shapes": checks["shapes"][variant]}
        spec = {"variant": variant, **vspec, **check, "source": str(source), "source_rel": _rel(p, source)}
        yield {
            "name": variant,
            "doc": f"C lowering + numerical check of {variant}",
            "actions": [_isolated(p, "laya_build.stages.lower_c", "run_lower_c", spec, record)],
            "file_dep": _stage_deps(p, "lower_c", *kdeps),
            "targets": [str(source), str(record)],
            "uptodate": [config_changed({"variant": vspec, **check})],
            "clean": _clean(p),
        }


def cuda_source_paths(p: config_mod.Pipeline):
    """(variant, vspec, dtype, target, relative .cu name) for every generated CUDA source."""
    for variant, vspec in _variants(p):
        for dtype in p.data["cuda"]["dtypes"]:
            for target in p.data["cuda"]["archs"]:
                yield variant, vspec, dtype, target, f"{variant}/{dtype}-{target['arch']}.cu"


def _cuda_spec(p, variant, vspec, dtype, target, source: Path) -> dict:
    return {"variant": variant, **vspec, "dtype": dtype, "target": target,
            "source": str(source), "source_rel": _rel(p, source)}


def cuda_source_tasks(p: config_mod.Pipeline):
    """CUDA source per kernel x dtype x arch, generated without a GPU, one process each."""
    for variant, vspec, dtype, target, name in cuda_source_paths(p):
        source = p.version_dir / "cuda" / name
        record = source.with_suffix(".json")
        yield {
            "name": name.removesuffix(".cu").replace("/", "."),
            "doc": f"CUDA source of {variant} ({dtype}, {target['arch']})",
            "actions": [_isolated(p, "laya_build.stages.cuda_source", "run_cuda_source",
                                  _cuda_spec(p, variant, vspec, dtype, target, source), record)],
            "file_dep": _stage_deps(p, "cuda_source", _factory_module(p, vspec["factory"]), *KERNEL_COMMON_DEPS),
            "targets": [str(source), str(record)],
            "uptodate": [config_changed({"variant": vspec, "dtype": dtype, "target": target})],
            "clean": _clean(p),
        }


def cuda_diff_tasks(p: config_mod.Pipeline):
    """Byte-level diff of every generated .cu against the configured baseline."""
    cuda = p.data["cuda"]
    baseline = cuda.get("baseline")
    if not baseline:
        yield {"name": None, "doc": "byte-level diff of CUDA sources against cuda.baseline (none configured)"}
        return
    out = p.version_dir / "cuda_diff"
    record = out / "cuda_diff.json"
    files = []
    baseline_tasks = []
    if "git_ref" in baseline:
        try:
            sha = gitrev.resolve(p.root, baseline["git_ref"])
            tree = gitrev.kernels_tree(p.root, sha)
        except gitrev.GitRefError as exc:  # fail this task when it runs, not the whole graph
            message = str(exc)
            yield {"name": "compare", "doc": "byte-level diff of CUDA sources (baseline unresolvable)",
                   "actions": [lambda: TaskFailed(message)], "uptodate": [False]}
            return
        describe = {"kind": "git_ref", "ref": baseline["git_ref"], "commit": sha,
                    "describe": f"kernels at git {baseline['git_ref']} ({sha[:12]})"}
        kernels_root = p.output_root / ".cache" / "baseline-kernels" / tree
        yield {
            "name": "baseline_kernels",
            "doc": f"kernels/ as of {sha[:12]}, extracted for the baseline generation",
            "actions": [(_extract_action, [p.root, sha, kernels_root])],
            "targets": [str(kernels_root / "kernels" / "__init__.py")],
            "uptodate": [config_changed({"kernels_tree": tree})],
        }
        for variant, vspec, dtype, target, name in cuda_source_paths(p):
            base = out / "baseline" / name
            base_record = base.with_suffix(".json")
            task_name = "baseline." + name.removesuffix(".cu").replace("/", ".")
            baseline_tasks.append(f"cuda_diff:{task_name}")
            files.append({"name": name, "current": str(p.version_dir / "cuda" / name), "baseline": str(base)})
            spec = {**_cuda_spec(p, variant, vspec, dtype, target, base),
                    "kernels_root": str(kernels_root), "kernels_commit": sha}
            yield {
                "name": task_name,
                "doc": f"CUDA source of {variant} ({dtype}, {target['arch']}) from kernels at {sha[:12]}",
                "actions": [_isolated(p, "laya_build.stages.cuda_source", "run_cuda_source", spec, base_record,
                                      extra_path=[str(kernels_root)], label=f"baseline {name}")],
                "file_dep": _stage_deps(p, "cuda_source"),
                "task_dep": ["cuda_diff:baseline_kernels"],
                "targets": [str(base), str(base_record)],
                "uptodate": [config_changed({"variant": vspec, "dtype": dtype, "target": target, "kernels_tree": tree})],
                "clean": _clean(p),
            }
    else:
        bdir = p.output_root / baseline["version"]
        describe = {"kind": "version", "version": baseline["version"],
                    "describe": f"artifact version {baseline['version']}"}
        for *_, name in cuda_source_paths(p):
            files.append({"name": name, "current": str(p.version_dir / "cuda" / name), "baseline": str(bdir / "cuda" / name)})

    spec = {"files": files, "diff_dir": str(out / "diffs"), "diff_dir_rel": _rel(p, out / "diffs"),
            "expect": cuda.get("expect", "identical"), "baseline": describe}
    yield {
        "name": "compare",
        "doc": f"byte-level diff of CUDA sources against {describe['describe']}",
        "actions": [(_compare_action, [spec, record])],
        # Both sides: a rebuilt baseline re-runs the comparison (a missing baseline file is a
        # difference the record reports, not a missing dependency).
        "file_dep": [f["current"] for f in files] + [f["baseline"] for f in files if baseline_tasks or Path(f["baseline"]).is_file()]
        + _deps(p, "laya_build/stages/cuda_diff.py", "schemas/cuda_diff.schema.json"),
        "task_dep": baseline_tasks,
        "targets": [str(record)],
        "uptodate": [config_changed({"baseline": describe, "expect": spec["expect"], "files": [f["name"] for f in files]})],
        "clean": _clean(p, out),
        "verbosity": 2,
    }


@_reported()
def _extract_action(root: Path, sha: str, dest: Path):
    gitrev.extract_kernels(root, sha, dest)


@_reported("cuda_diff: ", FileNotFoundError)
def _compare_action(spec: dict, record: Path):
    release.refuse_if_released(Path(record).parent.parent, "cuda_diff")
    rec = run_cuda_diff(spec)
    write_record(record, rec)
    print(f"cuda_diff: {rec['summary']} against {spec['baseline']['describe']}")
    return None


def _clean(p: config_mod.Pipeline, directory: Path | None = None) -> list:
    """``clean`` actions: remove a task's targets (or a whole output folder), never in a
    released version."""

    def clean(task):
        if release.is_released(p.version_dir):
            print(f"laya-build: not cleaning {task.name}: version {p.version} is released and immutable")
            return None
        for target in task.targets:
            Path(target).unlink(missing_ok=True)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        return None

    return [clean]


# ---------------------------------------------------------------------------------------------
# model stages: model -> export -> aoti_package -> verify, latency

MODEL_CODE = ("laya_build/model/__init__.py", "laya_build/model/decision.py", "laya_build/model/checkpoint.py",
              "laya_build/model/tokenizer.py", "laya_build/model/inputs.py", "laya_build/model/corpus.txt",
              "laya_build/model/defaults.yaml", "laya_build/stages/_model_common.py",
              "laya_build/stages/_aoti_runtime.py", "laya_build/errors.py")


# The serving runtime: verify and latency run packages through it.
RUNTIME_CODE = ("laya_build/runtime.py", "laya_build/buckets.py")


def _model_deps(p: config_mod.Pipeline, module: str, schema: str, *extra: str) -> list[str]:
    return _deps(p, f"laya_build/stages/{module}.py", f"schemas/{schema}.schema.json", "schemas/model_common.schema.json",
                 "schemas/model_sections.schema.json", *MODEL_CODE, *RUNNER_DEPS, *extra)


def model_dirs(p: config_mod.Pipeline) -> dict[str, Path]:
    v = p.version_dir
    return {"model": v / "model", "checkpoint": v / "model" / "checkpoint", "inputs": v / "model" / "inputs.pt"}


def model_builds(p: config_mod.Pipeline) -> list[tuple[str, str]]:
    """(target, dtype) of every package the config asks for."""
    targets = p.data["export"]["targets"]
    return [(t, d) for t in p.data["package"]["targets"] for d in targets.get(t, [])]


def _build_dir(p: config_mod.Pipeline, stage: str, target: str, dtype: str) -> Path:
    return p.version_dir / stage / f"{target}-{dtype}"


def _verify_spec(p: config_mod.Pipeline, cfg: dict, runtime_cfg: dict, build: str) -> dict:
    """run_verify's arguments for one build (``<target>-<dtype>``) of ``p``'s version folder."""
    v = p.version_dir
    return {"verify_cfg": cfg, "runtime_cfg": runtime_cfg, "package_record_path": str(v / "aoti_package" / build / "aoti_package.json"),
            "inputs_path": str(model_dirs(p)["inputs"]), "eager_path": str(v / "export" / build / "eager.pt")}


CHECKPOINT_FILES = ("rl_agent_config.json", "model.safetensors", "encoder/config.json")


def model_tasks(p: config_mod.Pipeline):
    """The decision-model checkpoint (generated from a seed, or a local one) and inputs.pt."""
    d = model_dirs(p)
    cfg = p.section("model")
    local = cfg.get("path")
    local_deps = [str((p.root / local / f).resolve()) for f in CHECKPOINT_FILES] if local else []
    record = d["model"] / "model.json"
    yield {
        "name": None,
        "doc": "decision-model checkpoint and the saved, tokenised inputs",
    }
    yield {
        "name": "build",
        "doc": "checkpoint (generated or local) + inputs.pt",
        "actions": [_isolated(p, "laya_build.stages.model", "run_model",
                              {"model_cfg": cfg, "out_dir": str(d["model"])}, None, label="model", kwargs=True,
                              fresh=d["model"])],
        "file_dep": _model_deps(p, "model", "model") + local_deps,
        "targets": [str(record), str(d["inputs"]), *(str(d["checkpoint"] / f) for f in CHECKPOINT_FILES)],
        "uptodate": [config_changed({"model": cfg})],
        "clean": _clean(p, d["model"]),
    }


def _build_task(p: config_mod.Pipeline, stage: str, module: str, function: str, target: str, dtype: str,
                spec: dict, deps: list[str], config_key: str, doc: str) -> dict:
    """One model-stage sub-task for a (target, dtype) build: its record is ``<stage>.json`` in
    ``artifacts/<version>/<stage>/<target>-<dtype>/``; long, so its progress lines are shown.
    Re-run when ``spec[config_key]`` (or the ``runtime`` section the stage reads) changes."""
    out = _build_dir(p, stage, target, dtype)
    cfg = {config_key: spec[config_key], **({"runtime": spec["runtime_cfg"]} if "runtime_cfg" in spec else {})}
    return {
        "name": f"{target}-{dtype}",
        "doc": f"{doc} ({target}, {dtype})",
        "actions": [_isolated(p, f"laya_build.stages.{module}", function, {**spec, "out_dir": str(out)}, None,
                              label=f"{stage} {target}-{dtype}", kwargs=True, fresh=out)],
        "file_dep": deps,
        "targets": [str(out / f"{stage}.json")],
        "uptodate": [config_changed({**cfg, "target": target, "dtype": dtype})],
        "clean": _clean(p, out),
        "verbosity": 2,
    }


def export_tasks(p: config_mod.Pipeline):
    """torch.export of the decision model per target x dtype, and eager.pt."""
    d = model_dirs(p)
    cfg = p.section("export")
    for target, dtype in model_builds(p):
        spec = {"export_cfg": cfg, "checkpoint_dir": str(d["checkpoint"]), "inputs_path": str(d["inputs"]),
                "target": target, "dtype": dtype}
        deps = _model_deps(p, "export", "export") + [str(d["model"] / "model.json"), str(d["inputs"])]
        yield _build_task(p, "export", "export", "run_export", target, dtype, spec, deps, "export_cfg",
                          "torch.export of the decision model")


def aoti_package_tasks(p: config_mod.Pipeline):
    """AOTInductor .pt2 package per target x dtype (explicit skip record where unsupported)."""
    cfg = p.section("package")
    for target, dtype in model_builds(p):
        export_dir = _build_dir(p, "export", target, dtype)
        spec = {"package_cfg": cfg, "export_dir": str(export_dir), "target": target}
        deps = _model_deps(p, "package", "aoti_package", "laya_build/stages/_package_child.py") + [
            str(export_dir / "export.json")]
        yield _build_task(p, "aoti_package", "package", "run_package", target, dtype, spec, deps, "package_cfg",
                          "AOTInductor package")


def verify_tasks(p: config_mod.Pipeline):
    """Each package, alone, in a fresh process: sha256 first, then parity with eager.pt.

    For a released version: every file against the manifest first, then the same
    verification of each package, with the release's own configuration; results go to
    ``artifacts/verifications/<version>/`` (a release is never written to)."""
    if release.is_released(p.version_dir):
        yield _verify_release_task(p)
        return
    d = model_dirs(p)
    cfg = p.section("verify")
    for target, dtype in model_builds(p):
        spec = _verify_spec(p, cfg, p.section("runtime"), f"{target}-{dtype}")
        deps = _model_deps(p, "verify", "verify", "laya_build/stages/_verify_child.py", *RUNTIME_CODE) + [
            spec["package_record_path"], str(d["inputs"])]
        yield _build_task(p, "verify", "verify", "run_verify", target, dtype, spec, deps, "verify_cfg",
                          "fresh-process verification of the package")


def _verify_release_task(p: config_mod.Pipeline) -> dict:
    vdir, out_root = p.version_dir, p.output_root / "verifications" / p.version

    @_reported(f"verify {p.version}: ")
    def act():
        manifest = release.check_files(vdir)
        print(f"verify {p.version}: {manifest['totals']['files']} files match {release.MANIFEST}", flush=True)
        config = json.loads((vdir / manifest["pipeline"]["effective"]).read_text())
        packages = sorted(f["path"] for f in manifest["files"] if f["path"].endswith("/aoti_package.json"))
        for rel in packages:
            build = rel.split("/")[1]
            spec = {**_verify_spec(p, config.get("verify", {}), config.get("runtime", {}), build),
                    "out_dir": str(out_root / build)}
            isolate.run("laya_build.stages.verify", "run_verify", spec, label=f"verify {p.version} {build}",
                        env=_stage_env(p), kwargs=True)
            result = json.loads((out_root / build / "verify.json").read_text())
            print(f"verify {p.version} {build}: {result['status']}"
                  + (f" ({result['reason']})" if result["status"] == "skipped" else ""), flush=True)
        return None

    return {"name": "release", "doc": f"verify released version {p.version}: manifest, then every package",
            "actions": [act], "uptodate": [False], "verbosity": 2}


def latency_tasks(p: config_mod.Pipeline):
    """Eager AMP / eager bf16 / torch.compile bf16 / package latency on the saved inputs."""
    d = model_dirs(p)
    cfg = p.section("latency")
    for target, dtype in model_builds(p):
        pkg = _build_dir(p, "aoti_package", target, dtype) / "aoti_package.json"
        spec = {"latency_cfg": cfg, "runtime_cfg": p.section("runtime"), "checkpoint_dir": str(d["checkpoint"]),
                "inputs_path": str(d["inputs"]), "package_record_path": str(pkg), "target": target}
        deps = _model_deps(p, "latency", "latency", "laya_build/stages/_latency_child.py", *RUNTIME_CODE) + [
            str(pkg), str(d["model"] / "model.json")]
        yield _build_task(p, "latency", "latency", "run_latency", target, dtype, spec, deps, "latency_cfg",
                          "latency table of the package")


# ---------------------------------------------------------------------------------------------
# releases

STAGE_GENERATORS = (tir_tasks, probe_c_tasks, lower_c_tasks, cuda_source_tasks, cuda_diff_tasks,
                    model_tasks, export_tasks, aoti_package_tasks, verify_tasks, latency_tasks)


def _owners(p: config_mod.Pipeline) -> dict[str, str]:
    """Relative path of every declared target -> the task that produces it."""
    owners = {}
    for gen in STAGE_GENERATORS:
        basename = gen.__name__.removesuffix("_tasks")
        for task in gen(p):
            for target in task.get("targets", []):
                path = Path(target)
                if p.version_dir in path.parents:
                    owners[path.relative_to(p.version_dir).as_posix()] = f"{basename}:{task['name']}"
    return owners


def release_task(p: config_mod.Pipeline) -> dict:
    """Build every stage for the version, then write REPORT.md and manifest.json (last)."""
    manifest = release.manifest_path(p.version_dir)
    stage_names = [gen.__name__.removesuffix("_tasks") for gen in STAGE_GENERATORS]
    if release.is_released(p.version_dir):
        stage_names = []  # nothing may run against a released version; the action refuses

    @_reported()
    def act():
        release.refuse_if_released(p.version_dir, "release")
        spec = {"version": p.version, "version_dir": str(p.version_dir), "root": str(p.root),
                "config": p.data, "owners": _owners(p)}
        print(f"release {p.version}: writing REPORT.md and {release.MANIFEST} (environment snapshot)", flush=True)
        isolate.run("laya_build.release", "build_manifest", spec, label="release")
        print(f"release {p.version}: {manifest}")

    return {
        "actions": [act],
        "task_dep": stage_names,
        "uptodate": [False],  # always checked: a second release into this version is refused
        "verbosity": 2,
        "doc": f"build every stage, then REPORT.md + manifest.json: releases version {p.version}",
    }


def release_diff_task(p: config_mod.Pipeline) -> dict:
    """``doit release_diff old=A new=B``: both versions must be released."""
    old, new = get_var("old", None), get_var("new", None)
    doc = "what changed between two releases: doit release_diff old=<version> new=<version>"
    if old is None or new is None:
        return {"actions": [lambda: TaskFailed("release_diff needs two released versions: doit release_diff old=<v> new=<v>")],
                "doc": doc, "uptodate": [False]}
    try:
        for name, value in (("old", old), ("new", new)):
            config_mod.check_version(value, f"doit argument {name}")
    except config_mod.ConfigError as exc:
        message = str(exc)
        return {"actions": [lambda: TaskFailed(message)], "doc": doc, "uptodate": [False]}
    out = p.output_root / "release_diff" / f"{old}..{new}"
    spec = {"artifacts": str(p.output_root), "old": old, "new": new, "out": str(out),
            "out_rel": out.relative_to(p.output_root).as_posix()}

    @_reported()
    def act():
        isolate.run("laya_build.stages.release_diff", "run_release_diff", spec, record=out / "release_diff.json",
                    label="release_diff")
        print((out / "release_diff.md").read_text())

    return {"actions": [act], "doc": doc, "uptodate": [False], "verbosity": 2,
            "targets": [str(out / "release_diff.json"), str(out / "release_diff.md")]}
