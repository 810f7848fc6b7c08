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

Launch configurations the library does not hold yet (``--candidates``): the GEGLU rows of a library
built from a copy of the CUDA source whose table of GEGLU configurations is replaced by the
candidates (:func:`candidate_source`), each a line such as ``cooperative 128x192x64 cluster 2x1
raster M swizzle 2 stages 4`` (schedule, tile, then optional cluster, the persistent scheduler's
raster order M or N and swizzle, and the mainloop's stages; leaving one out keeps the library's
default). Name the library's own configurations among them to time them side by side. Their
indices are the candidates', so this mode has no ``module`` row and suggests nothing.
``--rounds`` repeats the rows, interleaved, so that a difference can be told from the machine's
noise.
"""

from __future__ import annotations

import argparse
import re
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


CANDIDATE = re.compile(
    r"^(?P<schedule>cooperative|pingpong) (?P<m>\d+)x(?P<n>\d+)x(?P<k>\d+)"
    r"(?: cluster (?P<cm>[124])x(?P<cn>[124]))?(?: raster (?P<raster>[MN]))?(?: swizzle (?P<swizzle>[1248]))?"
    r"(?: stages (?P<stages>\d+))?$"
)
TABLE = ("// laya-geglu-table: begin", "// laya-geglu-table: end")
PARTS = ("// laya-geglu-parts: begin", "// laya-geglu-parts: end")


def parse_candidate(line: str) -> dict:
    """One ``--candidates`` line as its fields, or a ``ValueError`` that shows the form."""
    found = CANDIDATE.match(" ".join(line.split()))
    if found is None:
        raise ValueError(
            f"{line!r} is not a launch configuration: write e.g. 'cooperative 128x192x64 cluster 2x1 raster M "
            "swizzle 2 stages 4' (cluster, raster, swizzle and stages optional, in that order)"
        )
    spec = found.groupdict()
    return {
        "schedule": spec["schedule"],
        "tile": (int(spec["m"]), int(spec["n"]), int(spec["k"])),
        "cluster": (int(spec["cm"] or 1), int(spec["cn"] or 1)),
        "raster": spec["raster"],
        "swizzle": int(spec["swizzle"] or 1),
        "stages": int(spec["stages"] or 0),
    }


def candidate_name(spec: dict) -> str:
    """The name a candidate gets in the library's table (the committed names' form, then the rest)."""
    (m, n, k), (cm, cn) = spec["tile"], spec["cluster"]
    name = f"{spec['schedule']} {m}x{n}x{k} cluster {cm}x{cn}"
    if spec["raster"]:
        name += f" raster {spec['raster']}"
    if spec["swizzle"] != 1:
        name += f" swizzle {spec['swizzle']}"
    if spec["stages"]:
        name += f" stages {spec['stages']}"
    return name


def _between(text: str, marks: tuple[str, str], body: str) -> str:
    start, end = text.index(marks[0]), text.index(marks[1])
    line_end = text.index("\n", start) + 1
    return text[:line_end] + body + text[end:]


def candidate_source(text: str, specs: list[dict]) -> str:
    """The CUDA source ``text`` with its GEGLU configurations replaced by ``specs``: their table and
    names, and the parts they compile in, one part a kernel (candidates that differ only in the
    order of tiles share theirs), after the linear op's two."""
    lines, kernels = [], {}
    for i, spec in enumerate(specs):
        m, n, k = spec["tile"]
        schedule = {"cooperative": "Cooperative", "pingpong": "Pingpong"}[spec["schedule"]]
        raster = {None: "Heuristic", "M": "AlongM", "N": "AlongN"}[spec["raster"]]
        cm, cn = spec["cluster"]
        lines.append(
            f"using Config{i} = Kernel<Shape<_{m}, _{n}, _{k}>, Shape<_{cm}, _{cn}, _1>, "
            f"{schedule}, Raster::{raster}, {spec['swizzle']}, {spec['stages']}>;"
        )
        key = (spec["schedule"], spec["tile"], spec["cluster"], spec["stages"])
        kernels.setdefault(key, []).append(i)
    configs = ", ".join(f"Config{i}" for i in range(len(specs)))
    names = "".join(f'    "{candidate_name(spec)}",\n' for spec in specs)
    table = (
        "\n".join(lines)
        + f"\nusing GegluConfigs = std::tuple<{configs}>;\nconstexpr int kConfigs = std::tuple_size_v<GegluConfigs>;\n"
        + f"const char* const kConfigNames[kConfigs] = {{\n{names}}};\n"
    )
    parts = 2 + len(kernels)
    body = [f"#define LAYA_PARTS {parts}"]
    body.append("#define LAYA_PART_0(X) X(run_linear<Linear0>, LINEAR) X(run_linear<Linear0Residual>, LINEAR)")
    body.append("#define LAYA_PART_1(X) X(run_linear<Linear1>, LINEAR) X(run_linear<Linear1Residual>, LINEAR)")
    for p, members in enumerate(kernels.values(), start=2):
        body.append(f"#define LAYA_PART_{p}(X) " + " ".join(f"X(run<Config{i}>, GEGLU)" for i in members))
    body += ["", "#if !defined(LAYA_PART)", "#elif LAYA_PART == 0", "LAYA_PART_0(LAYA_DEFINE)"]
    body += [f"LAYA_PART_{p}(LAYA_DECLARE)" for p in range(1, parts)]
    for p in range(1, parts):
        body += [f"#elif LAYA_PART == {p}", f"LAYA_PART_{p}(LAYA_DEFINE)"]
    body += ["#else", '#error "LAYA_PART names no part of the kernels (0 to LAYA_PARTS - 1)"', "#endif", ""]
    return _between(_between(text, TABLE, table), PARTS, "\n".join(body))


