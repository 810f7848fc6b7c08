"""The saved-input and eager-output formats of a decision program, and calling a program on
saved batches (torch and the standard library only: the fresh verification process imports it;
torch is imported by the functions that call it, so that the verification's parent process, which
reads the constants, imports none)."""

from __future__ import annotations

import os

HEADS = ("decision", "act")
INPUTS_FORMAT = 2  # 2: upstream build_sequence tokenisation and the checkpoint's "calibration"
EAGER_FORMAT = 1


def load_weights_only(path, what: str, fmt: int) -> dict:
    import torch

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


def list_tree(root) -> list[dict]:
    """Files under ``root`` (relative path and size), sorted."""
    found = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            full = os.path.join(dirpath, name)
            found.append({"path": os.path.relpath(full, root), "bytes": os.path.getsize(full)})
    return sorted(found, key=lambda f: f["path"])


def run_batches(fn, batches: list[dict], arg_names, device: str) -> list[dict]:
    """``fn`` on every batch (inference mode), outputs detached on the CPU."""
    import torch

    with torch.inference_mode():
        return [outputs_dict(fn(*batch_args(b, arg_names, device))) for b in batches]
