"""The decision head as an export runs it (laya_build.model.head): its attention through the packed
kernel (export.attention fused) and its last layer at the read positions only
(export.last_head_layer: read).

Both must give upstream's outputs (the model's own forward, layer by layer) up to rounding: on rows
of several lengths, with masked marker slots, marker positions anywhere in the row (the first
included), one and two head layers; the exported program must compute the last layer's queries
and feed-forward at ``1 + slots`` positions a row, with rows, tokens and slots dynamic.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from laya_build.model import attention, head

pytestmark = pytest.mark.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(__file__))
from test_varlen_attention import small_model  # noqa: E402  (the same small model)


def model_with(head_layers: int):
    model = small_model()
    if head_layers != 1:
        layers = [model.head.layers[0]] + [
            type(model.head.layers[0])(64, 1, 256, batch_first=True, norm_first=True) for _ in range(head_layers - 1)
        ]
        model.head.layers = torch.nn.ModuleList(layers)
        model.head.num_layers = head_layers
    return model.eval()


def inputs(lengths=(48, 30, 17), width=48, slots=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    rows = len(lengths)
    ids = torch.randint(3, 300, (rows, width), generator=g)
    mask = torch.zeros(rows, width, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    positions = torch.stack([torch.randint(0, n, (slots,), generator=g) for n in lengths])
    positions[0, 0] = 0  # a marker on the class position itself
    marker_mask = torch.ones(rows, slots, dtype=torch.long)
    marker_mask[-1, -1] = 0  # a masked slot, its position -1 as the tokenizer pads it
    positions[-1, -1] = -1
    return ids, mask, positions, marker_mask, torch.arange(rows) % 3


def close(got, expected, atol=2e-5):
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        torch.testing.assert_close(g, e, atol=atol, rtol=1e-5)


@pytest.mark.parametrize("head_layers", [1, 2])
@pytest.mark.parametrize("encoder", ["sdpa", "fused"])
@pytest.mark.parametrize("last_layer", ["all", "read"])
def test_every_way_of_running_the_head_gives_upstream_s_outputs(head_layers, encoder, last_layer, monkeypatch):
    from laya_build.model import rotary_attention

    model = model_with(head_layers)
    args = inputs()
    with torch.no_grad():
        expected = model(*args)
        attention.use(model, encoder)
        head.use(model, encoder, last_layer)
        seen = []
        real = rotary_attention.reference
        monkeypatch.setattr(rotary_attention, "reference", lambda *a: (seen.append(a[1] is None), real(*a))[1])
        got = model(*args)
    close(got, expected)
    if encoder == "fused":  # every head layer ran the packed op, without rotary, after the encoder's 4
        assert seen == [False] * 4 + [True] * head_layers
    else:
        assert seen == []


def test_read_runs_the_last_layer_past_its_attention_at_the_read_positions_only():
    model = model_with(2)
    shapes = []
    for layer in model.head.layers:
        layer.linear1.register_forward_hook(lambda m, i, o: shapes.append(tuple(i[0].shape)))
    args = inputs(slots=3)
    head.use(model, "sdpa", "read")
    with torch.no_grad():
        model(*args)
    assert shapes == [(3, 48, 64), (3, 1 + 3, 64)]  # the first layer everywhere, the last at 1 + slots


def test_read_exports_with_dynamic_rows_tokens_and_slots():
    from torch.export import Dim

    model = model_with(2)
    attention.use(model, "fused")
    head.use(model, "fused", "read")
    rows, tokens, slots = Dim("rows", min=1, max=4), 16 * Dim("tokens16", min=2, max=8), Dim("slots", min=2, max=8)
    shapes = {
        "input_ids": {0: rows, 1: tokens},
        "attention_mask": {0: rows, 1: tokens},
        "marker_pos": {0: rows, 1: slots},
        "marker_mask": {0: rows, 1: slots},
        "qtype": {0: rows},
    }
    with torch.inference_mode():
        program = torch.export.export(model, inputs(slots=3), dynamic_shapes=shapes)
    packed = [n for n in program.graph.nodes if n.target is torch.ops.laya.packed_attention.default]
    gathered = [n for n in program.graph.nodes if n.target is torch.ops.laya.gathered_attention.default]
    assert len(packed) == 1 and len(gathered) == 1  # the last layer's queries at 1 + slots positions a row
    assert str(gathered[0].meta["val"].shape[1]) == str(
        [n for n in program.graph.nodes if n.name == "marker_pos"][0].meta["val"].shape[1] + 1
    )
    sdpa = [n for n in program.graph.nodes if n.target is torch.ops.aten.scaled_dot_product_attention.default]
    assert sdpa == []  # no cuDNN call left in the model
    # the feed-forward's hidden width is 256: the first layer's at every token, the last's at 1 + slots
    hidden = [
        n.meta["val"].shape
        for n in program.graph.nodes
        if n.op == "call_function"
        and len(getattr(n.meta.get("val"), "shape", ())) == 3
        and n.meta["val"].shape[-1] == 256
    ]
    widths = {str(s[1]) for s in hidden}
    slot_sym = [n for n in program.graph.nodes if n.name == "marker_pos"][0].meta["val"].shape[1]
    token_sym = [n for n in program.graph.nodes if n.name == "input_ids"][0].meta["val"].shape[1]
    assert widths == {str(token_sym), str(slot_sym + 1)}
    reference = model_with(2)
    for other in (inputs((32, 9), width=32, slots=5, seed=2), inputs((64,), width=64, slots=2, seed=3)):
        with torch.inference_mode():
            close(program.module()(*other), reference(*other))


def test_bad_choices_are_refused_with_the_key():
    with pytest.raises(ValueError, match=r"export.last_head_layer 'markers' is not one of all, read"):
        head.use(model_with(1), "sdpa", "markers")
    model = model_with(1)
    model.head.layers[0].norm_first = False
    with pytest.raises(ValueError, match="norm_first"):
        head.use(model, "sdpa", "read")


def test_a_model_without_head_layers_is_left_as_it_is():
    model = model_with(1)
    model.head = None
    before = model.run_head
    assert head.use(model, "fused", "read") is None
    assert model.run_head == before


def test_use_says_how_the_head_s_attention_runs():
    assert head.use(model_with(1), "fused", "all") == "fused"
    assert head.use(model_with(1), "bias", "read") == "sdpa"
    model = model_with(1)
    before = model.run_head
    assert head.use(model, "sdpa", "all") == "sdpa" and model.run_head == before  # upstream's loop


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA model: torch.cuda.is_available() is False")
def test_a_cuda_head_the_kernel_cannot_take_keeps_its_own_attention():
    """An encoder of heads of 32 (the kernel takes it) and a head of one 96-wide attention head
    (it does not): the encoder runs the kernel, the head its own attention, the outputs upstream's."""
    model = small_model(hidden_size=96, num_attention_heads=3).cuda().to(torch.bfloat16)
    args = [t.cuda() for t in inputs()]
    with torch.no_grad():
        expected = model(*args)
        attention.use(model, "fused")
        assert head.use(model, "fused", "read") == "sdpa"
        got = model(*args)
    close(got, expected, atol=0.1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("attn, last_layer", [("sdpa", "read"), ("fused", "all"), ("fused", "read")])
def test_relu_epilogue_computes_the_feed_forward_s_relu_with_its_first_gemm(dtype, attn, last_layer):
    """With ``relu_epilogue`` every head layer's feed-forward runs its first GEMM and ReLU as one
    ``aten._addmm_activation`` (cuBLASLt's epilogue on CUDA), with the same outputs; without it the
    exported program keeps the linear and the relu."""
    args = inputs()

    def run(epilogue: bool):
        model = model_with(2).to(dtype)
        attention.use(model, attn)
        head.use(model, attn, last_layer, relu_epilogue=epilogue)
        with torch.inference_mode():
            return model(*args), torch.export.export(model, args)

    def count(program, op):
        return sum(1 for n in program.graph.nodes if n.target is op)

    expected, plain = run(False)
    got, program = run(True)
    for g, e in zip(got, expected):
        assert torch.equal(g, e)  # bias, ReLU and rounding in one order either way on the CPU
    assert count(plain, torch.ops.aten._addmm_activation.default) == 0
    assert count(program, torch.ops.aten._addmm_activation.default) == 2  # both head layers'
    assert count(program, torch.ops.aten.relu.default) == count(plain, torch.ops.aten.relu.default) - 2
    layer = model_with(1).head.layers[0]
    h = torch.randn(3, 4, 64)
    with torch.no_grad():
        assert torch.equal(head.feed_forward(layer, h), layer._ff_block(h))
        layer.activation_relu_or_gelu, layer.activation = 2, torch.nn.functional.gelu
        assert torch.equal(head.feed_forward(layer, h), layer._ff_block(h))  # a GELU layer: upstream's


def test_relu_epilogue_needs_the_head_run_as_written_out():
    with pytest.raises(
        ValueError, match="export.relu_epilogue runs .* export.attention fused or export.last_head_layer read"
    ):
        head.use(model_with(2), "sdpa", "all", relu_epilogue=True)
