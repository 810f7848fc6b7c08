"""The encoder's GEMMs through every algorithm cuBLASLt offers, against the cuBLAS call the package makes.

    python benchmarks/cublaslt_probe.py --out cublaslt.json [--algos 24] [--workspace-mib 32]

The package's GEMMs (``aten.mm`` through AOTInductor) go to cuBLAS, which picks one kernel by its
own heuristic; cuBLASLt's heuristic returns a ranked list of algorithms for the same problem.  This
probe asks cuBLASLt (through ``ctypes``: the library torch itself loaded) for up to ``--algos`` of
them for each of a layer's four GEMMs of the H200 configuration (hidden 1024, GLU 2624) at both
serving shapes (M = 128 and 1,792 positions), and times each as the graphed runner runs a GEMM:
28 calls on 28 distinct bf16 weight matrices captured in one CUDA graph, time per call = the
replay's median / 28.  Rows:

- ``cublas``: ``F.linear`` with torch's default library (what the package runs);
- ``cublaslt-torch``: ``F.linear`` with ``preferred_blas_library("cublaslt")`` (the heuristic's first);
- ``lt #i``: the heuristic's i-th algorithm, with its configuration attributes, the largest
  difference from ``cublas``'s output and whether it is ``cublas``'s output bit for bit.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemm_probe import finish, probe_result, saver, timed_row  # noqa: E402  (shared by the GPU probes)

LAYERS = 28
GEMMS = {"Wqkv": (3072, 1024), "attn_out": (1024, 1024), "Wi": (5248, 1024), "mlp_out": (1024, 2624)}
ROWS = (128, 1792)

# cublasLt.h / library_types.h
CUDA_R_32F, CUDA_R_16BF = 0, 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
DESC_TRANSA, DESC_TRANSB = 3, 4
PREF_MAX_WORKSPACE_BYTES = 1
ALGO_CONFIG = {"id": 0, "tile": 1, "splitk": 2, "reduction": 3, "swizzle": 4, "custom": 5, "stages": 6}


class HeuristicResult(ctypes.Structure):
    _fields_ = [
        ("algo", ctypes.c_uint64 * 8),
        ("workspaceSize", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("wavesCount", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


def _size(value) -> ctypes.c_size_t:
    """A ``size_t`` argument: ctypes would pass a bare int as a 32-bit ``int``."""
    return ctypes.c_size_t(ctypes.sizeof(value))


def cublaslt_library() -> ctypes.CDLL:
    """The cuBLASLt torch loaded (after a GEMM on the GPU), from this process's memory map."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if "libcublasLt.so" in path:
            return ctypes.CDLL(path)
    raise RuntimeError("libcublasLt is not loaded in this process: run a GEMM on the GPU first")


