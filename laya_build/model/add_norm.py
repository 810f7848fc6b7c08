"""The residual add and the layer norm after it as one Triton kernel (``export.add_norms``).

An encoder layer of the decision model ends each branch with ``x = x + branch(...)`` and starts
the next with ``layer_norm(x)``.  Inductor fuses the two into one persistent reduction, one row
a program, at one launch configuration for every row count of the dynamic token axis.
``laya::add_norm`` computes the same two tensors (the sum, rounded to the dtype as the eager add
rounds it, and the norm of that sum in fp32, rounded) with a launch configuration chosen by the
row count (:data:`CONFIGS`): a few rows a program where there are many rows.  In the exported
program :func:`take_norms` replaces each ``add`` whose sum a ``layer_norm`` reads with one call.
AOTInductor compiles the kernel into the package, as the attention kernel's
(:mod:`laya_build.model.rotary_attention`); on the CPU the op computes with torch ops.
"""

from __future__ import annotations

import operator

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

# Launch configurations, fewest rows first: a call runs the last one whose ``min_rows`` its row
# count reaches (benchmarks/norm_probe.py times them; docs/measurements/runtime-h200.md).
CONFIGS = (
    {"ROWS": 1, "num_warps": 4, "min_rows": 0},
    {"ROWS": 4, "num_warps": 4, "min_rows": 512},
)
MAX_N = 16384  # the widest row the kernel holds in registers at once


