"""``laya_build.locks.held`` with a holder: who holds a lock is named to a process that waits for it,
and only while it holds it.  Real processes holding real lock files."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from laya_build import locks

HOLD = """
import sys, time
from pathlib import Path
from laya_build.locks import held
with held(sys.argv[1], "the test's lock", holder="aoti_package:cpu-float32 in /a/checkout"):
    Path(sys.argv[2]).write_text("held")
    deadline = time.monotonic() + 120
    while not Path(sys.argv[3]).exists() and time.monotonic() < deadline:  # until the test lets go
        time.sleep(0.02)
"""
ROOT = Path(__file__).resolve().parents[2]


def _hold(lock: Path, marker: Path, release: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), str(marker), str(release)], cwd=ROOT)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    return proc


def test_a_waiter_names_the_holder_and_the_holder_leaves_no_name_behind(tmp_path, capsys, monkeypatch):
    lock, release = tmp_path / "x.lock", tmp_path / "release"
    holder = _hold(lock, tmp_path / "held", release)
    said = locks.log.info
    # the holder lets go once this process has said whom it waits for
    monkeypatch.setattr(locks.log, "info", lambda message, *a, **k: (said(message, *a, **k), release.touch()))
    with locks.held(lock, "the test's lock", holder="me"):
        out = capsys.readouterr().out
        # the holder's name is gone with it; this process's stands while it holds the lock
        assert locks._holder(lock).startswith(f"pid {os.getpid()}, `me`, started ")
        assert oct((tmp_path / "x.lock.holder.json").stat().st_mode & 0o777) == "0o600"
    holder.wait(timeout=60)
    assert f"waiting for the test's lock (lock {lock}, held by pid {holder.pid}, " in out
    assert "`aoti_package:cpu-float32 in /a/checkout`, started " in out
    assert not (tmp_path / "x.lock.holder.json").exists()


def test_a_name_left_by_a_process_that_ended_names_no_one(tmp_path):
    lock = tmp_path / "x.lock"
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    started = time.time()
    (tmp_path / "x.lock.holder.json").write_text(
        f'{{"pid": {ended.stdout.strip()}, "command": "c", "started": {started}}}'
    )
    assert locks._holder(lock) == "a process that has not said who it is"


def test_a_name_that_cannot_be_written_holds_up_nothing(tmp_path, capsys):
    lock = tmp_path / "x.lock"
    (tmp_path / "x.lock.holder.json").mkdir()  # e.g. what another user left in a shared folder
    with locks.held(lock, "the test's lock", holder="me"):
        entered = True
    assert entered and (tmp_path / "x.lock.holder.json").is_dir()
    assert capsys.readouterr().out == ""
