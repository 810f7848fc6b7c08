"""The encoder's GEMMs with a zero bias (cuBLASLt), and the MLP's first GEMM and GeGLU in one Triton kernel.

    python benchmarks/mlp_probe.py --out mlp.json [--skip bias,geglu,tma]

Same method as ``benchmarks/gemm_probe.py``: 28 calls on 28 distinct bf16 weight matrices (the
H200 configuration's layer: hidden 1024, GLU 2624) captured in one CUDA graph; time per call = the
replay's median / 28; M = 128 and 1,792 positions (the 1×128 and 7×256 serving shapes).

- ``bias``: each of a layer's four GEMMs as ``torch.mm`` (what the package's ``aten.mm`` runs:
  cuBLAS) and as ``torch.addmm`` with a zero bias vector (torch sends a bf16 ``addmm`` with a 1-D
  bias to cuBLASLt with the bias in the epilogue), the largest difference between the two and
  whether they are equal bit for bit.
- ``geglu``: the MLP's first GEMM and its gated GELU as the package runs them (cuBLAS, then one
  pointwise kernel) against :func:`benchmarks.triton_skinny.geglu_gemm` (one kernel, grouped tiles)
  at several tiles; ``tma``: :func:`benchmarks.triton_skinny.geglu_gemm_tma` (TMA, persistent).
  Each row gives its largest difference from the first row's output.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemm_probe import finish, probe_result, saver, timed_row  # noqa: E402  (shared by the GPU probes)

LAYERS = 28
GEMMS = {"Wqkv": (3072, 1024), "attn_out": (1024, 1024), "Wi": (5248, 1024), "mlp_out": (1024, 2624)}
ROWS = (128, 1792)
# block_m, block_n, block_k, warps, stages
TILES = (
    (64, 32, 128, 4, 3),
    (64, 64, 128, 4, 3),
    (128, 32, 128, 4, 3),
    (64, 64, 64, 4, 4),
    (128, 64, 64, 4, 4),
    (128, 64, 64, 8, 4),
    (64, 128, 64, 4, 4),
    (128, 128, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 128, 32, 8, 5),
)


def bias_rows(torch, result, save, name: str, M: int, weights: list) -> None:
    """``mm`` and ``addmm`` with a zero bias for one GEMM at one M."""
    N, K = weights[0].shape
    zero = torch.zeros(N, device="cuda", dtype=torch.bfloat16)
    xs = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
    ys = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
    first = torch.mm(xs[0], weights[0].t())
    head = {"section": "bias", "gemm": name, "M": M, "N": N, "K": K}
    calls = [lambda i=i: torch.mm(xs[i], weights[i].t(), out=ys[i]) for i in range(LAYERS)]
    timed_row(torch, result, save, {**head, "name": "mm"}, calls, LAYERS)
    calls = [lambda i=i: torch.addmm(zero, xs[i], weights[i].t(), out=ys[i]) for i in range(LAYERS)]
    once = lambda: torch.addmm(zero, xs[0], weights[0].t())  # noqa: E731
    timed_row(torch, result, save, {**head, "name": "addmm-zero-bias"}, calls, LAYERS, once, first)


def geglu_rows(torch, result, save, skip, M: int, weights: list) -> None:
    """The package's GEMM and pointwise kernel, then the fused kernels, at one M."""
    from benchmarks.triton_skinny import geglu_gemm, geglu_gemm_tma, geglu_pointwise

    N, K = weights[0].shape
    F = N // 2
    xs = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
    hs = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
    ys = [torch.empty(M, F, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
    head = {"section": "geglu", "gemm": "Wi+GeGLU", "M": M, "N": N, "K": K}
    first = geglu_pointwise(torch.mm(xs[0], weights[0].t()), torch.empty(M, F, device="cuda", dtype=torch.bfloat16))

    def package(i):
        torch.mm(xs[i], weights[i].t(), out=hs[i])
        geglu_pointwise(hs[i], ys[i])

    calls = [lambda i=i: package(i) for i in range(LAYERS)]
    timed_row(torch, result, save, {**head, "name": "mm+pointwise"}, calls, LAYERS)
    for kind, fn in (("fused", geglu_gemm), ("tma", geglu_gemm_tma)):
        if kind in skip:
            continue
        for tile in TILES:

            def run(i, y=None, fn=fn, t=tile):
                out = y if y is not None else ys[i]
                return fn(xs[i], weights[i], out, *t[:3], num_warps=t[3], num_stages=t[4])

            once = lambda run=run: run(0, torch.empty(M, F, device="cuda", dtype=torch.bfloat16))  # noqa: E731
            label = "{}:{}x{}x{}/w{}/s{}".format(kind, *tile)
            calls = [lambda i=i, run=run: run(i) for i in range(LAYERS)]
            timed_row(torch, result, save, {**head, "name": label}, calls, LAYERS, once, first)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--skip", default="", help="sections to leave out: bias,geglu,tma")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    start = time.monotonic()

    import torch

    torch.manual_seed(0)
    result = probe_result(torch, "benchmarks/mlp_probe.py", skip=sorted(skip))
    save = saver(result, args.out)
    for name, (N, K) in GEMMS.items():
        weights = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K**-0.5 for _ in range(LAYERS)]
        for M in ROWS:
            if "bias" not in skip:
                bias_rows(torch, result, save, name, M, weights)
            if name == "Wi" and "geglu" not in skip:
                geglu_rows(torch, result, save, skip, M, weights)
    return finish(result, save, start)


if __name__ == "__main__":
    raise SystemExit(main())
