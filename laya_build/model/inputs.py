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
and each batch's padded length.  The export stage checks that the saved batches reach both
ends of every export range (:func:`check_dims_reached`).

``inputs.pt`` (``torch.load(weights_only=True)``-safe: plain tensors, lists, strings, numbers)::

    {"format": 2, "arg_names": [...], "special_ids": {...},
     "sequence": {"max_len": int, "head_max_len": int},
     "calibration": {"temperature": [3 floats], "temperature_by_options": {bucket: float}},
     "batches": [{"input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype":
                  int64 tensors, "decisions": [names], "valid_tokens": [ints],
                  "options": [ints]}, ...],
     "single_slot_batches": [...same, every row with exactly one option...]}

``calibration`` is the checkpoint's temperatures as upstream applies them; verify and latency
compute the published decision probabilities with it (``_aoti_runtime.decision_probabilities``).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from ..errors import ConfigError, InputsMismatchError
from ..stages._aoti_runtime import INPUTS_FORMAT, load_weights_only
from .decision import QUESTION_TYPES
from .tokenizer import build_sequence, noul_labels, render_options, special_token_ids, to_internal

ARG_NAMES = ("input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype")
DIM_AXES = {"rows": ("input_ids", 0), "tokens": ("input_ids", 1), "slots": ("marker_pos", 1)}


@dataclass(frozen=True)
class Decision:
    state: str | dict | list
    question: dict

    @property
    def qtype(self) -> str:
        return self.question["type"]

    @property
    def options(self) -> list[str]:
        """The option texts as the model reads them (one ``[MASK]`` slot each)."""
        return render_options(to_internal(self.question))


DECISIONS: dict[str, Decision] = {
    "second-charge-hold": Decision(
        "Charge status: pending.",
        {"type": "choice", "instructions": "Is the second charge a real payment?",
         "criteria": ["yes", "no"]}),
    "duplicate-likelihood": Decision(
        "Customer: you charged me twice. Duplicate suspected: yes.",
        {"type": "score", "instructions": "Is the charge a duplicate?",
         "criteria": ["unlikely", "likely", "certain"]}),
    "forgotten-cancellation": Decision(
        "I forgot to cancel before the renewal.",
        {"type": "noul", "instructions": "The customer forgot to cancel.",
         "criteria": {"true": "forgot", "false": "other"}}),
    "annual-refund": Decision(
        "Customer asks for a refund of an annual plan bought nine days ago. Usage is low. "
        "Refund requested: 119.00, plan: annual, days since charge: 9, prior refunds: 0. "
        "Annual plans can be refunded in full within fourteen days and pro rata within "
        "thirty days. The customer is polite and only wants to understand the charge.",
        {"type": "choice", "instructions": "Which refund option fits the customer request best?",
         "criteria": {"full refund": "within fourteen days of the charge",
                      "partial refund": "pro rata within thirty days",
                      "account credit": "", "no refund": None}}),
    "urgency": Decision(
        ["Dear support, I have written three times about the same double charge and nobody "
         "has answered.", "Ticket priority: high. Channel: email. Sentiment: negative.",
         "The customer is upset and mentions the word fraud."],
        {"type": "score", "instructions": "Rate how urgent this billing issue is on a scale from one to five.",
         "criteria": ["one", "two", "three", "four", {"level": "five", "when": "fraud or legal threat"}]}),
    "failed-payment-step": Decision(
        "The payment processor returned the error expired card. "
        "Subscription status: past due. Failed payments: 2. Grace period: 9 days left.",
        {"type": "choice", "instructions": "What is the best next step for this billing ticket?",
         "criteria": ["retry the payment", "update the card", "escalate to a specialist"]}),
    "late-fee-noul": Decision(
        {"message": "Why was my account charged a late fee when the payment went through on time?",
         "invoice": {"overdue_days": 12, "reminder_sent": True, "late_fee": 5.0}},
        {"type": "noul", "instructions": "Waive the late fee: the payment arrived on time.",
         "criteria": {"true": "waive the late fee"},
         "labels": {"false": "keep", "true": "waive"}}),
    "only-cancel": Decision(
        "Subscription status: active. Auto renewal: enabled.",
        {"type": "choice", "instructions": "Confirm the only available action.",
         "criteria": ["cancel the subscription"]}),
    "only-credit": Decision(
        "Refunds to a closed card are issued as account credit instead.",
        {"type": "score", "instructions": "How is the refund issued?",
         "criteria": ["as account credit"]}),
}


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
        if not labels or any(not isinstance(x, (str, int, float, bool)) for x in labels) \
                or len(set(labels)) != len(labels):
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
            raise bad(str(exc)) from None


