"""Stage ``latency``, once per target: the target's ``latency.variants`` of eager AMP, eager
explicit bf16 and ``torch.compile`` bf16 (by default on CUDA only: :func:`target_variants`),
then every package of the target, plain and behind the serving runtime (``package_graphed``).

The eager and compiled variants depend only on the checkpoint, the inputs, the target and
the configuration, so they are measured once; ``package`` and ``package_graphed`` are
measured for each package dtype of the target (each carries its ``dtype``).  A package whose
build was skipped is listed with the reason (``skipped_packages``); a target that cannot run
here, or whose packages were all skipped, gives a skip record.

Measured in a fresh interpreter (:mod:`laya_build.stages.children.latency`, started by
:func:`laya_build.runner.run`) with its own empty Inductor cache, on
the saved inputs: per variant and batch, ``timing.<target>.warmup`` calls, then
``torch.utils.benchmark``'s ``blocked_autorange`` for ``timing.<target>.min_run_time_s``
seconds (the median per-call time over its blocks; the record says how many calls each
figure rests on).  ``package_graphed`` is :class:`laya_build.runtime.DecisionRunner` with
``runtime.buckets.<target>``: one CUDA graph per bucket on CUDA (capture time recorded),
padded plain calls on the CPU.  Outputs are compared with eager AMP (decision
probabilities calibrated with the checkpoint's temperatures, upstream Laya's rule:
``laya_build.runtime.parity.decision_probabilities``).  Writes ``latency.json`` (the record)
and ``latency.md`` (a Markdown table).
Latencies exclude tokenisation, export and compilation (the first calls, which compile for
``compiled_bf16``, are recorded apart).
"""

from __future__ import annotations

import time
from pathlib import Path

from laya_build.atomic import write_text
from laya_build.environment import device_snapshot, unsupported_reason, versions
from laya_build.errors import ConfigError, StageError
from laya_build.layout import LATENCY_TABLE_NAME, child_log_name, record_name
from laya_build.records import check_record, sha256_file
from laya_build.release.model_report import gpu_sentence, variant_label
from laya_build.runner import Child, run
from laya_build.runner.folders import inductor_cache, vec_isa_root
from laya_build.runtime.buckets import parse_buckets
from laya_build.stages.common import check_sha256, skip, upstream

# Compilers this stage runs (torch.compile): part of its up-to-date check (laya_build.environment).
TOOLS = ("cxx",)
CHILD_MODULE = "laya_build.stages.children.latency"
DESCRIPTIONS = {
    "eager_amp": "eager, fp32 weights, {amp} autocast",
    "eager_bf16": "eager, explicit bf16 weights",
    "compiled_bf16": "torch.compile(dynamic={dynamic}, mode={mode}), explicit bf16",
    "package": "AOTInductor package ({dtype})",
    "package_graphed": "AOTInductor package ({dtype}) behind the runtime: {runner}",
}
# The variants measured once per package of the target; the others once per target.
PACKAGE_VARIANTS = ("package", "package_graphed")
RUNNERS = {"cuda": "a CUDA graph per bucket", "cpu": "padded to a bucket, no graphs on cpu"}


def markdown(record: dict, shapes: list[dict]) -> str:
    cols = [f"batch {i} ({s['rows']}x{s['tokens']}x{s['slots']})" for i, s in enumerate(shapes)]
    t = record["timing"]
    runs = [b["latency"]["runs"] for v in record["variants"] for b in v["batches"]]
    how = (
        f"adaptive_autorange for {t['min_run_time_s']:g} to {t['max_run_time_s']:g} s"
        if t.get("max_run_time_s")
        else f"blocked_autorange for {t['min_run_time_s']:g} s"
    )
    packages = ", ".join(f"{p['dtype']} (sha256 {p['sha256'][:16]})" for p in record["packages"]) or "none"
    lines = [
        f"# Latency: {record['target']}",
        "",
        f"Packages measured: {packages}.",
        *[f"Not measured: the {s['dtype']} package ({s['reason']})." for s in record["skipped_packages"]],
        "",
        f"Median ms per call after {t['warmup']} warm-ups, timed by torch.utils.benchmark's {how} "
        f"(each figure rests on {min(runs)} to {max(runs)} calls; the clock synchronises the device); "
        "batch shape rows x tokens x slots.  Deltas and argmax agreement are against eager AMP; decision "
        "probabilities are calibrated with the checkpoint's temperatures as upstream Laya publishes them "
        "(model.json `calibration`).",
        "",
        "| variant | what | " + " | ".join(cols) + " | decision argmax | act argmax | max decision prob delta |",
        "|---|---|" + "---:|" * len(cols) + "---:|---:|---:|",
    ]
    for v in record["variants"]:
        cells = [f"{b['latency']['median_ms']:.3f}" for b in v["batches"]]
        p = v["parity_vs_eager_amp"]
        if p is None:
            agree = ["reference", "reference", "-"]
        else:
            agree = [f"{p[h]['argmax_agree']}/{p[h]['rows']}" for h in ("decision", "act")]
            agree.append("n/a" if p["decision"]["max_prob_delta"] is None else f"{p['decision']['max_prob_delta']:.3g}")
        lines.append(f"| {variant_label(v)} | {v['description']} | " + " | ".join(cells + agree) + " |")
    gpu = gpu_sentence(record)
    if gpu:
        lines += ["", gpu]
    return "\n".join(lines) + "\n"


