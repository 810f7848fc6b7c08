"""Stage ``verify``: the package, alone in a fresh Python process, reproduces ``eager.pt``.

The stage runs :func:`laya_build.stages.children.verify.verify` in a fresh interpreter
(:func:`laya_build.runner.run`; see that module for what the child does and does not
import), with ``AOTI_RUNTIME_CHECK_INPUTS=1`` and a new, empty ``TORCHINDUCTOR_CACHE_DIR``
that is removed afterwards.  The child returns its measurements; the parent applies the thresholds of
``verify.thresholds.<target>.<dtype>`` and raises one exception class per failure kind
(:mod:`laya_build.errors`): :class:`PackageIntegrityError` (sha256 mismatch, found before
loading), :class:`InputsMismatchError` (eager outputs or inputs that do not belong to the
package), :class:`LogitParityError` / :class:`ProbabilityParityError` /
:class:`ArgmaxMismatchError` (naming program, batch, row, head and the numbers),
:class:`VerifyChildCrashError` (the child died by a signal: a failure naming the signal,
never a pass) and :class:`VerificationError` otherwise.

The decision program is also checked behind the serving runtime
(:class:`laya_build.runtime.DecisionRunner` with ``runtime.buckets.<target>``): CUDA graphs
on CUDA, padded plain calls on the CPU, against ``eager.pt`` with the same thresholds, and
on CUDA each graph replay against the plain call on the same padded inputs, bit for bit
(:class:`GraphReplayMismatchError`).  A package built for CPU vector instructions this CPU
lacks fails with :class:`PackageIsaError` before it is loaded.  The record's ``fresh_load``
breaks the child's time to its first answer down (imports, sha256, ISA answer, load,
graph capture, first call).

Verifications run side by side (one doit process per core), each child with torch's threads on
every core: the child runs with ``OMP_WAIT_POLICY=PASSIVE`` (unless the environment sets a policy),
so that OpenMP threads waiting for work sleep instead of spinning on the cores the other
verifications compute on (a warm fresh clone's ``doit release`` on the 2-core machine: 14.4 s
instead of 16.9–21.3 s, docs/measurements/cache.md).  The child records the policy it ran with.

The child loads ``verify.preload.<target>`` before loading (why: docs/guides/gpu-builds.md,
"How verify copes with the image's load crash"); if it still crashes, the signal is reported
as a failure.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from laya_build.errors import (
    ArgmaxMismatchError,
    ConfigError,
    GraphReplayMismatchError,
    LogitParityError,
    ProbabilityParityError,
    VerificationError,
    VerifyChildCrashError,
)
from laya_build.layout import child_log_name
from laya_build.log import get_logger
from laya_build.records import sha256_file
from laya_build.runner import Child, run
from laya_build.runner.folders import inductor_cache
from laya_build.runtime.buckets import parse_buckets
from laya_build.runtime.formats import HEADS, INPUTS_FORMAT
from laya_build.runtime.parity import summarize
from laya_build.stages.common import skip_if_blocked, upstream

CHILD_MODULE = "laya_build.stages.children.verify"
VERIFY_OMP_WAIT_POLICY = "PASSIVE"  # waiting OpenMP threads sleep: verifications share the cores
MEASURES = (("logit", "logits", LogitParityError), ("prob", "probabilities", ProbabilityParityError))


def _fmt(value) -> str:
    return "a non-finite amount" if value is None else f"{value:.3g}"


def parity_violations(program: dict, thresholds: dict) -> tuple[list[tuple[type, str]], list[str]]:
    """Every threshold a program's result exceeds, as ``(exception class, message)``, and the
    argmax differences excused as ties.

    An argmax difference fails unless the eager logits tie within ``logit_atol`` (the eager
    logit of the package's choice is that close to eager's top logit): logits may differ
    by that much, so such a choice is numerically indistinguishable from eager's.
    """
    where = "" if program["name"] == "decision" else f"{program['name']}: "
    found, ties = [], []
    for batch in program["batches"]:
        b = batch["batch"]
        for head in HEADS:
            limits, rows = thresholds[head], batch["compare"][head]
            for r in range(len(rows["argmax_ref"])):
                for key, label, cls in MEASURES:
                    delta, atol = rows[f"{key}_delta"][r], limits[f"{key}_atol"]
                    if delta is None or delta > atol:
                        found.append(
                            (cls, f"{where}{head} {label} of batch {b} row {r} differ by {_fmt(delta)} > atol {atol:g}")
                        )
                ref, got, margin = rows["argmax_ref"][r], rows["argmax_got"][r], rows["ref_margin"][r]
                if not limits.get("argmax", True) or ref == got:
                    continue
                text = (
                    f"{where}{head} argmax of batch {b} row {r} differs: package {got}, eager "
                    f"{ref}; eager prefers {ref} by {_fmt(margin)}"
                )
                if margin is not None and margin <= limits["logit_atol"]:
                    ties.append(f"{text} <= logit_atol {limits['logit_atol']:g} (a tie)")
                else:
                    found.append((ArgmaxMismatchError, f"{text} > logit_atol {limits['logit_atol']:g}"))
    return found, ties


def check_parity(programs: list[dict], thresholds: dict, files: str) -> list[list[str]]:
    """Raise for the first violation (mentioning how many more); return each program's ties."""
    checked = [parity_violations(p, thresholds) for p in programs]
    found = [v for violations, _ in checked for v in violations]
    if found:
        cls, message = found[0]
        more = f"; {len(found) - 1} more: " + "; ".join(m for _, m in found[1:4]) if len(found) > 1 else ""
        raise cls(f"{message} ({files}){more}")
    return [ties for _, ties in checked]


