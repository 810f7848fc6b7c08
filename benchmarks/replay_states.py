"""Whether one CUDA package's graph replays at one speed: the same graph timed after different
preceding work, in one process.

    python benchmarks/replay_states.py EXPORT_DIR INPUTS_PT NAME=PACKAGE.pt2 ... [--out FILE]

Each package is loaded through the project's runtime behind a
:class:`laya_build.runtime.DecisionRunner` with graph buckets at ``--shape`` (default 1x128x3)
and ``--heavy`` (default 7x256x4).  Then, for each package in turn, ``--repeat`` times, the
``--shape`` graph's replays are timed by CUDA events under each condition of
:data:`CONDITIONS`: some steps first, each for ``--busy-s`` seconds (``--idle-s`` for idle),
then ``--blocks`` blocks of ``--block`` back-to-back replays (``long``: six times as many), or as
many replays one at a time, the GPU synchronised after each (``paced``: a request served at a
time; the median of each block's worth).  The steps:

- ``idle``: nothing, the GPU idle;
- ``heavy``: the ``--heavy`` graph replayed;
- ``plain``: the package's plain call at ``--shape`` (its kernels launched one by one);
- ``other``: the next package's ``--shape`` graph (with two packages or more);
- ``tiny``: a one-element add, again and again (host-bound small kernels of no package);
- ``synced``: this graph replayed one at a time, synchronised after each.

Last, ``recaptured``: a new runner of the same package (new graphs, new static buffers), after an
allocation of a few MiB that moves where its buffers land; capturing runs each bucket's warm-up
plain calls first, the ``--heavy`` bucket's last.  ``--conditions`` runs some conditions only
(``steady,idle,heavy,plain,other`` and ``recaptured`` were the first version's).  Reports every block's microseconds a
replay, so that a change of state shows as a step between blocks; the GPU's clocks and power are
for ``nvidia-smi`` beside it.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from package_latency import package_arguments  # noqa: E402  (the benchmarks folder, on the path above)


def blocks(torch, replay, count: int, size: int) -> list[float]:
    """``count`` blocks of ``size`` back-to-back replays, µs a replay in each, by CUDA events."""
    out = []
    for _ in range(count):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(size):
            replay()
        end.record()
        end.synchronize()
        out.append(round(begin.elapsed_time(end) * 1e3 / size, 2))
    return out


def busy(torch, fn, seconds: float) -> int:
    """``fn()`` again and again for ``seconds`` (synchronised every 20 calls); the calls made."""
    calls, stop = 0, time.perf_counter() + seconds
    while time.perf_counter() < stop:
        for _ in range(20):
            fn()
        calls += 20
        torch.cuda.synchronize()
    return calls


def steps(torch, runner, other, graph, shape, heavy, padded) -> dict:
    """What may run before a condition's timing, by name: each a function of the seconds it runs."""
    tiny = torch.zeros(1, device=runner.device)
    done = {
        "idle": time.sleep,
        "heavy": lambda s: busy(torch, graph(runner, heavy), s),
        "plain": lambda s: busy(torch, lambda: runner.plain(*padded), s),
        "tiny": lambda s: busy(torch, lambda: tiny.add_(1), s),  # host-bound small kernels, no package
        "synced": lambda s: (
            replay := graph(runner, shape),
            busy(torch, lambda: (replay(), torch.cuda.synchronize()), s),
        ),
    }
    if other is not None:
        done["other"] = lambda s: busy(torch, graph(other, shape), s)
    return done


# condition: (the steps before it, how its replays are timed: back-to-back blocks or one at a time)
CONDITIONS = {
    "steady": ([], "blocks"),
    "idle": (["idle"], "blocks"),
    "heavy": (["heavy"], "blocks"),
    "plain": (["plain"], "blocks"),
    "other": (["other"], "blocks"),
    "tiny": (["tiny"], "blocks"),
    "synced": (["synced"], "blocks"),
    "plain-idle": (["plain", "idle"], "blocks"),
    "plain-heavy": (["plain", "heavy"], "blocks"),
    "one-at-a-time": ([], "paced"),
    "plain-one-at-a-time": (["plain"], "paced"),
    "plain-long": (["plain"], "long"),
}