def target_variants(cfg: dict, target: str) -> list[str]:
    """``latency.variants`` of ``target``: the list, or the target's entry of a per-target mapping."""
    variants = cfg["variants"]
    if isinstance(variants, list):
        return variants
    if target not in variants:
        raise ConfigError(f"latency.variants has no list for target {target} (it lists {', '.join(variants)})")
    return variants[target]


def _package_records(paths, target: str) -> list[tuple[Path, dict]]:
    """The target's package records (read and validated), one per dtype."""
    records, seen = [], {}
    for path in map(Path, paths):
        pkg = upstream(path, "aoti_package")
        if pkg["target"] != target:
            raise StageError(f"{path} is for target {pkg['target']}, not {target}")
        if "dtype" not in pkg:
            raise StageError(
                f"{path}: a {pkg['status']} package record without a dtype; latency labels each package by its dtype"
            )
        if pkg["dtype"] in seen:
            raise StageError(f"two package records for {target}-{pkg['dtype']}: {seen[pkg['dtype']]} and {path}")
        seen[pkg["dtype"]] = path
        records.append((path, pkg))
    if not records:
        raise StageError(f"latency of target {target}: no package record given")
    return records


def run_latency(
    latency_cfg: dict, runtime_cfg: dict, checkpoint_dir, inputs_path, package_record_paths, out_dir, target: str
) -> dict:
    """Measure ``target``: the shared variants once, the package variants for each package
    record of ``package_record_paths`` (every dtype of the target, one record each)."""
    from laya_build.model.inputs import batch_shape, load_inputs

    start = time.perf_counter()
    cfg, runtime = latency_cfg, runtime_cfg
    out = Path(out_dir)
    records = _package_records(package_record_paths, target)
    if reason := unsupported_reason(target, aoti=True):
        return skip("latency", reason, target=target)
    skipped = [
        {"dtype": pkg["dtype"], "reason": f"aoti_package skipped: {pkg['reason']}"}
        for _, pkg in records
        if pkg["status"] == "skipped"
    ]
    if len(skipped) == len(records):
        return skip(
            "latency",
            f"every package of target {target} was skipped: "
            + "; ".join(f"{s['dtype']}: {s['reason']}" for s in skipped),
            target=target,
        )

    buckets = runtime["buckets"].get(target, [])
    packages = []
    measured = target_variants(cfg, target)
    if any(name in PACKAGE_VARIANTS for name in measured):
        for path, pkg in records:
            if pkg["status"] != "ok":
                continue
            main = next(p for p in pkg["programs"] if p["name"] == "decision")
            package_path = path.parent / main["package"]["path"]
            actual = check_sha256(package_path, main["package"]["sha256"], "package record", "; refusing to load it")
            parse_buckets(buckets, pkg["dims"], where=f"runtime.buckets.{target}")  # the package's own ranges
            library = pkg.get("native_library")
            packages.append(
                {
                    "dtype": pkg["dtype"],
                    "path": str(package_path),
                    "sha256": actual,
                    "dims": pkg["dims"],
                    "library": library and {"path": str(path.parent / library["path"]), "sha256": library["sha256"]},
                }
            )
    timing = cfg["timing"][target]
    out.mkdir(parents=True, exist_ok=True)
    job = {
        "checkpoint": str(checkpoint_dir),
        "inputs": str(inputs_path),
        "device": target,
        "variants": [n for n in measured if n not in PACKAGE_VARIANTS],
        "package_variants": [n for n in measured if n in PACKAGE_VARIANTS],
        "amp_dtype": cfg["amp_dtype"],
        "compile": cfg["compile"],
        "timing": timing,
        "packages": packages,
        "preload": cfg["preload"].get(target, []),
        "vec_isa_root": str(vec_isa_root()),
        "runtime": {"buckets": buckets, "capture_warmup": runtime["capture_warmup"]},
    }
    with inductor_cache(f"latency-{target}") as cache:
        child = Child(
            log=out / child_log_name("latency"),
            timeout=cfg["timeout_s"],
            reraise=True,
            env={"TORCHINDUCTOR_CACHE_DIR": str(cache)},
            label=f"latency measurement ({target})",
        )
        result = run(f"{CHILD_MODULE}:measure_variants", {"job": job}, child, result=True)

    names = {"amp": cfg["amp_dtype"], "runner": RUNNERS[target], **cfg["compile"]}
    shapes = [batch_shape(b) for b in load_inputs(inputs_path)["batches"]]
    variants = [
        {
            **v,
            "description": DESCRIPTIONS[v["name"]].format(**names, dtype=v.get("dtype")),
            "setup_s": round(v["setup_s"], 4),
            "first_calls_s": round(v["first_calls_s"], 4),
            "batches": [{**b, "shape": shapes[b["batch"]]} for b in v["batches"]],
        }
        for v in result["variants"]
    ]
    record = {
        "stage": "latency",
        "status": "ok",
        "target": target,
        "packages": [{"dtype": p["dtype"], "sha256": p["sha256"]} for p in packages],
        "skipped_packages": skipped,
        "inputs": {"sha256": sha256_file(inputs_path)},
        "timing": timing,
        "amp_dtype": cfg["amp_dtype"],
        "compile": cfg["compile"],
        "variants": variants,
        "markdown": LATENCY_TABLE_NAME,
        "device": device_snapshot(target),
        "versions": versions(),
        "elapsed_s": round(time.perf_counter() - start, 4),
    }
    check_record(out / record_name("latency"), record)  # nothing is written for an invalid record
    write_text(out / LATENCY_TABLE_NAME, markdown(record, shapes))
    return record
