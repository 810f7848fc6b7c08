"""Latency of CUDA packages of one export side by side, interleaved, each in a process of its own.

    python benchmarks/package_latency.py EXPORT_DIR INPUTS_PT NAME=PACKAGE.pt2 ... [--out FILE]

Each package is loaded, in a process of its own (a process holds one build of the native op
library, and two packages may ship different ones), through the project's runtime
(``laya_build.runtime.load_package``, single-threaded) behind a
:class:`laya_build.runtime.DecisionRunner` with CUDA-graph buckets at the measured shapes
(default 1x128x3 and 7x256x4: rows x tokens x slots; ``--fill``: every position of a row real,
the default, or each row its saved decision's own length and then padding); one process runs at a
time.  Then, ROUNDS
times, for each shape and each package in turn: the graph replay (``replay_before_plain``, after the
package before it), the plain padded call, and the graph replay again (``replay``, right after the
plain call: on the H200 a graph of this model replays faster there, see
docs/measurements/runtime-h200.md, "two replay speeds"), each timed with
:func:`laya_build.runtime.timing.time_calls` (TIMING, JSON).  Reports per package and shape
the median over rounds of each round's median, every round's figure with the GPU's clocks,
power and clock limits while it was timed (``gpu``, :mod:`laya_build.runtime.gpu_state`), and
whether the outputs of the packages are equal.  Interleaving keeps clock and thermal drift out of the comparison.
``--profile N`` then, after all timing, records per package and shape N graph replays under
torch.profiler: the GPU work of one forward (kernels, memsets and copies: count, GPU time, the
span from the first one's start to the last one's end), every kernel by name, the most time
first, and the first replay's events in order with the idle time before each.  ``--launch N``
times N replays of each package and shape without a profiler: the host's time in each
``replay()`` call alone, and N replays back to back by CUDA events and by the wall clock.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
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
    parser.add_argument(
        "--fill",
        default="full",
        choices=("full", "saved"),
        help="full: every position of a row real (the saved tokens repeated); saved: each row its saved "
        "decision's own length, then padding",
    )
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
    from runtime_bench import parse_shapes

    shapes = parse_shapes(args.shapes)
    timing = json.loads(args.timing)
    result = {
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "timing": timing,
        "rounds": args.rounds,
        "fill": args.fill,
        "process": os.getpid(),
        "packages": {},
    }
    blas = dict(spec.split("=", 1) for spec in args.blas)
    setup = {"export_dir": args.export_dir, "inputs": args.inputs, "shapes": shapes, "timing": timing}
    setup["fill"] = args.fill
    setup["preload"] = [m for m in args.preload.split(",") if m]
    workers = {}
    try:
        for spec in args.packages:  # loaded side by side, each in its own process
            name, _, path = spec.partition("=")
            workers[name] = Worker(name, {**setup, "path": path, "blas": blas.get(name)})
        for name, worker in workers.items():
            ready = worker.answer()
            result["packages"][name] = {"path": worker.path, **ready["package"]}
            worker.outputs = ready["outputs"]
        run_rounds(torch, args, result, workers)
    finally:
        for worker in workers.values():
            worker.stop()
    return 0


def run_rounds(torch, args, result: dict, workers: dict) -> None:
    """For each shape, every package's outputs against the first one's, then ``args.rounds``
    rounds, each timing every package's modes in turn; then the launch times and the profiles."""
    rows = {}
    for shape in next(iter(workers.values())).outputs:
        outs = {name: w.outputs[shape]["out"] for name, w in workers.items()}
        modes = {name: w.outputs[shape]["modes"] for name, w in workers.items()}
        first = next(iter(outs.values()))
        rows[shape] = {
            "outputs_equal_to_first": {n: all(torch.equal(a, b) for a, b in zip(first, o)) for n, o in outs.items()},
            "max_abs_vs_first": {n: max(float((a - b).abs().max()) for a, b in zip(first, o)) for n, o in outs.items()},
            "ms": {n: {m: [] for m in modes[n]} for n in workers},
            "gpu": {n: {m: [] for m in modes[n]} for n in workers},
        }
        for _ in range(args.rounds):
            for name, worker in workers.items():
                for mode in modes[name]:
                    timed = worker.ask("time", shape, mode)
                    rows[shape]["ms"][name][mode].append(timed["ms"])
                    rows[shape]["gpu"][name][mode].append(timed["gpu"])
        rows[shape]["median_ms"] = {
            n: {m: statistics.median(v) for m, v in by_mode.items()} for n, by_mode in rows[shape]["ms"].items()
        }
        result["shapes"] = rows
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(shape, json.dumps(rows[shape]["median_ms"]), rows[shape]["outputs_equal_to_first"], flush=True)
    for what, calls in (("launch", args.launch), ("profile", args.profile)):  # the profiler after every timing
        for shape in rows if calls else ():
            graphed = [n for n, w in workers.items() if "replay" in w.outputs[shape]["modes"]]
            rows[shape][what] = {n: workers[n].ask(what, shape, calls) for n in graphed}
            Path(args.out).write_text(json.dumps(result, indent=1))


