"""Encoder linear layers through the project's own op (``export.native_linears``), with chosen cuBLASLt algorithms.

``laya_native::linear`` (laya_build/native/laya_native.cpp) computes what ``F.linear`` computes:
on the CPU with ``at::linear`` itself, on CUDA (bf16, fp16) with one ``cublasLtMatmul`` whose
algorithm the export names for the layer's shape.  cuBLAS, which a package's GEMMs go to,
picks its kernel by its own heuristic; on the H200 the best of the algorithms cuBLASLt offers
for each of an encoder layer's four GEMMs was 1.4 µs a layer faster at 128 positions and
1.5 µs at 1,792, each with cuBLAS's output bit for bit (``benchmarks/cublaslt_probe.py``,
docs/measurements/runtime-h200.md, "cuBLASLt's algorithms for the encoder's GEMMs").

The algorithms come from a file (``export.native_algorithms.<target>-<dtype>``, format
:data:`ALGORITHMS_FORMAT`, written by ``benchmarks/cublaslt_probe.py --write-algorithms`` on the
GPU they are for): per GEMM problem (N, K, dtype, bias) and row count bound ``m_max`` (None: any
row count), cuBLASLt's opaque ``cublasLtMatmulAlgo_t``, its 8 words in hex, and the cuBLASLt
version they were chosen with.  Each layer's op call holds its shape's entries and that version
as a constant (:func:`algorithm_argument`), so the package's bytes follow from the export and
that file; a problem without an entry, or a process with another cuBLASLt (whose words may name
other kernels), runs cuBLASLt's heuristic's first algorithm.  A package calls the op through
torch's dispatcher: its library ships beside it (:mod:`laya_build.native`).
"""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import torch

from laya_build.errors import ConfigError
from laya_build.model.linear_bias import HALF_DTYPES, LINEARS

ALGORITHMS_FORMAT = "laya-build cublaslt algorithms 1"
WORDS = 8  # a cublasLtMatmulAlgo_t: 8 opaque 64-bit words
_WORD = re.compile(r"^0x[0-9a-f]{16}$")
_FAKE = []  # the fake implementation, registered once a process


