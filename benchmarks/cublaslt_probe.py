"""The encoder's GEMMs through every algorithm cuBLASLt offers, against the cuBLAS call the package makes.

    python benchmarks/cublaslt_probe.py --out cublaslt.json [--algos 24] [--workspace-mib 32]
        [--search ROUNDS [--keep 4] [--search-s 40]] [--rounds 3] [--write-algorithms FILE]
        [--max-workspace BYTES] [--library liblaya_native.so]
    python benchmarks/cublaslt_probe.py --from-rows cublaslt.json --write-algorithms FILE
        [--max-workspace BYTES] [--cublaslt-version V]

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
  ``cublas``'s output bit for bit;
- ``lt search #i`` (with ``--search``): the fastest algorithms found beyond the heuristic's list.
  The heuristic offers 8 algorithms a problem on the H200, all of one algorithm id in different
  configurations; the search changes one configuration attribute at a time (tile, stages, custom
  option, cluster shape, inner shape, swizzle, split-K with each reduction scheme the algorithm
  supports), keeps what ``cublasLtMatmulAlgoCheck`` accepts for the problem, times each briefly,
  and starts the next round from the ``--keep`` fastest.  From the second round on, the other
  algorithm ids cuBLASLt has for bf16 GEMMs compete too, each at every tile it offers.  Outputs
  are checked as the rows above (split-K sums in another order: not cuBLAS's bits).  Only
  algorithms beyond the heuristic's list become these rows.

One timing of an algorithm can differ from the next by several per cent
(docs/measurements/runtime-h200.md, "cuBLASLt's algorithms beyond the heuristic's list").
``--rounds R`` times each ``cublas``, ``lt #`` and ``lt search #`` row of a shape R times more,
round-robin over the rows, and makes its ``us`` the median of all (``us_timings``).

``--write-algorithms FILE`` writes, for each GEMM, the fastest ``lt`` or ``lt search`` algorithm at each M as an
algorithms file (:data:`laya_build.model.native_linear.ALGORITHMS_FORMAT`; M = 128 as
``m_max`` 128, the largest M as no bound), what ``export.native_algorithms.cuda-bfloat16``
names.  ``--library`` then times the project's op (``laya_native::linear``, the library an
export built) with those algorithms beside the rows above: ``native`` rows.  ``--max-workspace
BYTES`` lets only algorithms needing at most that much workspace into the file (0: none; cuBLASLt
clears a small workspace before each call, a memset node in a CUDA graph).  ``--from-rows`` writes
the file from an earlier run's ``--out`` without a GPU.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemm_probe import failed, finish, probe_result, saver, timed_row  # noqa: E402  (shared by the GPU probes)

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
ALGO_CONFIG_U16 = {"inner": 7, "cluster": 8}  # uint16_t attributes
CAP_SPLITK, CAP_REDUCTION_MASK, CAP_SWIZZLE, CAP_TILE_IDS, CAP_CUSTOM_MAX, CAP_STAGES_IDS = 0, 1, 2, 6, 7, 13
SPLITS = (2, 3, 4, 6, 8)
# cublasLtClusterShape_t: AUTO = 0, then 1x1x1 = 2 ...; a value cuBLASLt refuses is skipped
CLUSTER_SHAPE_IDS = range(0, 40)
INNER_SHAPE_IDS = range(0, 8)


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
        for attrs, kind in ((ALGO_CONFIG, ctypes.c_uint32), (ALGO_CONFIG_U16, ctypes.c_uint16)):
            for name, attr in attrs.items():
                value, written = kind(0), ctypes.c_size_t(0)
                status = self.lib.cublasLtMatmulAlgoConfigGetAttribute(
                    ctypes.byref(result.algo), attr, ctypes.byref(value), _size(value), ctypes.byref(written)
                )
                if status == 0:
                    out[name] = int(value.value)
        return out

    def caps(self, algo) -> dict:
        """What an algorithm may be configured with: its tiles, stages, custom options, split-K and swizzle."""

        def ints(attr):
            written = ctypes.c_size_t(0)
            if self.lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attr, None, 0, ctypes.byref(written)):
                return []
            values = (ctypes.c_uint32 * max(1, written.value // 4))()
            self.lib.cublasLtMatmulAlgoCapGetAttribute(
                ctypes.byref(algo), attr, values, ctypes.sizeof(values), ctypes.byref(written)
            )
            return [int(v) for v in values[: written.value // 4]]

        def one(attr):
            value, written = ctypes.c_int32(0), ctypes.c_size_t(0)
            status = self.lib.cublasLtMatmulAlgoCapGetAttribute(
                ctypes.byref(algo), attr, ctypes.byref(value), _size(value), ctypes.byref(written)
            )
            return int(value.value) if status == 0 else 0

        return {
            "tiles": ints(CAP_TILE_IDS),
            "stages": ints(CAP_STAGES_IDS),
            "custom_max": one(CAP_CUSTOM_MAX),
            "splitk": one(CAP_SPLITK),
            "reduction_mask": one(CAP_REDUCTION_MASK),
            "swizzle": one(CAP_SWIZZLE),
        }

    def configured(self, algo, settings) -> HeuristicResult | None:
        """A copy of ``algo`` with ``settings`` ((attribute, value, ctype), ...), or None where refused."""
        out = HeuristicResult()
        ctypes.memmove(ctypes.byref(out.algo), ctypes.byref(algo), ctypes.sizeof(algo))
        for attr, value, kind in settings:
            v = kind(value)
            if self.lib.cublasLtMatmulAlgoConfigSetAttribute(ctypes.byref(out.algo), attr, ctypes.byref(v), _size(v)):
                return None
        return out

    def check(self, problem, result: HeuristicResult) -> HeuristicResult | None:
        """``result`` with the workspace and waves cuBLASLt gives its algorithm for ``problem``; None where
        the algorithm cannot run it or needs more workspace than this probe has."""
        desc, (a, b, c) = problem
        checked = HeuristicResult()
        if self.lib.cublasLtMatmulAlgoCheck(
            self.handle, desc, a, b, c, c, ctypes.byref(result.algo), ctypes.byref(checked)
        ):
            return None
        if checked.workspaceSize > self.workspace.numel():
            return None
        result.workspaceSize, result.wavesCount, result.state = checked.workspaceSize, checked.wavesCount, 0
        return result

    def variations(self, problem, seed: HeuristicResult) -> list[HeuristicResult]:
        """Every algorithm one configuration attribute away from ``seed`` that cuBLASLt accepts for ``problem``."""
        caps = self.caps(seed.algo)
        u32, u16 = ctypes.c_uint32, ctypes.c_uint16
        settings = [[(ALGO_CONFIG["tile"], t, u32)] for t in caps["tiles"]]
        settings += [[(ALGO_CONFIG["stages"], t, u32)] for t in caps["stages"]]
        settings += [[(ALGO_CONFIG["custom"], c, u32)] for c in range(caps["custom_max"] + 1)]
        settings += [[(ALGO_CONFIG_U16["cluster"], c, u16)] for c in CLUSTER_SHAPE_IDS]
        settings += [[(ALGO_CONFIG_U16["inner"], c, u16)] for c in INNER_SHAPE_IDS]
        if caps["swizzle"]:
            settings += [[(ALGO_CONFIG["swizzle"], c, u32)] for c in range(4)]
        if caps["splitk"]:
            schemes = [bit for bit in (1, 2, 4) if caps["reduction_mask"] & bit] or [0]
            settings += [
                [(ALGO_CONFIG["splitk"], k, u32), (ALGO_CONFIG["reduction"], r, u32)] for k in SPLITS for r in schemes
            ]
        out = []
        for setting in settings:
            algo = self.configured(seed.algo, setting)
            if algo is not None and self.check(problem, algo) is not None:
                out.append(algo)
        return out

    def other_ids(self, problem, known: set[int], limit: int = 128) -> list[HeuristicResult]:
        """Algorithms of the ids cuBLASLt has for bf16 GEMMs other than ``known`` (the heuristic's): each
        at every tile it offers, with the first of its stage configurations that ``problem`` accepts."""
        types = (CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF)
        ids, returned = (ctypes.c_int * limit)(), ctypes.c_int(0)
        if self.lib.cublasLtMatmulAlgoGetIds(self.handle, *types, limit, ids, ctypes.byref(returned)):
            return []
        u32, out = ctypes.c_uint32, []
        for algo_id in ids[: returned.value]:
            base = HeuristicResult()
            if algo_id in known or self.lib.cublasLtMatmulAlgoInit(
                self.handle, *types, algo_id, ctypes.byref(base.algo)
            ):
                continue
            caps = self.caps(base.algo)
            for tile in caps["tiles"] or [0]:
                for stage in caps["stages"] or [0]:
                    algo = self.configured(
                        base.algo, [(ALGO_CONFIG["tile"], tile, u32), (ALGO_CONFIG["stages"], stage, u32)]
                    )
                    if algo is not None and self.check(problem, algo) is not None:
                        out.append(algo)
                        break
        return out

    def matmul(self, problem, result: HeuristicResult, x, w, y, residual=None) -> None:
        """``y = x @ w^T``; with ``residual`` (``y``'s shape), ``y = x @ w^T + residual``: cuBLASLt's C
        matrix with beta 1, added in the epilogue before the one rounding."""
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
                ctypes.byref(self.beta if residual is None else self.alpha),  # beta 1 with a residual
                ctypes.c_void_p((y if residual is None else residual).data_ptr()),
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


def probe_shape(
    torch,
    lt: Lt,
    result: dict,
    save,
    name: str,
    M: int,
    weights: list,
    count: int,
    search: tuple | None = None,
    rounds: int = 0,
) -> None:
    """The rows of one GEMM at one M: cuBLAS, torch's cuBLASLt call, then each of cuBLASLt's
    algorithms; with ``search`` (rounds, keep, budget_s), then the fastest :func:`search_algorithms`
    finds beyond the heuristic's list; with ``rounds``, every row but torch's cuBLASLt call timed
    that many times more (:func:`timing_rounds`)."""
    import torch.nn.functional as F

    from benchmarks.gemm_probe import graphed_ms

    N, K = weights[0].shape
    xs = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
    ys = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
    reference = F.linear(xs[0], weights[0])
    again = []  # (row, calls) to time in the rounds: calls that run the same kernels whenever called

    def record(label, calls, out0=None, **extra):
        row = {"gemm": name, "M": M, "N": N, "K": K, "name": label, **extra}
        timed_row(torch, result, save, row, calls, LAYERS, out0, reference, versus="cublas")
        return row

    def mm(i):
        torch.mm(xs[i], weights[i].t(), out=ys[i])

    cublas_calls = [lambda i=i: mm(i) for i in range(LAYERS)]
    again.append((record("cublas", cublas_calls), cublas_calls))
    default_blas = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        lt_out = torch.mm(xs[0], weights[0].t())
        record("cublaslt-torch", [lambda i=i: mm(i) for i in range(LAYERS)], lambda: lt_out)
    finally:
        torch.backends.cuda.preferred_blas_library(default_blas)
    problem = lt.problem(M, N, K)

    def calls(algo):
        return [lambda i=i: lt.matmul(problem, algo, xs[i], weights[i], ys[i]) for i in range(LAYERS)]

    def once(algo):
        y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        lt.matmul(problem, algo, xs[0], weights[0], y)
        return y

    def lt_row(label, algo, **extra):
        replayed = calls(algo)
        row = record(
            label, replayed, functools.partial(once, algo), config=lt.config(algo), words=words_of(algo), **extra
        )
        again.append((row, replayed))

    heuristic = lt.algorithms(problem, count)
    for index, algo in enumerate(heuristic):
        lt_row(f"lt #{index}", algo)
    if search:
        best, candidates = search_algorithms(torch, lt, problem, heuristic, calls, *search)
        print(json.dumps({"gemm": name, "M": M, "candidates": candidates}), flush=True)
        listed = {_key(algo) for algo in heuristic}  # already rows of their own
        for index, algo in enumerate(a for a in best if _key(a) not in listed):
            lt_row(f"lt search #{index}", algo, candidates=candidates)
    if rounds:
        timing_rounds(again, rounds, lambda replayed: graphed_ms(torch, replayed) / LAYERS * 1e3)
        save()


def timing_rounds(rows_calls: list, rounds: int, timer) -> None:
    """``rounds`` more timings (``timer(calls)``, µs a call) of each timed ``(row, calls)``, round-robin:
    each round times every row once, so a change of the GPU's clocks falls on all rows alike.  A row's
    ``us`` becomes the median of all its timings, which ``us_timings`` lists; a row whose timing fails
    keeps what it had and records the ``error``."""
    timed = [(row, calls) for row, calls in rows_calls if "us" in row]
    for row, _ in timed:
        row["us_timings"] = [row["us"]]
    for _ in range(rounds):
        for row, calls in timed:
            if "error" not in row:
                try:
                    row["us_timings"].append(round(timer(calls), 2))
                except Exception as exc:  # noqa: BLE001 - a probe records what failed and goes on
                    row["error"] = failed(exc)
    for row, _ in timed:
        row["us"] = round(statistics.median(row["us_timings"]), 2)


def _key(result: HeuristicResult) -> tuple:
    return tuple(int(w) for w in result.algo)


def search_algorithms(
    torch, lt: Lt, problem, seeds: list, calls, rounds: int, keep: int, budget_s: float
) -> tuple[list[HeuristicResult], int]:
    """Beyond the heuristic's list (``seeds``): ``rounds`` of variations (each configuration attribute
    of an algorithm changed one at a time, as far as cuBLASLt accepts the change for the problem),
    each round from the ``keep`` fastest so far, every candidate timed briefly on ``calls(algo)``
    (no new one after ``budget_s``).  The ``keep`` fastest, and how many candidates were timed."""
    from benchmarks.gemm_probe import graphed_ms

    timed: dict[tuple, tuple[float, HeuristicResult]] = {}
    deadline = time.monotonic() + budget_s

    def brief(algo):
        if _key(algo) not in timed and time.monotonic() < deadline:
            try:
                timed[_key(algo)] = (graphed_ms(torch, calls(algo), min_run_time=0.03), algo)
            except Exception:  # noqa: BLE001 - an algorithm that fails to run is no candidate
                timed[_key(algo)] = (float("inf"), algo)

    def fastest():
        return [algo for _, algo in sorted(timed.values(), key=lambda t: t[0])[:keep]]

    for algo in seeds:
        brief(algo)
    tried = set()
    for round_ in range(rounds):
        if round_ == 1:  # after the heuristic's neighbours: the other algorithm ids, once
            for algo in lt.other_ids(problem, {lt.config(s).get("id") for s in seeds}):
                brief(algo)
        for seed in fastest():
            if _key(seed) not in tried:
                tried.add(_key(seed))
                for algo in lt.variations(problem, seed):
                    brief(algo)
    return fastest(), len(timed)


def words_of(result: HeuristicResult) -> list[str]:
    """The algorithm's 8 opaque words, as an algorithms file holds them."""
    return [f"0x{int(w):016x}" for w in result.algo]


def algorithms_file(result: dict, version: int, max_workspace: int | None = None) -> dict:
    """The fastest ``lt`` algorithm of each GEMM at each M, as an algorithms file: the smallest M
    bounds the rows it serves, the largest serves every M above.  With ``max_workspace`` only
    algorithms whose recorded workspace is at most that many bytes compete."""
    from laya_build.model.native_linear import ALGORITHMS_FORMAT

    def fits(row) -> bool:  # a row that does not say its workspace does not fit a limit
        needs = (row.get("config") or {}).get("workspace")
        return max_workspace is None or (needs is not None and needs <= max_workspace)

    best = {}
    for row in result["rows"]:  # an algorithm whose timing or output check failed is never chosen
        if (
            row["name"].startswith(("lt #", "lt search #"))
            and "us" in row
            and "words" in row
            and "error" not in row
            and fits(row)
        ):
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
    chosen = {} if max_workspace is None else {"max_workspace": max_workspace}
    return {
        "format": ALGORITHMS_FORMAT,
        "written_by": "benchmarks/cublaslt_probe.py",
        **chosen,
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


def write_algorithms(path: Path, algorithms: dict) -> None:
    """The algorithms file, written whole under a temporary name, then renamed."""
    from laya_build.atomic import write_text

    write_text(path, json.dumps(algorithms, indent=1) + "\n")


def write_from_rows(rows: Path, path: Path, max_workspace: int | None, version: int | None) -> int:
    """The algorithms file of an earlier run's rows (its ``--out``), with the cuBLASLt version that
    run recorded (or ``version``, for rows that do not record it); refused, naming what is missing."""
    try:
        result = json.loads(rows.read_text())
        if not isinstance(result["rows"], list):
            raise TypeError("its rows are not a list")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"--from-rows {rows}: not a probe result ({exc!r}); give the --out of a probe run", file=sys.stderr)
        return 2
    recorded = result.get("cublaslt_version")
    if recorded is not None and version is not None and int(recorded) != version:
        print(f"--from-rows {rows}: its rows were timed with cuBLASLt {recorded}, not {version}", file=sys.stderr)
        return 2
    version = recorded if recorded is not None else version
    if version is None:
        print(
            f"--from-rows {rows}: the rows do not say which cuBLASLt timed them; give --cublaslt-version",
            file=sys.stderr,
        )
        return 2
    algorithms = algorithms_file(result, int(version), max_workspace)
    if not algorithms["entries"]:
        print(f"--from-rows {rows}: no algorithm row fits (--max-workspace {max_workspace})", file=sys.stderr)
        return 2
    write_algorithms(path, algorithms)
    print(f"wrote {path}: {len(algorithms['entries'])} entries", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="the probe's rows (JSON); not with --from-rows")
    parser.add_argument("--algos", type=int, default=24)
    parser.add_argument("--workspace-mib", type=int, default=32)
    parser.add_argument("--write-algorithms", type=Path, help="the algorithms file to write (the fastest of each)")
    parser.add_argument("--library", type=Path, help="the native op library to time with those algorithms")
    parser.add_argument(
        "--max-workspace",
        type=int,
        metavar="BYTES",
        help="write only algorithms needing at most this much workspace (0: none, so no memset before the GEMM)",
    )
    parser.add_argument(
        "--from-rows",
        type=Path,
        metavar="PROBE_JSON",
        help="write the algorithms file from the rows of an earlier run's --out instead of timing (no GPU)",
    )
    parser.add_argument(
        "--cublaslt-version", type=int, help="with --from-rows: the cuBLASLt that timed rows which do not record it"
    )
    parser.add_argument(
        "--search", type=int, default=0, metavar="ROUNDS", help="rounds of variations beyond the heuristic's list"
    )
    parser.add_argument("--keep", type=int, default=4, help="the fastest candidates each search round starts from")
    parser.add_argument(
        "--search-s", type=float, default=40.0, help="seconds of brief timings a problem's search may take"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="more timings of each algorithm, round-robin over a shape's rows; its time is the median of all",
    )
    args = parser.parse_args()
    if args.library and not args.write_algorithms:
        parser.error("--library times the algorithms --write-algorithms writes: give both")
    if args.from_rows:
        if not args.write_algorithms or args.library:
            parser.error("--from-rows writes the algorithms file of stored rows: give --write-algorithms, no --library")
        return write_from_rows(args.from_rows, args.write_algorithms, args.max_workspace, args.cublaslt_version)
    if not args.out:
        parser.error("--out is required: the file the probe's rows go to")
    start = time.monotonic()

    import torch

    torch.manual_seed(0)
    torch.ones(8, 8, device="cuda", dtype=torch.bfloat16) @ torch.ones(8, 8, device="cuda", dtype=torch.bfloat16)
    lt = Lt(torch, args.workspace_mib << 20)
    result = probe_result(
        torch,
        "benchmarks/cublaslt_probe.py",
        algos=args.algos,
        workspace_mib=args.workspace_mib,
        search=args.search,
        rounds=args.rounds,
    )
    lt.lib.cublasLtGetVersion.restype = ctypes.c_size_t
    result["cublaslt_version"] = int(lt.lib.cublasLtGetVersion())  # what --from-rows writes the file with
    save = saver(result, args.out)
    algorithms = None
    search = (args.search, args.keep, args.search_s) if args.search else None
    for name, (N, K) in GEMMS.items():
        weights = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K**-0.5 for _ in range(LAYERS)]
        for M in ROWS:
            probe_shape(torch, lt, result, save, name, M, weights, args.algos, search, args.rounds)
            if args.write_algorithms:  # after every shape: a probe stopped part way leaves the shapes it timed
                algorithms = algorithms_file(result, int(lt.lib.cublasLtGetVersion()), args.max_workspace)
                write_algorithms(args.write_algorithms, algorithms)
    if algorithms is not None:
        print(f"wrote {args.write_algorithms}: {len(algorithms['entries'])} entries", flush=True)
        if args.library:
            native_rows(torch, result, save, args.library, algorithms)
    return finish(result, save, start)


if __name__ == "__main__":
    raise SystemExit(main())
