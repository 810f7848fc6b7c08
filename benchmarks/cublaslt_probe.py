"""The encoder's GEMMs through every algorithm cuBLASLt offers, against the cuBLAS call the package makes.

    python benchmarks/cublaslt_probe.py --out cublaslt.json [--algos 24] [--workspace-mib 32]
        [--write-algorithms FILE] [--library liblaya_native.so]

The package's GEMMs (``aten.mm`` through AOTInductor) go to cuBLAS, which picks one kernel by its
own heuristic; cuBLASLt's heuristic returns a ranked list of algorithms for the same problem.  This
probe asks cuBLASLt (through ``ctypes``: the library torch itself loaded) for up to ``--algos`` of
them for each of a layer's four GEMMs of the H200 configuration (hidden 1024, GLU 2624) at both
serving shapes (M = 128 and 1,792 positions), and times each as the graphed runner runs a GEMM:
28 calls on 28 distinct bf16 weight matrices captured in one CUDA graph, time per call = the
replay's median / 28.  Rows:

- ``cublas``: ``F.linear`` with torch's default library (what the package runs);
- ``cublaslt-torch``: ``F.linear`` with ``preferred_blas_library("cublaslt")`` (the heuristic's first);
- ``lt #i``: the heuristic's i-th algorithm, with its configuration attributes, its 8 opaque
  words (``words``), the largest difference from ``cublas``'s output and whether it is
  ``cublas``'s output bit for bit.

``--write-algorithms FILE`` writes, for each GEMM, the fastest ``lt`` algorithm at each M as an
algorithms file (:data:`laya_build.model.native_linear.ALGORITHMS_FORMAT`; M = 128 as
``m_max`` 128, the largest M as no bound), what ``export.native_algorithms.cuda-bfloat16``
names.  ``--library`` then times the project's op (``laya_native::linear``, the library an
export built) with those algorithms beside the rows above: ``native`` rows.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
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
        record(f"lt #{index}", calls, once, config=lt.config(algo), words=words_of(algo))


def words_of(result: HeuristicResult) -> list[str]:
    """The algorithm's 8 opaque words, as an algorithms file holds them."""
    return [f"0x{int(w):016x}" for w in result.algo]


def algorithms_file(result: dict, version: int) -> dict:
    """The fastest ``lt`` algorithm of each GEMM at each M, as an algorithms file: the smallest M
    bounds the rows it serves, the largest serves every M above."""
    from laya_build.model.native_linear import ALGORITHMS_FORMAT

    best = {}
    for row in result["rows"]:  # an algorithm whose timing or output check failed is never chosen
        if row["name"].startswith("lt #") and "us" in row and "words" in row and "error" not in row:
            key = (row["N"], row["K"], row["M"])
            if key not in best or row["us"] < best[key]["us"]:
                best[key] = row
    cublas = {(r["N"], r["K"], r["M"]): r.get("us") for r in result["rows"] if r["name"] == "cublas"}
    entries = []
    for (n, k, m), row in sorted(best.items()):
        entries.append(
            {
                "n": n,
                "k": k,
                "dtype": "bfloat16",
                "bias": False,
                "m_max": None if m == max(ROWS) else m,
                "algorithm": row["words"],
                "gemm": row["gemm"],
                "timed_at_m": m,
                "us": row["us"],
                "cublas_us": cublas.get((n, k, m)),
                "max_abs_vs_cublas": row.get("max_abs_vs_cublas"),
                "equal_to_cublas": row.get("equal_to_cublas"),
                "config": row.get("config"),
            }
        )
    return {
        "format": ALGORITHMS_FORMAT,
        "written_by": "benchmarks/cublaslt_probe.py",
        "date": result.get("date"),
        "gpu": result.get("gpu"),
        "torch": result.get("torch"),
        "cublaslt_version": version,
        "entries": entries,
    }


def native_rows(torch, result: dict, save, library: Path, algorithms: dict) -> None:
    """The project's op with the written algorithms, timed as the rows above (``native``)."""
    import torch.nn.functional as F

    from laya_build.model.native_linear import algorithm_argument
    from laya_build.records import sha256_file
    from laya_build.runtime.serving import load_library

    load_library(library, sha256_file(library), what="--library")
    entries = [{**e, "cublaslt_version": algorithms["cublaslt_version"]} for e in algorithms["entries"]]
    for name, (N, K) in GEMMS.items():
        weights = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K**-0.5 for _ in range(LAYERS)]
        arg = algorithm_argument(entries, N, K, "bfloat16", False) or None
        for M in ROWS:
            xs = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
            op = functools.partial(torch.ops.laya_native.linear, bias=None, algorithm=arg)
            calls = [functools.partial(op, x, w) for x, w in zip(xs, weights)]
            row = {"gemm": name, "M": M, "N": N, "K": K, "name": "native"}
            timed_row(torch, result, save, row, calls, LAYERS, calls[0], F.linear(xs[0], weights[0]), versus="cublas")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--algos", type=int, default=24)
    parser.add_argument("--workspace-mib", type=int, default=32)
    parser.add_argument("--write-algorithms", type=Path, help="the algorithms file to write (the fastest of each)")
    parser.add_argument("--library", type=Path, help="the native op library to time with those algorithms")
    args = parser.parse_args()
    if args.library and not args.write_algorithms:
        parser.error("--library times the algorithms --write-algorithms writes: give both")
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
    if args.write_algorithms:
        lt.lib.cublasLtGetVersion.restype = ctypes.c_size_t
        algorithms = algorithms_file(result, int(lt.lib.cublasLtGetVersion()))
        args.write_algorithms.write_text(json.dumps(algorithms, indent=1) + "\n")
        print(f"wrote {args.write_algorithms}: {len(algorithms['entries'])} entries", flush=True)
        if args.library:
            native_rows(torch, result, save, args.library, algorithms)
    return finish(result, save, start)


if __name__ == "__main__":
    raise SystemExit(main())