def register_fake() -> None:
    """The output shapes of the library's ops under tracing (``torch.export``, Inductor):
    ``linear`` and ``geglu_linear`` (laya_build/model/native_geglu.py); once a process, after the
    library that defines them is loaded."""
    if _FAKE:
        return

    @torch.library.register_fake("laya_native::linear")
    def linear(x, weight, bias, algorithm, residual=None, cutlass=None):
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @torch.library.register_fake("laya_native::geglu_linear")
    def geglu_linear(x, weight, bias, configs, counts=None):  # the interleaved rows: two a column of the output
        return x.new_empty((*x.shape[:-1], weight.shape[0] // 2))

    _FAKE.extend((linear, geglu_linear))


def read_algorithms(path, key: str) -> list[dict]:
    """The entries of an algorithms file, checked; ``key`` names the setting that named it."""
    path = Path(path)
    where = f"{key}: {path}"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist", hint=_WRITE_HINT) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{where} is not a JSON file ({exc})", hint=_WRITE_HINT) from None
    if not isinstance(doc, dict) or doc.get("format") != ALGORITHMS_FORMAT:
        raise ConfigError(f"{where}: format is not {ALGORITHMS_FORMAT!r}", hint=_WRITE_HINT)
    version = doc.get("cublaslt_version")
    if not (isinstance(version, int) and not isinstance(version, bool) and version > 0):
        raise ConfigError(f"{where}: needs cublaslt_version, the cuBLASLt version it was chosen with", hint=_WRITE_HINT)
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: entries must be a list", hint=_WRITE_HINT)
    for i, entry in enumerate(entries):
        if problem := _entry_problem(entry):
            raise ConfigError(f"{where}: entries[{i}] {problem}", hint=_WRITE_HINT)
    return [{**e, "cublaslt_version": version} for e in entries]


_WRITE_HINT = "write the file with `python benchmarks/cublaslt_probe.py --write-algorithms FILE` on the GPU it is for"


def _entry_problem(entry) -> str | None:
    if not isinstance(entry, dict):
        return "is not an object"
    for name in ("n", "k"):
        if not (isinstance(entry.get(name), int) and not isinstance(entry[name], bool) and entry[name] > 0):
            return f"needs {name}, a positive integer"
    if entry.get("dtype") not in ("bfloat16", "float16"):
        return "needs dtype bfloat16 or float16"
    if not isinstance(entry.get("bias"), bool):
        return "needs bias, true or false"
    m_max = entry.get("m_max")
    if m_max is not None and not (isinstance(m_max, int) and not isinstance(m_max, bool) and m_max > 0):
        return "has an m_max that is neither a positive integer nor null"
    words = entry.get("algorithm")
    if not (isinstance(words, list) and len(words) == WORDS and all(_WORD.match(str(w)) for w in words)):
        return f"needs algorithm, {WORDS} words as 0x and 16 lower-case hex digits"
    return None


def _signed(word: str) -> int:
    value = int(word, 16)
    return value - (1 << 64) if value >= 1 << 63 else value


def algorithm_argument(entries: list[dict], n: int, k: int, dtype: str, bias: bool) -> list[int]:
    """The op's ``algorithm`` for a layer of weight ``[n, k]``: the cuBLASLt version the entries
    were chosen with, then ``[m_max, 8 words]`` for each entry of that problem, the smallest bound
    first and the unbounded one (-1) last, the words as signed 64-bit integers (their bits);
    ``[]`` when no entry is for it (the heuristic's choice)."""
    mine = [e for e in entries if (e["n"], e["k"], e["dtype"], e["bias"]) == (n, k, dtype, bias)]
    if not mine:
        return []
    mine.sort(key=lambda e: (e["m_max"] is None, e["m_max"] or 0))
    bounds = [e["m_max"] for e in mine]
    if len(set(bounds)) != len(bounds):
        raise ConfigError(f"export.native_algorithms: two entries for N={n} K={k} {dtype} at the same m_max {bounds}")
    groups = [v for e in mine for v in (-1 if e["m_max"] is None else e["m_max"], *map(_signed, e["algorithm"]))]
    return [mine[0]["cublaslt_version"], *groups]


def check(model: torch.nn.Module, names: list[str]) -> None:
    """``names`` are linear layers of :data:`LINEARS` and the model's dtype and device can run them
    through the op (ValueError otherwise): checked before the library is built."""
    unknown = [n for n in names if n not in LINEARS]
    if unknown:
        raise ValueError(f"export.native_linears {unknown[0]!r} is not one of {', '.join(LINEARS)}")
    weight = model.encoder.embeddings.tok_embeddings.weight
    if names and weight.is_cuda and weight.dtype not in HALF_DTYPES:
        raise ValueError(
            f"export.native_linears runs bf16 or fp16 GEMMs on CUDA (this export is "
            f"{str(weight.dtype).removeprefix('torch.')}): leave export.native_linears.cuda empty for it"
        )


def check_bfloat16(model: torch.nn.Module, what: str, instead: str) -> None:
    """The native library's CUTLASS kernels are bf16: ValueError, saying ``what`` and what to do
    ``instead``, for a model of another dtype."""
    dtype = model.encoder.embeddings.tok_embeddings.weight.dtype
    if dtype != torch.bfloat16:
        raise ValueError(f"{what} bfloat16 and this export is {str(dtype).removeprefix('torch.')}: {instead}")


def check_cutlass(
    model: torch.nn.Module, names: list[str], cutlass: list[str], target: str, zero_bias: list[str] = ()
) -> None:
    """``cutlass`` (``export.native_cutlass.<target>``) are native layers (of ``names``) the CUTLASS
    kernels can run on ``target``: bf16 on CUDA, without a bias of the model's or of ``zero_bias``
    (ValueError otherwise); checked before the library is built."""
    if not cutlass:
        return
    outside = [n for n in cutlass if n not in names]
    if outside:
        raise ValueError(
            f"export.native_cutlass.{target} names {outside[0]!r}, which export.native_linears.{target} does not: "
            f"the CUTLASS GEMM is a path of the native op; name the layer in both, or in neither"
        )
    if target != "cuda":
        return
    check_bfloat16(model, "export.native_cutlass's kernels are", "leave export.native_cutlass.cuda empty for it")
    with_bias = [
        n
        for n in cutlass
        if n in zero_bias or any(layer.get_submodule(n).bias is not None for layer in model.encoder.layers)
    ]
    if with_bias:
        raise ValueError(
            f"export.native_cutlass's kernels add no bias and {with_bias[0]} has one (the model's, or "
            f"export.zero_bias's): drop it from export.native_cutlass.cuda or from export.zero_bias.cuda"
        )


def use(
    model: torch.nn.Module, names: list[str], entries: list[dict], cutlass: list[str] = (), configs: list[int] = ()
) -> int:
    """Run every encoder layer's linear layers ``names`` (of :data:`LINEARS`) through
    ``laya_native::linear`` with the algorithms ``entries`` hold for their shapes, and the layers
    ``cutlass`` with the CUTLASS launch configurations ``configs`` as well (``[m_max,
    configuration]`` groups, ``export.cutlass_configs.linear``); how many layers got named
    algorithms (the others run cuBLASLt's heuristic's choice).  The op's library must be loaded
    (:func:`laya_build.runtime.serving.load_library`)."""
    check(model, names)
    if not names:
        return 0
    register_fake()
    dtype_name = str(model.encoder.embeddings.tok_embeddings.weight.dtype).removeprefix("torch.")
    named = 0
    for layer in model.encoder.layers:
        for name in names:
            linear = layer.get_submodule(name)
            n, k = linear.weight.shape
            linear.laya_algorithm = algorithm_argument(entries, n, k, dtype_name, linear.bias is not None)
            linear.laya_cutlass = list(configs) if name in cutlass else None
            linear.forward = types.MethodType(_forward, linear)
            named += bool(linear.laya_algorithm)
    return named


def _forward(self, x: torch.Tensor) -> torch.Tensor:
    # None, not []: AOTInductor's call of a custom op passes an empty int list on as None
    if self.laya_cutlass is None:  # the call as before the CUTLASS path: the same exported program
        return torch.ops.laya_native.linear(x, self.weight, self.bias, self.laya_algorithm or None)
    algorithm = self.laya_algorithm or None
    return torch.ops.laya_native.linear(x, self.weight, self.bias, algorithm, cutlass=self.laya_cutlass)


def take_residuals(ep) -> int:
    """Move each add of a tensor to a native linear's output into the op, as its ``residual``,
    in the exported program ``ep`` (its graph changed in place); how many adds moved.

    An add moves when it is the output's only reader, adds without a scale (``alpha`` 1) and the
    other tensor has the output's shape, dtype and device: the add of the residual stream that
    ends an encoder layer's attention and MLP branches (``hidden_states + Wo(...)``).  On CUDA
    the op then adds it in the GEMM's epilogue, and the layer norm after it reads the new stream
    instead of summing it again from two tensors (``export.native_residual``)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    op = torch.ops.laya_native.linear.default
    names = [a.name for a in op._schema.arguments]  # x, weight, bias, algorithm, residual, cutlass
    graph = ep.graph_module.graph
    moved = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not op or len(node.users) != 1:
            continue
        # the tracer passes the residual by position (None) when a later argument is given
        given = {**dict(zip(names, node.args)), **node.kwargs}
        if given.get("residual") is not None or len(node.args) < 4:
            continue
        (add,) = node.users
        if add.target is not torch.ops.aten.add.Tensor or len(add.args) != 2 or add.kwargs.get("alpha", 1) != 1:
            continue
        other = add.args[1] if add.args[0] is node else add.args[0]
        if not isinstance(other, torch.fx.Node) or other is node:
            continue
        mine, theirs = node.meta.get("val"), other.meta.get("val")
        if not (isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor)):
            continue
        if (theirs.dtype, theirs.device) != (mine.dtype, mine.device):
            continue
        if theirs.dim() != mine.dim() or not all(
            statically_known_true(a == b) for a, b in zip(theirs.shape, mine.shape)
        ):
            continue
        later = {k: v for k, v in given.items() if k in names[4:] and v is not None}
        with graph.inserting_before(add):  # the add's operands are all defined by here
            taken = graph.call_function(op, tuple(node.args[:4]), {**later, "residual": other})
        taken.meta = {**node.meta, "val": add.meta["val"]}
        add.replace_all_uses_with(taken)
        graph.erase_node(add)
        graph.erase_node(node)
        moved += 1
    if moved:
        graph.lint()
        ep.graph_module.recompile()
    return moved
