"""A build stopped before its end removes what its processes were writing (``laya_build.tasks.run``).

A tiny dodo with the project's run installed (its version lock, its sweep of half-written files)
and a task whose process writes a file under an atomic write's temporary name and stays
there, as a stage's process does while it writes a package.  The build is then stopped: by a
full disk when doit writes a task's state (a real tmpfs, filled by another task), and by SIGTERM.
Each time no process of the build is left and the temporary file is gone; a run that waits for
the version's lock, stopped, removes nothing of the run that holds it.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.pipeline.project import start_doit

DODO = """
import os, subprocess, sys, time
from pathlib import Path

from laya_build.locks import run_lock
from laya_build.runner.stage import remove_partial_files
from laya_build.tasks import run, state

DISK = Path(os.environ["DISK"])
state.install()
run.install(
    lambda selected: None,
    lambda: run_lock(Path("version.lock"), "the version"),
    lambda: remove_partial_files([DISK / "out"]),
)
DOIT_CONFIG = {"backend": "sqlite3", "dep_file": str(DISK / "state.db")}
WRITER = '''
import os, sys, time
with open(sys.argv[1], "wb") as f:
    f.write(b"x" * 4096)
    f.flush()
    Path = __import__("pathlib").Path
    Path(sys.argv[2]).write_text(str(os.getpid()))
    time.sleep(120)
'''

def task_write():  # a stage's process, writing its output under a temporary name
    def act():
        (DISK / "out").mkdir(exist_ok=True)
        tmp = DISK / "out" / ".decision.pt2.k2j4h5g6.tmp"
        subprocess.run([sys.executable, "-c", WRITER, str(tmp), os.environ["WRITER_PID"]], check=True)
    return {"actions": [act], "targets": [str(DISK / "out" / "decision.pt2")]}

def task_fill():  # fills the disk when the test says so, then succeeds: doit cannot write the task's state
    def act():
        while not Path(os.environ["FILL_NOW"]).exists():
            time.sleep(0.05)
        fd = os.open(DISK / "fill.bin", os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, bytes(65536))
        except OSError:
            pass
        os.close(fd)
    return {"actions": [act], "targets": [str(DISK / "fill.bin")]}
"""


def _start(path: Path, disk: Path, pid_file: Path, *args: str) -> subprocess.Popen:
    env = {"DISK": str(disk), "WRITER_PID": str(pid_file), "FILL_NOW": str(path / "fill-now")}
    return start_doit(path, *args, env=env)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the writer never started"
        time.sleep(0.05)
    return int(path.read_text())


def _gone(pid: int) -> bool:
    for _ in range(50):  # a killed process is reaped by init a moment later
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def _project(tmp_path: Path) -> Path:
    (tmp_path / "dodo.py").write_text(DODO)
    return tmp_path


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {mount.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_build_whose_state_cannot_be_written_stops_and_leaves_nothing_half_written(tmp_path, small_disk):
    project, pid_file = _project(tmp_path), tmp_path / "writer.pid"
    run = _start(project, small_disk, pid_file, "-n", "2", "write", "fill")
    writer = _wait_for(pid_file, run)
    assert (small_disk / "out" / ".decision.pt2.k2j4h5g6.tmp").is_file()
    (project / "fill-now").touch()  # only now, so the build cannot stop before the file is seen
    out = run.communicate(timeout=120)[0]
    assert run.returncode == 1, out
    said = [line for line in out.splitlines() if line.startswith("laya-build: ")]
    assert len(said) == 1, out
    assert said[0].startswith(
        f"laya-build: DiskFullError: {small_disk / 'state.db'}: doit's task state cannot be written ("
    ), out
    assert "Traceback" not in out, out
    assert list((small_disk / "out").iterdir()) == [], "the writer's temporary file was removed"
    assert _gone(writer), "the writer was stopped with the build"


def test_sigterm_removes_the_runs_half_written_files_and_a_run_waiting_for_its_lock_removes_none(tmp_path):
    project, disk, pid_file = _project(tmp_path), tmp_path / "disk", tmp_path / "writer.pid"
    disk.mkdir()
    holder = _start(project, disk, pid_file, "-n", "1", "write")
    writer = _wait_for(pid_file, holder)
    tmp = disk / "out" / ".decision.pt2.k2j4h5g6.tmp"

    waiting = _start(project, disk, tmp_path / "second-writer.pid", "-n", "1", "write")
    lines = []
    for line in waiting.stdout:  # it says whom it waits for, then waits
        lines.append(line)
        if "waiting" in line:
            break
    assert any("another doit run in this checkout builds the version" in line for line in lines), lines
    waiting.send_signal(signal.SIGTERM)
    out = "".join(lines) + waiting.communicate(timeout=60)[0]
    assert waiting.returncode == 128 + signal.SIGTERM, out
    assert "build interrupted by SIGTERM" in out
    assert tmp.is_file() and holder.poll() is None and not _gone(writer), "the waiting run took nothing of the other"

    holder.send_signal(signal.SIGTERM)
    out = holder.communicate(timeout=60)[0]
    assert holder.returncode == 128 + signal.SIGTERM, out
    assert list((disk / "out").iterdir()) == [], "the interrupted run removed its temporary file"
    assert _gone(writer)
