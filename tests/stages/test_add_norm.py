"""The residual add and its layer norm as one op (laya_build.model.add_norm, export.add_norms).

The Triton kernel runs here in Triton's interpreter (numpy on the CPU) against the torch ops it
replaces, at every launch configuration, on row counts that are not multiples of its rows a
program and widths that are not powers of two; on a GPU the same compiled.  The graph rewrite
is checked on small programs (which norms it takes, the same outputs bit for bit on the CPU),
and a project with ``export.add_norms`` is built, packaged and verified end to end.
"""

from __future__ import annotations

import os
import sys
import textwrap

import pytest
import torch

from laya_build.errors import ConfigError

sys.path.insert(0, os.path.dirname(__file__))
from test_rotary_attention import interpreted  # noqa: E402  (the same interpreter run)

an = pytest.importorskip("laya_build.model.add_norm", reason="Triton does not import here")

INTERPRETED = textwrap.dedent(
    """
    import json, sys, torch
    from laya_build.model import add_norm as an
    torch.manual_seed(0)
    worst = {}
    for dtype in (torch.float32, torch.bfloat16):
        for rows, n in ((1, 64), (7, 96), (70, 64), (9, 1024)):
            a = (torch.randn(rows, n) * 3 + 1).to(dtype)
            b = torch.randn(rows, n).to(dtype)
            for affine in ("none", "weight", "weight and bias"):
                w = torch.randn(n).to(dtype) if affine != "none" else None
                bias = torch.randn(n).to(dtype) if affine == "weight and bias" else None
                want_sum, want = an.reference(a, b, w, bias, 1e-5)
                for config in json.loads(sys.argv[1]):
                    # outputs a row longer than the inputs: the row past them must stay untouched
                    s = torch.full((rows + 1, n), float("nan"), dtype=dtype)
                    y = torch.full((rows + 1, n), float("nan"), dtype=dtype)
                    an.launch(a, b, w, bias, 1e-5, s, y, config)
                    assert s[rows:].isnan().all() and y[rows:].isnan().all(), "a row past the inputs was written"
                    key = f"{dtype} {rows}x{n} {affine} {config['ROWS']}x{config['num_warps']}"
                    # the sum: the interpreter rounds fp32 to bf16 toward zero, the GPU to nearest
                    scale = want_sum.float().abs().clamp_min(1e-30)
                    worst[key + " sum"] = ((s[:rows].float() - want_sum.float()).abs() / scale).max().item()
                    worst[key + " norm"] = (y[:rows].float() - want.float()).abs().max().item()
    print(json.dumps(worst))
    """
)


def test_the_kernel_in_triton_s_interpreter_is_the_reference():
    configs = [{"ROWS": 1, "num_warps": 1}, {"ROWS": 2, "num_warps": 2}, {"ROWS": 8, "num_warps": 4}]
    configs += [{k: c[k] for k in ("ROWS", "num_warps")} for c in an.CONFIGS]
    configs = [c for i, c in enumerate(configs) if c not in configs[:i]]  # the committed ones, once
    worst = interpreted(INTERPRETED, configs)
    assert len(worst) == 2 * 4 * 3 * len(configs) * 2
    for key, err in worst.items():
        fp32 = "float32" in key
        if key.endswith("sum"):
            limit = 0 if fp32 else 2**-7  # bf16: one unit in the last place, rounded the other way
        else:
            limit = 2e-5 if fp32 else 0.1  # bf16: the sum's last place, times up to |w| / std
        assert err <= limit, f"{key}: {err}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton kernel compiled needs a CUDA GPU")
