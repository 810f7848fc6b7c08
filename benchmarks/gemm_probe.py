"""The decision model's GEMMs on a GPU, one shape at a time: cuBLAS, TileLang tiles, Inductor templates.

    python benchmarks/gemm_probe.py --out gemm.json [--budget-s 420]

Each GEMM of the H200 configuration (``pipeline.h200.yaml``: hidden 1024, GLU 2624, 28 layers) at
the two serving shapes (M = 1 x 128 and 7 x 256 tokens) is timed the way the graphed runner runs
it: 28 calls on 28 distinct weight matrices (as many as the model has layers, so the weights come
from HBM, not L2) captured in one CUDA graph, replayed; the time per GEMM is the replay's median
over 28.  Next to each time: the bytes the GEMM must move (weights, input, output) over that
time, and the time those bytes take at ``--peak-tbs`` (the bandwidth bound).  Candidates:

- ``cublas``: ``torch.nn.functional.linear``, what the package calls today;
- ``tilelang:<block_M>x<block_N>x<block_K>/s<stages>/t<threads>``: ``kernels.gemm_kernel`` with
  that tile, checked against cuBLAS first;
- ``inductor:<options>``: ``torch.compile`` of the linear with ``max-autotune`` GEMM templates
  (Triton, and Hopper's persistent TMA templates), graphed the same way;
- ``cublas-l2``: cuBLAS on one weight matrix 28 times, so that it is read from L2 after the first
  call: what a GEMM would take with its weights already in L2 (the ceiling of prefetching them);
- ``cublas-batched``: the 28 GEMMs of a shape as one ``torch.bmm`` (one launch, every weight from
  HBM): what a GEMM costs once the per-launch cost is shared (the ceiling of chaining them);
- ``cublaslt``: the same call with ``torch.backends.cuda.preferred_blas_library("cublaslt")``;
- ``triton:<block_M>x<block_N>x<block_K>/k<split>/w<warps>/s<stages>``: the skinny-M kernels of
  ``benchmarks/triton_skinny.py`` (split-K with an in-kernel, ordered reduction), checked
  against cuBLAS first;
- for the MLP's first GEMM also its GeGLU: ``cublas+geglu`` (cuBLAS, then one fused pointwise
  kernel, as the package runs it) against ``triton-geglu:<tile>`` (one kernel).

Results are written after each measurement, so a run stopped early keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's kernels

HIDDEN, GLU, LAYERS = 1024, 2624, 28
SHAPES = {  # name: (N, K) of W [N, K], as torch.nn.Linear stores it
    "qkv": (3 * HIDDEN, HIDDEN),
    "attn_out": (HIDDEN, HIDDEN),
    "mlp_in": (2 * GLU, HIDDEN),
    "mlp_out": (HIDDEN, GLU),
}
ROWS = {"1x128": 128, "7x256": 7 * 256}
TILES = (  # (block_M, block_N, block_K, num_stages, threads)
    (64, 32, 128, 4, 128),
    (128, 32, 128, 4, 128),
    (64, 64, 128, 3, 128),
    (128, 64, 64, 4, 128),
    (64, 16, 256, 3, 128),
)
TRITON = {  # shape: (block_M, block_N, block_K, split_k, num_warps, num_stages), for M = 128
    "qkv": [
        (128, 64, 128, 1, 4, 3),
        (128, 32, 128, 1, 4, 4),
        (128, 64, 128, 2, 4, 3),
        (64, 64, 128, 1, 4, 3),
        (128, 128, 128, 4, 8, 3),
        (128, 64, 64, 2, 4, 4),
    ],
    "attn_out": [
        (128, 32, 128, 4, 4, 4),
        (128, 64, 128, 8, 4, 3),
        (128, 64, 128, 4, 4, 3),
        (64, 64, 128, 4, 4, 3),
        (128, 16, 128, 2, 4, 4),
        (128, 32, 64, 4, 4, 4),
    ],
    "mlp_in": [
        (128, 64, 128, 1, 4, 3),
        (128, 32, 128, 1, 4, 4),
        (128, 64, 128, 2, 4, 3),
        (64, 64, 128, 1, 4, 3),
        (128, 128, 64, 2, 8, 3),
    ],
    "mlp_out": [
        (128, 32, 128, 4, 4, 4),
        (128, 64, 128, 8, 4, 3),
        (128, 64, 64, 8, 4, 4),
        (64, 64, 128, 4, 4, 3),
        (128, 32, 128, 7, 4, 4),
        (128, 64, 128, 4, 4, 3),
    ],
}
TRITON_LARGE = [(128, 128, 64, 1, 8, 3), (128, 256, 64, 1, 8, 3)]  # also at M = 1,792: large tiles
GEGLU = [(128, 32, 128, 4, 3), (128, 64, 64, 4, 3), (64, 32, 128, 4, 3), (128, 16, 128, 4, 4)]  # bm, bn, bk, w, s
INDUCTOR = {
    "max-autotune": {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON"},
    "max-autotune+persistent-tma": {
        "max_autotune": True,
        "max_autotune_gemm_backends": "ATEN,TRITON",
        "triton.enable_persistent_tma_matmul": True,
    },
}


def probe_result(torch, command: str, **fields) -> dict:
    """The head of a GPU probe's JSON: the command, when, on what, and its rows and errors."""
    return {
        "command": command,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        **fields,
        "rows": [],
        "errors": [],
    }


