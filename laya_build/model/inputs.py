"""Saved decision inputs: real billing/refund decisions, tokenised as upstream Laya does.

Each decision is a state and a question in upstream's public format (``{"type", "instructions",
"criteria"[, "labels"]}``, the ``questions`` of ``laya.load(...).system_one``).  A row is what
upstream's runtime feeds the model for it (:func:`laya_build.model.tokenizer.build_sequence`,
a port of ``laya.common.build_sequence`` checked against it token for token)::

    [CLS] <type> question: <instructions> [SEP] [MASK] option0 [MASK] option1 ... [SEP] state [SEP]

with the checkpoint's ``max_len`` / ``head_max_len`` budgets (the option texts are rendered
by type: a choice label with its description, ``level i: ...`` for a score, ``false: ...`` /
``true: ...`` for a noul, a yes/no statement question).  ``marker_pos`` holds the ``[MASK]``
positions (one slot per option; padded slots point at position 0 and have
``marker_mask == 0``), ``qtype`` the question type (``choice`` = 0, ``score`` = 1,
``noul`` = 2).  Rows are padded on the right with the tokenizer's pad id to the batch's
``tokens`` (a multiple of ``pad_multiple``; by default the longest row rounded up).

The batch layout is config-driven (``model.inputs.batches``): which decisions share a batch
and each batch's padded length.  The decisions and the layout rules are plain Python in
:mod:`laya_build.model.batches` (checked when pipeline.yaml is loaded, and here again on the
tensors); the export stage checks that the saved batches reach both ends of every export
range (:func:`check_dims_reached`).

``inputs.pt`` (``torch.load(weights_only=True)``-safe: plain tensors, lists, strings, numbers)::

    {"format": 2, "arg_names": [...], "special_ids": {...},
     "sequence": {"max_len": int, "head_max_len": int},
     "calibration": {"temperature": [3 floats], "temperature_by_options": {bucket: float}},
     "batches": [{"input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype":
                  int64 tensors, "decisions": [names], "valid_tokens": [ints],
                  "options": [ints]}, ...],
     "single_slot_batches": [...same, every row with exactly one option...]}

``calibration`` is the checkpoint's temperatures as upstream applies them; verify and latency
compute the published decision probabilities with it (``aoti.decision_probabilities``).
"""

from __future__ import annotations

import math
import os

import torch

from laya_build.errors import ConfigError, InputsMismatchError, message_of
from laya_build.model.batches import DECISIONS, Decision, DimsError, batch_layout, check_dims, planned_shapes
from laya_build.model.decision import QUESTION_TYPES
from laya_build.model.tokenizer import build_sequence, noul_labels, special_token_ids, to_internal
from laya_build.runtime.formats import INPUTS_FORMAT, load_weights_only

ARG_NAMES = ("input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype")
DIM_AXES = {"rows": ("input_ids", 0), "tokens": ("input_ids", 1), "slots": ("marker_pos", 1)}


def check_question(name: str, question: dict) -> None:
    """The shape upstream's ``Agent._check_question`` accepts (its core rules), else a
    :class:`ConfigError` naming the decision."""

    def bad(why):
        return ConfigError(f"decision {name!r}: {why}")

    if not isinstance(question, dict) or question.get("type") not in QUESTION_TYPES:
        raise bad(f"question type must be one of {', '.join(QUESTION_TYPES)}")
    ins = question.get("instructions")
    if ins is None or (isinstance(ins, (str, list, dict)) and not (ins.strip() if isinstance(ins, str) else ins)):
        raise bad("instructions must be a non-empty string, list or mapping")
    t, crit = question["type"], question.get("criteria")
    if t == "choice":
        labels = crit if isinstance(crit, list) else list(crit) if isinstance(crit, dict) else None
        if (
            not labels
            or any(not isinstance(x, (str, int, float, bool)) for x in labels)
            or len(set(labels)) != len(labels)
        ):
            raise bad("a choice takes criteria as distinct scalar labels (a list, or a mapping to descriptions)")
    elif t == "score":
        if not isinstance(crit, list) or not crit or None in crit:
            raise bad("a score takes criteria as a non-empty list of level descriptions")
    elif crit is not None and (not isinstance(crit, dict) or not {str(k).lower() for k in crit} <= {"true", "false"}):
        raise bad("a noul takes criteria as a mapping keyed only 'true'/'false', or none")
    if "labels" in question:
        if t != "noul":
            raise bad("labels are only supported for noul questions")
        try:
            noul_labels(question["labels"])
        except ConfigError as exc:
            raise bad(message_of(exc)) from None