def test_the_kernel_on_cuda_is_the_reference():
    torch.manual_seed(0)
    w = torch.randn(1024, device="cuda").to(torch.bfloat16)
    for rows in (1, 128, 513, 1792):
        a, b = (torch.randn(rows, 1024, device="cuda").to(torch.bfloat16) for _ in range(2))
        got_sum, got = torch.ops.laya.add_norm(a, b, w, None, 1e-5)
        want_sum, want = an.reference(a, b, w, None, 1e-5)
        assert torch.equal(got_sum, want_sum)  # the eager add's rounding, bit for bit
        assert (got.float() - want.float()).abs().max().item() <= 0.0625
        for config in an.CONFIGS:
            s, y = torch.empty_like(a), torch.empty_like(a)
            an.launch(a, b, w, None, 1e-5, s, y, config)
            assert torch.equal(s, want_sum) and torch.equal(y, got) or (y.float() - want.float()).abs().max() <= 0.0625


def test_a_row_count_selects_one_configuration_and_a_symbolic_count_adds_no_guard():
    """The configuration with the largest ``min_rows`` the row count reaches runs, alone; with the
    row count symbolic (as AOTInductor compiles the op for every token count) the choice is an
    expression of it and adds no guard."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    assert an.CONFIGS[0]["min_rows"] == 0
    assert [c["min_rows"] for c in an.CONFIGS] == sorted({c["min_rows"] for c in an.CONFIGS})

    def chosen(rows):
        uses = [use for _, use in an.selection(rows)]
        assert sorted(uses) == [0] * (len(uses) - 1) + [1], (rows, uses)
        return an.CONFIGS[uses.index(1)]

    for rows in (1, 2, 127, 128, 511, 512, 513, 1792, 100000):
        want = [c for c in an.CONFIGS if rows >= c["min_rows"]][-1]
        assert chosen(rows) is want, rows
    env = ShapeEnv()
    symbol = env.create_symbol(1792, ConstantSource("rows"), dynamic_dim=DimDynamic.DYNAMIC)
    rows = env.create_symintnode(symbol, hint=1792)
    uses = [use for _, use in an.selection(rows)]
    assert not env.guards
    for n in (1, 16, 511, 512, 4096):
        values = [int(u) if isinstance(u, int) else int(u.node.expr.subs({symbol: n})) for u in uses]
        assert an.CONFIGS[values.index(1)] is chosen(n) and sum(values) == 1


def test_a_configuration_not_selected_launches_no_program_and_no_float_is_a_runtime_argument():
    """Each configuration is launched with its grid times its use (0: no program); the epsilon is
    a compile-time constant, since AOTInductor passes a Python float to a user's kernel as fp64."""
    launched = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append((grid, args, kwargs))

    a = torch.zeros(600, 64)
    for config, use in an.selection(600):
        an.launch(a, a, None, None, 1e-6, a, a, config, use, Recorder())
    grids = {kw["ROWS"]: grid for grid, _, kw in launched}
    assert grids == {c["ROWS"]: (-(-600 // c["ROWS"]) * (c is an.CONFIGS[-1]),) for c in an.CONFIGS}
    for _, args, kwargs in launched:
        assert not [x for x in args if isinstance(x, float)]
        assert kwargs["EPS"] == 1e-6 and kwargs["N"] == 64 and kwargs["BLOCK_N"] == 64
        assert kwargs["HAS_WEIGHT"] is False and kwargs["HAS_BIAS"] is False
    names = an._add_norm_kernel.arg_names
    assert {names.index(k) for k in ("EPS", "N", "BLOCK_N", "ROWS", "HAS_WEIGHT", "HAS_BIAS")} <= set(
        an._add_norm_kernel.constexprs
    )


def test_mismatched_operands_are_refused_by_name():
    a = torch.zeros(4, 8)
    with pytest.raises(RuntimeError, match="two tensors of one shape"):
        torch.ops.laya.add_norm(a, torch.zeros(4, 1), None, None, 1e-5)
    with pytest.raises(RuntimeError, match="two tensors of one dtype"):
        torch.ops.laya.add_norm(a, a.double(), None, None, 1e-5)
    with pytest.raises(RuntimeError, match=r"weight must be \[8\]"):
        torch.ops.laya.add_norm(a, a, torch.ones(4), None, 1e-5)


class Program(torch.nn.Module):
    def __init__(self, body):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))
        self.norm = torch.nn.LayerNorm(8, bias=False)
        self.affine = torch.nn.LayerNorm(8)
        self.body = body

    def forward(self, x):
        return self.body(self, x)


F = torch.nn.functional
BODIES = {
    # a residual stream: the sum read by the norm and by the next add
    "stream": (2, lambda m, x: (lambda s: m.affine(s + m.norm(s) @ m.w))(x + x @ m.w)),
    "the sum read by the norm alone": (1, lambda m, x: m.norm(x + x @ m.w)),
    "bias": (1, lambda m, x: (lambda s: (s, m.affine(s)))(x @ m.w + x)),
    "broadcast": (0, lambda m, x: m.norm(x + x[:, :1])),
    "scaled": (0, lambda m, x: m.norm(torch.add(x, x @ m.w, alpha=2))),
    "a scalar": (0, lambda m, x: m.norm(x + 1.0)),
    "operands of two dtypes": (0, lambda m, x: F.layer_norm(x.double() + x @ m.w, (8,)).float()),
    "two dims": (0, lambda m, x: F.layer_norm(x + x @ m.w, x.shape[-2:])),
    "no add": (0, lambda m, x: m.norm(x @ m.w)),
}


@pytest.mark.parametrize("name", list(BODIES))
def test_the_rewrite_takes_exactly_the_norms_of_a_plain_add_with_the_same_outputs(name):
    from torch.export import Dim

    expected, body = BODIES[name]
    torch.manual_seed(0)
    model = Program(body).eval()
    x = torch.randn(2, 32, 8)
    with torch.no_grad():
        model.affine.weight.normal_()
        model.affine.bias.normal_()
        ep = torch.export.export(model, (x,), dynamic_shapes=({1: 16 * Dim("t", min=1, max=8)},))
    want = ep.module()(x)
    norms = lambda: sum(n.target is torch.ops.aten.layer_norm.default for n in ep.graph.nodes)  # noqa: E731
    before = norms()
    assert an.take_norms(ep) == expected
    calls = [n for n in ep.graph.nodes if n.target is torch.ops.laya.add_norm.default]
    assert len(calls) == expected and norms() == before - expected
    assert not [n for n in ep.graph.nodes if an._norm_of_add(n) is not None]
    got = ep.module()(x)
    leaves = torch.utils._pytree.tree_leaves
    assert all(torch.equal(a, b) for a, b in zip(leaves(got), leaves(want), strict=True))
    for longer in (torch.randn(2, 128, 8), torch.randn(2, 16, 8)):  # other lengths of the dynamic axis
        assert all(torch.isfinite(t).all() for t in leaves(ep.module()(longer)))


def _conds(ep):
    return [n for n in ep.graph.nodes if n.target is torch.ops.higher_order.cond]


def _exported(name, tokens=32):
    from torch.export import Dim

    torch.manual_seed(0)
    model = Program(BODIES[name][1]).eval()
    with torch.no_grad():
        model.affine.weight.normal_()
        model.affine.bias.normal_()
        ep = torch.export.export(
            model, (torch.randn(2, tokens, 8),), dynamic_shapes=({1: 16 * Dim("t", min=1, max=8)},)
        )
    return model, ep


@pytest.mark.parametrize("name", ["stream", "bias"])
def test_with_a_least_row_count_each_norm_is_a_cond_on_the_size_with_the_op_above_and_the_norm_below(name, tmp_path):
    """``take_norms(ep, min_rows)``: each norm of an add becomes a ``torch.cond`` on the product of
    the dimensions but the last reaching ``min_rows``; its one branch calls the op, the other adds and
    normalises as before. The program gives the eager model's outputs at sizes on both sides of the
    bound, also saved, loaded and compiled by AOTInductor (the branch chosen from the call's sizes)."""
    from laya_build.stages.children.package import restore_symbol_hints

    expected = BODIES[name][0]
    model, ep = _exported(name)
    assert an.take_norms(ep, min_rows=64) == expected
    conds = _conds(ep)
    assert len(conds) == expected
    assert not [n for n in ep.graph.nodes if n.target is torch.ops.laya.add_norm.default]
    for cond in conds:
        reach, above, below = cond.args[:3]
        assert reach.target.__name__ == "ge" and reach.args[1] == 64
        targets = lambda attr: [n.target for n in getattr(ep.graph_module, attr.target).graph.nodes]  # noqa: E731
        assert torch.ops.laya.add_norm.default in targets(above)
        assert torch.ops.aten.add.Tensor in targets(below) and torch.ops.aten.layer_norm.default in targets(below)
        assert torch.ops.laya.add_norm.default not in targets(below)
    leaves = torch.utils._pytree.tree_leaves
    same = lambda got, want: all(torch.equal(a, b) for a, b in zip(leaves(got), leaves(want), strict=True))  # noqa: E731
    sizes = [torch.randn(2, t, 8) for t in (16, 32, 128)]  # 32 and 64 positions: both sides of 64
    with torch.no_grad():
        for x in sizes:
            assert same(ep.module()(x), model(x)), x.shape
        torch.export.save(ep, tmp_path / "exported.pt2")
        loaded = torch.export.load(tmp_path / "exported.pt2")
        restore_symbol_hints(loaded)
        path = torch._inductor.aoti_compile_and_package(loaded, package_path=str(tmp_path / "package.pt2"))
        package = torch._inductor.aoti_load_package(path)
        for x in sizes:
            got, want = leaves(package(x)), leaves(model(x))
            assert max((a - b).abs().max().item() for a, b in zip(got, want, strict=True)) < 1e-5, x.shape


def test_a_static_size_below_the_least_row_count_keeps_its_norm_and_one_above_takes_the_op_unconditionally():
    for tokens, min_rows, calls in ((32, 65, 0), (32, 64, 2)):
        ep = torch.export.export(Program(BODIES["stream"][1]).eval(), (torch.randn(2, tokens, 8),))
        assert an.take_norms(ep, min_rows=min_rows) == calls
        assert not _conds(ep)
        assert len([n for n in ep.graph.nodes if n.target is torch.ops.laya.add_norm.default]) == calls


def test_an_export_with_nothing_to_take_is_refused_with_what_to_do():
    from laya_build.stages.export import taken_norms

    ep = torch.export.export(Program(BODIES["no add"][1]).eval(), (torch.randn(2, 32, 8),))
    assert taken_norms(ep, {"add_norms": {"cpu": False}}, "cpu") == {}
    with pytest.raises(ConfigError, match="export.add_norms.cpu is true and no layer norm") as e:
        taken_norms(ep, {"add_norms": {"cpu": True}, "native_residual": {}}, "cpu")
    assert "set export.add_norms.cpu to false" in e.value.hint
    with pytest.raises(ConfigError) as e:
        taken_norms(ep, {"add_norms": {"cpu": True}, "native_residual": {"cpu": True}}, "cpu")
    assert "export.native_residual.cpu" in e.value.hint


def test_the_probe_takes_a_list_of_configurations_and_refuses_anything_else_with_the_form():
    from benchmarks.norm_probe import DEFAULT_CONFIGS, name, parse_configs

    assert parse_configs(None) == DEFAULT_CONFIGS and {c["ROWS"] for c in DEFAULT_CONFIGS} == {1, 2, 4, 8}
    assert all(c["ROWS"] * 1024 // (c["num_warps"] * 32) >= 4 for c in DEFAULT_CONFIGS)  # 4 elements a thread
    assert parse_configs('[{"ROWS": 4, "num_warps": 8}]') == [{"ROWS": 4, "num_warps": 8}]
    assert name({"ROWS": 4, "num_warps": 8}) == "add_norm 4x8"
    for text in ("[", "[]", "{}", '[{"ROWS": 3, "num_warps": 4}]', '[{"ROWS": 4}]', '[{"ROWS": true, "num_warps": 4}]'):
        with pytest.raises(SystemExit) as e:
            parse_configs(text)
        assert "ROWS and num_warps powers of two" in str(e.value), text
