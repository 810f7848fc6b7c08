"""The MLP's first GEMM and its gated GELU in one Triton kernel, against cuBLAS and Inductor's kernel.

    python benchmarks/geglu_linear_probe.py --out geglu_linear.json [--configs all|module]

The H200 configuration's MLP (hidden 1024, GLU 2624, bf16) at M = 128 and 1,792 positions; same
method as ``benchmarks/gemm_probe.py``: 28 calls on 28 distinct inputs and weight matrices in one
CUDA graph, µs a call = the replay's median / 28.  Rows:

- ``cublas, geglu``: the package's pair, ``F.linear`` (cuBLAS) then Inductor's kernel for
  ``gelu(input) * gate`` (``torch.compile`` of the expression); the reference of every other row;
- ``cublas``: the GEMM alone;
- ``fused BMxBNxBK wW sS``: ``laya::geglu_linear``'s kernel at one launch configuration
  (:data:`laya_build.model.geglu_linear.CONFIGS` and, with ``--configs all``, others), with its
  largest difference from the pair's output; ``module``: the op itself, as a package calls it
  (its configuration chosen by the row count).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemm_probe import finish, probe_result, saver, timed_row  # noqa: E402

LAYERS = 28
HIDDEN = 1024
GLU = 2624
ROWS = (128, 1792)
OTHERS = (  # BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages
    (128, 128, 64, 8, 4),
    (128, 64, 64, 4, 4),
    (128, 64, 64, 8, 3),
    (64, 128, 64, 4, 4),
    (256, 64, 64, 8, 3),
    (128, 128, 32, 8, 4),
    (64, 64, 128, 4, 3),
    (32, 64, 64, 4, 4),
    (16, 64, 128, 4, 3),
    (64, 32, 64, 4, 4),
)


def configs(which: str) -> list[dict]:
    from laya_build.model import geglu_linear

    chosen = [dict(c) for c in geglu_linear.CONFIGS]
    if which == "all":
        for bm, bn, bk, w, s in OTHERS:
            chosen.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "num_warps": w, "num_stages": s})
    return chosen


def rows_at(torch, result, save, weights, pointwise, M: int, which: str) -> None:
    """The probe's rows at M positions."""
    import torch.nn.functional as F

    from laya_build.model import geglu_linear

    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    xs = [torch.randn(M, HIDDEN, **bf16) for _ in range(LAYERS)]
    ys = [torch.empty(M, 2 * GLU, **bf16) for _ in range(LAYERS)]
    outs = [torch.empty(M, GLU, **bf16) for _ in range(LAYERS)]
    head = {"M": M, "N": 2 * GLU, "K": HIDDEN}

    def gemm(i):
        return torch.mm(xs[i], weights[i].t(), out=ys[i])

    def pair(i):
        return pointwise(gemm(i))

    def fused(i, config):
        geglu_linear.launch(xs[i], weights[i], None, outs[i], config)

    def module(i):
        return geglu_linear.geglu_linear(xs[i], weights[i], None)

    reference = pair(0).clone()
    timed_row(torch, result, save, {**head, "name": "cublas"}, [lambda i=i: gemm(i) for i in range(LAYERS)], LAYERS)
    timed_row(
        torch, result, save, {**head, "name": "cublas, geglu"}, [lambda i=i: pair(i) for i in range(LAYERS)], LAYERS
    )
    for config in configs(which):
        name = "fused {BLOCK_M}x{BLOCK_N}x{BLOCK_K} w{num_warps} s{num_stages}".format(**config)
        calls = [lambda i=i, c=config: fused(i, c) for i in range(LAYERS)]
        timed_row(
            torch, result, save, {**head, "name": name}, calls, LAYERS, lambda: outs[0], reference, "cublas_geglu"
        )
    calls = [lambda i=i: module(i) for i in range(LAYERS)]
    timed_row(
        torch, result, save, {**head, "name": "module"}, calls, LAYERS, lambda: module(0), reference, "cublas_geglu"
    )
    product = xs[0].float() @ weights[0].float().t()
    exact = F.gelu(product[:, :GLU]) * product[:, GLU:]
    result.setdefault("pair_vs_fp32", {})[str(M)] = float((reference.float() - exact).abs().max())
    result.setdefault("fused_vs_fp32", {})[str(M)] = float((module(0).float() - exact).abs().max())
    save()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--configs", choices=("all", "module"), default="all")
    args = parser.parse_args()
    start = time.monotonic()

    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    result = probe_result(torch, "benchmarks/geglu_linear_probe.py")
    save = saver(result, args.out)
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    weights = [torch.randn(2 * GLU, HIDDEN, **bf16) * HIDDEN**-0.5 for _ in range(LAYERS)]
    pointwise = torch.compile(lambda y: F.gelu(y[:, :GLU]) * y[:, GLU:], dynamic=False)
    for M in ROWS:
        rows_at(torch, result, save, weights, pointwise, M, args.configs)
    return finish(result, save, start)


if __name__ == "__main__":
    raise SystemExit(main())