def runner_checks(programs: list[dict]) -> list[dict]:
    """The runner results as programs for :func:`check_parity` (named ``<program> runner``);
    raises :class:`GraphReplayMismatchError` when a graph replay differs from the plain call
    on the same padded inputs."""
    checked = []
    for p in programs:
        runner = p.get("runner")
        if runner is None:
            continue
        for b in runner["batches"]:
            diff = b["replay_vs_plain"]
            if diff is not None and any(v != 0 for v in diff.values()):
                raise GraphReplayMismatchError(
                    f"{p['name']}: the CUDA graph of bucket {b['bucket']} replayed batch {b['batch']} with "
                    f"max |difference| {diff} from the plain package call on the same padded inputs"
                )
        checked.append({"name": f"{p['name']} runner", "batches": runner["batches"]})
    return checked


def run_verify(
    verify_cfg: dict,
    runtime_cfg: dict,
    package_record_path,
    inputs_path,
    eager_path,
    out_dir,
    *,
    package_record: dict | None = None,
    inputs_format: int | None = None,
) -> dict:
    """Verify one package (``verify`` of a build): the effective ``verify`` and ``runtime``
    sections, the package record, the saved inputs and eager outputs; results in ``out_dir``.

    A release of an earlier format (:mod:`laya_build.release.formats`) passes its package record
    as its format read it (``package_record``) and the format of its saved inputs
    (``inputs_format``; default today's)."""
    start = time.perf_counter()
    cfg, runtime = verify_cfg, runtime_cfg
    package_record_path, eager_path, out = Path(package_record_path), Path(eager_path), Path(out_dir)
    pkg = package_record if package_record is not None else upstream(package_record_path, "aoti_package")
    target = pkg["target"]
    if (skipped := skip_if_blocked("verify", pkg, target)) is not None:
        return skipped
    thresholds = cfg["thresholds"].get(target, {}).get(pkg["dtype"])
    if thresholds is None:
        raise ConfigError(f"verify.thresholds.{target}.{pkg['dtype']} is not configured")

    buckets = runtime["buckets"].get(target, [])
    parse_buckets(buckets, pkg["dims"], where=f"runtime.buckets.{target}")  # the package's own ranges
    timing = cfg["timing"][target]
    package_dir = package_record_path.parent
    library = pkg.get("native_library")
    programs = [
        {
            "name": p["name"],
            "batches_key": p["batches_key"],
            "package": str(package_dir / p["package"]["path"]),
            "sha256": p["package"]["sha256"],
            "library": library and {"path": str(package_dir / library["path"]), "sha256": library["sha256"]},
            "eager": str(eager_path if p["name"] == "decision" else eager_path.with_name(p["eager"]["path"])),
        }
        for p in pkg["programs"]
    ]
    out.mkdir(parents=True, exist_ok=True)
    job = {
        "programs": programs,
        "inputs": str(Path(inputs_path)),
        "inputs_sha256": pkg["inputs"]["sha256"],
        "inputs_format": inputs_format or INPUTS_FORMAT,
        "target": target,
        "dtype": pkg["dtype"],
        "device": target,
        "preload": cfg["preload"].get(target, []),
        "timing": timing,
        "dims": pkg["dims"],
        "buckets": buckets,
        "capture_warmup": runtime["capture_warmup"],
    }
    with inductor_cache(f"verify-{target}-{pkg['dtype']}") as cache:
        child = Child(
            log=out / child_log_name("verify"),
            timeout=cfg["timeout_s"],
            reraise=True,
            crash_error=VerifyChildCrashError,
            label=f"verification process for {programs[0]['package']}",
            env={
                "TORCHINDUCTOR_CACHE_DIR": str(cache),
                "AOTI_RUNTIME_CHECK_INPUTS": "1",
                "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY") or VERIFY_OMP_WAIT_POLICY,
            },
        )
        result = run(f"{CHILD_MODULE}:verify", {"job": job}, child, result=True)
    runners = runner_checks(result["programs"])
    ties = check_parity(result["programs"] + runners, thresholds, f"package {programs[0]['package']} vs {eager_path}")
    runner_ties = dict(zip([r["name"] for r in runners], ties[len(result["programs"]) :]))
    if result["child"]["forbidden_modules_loaded"]:
        raise VerificationError(
            f"the verification process imported "
            f"{result['child']['forbidden_modules_loaded']}; it must load only the package"
        )

    record = {
        "stage": "verify",
        "status": "ok",
        "target": target,
        "dtype": pkg["dtype"],
        "package_record": {"sha256": sha256_file(package_record_path)},
        "inputs": {"sha256": pkg["inputs"]["sha256"]},
        "thresholds": thresholds,
        "timing": timing,
        "programs": [
            {
                **p,
                "package": {"sha256": spec["sha256"]},
                "eager": {"sha256": sha256_file(spec["eager"])},
                "summary": summarize([b["compare"] for b in p["batches"]]),
                "argmax_ties": program_ties,
                "load_s": round(p["load_s"], 4),
                **(
                    {"runner": {**p["runner"], "argmax_ties": runner_ties[f"{p['name']} runner"]}}
                    if "runner" in p
                    else {}
                ),
            }
            for p, spec, program_ties in zip(result["programs"], programs, ties)
        ],
        "fresh_load": result["fresh_load"],
        "inductor_cache": {
            "initial": result["cache_initial"],
            "after_run": result["cache_after_run"],
            "removed": cache.removed,
        },
        "child": result["child"],
        "elapsed_s": round(time.perf_counter() - start, 4),
    }
    return record


def verify_released(release_dir, build: str, out_dir) -> dict:
    """Verify the package ``build`` (``cpu-float32``) of a released version folder with the
    release's own configuration (its ``pipeline.effective.json``, which the manifest covers:
    ``verify:manifest`` checked every file first), read by the rules of the release's format
    (:mod:`laya_build.release.formats`); results in ``out_dir``, outside the release."""
    from laya_build.release.formats import read_release

    release = read_release(release_dir)
    target, dtype = build.split("-", 1)
    log = get_logger(__name__)
    log.info(f"verify {release.config['version']} {build}: read as {release.describe()}")
    record = run_verify(**release.verify_spec(target, dtype), out_dir=out_dir)
    said = f" ({record['reason']})" if record["status"] == "skipped" else ""
    log.info(f"verify {release.config['version']} {build}: {record['status']}{said}")
    return record
