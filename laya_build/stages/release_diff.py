"""Stage ``release_diff``: what changed between two releases, as JSON and Markdown.

Both versions must be released (their files are checked against their manifests first).
Compared: every file by sha256 (added / removed / changed), CUDA and C sources byte for byte
with unified diffs, TIR structural hashes, packages, verification deltas and latencies side
by side.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from laya_build.atomic import write_text
from laya_build.layout import DIFFS_DIR, RELEASE_DIFF_RECORD_NAME, RELEASE_DIFF_REPORT_NAME, diff_name, tir_flavour
from laya_build.records import check_record
from laya_build.release import check_files, model_report
from laya_build.release.report import records_by_stage, table
from laya_build.stages.cuda_diff import compare_file


def _sources(
    old_dir: Path, new_dir: Path, old_files: dict, new_files: dict, folder: str, suffix: str, out: Path, out_rel: str
):
    """The built sources of ``folder`` (``cuda/``, ``lower_c/``; not the cuda_diff baselines)."""
    names = sorted(n for n in set(old_files) | set(new_files) if n.startswith(folder) and n.endswith(suffix))
    rows = []
    for name in names:
        if name not in new_files:
            rows.append({"file": name, "status": "removed"})
            continue
        if name not in old_files:
            rows.append({"file": name, "status": "added"})
            continue
        entry = compare_file(
            name,
            new_dir / name,
            old_dir / name,
            out / DIFFS_DIR / diff_name(name),
            f"{out_rel}/{DIFFS_DIR}/{diff_name(name)}",
        )
        rows.append(
            {
                "file": name,
                "status": "identical" if entry["identical"] else "changed",
                "old_sha256": entry["baseline"]["sha256"],
                "new_sha256": entry["current"]["sha256"],
                "first_diff_offset": entry["first_diff_offset"],
                "diff": entry["diff"],
            }
        )
    return rows


def _tir(old_recs: dict, new_recs: dict) -> list[dict]:
    def by_key(recs):
        return {
            f"{r['variant']}.{tir_flavour(r['dtype'], r['cpu'])}": r["structural_hash"] for _, r in recs.get("tir", [])
        }

    old, new = by_key(old_recs), by_key(new_recs)
    return [
        {"kernel": k, "old": old.get(k), "new": new.get(k), "changed": old.get(k) != new.get(k)}
        for k in sorted(set(old) | set(new))
    ]


def run_release_diff(**spec) -> dict:
    """spec: artifacts (root), old, new, out (folder), out_rel (its path relative to artifacts)."""
    root = Path(spec["artifacts"])
    old_dir, new_dir, out = root / spec["old"], root / spec["new"], Path(spec["out"])
    old_m, new_m = check_files(old_dir), check_files(new_dir)
    old_recs, new_recs = records_by_stage(old_dir), records_by_stage(new_dir)  # each folder read once
    shutil.rmtree(out, ignore_errors=True)  # a fresh report, no diff of an earlier one
    old_files = {f["path"]: f for f in old_m["files"]}
    new_files = {f["path"]: f for f in new_m["files"]}
    both = set(old_files) & set(new_files)
    files = {
        "added": sorted(set(new_files) - set(old_files)),
        "removed": sorted(set(old_files) - set(new_files)),
        "changed": sorted(n for n in both if old_files[n]["sha256"] != new_files[n]["sha256"]),
        "unchanged": len([n for n in both if old_files[n]["sha256"] == new_files[n]["sha256"]]),
    }
    cuda = _sources(old_dir, new_dir, old_files, new_files, "cuda/", ".cu", out, spec["out_rel"])
    csrc = _sources(old_dir, new_dir, old_files, new_files, "lower_c/", ".c", out, spec["out_rel"])
    record = {
        "stage": "release_diff",
        "old": {
            "version": spec["old"],
            "commit": old_m["git"]["commit"],
            "pipeline_sha256": old_m["pipeline"]["sha256"],
        },
        "new": {
            "version": spec["new"],
            "commit": new_m["git"]["commit"],
            "pipeline_sha256": new_m["pipeline"]["sha256"],
        },
        "files": files,
        "cuda_sources": cuda,
        "c_sources": csrc,
        "tir": _tir(old_recs, new_recs),
        "model": model_report.diff(old_recs, new_recs),
    }
    record["summary"] = {
        "cuda_changed": [r["file"] for r in cuda if r["status"] != "identical"],
        "c_changed": [r["file"] for r in csrc if r["status"] != "identical"],
        "tir_changed": [r["kernel"] for r in record["tir"] if r["changed"]],
    }
    check_record(out / RELEASE_DIFF_RECORD_NAME, record)
    write_text(out / RELEASE_DIFF_REPORT_NAME, render(record))
    return record


def render(record: dict) -> str:
    old, new = record["old"]["version"], record["new"]["version"]
    s = record["summary"]
    same_config = record["old"]["pipeline_sha256"] == record["new"]["pipeline_sha256"]
    parts = [
        f"# Release diff {old} → {new}\n",
        f"- commits: `{record['old']['commit']}` → `{record['new']['commit']}`",
        f"- pipeline config: {'same' if same_config else 'changed'}",
        f"- files: {len(record['files']['changed'])} changed, {len(record['files']['added'])} added, "
        f"{len(record['files']['removed'])} removed, {record['files']['unchanged']} unchanged",
        f"- CUDA sources changed: {', '.join(s['cuda_changed']) or 'none'}",
        f"- C sources changed: {', '.join(s['c_changed']) or 'none'}",
        f"- TIR changed: {', '.join(s['tir_changed']) or 'none'}\n",
    ]
    for title, rows in (("CUDA sources", record["cuda_sources"]), ("C sources", record["c_sources"])):
        parts += [
            f"## {title}\n",
            table(
                ["file", "status", "first differing byte", "diff"],
                [[r["file"], r["status"], r.get("first_diff_offset"), r.get("diff")] for r in rows],
            ),
        ]
    parts += [
        "## TIR structural hashes\n",
        table(
            ["kernel", old, new, "changed"], [[r["kernel"], r["old"], r["new"], r["changed"]] for r in record["tir"]]
        ),
    ]
    parts += model_report.diff_sections(record["model"], old, new)
    for kind in ("changed", "added", "removed"):
        if record["files"][kind]:
            parts += [f"## Files {kind}\n", "\n".join(f"- `{f}`" for f in record["files"][kind]) + "\n"]
    return "\n".join(parts)
