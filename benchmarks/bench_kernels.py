"""GPU benchmark of the TileLang kernels against PyTorch (CUDA only).

    python benchmarks/bench_kernels.py --out artifacts/bench_kernels.json [--m 4096 8192 16384]

Times each bf16 TileLang kernel and its PyTorch counterpart at ModernBERT-large shapes
(hidden 1024, GLU intermediate F = 2624, fused QKV 3072) with CUDA events (median of
``--rep`` timed calls after ``--warmup``), prints a Markdown table with TFLOP/s and writes
the rows as JSON to ``--out``.

Adding a kernel: write ``def bench_x(M, dtype) -> list[Case]`` and decorate it with
``@register``; every registered function runs for every ``M``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HIDDEN, INTERMEDIATE, QKV = 1024, 2624, 3 * 1024


@dataclass
class Case:
    """One comparison: ``tilelang()`` and ``torch()`` compute the same ``flops``."""

    kernel: str
    shape: str
    flops: float
    tilelang: Callable[[], object]
    torch: Callable[[], object]


BENCHMARKS: list[Callable[[int, str], list[Case]]] = []


def register(fn):
    """Add a benchmark function ``fn(M, dtype) -> list[Case]`` to the run."""
    BENCHMARKS.append(fn)
    return fn


@register
def bench_gemm(M: int, dtype: str) -> list[Case]:
    import torch

    from kernels import gemm_kernel

    t = getattr(torch, dtype)
    cases = []
    for name, N, K in (("qkv", QKV, HIDDEN), ("attn_out", HIDDEN, HIDDEN), ("mlp_out", HIDDEN, INTERMEDIATE)):
        A = torch.randn(M, K, device="cuda", dtype=t)
        W = torch.randn(N, K, device="cuda", dtype=t) / K**0.5
        b, C = torch.zeros(N, device="cuda"), torch.empty(M, N, device="cuda", dtype=t)
        kernel = gemm_kernel(N, K, dtype=dtype)
        cases.append(
            Case(
                f"gemm/{name}",
                f"{M}x{N}x{K}",
                2.0 * M * N * K,
                lambda k=kernel, a=(A, W, b, C): k(*a),
                lambda A=A, W=W: torch.matmul(A, W.t()),
            )
        )
    return cases


@register
def bench_geglu(M: int, dtype: str) -> list[Case]:
    import torch
    import torch.nn.functional as F

    from kernels import gemm_geglu_kernel

    t = getattr(torch, dtype)
    A = torch.randn(M, HIDDEN, device="cuda", dtype=t)
    W = torch.randn(2 * INTERMEDIATE, HIDDEN, device="cuda", dtype=t) / HIDDEN**0.5
    C = torch.empty(M, INTERMEDIATE, device="cuda", dtype=t)
    kernel = gemm_geglu_kernel(INTERMEDIATE, HIDDEN, dtype=dtype)

    def torch_geglu():  # what the fused kernel replaces: matmul, then GELU(gate) * up
        gate, up = torch.matmul(A, W.t()).chunk(2, dim=-1)
        return F.gelu(gate) * up

    flops = 2.0 * M * 2 * INTERMEDIATE * HIDDEN
    return [
        Case("geglu/fused", f"{M}x{2 * INTERMEDIATE}x{HIDDEN}", flops, lambda: kernel(A, W, C), torch_geglu),
        Case(
            "geglu/matmul-only",
            f"{M}x{2 * INTERMEDIATE}x{HIDDEN}",
            flops,
            lambda: kernel(A, W, C),
            lambda: torch.matmul(A, W.t()),
        ),
    ]


def time_ms(fn, warmup: int, rep: int) -> float:
    """Median milliseconds of one call, timed with CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(rep):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run(Ms, dtype: str, warmup: int, rep: int) -> list[dict]:
    rows = []
    for M in Ms:
        for bench in BENCHMARKS:
            for case in bench(M, dtype):
                tl_ms, torch_ms = time_ms(case.tilelang, warmup, rep), time_ms(case.torch, warmup, rep)
                rows.append(
                    dict(
                        kernel=case.kernel,
                        M=M,
                        shape=case.shape,
                        dtype=dtype,
                        flops=case.flops,
                        tilelang_ms=tl_ms,
                        torch_ms=torch_ms,
                        tilelang_tflops=case.flops / tl_ms / 1e9,
                        torch_tflops=case.flops / torch_ms / 1e9,
                    )
                )
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| kernel | M x N x K | TileLang ms | TileLang TFLOP/s | torch ms | torch TFLOP/s | speed-up |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kernel']} | {r['shape']} | {r['tilelang_ms']:.3f} | {r['tilelang_tflops']:.1f} "
            f"| {r['torch_ms']:.3f} | {r['torch_tflops']:.1f} | {r['torch_ms'] / r['tilelang_ms']:.2f}x |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON output path")
    parser.add_argument("--m", type=int, nargs="+", default=[4096, 8192, 16384], help="row counts (tokens)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rep", type=int, default=50)
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("bench_kernels: CUDA is not available; this benchmark needs an NVIDIA GPU.", file=sys.stderr)
        return 2
    import tilelang

    rows = run(args.m, args.dtype, args.warmup, args.rep)
    print(markdown(rows))
    record = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        tilelang=tilelang.__version__,
        python=platform.python_version(),
        warmup=args.warmup,
        rep=args.rep,
        rows=rows,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
