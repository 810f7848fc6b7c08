"""``export.padded_linears``: the named linear layers multiply inputs and weights padded with zero
columns to a multiple of 8, with the same parameters and the GEMM's outputs up to rounding."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from laya_build.model import padded_linear

sys.path.insert(0, str(Path(__file__).parent))
from test_fused_linear import GEMM_OPS, gemms  # noqa: E402
from test_varlen_attention import batch, exported, small_model  # noqa: E402  (the same small model)

pytestmark = pytest.mark.filterwarnings("ignore")


def gemm_widths(program) -> dict[str, tuple[int, ...]]:
    """Each constant or weight an exported program multiplies by a GEMM, with its shape."""
    seen = {}
    for node in program.graph.nodes:
        if node.target in GEMM_OPS:
            for arg in node.args:
                if getattr(arg, "op", None) == "placeholder" and "weight" in arg.name:
                    seen[arg.name] = tuple(arg.meta["val"].shape)
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_padded_layer_gives_the_gemm_outputs_and_exports_an_aligned_gemm(dtype):
    model = small_model().to(dtype)
    args = batch()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    before = gemm_widths(exported(model))
    assert before["p_act_head_0_weight"] == (256, 68)  # hidden 64 + 4 features: no multiple of 8
    with torch.no_grad():
        expected = model(*args)
        padded_linear.use(model, ["act_head.0"])
        got = model(*args)
    assert isinstance(model.act_head[0], padded_linear.PaddedLinear)
    assert model.state_dict().keys() == state.keys()  # the checkpoint's parameters, no new entry
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    atol = 1e-5 if dtype == torch.float32 else 0.05
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g.float(), e.float(), atol=atol, rtol=0)
    after = gemm_widths(exported(model))
    assert "p_act_head_0_weight" not in after
    padded = {name: shape for name, shape in after.items() if name not in before}
    assert list(padded.values()) == [(256, 72)]  # the padded weight, 68 rounded up to 72
    assert {k: v for k, v in after.items() if k in before} == {
        k: v for k, v in before.items() if k != "p_act_head_0_weight"
    }
    assert sum(gemms(exported(model)).values()) == sum(gemms(exported(small_model().to(dtype))).values())  # one for one


def test_the_padded_weight_is_the_weight_and_zeros():
    torch.manual_seed(5)
    linear = torch.nn.Linear(13, 6)
    layer = padded_linear.PaddedLinear(linear)
    assert layer.weight is linear.weight and layer.bias is linear.bias and layer.pad == 3
    assert torch.equal(layer.padded_weight[:, :13], linear.weight.detach())
    assert torch.equal(layer.padded_weight[:, 13:], torch.zeros(6, 3))
    x = torch.randn(2, 5, 13)
    torch.testing.assert_close(layer(x), linear(x), atol=1e-6, rtol=0)
    assert "padded_weight" not in layer.state_dict()


def test_a_layer_it_cannot_pad_is_refused_with_the_reason():
    model = small_model()
    with pytest.raises(ValueError, match=r"'head.layers.0.linear1' is not a linear layer .*; name one of scorer.1, "):
        padded_linear.use(model, ["act_head.0", "head.layers.0.linear1"])
    with pytest.raises(ValueError, match=r"'scorer.1' takes 64 inputs, already a multiple of 8: .* leave it out"):
        padded_linear.use(model, ["scorer.1"])
    with pytest.raises(ValueError, match=r"'act_head.0' is also in export.fused_linears: .* not both"):
        padded_linear.use(model, ["act_head.0"], fused=["scorer.3", "act_head.0"])
    assert isinstance(model.act_head[0], torch.nn.Linear)  # nothing replaced before a refusal
    padded_linear.use(model, [])
    assert not any(isinstance(m, padded_linear.PaddedLinear) for m in model.modules())
