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
and each batch's padded length.  The export stage checks that the saved batches reach both
ends of every export range (:func:`check_dims_reached`).

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
from dataclasses import dataclass

import torch

from ..errors import ConfigError, InputsMismatchError
from ..stages._aoti_runtime import INPUTS_FORMAT, load_weights_only
from .decision import QUESTION_TYPES
from .tokenizer import special_token_ids

ARG_NAMES = ("input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype")
DIM_AXES = {"rows": ("input_ids", 0), "tokens": ("input_ids", 1), "slots": ("marker_pos", 1)}


@dataclass(frozen=True)
class Decision:
    qtype: str
    question: str
    options: tuple[str, ...]
    state: str


DECISIONS: dict[str, Decision] = {
    "second-charge-hold": Decision(
        "choice", "Is the second charge a real payment?", ("yes", "no"),
        "Charge status: pending."),
    "duplicate-likelihood": Decision(
        "score", "How likely is it that the charge is a duplicate?",
        ("unlikely", "likely", "very likely"),
        "Customer: you charged me twice. Charge status: settled. Duplicate suspected: yes. "
        "Matching authorization: voided."),
    "forgotten-cancellation": Decision(
        "noul", "Which refund reason matches this request?",
        ("forgotten cancellation", "none of these"),
        "The customer wants a refund because they forgot to cancel before the renewal. "
        "Usage logs show no logins since the renewal date."),
    "annual-refund": Decision(
        "choice", "Which refund option fits the customer request best?",
        ("full refund", "partial refund", "account credit", "no refund"),
        "Customer asks for a refund of an annual plan bought nine days ago. Usage is low. "
        "Refund requested: 119.00, plan: annual, days since charge: 9, prior refunds: 0. "
        "Annual plans can be refunded in full within fourteen days and pro rata within "
        "thirty days. The customer is polite and only wants to understand the charge."),
    "urgency": Decision(
        "score", "Rate how urgent this billing issue is on a scale from one to five.",
        ("one", "two", "three", "four", "five"),
        "Dear support, I have written three times about the same double charge and nobody "
        "has answered. Ticket priority: high. Channel: email. Sentiment: negative. "
        "The customer is upset and mentions the word fraud."),
    "failed-payment-step": Decision(
        "choice", "What is the best next step for this billing ticket?",
        ("retry the payment", "update the card", "escalate to a specialist"),
        "The payment processor returned the error expired card. "
        "Subscription status: past due. Failed payments: 2. Grace period: 9 days left."),
    "late-fee-noul": Decision(
        "noul", "Should the agent waive the late fee or correct the invoice?",
        ("waive the late fee", "send the corrected invoice", "none of these"),
        "Why was my account charged a late fee when the payment went through on time? "
        "The invoice is overdue by twelve days and a reminder was sent."),
    "only-cancel": Decision(
        "choice", "Confirm the only available action.", ("cancel the subscription",),
        "Subscription status: active. Auto renewal: enabled."),
    "only-credit": Decision(
        "noul", "Is account credit the answer?", ("account credit",),
        "Refunds to a closed card are issued as account credit instead."),
}


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
                slots: int | None = None) -> dict:
    unknown = [n for n in names if n not in DECISIONS]
    if unknown:
        raise ConfigError(f"model.inputs: unknown decisions {unknown}; known: {sorted(DECISIONS)}")
    encoded = [encode_decision(tokenizer, DECISIONS[n]) for n in names]
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


def build_inputs(tokenizer, spec: dict) -> dict:
    """Tokenise the configured decision batches (``model.inputs``) into the saved layout."""
    pad = int(spec.get("pad_multiple", 16))

    def batches(key, slots=None):
        return [build_batch(tokenizer, b["decisions"], b.get("tokens"), pad, slots or b.get("slots"))
                for b in spec.get(key, [])]

    single = batches("single_slot_batches", slots=1)
    for batch in single:
        if any(n != 1 for n in batch["options"]):
            raise ConfigError(f"model.inputs.single_slot_batches: {batch['decisions']} must "
                              f"have exactly one option each, got {batch['options']}")
    return {"format": INPUTS_FORMAT, "arg_names": list(ARG_NAMES),
            "special_ids": special_token_ids(tokenizer),
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
