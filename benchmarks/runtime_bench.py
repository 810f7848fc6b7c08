"""Benchmarks of the serving runtime (laya_build/runtime.py), for benchmarks/h200_runtime.sh.

    python benchmarks/runtime_bench.py fresh-load RECORD --inputs INPUTS --buckets JSON --preload tilelang \\
        --repeat 2 --out fresh_load.json
    python benchmarks/runtime_bench.py runner RECORD --inputs INPUTS --shapes 1x128x3,7x256x4 --out runner.json
    python benchmarks/runtime_bench.py derive-config BASE.yaml OUT.yaml --set latency.variants='["package"]'
    python benchmarks/runtime_bench.py package EXPORT_DIR OUT_DIR --target cuda --inductor-configs '{...}'

``fresh-load`` starts ``first-answer`` (this script) in fresh interpreters, each with an
empty Inductor cache, and records the time from spawning it to its exit, its own phases
(import torch, preload, Inductor's loader modules, sha256, ISA answer, load, graph capture,
first call) and how it ended (an exit status, or the signal that killed it); ``--loader
direct`` loads without importing Inductor (see ``runtime.load_package``).

``runner`` measures, for each shape rows x tokens x slots (a bucket of its own): graph
replay against the plain package call on the same padded inputs, bit for bit, and the
per-call latency of the graph replay alone, the runner's call (padding, copies, replay,
outputs), the plain call of the single-threaded package, of a default load and of the
direct loader (no per-call pytree parsing).  Inputs are
the saved decisions' tokens repeated to fill every row (all attended).  On the CPU there
are no graphs: the replay rows are left out.

``package`` builds a package of an export folder with other Inductor options through the
pipeline's own ``run_package`` (fresh process, private cache; the record has the compile
time), for the autotuning comparison.  Every subcommand writes one JSON file.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STARTED = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def write_json(path, obj) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for item in text.split(","):
        parts = [int(v) for v in item.lower().split("x")]
        if len(parts) != 3:
            raise SystemExit(f"--shapes: {item!r} is not rows x tokens x slots (e.g. 1x128x3)")
        shapes.append(tuple(parts))
    return shapes


# ------------------------------------------------------------------------ first answer


def first_answer(args) -> int:
    """One fresh process's way to its first answer (runs as a child of ``fresh-load``)."""
    phases = {}
    mark = time.perf_counter()

    def lap(name):
        nonlocal mark
        now = time.perf_counter()
        phases[name] = now - mark
        mark = now

    import torch

    lap("import_torch_s")
    from laya_build import runtime

    preloaded = runtime.preload_modules([m for m in args.preload.split(",") if m])
    lap("preload_s")
    runtime.import_loader_modules(args.loader)
    lap("import_loader_s")
    record = json.loads(Path(args.record).read_text())
    entry = next(p for p in record["programs"] if p["name"] == "decision")
    path = Path(args.record).parent / entry["package"]["path"]
    package = runtime.load_package(
        path, entry["package"]["sha256"], loader=args.loader, library=runtime.library_beside(path)
    )
    phases.update(package.timings)
    mark = time.perf_counter()
    runner = runtime.DecisionRunner(package, dims=record["dims"], buckets=json.loads(args.buckets))
    lap("capture_s")
    inputs = torch.load(args.inputs, weights_only=True)
    batch = inputs["batches"][0]
    call = tuple(batch[k] for k in inputs["arg_names"])
    mark = time.perf_counter()
    decision, act = runner(*call)
    answer = int(decision[0].argmax())  # the first answer, on the host
    lap("first_call_s")
    phases["total_s"] = time.perf_counter() - STARTED
    write_json(
        args.out,
        {
            "phases": phases,
            "answer": answer,
            "preload": preloaded,
            "isa": package.isa,
            "loader": args.loader,
            "runner": runner.describe(),
            "torch": torch.__version__,
            "inductor_imported": "torch._inductor" in sys.modules,
        },
    )
    return 0


