"""Kernel stage tasks: tir, probe_c, lower_c, cuda_source, cuda_diff.

Every kernel task runs in a child forked from a server that imported torch and TileLang
once (``fork=True``, :mod:`laya_build.runner`): no generation sees another's state, a
crashing compiler takes only its child down, and no CUDA is ever initialised there.
"""
from __future__ import annotations

from pathlib import Path

from doit.exceptions import TaskFailed
from doit.tools import config_changed

from kernels.registry import KERNELS
from laya_build import release
from laya_build.layout import cuda_name, tir_flavour
from laya_build.log import get_logger
from laya_build.records import write_record
from laya_build.stages import gitrev
from laya_build.tasks.checks import outputs_unchanged
from laya_build.tasks.common import clean_action, clear_outputs, derived_deps, reported, stage_task, task_outputs

log = get_logger(__name__)


def _variants(p):
    return p.data["kernels"]["variants"].items()


def _factory_module(p, factory: str) -> str:
    return f"kernels.{KERNELS[factory].module}"


def tir_tasks(p):
    """TileLang TIR of every kernel variant: GPU dtypes and the fp32 CPU specialisation."""
    v = p.layout
    for variant, vspec in _variants(p):
        flavours = [(d, False) for d in p.data["cuda"]["dtypes"]] + [("float32", True)]
        for dtype, cpu in flavours:
            flavour = tir_flavour(dtype, cpu)
            script, record = v.tir_script(variant, flavour), v.tir_record(variant, flavour)
            target = "c" if cpu else p.data["cuda"]["archs"][0]
            spec = {"variant": variant, **vspec, "dtype": dtype, "cpu": cpu, "target": target,
                    "script": str(script), "script_rel": v.rel(script)}
            yield stage_task(p, basename="tir", name=f"{variant}.{flavour}", doc=f"TIR of {variant} ({flavour})",
                             module="laya_build.stages.tir", function="run_tir", spec=spec, record=record,
                             files=[script], schemas=("tir",), kernel_module=_factory_module(p, vspec["factory"]),
                             config={"variant": vspec, "dtype": dtype, "cpu": cpu, "target": target}, fork=True)


def probe_c_tasks(p):
    """The GPU specialisation compiled for target c (and cpu=True in 16-bit): diagnostics as data."""
    probe = p.data["probe"]
    for variant, vspec in _variants(p):
        flavours = [(d, False) for d in probe["dtypes"]] + [(d, True) for d in probe.get("cpu_dtypes", [])]
        for dtype, cpu in flavours:
            flavour = f"{'cpu' if cpu else 'gpu'}-{dtype}"
            spec = {"variant": variant, **vspec, "dtype": dtype, "cpu": cpu}
            yield stage_task(p, basename="probe_c", name=f"{variant}.{flavour}",
                             doc=f"probe {variant} for target c ({flavour})",
                             module="laya_build.stages.probe_c", function="run_probe_c", spec=spec,
                             record=p.layout.probe_record(variant, flavour), schemas=("probe_c",),
                             kernel_module=_factory_module(p, vspec["factory"]),
                             config={"variant": vspec, "dtype": dtype, "cpu": cpu}, fork=True)


def lower_c_tasks(p):
    """compile_cpu: generated C source plus the numerical check against the torch reference."""
    checks = p.data["cpu_checks"]
    v = p.layout
    for variant, vspec in _variants(p):
        source = v.lower_c_source(variant)
        check = {"seed": checks["seed"], "atol": checks.get("atol_overrides", {}).get(variant, checks["atol"]),
                 "shapes": checks["shapes"][variant]}
        spec = {"variant": variant, **vspec, **check, "source": str(source), "source_rel": v.rel(source)}
        yield stage_task(p, basename="lower_c", name=variant, doc=f"C lowering + numerical check of {variant}",
                         module="laya_build.stages.lower_c", function="run_lower_c", spec=spec,
                         record=source.with_suffix(".json"), files=[source], schemas=("lower_c",),
                         kernel_module=_factory_module(p, vspec["factory"]), config={"variant": vspec, **check},
                         fork=True)


def cuda_source_paths(p):
    """(variant, vspec, dtype, target, relative .cu name) for every generated CUDA source."""
    for variant, vspec in _variants(p):
        for dtype in p.data["cuda"]["dtypes"]:
            for target in p.data["cuda"]["archs"]:
                yield variant, vspec, dtype, target, cuda_name(variant, dtype, target["arch"])


def _cuda_spec(p, variant, vspec, dtype, target, source: Path) -> dict:
    return {"variant": variant, **vspec, "dtype": dtype, "target": target,
            "source": str(source), "source_rel": p.layout.rel(source)}


