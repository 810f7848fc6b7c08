"""A package's sha256 taken in a thread while the main thread imports torch, as
``laya_build.runtime.start`` does: ``hashlib.file_digest`` (256 KiB reads) against
``laya_build.runtime.digest`` (32 MiB blocks), each in fresh processes, side by side per round.

    python benchmarks/hash_probe.py FILE [--rounds 3]

Prints one JSON line per process (hash_s: the thread's time to its digest; import_s: torch's
import in the main thread; total_s: both done) and the machine.  The file should be in the page
cache (the first round reads it once before timing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import hashlib, json, sys, threading, time
sys.path.insert(0, sys.argv[3])
from laya_build.runtime.digest import sha256_of
path, how = sys.argv[1], sys.argv[2]
res = {}
def run():
    t = time.perf_counter()
    with open(path, "rb") as fh:
        res["sha256"] = hashlib.file_digest(fh, "sha256").hexdigest() if how == "file_digest" else sha256_of(fh)
    res["hash_s"] = round(time.perf_counter() - t, 3)
t0 = time.perf_counter()
th = threading.Thread(target=run)
th.start()
import torch
res["import_s"] = round(time.perf_counter() - t0, 3)
th.join()
res["total_s"] = round(time.perf_counter() - t0, 3)
print(json.dumps({"how": how, **res}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with open(args.file, "rb") as fh:  # into the page cache
        while fh.read(64 << 20):
            pass
    digests = set()
    for i in range(args.rounds):
        for how in ("file_digest", "blocks"):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(args.file), how, str(ROOT)],
                capture_output=True,
                text=True,
                check=True,
            )
            row = {"round": i, **json.loads(out.stdout.strip().splitlines()[-1])}
            digests.add(row.pop("sha256"))
            print(json.dumps(row), flush=True)
    print(
        json.dumps(
            {
                "same_digest": len(digests) == 1,
                "bytes": args.file.stat().st_size,
                "cpus": os.cpu_count(),
                "load": round(os.getloadavg()[0], 2),
                "python": platform.python_version(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
