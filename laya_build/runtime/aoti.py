"""Torch-only helpers around a decision program and its package, shared by the export stage
and the child processes (:mod:`laya_build.stages.children`): the saved-input and eager-output
formats, calling a program on a saved batch, comparing heads (decision probabilities as
upstream Laya publishes them), timing calls to a budget.

This module imports nothing but ``torch``, the standard library and the serving runtime
(:mod:`laya_build.runtime`, itself torch + stdlib): the fresh verification process
(:mod:`laya_build.stages.children.verify`) imports it and must not pull in transformers or any
model code.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import platform
import subprocess
import time
from pathlib import Path

import torch

from laya_build.runtime.serving import cpu_isa_flags, preload_modules, sha256_file  # noqa: F401  (used by the child processes)

HEADS = ("decision", "act")
INPUTS_FORMAT = 2  # 2: upstream build_sequence tokenisation and the checkpoint's "calibration"
EAGER_FORMAT = 1


def load_weights_only(path, what: str, fmt: int) -> dict:
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(obj, dict) or obj.get("format") != fmt:
        raise ValueError(f"{path}: not a laya {what} file (format {fmt})")
    return obj


def batch_args(batch: dict, arg_names, device) -> tuple:
    return tuple(batch[name].to(device) for name in arg_names)


def outputs_dict(outputs) -> dict:
    """``(decision_logits, act_logits)`` of a model or package call, detached on the CPU."""
    decision, act = outputs
    return {"decision": decision.detach().cpu(), "act": act.detach().cpu()}


def finite_or_none(x: float):
    return x if math.isfinite(x) else None


# ------------------------------------------------------------------ calibrated probabilities
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
PROBABILITY_RULE = ("decision: softmax(logits[:k] / t) over the row's k options, "
                    "t = temperature_by_options[<type>:<k bucket>] if present else temperature[qtype], "
                    f"each clamped to [{TEMP_MIN:g}, {TEMP_MAX:g}] (non-numbers -> 1.0); act: softmax(logits)")
PROBABILITY_RULE_SOURCE = ("laya 0.4.15: laya/agent.py Agent.__init__ and Agent._decode_answers; "
                           "laya/common.py temp_bucket, clamp_temperature")


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
    return {"temperature": applied, "temperature_by_options": by_options,
            "replaced": [f"{name}={raw!r} -> {value:g}" for name, raw, value in entries
                         if temperature_rejected(raw, value)]}


def decision_temperatures(qtype: torch.Tensor, marker_mask: torch.Tensor, calibration: dict) -> torch.Tensor:
    """Per row, the temperature upstream divides that row's decision logits by."""
    ks = (marker_mask != 0).sum(-1).tolist()
    by_options, per_type = calibration["temperature_by_options"], calibration["temperature"]
    return torch.tensor([by_options.get(temperature_bucket(q, k), per_type[int(q)])
                         for q, k in zip(qtype.tolist(), ks)], dtype=torch.float32)


def decision_probabilities(logits: torch.Tensor, qtype: torch.Tensor, marker_mask: torch.Tensor,
                           calibration: dict) -> torch.Tensor:
    """Calibrated decision probabilities ``[rows, slots]`` (padded slots 0), upstream's rule
    (see :data:`PROBABILITY_RULE_SOURCE`): softmax over the row's options of logits / t."""
    valid = marker_mask.to(logits.device) != 0
    t = decision_temperatures(qtype, marker_mask, calibration).to(logits.device)
    z = (logits.float() / t[:, None]).masked_fill(~valid, float("-inf"))
    return torch.softmax(z, -1)


def head_probabilities(head: str, logits: torch.Tensor, batch: dict, calibration: dict) -> torch.Tensor:
    if head == "decision":
        return decision_probabilities(logits, batch["qtype"], batch["marker_mask"], calibration)
    return torch.softmax(logits.float(), -1)


def compare_heads(ref: dict, got: dict, batch: dict, calibration: dict) -> dict:
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
        prob = (head_probabilities(head, r, batch, calibration)
                - head_probabilities(head, g, batch, calibration)).abs().amax(-1)
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


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


IQR_THRESHOLD = 0.1  # adaptive timing stops once the blocks' IQR is under 10 % of their median


