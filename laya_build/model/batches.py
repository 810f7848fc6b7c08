"""The saved decisions and the rules of their batch layout, in plain Python (no torch).

``model.inputs`` lays the decisions of :data:`DECISIONS` out in batches: a batch has one row
per decision, ``tokens`` padded positions (a multiple of ``pad_multiple``; without it, the
longest row rounded up, which only the tokenizer knows) and ``slots`` marker slots (by
default the most options of its rows).  ``export.dims`` gives the dynamic ranges the saved
batches must cover.

The rules live here once.  :mod:`laya_build.config` applies them to the layout the config
describes when ``pipeline.yaml`` is loaded (an unknown tokens count is left to the stage);
the model stage (:mod:`laya_build.model.inputs`) and the export stage apply the same
functions to the tensors they build and load.
"""

from __future__ import annotations

from dataclasses import dataclass

from laya_build.errors import ConfigError
from laya_build.model.tokenizer import render_options, to_internal  # plain Python: no torch, no tokenizers

TOKEN_ALIGN = 16  # export's tokens are 16 * Dim("tokens16"): the attention alignment guard
# Each export dim: (the shape key, the export.dims key, its multiplier).
EXPORT_DIMS = {"rows": ("rows", 1), "tokens": ("tokens16", TOKEN_ALIGN), "slots": ("slots", 1)}
BATCH_KEYS = ("batches", "single_slot_batches")


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
        {"type": "choice", "instructions": "Is the second charge a real payment?", "criteria": ["yes", "no"]},
    ),
    "duplicate-likelihood": Decision(
        "Customer: you charged me twice. Duplicate suspected: yes.",
        {"type": "score", "instructions": "Is the charge a duplicate?", "criteria": ["unlikely", "likely", "certain"]},
    ),
    "forgotten-cancellation": Decision(
        "I forgot to cancel before the renewal.",
        {
            "type": "noul",
            "instructions": "The customer forgot to cancel.",
            "criteria": {"true": "forgot", "false": "other"},
        },
    ),
    "annual-refund": Decision(
        "Customer asks for a refund of an annual plan bought nine days ago. Usage is low. "
        "Refund requested: 119.00, plan: annual, days since charge: 9, prior refunds: 0. "
        "Annual plans can be refunded in full within fourteen days and pro rata within "
        "thirty days. The customer is polite and only wants to understand the charge.",
        {
            "type": "choice",
            "instructions": "Which refund option fits the customer request best?",
            "criteria": {
                "full refund": "within fourteen days of the charge",
                "partial refund": "pro rata within thirty days",
                "account credit": "",
                "no refund": None,
            },
        },
    ),
    "urgency": Decision(
        [
            "Dear support, I have written three times about the same double charge and nobody has answered.",
            "Ticket priority: high. Channel: email. Sentiment: negative.",
            "The customer is upset and mentions the word fraud.",
        ],
        {
            "type": "score",
            "instructions": "Rate how urgent this billing issue is on a scale from one to five.",
            "criteria": ["one", "two", "three", "four", {"level": "five", "when": "fraud or legal threat"}],
        },
    ),
    "failed-payment-step": Decision(
        "The payment processor returned the error expired card. "
        "Subscription status: past due. Failed payments: 2. Grace period: 9 days left.",
        {
            "type": "choice",
            "instructions": "What is the best next step for this billing ticket?",
            "criteria": ["retry the payment", "update the card", "escalate to a specialist"],
        },
    ),
    "late-fee-noul": Decision(
        {
            "message": "Why was my account charged a late fee when the payment went through on time?",
            "invoice": {"overdue_days": 12, "reminder_sent": True, "late_fee": 5.0},
        },
        {
            "type": "noul",
            "instructions": "Waive the late fee: the payment arrived on time.",
            "criteria": {"true": "waive the late fee"},
            "labels": {"false": "keep", "true": "waive"},
        },
    ),
    "only-cancel": Decision(
        "Subscription status: active. Auto renewal: enabled.",
        {
            "type": "choice",
            "instructions": "Confirm the only available action.",
            "criteria": ["cancel the subscription"],
        },
    ),
    "only-credit": Decision(
        "Refunds to a closed card are issued as account credit instead.",
        {"type": "score", "instructions": "How is the refund issued?", "criteria": ["as account credit"]},
    ),
}


