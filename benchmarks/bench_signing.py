"""What signing and checking a release costs, by the size of its package.

Makes a release-shaped folder (a ``decision.pt2`` of random bytes of the given size and a few
small files), then times, side by side in one process: the sha256 of the package alone, signing
the folder (``laya_build.release.signing.sign``: model-signing hashes every file, then signs), and
checking it (``signing.check``: the bundle, the key, every file's digest again).

    .venv/bin/python benchmarks/bench_signing.py --mb 10 --mb 745 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


def folder(root: Path, mb: int) -> Path:
    vdir = root / f"release-{mb}"
    (vdir / "aoti_package" / "cuda-bfloat16").mkdir(parents=True)
    with open(vdir / "aoti_package" / "cuda-bfloat16" / "decision.pt2", "wb") as fh:
        for _ in range(mb):
            fh.write(os.urandom(1 << 20))
    for i in range(40):
        (vdir / f"record-{i}.json").write_text(json.dumps({"i": i}) + "\n")
    return vdir


def timed(fn, repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> None:
    from laya_build.records import sha256_file
    from laya_build.release import keys, signing

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, action="append", help="package size in MiB (repeatable)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        private, public, _ = keys.new(str(root / "bench"))
        key = signing.signing_key({"key": str(private)}, root, environ={})
        trusted = signing.trusted_keys({"keys": [str(public)]}, root, environ={})
        print("| package MiB | sha256 of the package s | sign s | check s |")
        print("|---:|---:|---:|---:|")
        for mb in args.mb or [10]:
            vdir = folder(root, mb)
            package = vdir / "aoti_package" / "cuda-bfloat16" / "decision.pt2"
            sha = timed(lambda package=package: sha256_file(package), args.repeat)
            sign = timed(lambda vdir=vdir: signing.sign(vdir, key), args.repeat)
            check = timed(lambda vdir=vdir: signing.check(vdir, trusted), args.repeat)
            print(f"| {mb} | {sha:.3f} | {sign:.3f} | {check:.3f} |")


if __name__ == "__main__":
    main()