def encode_decision(
    tokenizer, decision: Decision, max_len: int, head_max_len: int, name: str = "?"
) -> tuple[list[int], list[int]]:
    """Token ids of one decision and the positions of its ``[MASK]`` markers."""
    check_question(name, decision.question)
    ids, markers = build_sequence(tokenizer, decision.state, to_internal(decision.question), max_len, head_max_len)
    n_options = len(decision.options)
    if len(markers) != n_options:  # as upstream's Agent._encode_state refuses it
        raise ConfigError(
            f"decision {name!r}: only {len(markers)} of its {n_options} option markers fit "
            f"in the checkpoint's max_len={max_len} with head_max_len={head_max_len}"
        )
    return ids, markers


def build_batch(
    tokenizer,
    names: list[str],
    tokens: int | None,
    pad_multiple: int,
    slots: int | None = None,
    *,
    key: str = "model.inputs",
    single_slot: bool = False,
    max_len: int = 512,
    head_max_len: int = 192,
) -> dict:
    layout = batch_layout(names, tokens, pad_multiple, slots, key=key, single_slot=single_slot)
    encoded = [encode_decision(tokenizer, DECISIONS[n], max_len, head_max_len, n) for n in names]
    longest = max(len(ids) for ids, _ in encoded)
    width = tokens or math.ceil(longest / pad_multiple) * pad_multiple
    if width < longest:  # the one layout rule that needs the tokenizer
        raise ConfigError(
            f"{key}: batch {names} needs {longest} tokens; padded length "
            f"{width} must be a multiple of {pad_multiple} and at least that"
        )
    rows, n_slots = layout["rows"], layout["slots"]
    batch = {
        "input_ids": torch.full((rows, width), tokenizer.pad_token_id, dtype=torch.long),
        "attention_mask": torch.zeros(rows, width, dtype=torch.long),
        "marker_pos": torch.zeros(rows, n_slots, dtype=torch.long),
        "marker_mask": torch.zeros(rows, n_slots, dtype=torch.long),
        "qtype": torch.tensor([QUESTION_TYPES.index(DECISIONS[n].qtype) for n in names]),
    }
    for row, (ids, markers) in enumerate(encoded):
        batch["input_ids"][row, : len(ids)] = torch.tensor(ids)
        batch["attention_mask"][row, : len(ids)] = 1
        batch["marker_pos"][row, : len(markers)] = torch.tensor(markers)
        batch["marker_mask"][row, : len(markers)] = 1
    batch.update(
        decisions=list(names), valid_tokens=[len(ids) for ids, _ in encoded], options=[len(m) for _, m in encoded]
    )
    return batch


def build_inputs(tokenizer, spec: dict, agent: dict) -> dict:
    """Tokenise the configured decision batches (``model.inputs``) into the saved layout, with
    the budgets and the applied calibration of the checkpoint's ``agent`` config
    (:func:`laya_build.model.checkpoint.read_agent_config`)."""
    pad = int(spec.get("pad_multiple", 16))
    sizes = {"max_len": agent["max_len"], "head_max_len": agent["head_max_len"]}

    planned_shapes(spec)  # every layout rule first, each error with its key path

    def batches(key):
        return [
            build_batch(
                tokenizer,
                b["decisions"],
                b.get("tokens"),
                pad,
                b.get("slots"),
                key=f"model.inputs.{key}.{i}",
                single_slot=key == "single_slot_batches",
                **sizes,
            )
            for i, b in enumerate(spec.get(key, []))
        ]

    calibration = agent["calibration"]
    return {
        "format": INPUTS_FORMAT,
        "arg_names": list(ARG_NAMES),
        "special_ids": special_token_ids(tokenizer),
        "sequence": sizes,
        "calibration": {
            "temperature": list(calibration["applied"]["temperature"]),
            "temperature_by_options": dict(calibration["applied"]["temperature_by_options"]),
        },
        "batches": batches("batches"),
        "single_slot_batches": batches("single_slot_batches"),
    }


def save_inputs(inputs: dict, path: str | os.PathLike) -> None:
    from laya_build.atomic import torch_save

    torch_save(inputs, path)


def load_inputs(path: str | os.PathLike) -> dict:
    try:
        return load_weights_only(path, "inputs", INPUTS_FORMAT)
    except ValueError as exc:
        raise InputsMismatchError(message_of(exc)) from None


def batch_shape(batch: dict) -> dict[str, int]:
    return {dim: int(batch[arg].shape[axis]) for dim, (arg, axis) in DIM_AXES.items()}


def check_dims_reached(batches: list[dict], dims: dict, *, reach: bool = True) -> None:
    """Every batch lies inside the export ranges; with ``reach``, the batches together hit
    both the minimum and the maximum of rows, tokens (``16 * tokens16``) and slots
    (:func:`laya_build.model.batches.check_dims` on the saved tensors' shapes)."""
    try:
        check_dims([batch_shape(b) for b in batches], dims, reach=reach)
    except DimsError as exc:
        raise InputsMismatchError(exc.detail) from None
