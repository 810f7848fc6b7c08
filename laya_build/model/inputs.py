"""Saved decision inputs: real tokenised billing/refund decisions, batched and padded.

Each row is one decision::

    [CLS] <type>: question [SEP] [MASK] option0 [MASK] option1 ... [SEP] state [SEP] [PAD]...

``marker_pos`` holds the positions of the ``[MASK]`` tokens (one slot per option; padded
slots point at position 0 and have ``marker_mask == 0``), ``qtype`` the question type
(``choice`` = 0, ``score`` = 1, ``noul`` = 2; a ``noul`` question is one where "none of
these" is a legitimate answer, so its option list includes that escape).  Rows are padded on
the right to the batch's ``tokens`` (a multiple of ``pad_multiple``; by default the longest
row rounded up).

The batch layout is config-driven (``model.inputs.batches``): which decisions share a batch
and each batch's padded length.  The decisions and the layout rules are plain Python in
:mod:`laya_build.model.batches` (checked when pipeline.yaml is loaded, and here again on the
tensors); the export stage checks that the saved batches reach both ends of every export
range (:func:`check_dims_reached`).

``inputs.pt`` (``torch.load(weights_only=True)``-safe: plain tensors, lists, strings, ints)::

    {"format": 1, "arg_names": [...], "special_ids": {...},
     "batches": [{"input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype":
                  int64 tensors, "decisions": [names], "valid_tokens": [ints],
                  "options": [ints]}, ...],
     "single_slot_batches": [...same, every row with exactly one option...]}
"""
from __future__ import annotations

import math
import os

import torch

from ..errors import ConfigError, InputsMismatchError
from .batches import DECISIONS, Decision, DimsError, batch_layout, check_dims, planned_shapes
from ..stages._aoti_runtime import INPUTS_FORMAT, load_weights_only
from .decision import QUESTION_TYPES
from .tokenizer import special_token_ids

ARG_NAMES = ("input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype")
DIM_AXES = {"rows": ("input_ids", 0), "tokens": ("input_ids", 1), "slots": ("marker_pos", 1)}


def encode_decision(tokenizer, decision: Decision) -> tuple[list[int], list[int]]:
    """Token ids of one decision and the positions of its ``[MASK]`` markers."""
    ids_of = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids = [tokenizer.cls_token_id, *ids_of(f"{decision.qtype}: {decision.question}"),
           tokenizer.sep_token_id]
    markers = []
    for option in decision.options:
        markers.append(len(ids))
        ids += [tokenizer.mask_token_id, *ids_of(option)]
    ids += [tokenizer.sep_token_id, *ids_of(decision.state), tokenizer.sep_token_id]
    return ids, markers


def build_batch(tokenizer, names: list[str], tokens: int | None, pad_multiple: int,
                slots: int | None = None, *, key: str = "model.inputs", single_slot: bool = False) -> dict:
    layout = batch_layout(names, tokens, pad_multiple, slots, key=key, single_slot=single_slot)
    encoded = [encode_decision(tokenizer, DECISIONS[n]) for n in names]
    longest = max(len(ids) for ids, _ in encoded)
    width = tokens or math.ceil(longest / pad_multiple) * pad_multiple
    if width < longest:  # the one layout rule that needs the tokenizer
        raise ConfigError(f"{key}: batch {names} needs {longest} tokens; padded length "
                          f"{width} must be a multiple of {pad_multiple} and at least that")
    rows, n_slots = layout["rows"], layout["slots"]
    batch = {
        "input_ids": torch.full((rows, width), tokenizer.pad_token_id, dtype=torch.long),
        "attention_mask": torch.zeros(rows, width, dtype=torch.long),
        "marker_pos": torch.zeros(rows, n_slots, dtype=torch.long),
        "marker_mask": torch.zeros(rows, n_slots, dtype=torch.long),
        "qtype": torch.tensor([QUESTION_TYPES.index(DECISIONS[n].qtype) for n in names]),
    }
    for row, (ids, markers) in enumerate(encoded):
        batch["input_ids"][row, :len(ids)] = torch.tensor(ids)
        batch["attention_mask"][row, :len(ids)] = 1
        batch["marker_pos"][row, :len(markers)] = torch.tensor(markers)
        batch["marker_mask"][row, :len(markers)] = 1
    batch.update(decisions=list(names), valid_tokens=[len(ids) for ids, _ in encoded],
                 options=[len(m) for _, m in encoded])
    return batch


def build_inputs(tokenizer, spec: dict) -> dict:
    """Tokenise the configured decision batches (``model.inputs``) into the saved layout."""
    planned_shapes(spec)  # every layout rule first, each error with its key path
    pad = int(spec.get("pad_multiple", 16))

    def batches(key):
        return [build_batch(tokenizer, b["decisions"], b.get("tokens"), pad, b.get("slots"),
                            key=f"model.inputs.{key}.{i}", single_slot=key == "single_slot_batches")
                for i, b in enumerate(spec.get(key, []))]

    return {"format": INPUTS_FORMAT, "arg_names": list(ARG_NAMES),
            "special_ids": special_token_ids(tokenizer),
            "batches": batches("batches"), "single_slot_batches": batches("single_slot_batches")}


def save_inputs(inputs: dict, path: str | os.PathLike) -> None:
    from ..stages._model_common import torch_save

    torch_save(inputs, path)


def load_inputs(path: str | os.PathLike) -> dict:
    try:
        return load_weights_only(path, "inputs", INPUTS_FORMAT)
    except ValueError as exc:
        raise InputsMismatchError(str(exc)) from None


def batch_shape(batch: dict) -> dict[str, int]:
    return {dim: int(batch[arg].shape[axis]) for dim, (arg, axis) in DIM_AXES.items()}


def check_dims_reached(batches: list[dict], dims: dict, *, reach: bool = True) -> None:
    """Every batch lies inside the export ranges; with ``reach``, the batches together hit
    both the minimum and the maximum of rows, tokens (``16 * tokens16``) and slots
    (:func:`laya_build.model.batches.check_dims` on the saved tensors' shapes)."""
    try:
        check_dims([batch_shape(b) for b in batches], dims, reach=reach)
    except DimsError as exc:
        raise InputsMismatchError(exc.message) from None
