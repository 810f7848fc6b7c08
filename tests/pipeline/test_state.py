"""doit's task state across a killed build (``laya_build.tasks.state``): a task that finished
before the kill stays done; with doit's own sqlite3 backend the next run does it again."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from laya_build.tasks import doit_config, load_pipeline, state
from tests.pipeline.project import DoitRun, start_doit

DODO = """
import os, time
from pathlib import Path

if os.environ["COMMIT_EACH_TASK"] == "1":
    from laya_build.tasks import state
    state.install()

DOIT_CONFIG = {"backend": "sqlite3", "dep_file": ".doit.db"}

def task_first():
    def act():
        Path("first.out").write_text(Path("in.txt").read_text())
    return {"actions": [act], "file_dep": ["in.txt"], "targets": ["first.out"]}

def task_second():  # started, then killed (its marker says when); quick on the next run
    def act():
        Path("second.started").write_text("")
        time.sleep(float(os.environ["SECOND_SECONDS"]))
        Path("second.out").write_text(Path("first.out").read_text())
    return {"actions": [act], "file_dep": ["first.out"], "targets": ["second.out"]}
"""


def _doit(path, commit_each_task: bool, seconds: float, *args: str) -> subprocess.Popen:
    env = {"COMMIT_EACH_TASK": "1" if commit_each_task else "0", "SECOND_SECONDS": str(seconds)}
    return start_doit(path, *args, env=env)


@pytest.mark.parametrize("commit_each_task", [True, False], ids=["laya-build", "doit-alone"])
def test_a_task_finished_before_a_kill_stays_done(tmp_path, commit_each_task):
    (tmp_path / "dodo.py").write_text(DODO)
    (tmp_path / "in.txt").write_text("input\n")
    run = _doit(tmp_path, commit_each_task, 60, "-n", "1", "second")
    deadline = time.monotonic() + 60
    while not (tmp_path / "second.started").exists():
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0]
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGKILL)  # the whole run, mid-task: no dump at the end
    run.wait()
    proc = _doit(tmp_path, commit_each_task, 0, "second")
    out = proc.communicate(timeout=60)[0]
    rerun = DoitRun(proc.returncode, out, "")
    assert rerun.returncode == 0, rerun.stdout
    if commit_each_task:
        assert (rerun.executed, rerun.up_to_date) == (["second"], ["first"]), rerun.stdout
    else:  # doit's own backend forgot the whole killed run
        assert (rerun.executed, rerun.up_to_date) == (["first", "second"], []), rerun.stdout


def test_building_the_task_graph_installs_it():
    """``laya_build.tasks`` (what dodo.py imports) installs it, once, on doit's sqlite3 backend."""
    from doit.dependency import SqliteDB

    assert doit_config(load_pipeline())["backend"] == "sqlite3" and state.installed()
    state.install()
    assert SqliteDB.set.__wrapped__ is state._SET, "installed twice: the commit would wrap itself"