def saver(result: dict, out: Path):
    """A function writing ``result`` to ``out`` whole (temp + rename): a stopped probe keeps what it measured."""

    def save():
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        os.replace(tmp, out)

    return save


def finish(result: dict, save, start: float) -> int:
    """A probe's last write and line: how long it took, and what failed."""
    result["elapsed_s"] = round(time.monotonic() - start, 1)
    save()
    print(json.dumps({"done": True, "elapsed_s": result["elapsed_s"], "errors": result["errors"]}))
    return 0


def failed(exc: Exception) -> str:
    """How a probe records an exception: its type and the start of its message."""
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def timed_row(torch, result: dict, save, row: dict, calls, per: int, output=None, reference=None, versus="first"):
    """Time ``calls`` in one graph into ``row["us"]`` (µs a call: the replay over ``per``), with
    ``output()``'s largest difference from ``reference`` and whether it is that bit for bit
    (``max_abs_vs_<versus>``, ``equal_to_<versus>``); a failure is the row's ``error``.  The row
    joins ``result`` and is printed and saved."""
    try:
        row["us"] = round(graphed_ms(torch, calls) / per * 1e3, 2)
        if output is not None and reference is not None:
            out = output()
            row[f"max_abs_vs_{versus}"] = float((out.float() - reference.float()).abs().max())
            row[f"equal_to_{versus}"] = bool(torch.equal(out, reference))
    except Exception as exc:  # noqa: BLE001 - a probe records what failed and goes on
        row["error"] = failed(exc)
    result["rows"].append(row)
    print(json.dumps(row), flush=True)
    save()


def graphed_ms(torch, calls, min_run_time: float = 0.4) -> float:
    """Median ms of one replay of a CUDA graph holding ``calls`` (each a no-argument callable)."""
    from torch.utils import benchmark

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    m = benchmark.Timer(stmt="g.replay(); torch.cuda.synchronize()", globals={"g": graph, "torch": torch})
    return m.blocked_autorange(min_run_time=min_run_time).median * 1e3


