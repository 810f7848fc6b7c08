"""Kernel stage tasks: tir, probe_c, lower_c, cuda_source, cuda_diff.

Every kernel task runs in a child forked from a server that imported torch and TileLang
once (``fork=True``, :mod:`laya_build.runner`): no generation sees another's state, a
crashing compiler takes only its child down, and no CUDA is ever initialised there.
"""

from __future__ import annotations

from pathlib import Path

from kernels.registry import KERNELS
from laya_build.layout import cuda_name, tir_flavour
from laya_build.stage import Stage
from laya_build.stages import gitrev
from laya_build.tasks.build import doit_task, version_stage


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
            spec = {
                "variant": variant,
                **vspec,
                "dtype": dtype,
                "cpu": cpu,
                "target": target,
                "script": str(script),
                "script_rel": v.rel(script),
            }
            yield doit_task(
                p,
                version_stage(
                    p,
                    "tir",
                    f"{variant}.{flavour}",
                    doc=f"TIR of {variant} ({flavour})",
                    entry="laya_build.stages.tir:run_tir",
                    spec=spec,
                    record=record,
                    files=(script,),
                    schemas=("tir",),
                    code=(_factory_module(p, vspec["factory"]),),
                    config={"variant": vspec, "dtype": dtype, "cpu": cpu, "target": target},
                ),
            )


def probe_c_tasks(p):
    """The GPU specialisation compiled for target c (and cpu=True in 16-bit): diagnostics as data."""
    probe = p.data["probe"]
    for variant, vspec in _variants(p):
        flavours = [(d, False) for d in probe["dtypes"]] + [(d, True) for d in probe.get("cpu_dtypes", [])]
        for dtype, cpu in flavours:
            flavour = f"{'cpu' if cpu else 'gpu'}-{dtype}"
            yield doit_task(
                p,
                version_stage(
                    p,
                    "probe_c",
                    f"{variant}.{flavour}",
                    doc=f"probe {variant} for target c ({flavour})",
                    entry="laya_build.stages.probe_c:run_probe_c",
                    spec={"variant": variant, **vspec, "dtype": dtype, "cpu": cpu},
                    record=p.layout.probe_record(variant, flavour),
                    schemas=("probe_c",),
                    code=(_factory_module(p, vspec["factory"]),),
                    config={"variant": vspec, "dtype": dtype, "cpu": cpu},
                ),
            )


def lower_c_tasks(p):
    """compile_cpu: generated C source plus the numerical check against the torch reference."""
    checks = p.data["cpu_checks"]
    v = p.layout
    for variant, vspec in _variants(p):
        source = v.lower_c_source(variant)
        check = {
            "seed": checks["seed"],
            "atol": checks.get("atol_overrides", {}).get(variant, checks["atol"]),
            "shapes": checks["shapes"][variant],
        }
        spec = {"variant": variant, **vspec, **check, "source": str(source), "source_rel": v.rel(source)}
        yield doit_task(
            p,
            version_stage(
                p,
                "lower_c",
                variant,
                doc=f"C lowering + numerical check of {variant}",
                entry="laya_build.stages.lower_c:run_lower_c",
                spec=spec,
                record=v.lower_c_record(variant),
                files=(source,),
                schemas=("lower_c",),
                code=(_factory_module(p, vspec["factory"]),),
                config={"variant": vspec, **check},
            ),
        )


def cuda_source_paths(p):
    """(variant, vspec, dtype, target, relative .cu name) for every generated CUDA source."""
    for variant, vspec in _variants(p):
        for dtype in p.data["cuda"]["dtypes"]:
            for target in p.data["cuda"]["archs"]:
                yield variant, vspec, dtype, target, cuda_name(variant, dtype, target["arch"])


def _cuda_spec(p, variant, vspec, dtype, target, source: Path) -> dict:
    return {
        "variant": variant,
        **vspec,
        "dtype": dtype,
        "target": target,
        "source": str(source),
        "source_rel": p.layout.rel(source),
    }


def cuda_source_tasks(p):
    """CUDA source per kernel x dtype x arch, generated without a GPU, one process each."""
    for variant, vspec, dtype, target, name in cuda_source_paths(p):
        source = p.layout.cuda_source(name)
        yield doit_task(
            p,
            version_stage(
                p,
                "cuda_source",
                name.removesuffix(".cu").replace("/", "."),
                doc=f"CUDA source of {variant} ({dtype}, {target['arch']})",
                entry="laya_build.stages.cuda_source:run_cuda_source",
                spec=_cuda_spec(p, variant, vspec, dtype, target, source),
                record=p.layout.cuda_record(name),
                files=(source,),
                schemas=("cuda_source",),
                code=(_factory_module(p, vspec["factory"]),),
                config={"variant": vspec, "dtype": dtype, "target": target},
            ),
        )


