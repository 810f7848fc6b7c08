"""REPORT.md of a release: stages, timings, checks, parity and latency tables, so a reviewer
can read a release without opening JSON."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from laya_build.layout import tir_flavour
from laya_build.release import model_report
from laya_build.release.markdown import table


def records_by_stage(vdir: Path) -> dict[str, list[tuple[str, dict]]]:
    by_stage: dict[str, list[tuple[str, dict]]] = defaultdict(list)
    for path in sorted(vdir.rglob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(record, dict) and "stage" in record and record["stage"] != "manifest":
            by_stage[record["stage"]].append((path.relative_to(vdir).as_posix(), record))
    return by_stage


def _kernel_sections(recs) -> list[str]:
    out = []
    if recs.get("lower_c"):
        rows = [
            [
                r["variant"],
                len(r["checks"]),
                f"{r['max_abs_err']:.2e}",
                f"{min(c['atol'] for c in r['checks']):.0e}",
                "exact" if all(c["exact"] for c in r["checks"]) else "NOT exact",
                "pass" if r["passed"] else "FAIL",
            ]
            for _, r in recs["lower_c"]
        ]
        out += [
            "## CPU (C target) numerical checks\n",
            table(["variant", "shapes", "max abs err", "atol", "in-place updates", "result"], rows),
        ]
    if recs.get("probe_c"):
        rows = [
            [
                r["variant"],
                r["specialisation"],
                r["dtype"],
                r["outcome"],
                r["exception_type"],
                (r["message"] or "")[:90],
                r["pin"]["status"],
            ]
            for _, r in recs["probe_c"]
        ]
        out += [
            "## Target-c probe of the GPU specialisations\n",
            table(["variant", "spec.", "dtype", "outcome", "exception", "message", "pin"], rows),
        ]
    if recs.get("cuda_source"):
        rows = [
            [r["source"], r["target"]["arch"], r["bytes"], r["sha256"][:16]]
            for _, r in recs["cuda_source"]
            if r.get("kernels", "worktree") == "worktree"
        ]
        out += ["## CUDA sources\n", table(["file", "arch", "bytes", "sha256"], rows)]
    for _, r in recs.get("cuda_diff", []):
        out += [f"CUDA sources against {r['baseline']['describe']}: **{r['summary']}** (expect: {r['expect']}).\n"]
        changed = [[f["file"], f["first_diff_offset"], f["diff"]] for f in r["files"] if not f["identical"]]
        if changed:
            out += [table(["file", "first differing byte", "diff"], changed)]
    if recs.get("tir"):
        rows = [
            [r["variant"], tir_flavour(r["dtype"], r["cpu"]), r["structural_hash"], r["script_sha256"][:16]]
            for _, r in recs["tir"]
        ]
        out += ["## TIR\n", table(["variant", "flavour", "structural hash", "script sha256"], rows)]
    return out


def render_report(vdir: Path, config: dict, env: dict, git: dict) -> str:

    recs = records_by_stage(Path(vdir))
    head = [
        f"# Release {config['version']}\n",
        f"- git commit: `{git.get('commit')}`{' (dirty tree)' if git.get('dirty') else ''}",
        f"- toolchain: torch {env['packages'].get('torch')}, tilelang {env['packages'].get('tilelang')}, "
        f"TVM {env.get('tvm')}, transformers {env['packages'].get('transformers')}, Python {env['python']}",
        f"- compilers: {env.get('cc')}; nvcc: {env.get('nvcc')}",
        f"- GPU: {'yes (nvidia-smi -q in manifest.json)' if env.get('nvidia_smi') else 'none'}\n",
    ]
    stages = [
        [
            stage,
            len(items),
            round(sum(r.get("elapsed_s", 0) or 0 for _, r in items), 2),
            sum(1 for _, r in items if r.get("status") == "skipped"),
        ]
        for stage, items in sorted(recs.items())
    ]
    body = ["## Stages\n", table(["stage", "records", "time (s)", "skipped"], stages)]
    body += _kernel_sections(recs)
    body += model_report.sections(recs)
    return "\n".join(head + body)