class Lt:
    """``y[M, N] = x[M, K] @ w[N, K]^T`` in bf16 with fp32 accumulation, through a chosen cuBLASLt algorithm."""

    def __init__(self, torch, workspace_bytes: int):
        self.torch = torch
        self.lib = cublaslt_library()
        self.handle = ctypes.c_void_p()
        self._ok(self.lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device="cuda")
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    @staticmethod
    def _ok(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} returned cuBLAS status {status}")

    def problem(self, M: int, N: int, K: int):
        """The descriptors of one problem: column-major ``y^T[N, M] = w[N, K] . x^T[K, M]``."""
        desc = ctypes.c_void_p()
        self._ok(
            self.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate"
        )
        for attr, op in ((DESC_TRANSA, CUBLAS_OP_T), (DESC_TRANSB, CUBLAS_OP_N)):
            value = ctypes.c_int32(op)
            self._ok(
                self.lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(value), _size(value)),
                "MatmulDescSetAttribute",
            )
        layouts = []
        for rows, cols, ld in ((K, N, K), (K, M, K), (N, M, N)):
            layout = ctypes.c_void_p()
            self._ok(
                self.lib.cublasLtMatrixLayoutCreate(
                    ctypes.byref(layout), CUDA_R_16BF, ctypes.c_uint64(rows), ctypes.c_uint64(cols), ctypes.c_int64(ld)
                ),
                "MatrixLayoutCreate",
            )
            layouts.append(layout)
        return desc, layouts

    def algorithms(self, problem, count: int) -> list[HeuristicResult]:
        desc, (a, b, c) = problem
        pref = ctypes.c_void_p()
        self._ok(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "MatmulPreferenceCreate")
        size = ctypes.c_uint64(self.workspace.numel())
        self._ok(
            self.lib.cublasLtMatmulPreferenceSetAttribute(
                pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(size), _size(size)
            ),
            "MatmulPreferenceSetAttribute",
        )
        results = (HeuristicResult * count)()
        returned = ctypes.c_int(0)
        self._ok(
            self.lib.cublasLtMatmulAlgoGetHeuristic(
                self.handle, desc, a, b, c, c, pref, count, results, ctypes.byref(returned)
            ),
            "MatmulAlgoGetHeuristic",
        )
        return [results[i] for i in range(returned.value) if results[i].state == 0]

    def config(self, result: HeuristicResult) -> dict:
        out = {"workspace": int(result.workspaceSize), "waves": round(float(result.wavesCount), 3)}
        for name, attr in ALGO_CONFIG.items():
            value, written = ctypes.c_uint32(0), ctypes.c_size_t(0)
            status = self.lib.cublasLtMatmulAlgoConfigGetAttribute(
                ctypes.byref(result.algo), attr, ctypes.byref(value), _size(value), ctypes.byref(written)
            )
            if status == 0:
                out[name] = int(value.value)
        return out

    def matmul(self, problem, result: HeuristicResult, x, w, y) -> None:
        desc, (a, b, c) = problem
        self._ok(
            self.lib.cublasLtMatmul(
                self.handle,
                desc,
                ctypes.byref(self.alpha),
                ctypes.c_void_p(w.data_ptr()),
                a,
                ctypes.c_void_p(x.data_ptr()),
                b,
                ctypes.byref(self.beta),
                ctypes.c_void_p(y.data_ptr()),
                c,
                ctypes.c_void_p(y.data_ptr()),
                c,
                ctypes.byref(result.algo),
                ctypes.c_void_p(self.workspace.data_ptr()),
                ctypes.c_size_t(self.workspace.numel()),
                ctypes.c_void_p(self.torch.cuda.current_stream().cuda_stream),
            ),
            "cublasLtMatmul",
        )


def probe_shape(torch, lt: Lt, result: dict, save, name: str, M: int, weights: list, count: int) -> None:
    """The rows of one GEMM at one M: cuBLAS, torch's cuBLASLt call, then each of cuBLASLt's algorithms."""
    import torch.nn.functional as F

    N, K = weights[0].shape
    xs = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
    ys = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
    reference = F.linear(xs[0], weights[0])

    def record(label, calls, out0=None, **extra):
        row = {"gemm": name, "M": M, "N": N, "K": K, "name": label, **extra}
        timed_row(torch, result, save, row, calls, LAYERS, out0, reference, versus="cublas")

    def mm(i):
        torch.mm(xs[i], weights[i].t(), out=ys[i])

    record("cublas", [lambda i=i: mm(i) for i in range(LAYERS)])
    default_blas = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        lt_out = torch.mm(xs[0], weights[0].t())
        record("cublaslt-torch", [lambda i=i: mm(i) for i in range(LAYERS)], lambda: lt_out)
    finally:
        torch.backends.cuda.preferred_blas_library(default_blas)
    problem = lt.problem(M, N, K)
    for index, algo in enumerate(lt.algorithms(problem, count)):

        def once(algo=algo):
            y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            lt.matmul(problem, algo, xs[0], weights[0], y)
            return y

        calls = [lambda i=i, algo=algo: lt.matmul(problem, algo, xs[i], weights[i], ys[i]) for i in range(LAYERS)]
        record(f"lt #{index}", calls, once, config=lt.config(algo))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--algos", type=int, default=24)
    parser.add_argument("--workspace-mib", type=int, default=32)
    args = parser.parse_args()
    start = time.monotonic()

    import torch

    torch.manual_seed(0)
    torch.ones(8, 8, device="cuda", dtype=torch.bfloat16) @ torch.ones(8, 8, device="cuda", dtype=torch.bfloat16)
    lt = Lt(torch, args.workspace_mib << 20)
    result = probe_result(torch, "benchmarks/cublaslt_probe.py", algos=args.algos, workspace_mib=args.workspace_mib)
    save = saver(result, args.out)
    for name, (N, K) in GEMMS.items():
        weights = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K**-0.5 for _ in range(LAYERS)]
        for M in ROWS:
            probe_shape(torch, lt, result, save, name, M, weights, args.algos)
    return finish(result, save, start)


if __name__ == "__main__":
    raise SystemExit(main())