def _failing(name: str, doc: str, exc) -> dict:
    """A task that fails with ``exc`` when it runs (not the whole graph when it is built)."""
    from laya_build.tasks.build import failure

    return {"name": name, "doc": doc, "actions": [lambda: failure(exc)], "uptodate": [False]}


def cuda_diff_tasks(p):
    """Byte-level diff of every generated .cu against the configured baseline."""
    cuda = p.data["cuda"]
    baseline = cuda.get("baseline")
    if not baseline:
        yield {"name": None, "doc": "byte-level diff of CUDA sources against cuda.baseline (none configured)"}
        return
    v = p.layout
    files = []
    baseline_tasks = []
    if "git_ref" in baseline:
        try:
            sha = gitrev.resolve(p.root, baseline["git_ref"])
            tree = gitrev.kernels_tree(p.root, sha)
        except gitrev.GitRefError as exc:
            yield _failing("compare", "byte-level diff of CUDA sources (baseline unresolvable)", exc)
            return
        describe = {
            "kind": "git_ref",
            "ref": baseline["git_ref"],
            "commit": sha,
            "describe": f"kernels at git {baseline['git_ref']} ({sha[:12]})",
        }
        kernels_root = p.artifacts.baseline_kernels(tree)
        extract = Stage(
            basename="cuda_diff",
            name="baseline_kernels",
            doc=f"kernels/ as of {sha[:12]}, extracted for the baseline generation",
            entry="laya_build.stages.gitrev:extract_kernels",
            process="inline",
            # a cache shared by every version (extracted atomically, once): no outputs of its own
            spec={"root": str(p.root), "sha": sha, "dest": str(kernels_root)},
            config={"kernels_tree": tree},
            code_excluded=("kernels",),
            outputs_record=p.artifacts.outputs_record(p.version, "cuda_diff:baseline_kernels"),
        )
        yield doit_task(p, extract)
        lowering = gitrev.lowering_module(p.root, sha)
        for variant, vspec, dtype, target, name in cuda_source_paths(p):
            base = v.cuda_baseline(name)
            task_name = "baseline." + name.removesuffix(".cu").replace("/", ".")
            baseline_tasks.append(f"cuda_diff:{task_name}")
            files.append({"name": name, "current": str(v.cuda_source(name)), "baseline": str(base)})
            spec = {
                **_cuda_spec(p, variant, vspec, dtype, target, base),
                "lowering": lowering,
                "kernels_root": str(kernels_root),
                "kernels_commit": sha,
            }
            # The kernels come from the revision (keyed by its tree); the code that runs them
            # is this checkout's stage, whose closure is taken without kernels/.
            yield doit_task(
                p,
                version_stage(
                    p,
                    "cuda_diff",
                    task_name,
                    doc=f"CUDA source of {variant} ({dtype}, {target['arch']}) from kernels at {sha[:12]}",
                    entry="laya_build.stages.cuda_source:run_cuda_source",
                    spec=spec,
                    record=v.cuda_baseline_record(name),
                    files=(base,),
                    schemas=("cuda_source",),
                    config={"variant": vspec, "dtype": dtype, "target": target, "kernels_tree": tree},
                    code_excluded=("kernels",),
                    sys_path=(str(kernels_root),),
                    task_dep=("cuda_diff:baseline_kernels",),
                ),
            )
    else:
        bdir = p.artifacts.version(baseline["version"])
        describe = {
            "kind": "version",
            "version": baseline["version"],
            "describe": f"artifact version {baseline['version']}",
        }
        for *_, name in cuda_source_paths(p):
            files.append({"name": name, "current": str(v.cuda_source(name)), "baseline": str(bdir.cuda_source(name))})

    diff_dir = v.cuda_diffs_dir
    spec = {
        "files": files,
        "diff_dir": str(diff_dir),
        "diff_dir_rel": v.rel(diff_dir),
        "expect": cuda.get("expect", "identical"),
        "baseline": describe,
    }
    compare = version_stage(
        p,
        "cuda_diff",
        "compare",
        doc=f"byte-level diff of CUDA sources against {describe['describe']}",
        entry="laya_build.stages.cuda_diff:run_cuda_diff",
        process="inline",
        spec=spec,
        record=v.cuda_diff_record,
        dirs=(diff_dir,),
        schemas=("cuda_diff",),
        # Both sides: a rebuilt baseline re-runs the comparison (a missing baseline file is a
        # difference the record reports, not a missing dependency).
        inputs=tuple(Path(f["current"]) for f in files)
        + tuple(Path(f["baseline"]) for f in files if baseline_tasks or Path(f["baseline"]).is_file()),
        config={"baseline": describe, "expect": spec["expect"], "files": [f["name"] for f in files]},
        task_dep=tuple(baseline_tasks),
        verbose=True,
    )
    yield doit_task(p, compare)