def fresh_load(args) -> int:
    runs = []
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="laya-fresh-") as tmp:
            child_out = Path(tmp) / "first_answer.json"
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(Path(tmp) / "inductor"), PYTHONHASHSEED="0")
            cmd = [
                sys.executable,
                __file__,
                "first-answer",
                args.record,
                "--inputs",
                args.inputs,
                "--buckets",
                args.buckets,
                "--preload",
                args.preload,
                "--loader",
                args.loader,
                "--out",
                str(child_out),
            ]
            start = time.perf_counter()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
            wall = time.perf_counter() - start
            ended = (
                f"signal {signal.Signals(-proc.returncode).name}" if proc.returncode < 0 else f"exit {proc.returncode}"
            )
            run = {
                "run": i,
                "preload": args.preload,
                "loader": args.loader,
                "wall_s": wall,
                "ended": ended,
                "output_tail": (proc.stdout + proc.stderr)[-1500:],
            }
            if child_out.is_file():
                run.update(json.loads(child_out.read_text()))
            runs.append(run)
            print(
                f"fresh load {i} ({args.loader}, preload {args.preload or 'none'}): {ended}, {wall:.2f} s wall, "
                f"phases {run.get('phases')}",
                flush=True,
            )
        write_json(args.out, {"runs": runs})
    return 0


# ------------------------------------------------------------------------------ runner


FILLS = ("full", "saved")  # every position of a row real; a row as long as its saved decision


def synthetic_call(inputs: dict, rows: int, tokens: int, slots: int, fill: str = "full"):
    """A call of this shape from the saved decisions' tokens: with ``fill`` full, each row's
    tokens repeated to fill it (every position real); with ``saved``, each row its decision's own
    tokens (up to ``tokens``), then padding, the markers inside the real part."""
    import torch

    if fill not in FILLS:
        raise ValueError(f"fill {fill!r} is not one of {', '.join(FILLS)}")
    saved = [
        (b["input_ids"][r, :n], q)
        for b in inputs["batches"]
        for r, (n, q) in enumerate(zip(b["valid_tokens"], b["qtype"].tolist()))
    ]
    own = [saved[r % len(saved)][0].tolist() for r in range(rows)]
    if fill == "full":
        real = [tokens] * rows
        ids = torch.stack([torch.tensor(list(itertools.islice(itertools.cycle(t), tokens))) for t in own])
    else:
        real = [min(len(t), tokens) for t in own]
        ids = torch.full((rows, tokens), inputs["special_ids"]["pad_token_id"], dtype=torch.long)
        for r, t in enumerate(own):
            ids[r, : real[r]] = torch.tensor(t[: real[r]])
    mask = (torch.arange(tokens)[None, :] < torch.tensor(real)[:, None]).long()
    pos = torch.stack([(torch.arange(slots) * 3 + 4).clamp(max=n - 1) for n in real])
    return (
        ids,
        mask,
        pos,
        torch.ones(rows, slots, dtype=torch.long),
        torch.tensor([saved[r % len(saved)][1] for r in range(rows)]),
    )


