"""Latency of CUDA packages of one export side by side, in one process, interleaved.

    python benchmarks/package_latency.py EXPORT_DIR INPUTS_PT NAME=PACKAGE.pt2 ... [--out FILE]

Each package is loaded through the project's runtime (``laya_build.runtime.load_package``,
single-threaded) behind a :class:`laya_build.runtime.DecisionRunner` with CUDA-graph buckets at
the measured shapes (default 1x128x3 and 7x256x4: rows x tokens x slots).  Then, ROUNDS times,
for each shape and each package in turn: the graph replay (``replay_before_plain``, after the
package before it), the plain padded call, and the graph replay again (``replay``, right after the
plain call: on the H200 a graph of this model replays faster there, see
docs/measurements/runtime-h200.md, "two replay speeds"), each timed with
:func:`laya_build.runtime.timing.time_calls` (TIMING, JSON).  Reports per package and shape
the median over rounds of each round's median, every round's figure, and whether the outputs
of the packages are equal.  Interleaving keeps clock and thermal drift out of the comparison.
``--profile N`` then, after all timing, records per package and shape N graph replays under
torch.profiler: the GPU work of one forward (kernels, memsets and copies: count, GPU time, the
span from the first one's start to the last one's end) and every kernel by name, the most time
first.  ``--launch N`` times N replays of each package and shape without a profiler: the host's
time in each ``replay()`` call alone, and N replays back to back by CUDA events and by the wall
clock.
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


def package_arguments(description: str) -> argparse.ArgumentParser:
    """A parser with the arguments of a script over packages of one export: the export's folder,
    the saved inputs, ``NAME=PATH`` of each ``decision.pt2``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("export_dir")
    parser.add_argument("inputs")
    parser.add_argument("packages", nargs="+", help="NAME=PATH of a decision.pt2")
    return parser


def main(argv=None) -> int:
    parser = package_arguments(__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1x128x3,7x256x4")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--timing", default='{"warmup": 10, "min_run_time_s": 0.4}')
    parser.add_argument("--preload", default="tilelang")
    parser.add_argument("--out", default="latency.json")
    parser.add_argument("--profile", type=int, default=0, help="graph replays to profile per package and shape")
    parser.add_argument(
        "--launch",
        type=int,
        default=0,
        help="graph replays per package and shape timed on the host (the launch call alone) and by CUDA events",
    )
    parser.add_argument(
        "--blas",
        action="append",
        default=[],
        metavar="NAME=LIBRARY",
        help="capture NAME's graphs with torch.backends.cuda.preferred_blas_library(LIBRARY) (its replays "
        "run the GEMM kernels chosen then; its plain calls the process's default); repeatable",
    )
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
    blas = dict(spec.split("=", 1) for spec in args.blas)
    default_blas = torch.backends.cuda.preferred_blas_library()
    for spec in args.packages:
        name, _, path = spec.partition("=")
        with open(path, "rb") as fh:
            sha = hashlib.file_digest(fh, "sha256").hexdigest()
        torch.backends.cuda.preferred_blas_library(blas.get(name, default_blas))
        try:  # the graphs are captured here, with the GEMM kernels of that library
            runners[name] = runtime.DecisionRunner(
                runtime.load_package(path, sha, library=runtime.library_beside(path)), dims=exp["dims"], buckets=buckets
            )
        finally:
            torch.backends.cuda.preferred_blas_library(default_blas)
        result["packages"][name] = {"path": path, "sha256": sha, "blas_at_capture": str(blas.get(name, default_blas))}
    inputs = torch.load(args.inputs, weights_only=True)
    device = str(next(iter(runners.values())).device)
    rows, replays = {}, {}
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
            if bucket in runner.graphs:  # timed before the plain call and right after it
                replay = (runner.graphs[bucket].replay, ())
                cases[name] = {"replay_before_plain": replay, **cases[name], "replay": replay}
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
        replays[shape] = {n: cases[n]["replay"][0] for n in runners if "replay" in cases[n]}
        rows[shape]["median_ms"] = {
            n: {m: statistics.median(v) for m, v in modes.items()} for n, modes in rows[shape]["ms"].items()
        }
        result["shapes"] = rows
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(shape, json.dumps(rows[shape]["median_ms"]), rows[shape]["outputs_equal_to_first"], flush=True)
    for shape, graphed in replays.items() if args.launch else ():
        rows[shape]["launch"] = {n: launch_times(torch, replay, args.launch) for n, replay in graphed.items()}
        Path(args.out).write_text(json.dumps(result, indent=1))
    for shape, graphed in replays.items() if args.profile else ():  # after every timing: no profiler state in them
        rows[shape]["profile"] = {n: kernel_profile(torch, replay, args.profile) for n, replay in graphed.items()}
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


def launch_times(torch, replay, calls: int) -> dict:
    """Where a replay's time goes without a profiler: the host's time in each ``replay()`` call
    (the launch alone, the GPU idle before it), and the GPU's time for ``calls`` replays back to
    back, from CUDA events recorded around them, against the wall time of the same replays."""
    torch.cuda.synchronize()
    host = []
    for _ in range(calls):
        start = time.perf_counter()
        replay()
        host.append(time.perf_counter() - start)
        torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    wall = time.perf_counter()
    begin.record()
    for _ in range(calls):
        replay()
    end.record()
    end.synchronize()
    wall = time.perf_counter() - wall
    return {
        "calls": calls,
        "host_launch_us_median": round(statistics.median(host) * 1e6, 2),
        "events_us_per_replay": round(begin.elapsed_time(end) * 1e3 / calls, 2),
        "wall_us_per_replay": round(wall * 1e6 / calls, 2),
    }


def kernel_profile(torch, replay, calls: int, top: int | None = None) -> dict:
    """The GPU work of one ``replay()`` (a forward), from torch.profiler's trace of ``calls`` of
    them: kernels, memsets and copies, their time, and the span from the first one's start to
    the last one's end."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    if not gpu:
        return {"calls": calls, "events_per_forward": 0}
    by_name: dict[str, list[float]] = {}
    for e in gpu:
        by_name.setdefault(f"{e['cat']}: {e['name'][:160]}", []).append(float(e["dur"]))
    busy = sum(float(e["dur"]) for e in gpu)
    span = max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu)
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]  # top None: every kernel
    return {
        "calls": calls,
        "events_per_forward": round(len(gpu) / calls, 2),
        "kernels_per_forward": round(sum(e["cat"] == "kernel" for e in gpu) / calls, 2),
        "gpu_us_per_forward": round(busy / calls, 2),
        "span_us_per_forward": round(span / calls, 2),
        "top": [
            {"name": name, "per_forward": round(len(us) / calls, 2), "us_per_forward": round(sum(us) / calls, 2)}
            for name, us in ranked
        ],
    }


if __name__ == "__main__":
    sys.exit(main())
