"""The residual added in a branch's last GEMM (cuBLASLt's C matrix) against the add in the layer norm after it.

    python benchmarks/residual_probe.py --out residual.json

An encoder layer ends each branch (attention, MLP) with a GEMM whose output is added to the residual
stream; the next layer norm then reads the new stream.  The package runs the GEMM, then one kernel
that reads the stream and the GEMM's output and writes the new stream and its norm.  With the
residual as the GEMM's C matrix (beta 1, added in the epilogue), the norm kernel reads one tensor and
writes one.  Same method as ``benchmarks/gemm_probe.py``: 28 calls on 28 distinct inputs and bf16
weight matrices (the H200 configuration: hidden 1024, GLU 2624) in one CUDA graph, µs a call = the
replay's median / 28, at M = 128 and 1,792 positions.  Rows per branch GEMM (``attn_out``,
``mlp_out``) and M:

- ``gemm`` / ``gemm+residual``: the GEMM alone (cuBLASLt's heuristic's first algorithm), without and
  with the residual;
- ``add+norm`` / ``norm``: Inductor's kernel for the norm with the add, and for the norm alone
  (``torch.compile`` of the same expressions, LayerNorm without bias as ModernBERT's);
- ``gemm, add+norm`` (the package's pair) and ``gemm+residual, norm`` (the pair with the add moved),
  the latter with the largest difference of its norm output and new stream from the former's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cublaslt_probe import Lt  # noqa: E402  (shared by the GPU probes)
from benchmarks.gemm_probe import finish, probe_result, saver, timed_row  # noqa: E402

LAYERS = 28
HIDDEN = 1024
BRANCHES = {"attn_out": (HIDDEN, 1024), "mlp_out": (HIDDEN, 2624)}
ROWS = (128, 1792)
EPS = 1e-5


def norms(torch):
    """The two Inductor kernels: ``(r + y, norm(r + y))`` and ``norm(s)``."""
    import torch.nn.functional as F

    def add_norm(r, y, w):
        s = r + y
        return s, F.layer_norm(s, (HIDDEN,), w, None, EPS)

    def norm(s, w):
        return F.layer_norm(s, (HIDDEN,), w, None, EPS)

    return torch.compile(add_norm, dynamic=False), torch.compile(norm, dynamic=False)


def branch_rows(torch, lt, result, save, name: str, M: int, weights: list, add_norm, norm) -> None:
    N, K = weights[0].shape
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    xs = [torch.randn(M, K, **bf16) for _ in range(LAYERS)]
    rs = [torch.randn(M, N, **bf16) * 4 for _ in range(LAYERS)]
    ys = [torch.empty(M, N, **bf16) for _ in range(LAYERS)]
    ss = [torch.empty(M, N, **bf16) for _ in range(LAYERS)]
    w = torch.rand(N, **bf16) + 0.5
    problem = lt.problem(M, N, K)
    algo = lt.algorithms(problem, 1)[0]
    head = {"gemm": name, "M": M, "N": N, "K": K}
    outs = {}

    def row(label, call, output=None, reference=None, versus="first"):
        calls = [lambda i=i: call(i) for i in range(LAYERS)]
        timed_row(torch, result, save, {**head, "name": label}, calls, LAYERS, output, reference, versus)

    def package(i):
        lt.matmul(problem, algo, xs[i], weights[i], ys[i])
        outs[i] = add_norm(rs[i], ys[i], w)

    def moved(i):
        lt.matmul(problem, algo, xs[i], weights[i], ss[i], residual=rs[i])
        outs[i] = (ss[i], norm(ss[i], w))

    row("gemm", lambda i: lt.matmul(problem, algo, xs[i], weights[i], ys[i]))
    row("gemm+residual", lambda i: lt.matmul(problem, algo, xs[i], weights[i], ss[i], residual=rs[i]))
    row("add+norm", lambda i: add_norm(rs[i], ys[i], w))
    row("norm", lambda i: norm(ss[i], w))
    package(0)
    first = [t.clone() for t in outs[0]]
    row("gemm, add+norm", package)
    moved(0)
    stream = outs[0][0].clone()
    row("gemm+residual, norm", moved, lambda: outs[0][1], first[1], versus="package_norm")
    result["rows"][-1]["max_abs_stream_vs_package"] = float((stream.float() - first[0].float()).abs().max())
    exact = (xs[0].float() @ weights[0].float().t() + rs[0].float()).to(torch.bfloat16)
    result["rows"][-1]["stream_ulps_vs_fp32_once_rounded"] = int(
        (stream.view(torch.int16).int() - exact.view(torch.int16).int()).abs().max()
    )
    save()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workspace-mib", type=int, default=32)
    args = parser.parse_args()
    start = time.monotonic()

    import torch

    torch.manual_seed(0)
    result = probe_result(torch, "benchmarks/residual_probe.py")
    save = saver(result, args.out)
    torch.ones(8, 8, device="cuda", dtype=torch.bfloat16) @ torch.ones(8, 8, device="cuda", dtype=torch.bfloat16)
    lt = Lt(torch, args.workspace_mib << 20)
    add_norm, norm = norms(torch)
    for name, (N, K) in BRANCHES.items():
        weights = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K**-0.5 for _ in range(LAYERS)]
        for M in ROWS:
            branch_rows(torch, lt, result, save, name, M, weights, add_norm, norm)
    return finish(result, save, start)


if __name__ == "__main__":
    raise SystemExit(main())
