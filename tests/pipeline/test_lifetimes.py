"""No process of a stage outlives what it was started for: a timeout ends the stage's whole
process group (the compilers it started included), and a stage whose parent dies (a doit
worker killed with SIGKILL) ends with its group, forked from the fork server or fresh.  The
process table says what is left; a ``sleep`` stands for a compiler."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from laya_build.errors import StageError
from laya_build.runner import Child, run

ROOT = Path(__file__).resolve().parents[2]
JOB = "tests.pipeline.runner_jobs:spawn_and_sleep"


def _pids(pidfile: Path, timeout: float = 120) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pidfile.is_file():
            return [int(p) for p in pidfile.read_text().split()]
        time.sleep(0.05)
    raise AssertionError("the job did not start")


def _gone(pids: list[int], timeout: float = 15) -> list[int]:
    """The pids still running (not zombies) after waiting up to ``timeout`` for them to end."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def test_a_timeout_ends_the_stage_and_what_it_started(tmp_path):
    pidfile = tmp_path / "pids"
    # long enough for a fresh interpreter to start its job on a loaded machine
    with pytest.raises(StageError, match=r"ran past its 15 s timeout; its process group was ended"):
        run(JOB, {"pidfile": str(pidfile)}, Child(timeout=15, label="sleeper"))
    assert _gone(_pids(pidfile)) == []


@pytest.mark.parametrize("fork", [False, True], ids=["fresh", "forked"])
def test_a_stage_ends_with_its_parent(tmp_path, fork):
    pidfile = tmp_path / "pids"
    code = (
        "import sys; from laya_build.runner import Child, run; "
        f"run({JOB!r}, {{'pidfile': {str(pidfile)!r}}}, Child(fork={fork}))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env)
    try:
        stage, sleeper = _pids(pidfile)
        assert psutil.Process(sleeper).ppid() == stage
        parent.send_signal(signal.SIGKILL)  # as a doit worker killed with SIGKILL
        parent.wait()
        assert _gone([stage, sleeper]) == [], json.dumps({"stage": stage, "sleeper": sleeper})
    finally:
        if parent.poll() is None:
            parent.kill()