def main(argv=None) -> int:
    parser = package_arguments(__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1x128x3")
    parser.add_argument("--heavy", default="7x256x4")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--block", type=int, default=100, help="replays a timed block")
    parser.add_argument("--blocks", type=int, default=5, help="blocks a condition")
    parser.add_argument("--idle-s", type=float, default=2.0)
    parser.add_argument("--busy-s", type=float, default=2.0)
    parser.add_argument("--preload", default="lib:tvm_ffi")
    parser.add_argument(
        "--conditions", default=",".join(CONDITIONS), help="the conditions to run, comma-separated (default: all)"
    )
    parser.add_argument("--out", default="replay-states.json")
    args = parser.parse_args(argv)
    chosen = [c.strip() for c in args.conditions.split(",") if c.strip()]
    if unknown := [c for c in chosen if c not in CONDITIONS]:
        parser.error(f"--conditions: {', '.join(unknown)} not among {', '.join(CONDITIONS)}")

    import torch
    from runtime_bench import parse_shapes, synthetic_call

    from laya_build import runtime

    runtime.preload_modules([m for m in args.preload.split(",") if m])
    exp = json.loads((Path(args.export_dir) / "export.json").read_text())
    (shape,), (heavy,) = parse_shapes(args.shape), parse_shapes(args.heavy)
    buckets = [{"rows": r, "tokens": t, "slots": s} for r, t, s in (shape, heavy)]
    inputs = torch.load(args.inputs, weights_only=True)
    paths, runners = {}, {}
    for spec in args.packages:
        name, _, path = spec.partition("=")
        with open(path, "rb") as fh:
            paths[name] = (path, hashlib.file_digest(fh, "sha256").hexdigest())
        runners[name] = runtime.DecisionRunner(
            runtime.load_package(path, paths[name][1], library=runtime.library_beside(path)),
            dims=exp["dims"],
            buckets=buckets,
        )
    device = str(next(iter(runners.values())).device)
    call = tuple(x.to(device) for x in synthetic_call(inputs, *shape))
    heavy_call = tuple(x.to(device) for x in synthetic_call(inputs, *heavy))

    def graph(runner, which):
        runner(*(call if which is shape else heavy_call))  # fills the bucket's static inputs (and replays)
        return runner.graphs[runner.bucket_for(*which)].replay

    result = {
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(),
        "settings": {k: v for k, v in vars(args).items() if k not in ("packages", "export_dir", "inputs")},
        "packages": {n: {"path": p, "sha256": s} for n, (p, s) in paths.items()},
        "runs": [],
    }
    names = list(runners)

    def record(repeat, name, condition, timing, started, us):
        result["runs"].append(
            {"repeat": repeat, "package": name, "condition": condition, "timing": timing, "utc": started, "us": us}
        )
        print(repeat, name, condition, us, flush=True)

    keep = []  # allocations that move a recaptured runner's buffers; held to the end
    with torch.inference_mode():
        for repeat in range(args.repeat):
            for i, name in enumerate(names):
                runner = runners[name]
                replay = graph(runner, shape)
                padded = runner.padded_inputs(call)
                other = runners[names[(i + 1) % len(names)]] if len(names) > 1 else None
                available = steps(torch, runner, other, graph, shape, heavy, padded)
                blocks(torch, replay, 3, args.block)  # warm
                for condition, (before, timing) in CONDITIONS.items():
                    if condition not in chosen or any(step not in available for step in before):
                        continue
                    torch.cuda.synchronize()
                    started = time.strftime("%H:%M:%S", time.gmtime())
                    for step in before:
                        available[step](args.idle_s if step == "idle" else args.busy_s)
                    torch.cuda.synchronize()
                    if timing == "paced":  # blocks of one replay each, their medians in blocks' worth
                        each = blocks(torch, replay, args.block * args.blocks, 1)
                        us = [
                            round(statistics.median(each[k : k + args.block]), 2)
                            for k in range(0, len(each), args.block)
                        ]
                    else:
                        us = blocks(torch, replay, args.blocks * (6 if timing == "long" else 1), args.block)
                    record(repeat, name, condition, timing, started, us)
                keep.append(torch.empty((repeat + 1) * (i + 3) * 2**20, dtype=torch.uint8, device=device))
                again = runtime.load_package(*paths[name], library=runtime.library_beside(paths[name][0]))
                fresh = runtime.DecisionRunner(again, dims=exp["dims"], buckets=buckets)
                us = blocks(torch, graph(fresh, shape), args.blocks, args.block)
                record(repeat, name, "recaptured", "blocks", time.strftime("%H:%M:%S", time.gmtime()), us)
                del fresh
            Path(args.out).write_text(json.dumps(result, indent=1))
    summary = {}
    for run in result["runs"]:
        summary.setdefault(run["package"], {}).setdefault(run["condition"], []).append(statistics.median(run["us"]))
    result["median_us"] = summary
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
