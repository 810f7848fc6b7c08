"""doit's task state across a killed build (``laya_build.tasks.state``): a task that finished
before the kill stays done; with doit's own sqlite3 backend the next run does it again."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from importlib import metadata

import pytest

from laya_build.errors import InstallError
from laya_build.tasks import doit_config, load_pipeline, state
from tests.pipeline.project import TASK_LINE

DODO = '''
import os, time
from pathlib import Path

DOIT_CONFIG = {"backend": os.environ["BACKEND"], "dep_file": ".doit.db"}

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
'''


def _doit(path, backend: str, seconds: float, *args: str) -> subprocess.Popen:
    env = {**os.environ, "BACKEND": backend, "SECOND_SECONDS": str(seconds)}
    return subprocess.Popen([sys.executable, "-m", "doit", *args], cwd=path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.mark.parametrize("backend", [state.NAME, "sqlite3"])
def test_a_task_finished_before_a_kill_stays_done(tmp_path, backend):
    (tmp_path / "dodo.py").write_text(DODO)
    (tmp_path / "in.txt").write_text("input\n")
    run = _doit(tmp_path, backend, 60, "-n", "1", "second")
    deadline = time.monotonic() + 60
    while not (tmp_path / "second.started").exists():
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0]
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGKILL)  # the whole run, mid-task: no dump at the end
    run.wait()
    rerun = _doit(tmp_path, backend, 0, "second")
    out = rerun.communicate(timeout=60)[0]
    assert rerun.returncode == 0, out
    executed = [m.group(2) for line in out.splitlines() if (m := TASK_LINE.match(line)) and m.group(1) == "."]
    up_to_date = [m.group(2) for line in out.splitlines() if (m := TASK_LINE.match(line)) and m.group(1) == "--"]
    if backend == state.NAME:
        assert (executed, up_to_date) == (["second"], ["first"]), out
    else:  # doit's own backend forgot the whole killed run
        assert (executed, up_to_date) == (["first", "second"], []), out


def test_the_pipeline_uses_it_and_doit_finds_it_by_entry_point():
    assert doit_config(load_pipeline())["backend"] == state.NAME
    (point,) = metadata.entry_points(group=state.GROUP, name=state.NAME)  # wherever doit runs from
    assert point.load() is state.TaskStateDB


def test_a_missing_registration_is_named_before_doit_fails_on_it(monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(state.metadata, "distribution", not_installed)
    with pytest.raises(InstallError, match=r"backend 'sqlite3-task' is not registered .*pip install .*-e \."):
        doit_config(load_pipeline())