class Worker:
    """One package in a process of its own (a process holds one build of the native op library,
    laya_build.runtime.serving.load_library, and packages of one export may ship different ones),
    timed on request; only one worker runs at a time, so the timings stay side by side."""

    def __init__(self, name: str, setup: dict):
        import multiprocessing

        self.name, self.path, self.outputs = name, setup["path"], None
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(child, setup), name=f"latency-{name}", daemon=True)
        self.process.start()
        child.close()

    def answer(self):
        try:
            kind, value = self.conn.recv()
        except EOFError:
            raise SystemExit(f"{self.name}: its process ended (exit code {self.process.exitcode})") from None
        if kind == "error":
            raise SystemExit(f"{self.name} ({self.path}) failed in its process:\n{value}")
        return value

    def ask(self, *request):
        self.conn.send(request)
        return self.answer()

    def stop(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(("stop",))
            except OSError:
                pass
            self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def serve(conn, setup: dict) -> None:
    """A worker: load the package behind a DecisionRunner, send its outputs and what it can time
    at each shape, then answer ``("time", shape, mode)``, ``("launch", shape, calls)`` and
    ``("profile", shape, calls)`` until ``("stop",)``."""
    import traceback

    sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
    try:
        import torch
        from runtime_bench import synthetic_call

        from laya_build import runtime
        from laya_build.runtime.timing import time_calls

        runtime.preload_modules(setup["preload"])
        exp = json.loads((Path(setup["export_dir"]) / "export.json").read_text())
        path = setup["path"]
        with open(path, "rb") as fh:
            sha = hashlib.file_digest(fh, "sha256").hexdigest()
        buckets = [{"rows": r, "tokens": t, "slots": s} for r, t, s in setup["shapes"]]
        library = runtime.library_beside(path)
        default_blas = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library(setup["blas"] or default_blas)
        try:  # the graphs are captured here, with the GEMM kernels of that library
            runner = runtime.DecisionRunner(
                runtime.load_package(path, sha, library=library), dims=exp["dims"], buckets=buckets
            )
        finally:
            torch.backends.cuda.preferred_blas_library(default_blas)
        inputs = torch.load(setup["inputs"], weights_only=True)
        cases, outputs = {}, {}
        for r, t, s in setup["shapes"]:
            shape = f"{r}x{t}x{s}"
            call = tuple(x.to(runner.device) for x in synthetic_call(inputs, r, t, s, setup["fill"]))
            bucket = runner.bucket_for(r, t, s)
            padded = runner.padded_inputs(call)
            with torch.inference_mode():
                out = [o.float().cpu() for o in runner(*call)]
            cases[shape] = {"plain": (runner.plain, padded)}
            if bucket in runner.graphs:  # timed before the plain call and right after it
                replay = (runner.graphs[bucket].replay, ())
                cases[shape] = {"replay_before_plain": replay, **cases[shape], "replay": replay}
            outputs[shape] = {"out": out, "modes": list(cases[shape])}
        package = {
            "sha256": sha,
            "blas_at_capture": str(setup["blas"] or default_blas),
            "native_library": library and library["sha256"],
            "process": os.getpid(),
        }
        conn.send(("ready", {"package": package, "outputs": outputs}))
        device = str(runner.device)
        while True:
            request = conn.recv()
            if request[0] == "stop":
                return
            what, shape, arg = request
            if what == "time":
                fn, fn_args = cases[shape][arg]
                timed = time_calls(fn, fn_args, setup["timing"], device)
                conn.send(("ok", {"ms": timed["median_ms"], "gpu": timed.get("gpu")}))
            else:
                measure = launch_times if what == "launch" else kernel_profile
                conn.send(("ok", measure(torch, cases[shape]["replay"][0], arg)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise


def launch_times(torch, replay, calls: int) -> dict:
    """Where a replay's time goes without a profiler: the host's time in each ``replay()`` call
    (the launch alone, the GPU idle before it), and the GPU's time for ``calls`` replays back to
    back, from CUDA events recorded around them, against the wall time of the same replays (the
    GPU's clocks and power sampled meanwhile)."""
    from laya_build.runtime.gpu_state import GpuSampler, device_id

    torch.cuda.synchronize()
    host = []
    for _ in range(calls):
        start = time.perf_counter()
        replay()
        host.append(time.perf_counter() - start)
        torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    with GpuSampler(device_id(torch.cuda.current_device())) as sampler:
        wall = time.perf_counter()
        begin.record()
        for _ in range(calls):
            replay()
        end.record()
        end.synchronize()
        wall = time.perf_counter() - wall
    return {
        "gpu": sampler.summary,
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
    return trace_summary(events, calls, top)


def trace_summary(events: list[dict], calls: int, top: int | None = None) -> dict:
    """What :func:`kernel_profile` records of a Chrome trace's ``events`` for ``calls`` replays:
    the GPU events' count, time and span a forward, the kernels by name (the ``top`` most time
    first; None: all), and the first replay's events in order (``forward``)."""
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    if not gpu:
        return {"calls": calls, "events_per_forward": 0}
    by_name: dict[str, list[float]] = {}
    for e in gpu:
        by_name.setdefault(f"{e['cat']}: {e['name'][:160]}", []).append(float(e["dur"]))
    busy = sum(float(e["dur"]) for e in gpu)
    span = max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu)
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]  # top None: every kernel
    gpu.sort(key=lambda e: e["ts"])
    first = gpu[: round(len(gpu) / calls)]  # the first replay's events, in the order they ran
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
        # one forward in order: [kind: name, µs idle before it, µs it ran, bytes (memsets and copies)]
        "forward": [
            [
                f"{e['cat']}: {e['name'][:80]}",
                round(float(e["ts"]) - float(first[i - 1]["ts"] + first[i - 1]["dur"]), 2) if i else 0.0,
                round(float(e["dur"]), 2),
                (e.get("args") or {}).get("bytes"),
            ]
            for i, e in enumerate(first)
        ],
    }


if __name__ == "__main__":
    sys.exit(main())
