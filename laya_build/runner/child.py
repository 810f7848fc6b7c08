"""The child side of the runner's protocol: the environment of a stage process, and running
one request in it (a fresh interpreter, ``python -m laya_build.runner``, or a fork-server child)."""

from __future__ import annotations

import errno
import importlib
import json
import os
import sys
import traceback
from pathlib import Path

from laya_build import PROJECT_ROOT, errors

ERROR_PREFIX = "LAYA-ERROR "


def child_env(env: dict | None = None) -> dict:
    """Environment of a stage process: offline, the project importable, a fixed hash seed.
    ``env`` goes on top, but for its ``PYTHONPATH``, which goes first on the process's own."""
    out = dict(os.environ)
    env = dict(env or {})
    paths = [env.pop("PYTHONPATH", ""), str(PROJECT_ROOT), out.get("PYTHONPATH", "")]
    out["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    out["HF_HUB_OFFLINE"] = "1"
    out["TRANSFORMERS_OFFLINE"] = "1"
    # Reproducible outputs: with a random str hash seed, torch.export orders some nodes by
    # set iteration (the two rotary inv_freq buffers of ModernBERT), so exported.pt2 bytes
    # changed from run to run.
    out["PYTHONHASHSEED"] = "0"
    out["PYTHONUNBUFFERED"] = "1"
    out.update(env)
    return out


def _write_json(path: str, obj) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


def execute(request: dict) -> int:
    """Run one request in this process (a fresh interpreter or a forked child)."""
    # ``python -m`` puts the working directory first on sys.path; paths the parent asked for
    # (a baseline revision's kernels/) must win over the project's own.
    sys.path[:0] = request.get("sys_path", [])
    if request.get("task"):
        os.environ["LAYA_TASK"] = request["task"]
    try:
        module, function = request["entry"].split(":", 1)
        value = getattr(importlib.import_module(module), function)(**request["spec"])
        if request.get("record"):
            from laya_build.records import write_record

            write_record(Path(request["record"]), value)
        if request.get("result"):
            _write_json(request["result"], value)
    except Exception as exc:  # reported to the parent (StageFailed, or the class itself)
        traceback.print_exc()
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            exc = errors.DiskFullError(f"{exc.filename or 'a file'}: {os.strerror(exc.errno)}")
        message = errors.message_of(exc)
        print(f"{ERROR_PREFIX}{type(exc).__name__}: {message}".replace("\n", " | "), file=sys.stderr)
        _write_json(
            request["error"], {"type": type(exc).__name__, "message": message, "hint": getattr(exc, "hint", None)}
        )
        return 1
    return 0