def cuda_source_tasks(p):
    """CUDA source per kernel x dtype x arch, generated without a GPU, one process each."""
    for variant, vspec, dtype, target, name in cuda_source_paths(p):
        source = p.layout.cuda_source(name)
        yield stage_task(p, basename="cuda_source", name=name.removesuffix(".cu").replace("/", "."),
                         doc=f"CUDA source of {variant} ({dtype}, {target['arch']})",
                         module="laya_build.stages.cuda_source", function="run_cuda_source",
                         spec=_cuda_spec(p, variant, vspec, dtype, target, source), record=source.with_suffix(".json"),
                         files=[source], schemas=("cuda_source",), kernel_module=_factory_module(p, vspec["factory"]),
                         config={"variant": vspec, "dtype": dtype, "target": target}, fork=True)


def cuda_diff_tasks(p):
    """Byte-level diff of every generated .cu against the configured baseline."""
    cuda = p.data["cuda"]
    baseline = cuda.get("baseline")
    if not baseline:
        yield {"name": None, "doc": "byte-level diff of CUDA sources against cuda.baseline (none configured)"}
        return
    v = p.layout
    out = v.cuda_diff_dir
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
        kernels_root = p.artifacts.cache("baseline-kernels", tree)
        yield {
            "name": "baseline_kernels",
            "doc": f"kernels/ as of {sha[:12]}, extracted for the baseline generation",
            "actions": [(_extract_action, [p.root, sha, kernels_root])],
            "targets": [str(kernels_root / "kernels" / "__init__.py")],
            "uptodate": [config_changed({"kernels_tree": tree})],
        }
        lowering = gitrev.lowering_module(p.root, sha)
        for variant, vspec, dtype, target, name in cuda_source_paths(p):
            base = v.cuda_baseline(name)
            task_name = "baseline." + name.removesuffix(".cu").replace("/", ".")
            baseline_tasks.append(f"cuda_diff:{task_name}")
            files.append({"name": name, "current": str(v.cuda_source(name)), "baseline": str(base)})
            spec = {**_cuda_spec(p, variant, vspec, dtype, target, base), "lowering": lowering,
                    "kernels_root": str(kernels_root), "kernels_commit": sha}
            # The kernels come from the revision (keyed by its tree); the code that runs them
            # is this checkout's stage, whose closure is taken without kernels/.
            task = stage_task(p, basename="cuda_diff", name=task_name,
                              doc=f"CUDA source of {variant} ({dtype}, {target['arch']}) from kernels at {sha[:12]}",
                              module="laya_build.stages.cuda_source", function="run_cuda_source", spec=spec,
                              record=base.with_suffix(".json"), files=[base], schemas=("cuda_source",),
                              config={"variant": vspec, "dtype": dtype, "target": target, "kernels_tree": tree},
                              extra_path=[str(kernels_root)], label=f"baseline {name}", fork=True,
                              task_dep=["cuda_diff:baseline_kernels"])
            task["file_dep"] = [f for f in task["file_dep"] if not Path(f).is_relative_to(p.root / "kernels")]
            yield task
    else:
        bdir = p.artifacts.version(baseline["version"])
        describe = {"kind": "version", "version": baseline["version"],
                    "describe": f"artifact version {baseline['version']}"}
        for *_, name in cuda_source_paths(p):
            files.append({"name": name, "current": str(v.cuda_source(name)), "baseline": str(bdir.cuda_source(name))})

    diff_dir = out / "diffs"
    spec = {"files": files, "diff_dir": str(diff_dir), "diff_dir_rel": v.rel(diff_dir),
            "expect": cuda.get("expect", "identical"), "baseline": describe}
    code, _ = derived_deps(p, ("laya_build.stages.cuda_diff",), ("cuda_diff",))
    outputs = task_outputs(p, "cuda_diff:compare", [record], [diff_dir])
    yield {
        "name": "compare",
        "doc": f"byte-level diff of CUDA sources against {describe['describe']}",
        "actions": [(_compare_action, [p, spec, record, outputs])],
        # Both sides: a rebuilt baseline re-runs the comparison (a missing baseline file is a
        # difference the record reports, not a missing dependency).
        "file_dep": [f["current"] for f in files]
        + [f["baseline"] for f in files if baseline_tasks or Path(f["baseline"]).is_file()] + code,
        "task_dep": baseline_tasks,
        "targets": [str(record)],
        "uptodate": [config_changed({"baseline": describe, "expect": spec["expect"],
                                     "files": [f["name"] for f in files], "version": p.version}),
                     outputs_unchanged(outputs)],
        "clean": clean_action(p, outputs),
        "verbosity": 2,
    }


@reported()
def _extract_action(root: Path, sha: str, dest: Path):
    gitrev.extract_kernels(root, sha, dest)


@reported("cuda_diff: ", FileNotFoundError)
def _compare_action(p, spec: dict, record: Path, outputs):
    from laya_build.stages.cuda_diff import run_cuda_diff

    release.refuse_if_released(p.version_dir, "cuda_diff")
    outputs.check_untampered("cuda_diff:compare")
    outputs.forget()
    clear_outputs(outputs.files, outputs.dirs)
    rec = run_cuda_diff(spec)
    write_record(record, rec)
    outputs.save()
    log.info(f"cuda_diff: {rec['summary']} against {spec['baseline']['describe']}")
    return None
