"""Build-speed benchmark: cold `doit release`, no-op `doit`, `doit list`, a one-kernel edit.

Runs in a throw-away copy of this checkout (its own git repository and artifacts/, so the
measured build starts cold and the checkout's own artifacts are untouched) with the default
pipeline.yaml, and prints one Markdown table plus the machine.  Wall-clock times of whole
commands, as a release engineer sees them; the machine should be otherwise idle.

By default cold means cold everywhere: every command runs with its own empty ``TMPDIR``,
so the per-user compiler caches that outlive a build (Inductor's precompiled headers under
``$TMPDIR/torchinductor_<user>``, the CPU-ISA checks under ``$TMPDIR/laya-build-<uid>``)
start empty too.  ``--warm-caches`` keeps the user's ``TMPDIR`` (a new checkout on a machine
that has built before: the artifacts are cold, those compiler caches are not).

    .venv/bin/python benchmarks/bench_build.py [--keep DIR] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def copy_checkout(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for rel in files:
        if (ROOT / rel).is_file() and not rel.startswith("tests/"):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "b",
        "GIT_AUTHOR_EMAIL": "b@b",
        "GIT_COMMITTER_NAME": "b",
        "GIT_COMMITTER_EMAIL": "b@b",
    }
    for cmd in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "benchmark copy"]):
        subprocess.run(["git", *cmd], cwd=dest, env=env, check=True, capture_output=True)


TMPDIR: dict[str, str] = {}  # {"TMPDIR": <the benchmark's own>} unless --warm-caches


def timed(dest: Path, *args: str) -> tuple[float, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **TMPDIR}
    env.pop("PYTHONPATH", None)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=dest, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"doit {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout


def executed(stdout: str) -> int:
    return sum(1 for line in stdout.splitlines() if line.startswith(". "))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="build in this (empty) folder and keep it")
    parser.add_argument("--repeat", type=int, default=5, help="runs of the quick commands (median)")
    parser.add_argument(
        "--warm-caches", action="store_true", help="keep the user's TMPDIR (warm per-user compiler caches)"
    )
    args = parser.parse_args()
    dest = args.keep or Path(tempfile.mkdtemp(prefix="laya-bench-"))
    dest.mkdir(parents=True, exist_ok=True)
    copy_checkout(dest)
    if not args.warm_caches:
        (dest / ".bench-tmp").mkdir()
        TMPDIR["TMPDIR"] = str(dest / ".bench-tmp")
    rows = []
    load_before = os.getloadavg()[0]
    cold, out = timed(dest, "release")
    rows.append(("cold `doit release` (default pipeline.yaml)", cold, executed(out)))
    kernels, out = timed(dest, "version=0.2.0")  # an unreleased version for the iteration loop
    rows.append(("cold `doit` (default tasks: the kernel stages)", kernels, executed(out)))
    noop = [timed(dest, "version=0.2.0") for _ in range(args.repeat)]
    rows.append(("no-op `doit`", statistics.median(t for t, _ in noop), executed(noop[-1][1])))
    listing = [timed(dest, "list")[0] for _ in range(args.repeat)]
    rows.append(("`doit list`", statistics.median(listing), 0))
    rope = dest / "kernels" / "rope.py"
    original = rope.read_text()
    rope.write_text(original + "\n# benchmark edit\n")
    edit, out = timed(dest, "version=0.2.0")
    rows.append(("one-kernel edit (kernels/rope.py), then `doit`", edit, executed(out)))
    rope.write_text(original)
    print(f"# laya-build build benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, load average before: {load_before:.2f}; compiler caches: "
        f"{'warm (the user TMPDIR)' if args.warm_caches else 'empty (own TMPDIR)'}"
    )
    print()
    print("| what | wall s | tasks run |")
    print("|---|---:|---:|")
    for what, seconds, n in rows:
        print(f"| {what} | {seconds:.2f} | {n} |")
    if not args.keep:
        shutil.rmtree(dest, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
