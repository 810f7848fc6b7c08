"""The native library's CUTLASS kernels against cuBLAS, cuBLASLt and Inductor's kernel, on the encoder's shapes.

    python benchmarks/native_cutlass_probe.py --out native_cutlass.json [--library liblaya_native.so]
        [--only geglu|linear|wi]

Builds the project's native op library with its CUDA kernels (``laya_build.native.build(...,
cuda_kernels=True)``: nvcc and CUTLASS's headers, ``CUTLASS_PATH`` or TileLang's copy) unless
``--library`` names one, then times the H200 configuration's GEMMs (hidden 1024, GLU 2624, bf16)
at M = 128 and 1,792 positions, the way ``benchmarks/gemm_probe.py`` does: 28 calls on 28
distinct inputs and weight matrices in one CUDA graph, µs a call = the replay's median / 28.

The MLP's first GEMM and its gated GELU (``laya_native::geglu_linear``):

- ``cublas, geglu``: the package's pair today, ``F.linear`` (cuBLAS) then Inductor's kernel for
  ``gelu(input) * gate`` (``torch.compile`` of the expression); the reference of the rows below;
- ``cublas``: the GEMM alone;
- ``cutlass #i <name>``: the op at the library's launch configuration ``i`` (the weights' rows
  interleaved), with its largest difference from the pair's output;
- ``module``: the op with the configurations an export gives it by default
  (``export.cutlass_configs.geglu``).

``pair_vs_fp32`` and ``module_vs_fp32``: each one's largest difference, at each M, from the fp32
product's gated GELU.

The output GEMMs of attention and the MLP (1,024 columns; ``laya_native::linear``), each without
and with the residual added (``+ residual``, as ``export.native_residual`` calls it):

- ``cublas``: ``F.linear`` (and the add); the reference of the rows below;
- ``cublaslt``: the op through cuBLASLt, its heuristic's algorithm;
- ``cutlass #i <name>``: the op's CUTLASS path at configuration ``i`` (stream-K and the others);
- ``module``: the configurations an export gives a ``native_cutlass`` layer by default
  (``export.cutlass_configs.linear``).

The MLP's first GEMM alone (``op`` ``wi``: 5,248 columns, the GEGLU kernel's GEMM without its gated
GELU) through the same rows as the output GEMMs, without the residual: where the GEGLU kernel's
time goes, its tiles' mainloops (the linear op's 128 x 128 and 128 x 256 tiles) without its
epilogue beside cuBLAS's GEMM. These rows suggest nothing.

``suggested_cutlass_configs``: the fastest configuration of each op at each M, as
``export.cutlass_configs`` takes it (:func:`suggest`). Results are written after each row, so a run
stopped early keeps what it measured.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemm_probe import finish, probe_result, saver, timed_row  # noqa: E402

LAYERS = 28
HIDDEN = 1024
GLU = 2624
ROWS = (128, 1792)


def library(path: Path | None, result: dict) -> Path:
    """The native library to time: ``path``, else one built here with the CUDA kernels."""
    if path is not None:
        return path
    from laya_build import native

    out = Path(tempfile.mkdtemp(prefix="native-geglu-"))
    record = native.build(out, cuda_kernels=True)
    result["library"] = {k: record[k] for k in ("sha256", "bytes", "cuda_compiler", "cutlass", "build_s")}
    return out / record["path"]


def defaults() -> dict:
    """``export.cutlass_configs`` as an export has it by default."""
    from laya_build.config.sections import section

    return section("export", None)["cutlass_configs"]


def rows_at(torch, result, save, weights, interleaved, pointwise, names, M: int) -> None:
    """The probe's rows at M positions."""
    import torch.nn.functional as F

    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    xs = [torch.randn(M, HIDDEN, **bf16) for _ in range(LAYERS)]
    ys = [torch.empty(M, 2 * GLU, **bf16) for _ in range(LAYERS)]
    head = {"op": "geglu", "M": M, "N": 2 * GLU, "K": HIDDEN}
    op = torch.ops.laya_native.geglu_linear

    def gemm(i):
        return torch.mm(xs[i], weights[i].t(), out=ys[i])

    def pair(i):
        return pointwise(gemm(i))

    reference = pair(0).clone()
    timed_row(torch, result, save, {**head, "name": "cublas"}, [lambda i=i: gemm(i) for i in range(LAYERS)], LAYERS)
    calls = [lambda i=i: pair(i) for i in range(LAYERS)]
    timed_row(torch, result, save, {**head, "name": "cublas, geglu"}, calls, LAYERS)
    for index, name in enumerate(names):
        calls = [lambda i=i, c=index: op(xs[i], interleaved[i], None, [-1, c]) for i in range(LAYERS)]
        output = lambda c=index: op(xs[0], interleaved[0], None, [-1, c])  # noqa: E731
        row = {**head, "name": f"cutlass #{index} {name}", "config": index}
        timed_row(torch, result, save, row, calls, LAYERS, output, reference, "cublas_geglu")
    configs = list(defaults()["geglu"])
    calls = [lambda i=i: op(xs[i], interleaved[i], None, configs) for i in range(LAYERS)]
    output = lambda: op(xs[0], interleaved[0], None, configs)  # noqa: E731
    timed_row(torch, result, save, {**head, "name": "module"}, calls, LAYERS, output, reference, "cublas_geglu")
    try:
        product = xs[0].float() @ weights[0].float().t()
        exact = F.gelu(product[:, :GLU]) * product[:, GLU:]
        result.setdefault("pair_vs_fp32", {})[str(M)] = float((reference.float() - exact).abs().max())
        result.setdefault("module_vs_fp32", {})[str(M)] = float((output().float() - exact).abs().max())
    except Exception as exc:  # noqa: BLE001 - a probe records what failed and goes on
        result["errors"].append(f"fp32 comparison at M={M}: {type(exc).__name__}: {exc}")
    save()


