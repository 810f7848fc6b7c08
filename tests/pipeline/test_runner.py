"""The process runner (``laya_build.runner``): fork-server children, what they report, and one
server per build shared by doit's parallel workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from laya_build import runner
from laya_build.errors import ConfigError, StageFailed
from laya_build.runner import Child, forkserver
from tests.pipeline.runner_jobs import stat_fields

ROOT = Path(__file__).resolve().parents[2]
JOBS = "tests.pipeline.runner_jobs"


def _run(function: str, spec: dict | None = None, **kw):
    return runner.run(f"{JOBS}:{function}", spec or {}, Child(fork=True, **kw), result=True)


def test_concurrent_requests_get_children_of_one_server_each_from_a_clean_state(monkeypatch):
    # threads that all ask first make one place and start one server (a slow place widens the
    # window: without the lock four threads made four servers)
    monkeypatch.setattr(forkserver, "_PLACE", None)
    make = forkserver.ServerPlace.__init__

    def slow_place(self):
        time.sleep(0.2)
        make(self)

    monkeypatch.setattr(forkserver.ServerPlace, "__init__", slow_place)
    with ThreadPoolExecutor(4) as pool:
        seen = list(pool.map(lambda _: _run("where"), range(8)))
    assert len({s["server"] for s in seen}) == 1
    assert len({s["child"] for s in seen}) == 8 and os.getpid() not in {s["child"] for s in seen}
    assert _run("mark", {"mark": "first"}) is None
    assert _run("mark", {"mark": "second"}) is None, "a child saw what an earlier child left"


def test_a_child_killed_by_a_signal_fails_naming_it():
    with pytest.raises(StageFailed, match="killed by signal SIGKILL"):
        _run("crash")


def test_an_error_in_the_child_is_reported_with_its_type_and_message():
    with pytest.raises(StageFailed, match=r"ConfigError: export\.dims\.rows\.max: 0 is below min 1"):
        _run("refuse", {"value": 0})
    with pytest.raises(ConfigError, match=r"export\.dims\.rows\.max: 0 is below min 1"):
        _run("refuse", {"value": 0}, reraise=True)


def test_a_fork_server_childs_lines_are_shown_while_it_runs_and_once(tmp_path, capsys):
    # a stage's progress (a wait for another build's compile folder, a long compile) must reach the
    # build's output while it lasts, not when it has ended: a build stopped meanwhile shows none
    go = tmp_path / "go"
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(_run, "say_then_wait", {"go": str(go)})
        seen, deadline = "", time.monotonic() + 60
        while "progress: waiting for the go file" not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
            seen += capsys.readouterr().out
        assert "progress: waiting for the go file" in seen, "the child's line was not shown while it ran"
        assert not running.done()
        go.touch()
        assert running.result(timeout=60) == "went"
    seen += capsys.readouterr().out
    assert seen.splitlines() == [
        "progress: waiting for the go file",
        "progress: done",
        "last words without a newline",
    ]


def test_a_failing_fork_server_childs_lines_are_shown_and_its_error_raised_once(capsys):
    with pytest.raises(StageFailed, match=r"ConfigError: export\.dims\.rows\.max: 0 is below min 1") as failed:
        _run("say_then_fail")
    out = capsys.readouterr().out
    assert out.splitlines() == ["progress: about to refuse"]  # the error line is the exception's alone
    assert "LAYA-ERROR" not in out and "below min 1" in str(failed.value)


def test_a_fork_server_child_with_a_log_of_its_own_keeps_both_streams_in_it_in_order(tmp_path, capsys):
    log = tmp_path / "stage.log"
    with pytest.raises(StageFailed, match=r"ConfigError: export\.dims\.rows\.max: 0 is below min 1"):
        _run("say_then_fail", log=str(log))
    text = log.read_text()
    assert text.startswith("progress: about to refuse\nTraceback (most recent call last):"), text
    assert "LAYA-ERROR ConfigError" in text and "progress" not in capsys.readouterr().out


def _alive(pid: int) -> bool:
    try:
        return stat_fields(pid)[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_server_ends_with_the_process_that_started_it():
    code = (
        "import json; from laya_build.runner import Child, forkserver, run; "
        f"print(json.dumps({{**run({JOBS!r} + ':where', {{}}, Child(fork=True), result=True), "
        "'folder': str(forkserver._PLACE.folder)}))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout.splitlines()[-1])
    deadline = time.monotonic() + 30
    while _alive(seen["server"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(seen["server"]), "the fork server outlived its build"
    assert not Path(seen["folder"]).exists()


def test_a_preload_that_does_not_import_is_left_to_the_stages_that_need_it(tmp_path):
    """A machine that only packages may have TileLang without its native libraries: the fork
    server says it did not preload it and serves every other stage."""
    broken = tmp_path / "site" / "tilelang"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise OSError('libz3.so.4.15: cannot open shared object file')\n")
    code = (
        "import json; from laya_build.runner import Child, run; "
        f"print(json.dumps(run({JOBS!r} + ':where', {{}}, Child(fork=True), result=True)))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["child"] != seen["server"]  # a fork-server child ran it
    assert "not preloaded: tilelang (OSError: libz3.so.4.15: cannot open shared object file)" in out.stderr


DODO = """
import json, os
from laya_build.runner import Child, run
if os.environ["SHARE"] == "1":
    from laya_build.tasks import dispatch
    dispatch.install()

