"""Jobs for tests/pipeline/test_runner.py, run in fork-server children."""

from __future__ import annotations

import os
import signal
import sys

from laya_build.errors import ConfigError


def stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` after the command name: state, ppid, ..."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()


def _ppid(pid: int) -> int:
    return int(stat_fields(pid)[1])


def where(**spec) -> dict:
    """This child's pid and its fork server's (the child's parent is the server's handler)."""
    return {"child": os.getpid(), "server": _ppid(os.getppid())}


def mark(**spec) -> str | None:
    """Leave state in this process; a later child must not see it."""
    seen = getattr(sys, "_laya_mark", None)
    sys._laya_mark = spec["mark"]
    return seen


def crash(**spec) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def refuse(**spec) -> None:
    raise ConfigError(f"export.dims.rows.max: {spec['value']} is below min 1")


def spawn_and_sleep(**spec) -> None:
    """Start a long ``sleep`` (standing for a compiler), write ``<this pid> <its pid>`` to
    ``spec["pidfile"]``, then wait."""
    import subprocess
    import time

    sleeper = subprocess.Popen(["sleep", "600"])
    with open(spec["pidfile"] + ".tmp", "w") as fh:
        fh.write(f"{os.getpid()} {sleeper.pid}")
    os.replace(spec["pidfile"] + ".tmp", spec["pidfile"])
    time.sleep(600)


def environment_seen(**spec) -> dict:
    """What a stage, and a process it starts, find in the environment."""
    import subprocess

    names = spec["names"]
    code = f"import json, os; print(json.dumps({{n: os.environ.get(n) for n in {names!r}}}))"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import json

    return {"stage": {n: os.environ.get(n) for n in names}, "child": json.loads(child.stdout)}


def say_then_wait(**spec) -> str:
    """Print a progress line, then wait until the file ``spec["go"]`` exists (a stage waiting
    for a lock or a compile); a line without its newline last."""
    import time
    from pathlib import Path

    print("progress: waiting for the go file", flush=True)
    while not Path(spec["go"]).exists():
        time.sleep(0.05)
    print("progress: done", flush=True)
    sys.stdout.write("last words without a newline")
    return "went"


def say_then_fail(**spec) -> None:
    print("progress: about to refuse", flush=True)
    raise ConfigError("export.dims.rows.max: 0 is below min 1")
