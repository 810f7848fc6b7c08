"""The shared cache's cost and benefit: a cold `doit release` without and with a cache that is
written, then a fresh clone releasing from the warm cache.

Runs in throw-away copies of this checkout (default pipeline.yaml) with a throw-away folder
cache; every build has its own empty ``TMPDIR`` (cold compiler caches).  Prints one Markdown
table, the cache's own time from the cache report (computing keys, hashing and storing), and
the machine.  Wall-clock times of whole commands; the machine should be otherwise idle.

    .venv/bin/python benchmarks/bench_cache.py [--keep DIR] [--skip-plain]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_build import copy_checkout  # noqa: E402


def doit(dest: Path, *args: str, env: dict | None = None) -> tuple[float, str, str]:
    full = {**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": tempfile.mkdtemp(prefix="laya-bench-tmp-"), **(env or {})}
    full.pop("PYTHONPATH", None)
    for name in [k for k in full if k.startswith("LAYA_BUILD_CACHE")]:
        if not env or name not in env:
            full.pop(name)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=dest, env=full, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"doit {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout, proc.stderr


def report(dest: Path) -> list[dict]:
    path = dest / "artifacts" / ".doit" / "cache" / "0.1.0.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="build in this (empty) folder and keep it")
    parser.add_argument("--skip-plain", action="store_true", help="no cold release without a cache")
    args = parser.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="laya-bench-cache-"))
    base.mkdir(parents=True, exist_ok=True)
    cache = base / "cache"
    env = {"LAYA_BUILD_CACHE_URL": str(cache)}
    rows = []
    if not args.skip_plain:
        plain = base / "plain"
        plain.mkdir()
        copy_checkout(plain)
        seconds, _, _ = doit(plain, "release")
        rows.append(("cold `doit release`, no cache", seconds, ""))
    writer = base / "writer"
    writer.mkdir()
    copy_checkout(writer)
    seconds, _, _ = doit(writer, "release", env=env)
    lines = report(writer)
    stored = [r for r in lines if r["result"] == "stored"]
    own = sum(r.get("seconds", 0) for r in stored) + sum(r.get("key_s", 0) for r in lines if r["result"] == "built")
    size = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
    rows.append(
        (
            "cold `doit release`, cache written",
            seconds,
            f"{len(stored)} entries, {size / 1e6:.1f} MB; keys + storing: {own:.2f} s",
        )
    )
    clone = base / "clone"
    subprocess.run(["git", "clone", "-q", str(writer), str(clone)], check=True)
    seconds, out, err = doit(clone, "release", env=env)
    fetched = [r for r in report(clone) if r["result"] == "fetched"]
    ran = [line.split()[1] for line in out.splitlines() if line.startswith(". ")]
    rows.append(
        (
            "fresh clone, warm cache: `doit release`",
            seconds,
            f"{len(fetched)} tasks fetched; ran {len(ran) - len(fetched)}: "
            + ", ".join(sorted({t for t in ran if t not in {r["task"] for r in fetched}})),
        )
    )
    print("| command | seconds | notes |\n|---|---:|---|")
    for name, secs, note in rows:
        print(f"| {name} | {secs:.1f} | {note} |")
    load = os.getloadavg()[0]
    print(
        f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} cores, load {load:.2f}, "
        f"Python {platform.python_version()}"
    )
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
