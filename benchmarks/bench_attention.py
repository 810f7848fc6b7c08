"""TileLang bf16 attention vs ``torch.nn.functional.scaled_dot_product_attention`` (GPU only).

ModernBERT-large shapes by default (B=8, L=512, H=16, Dh=64, every sequence full), full
bidirectional attention and a sliding window (SDPA gets the window as an explicit boolean
mask).  Both sides read the same packed ``QKV[B, L, 3, H, Dh]``: SDPA takes strided
``[B, H, L, Dh]`` views of it, as a model would, and its ``[B, H, L, Dh]`` output is not
re-packed (in SDPA's favour); the TileLang kernel writes ``O[B, L, H*Dh]`` directly.

TFLOP/s count the useful work only: ``4 * Dh`` FLOPs per visible (query, key) pair and
head (QK^T and PV), the same count for both sides, so a masked SDPA that computes every
pair is not credited for the masked ones.  Times are the median of CUDA-event-timed
calls after a warm-up.

    python benchmarks/bench_attention.py [--out results.json] [--windows 0 64] [--dtype bfloat16]

:func:`bench_attention` returns the rows, for a benchmark driver that collects several.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels import attn_kernel  # noqa: E402

MODERNBERT_LARGE = dict(B=8, L=512, H=16, Dh=64)


def visible_pairs(L: int, window: int) -> int:
    """Number of (query, key) pairs with ``abs(i - j) <= window`` (all pairs if 0)."""
    if window <= 0 or window >= L:
        return L * L
    i = torch.arange(L)
    return int(((i[:, None] - i[None, :]).abs() <= window).sum())


def time_ms(fn, warmup: int = 25, rep: int = 200) -> float:
    """Median wall time of ``fn()`` on the current stream, in milliseconds."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rep):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(torch.tensor(times).median())


def bench_attention(B: int, L: int, H: int, Dh: int, windows=(0, 64), dtype: str = "bfloat16", seed: int = 1234) -> list[dict]:
    """One row per (window, implementation): ms, useful TFLOP/s and max |TileLang - SDPA|."""
    tdtype = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn(B, L, 3, H, Dh, device="cuda", dtype=tdtype, generator=gen)
    lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
    out = torch.empty(B, L, H * Dh, device="cuda", dtype=tdtype)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [B, H, L, Dh] views
    idx = torch.arange(L, device="cuda")

    rows = []
    for window in windows:
        kernel = attn_kernel(B, L, H, Dh, window=window, dtype=dtype)
        mask = (idx[:, None] - idx[None, :]).abs() <= window if window > 0 else None

        def tilelang_call():
            kernel(qkv, lens, out)

        def sdpa_call():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        tilelang_call()
        ref = sdpa_call().transpose(1, 2).reshape(B, L, H * Dh)
        max_diff = float((out.float() - ref.float()).abs().max())
        flops = 4.0 * B * H * Dh * visible_pairs(L, window)
        for name, fn in (("tilelang", tilelang_call), ("sdpa", sdpa_call)):
            ms = time_ms(fn)
            rows.append(
                dict(kernel="attention", impl=name, B=B, L=L, H=H, Dh=Dh, window=window, dtype=dtype,
                     ms=ms, tflops=flops / (ms * 1e-3) / 1e12, max_abs_diff_vs_sdpa=max_diff)
            )
    return rows


def markdown(rows: list[dict]) -> str:
    head = "| window | impl | B×L×H×Dh | ms | TFLOP/s | max abs diff vs SDPA |\n|---|---|---|---:|---:|---:|"
    body = [
        f"| {r['window'] or 'full'} | {r['impl']} | {r['B']}×{r['L']}×{r['H']}×{r['Dh']} | "
        f"{r['ms']:.4f} | {r['tflops']:.1f} | {r['max_abs_diff_vs_sdpa']:.2e} |"
        for r in rows
    ]
    return "\n".join([head, *body])


def environment() -> dict:
    import tilelang

    return dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, tilelang=tilelang.__version__,
                cuda=torch.version.cuda, python=platform.python_version())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for key, value in MODERNBERT_LARGE.items():
        ap.add_argument(f"--{key}", type=int, default=value)
    ap.add_argument("--windows", type=int, nargs="+", default=[0, 64], help="0 = full attention")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--out", type=Path, help="write the rows and the environment as JSON")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_attention: no CUDA device; nothing measured", file=sys.stderr)
        return 2
    rows = bench_attention(args.B, args.L, args.H, args.Dh, args.windows, args.dtype)
    print(markdown(rows))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dict(environment=environment(), rows=rows), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
