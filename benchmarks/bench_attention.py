"""TileLang attention vs ``torch.nn.functional.scaled_dot_product_attention`` (GPU only).

ModernBERT-large shapes by default (B=8, L=512, H=16, Dh=64, every sequence full), full
bidirectional attention and a sliding window (SDPA gets the window as an explicit boolean
mask).  Both sides read the same packed ``QKV[B, L, 3, H, Dh]``: SDPA takes strided
``[B, H, L, Dh]`` views of it, as a model would, and its ``[B, H, L, Dh]`` output is not
re-packed (in SDPA's favour); the TileLang kernel writes ``O[B, L, H*Dh]`` directly.

TFLOP/s count the useful work only: ``4 * Dh`` FLOPs per visible (query, key) pair and
head (QK^T and PV), the same count for both sides, so a masked SDPA that computes every
pair is not credited for the masked ones.  A time is the median over repeats of the mean
of a burst of back-to-back calls between two CUDA events, after a warm-up: with plain
launches the host's per-call cost counts where it exceeds the kernel's own time; with
``--graph`` the burst is a CUDA graph's replay and only device time counts.

    python benchmarks/bench_attention.py [--out results.json] [--windows 0 64] [--dtype bfloat16]
                                         [--tiles 128,64,1,256 128,128,1,256 ...] [--graph]

For ``benchmarks/bench_kernels.py``: :func:`attention_cases` ``(M, dtype)`` has the shape
of its registered benchmarks (M tokens as ``M // 512`` sequences of 512) and returns
objects with the fields of its ``Case``; register it there with
``register(attention_cases)``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_kernels import Case, time_ms  # noqa: E402  (one CUDA-event timer for every benchmark)
from kernels import attn_kernel  # noqa: E402
from kernels.attention import TILE_DEFAULTS  # noqa: E402

MODERNBERT_LARGE = dict(B=8, L=512, H=16, Dh=64)
WINDOWS = (0, 64)  # full attention and ModernBERT's local layers (128-token window = +-64)
TILE_KEYS = ("block_M", "block_N", "num_stages", "threads")


@dataclass
class AttnCase(Case):
    """One TileLang configuration against SDPA on the same inputs."""

    window: int
    tiles: dict
    max_abs_diff_vs_sdpa: float


def visible_pairs(L: int, window: int) -> int:
    """Number of (query, key) pairs with ``abs(i - j) <= window`` (all pairs if 0)."""
    if window <= 0 or window >= L:
        return L * L
    i = torch.arange(L)
    return int(((i[:, None] - i[None, :]).abs() <= window).sum())


def make_cases(
    B: int, L: int, H: int, Dh: int, windows=WINDOWS, dtype: str = "bfloat16", tiles=(TILE_DEFAULTS,), seed: int = 1234
) -> list[AttnCase]:
    """One case per (window, tile configuration), checked once against SDPA."""
    tdtype = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn(B, L, 3, H, Dh, device="cuda", dtype=tdtype, generator=gen)
    lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
    out = torch.empty(B, L, H * Dh, device="cuda", dtype=tdtype)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [B, H, L, Dh] views
    idx = torch.arange(L, device="cuda")

    cases = []
    for window in windows:
        mask = (idx[:, None] - idx[None, :]).abs() <= window if window > 0 else None

        def sdpa(mask=mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        ref = sdpa().transpose(1, 2).reshape(B, L, H * Dh).float()
        for tile in tiles:
            kernel = attn_kernel(B, L, H, Dh, window=window, dtype=dtype, **tile)

            def tilelang_call(kernel=kernel):
                kernel(qkv, lens, out)

            out.fill_(float("nan"))
            tilelang_call()
            cases.append(
                AttnCase(
                    kernel=f"attention/{f'window{window}' if window else 'full'}",
                    shape=f"{B}x{L}x{H}x{Dh}",
                    flops=4.0 * B * H * Dh * visible_pairs(L, window),
                    tilelang=tilelang_call,
                    torch=sdpa,
                    window=window,
                    tiles=dict(tile),
                    max_abs_diff_vs_sdpa=float((out.float() - ref).abs().max()),  # NaN: a row was not written
                )
            )
    return cases


def attention_cases(M: int, dtype: str) -> list[AttnCase]:
    """``bench_kernels`` hook: ``M`` tokens as ``M // 512`` ModernBERT-large sequences."""
    shape = dict(MODERNBERT_LARGE, B=max(M // MODERNBERT_LARGE["L"], 1))
    return make_cases(**shape, dtype=dtype)


def burst_ms(fn, graph: bool = False, warmup: int = 25, burst: int = 50, repeats: int = 15) -> float:
    """Time of one ``fn()`` in milliseconds: the median over ``repeats`` of the mean of
    ``burst`` back-to-back calls between two CUDA events.  ``graph=True`` captures the
    burst in a CUDA graph and times its replays, which takes the host's launch cost out."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(burst):
                fn()
        run = g.replay
    else:

        def run():
            for _ in range(burst):
                fn()

    return time_ms(run, warmup=1, rep=repeats) / burst


def bench_attention(
    B: int,
    L: int,
    H: int,
    Dh: int,
    windows=WINDOWS,
    dtype: str = "bfloat16",
    tiles=(TILE_DEFAULTS,),
    graph: bool = False,
) -> list[dict]:
    """Rows of ms and useful TFLOP/s: SDPA once per window, then each TileLang tile config."""
    rows, sdpa_timed = [], set()
    timing = "cuda-graph" if graph else "launch"
    for case in make_cases(B, L, H, Dh, windows, dtype, tiles):
        common = dict(kernel=case.kernel, B=B, L=L, H=H, Dh=Dh, window=case.window, dtype=dtype, timing=timing)
        runs = [("tilelang", case.tiles, case.tilelang, case.max_abs_diff_vs_sdpa)]
        if case.window not in sdpa_timed:
            sdpa_timed.add(case.window)
            runs.insert(0, ("sdpa", None, case.torch, 0.0))
        for impl, tiles_, fn, diff in runs:
            ms = burst_ms(fn, graph)
            rows.append(
                dict(
                    common,
                    impl=impl,
                    tiles=tiles_,
                    ms=ms,
                    tflops=case.flops / (ms * 1e-3) / 1e12,
                    max_abs_diff_vs_sdpa=diff,
                )
            )
    return rows


def parse_tiles(text: str) -> dict:
    """``"128,64,1,256"`` -> ``{"block_M": 128, "block_N": 64, "num_stages": 1, "threads": 256}``."""
    values = [int(v) for v in text.split(",")]
    if len(values) != len(TILE_KEYS):
        raise argparse.ArgumentTypeError(f"expected {','.join(TILE_KEYS)}, got {text!r}")
    return dict(zip(TILE_KEYS, values))


def markdown(rows: list[dict]) -> str:
    head = (
        "| window | impl | tiles (M,N,stages,threads) | B×L×H×Dh | timing | ms | TFLOP/s | max abs diff vs SDPA |\n"
        "|---|---|---|---|---|---:|---:|---:|"
    )
    body = [
        f"| {r['window'] or 'full'} | {r['impl']} | "
        f"{','.join(str(r['tiles'][k]) for k in TILE_KEYS) if r['tiles'] else ''} | "
        f"{r['B']}×{r['L']}×{r['H']}×{r['Dh']} | {r['timing']} | {r['ms']:.4f} | {r['tflops']:.1f} | "
        f"{r['max_abs_diff_vs_sdpa']:.2e} |"
        for r in rows
    ]
    return "\n".join([head, *body])


def environment() -> dict:
    import tilelang

    return dict(
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        tilelang=tilelang.__version__,
        cuda=torch.version.cuda,
        python=platform.python_version(),
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for key, value in MODERNBERT_LARGE.items():
        ap.add_argument(f"--{key}", type=int, default=value)
    ap.add_argument("--windows", type=int, nargs="+", default=list(WINDOWS), help="0 = full attention")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument(
        "--tiles",
        nargs="+",
        type=parse_tiles,
        default=[dict(TILE_DEFAULTS)],
        help="TileLang tile configurations block_M,block_N,num_stages,threads (default: the kernel's)",
    )
    ap.add_argument("--graph", action="store_true", help="time CUDA-graph replays (no host launch cost)")
    ap.add_argument("--out", type=Path, help="write the rows and the environment as JSON")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_attention: no CUDA device; nothing measured", file=sys.stderr)
        return 2
    rows = bench_attention(args.B, args.L, args.H, args.Dh, args.windows, args.dtype, args.tiles, args.graph)
    print(markdown(rows))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dict(environment=environment(), rows=rows), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