def triton_section(torch, F, data, record, result, save, over) -> None:
    """The skinny-M Triton kernels, and the GeGLU GEMM with its epilogue in one kernel."""
    try:
        from benchmarks.triton_skinny import geglu_pointwise, skinny_geglu, skinny_mm
    except Exception as exc:  # noqa: BLE001
        result["errors"].append(f"triton: {type(exc).__name__}: {exc}")
        save()
        return

    def run(name, shape, rows, fn, ref):
        try:
            fn(0)
            torch.cuda.synchronize()
            err = (fn(0).float() - ref.float()).abs().max().item()
            calls = [lambda i=i: fn(i) for i in range(LAYERS)]
            record(name, shape, rows, graphed_ms(torch, calls) / LAYERS, round(err, 4))
        except Exception as exc:  # noqa: BLE001
            result["errors"].append(f"{name} {shape} {rows}: {failed(exc)}")
            save()

    for shape, tiles in TRITON.items():
        for rows in ROWS:
            weights, x, outs = data[shape, rows]
            ref = F.linear(x, weights[0])
            for bm, bn, bk, split, warps, stages in tiles if rows == "1x128" else tiles + TRITON_LARGE:
                if over():
                    return
                M, N = outs[0].shape
                part = torch.empty(split * M * N, device=x.device, dtype=torch.float32)
                count = torch.zeros(triton_tiles(N, bn) * triton_tiles(M, bm), device=x.device, dtype=torch.int32)

                def fn(i, w=weights, o=outs, x=x, t=(bm, bn, bk, split, warps, stages), part=part, count=count):
                    return skinny_mm(x, w[i], o[i], *t[:4], num_warps=t[4], num_stages=t[5], part=part, count=count)

                run(f"triton:{bm}x{bn}x{bk}/k{split}/w{warps}/s{stages}", shape, rows, fn, ref)
    # the MLP's first GEMM and its GeGLU
    for rows in ROWS:
        weights, x, outs = data["mlp_in", rows]
        M = x.shape[0]
        acts = [torch.empty(M, GLU, device=x.device, dtype=x.dtype) for _ in range(LAYERS)]
        hidden = F.linear(x, weights[0])
        up, gate = hidden.chunk(2, dim=-1)
        ref = F.gelu(up.float()) * gate.float()

        def cublas_geglu(i, w=weights, o=outs, x=x, a=acts):
            torch.mm(x, w[i].t(), out=o[i])
            return geglu_pointwise(o[i], a[i])

        run("cublas+geglu", "mlp_in_geglu", rows, cublas_geglu, ref)
        for bm, bn, bk, warps, stages in GEGLU if rows == "1x128" else [*GEGLU, (128, 64, 64, 8, 3)]:
            if over():
                return

            def fused(i, w=weights, x=x, a=acts, t=(bm, bn, bk, warps, stages)):
                return skinny_geglu(x, w[i], a[i], *t[:3], num_warps=t[3], num_stages=t[4])

            run(f"triton-geglu:{bm}x{bn}x{bk}/w{warps}/s{stages}", "mlp_in_geglu", rows, fused, ref)


