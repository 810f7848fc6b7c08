"""The doit task graph, built from a validated :class:`~laya_build.config.Pipeline`.

This is the only module that knows doit.  Each ``*_tasks`` generator yields sub-task dicts
with ``name``, ``file_dep``, ``targets``, ``uptodate=[config_changed(<the config slice the
task reads>)]`` and ``clean``; the actions call stage functions of :mod:`laya_build.stages`,
compiling ones in a fresh process (:mod:`laya_build.isolate`).  Building the graph imports
no torch, tilelang or transformers.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from doit import get_var
from doit.exceptions import TaskFailed
from doit.tools import config_changed

from . import PROJECT_ROOT, config as config_mod, gitrev, isolate, release

GPU_DTYPES_ORDER = ("bfloat16", "float16")
KERNEL_COMMON_DEPS = ("kernels/__init__.py", "kernels/_common.py")


def load_pipeline(root: Path = PROJECT_ROOT) -> config_mod.Pipeline:
    """The pipeline of ``root``, with ``doit config=... version=...`` applied."""
    return config_mod.load(get_var("config", None), root=root, overrides={"version": get_var("version", None)})


def doit_config(p: config_mod.Pipeline) -> dict:
    return {
        "backend": "json",  # dbm locks and corrupts under concurrent runs
        "dep_file": str(p.output_root / ".doit-db.json"),
        "default_tasks": ["tir", "probe_c", "lower_c", "cuda_source", "cuda_diff"],
    }


# ---------------------------------------------------------------------------------------------
# helpers


def _rel(p: config_mod.Pipeline, path: Path) -> str:
    return path.relative_to(p.version_dir).as_posix()


def _deps(p: config_mod.Pipeline, *paths: str) -> list[str]:
    return [str(p.root / path) for path in paths]


def _factory_module(p: config_mod.Pipeline, factory: str) -> str:
    return config_mod.kernel_factories(p.root / "kernels")[factory]


def _stage_deps(p: config_mod.Pipeline, stage: str, *extra: str) -> list[str]:
    return _deps(p, f"laya_build/stages/{stage}.py", "laya_build/stages/_kernel_common.py",
                 f"schemas/{stage}.schema.json", *extra)


def _isolated(p: config_mod.Pipeline, module: str, function: str, spec: dict, record: Path, extra_path=None,
              label=None):
    """A doit python-action: run a stage in its own process; a failure is a TaskFailed with
    the stage's own message (no traceback of the runner).  Refuses to write into a released
    version."""
    env = _stage_env(p)

    def action():
        try:
            release.refuse_if_released(p.version_dir, label or module)
            isolate.run(module, function, spec, record=record, extra_path=extra_path, label=label, env=env)
        except (isolate.StageFailed, release.ReleasedVersionError) as exc:
            return TaskFailed(str(exc))
        return None

    action.__name__ = f"{module.rsplit('.', 1)[-1]}:{label or function}"
    return action


def _stage_env(p: config_mod.Pipeline) -> dict:
    # TileLang's compile cache lives beside the versions, never inside a release.
    return {"TILELANG_CACHE_DIR": str(p.output_root / ".cache" / "tilelang")}


def _variants(p: config_mod.Pipeline):
    return p.data["kernels"]["variants"].items()


def _arch_name(target: dict) -> str:
    return target["arch"]


# ---------------------------------------------------------------------------------------------
# kernel stages


def tir_tasks(p: config_mod.Pipeline):
    """TileLang TIR of every kernel variant: GPU dtypes and the fp32 CPU specialisation."""
    for variant, vspec in _variants(p):
        kdeps = [_factory_module(p, vspec["factory"]), *KERNEL_COMMON_DEPS]
        flavours = [(d, False) for d in p.data["cuda"]["dtypes"]] + [("float32", True)]
        for dtype, cpu in flavours:
            flavour = f"cpu-{dtype}" if cpu else dtype
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
                yield variant, vspec, dtype, target, f"{variant}/{dtype}-{_arch_name(target)}.cu"


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
        sha = gitrev.resolve(p.root, baseline["git_ref"])
        describe = {"kind": "git_ref", "ref": baseline["git_ref"], "commit": sha,
                    "describe": f"kernels at git {baseline['git_ref']} ({sha[:12]})"}
        kernels_root = p.output_root / ".cache" / "baseline-kernels" / sha
        yield {
            "name": "baseline_kernels",
            "doc": f"kernels/ as of {sha[:12]}, extracted for the baseline generation",
            "actions": [(_extract_action, [p.root, sha, kernels_root])],
            "targets": [str(kernels_root / "kernels" / "__init__.py")],
            "uptodate": [config_changed({"commit": sha})],
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
                "uptodate": [config_changed({"variant": vspec, "dtype": dtype, "target": target, "commit": sha})],
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
        "file_dep": [f["current"] for f in files] + _deps(p, "laya_build/stages/cuda_diff.py", "schemas/cuda_diff.schema.json"),
        "task_dep": baseline_tasks,
        "targets": [str(record)],
        "uptodate": [config_changed({"baseline": describe, "expect": spec["expect"], "files": [f["name"] for f in files]})],
        "clean": _clean(p, out),
        "verbosity": 2,
    }


def _extract_action(root: Path, sha: str, dest: Path):
    try:
        gitrev.extract_kernels(root, sha, dest)
    except gitrev.GitRefError as exc:
        return TaskFailed(str(exc))
    return None


def _compare_action(spec: dict, record: Path):
    from .records import write_record
    from .stages.cuda_diff import CudaSourceMismatch, run_cuda_diff

    try:
        release.refuse_if_released(Path(record).parent.parent, "cuda_diff")
        rec = run_cuda_diff(spec)
    except (CudaSourceMismatch, FileNotFoundError, release.ReleasedVersionError) as exc:
        return TaskFailed(f"cuda_diff: {exc}")
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
# releases

KERNEL_TASK_GENERATORS = ("tir_tasks", "probe_c_tasks", "lower_c_tasks", "cuda_source_tasks", "cuda_diff_tasks")


def _owners(p: config_mod.Pipeline, generators) -> dict[str, str]:
    """Relative path of every declared target -> the task that produces it."""
    owners = {}
    for gen in generators:
        basename = gen.__name__.removesuffix("_tasks")
        for task in gen(p):
            for target in task.get("targets", []):
                path = Path(target)
                if p.version_dir in path.parents:
                    owners[path.relative_to(p.version_dir).as_posix()] = f"{basename}:{task['name']}"
    return owners


def release_tasks(p: config_mod.Pipeline, stage_generators, stage_names: list[str]):
    """Build every stage for the version, then write REPORT.md and manifest.json (last)."""
    manifest = release.manifest_path(p.version_dir)
    spec = {"version": p.version, "version_dir": str(p.version_dir), "root": str(p.root), "config": p.data,
            "owners": _owners(p, stage_generators)}

    def act():
        try:
            release.refuse_if_released(p.version_dir, "release")
            print(f"release {p.version}: writing REPORT.md and {release.MANIFEST} (environment snapshot)", flush=True)
            isolate.run("laya_build.release", "build_manifest", spec, record=manifest, label="release")
        except (isolate.StageFailed, release.ReleasedVersionError) as exc:
            return TaskFailed(str(exc))
        print(f"release {p.version}: {manifest}")
        return None

    return {
        "actions": [act],
        "task_dep": stage_names,
        "uptodate": [False],  # always checked: a second release into this version is refused
        "verbosity": 2,
        "doc": f"build every stage, then REPORT.md + manifest.json: releases version {p.version}",
    }