def time_calls(fn, args: tuple, timing: dict, device: str) -> dict:
    """Per-call milliseconds of ``fn(*args)`` timed to a budget with ``torch.utils.benchmark``:
    ``timing.warmup`` calls, then ``blocked_autorange(min_run_time=timing.min_run_time_s)``,
    or with ``timing.max_run_time_s`` ``adaptive_autorange`` (at least four blocks, until
    their IQR is under ``IQR_THRESHOLD`` of the median or ``max_run_time_s`` has passed).

    The clock synchronises ``device`` before each reading, so a block's time covers every
    CUDA kernel its calls launched; the torch thread count is left as the process has it
    (the Timer's default would time single-threaded).  Returns the median and IQR of the
    per-call times of the blocks, how many calls they rest on (``runs`` = blocks x
    ``block_size``) and each block's mean.
    """
    from torch.utils.benchmark import Timer

    def clock() -> float:
        synchronize(device)
        return time.perf_counter()

    with torch.inference_mode():
        for _ in range(timing["warmup"]):
            fn(*args)
        synchronize(device)
        timer = Timer("fn(*args)", globals={"fn": fn, "args": args}, timer=clock,
                      num_threads=torch.get_num_threads())
        if timing.get("max_run_time_s"):
            m = timer.adaptive_autorange(threshold=IQR_THRESHOLD, min_run_time=timing["min_run_time_s"],
                                         max_run_time=timing["max_run_time_s"])
        else:
            m = timer.blocked_autorange(min_run_time=timing["min_run_time_s"])
    return {"median_ms": m.median * 1e3, "iqr_ms": m.iqr * 1e3, "runs": m.number_per_run * len(m.raw_times),
            "block_size": m.number_per_run, "blocks_ms": [t * 1e3 / m.number_per_run for t in m.raw_times]}


def list_tree(root) -> list[dict]:
    """Files under ``root`` (relative path and size), sorted."""
    found = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            full = os.path.join(dirpath, name)
            found.append({"path": os.path.relpath(full, root), "bytes": os.path.getsize(full)})
    return sorted(found, key=lambda f: f["path"])


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


def run_batches(fn, batches: list[dict], arg_names, device: str) -> list[dict]:
    """``fn`` on every batch (inference mode), outputs detached on the CPU."""
    with torch.inference_mode():
        return [outputs_dict(fn(*batch_args(b, arg_names, device))) for b in batches]


# ------------------------------------------------------------------------ CPU vector ISAs

def _compiler_identity() -> str:
    from torch._inductor.cpp_builder import get_cpp_compiler

    cxx = get_cpp_compiler()
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    return f"{cxx}: {(out.stdout.splitlines() or [''])[0]}"


def vec_isa_key() -> str:
    """What Inductor's answer to "which CPU vector ISAs can be built and loaded here" depends
    on: torch, the C++ compiler, the CPU's vector features and the architecture."""
    facts = {"torch": torch.__version__, "cxx": _compiler_identity(), "cpu": cpu_isa_flags(),
             "machine": platform.machine()}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]


def check_vec_isas(root) -> list[str]:
    """Inductor's own check of the CPU vector ISAs (``cpu_vec_isa.valid_vec_isa_list``: a dry
    compile and load of a test kernel per ISA, ~12 s), run with its cache at
    ``root/<vec_isa_key()>`` instead of the process's ``TORCHINDUCTOR_CACHE_DIR``.

    The check's products are keyed by their source and flags, so a later process with the same
    torch, compiler and CPU finds them built and only loads them (Inductor's own warm-cache
    path): the answer is Inductor's, paid once per toolchain instead of once per compile.  The
    answer stays cached in this process (torch caches it), so the compile that follows asks
    nothing again; the build's own (empty) cache is untouched.  Serialised by a lock."""
    from torch._inductor import cpu_vec_isa

    folder = Path(root) / vec_isa_key()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.with_suffix(".lock"), "w") as lock, _env("TORCHINDUCTOR_CACHE_DIR", str(folder)):
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]
        picked = str(cpu_vec_isa.pick_vec_isa())
    print(f"CPU vector ISAs: {', '.join(found) or 'none'} (picked {picked or 'none'}; checked in {folder})", flush=True)
    return found


@contextlib.contextmanager
def _env(name: str, value: str):
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