@triton.jit
def _add_norm_kernel(
    A,
    B,
    W,
    BIAS,
    SUM,
    OUT,
    n_rows,
    EPS: tl.constexpr,
    N: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ok = (rows < n_rows)[:, None] & col_ok[None, :]
    at = rows.to(tl.int64)[:, None] * N + cols[None, :]
    a = tl.load(A + at, mask=ok, other=0.0)
    b = tl.load(B + at, mask=ok, other=0.0)
    s = (a.to(tl.float32) + b.to(tl.float32)).to(SUM.dtype.element_ty)  # the eager add's rounding
    tl.store(SUM + at, s, mask=ok)
    x = s.to(tl.float32)
    mean = tl.sum(x, axis=1) / N
    centred = tl.where(ok, x - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(centred * centred, axis=1) / N + EPS)
    y = centred * rstd[:, None]
    if HAS_WEIGHT:
        y = y * tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        y = y + tl.load(BIAS + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(OUT + at, y.to(OUT.dtype.element_ty), mask=ok)


def reaches(rows, min_rows: int):
    """1 where ``rows`` is at least ``min_rows``, else 0; with a symbolic ``rows`` a symbolic size
    (``Min``/``Max``), so choosing adds no guard to the exported program."""
    return torch.sym_min(1, torch.sym_max(0, rows - (min_rows - 1)))


def selection(rows) -> list[tuple[dict, object]]:
    """``(config, use)`` for each of :data:`CONFIGS`: ``use`` is 1 for the last configuration whose
    ``min_rows`` ``rows`` reaches, 0 for the others."""
    uses = [reaches(rows, c["min_rows"]) if c["min_rows"] > 0 else 1 for c in CONFIGS]
    return [(c, use - (uses[i + 1] if i + 1 < len(uses) else 0)) for i, (c, use) in enumerate(zip(CONFIGS, uses))]


def launch(a, b, weight, bias, eps: float, out_sum, out, config: dict, use=1, kernel=None) -> None:
    """Run the kernel at ``config`` (``ROWS``, ``num_warps``) over ``a``, ``b`` (``[..., N]``,
    contiguous) into ``out_sum`` and ``out``; ``use`` multiplies the grid (0: no program)."""
    kernel = kernel if kernel is not None else _add_norm_kernel
    n = a.shape[-1]
    rows = a.numel() // n
    kernel[(triton.cdiv(rows, config["ROWS"]) * use,)](
        a,
        b,
        weight if weight is not None else a,  # (not read without one)
        bias if bias is not None else a,
        out_sum,
        out,
        rows,
        EPS=eps,  # a constant: AOTInductor would pass a float argument as fp64
        N=n,
        BLOCK_N=triton.next_power_of_2(n),
        ROWS=config["ROWS"],
        HAS_WEIGHT=weight is not None,
        HAS_BIAS=bias is not None,
        num_warps=config["num_warps"],
    )


def reference(a, b, weight, bias, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """What the op computes, in torch ops: the eager model's add and layer norm."""
    s = a + b
    return s, torch.nn.functional.layer_norm(s, (a.shape[-1],), weight, bias, eps)


def check(a, b, weight, bias) -> None:
    torch._check(a.shape == b.shape, lambda: f"add_norm needs two tensors of one shape, got {a.shape} and {b.shape}")
    torch._check(a.dtype == b.dtype, lambda: f"add_norm needs two tensors of one dtype, got {a.dtype} and {b.dtype}")
    n = a.shape[-1]
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            torch._check(
                p.dim() == 1 and p.shape[0] == n,
                lambda name=name, p=p: f"add_norm's {name} must be [{n}], got {p.shape}",
            )


@triton_op("laya::add_norm", mutates_args={})
def add_norm(
    a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``a + b`` and ``layer_norm(a + b)`` over the last dimension (``weight``, ``bias`` optional),
    both of ``a``'s shape and dtype."""
    check(a, b, weight, bias)
    if a.device.type != "cuda" or a.shape[-1] > MAX_N:
        return reference(a, b, weight, bias, eps)
    a, b = a.contiguous(), b.contiguous()
    out_sum, out = torch.empty_like(a), torch.empty_like(a)
    for config, use in selection(a.numel() // a.shape[-1]):
        if isinstance(use, int) and use == 0:
            continue
        launch(a, b, weight, bias, eps, out_sum, out, config, use, wrap_triton(_add_norm_kernel))
    return out_sum, out


def _norm_of_add(node):
    """The ``add`` node whose sum the ``layer_norm`` node ``node`` normalises over its last
    dimension, when that add is of two tensors of one shape and dtype (else None)."""
    if node.op != "call_function" or node.target is not torch.ops.aten.layer_norm.default:
        return None
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    x = node.args[0]
    if not (isinstance(x, torch.fx.Node) and x.target is torch.ops.aten.add.Tensor):
        return None
    if len(x.args) != 2 or x.kwargs.get("alpha", 1) != 1 or not all(isinstance(t, torch.fx.Node) for t in x.args):
        return None
    vals = [t.meta.get("val") for t in x.args]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return None
    (p, q), shape = vals, node.args[1]
    if (p.dtype, p.device) != (q.dtype, q.device) or p.dim() != q.dim() or len(shape) != 1:
        return None
    if not all(statically_known_true(i == j) for i, j in zip(p.shape, q.shape)):
        return None
    if not statically_known_true(p.shape[-1] == shape[0]):
        return None
    return x


def take_norms(ep) -> int:
    """Replace each ``layer_norm(a + b)`` over the last dimension in the exported program ``ep``
    (its graph changed in place) by one ``laya::add_norm`` call, whose sum also takes the add's
    other readers (the residual stream); how many calls there are now."""
    graph = ep.graph_module.graph
    taken = 0
    for node in list(graph.nodes):
        add = _norm_of_add(node)
        if add is None:
            continue
        args = list(node.args) + [None] * (5 - len(node.args))
        weight, bias, eps = args[2], args[3], args[4] if args[4] is not None else 1e-5
        with graph.inserting_before(add):  # every operand is defined by here, every reader after
            call = graph.call_function(torch.ops.laya.add_norm.default, (*add.args, weight, bias, float(eps)))
            total = graph.call_function(operator.getitem, (call, 0))
            normed = graph.call_function(operator.getitem, (call, 1))
        call.meta = {**node.meta, "val": (add.meta["val"], node.meta["val"])}
        total.meta = {**add.meta}
        normed.meta = {**node.meta}
        node.replace_all_uses_with(normed)
        add.replace_all_uses_with(total)
        graph.erase_node(node)
        graph.erase_node(add)
        taken += 1
    if taken:
        graph.lint()
        ep.graph_module.recompile()
    return taken
