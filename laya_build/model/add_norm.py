"""The residual add and the layer norm after it as one Triton kernel (``export.add_norms``).

An encoder layer of the decision model ends each branch with ``x = x + branch(...)`` and starts
the next with ``layer_norm(x)``.  Inductor fuses the two into one persistent reduction, one row
a program, at one launch configuration for every row count of the dynamic token axis.
``laya::add_norm`` computes the same two tensors (the sum, rounded to the dtype as the eager add
rounds it, and the norm of that sum in fp32, rounded) with a launch configuration chosen by the
row count (:data:`CONFIGS`).  In the exported program :func:`take_norms` replaces each ``add``
whose sum a ``layer_norm`` reads with one call; with a least row count, with a ``torch.cond`` on the
row count that runs the call from that many rows on and the add and norm as they were below it, so
that Inductor's own fused kernel still serves the small shapes.
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
# count reaches (benchmarks/norm_probe.py times them; docs/measurements/runtime-h200.md, "The
# decision head's tail timed, and the add-and-norm op from 512 positions on": on the H200 one row a
# program with one warp was the fastest of 16 configurations at 128 rows and even with the fastest
# at 1,792).
CONFIGS = ({"ROWS": 1, "num_warps": 1, "min_rows": 0},)
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


def _branch(params, vals, body) -> torch.fx.GraphModule:
    """A ``torch.cond`` branch: a graph of placeholders ``params`` (names, their values ``vals``)
    whose output is ``body(graph, *placeholders)`` (a pair of nodes)."""
    graph = torch.fx.Graph()
    args = []
    for name, val in zip(params, vals, strict=True):
        args.append(graph.placeholder(name))
        args[-1].meta["val"] = val
    graph.output(tuple(body(graph, *args)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _valued(node, val):
    node.meta["val"] = val
    return node


def rows_of(x) -> object:
    """The product of the dimensions of the node ``x``'s value but the last: an int, or a symbolic
    size of the program's dynamic dimensions."""
    val, rows = x.meta["val"], 1
    for size in val.shape[:-1]:
        rows = rows * size
    return rows


def _rows_reach(graph, x, min_rows: int):
    """Nodes (inserted at the graph's insertion point) for ``rows_of(x) >= min_rows``: a symbolic
    boolean of the program's sizes."""
    val = x.meta["val"]
    rows = None
    for dim in range(val.dim() - 1):
        size = graph.call_function(torch.ops.aten.sym_size.int, (x, dim))
        size.meta["val"] = val.shape[dim]
        if rows is not None:
            size = graph.call_function(operator.mul, (rows, size))
            size.meta["val"] = rows.meta["val"] * val.shape[dim]
        rows = size
    reach = graph.call_function(operator.ge, (rows, min_rows))
    reach.meta["val"] = rows.meta["val"] >= min_rows
    return reach


def _conditional(ep, graph, node, add, weight, bias, eps: float, min_rows: int):
    """A ``torch.cond`` node on ``rows >= min_rows`` whose true branch calls the op and whose false
    branch is ``add`` and the norm ``node`` as they were; its two outputs are the sum and the norm."""
    given = [(name, t) for name, t in (("weight", weight), ("bias", bias)) if t is not None]
    operands = [*add.args] + [t for _, t in given]
    params = ["a", "b"] + [name for name, _ in given]

    def named(args):  # weight and bias: a placeholder, or None as in the norm
        names = dict(zip(params, args))
        return names["a"], names["b"], names.get("weight"), names.get("bias")

    total_val, normed_val = add.meta["val"], node.meta["val"]

    def op_call(g, *args):
        a, b, w, bi = named(args)
        call = _valued(g.call_function(torch.ops.laya.add_norm.default, (a, b, w, bi, eps)), (total_val, normed_val))
        return (_valued(g.call_function(operator.getitem, (call, i)), v) for i, v in enumerate((total_val, normed_val)))

    def as_before(g, *args):
        a, b, w, bi = named(args)
        total = _valued(g.call_function(torch.ops.aten.add.Tensor, (a, b)), total_val)
        normed = g.call_function(torch.ops.aten.layer_norm.default, (total, node.args[1], w, bi, *node.args[4:]))
        return total, _valued(normed, normed_val)

    owner = ep.graph_module
    names = []
    vals = [t.meta["val"] for t in operands]
    for kind, body in (("true", op_call), ("false", as_before)):
        index = 0
        while hasattr(owner, f"laya_add_norm_{kind}_{index}"):
            index += 1
        names.append(f"laya_add_norm_{kind}_{index}")
        owner.register_module(names[-1], _branch(params, vals, body))
    reach = _rows_reach(graph, add.args[0], min_rows)
    branches = [graph.get_attr(name) for name in names]
    return graph.call_function(torch.ops.higher_order.cond, (reach, *branches, tuple(operands)))


def _rename_outputs(ep, names: dict) -> None:
    """The program's output specs renamed from the replaced nodes' names to their replacements'."""
    for spec in ep.graph_signature.output_specs:
        name = getattr(spec.arg, "name", None)
        if name in names:
            spec.arg.name = names[name]


def take_norms(ep, min_rows: int = 0) -> int:
    """Replace each ``layer_norm(a + b)`` over the last dimension in the exported program ``ep``
    (its graph changed in place) by one ``laya::add_norm`` call, whose sum also takes the add's
    other readers (the residual stream); how many calls there are now.  With ``min_rows`` the call
    runs only where the product of the operands' dimensions but the last reaches it: a
    ``torch.cond`` on that size, the add and the norm as they were in its other branch (a size
    known when the program runs: AOTInductor decides it on the host, and a captured graph holds
    the branch of its shape)."""
    graph = ep.graph_module.graph
    taken = 0
    for node in list(graph.nodes):
        add = _norm_of_add(node)
        if add is None:
            continue
        args = list(node.args) + [None] * (5 - len(node.args))
        weight, bias, eps = args[2], args[3], args[4] if args[4] is not None else 1e-5
        rows = rows_of(add.args[0])
        if isinstance(rows, int) and rows < min_rows:
            continue  # a static size below the least: the add and norm stay
        with graph.inserting_before(add):  # every operand is defined by here, every reader after
            if min_rows > 0 and not isinstance(rows, int):
                call = _conditional(ep, graph, node, add, weight, bias, float(eps), min_rows)
            else:
                call = graph.call_function(torch.ops.laya.add_norm.default, (*add.args, weight, bias, float(eps)))
            total = graph.call_function(operator.getitem, (call, 0))
            normed = graph.call_function(operator.getitem, (call, 1))
        call.meta = {**node.meta, "val": (add.meta["val"], node.meta["val"])}
        total.meta = {**add.meta}
        normed.meta = {**node.meta}
        node.replace_all_uses_with(normed)
        add.replace_all_uses_with(total)
        _rename_outputs(ep, {node.name: normed.name, add.name: total.name})
        graph.erase_node(node)
        graph.erase_node(add)
        taken += 1
    if taken:
        graph.lint()
        ep.graph_module.recompile()
    return taken