DOIT_CONFIG = {"backend": "json", "dep_file": ".doit.json"}

def where(name):
    def act():
        seen = run("tests.pipeline.runner_jobs:where", {}, Child(fork=True), result=True)
        with open(name + ".json", "w") as f:
            json.dump({**seen, "worker": os.getpid()}, f)
    return act

def task_job():
    for name in ("a", "b"):
        yield {"name": name, "actions": [where(name)], "uptodate": [False]}
"""


@pytest.mark.parametrize("share", [True, False], ids=["laya-build", "doit-alone"])
def test_parallel_workers_share_one_fork_server(tmp_path, share):
    (tmp_path / "dodo.py").write_text(DODO)
    env = {**os.environ, "SHARE": "1" if share else "0", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "doit", "-n", "2", "job"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("a", "b"))
    assert a["worker"] != b["worker"], "each worker ran one of the two tasks"
    assert (a["server"] == b["server"]) is share


def test_a_new_place_removes_those_of_ended_processes():
    """A killed build leaves its place folder behind; the next place made removes it (and leaves
    those of live processes alone)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    place = forkserver.ServerPlace()
    root = place.folder.parent
    stale = root / f"{dead.pid}-left"
    stale.mkdir()
    (stale / "0123.sock").write_text("")
    live = root / f"{os.getpid()}-live"
    live.mkdir(exist_ok=True)
    try:
        forkserver.ServerPlace()._remove()
        assert not stale.exists() and live.exists() and place.folder.exists()
    finally:
        live.rmdir()
        place._remove()


@pytest.mark.parametrize("process", ["inline", "fork", "fresh"])
def test_every_stage_process_and_what_it_starts_have_the_stage_environment(process):
    """An inline stage (run in doit's process) gets its environment and LAYA_TASK as a stage
    process does, for itself and the processes it starts; doit's environment is as it was after."""
    from laya_build.runner.stage import run_stage
    from laya_build.stage import Stage

    names = ["LAYA_TEST_STAGE_ENV", "LAYA_TASK"]
    stage = Stage(
        basename="probe",
        name="env",
        doc="environment",
        entry="tests.pipeline.runner_jobs:environment_seen",
        spec={"names": names},
        process=process,
        env={"LAYA_TEST_STAGE_ENV": "set"},
    )
    before = {n: os.environ.get(n) for n in names}
    seen = run_stage(stage)
    assert seen["stage"] == seen["child"] == {"LAYA_TEST_STAGE_ENV": "set", "LAYA_TASK": "probe:env"}
    assert {n: os.environ.get(n) for n in names} == before
