"""The saved inputs: layout, real tokenised text, and reaching the export ranges."""

from __future__ import annotations

import pytest
import torch

from laya_build.config.sections import merge, section
from laya_build.errors import InputsMismatchError
from laya_build.model.decision import QUESTION_TYPES
from laya_build.model.inputs import DECISIONS, batch_shape, check_dims_reached


def test_saved_inputs_are_plain_and_weights_only(model_dir):
    loaded = torch.load(model_dir / "inputs.pt", weights_only=True)
    assert loaded["arg_names"] == ["input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype"]
    assert all(t.dtype == torch.long for b in loaded["batches"] for k, t in b.items() if isinstance(t, torch.Tensor))


def test_seven_rows_over_three_batches(inputs):
    shapes = [batch_shape(b) for b in inputs["batches"]]
    assert len(shapes) == 3 and sum(s["rows"] for s in shapes) == 7
    example = shapes[section("export", {})["example_batch"]]
    assert any(s != example for s in shapes)
    assert all(s["tokens"] % 16 == 0 for s in shapes)
    qtypes = {int(q) for b in inputs["batches"] for q in b["qtype"]}
    assert qtypes == set(range(len(QUESTION_TYPES)))


def test_inputs_reach_both_ends_of_the_export_ranges(inputs):
    dims = section("export", {})["dims"]
    check_dims_reached(inputs["batches"], dims)  # raises otherwise
    shapes = [batch_shape(b) for b in inputs["batches"]]
    for dim, key, scale in (("rows", "rows", 1), ("tokens", "tokens16", 16), ("slots", "slots", 1)):
        seen = {s[dim] for s in shapes}
        assert {scale * dims[key]["min"], scale * dims[key]["max"]} <= seen


@pytest.mark.parametrize("dim, bad", [("rows", {"max": 8}), ("tokens16", {"min": 1}), ("slots", {"max": 9})])
def test_unreached_range_is_reported(inputs, dim, bad):
    dims = merge(section("export", {})["dims"], {dim: bad})
    with pytest.raises(InputsMismatchError, match=r"do not reach both ends of the export range of"):
        check_dims_reached(inputs["batches"], dims)


def test_row_layout_and_markers(inputs, checkpoint):
    tokenizer = checkpoint[1]
    ids = inputs["special_ids"]
    valid_lengths = []
    for batch in inputs["batches"]:
        for row, name in enumerate(batch["decisions"]):
            decision = DECISIONS[name]
            n = batch["valid_tokens"][row]
            valid_lengths.append(n)
            tokens = batch["input_ids"][row]
            assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (len(tokens) - n)
            assert tokens[0] == ids["cls_token_id"] and tokens[n - 1] == ids["sep_token_id"]
            assert torch.all(tokens[n:] == ids["pad_token_id"])
            assert int((tokens[:n] == ids["sep_token_id"]).sum()) == 3
            k = len(decision.options)
            pos, mask = batch["marker_pos"][row], batch["marker_mask"][row]
            assert mask.tolist() == [1] * k + [0] * (len(mask) - k)
            assert torch.all(tokens[pos[:k]] == ids["mask_token_id"])
            assert int((tokens == ids["mask_token_id"]).sum()) == k
            assert torch.all(pos[k:] == 0)
            assert int(batch["qtype"][row]) == QUESTION_TYPES.index(decision.qtype)
            first = tokenizer.decode(tokens[pos[0] + 1 : pos[1] if k > 1 else n]).split("[SEP]")[0]
            assert first.strip() == decision.options[0]  # the rendered option text
    assert len(set(valid_lengths)) == len(valid_lengths)  # unequal valid lengths
    padded_slots = [b for b in inputs["batches"] if int((b["marker_mask"] == 0).sum())]
    assert padded_slots, "some batch must have padded marker slots"


def test_texts_are_billing_support(inputs, checkpoint):
    tokenizer = checkpoint[1]
    text = " ".join(
        tokenizer.decode(b["input_ids"][r]) for b in inputs["batches"] for r in range(len(b["decisions"]))
    ).lower()
    for word in ("refund", "charge", "invoice", "subscription"):
        assert word in text
    assert "[UNK]" not in text


def test_single_slot_batches(inputs):
    (batch,) = inputs["single_slot_batches"]
    assert batch["marker_pos"].shape[1] == 1 and batch["options"] == [1, 1]
    assert batch["input_ids"].shape[0] >= 2


def test_batch_slots_pad_marker_slots_and_never_drop_options(checkpoint):
    from laya_build.errors import ConfigError
    from laya_build.model.inputs import build_batch

    _, tokenizer, _ = checkpoint
    names = ["annual-refund", "urgency"]
    most = max(len(DECISIONS[n].options) for n in names)
    batch = build_batch(tokenizer, names, None, 16, slots=most + 3)
    assert batch["marker_pos"].shape[1] == most + 3
    assert (batch["marker_mask"][:, most:] == 0).all() and (batch["marker_pos"][:, most:] == 0).all()
    with pytest.raises(ConfigError, match=rf"has a row with {most} options; slots={most - 1} is too few"):
        build_batch(tokenizer, names, None, 16, slots=most - 1)
