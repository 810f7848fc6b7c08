"""``export.fused_linears``: the named linear layers become a product and a sum (no GEMM in the
exported program for them), with the same parameters and the outputs of the GEMM up to rounding."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from laya_build.model import fused_linear

sys.path.insert(0, str(Path(__file__).parent))
from test_varlen_attention import batch, exported, small_model  # noqa: E402  (the same small model)

pytestmark = pytest.mark.filterwarnings("ignore")

NAMES = ["scorer.3", "act_head.0", "act_head.2"]
GEMM_OPS = (torch.ops.aten.linear.default, torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


def gemms(program) -> dict[str, int]:
    """Each weight an exported program multiplies by a GEMM (a linear, mm or addmm node), counted."""
    seen: dict[str, int] = {}
    for node in program.graph.nodes:
        if node.target in GEMM_OPS:
            for arg in node.args:
                if getattr(arg, "op", None) == "placeholder" and arg.name.endswith("weight"):
                    seen[arg.name] = seen.get(arg.name, 0) + 1
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_layers_give_the_gemm_outputs_and_export_without_a_gemm(dtype):
    model = small_model().to(dtype)
    args = batch()
    before = gemms(exported(model))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        expected = model(*args)
        fused_linear.use(model, NAMES)
        got = model(*args)
    assert model.state_dict().keys() == state.keys()  # the same parameters under the same names
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    for name in NAMES:
        assert isinstance(model.get_submodule(name), fused_linear.FusedLinear)
    atol = 1e-5 if dtype == torch.float32 else 0.05
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g.float(), e.float(), atol=atol, rtol=0)
    after = gemms(exported(model))
    fused = {f"p_{name.replace('.', '_')}_weight" for name in NAMES}
    assert fused <= before.keys() and not fused & after.keys()  # exactly the named layers' GEMMs are gone
    assert after == {k: v for k, v in before.items() if k not in fused}


def test_a_layer_of_the_sum_is_the_layer():
    torch.manual_seed(3)
    linear = torch.nn.Linear(37, 5)
    x = torch.randn(4, 6, 37)
    fused = fused_linear.FusedLinear(linear)
    assert fused.weight is linear.weight and fused.bias is linear.bias
    torch.testing.assert_close(fused(x), linear(x), atol=1e-5, rtol=0)
    linear.bias = None
    torch.testing.assert_close(fused_linear.FusedLinear(linear)(x), x @ linear.weight.T, atol=1e-5, rtol=0)


def test_a_name_it_cannot_fuse_is_refused_with_the_names_it_takes():
    model = small_model()
    assert fused_linear.candidates(model) == ["scorer.1", "scorer.3", "act_head.0", "act_head.2"]
    takes = "name one of scorer.1, scorer.3, act_head.0, act_head.2"
    for name in (
        "act_head.1",
        "encoder.layers.0.mlp.Wo",
        "head.layers.0.linear1",
        "head.layers.0.self_attn.out_proj",
        "nope",
    ):
        with pytest.raises(ValueError, match=rf"export.fused_linears {name!r} is not a linear layer .*; {takes}"):
            fused_linear.use(model, ["act_head.0", name])
        assert isinstance(model.act_head[0], torch.nn.Linear)  # nothing replaced before the refusal


def test_nothing_named_changes_nothing():
    model = small_model()
    fused_linear.use(model, [])
    assert not any(isinstance(m, fused_linear.FusedLinear) for m in model.modules())