def encode_decision(tokenizer, decision: Decision, max_len: int, head_max_len: int,
                    name: str = "?") -> tuple[list[int], list[int]]:
    """Token ids of one decision and the positions of its ``[MASK]`` markers."""
    check_question(name, decision.question)
    ids, markers = build_sequence(tokenizer, decision.state, to_internal(decision.question), max_len, head_max_len)
    n_options = len(decision.options)
    if len(markers) != n_options:  # as upstream's Agent._encode_state refuses it
        raise ConfigError(f"decision {name!r}: only {len(markers)} of its {n_options} option markers fit "
                          f"in the checkpoint's max_len={max_len} with head_max_len={head_max_len}")
    return ids, markers


def build_batch(tokenizer, names: list[str], tokens: int | None, pad_multiple: int,
                slots: int | None = None, *, max_len: int = 512, head_max_len: int = 192) -> dict:
    unknown = [n for n in names if n not in DECISIONS]
    if unknown:
        raise ConfigError(f"model.inputs: unknown decisions {unknown}; known: {sorted(DECISIONS)}")
    encoded = [encode_decision(tokenizer, DECISIONS[n], max_len, head_max_len, n) for n in names]
    longest = max(len(ids) for ids, _ in encoded)
    width = tokens or math.ceil(longest / pad_multiple) * pad_multiple
    if width % pad_multiple or width < longest:
        raise ConfigError(f"model.inputs: batch {names} needs {longest} tokens; padded length "
                          f"{width} must be a multiple of {pad_multiple} and at least that")
    most = max(len(m) for _, m in encoded)
    n_slots = slots or most
    if n_slots < most:
        raise ConfigError(f"model.inputs: batch {names} has a row with {most} options; slots={n_slots} is too few")
    rows = len(names)
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


def build_inputs(tokenizer, spec: dict, agent: dict) -> dict:
    """Tokenise the configured decision batches (``model.inputs``) into the saved layout, with
    the budgets and the applied calibration of the checkpoint's ``agent`` config
    (:func:`laya_build.model.checkpoint.read_agent_config`)."""
    pad = int(spec.get("pad_multiple", 16))
    sizes = {"max_len": agent["max_len"], "head_max_len": agent["head_max_len"]}

    def batches(key, slots=None):
        return [build_batch(tokenizer, b["decisions"], b.get("tokens"), pad, slots or b.get("slots"), **sizes)
                for b in spec.get(key, [])]

    single = batches("single_slot_batches", slots=1)
    for batch in single:
        if any(n != 1 for n in batch["options"]):
            raise ConfigError(f"model.inputs.single_slot_batches: {batch['decisions']} must "
                              f"have exactly one option each, got {batch['options']}")
    calibration = agent["calibration"]
    return {"format": INPUTS_FORMAT, "arg_names": list(ARG_NAMES),
            "special_ids": special_token_ids(tokenizer), "sequence": sizes,
            "calibration": {"temperature": list(calibration["applied"]["temperature"]),
                            "temperature_by_options": dict(calibration["applied"]["temperature_by_options"])},
            "batches": batches("batches"), "single_slot_batches": single}


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
    both the minimum and the maximum of rows, tokens (``16 * tokens16``) and slots."""
    ranges = {"rows": (dims["rows"]["min"], dims["rows"]["max"]),
              "tokens": (16 * dims["tokens16"]["min"], 16 * dims["tokens16"]["max"]),
              "slots": (dims["slots"]["min"], dims["slots"]["max"])}
    shapes = [batch_shape(b) for b in batches]
    for i, shape in enumerate(shapes):
        if shape["tokens"] % 16:
            raise InputsMismatchError(f"batch {i}: {shape['tokens']} tokens is not a multiple of 16")
        for dim, (lo, hi) in ranges.items():
            if dim == "slots" and not reach:
                continue
            if not lo <= shape[dim] <= hi:
                raise InputsMismatchError(f"batch {i}: {dim} = {shape[dim]} is outside the "
                                          f"export range {lo}..{hi}")
    if reach:
        for dim, (lo, hi) in ranges.items():
            seen = sorted({s[dim] for s in shapes})
            if not seen or seen[0] != lo or seen[-1] != hi:
                raise InputsMismatchError(
                    f"the saved batches do not reach both ends of the export range of {dim} "
                    f"{lo}..{hi} (seen {seen}); change export.dims or model.inputs.batches")
