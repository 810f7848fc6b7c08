"""``export.zero_bias``: the encoder layers' named linear layers get a zero bias (an ``addmm``, which
torch runs through cuBLASLt on CUDA); the model's outputs stay those without it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from laya_build.model import linear_bias

sys.path.insert(0, str(Path(__file__).parent))
from test_varlen_attention import batch, exported, small_model  # noqa: E402  (the same small model)

pytestmark = pytest.mark.filterwarnings("ignore")


def test_zero_biases_change_no_output_and_export_as_addmm():
    model = small_model().to(torch.bfloat16)
    args = batch()
    with torch.no_grad():
        expected = model(*args)
        linear_bias.use(model, ["mlp.Wo", "attn.Wqkv"])
        got = model(*args)
    for layer in model.encoder.layers:
        for name in ("mlp.Wo", "attn.Wqkv"):
            linear = layer.get_submodule(name)
            bias = linear.bias
            assert bias is not None and not bias.any() and not bias.requires_grad
            assert (bias.dtype, bias.device, bias.shape) == (
                torch.bfloat16,
                linear.weight.device,
                linear.weight.shape[:1],
            )
        assert layer.mlp.Wi.bias is None and layer.attn.Wo.bias is None
    for e, g in zip(expected, got):
        assert torch.equal(g, e)  # x + 0 is x: a zero bias changes no bit of the CPU's results
    program = exported(model).run_decompositions()
    biases = [n.args[0].name for n in program.graph.nodes if n.target is torch.ops.aten.addmm.default]
    encoder = sorted(b for b in biases if b.startswith("p_encoder_layers_"))  # (the head's have biases of their own)
    layers = range(len(model.encoder.layers))
    assert encoder == sorted(
        [f"p_encoder_layers_{i}_mlp_wo_bias" for i in layers] + [f"p_encoder_layers_{i}_attn_wqkv_bias" for i in layers]
    )


def test_an_unknown_layer_or_one_with_a_bias_is_refused_with_what_to_do():
    with pytest.raises(
        ValueError, match=r"export.zero_bias 'mlp.Wout' is not one of attn.Wqkv, attn.Wo, mlp.Wi, mlp.Wo"
    ):
        linear_bias.use(small_model().to(torch.bfloat16), ["mlp.Wout"])
    model = small_model(mlp_bias=True).to(torch.bfloat16)
    with pytest.raises(
        ValueError, match=r"export.zero_bias mlp.Wo: this model's mlp.Wo has a bias of its own; leave it out"
    ):
        linear_bias.use(model, ["mlp.Wo"])


def test_a_float32_export_is_refused_with_what_to_do():
    with pytest.raises(
        ValueError, match=r"bf16 or fp16 exports only \(this one is float32.*leave export.zero_bias.cuda empty"
    ):
        linear_bias.use(small_model(), ["mlp.Wo"])


def test_nothing_named_changes_nothing():
    model = small_model()
    linear_bias.use(model, [])
    assert all(layer.mlp.Wo.bias is None for layer in model.encoder.layers)
