"""Latency of CUDA packages of one export side by side, in one process, interleaved.

    python benchmarks/package_latency.py EXPORT_DIR INPUTS_PT NAME=PACKAGE.pt2 ... [--out FILE]

Each package is loaded through the project's runtime (``laya_build.runtime.load_package``,
single-threaded) behind a :class:`laya_build.runtime.DecisionRunner` with CUDA-graph buckets at
the measured shapes (default 1x128x3 and 7x256x4: rows x tokens x slots).  Then, ROUNDS times,
for each shape and each package in turn: the graph replay and the plain padded call, each timed
with :func:`laya_build.runtime.timing.time_calls` (TIMING, JSON).  Reports per package and shape
the median over rounds of each round's median, every round's figure, and whether the outputs
of the packages are equal.  Interleaving keeps clock and thermal drift out of the comparison.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir")
    parser.add_argument("inputs")
    parser.add_argument("packages", nargs="+", help="NAME=PATH of a decision.pt2")
    parser.add_argument("--shapes", default="1x128x3,7x256x4")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--timing", default='{"warmup": 10, "min_run_time_s": 0.4}')
    parser.add_argument("--preload", default="tilelang")
    parser.add_argument("--out", default="latency.json")
    args = parser.parse_args(argv)

    import torch
    from runtime_bench import parse_shapes, synthetic_call

    from laya_build import runtime
    from laya_build.runtime.timing import time_calls

    runtime.preload_modules([m for m in args.preload.split(",") if m])
    exp = json.loads((Path(args.export_dir) / "export.json").read_text())
    shapes = parse_shapes(args.shapes)
    timing = json.loads(args.timing)
    buckets = [{"rows": r, "tokens": t, "slots": s} for r, t, s in shapes]
    runners = {}
    result = {
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "timing": timing,
        "rounds": args.rounds,
        "packages": {},
    }
    for spec in args.packages:
        name, _, path = spec.partition("=")
        with open(path, "rb") as fh:
            sha = hashlib.file_digest(fh, "sha256").hexdigest()
        runners[name] = runtime.DecisionRunner(runtime.load_package(path, sha), dims=exp["dims"], buckets=buckets)
        result["packages"][name] = {"path": path, "sha256": sha}
    inputs = torch.load(args.inputs, weights_only=True)
    device = str(next(iter(runners.values())).device)
    rows = {}
    for r, t, s in shapes:
        shape = f"{r}x{t}x{s}"
        call = tuple(x.to(device) for x in synthetic_call(inputs, r, t, s))
        outs, cases = {}, {}
        for name, runner in runners.items():
            bucket = runner.bucket_for(r, t, s)
            padded = runner.padded_inputs(call)
            with torch.inference_mode():
                outs[name] = [o.float().cpu() for o in runner(*call)]
            cases[name] = {"plain": (runner.plain, padded)}
            if bucket in runner.graphs:
                cases[name]["replay"] = (runner.graphs[bucket].replay, ())
        first = next(iter(outs.values()))
        rows[shape] = {
            "outputs_equal_to_first": {n: all(torch.equal(a, b) for a, b in zip(first, o)) for n, o in outs.items()},
            "max_abs_vs_first": {n: max(float((a - b).abs().max()) for a, b in zip(first, o)) for n, o in outs.items()},
            "ms": {n: {m: [] for m in cases[n]} for n in runners},
        }
        for _ in range(args.rounds):
            for name in runners:
                for mode, (fn, fn_args) in cases[name].items():
                    rows[shape]["ms"][name][mode].append(time_calls(fn, fn_args, timing, device)["median_ms"])
        rows[shape]["median_ms"] = {
            n: {m: statistics.median(v) for m, v in modes.items()} for n, modes in rows[shape]["ms"].items()
        }
        result["shapes"] = rows
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(shape, json.dumps(rows[shape]["median_ms"]), rows[shape]["outputs_equal_to_first"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
