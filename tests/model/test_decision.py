"""The decision model's dtype rule and forward contract."""

from __future__ import annotations

import pytest
import torch

from laya_build.model.decision import ENTROPY_FLOOR, eval_copy, top_two


def _capture_act_input(model):
    seen = {}

    def hook(module, args):
        seen["input"] = args[0]

    handle = model.act_head[0].register_forward_pre_hook(hook)
    return seen, handle


def _run(model, inputs, index=2):
    batch = inputs["batches"][index]
    with torch.inference_mode():
        return model(*(batch[k] for k in inputs["arg_names"])), batch


def test_explicit_bf16_casts_act_input_and_keeps_fp32_scores(checkpoint, inputs):
    model = eval_copy(checkpoint[0], torch.bfloat16)
    seen, handle = _capture_act_input(model)
    try:
        (decision, act), batch = _run(model, inputs)  # no "mat1 and mat2 must have the same dtype"
    finally:
        handle.remove()
    assert seen["input"].dtype == torch.bfloat16
    assert decision.dtype == torch.float32 and act.dtype == torch.bfloat16
    # The confidence features come from an fp32 softmax of the fp32 decision logits.
    probs = torch.softmax(decision, -1)
    top = probs.topk(2, -1).values
    k = batch["marker_mask"].sum(-1).clamp(min=2).float()
    entropy = -(probs * probs.clamp_min(ENTROPY_FLOOR).log()).sum(-1)
    expected = torch.stack([top[:, 0], top[:, 0] - top[:, 1], entropy / k.log(), k / 255], -1)
    d = model.encoder.config.hidden_size
    assert torch.equal(seen["input"][:, d:], expected.to(torch.bfloat16))


def test_fp32_weights_keep_fp32(checkpoint, inputs):
    model = checkpoint[0]
    seen, handle = _capture_act_input(model)
    try:
        (decision, act), _ = _run(model, inputs)
    finally:
        handle.remove()
    assert seen["input"].dtype == torch.float32 and act.dtype == torch.float32


def test_autocast_leaves_the_cast_to_autocast(checkpoint, inputs):
    model = checkpoint[0]  # fp32 weights
    seen, handle = _capture_act_input(model)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            (decision, act), _ = _run(model, inputs)
    finally:
        handle.remove()
    assert seen["input"].dtype == torch.float32  # not cast by the model
    assert act.dtype == torch.bfloat16  # autocast's own cast in the Linear
    assert decision.dtype == torch.float32


def test_mixed_weights_under_autocast(checkpoint, inputs):
    model = eval_copy(checkpoint[0], torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (decision, act), _ = _run(model, inputs)
    assert decision.dtype == torch.float32 and act.dtype == torch.bfloat16


def test_single_slot_branch(checkpoint, inputs):
    model = checkpoint[0]
    batch = inputs["single_slot_batches"][0]
    seen, handle = _capture_act_input(model)
    try:
        with torch.inference_mode():
            decision, act = model(*(batch[k] for k in inputs["arg_names"]))
    finally:
        handle.remove()
    assert decision.shape == (2, 1)
    d = model.encoder.config.hidden_size
    feats = seen["input"][:, d:]
    assert torch.allclose(feats, torch.tensor([[1.0, 1.0, 0.0, 2 / 255]] * 2))


def test_eval_copy_refuses_autocast(checkpoint):
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(RuntimeError, match="outside autocast"):
        eval_copy(checkpoint[0], torch.bfloat16)


def test_eval_copy_leaves_the_original(checkpoint):
    model = checkpoint[0]
    copy = eval_copy(model, torch.bfloat16)
    assert next(model.parameters()).dtype == torch.float32
    assert next(copy.parameters()).dtype == torch.bfloat16 and not copy.training
    assert copy.temperature.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("k", [2, 3, 8, 40])
def test_top_two_is_topk_bit_for_bit(k):
    generator = torch.Generator().manual_seed(k)
    probs = torch.softmax(torch.randn(64, k, generator=generator) * 4, dim=-1)
    probs[0] = 1.0 / k  # every value tied
    probs[1, :2] = probs[1].max()  # the largest twice
    probs[2] = 0.0
    probs[2, -1] = 1.0  # the largest last, the rest tied
    probs[3, 0] = float("nan")  # NaN ranks first, as in topk
    probs[4, :2] = float("nan")
    top1, top2 = top_two(probs)
    expected = probs.topk(2, dim=-1).values
    torch.testing.assert_close(top1, expected[:, 0], atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(top2, expected[:, 1], atol=0, rtol=0, equal_nan=True)
    assert torch.equal(top2[:2], top1[:2])  # a tie gives the tied value twice


def test_the_forward_exports_without_a_sort(checkpoint, inputs):
    model = checkpoint[0]
    batch = inputs["batches"][1]
    program = torch.export.export(model, tuple(batch[k] for k in inputs["arg_names"]))
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert not [t for t in targets if "topk" in t or "sort" in t], sorted(targets)
    assert "aten.amax.default" in targets