def candidate_library(specs: list[dict], result: dict) -> Path:
    """A native library whose GEGLU configurations are the candidates ``specs`` (:func:`parse_candidate`),
    built here."""
    from laya_build import native

    work = Path(tempfile.mkdtemp(prefix="native-candidates-"))
    source = work / native.CUDA_SOURCE.name
    source.write_text(candidate_source(native.CUDA_SOURCE.read_text(), specs))
    result["candidates"] = [candidate_name(spec) for spec in specs]
    native.CUDA_SOURCE = source  # the build reads its source through this name
    return library(None, result)


def defaults() -> dict:
    """``export.cutlass_configs`` as an export has it by default."""
    from laya_build.config.sections import section

    return section("export", None)["cutlass_configs"]


def rows_at(torch, result, save, weights, interleaved, pointwise, names, M: int, module: bool = True) -> None:
    """The probe's rows at M positions (``module``: with the row of the export's default configurations)."""
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
    output = lambda: op(xs[0], interleaved[0], None, configs)  # noqa: E731
    if module:
        calls = [lambda i=i: op(xs[i], interleaved[i], None, configs) for i in range(LAYERS)]
        timed_row(torch, result, save, {**head, "name": "module"}, calls, LAYERS, output, reference, "cublas_geglu")
    try:
        product = xs[0].float() @ weights[0].float().t()
        exact = F.gelu(product[:, :GLU]) * product[:, GLU:]
        result.setdefault("pair_vs_fp32", {})[str(M)] = float((reference.float() - exact).abs().max())
        if module:  # (the export's configurations index the library's own table, not the candidates')
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
    parser.add_argument("--candidates", type=Path, help="a file of GEGLU launch configurations, one a line")
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS), help="the row counts (M) to time")
    parser.add_argument("--rounds", type=int, default=1, help="times each row is timed, interleaved")
    args = parser.parse_args()
    if args.candidates is not None:
        lines = [line for line in args.candidates.read_text().splitlines() if line.strip()]
        if not lines:
            parser.error(f"{args.candidates} names no launch configuration (one a line)")
        try:
            specs = [parse_candidate(line) for line in lines]
        except ValueError as exc:
            parser.error(f"{args.candidates}: {exc}")
        if args.library is not None or args.only not in (None, "geglu"):
            parser.error("--candidates builds its own library and times the GEGLU rows only")
    start = time.monotonic()

    import torch
    import torch.nn.functional as F

    from laya_build.model import native_geglu

    torch.manual_seed(0)
    result = probe_result(torch, "benchmarks/native_cutlass_probe.py")
    save = saver(result, args.out)
    path = library(args.library, result) if args.candidates is None else candidate_library(specs, result)
    torch.ops.load_library(str(path))
    result["configs"] = {op: list(torch.ops.laya_native.cutlass_configs(op)) for op in ("geglu", "linear")}
    save()
    if args.only in (None, "geglu"):
        bf16 = {"device": "cuda", "dtype": torch.bfloat16}
        weights = [torch.randn(2 * GLU, HIDDEN, **bf16) * HIDDEN**-0.5 for _ in range(LAYERS)]
        interleaved = [native_geglu.interleave(w).contiguous() for w in weights]
        pointwise = torch.compile(lambda y: F.gelu(y[:, :GLU]) * y[:, GLU:], dynamic=False)
        names = result["configs"]["geglu"]
        for _ in range(args.rounds):
            for M in args.rows:
                rows_at(torch, result, save, weights, interleaved, pointwise, names, M, args.candidates is None)
        del weights, interleaved
        if args.candidates is not None:
            return finish(result, save, start)
    if args.only in (None, "linear"):
        for M in args.rows:
            linear_rows_at(torch, result, save, result["configs"]["linear"], M)
    if args.only in (None, "wi"):
        for M in args.rows:
            linear_rows_at(torch, result, save, result["configs"]["linear"], M, WI, "wi", (False,))
    result["suggested_cutlass_configs"] = suggest(result["rows"])
    return finish(result, save, start)


if __name__ == "__main__":
    raise SystemExit(main())
