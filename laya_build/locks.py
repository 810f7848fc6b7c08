"""File locks that say what they wait for (``filelock``): between the processes of a build, the
builds of a user, and the ``doit`` runs of a checkout."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

from filelock import FileLock, Timeout

from laya_build.errors import BuildBusyError
from laya_build.log import get_logger

log = get_logger(__name__)


@contextlib.contextmanager
def held(path: str | os.PathLike, what: str, mode: int = 0o600, holder: str | None = None):
    """Hold the lock file ``path`` (created if missing, with ``mode``) for the block.  When
    another process holds it, say once what this process waits for, then wait.  With ``holder``
    (what this process is, e.g. a task and its checkout) the holder of the lock is named: each one
    writes its pid, ``holder`` and start beside the lock once it has it (readable by its user
    alone; a file that cannot be written names no one, and holds up nothing) and removes it
    before letting go, and a waiter says whom it waits for."""
    path = Path(path)
    lock = FileLock(str(path), mode=mode)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        whom = _holder(path) if holder is not None else "another process"
        log.info(f"[laya] waiting for {what} (lock {path}, held by {whom})")
        lock.acquire()
    named = False
    try:
        if holder is not None:
            named = _name_holder(path, holder)
        yield
    finally:
        if named:
            with contextlib.suppress(OSError):
                _holder_file(path).unlink()
        lock.release()


def _name_holder(path: Path, holder: str) -> bool:
    """Write who holds the lock ``path`` beside it: whether it was written."""
    from laya_build.atomic import write_json

    info = {"pid": os.getpid(), "command": holder, "started": time.time()}
    try:
        os.chmod(write_json(_holder_file(path), info), 0o600)
    except OSError as exc:  # a full disk, or a file of this name another user left in a shared folder
        log.debug(f"[laya] the holder of {path} is not named: {exc}")
        return False
    return True


def _holder_file(path: Path) -> Path:
    return path.with_name(path.name + ".holder.json")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def _holder(path: Path) -> str:
    """Who holds the lock ``path``, as its holder wrote it (a process that has ended holds nothing)."""
    unsaid = "a process that has not said who it is"
    try:
        info = json.loads(_holder_file(path).read_text())
        if not _alive(int(info["pid"])):
            return unsaid
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(info["started"]))
        return f"pid {info['pid']}, `{info['command']}`, started {started}"
    except (OSError, ValueError, KeyError, TypeError, OverflowError):
        return unsaid


@contextlib.contextmanager
def run_lock(path: str | os.PathLike, what: str, *, wait: bool = True):
    """Hold ``path`` for a whole ``doit`` run of ``what`` (e.g. "version 0.1.0"): a second run
    waits, saying which process it waits for, or with ``wait`` False raises
    :class:`BuildBusyError` naming it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), mode=0o600)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        busy = f"another doit run in this checkout builds {what} ({_holder(path)})"
        if not wait:
            raise BuildBusyError(f"{busy}; not waiting (wait=no)") from None
        log.info(f"laya-build: waiting: {busy}")
        lock.acquire()
    try:
        _name_holder(path, " ".join(["doit", *sys.argv[1:]]))
        yield
    finally:
        lock.release()
