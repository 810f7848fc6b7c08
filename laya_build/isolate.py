"""Run a stage function in a fresh Python process.

Compiling stages run here rather than in the doit process because TileLang renames
PrimFuncs whose names collide within one process (which changes generated source), because
CUDA cannot be re-initialised in a forked worker, and because a crashing native compiler
must not take the build down with it.

Protocol: the parent sends ``{"module", "function", "spec", "record"}`` as JSON on stdin;
the child imports ``module``, calls ``function(spec)`` and, if ``record`` is set, validates
and writes the returned record there.  A failure in the child is reported as one
``LAYA-ERROR <type>: <message>`` line on stderr, which the parent re-raises as
:class:`StageFailed` with that message.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path

from . import PROJECT_ROOT

ERROR_PREFIX = "LAYA-ERROR "


class StageFailed(RuntimeError):
    """A stage failed in its own process; the message is the child's error."""


def child_env(env: dict | None = None) -> dict:
    """Environment of a stage process: offline, the project importable, a fixed hash seed."""
    out = dict(os.environ)
    paths = [str(PROJECT_ROOT)]
    if out.get("PYTHONPATH"):
        paths.append(out["PYTHONPATH"])
    out["PYTHONPATH"] = os.pathsep.join(paths)
    out["HF_HUB_OFFLINE"] = "1"
    out["TRANSFORMERS_OFFLINE"] = "1"
    # Reproducible outputs: with a random str hash seed, torch.export orders some nodes by
    # set iteration (the two rotary inv_freq buffers of ModernBERT), so exported.pt2 bytes
    # changed from run to run.
    out["PYTHONHASHSEED"] = "0"
    out.update(env or {})
    return out


def run(module: str, function: str, spec: dict, *, record: str | os.PathLike | None = None,
        extra_path: list[str] | None = None, env: dict | None = None, label: str | None = None,
        kwargs: bool = False) -> None:
    """Run ``module.function(spec)`` (``function(**spec)`` with ``kwargs=True``) in a new
    interpreter; raise :class:`StageFailed` on failure."""
    payload = json.dumps({"module": module, "function": function,
                          "spec": spec, "call": "kwargs" if kwargs else "spec",
                          "record": str(record) if record else None, "sys_path": list(extra_path or [])})
    proc = subprocess.Popen([sys.executable, "-m", "laya_build.isolate"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=PROJECT_ROOT,
                            env=child_env(env))
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True)
    reader.start()
    proc.stdin.write(payload)
    proc.stdin.close()
    for line in proc.stdout:  # progress lines of long stages, shown as they come
        print(line, end="", flush=True)
    proc.wait()
    reader.join()
    if proc.returncode == 0:
        return
    what = label or f"{module}.{function}"
    err_text = "".join(stderr)
    errors = [line[len(ERROR_PREFIX):] for line in err_text.splitlines() if line.startswith(ERROR_PREFIX)]
    if errors:
        raise StageFailed(f"{what}: {errors[-1]}")
    if proc.returncode < 0:
        reason = f"killed by signal {signal.Signals(-proc.returncode).name}"
    else:
        reason = f"exit status {proc.returncode}"
    tail = "\n".join(err_text.strip().splitlines()[-20:])
    raise StageFailed(f"{what}: process failed ({reason})\n{tail}")


def _main() -> int:
    request = json.loads(sys.stdin.read())
    # ``python -m`` puts the working directory first on sys.path; paths the parent asked for
    # (a baseline revision's kernels/) must win over the project's own.
    sys.path[:0] = request.get("sys_path", [])
    try:
        func = getattr(importlib.import_module(request["module"]), request["function"])
        spec = request["spec"]
        record = func(**spec) if request["call"] == "kwargs" else func(spec)
        if request.get("record"):
            from .records import write_record

            write_record(Path(request["record"]), record)
    except Exception as exc:  # reported to the parent, which raises StageFailed
        traceback.print_exc()
        message = str(exc).replace("\n", " | ")
        print(f"{ERROR_PREFIX}{type(exc).__name__}: {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main())
