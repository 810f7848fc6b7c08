"""Stage ``cuda_diff``: byte-level comparison of generated CUDA sources with a baseline.

Per file: identical or not, both sha256 and sizes, the first differing byte offset, and a
unified diff written next to the record when they differ.  The summary reads like
``10/10 identical``.
"""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path

from laya_build.atomic import write_text
from laya_build.errors import CudaSourceMismatch, StageError
from laya_build.layout import diff_name
from laya_build.log import get_logger
from laya_build.records import sha256_file


def first_difference(a: bytes, b: bytes) -> int | None:
    """Offset of the first differing byte (the shorter length if one is a prefix), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _side(path: Path) -> dict | None:
    if not path.is_file():
        return None
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def compare_file(name: str, current: Path, baseline: Path, diff_path: Path, diff_rel: str) -> dict:
    entry = {"file": name, "current": _side(current), "baseline": _side(baseline)}
    if entry["current"] is None:
        raise StageError(f"generated source {current} is missing", hint="`doit cuda_source` generates it")
    if entry["baseline"] is None:
        entry.update(identical=False, first_diff_offset=None, diff=None, note="missing in baseline")
        return entry
    if entry["current"]["sha256"] == entry["baseline"]["sha256"]:
        entry.update(identical=True, first_diff_offset=None, diff=None)
        return entry
    old, new = baseline.read_bytes(), current.read_bytes()
    lines = difflib.unified_diff(
        old.decode("utf-8", "replace").splitlines(keepends=True),
        new.decode("utf-8", "replace").splitlines(keepends=True),
        fromfile=f"baseline/{name}",
        tofile=f"current/{name}",
    )
    write_text(diff_path, "".join(lines))
    entry.update(identical=False, first_diff_offset=first_difference(old, new), diff=diff_rel)
    return entry


def run_cuda_diff(**spec) -> dict:
    """spec: files [{name, current, baseline}], diff_dir, diff_dir_rel, expect, baseline (description)."""
    diff_dir = Path(spec["diff_dir"])
    shutil.rmtree(diff_dir, ignore_errors=True)  # no diff of an earlier run survives
    files = [
        compare_file(
            f["name"],
            Path(f["current"]),
            Path(f["baseline"]),
            diff_dir / diff_name(f["name"]),
            f"{spec['diff_dir_rel']}/{diff_name(f['name'])}",
        )
        for f in spec["files"]
    ]
    same = sum(f["identical"] for f in files)
    record = {
        "stage": "cuda_diff",
        "baseline": spec["baseline"],
        "expect": spec["expect"],
        "files": files,
        "identical": same,
        "total": len(files),
        "summary": f"{same}/{len(files)} identical",
    }
    if spec["expect"] == "identical" and same != len(files):
        differing = ", ".join(f["file"] for f in files if not f["identical"])
        raise CudaSourceMismatch(f"{record['summary']} against {spec['baseline']['describe']}; differing: {differing}")
    get_logger(__name__).info(f"cuda_diff: {record['summary']} against {spec['baseline']['describe']}")
    return record