def triton_tiles(n: int, block: int) -> int:
    return -(-n // block)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop starting new measurements after this")
    parser.add_argument("--peak-tbs", type=float, default=4.3, help="HBM bandwidth of the bound, TB/s")
    parser.add_argument(
        "--skip", default="", help="sections to leave out: l2,batched,tilelang,inductor,cublaslt,triton"
    )
    args = parser.parse_args()
    start = time.monotonic()
    skip = set(filter(None, args.skip.split(",")))

    import torch
    import torch.nn.functional as F

    result = probe_result(torch, "benchmarks/gemm_probe.py", peak_tbs=args.peak_tbs, layers=LAYERS)
    save = saver(result, args.out)

    def over() -> bool:
        return time.monotonic() - start > args.budget_s

    torch.manual_seed(0)
    dt = torch.bfloat16
    data = {}
    for shape, (N, K) in SHAPES.items():
        weights = [torch.randn(N, K, device="cuda", dtype=dt) / K**0.5 for _ in range(LAYERS)]
        for rows, M in ROWS.items():
            x = torch.randn(M, K, device="cuda", dtype=dt)
            outs = [torch.empty(M, N, device="cuda", dtype=dt) for _ in range(LAYERS)]
            data[shape, rows] = (weights, x, outs)

    def record(candidate, shape, rows, ms_per_layer, max_abs=None):
        N, K = SHAPES["mlp_in" if shape == "mlp_in_geglu" else shape]
        M = ROWS[rows]
        moved = 2 * (N * K + M * K + M * (N // 2 if shape == "mlp_in_geglu" else N))
        row = {
            "candidate": candidate,
            "shape": shape,
            "rows": rows,
            "M": M,
            "N": N,
            "K": K,
            "us": round(ms_per_layer * 1e3, 2),
            "tb_s": round(moved / (ms_per_layer * 1e-3) / 1e12, 3),
            "tflop_s": round(2 * M * N * K / (ms_per_layer * 1e-3) / 1e12, 1),
            "bound_us": round(moved / (args.peak_tbs * 1e12) * 1e6, 2),
        }
        if max_abs is not None:
            row["max_abs_vs_cublas"] = max_abs
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        save()

    # cuBLAS, as the package calls it
    for (shape, rows), (weights, x, outs) in data.items():
        calls = [lambda w=w, o=o, x=x: torch.mm(x, w.t(), out=o) for w, o in zip(weights, outs)]
        record("cublas", shape, rows, graphed_ms(torch, calls) / LAYERS)

    if "l2" not in skip:  # the same 28 calls on one weight matrix: from L2 after the first
        for (shape, rows), (weights, x, outs) in data.items():
            calls = [lambda o=o, x=x, w=weights[0]: torch.mm(x, w.t(), out=o) for o in outs]
            record("cublas-l2", shape, rows, graphed_ms(torch, calls) / LAYERS)

    if "batched" not in skip:  # the 28 GEMMs as one batched call: one launch for all of them
        for (shape, rows), (weights, x, _outs) in data.items():
            stacked = torch.stack(weights)  # [28, N, K], each as the layers store it
            inputs = x.expand(LAYERS, *x.shape)
            out = torch.empty(LAYERS, x.shape[0], stacked.shape[1], device="cuda", dtype=dt)
            calls = [lambda i=inputs, w=stacked, o=out: torch.bmm(i, w.transpose(1, 2), out=o)]
            record("cublas-batched", shape, rows, graphed_ms(torch, calls) / LAYERS)
            del stacked, out

    if "cublaslt" not in skip:
        try:
            torch.backends.cuda.preferred_blas_library("cublaslt")
            for (shape, rows), (weights, x, outs) in data.items():
                calls = [lambda w=w, o=o, x=x: torch.mm(x, w.t(), out=o) for w, o in zip(weights, outs)]
                record("cublaslt", shape, rows, graphed_ms(torch, calls) / LAYERS)
        except Exception as exc:  # noqa: BLE001
            result["errors"].append(f"cublaslt: {failed(exc)}")
            save()
        finally:
            torch.backends.cuda.preferred_blas_library("cublas")

    if "triton" not in skip:
        triton_section(torch, F, data, record, result, save, over)

    if "tilelang" not in skip:
        try:
            from kernels import gemm_kernel
        except Exception as exc:  # noqa: BLE001 - a probe records what failed and goes on
            result["errors"].append(f"tilelang: {type(exc).__name__}: {exc}")
            save()
        else:
            for shape, (N, K) in SHAPES.items():
                for tile in TILES:
                    if over():
                        break
                    bm, bn, bk, st, th = tile
                    name = f"tilelang:{bm}x{bn}x{bk}/s{st}/t{th}"
                    try:
                        kernel = gemm_kernel(N, K, block_M=bm, block_N=bn, block_K=bk, num_stages=st, threads=th)
                        bias = torch.zeros(N, device="cuda")
                        for rows in ROWS:
                            weights, x, outs = data[shape, rows]
                            kernel(x, weights[0], bias, outs[0])
                            torch.cuda.synchronize()
                            ref = F.linear(x, weights[0])
                            err = (outs[0].float() - ref.float()).abs().max().item()
                            calls = [
                                lambda w=w, o=o, x=x, k=kernel, b=bias: k(x, w, b, o) for w, o in zip(weights, outs)
                            ]
                            record(name, shape, rows, graphed_ms(torch, calls) / LAYERS, round(err, 4))
                    except Exception as exc:  # noqa: BLE001
                        result["errors"].append(f"{name} {shape}: {failed(exc)}")
                        save()

    if "inductor" not in skip:
        for label, options in INDUCTOR.items():
            for shape in SHAPES:
                if over():
                    break
                rows = "1x128"
                weights, x, outs = data[shape, rows]
                try:
                    torch._dynamo.reset()
                    t0 = time.monotonic()
                    fn = torch.compile(lambda a, w: F.linear(a, w), options=options, dynamic=False, fullgraph=True)
                    fn(x, weights[0])
                    compile_s = time.monotonic() - t0
                    ref = F.linear(x, weights[0])
                    err = (fn(x, weights[0]).float() - ref.float()).abs().max().item()
                    results = [None] * LAYERS

                    def call(i, w, fn=fn, x=x, results=results):
                        results[i] = fn(x, w)

                    calls = [lambda i=i, w=w: call(i, w) for i, w in enumerate(weights)]
                    record(f"inductor:{label}", shape, rows, graphed_ms(torch, calls) / LAYERS, round(err, 4))
                    result["rows"][-1]["compile_s"] = round(compile_s, 1)
                    save()
                except Exception as exc:  # noqa: BLE001
                    result["errors"].append(f"inductor:{label} {shape}: {failed(exc)}")
                    save()
    return finish(result, save, start)


if __name__ == "__main__":
    raise SystemExit(main())