def bench_runner(args) -> int:
    import torch

    from laya_build import runtime
    from laya_build.runtime.timing import time_calls

    shapes = parse_shapes(args.shapes)
    timing = json.loads(args.timing)
    runtime.preload_modules([m for m in args.preload.split(",") if m])
    record_path = Path(args.record)
    record = json.loads(record_path.read_text())
    entry = next(p for p in record["programs"] if p["name"] == "decision")
    path, sha = record_path.parent / entry["package"]["path"], entry["package"]["sha256"]
    buckets = [{"rows": r, "tokens": t, "slots": s} for r, t, s in shapes]
    start = time.perf_counter()
    library = runtime.library_beside(path)
    package = runtime.load_package(path, sha, library=library)
    runner = runtime.DecisionRunner(package, dims=record["dims"], buckets=buckets)
    setup_s = time.perf_counter() - start
    default = runtime.load_package(path, sha, single_threaded=False, loader="aoti_load_package", library=library)
    direct = runtime.load_package(path, sha, loader="direct", library=library)
    inputs = torch.load(args.inputs, weights_only=True)
    device = str(runner.device)
    result = {
        "record": str(record_path),
        "package_sha256": sha,
        "inductor_configs": record.get("inductor_configs"),
        "package_s": entry.get("package_s"),
        "torch": torch.__version__,
        "device": device,
        "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else None,
        "runner": runner.describe(),
        "setup_s": setup_s,
        "timing": timing,
        "shapes": [],
    }
    for rows, tokens, slots in shapes:
        call = tuple(t.to(runner.device) for t in synthetic_call(inputs, rows, tokens, slots))
        bucket = runner.bucket_for(rows, tokens, slots)
        padded = runner.padded_inputs(call)
        with torch.inference_mode():
            got = runner(*call)
            plain = runner.plain(*padded)
            other = default(*padded)
        row = {
            "shape": f"{rows}x{tokens}x{slots}",
            "bucket": bucket and bucket.as_dict(),
            "replay_equals_plain": [bool(torch.equal(a, b)) for a, b in zip(got, plain)],
            "replay_vs_plain_max_abs": [float((a.float() - b.float()).abs().max()) for a, b in zip(got, plain)],
            "default_vs_single_threaded_max_abs": [
                float((a.float() - b.float()).abs().max()) for a, b in zip(other, plain)
            ],
            "latency": {},
        }
        cases = {
            "runner": (runner, call),
            "plain_single_threaded": (runner.package, padded),
            "plain_default_load": (default, padded),
            "plain_direct_loader": (direct, padded),
        }
        if runner.graphed:
            graph = runner.graphs[bucket]
            cases = {"graph_replay": (graph.replay, ()), **cases}
        for name, (fn, fn_args) in cases.items():
            row["latency"][name] = time_calls(fn, fn_args, timing, device)
        result["shapes"].append(row)
        print(
            f"{row['shape']}: replay == plain {row['replay_equals_plain']}; "
            + ", ".join(f"{k} {v['median_ms']:.3f} ms ({v['runs']} calls)" for k, v in row["latency"].items()),
            flush=True,
        )
        write_json(args.out, result)
    return 0


# ------------------------------------------------------------------------------- other


def derive_config(args) -> int:
    import yaml

    data = yaml.safe_load(Path(args.base).read_text())
    for item in args.set:
        key, _, value = item.partition("=")
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = json.loads(value)
    Path(args.out).write_text(yaml.safe_dump(data, sort_keys=False))
    return 0


def build_package(args) -> int:
    from laya_build.stages.package import run_package

    cfg = {"inductor_configs": json.loads(args.inductor_configs), "timeout_s": args.timeout}
    start = time.perf_counter()
    record = run_package(cfg, args.export_dir, args.out_dir, args.target)
    print(f"package {args.out_dir}: {record['status']} in {time.perf_counter() - start:.1f} s", flush=True)
    return 0 if record["status"] == "ok" else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("first-answer", "fresh-load"):
        p = sub.add_parser(name)
        p.add_argument("record", help="an aoti_package.json beside its decision.pt2")
        p.add_argument("--inputs", required=True, help="the build's model/inputs.pt")
        p.add_argument("--buckets", default="[]", help="JSON list of {rows, tokens, slots?}")
        p.add_argument("--preload", default="", help="comma-separated modules imported before loading")
        p.add_argument("--loader", default="aoti_load_package", choices=("aoti_load_package", "direct"))
        p.add_argument("--out", required=True)
        if name == "fresh-load":
            p.add_argument("--repeat", type=int, default=2)
            p.add_argument("--timeout", type=float, default=300)
    p = sub.add_parser("runner")
    p.add_argument("record")
    p.add_argument("--inputs", required=True)
    p.add_argument("--shapes", default="1x128x3,7x256x4")
    p.add_argument("--timing", default='{"warmup": 10, "min_run_time_s": 1.0}')
    p.add_argument("--preload", default="")
    p.add_argument("--out", required=True)
    p = sub.add_parser("derive-config")
    p.add_argument("base")
    p.add_argument("out")
    p.add_argument("--set", action="append", default=[], help="dotted.key=JSON value")
    p = sub.add_parser("package")
    p.add_argument("export_dir")
    p.add_argument("out_dir")
    p.add_argument("--target", default="cuda")
    p.add_argument("--inductor-configs", required=True, help="JSON object")
    p.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args(argv)
    return {
        "first-answer": first_answer,
        "fresh-load": fresh_load,
        "runner": bench_runner,
        "derive-config": derive_config,
        "package": build_package,
    }[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