OUTPUT_GEMMS = {"attn_out": (HIDDEN, HIDDEN), "mlp_out": (HIDDEN, GLU)}  # name: (N, K)
WI = {"Wi": (2 * GLU, HIDDEN)}  # the GEMM of the GEGLU kernel, without its gated GELU


def linear_rows_at(torch, result, save, names, M: int, gemms=None, op_name="linear", residuals=(False, True)) -> None:
    """The rows of ``gemms`` (default: the output GEMMs) at M positions, each without and with the
    residual of ``residuals``, labelled ``op_name``."""
    import torch.nn.functional as F

    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    op = torch.ops.laya_native.linear
    for gemm, (n, k) in (gemms or OUTPUT_GEMMS).items():
        ws = [torch.randn(n, k, **bf16) * k**-0.5 for _ in range(LAYERS)]
        xs = [torch.randn(M, k, **bf16) for _ in range(LAYERS)]
        rs = [torch.randn(M, n, **bf16) for _ in range(LAYERS)]
        for residual in residuals:
            head = {"op": op_name, "gemm": gemm, "M": M, "N": n, "K": k, "residual": residual}
            suffix = " + residual" if residual else ""

            def ref(i, residual=residual, xs=xs, ws=ws, rs=rs):
                out = F.linear(xs[i], ws[i])
                return out + rs[i] if residual else out

            def mine(i, cutlass, residual=residual, xs=xs, ws=ws, rs=rs):
                return op(xs[i], ws[i], None, None, rs[i] if residual else None, cutlass=cutlass)

            reference = ref(0).clone()
            calls = [lambda i=i: ref(i) for i in range(LAYERS)]
            timed_row(torch, result, save, {**head, "name": "cublas" + suffix}, calls, LAYERS)
            rows = [("cublaslt", None, -1)]
            rows += [(f"cutlass #{i} {name}", [-1, i], i) for i, name in enumerate(names)]
            rows += [("module", list(defaults()["linear"]), None)]
            for name, cutlass, config in rows:
                calls = [lambda i=i, c=cutlass: mine(i, c) for i in range(LAYERS)]
                output = lambda c=cutlass: mine(0, c)  # noqa: E731
                row = {**head, "name": name + suffix, **({} if config is None else {"config": config})}
                timed_row(torch, result, save, row, calls, LAYERS, output, reference, "cublas")


SMALL = 256  # the m_max of the small row counts' group: the serving shapes of 128 rows and fewer


def suggest(rows: list[dict]) -> dict:
    """``export.cutlass_configs`` from the rows: for each op, the configuration with the least time
    at each M (for ``linear`` summed over both GEMMs, with and without the residual; -1, cuBLASLt,
    competes), as ``[SMALL, best at the smallest M, -1, best at the largest]``; an op whose rows do
    not cover every configuration at both M is left out."""
    suggested = {}
    for op in ("geglu", "linear"):
        mine = [r for r in rows if r.get("op") == op and "config" in r]
        sizes = sorted({r["M"] for r in mine})
        if len(sizes) < 2:
            continue
        best = []
        for m in (sizes[0], sizes[-1]):
            per = {}  # configuration: its rows at m (for linear: each GEMM, with and without the residual)
            for r in mine:
                if r["M"] == m:
                    per.setdefault(r["config"], []).append(r)
            full = max(len(v) for v in per.values())
            complete = {c: v for c, v in per.items() if len(v) == full and all("us" in r for r in v)}
            totals = {c: sum(r["us"] for r in v) for c, v in complete.items()}
            if not totals:
                break
            best.append(min(totals, key=totals.get))
        if len(best) == 2:
            suggested[op] = [SMALL, best[0], -1, best[1]]
    return suggested


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--library", type=Path, help="a native library built with its CUDA kernels")
    parser.add_argument("--only", choices=("geglu", "linear", "wi"), help="one op's rows only")
    args = parser.parse_args()
    start = time.monotonic()

    import torch
    import torch.nn.functional as F

    from laya_build.model import native_geglu

    torch.manual_seed(0)
    result = probe_result(torch, "benchmarks/native_cutlass_probe.py")
    save = saver(result, args.out)
    path = library(args.library, result)
    torch.ops.load_library(str(path))
    result["configs"] = {op: list(torch.ops.laya_native.cutlass_configs(op)) for op in ("geglu", "linear")}
    save()
    if args.only in (None, "geglu"):
        bf16 = {"device": "cuda", "dtype": torch.bfloat16}
        weights = [torch.randn(2 * GLU, HIDDEN, **bf16) * HIDDEN**-0.5 for _ in range(LAYERS)]
        interleaved = [native_geglu.interleave(w).contiguous() for w in weights]
        pointwise = torch.compile(lambda y: F.gelu(y[:, :GLU]) * y[:, GLU:], dynamic=False)
        for M in ROWS:
            rows_at(torch, result, save, weights, interleaved, pointwise, result["configs"]["geglu"], M)
        del weights, interleaved
    if args.only in (None, "linear"):
        for M in ROWS:
            linear_rows_at(torch, result, save, result["configs"]["linear"], M)
    if args.only in (None, "wi"):
        for M in ROWS:
            linear_rows_at(torch, result, save, result["configs"]["linear"], M, WI, "wi", (False,))
    result["suggested_cutlass_configs"] = suggest(result["rows"])
    return finish(result, save, start)


if __name__ == "__main__":
    raise SystemExit(main())
