"""Comparing a package's outputs with eager's: decision probabilities calibrated as upstream Laya
publishes them, per-head deltas and argmax agreement (torch and the standard library only)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from laya_build.runtime.formats import HEADS

if TYPE_CHECKING:
    import torch


def finite_or_none(x: float):
    return x if math.isfinite(x) else None


#
# The rule of upstream Laya (``laya==0.4.15``), which is how a calibrated checkpoint's decision
# probabilities are published:
#   * laya/agent.py ``Agent.__init__``: ``temperature`` (default [1, 1, 1], one per question
#     type) and ``temperature_by_options`` (bucket -> temperature) from rl_agent_config.json,
#     every value passed through ``clamp_temperature``;
#   * laya/agent.py ``Agent._decode_answers``: ``t = temperature_by_options.get(
#     temp_bucket(qtype, k), temperature[qtype])`` with ``k`` the row's option count, then
#     ``p = softmax(logits[:k] / t)``;
#   * laya/common.py ``temp_bucket``, ``clamp_temperature`` (``TEMP_MIN``/``TEMP_MAX``) and
#     ``temperature_rejected``.
# The act head's probabilities are its plain softmax (laya/agent.py ``Agent._forward``).

TEMP_MIN, TEMP_MAX = 0.5, 5.0
QTYPE_NAMES = ("choice", "score", "noul")
PROBABILITY_RULE = (
    "decision: softmax(logits[:k] / t) over the row's k options, "
    "t = temperature_by_options[<type>:<k bucket>] if present else temperature[qtype], "
    f"each clamped to [{TEMP_MIN:g}, {TEMP_MAX:g}] (non-numbers -> 1.0); act: softmax(logits)"
)
PROBABILITY_RULE_SOURCE = (
    "laya 0.4.15: laya/agent.py Agent.__init__ and Agent._decode_answers; laya/common.py temp_bucket, clamp_temperature"
)


def clamp_temperature(t) -> float:
    """laya/common.py ``clamp_temperature``: ``t`` in [0.5, 5.0]; 1.0 if not a finite number."""
    if isinstance(t, bool):
        return 1.0
    try:
        t = float(t)
    except (TypeError, ValueError):
        return 1.0
    if not math.isfinite(t):
        return 1.0
    return min(TEMP_MAX, max(TEMP_MIN, t))


def temperature_rejected(raw, applied: float) -> bool:
    """laya/common.py ``temperature_rejected``: ``raw`` is not the number that was applied."""
    if isinstance(raw, bool):
        return True
    try:
        return float(raw) != applied
    except (TypeError, ValueError):
        return True


def temperature_bucket(qtype: int, k: int) -> str:
    """laya/common.py ``temp_bucket``: ``"<type>:<2|3-5|6-10|11+>"``."""
    size = "2" if k <= 2 else "3-5" if k <= 5 else "6-10" if k <= 10 else "11+"
    return f"{QTYPE_NAMES[int(qtype)]}:{size}"


def applied_calibration(temperature, temperature_by_options) -> dict:
    """The temperatures upstream applies for a checkpoint's raw ``temperature`` (a list of 3)
    and ``temperature_by_options`` (a mapping), plus the entries it had to replace."""
    applied = [clamp_temperature(t) for t in temperature]
    by_options = {str(k): clamp_temperature(v) for k, v in temperature_by_options.items()}
    entries = [(f"temperature[{i}]", raw, applied[i]) for i, raw in enumerate(temperature)]
    entries += [(f"temperature_by_options.{k}", v, by_options[str(k)]) for k, v in temperature_by_options.items()]
    return {
        "temperature": applied,
        "temperature_by_options": by_options,
        "replaced": [
            f"{name}={raw!r} -> {value:g}" for name, raw, value in entries if temperature_rejected(raw, value)
        ],
    }


def decision_temperatures(qtype: torch.Tensor, marker_mask: torch.Tensor, calibration: dict) -> torch.Tensor:
    """Per row, the temperature upstream divides that row's decision logits by."""
    import torch

    ks = (marker_mask != 0).sum(-1).tolist()
    by_options, per_type = calibration["temperature_by_options"], calibration["temperature"]
    return torch.tensor(
        [by_options.get(temperature_bucket(q, k), per_type[int(q)]) for q, k in zip(qtype.tolist(), ks)],
        dtype=torch.float32,
    )


def decision_probabilities(
    logits: torch.Tensor, qtype: torch.Tensor, marker_mask: torch.Tensor, calibration: dict
) -> torch.Tensor:
    """Calibrated decision probabilities ``[rows, slots]`` (padded slots 0), upstream's rule
    (see :data:`PROBABILITY_RULE_SOURCE`): softmax over the row's options of logits / t."""
    import torch

    valid = marker_mask.to(logits.device) != 0
    t = decision_temperatures(qtype, marker_mask, calibration).to(logits.device)
    z = (logits.float() / t[:, None]).masked_fill(~valid, float("-inf"))
    return torch.softmax(z, -1)


def head_probabilities(head: str, logits: torch.Tensor, batch: dict, calibration: dict | None) -> torch.Tensor:
    """The published probabilities of a head; without ``calibration`` (saved inputs of format 1,
    releases made before 2026-11-30 10:00) the raw softmax of the logits, as those releases had."""
    import torch

    if head == "decision" and calibration is not None:
        return decision_probabilities(logits, batch["qtype"], batch["marker_mask"], calibration)
    return torch.softmax(logits.float(), -1)


def compare_heads(ref: dict, got: dict, batch: dict, calibration: dict | None) -> dict:
    """Per head and row: max |logit delta|, max |probability delta|, both argmaxes and the
    reference's margin between its own choice and the candidate's (0 when they agree).

    Compared in fp32; probabilities are the published ones, upstream's rule
    (:func:`head_probabilities`, ``calibration`` from the saved inputs).  A non-finite delta
    is reported as ``None`` (and fails every threshold).
    """
    out = {}
    for head in HEADS:
        r, g = ref[head].float(), got[head].float()
        if r.shape != g.shape:
            raise ValueError(f"{head} logits: shape {tuple(g.shape)} != reference {tuple(r.shape)}")
        logit = (r - g).abs().amax(-1)
        prob = (
            (head_probabilities(head, r, batch, calibration) - head_probabilities(head, g, batch, calibration))
            .abs()
            .amax(-1)
        )
        ref_arg, got_arg = r.argmax(-1), g.argmax(-1)
        margin = r.gather(-1, ref_arg[:, None]) - r.gather(-1, got_arg[:, None])
        out[head] = {
            "logit_delta": [finite_or_none(float(v)) for v in logit],
            "prob_delta": [finite_or_none(float(v)) for v in prob],
            "argmax_ref": [int(v) for v in ref_arg],
            "argmax_got": [int(v) for v in got_arg],
            "ref_margin": [finite_or_none(float(v)) for v in margin[:, 0]],
        }
    return out


def summarize(compares: list[dict]) -> dict:
    """Per head over all batches: max deltas (None if any is not finite) and argmax agreement."""

    def worst(values):
        return None if any(v is None for v in values) else max(values, default=0.0)

    out = {}
    for head in HEADS:
        rows = [c[head] for c in compares]
        out[head] = {
            "max_logit_delta": worst([v for r in rows for v in r["logit_delta"]]),
            "max_prob_delta": worst([v for r in rows for v in r["prob_delta"]]),
            "argmax_agree": sum(a == b for r in rows for a, b in zip(r["argmax_ref"], r["argmax_got"])),
            "rows": sum(len(r["argmax_ref"]) for r in rows),
        }
    return out
