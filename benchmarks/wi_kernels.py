"""The MLP's first GEMM at 1,792 rows, kernel by kernel, for a profiler (Nsight Compute).

    ncu --nvtx -k regex:'nvjet|device_kernel' --section SpeedOfLight --section WarpStateStats \\
        --csv --page details python benchmarks/wi_kernels.py [--library liblaya_native.so] > wi.csv

(``-k`` matches a kernel's function name without its template arguments: CUTLASS's kernels are all
``cutlass::device_kernel<...>``, cuBLAS's and cuBLASLt's on Hopper ``nvjet_...``.)

Builds the native op library with its CUDA kernels unless ``--library`` names one, then calls, in
this order and each ``--calls`` times (default 2), every one inside an NVTX range of its name:

- ``cublas``: ``torch.mm`` of the H200 configuration's ``Wi`` shape (1,792 x 1,024 by 1,024 x 5,248);
- ``cublaslt``: the same product through ``laya_native::linear`` and cuBLASLt's heuristic;
- ``cutlass-linear #i``: the same product through the native library's CUTLASS GEMM at each launch
  configuration of ``linear`` (its mainloop without the gated GELU);
- ``geglu #i``: ``laya_native::geglu_linear`` (the product with its gated GELU in the epilogue) at
  each launch configuration of ``geglu``.

The inputs are scaled as the model's are (the input a layer norm's output, the weights the
initialiser's standard deviation of 0.02), since a tensor core's power, and with it the clock a
GEMM keeps, depends on the bits it multiplies.  Nothing is timed here: the profiler measures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.native_cutlass_probe import GLU, HIDDEN, library  # noqa: E402

ROWS = 1792
STD = 0.02  # the model initialiser's standard deviation


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", type=Path, help="a native library built with its CUDA kernels")
    parser.add_argument("--calls", type=int, default=2)
    args = parser.parse_args()

    import torch

    from laya_build.model import native_geglu

    torch.manual_seed(0)
    path = library(args.library, {})
    torch.ops.load_library(str(path))
    ops = torch.ops.laya_native
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    x = torch.randn(ROWS, HIDDEN, **bf16)
    w = torch.randn(2 * GLU, HIDDEN, **bf16) * STD
    interleaved = native_geglu.interleave(w).contiguous()
    y = torch.empty(ROWS, 2 * GLU, **bf16)

    calls = [("cublas", lambda: torch.mm(x, w.t(), out=y)), ("cublaslt", lambda: ops.linear(x, w, None, None, None))]
    for i, name in enumerate(ops.cutlass_configs("linear")):
        calls.append((f"cutlass-linear #{i} {name}", lambda i=i: ops.linear(x, w, None, None, None, cutlass=[-1, i])))
    for i, name in enumerate(ops.cutlass_configs("geglu")):
        calls.append((f"geglu #{i} {name}", lambda i=i: ops.geglu_linear(x, interleaved, None, [-1, i])))
    for name, call in calls:
        for _ in range(args.calls):
            torch.cuda.nvtx.range_push(name)
            call()
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        print(name, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