class LayoutError(ConfigError):
    """A batch layout that cannot be built or exported; ``key`` is the config key path."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key, self.detail = key, message


class DimsError(LayoutError):
    """The batches do not fit the export ranges (at a stage: the saved inputs do not)."""


def batch_layout(
    names: list[str],
    tokens: int | None,
    pad_multiple: int,
    slots: int | None = None,
    *,
    key: str = "model.inputs",
    single_slot: bool = False,
) -> dict:
    """The shape ``{"rows", "tokens", "slots"}`` of a batch of the decisions ``names``;
    ``tokens`` stays None when not given (the tokenizer decides).  ``single_slot``: a batch of
    ``single_slot_batches`` (every row has exactly one option; slots is 1)."""
    unknown = [(i, n) for i, n in enumerate(names) if n not in DECISIONS]
    if unknown:
        raise LayoutError(
            f"{key}.decisions.{unknown[0][0]}",
            f"unknown decisions {[n for _, n in unknown]}; known: {sorted(DECISIONS)}",
        )
    options = [len(DECISIONS[n].options) for n in names]
    if tokens is not None and tokens % pad_multiple:
        raise LayoutError(f"{key}.tokens", f"padded length {tokens} is not a multiple of {pad_multiple}")
    if single_slot:
        several = [(i, n) for i, n in enumerate(names) if options[i] != 1]
        if several:
            raise LayoutError(
                f"{key}.decisions.{several[0][0]}",
                f"single_slot_batches rows must have exactly one option; "
                f"{[n for _, n in several]} have {[options[i] for i, _ in several]}",
            )
        if slots not in (None, 1):
            raise LayoutError(f"{key}.slots", f"a single-slot batch has 1 slot, got slots={slots}")
        return {"rows": len(names), "tokens": tokens, "slots": 1}
    most = max(options)
    if slots is not None and slots < most:
        raise LayoutError(f"{key}.slots", f"batch {names} has a row with {most} options; slots={slots} is too few")
    return {"rows": len(names), "tokens": tokens, "slots": slots or most}


def planned_shapes(inputs_cfg: dict) -> dict[str, list[dict]]:
    """:func:`batch_layout` of every batch of ``model.inputs``, by batches key."""
    pad = int(inputs_cfg.get("pad_multiple", TOKEN_ALIGN))
    return {
        bkey: [
            batch_layout(
                b["decisions"],
                b.get("tokens"),
                pad,
                b.get("slots"),
                key=f"model.inputs.{bkey}.{i}",
                single_slot=bkey == "single_slot_batches",
            )
            for i, b in enumerate(inputs_cfg.get(bkey, []))
        ]
        for bkey in BATCH_KEYS
    }


def export_ranges(dims: dict) -> dict[str, tuple[int, int]]:
    """``export.dims`` as (min, max) of rows, tokens and slots."""
    return {dim: (scale * dims[key]["min"], scale * dims[key]["max"]) for dim, (key, scale) in EXPORT_DIMS.items()}


def check_dims(shapes: list[dict], dims: dict, *, reach: bool = True, batches_key: str = "batches") -> None:
    """Every batch lies inside the export ranges; with ``reach``, the batches together hit
    both the minimum and the maximum of rows, tokens (``16 * tokens16``) and slots.

    A ``None`` size is not known yet (tokens before tokenisation): it is checked by the
    stage that knows it, and a range end it might reach is not decided here.
    """
    ranges = export_ranges(dims)
    for i, shape in enumerate(shapes):
        where = f"model.inputs.{batches_key}.{i}"
        if shape["tokens"] is not None and shape["tokens"] % TOKEN_ALIGN:
            raise DimsError(where, f"batch {i}: {shape['tokens']} tokens is not a multiple of {TOKEN_ALIGN}")
        for dim, (lo, hi) in ranges.items():
            if (dim == "slots" and not reach) or shape[dim] is None:
                continue
            if not lo <= shape[dim] <= hi:
                raise DimsError(where, f"batch {i}: {dim} = {shape[dim]} is outside the export range {lo}..{hi}")
    if reach:
        for dim, (lo, hi) in ranges.items():
            if any(s[dim] is None for s in shapes):
                continue
            seen = sorted({s[dim] for s in shapes})
            if not seen or seen[0] != lo or seen[-1] != hi:
                raise DimsError(
                    f"export.dims.{EXPORT_DIMS[dim][0]}",
                    f"the saved batches do not reach both ends of the export range of {dim} "
                    f"{lo}..{hi} (seen {seen}); change export.dims or model.inputs.batches",
                )


def check_example(shapes: list[dict], index: int, batches_key: str) -> None:
    """The batch torch.export traces must exist and have >= 2 rows (a 1-row example would
    specialise rows to 1)."""
    key = "export.example_batch" if batches_key == "batches" else f"model.inputs.{batches_key}.{index}"
    if index >= len(shapes):
        raise LayoutError(key, f"batch {index} does not exist: model.inputs.{batches_key} has {len(shapes)}")
    if shapes[index]["rows"] < 2:
        raise LayoutError(
            key,
            f"export example ({batches_key}[{index}]) has one row; torch.export would "
            "specialise rows to 1: pick a batch with >= 2 rows",
        )


def check_export_layout(shapes: dict[str, list[dict]], export_cfg: dict) -> None:
    """What the export stage requires of the saved batches (``shapes`` by batches key)."""
    check_dims(shapes["batches"], export_cfg["dims"])
    check_example(shapes["batches"], export_cfg["example_batch"], "batches")
    if export_cfg["single_slot"]:
        if not shapes["single_slot_batches"]:
            raise DimsError(
                "model.inputs.single_slot_batches", "export.single_slot is set but there are no single_slot_batches"
            )
        check_dims(shapes["single_slot_batches"], export_cfg["dims"], reach=False, batches_key="single_slot_batches")
        check_example(shapes["single_slot_batches"], 0, "single_slot_batches")
