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
    writes its pid, ``holder`` and start beside the lock once it has it, and a waiter says whom it
    waits for."""
    path = Path(path)
    lock = FileLock(str(path), mode=mode)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        whom = _holder(path) if holder is not None else "another process"
        log.info(f"[laya] waiting for {what} (lock {path}, held by {whom})")
        lock.acquire()
    try:
        if holder is not None:
            from laya_build.atomic import write_json

            write_json(_holder_file(path), {"pid": os.getpid(), "command": holder, "started": time.time()})
        yield
    finally:
        lock.release()


def _holder_file(path: Path) -> Path:
    return path.with_name(path.name + ".holder.json")


def _holder(path: Path) -> str:
    """Who holds the lock ``path``, as its holder wrote it."""
    try:
        info = json.loads(_holder_file(path).read_text())
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(info["started"]))
        return f"pid {info['pid']}, `{info['command']}`, started {started}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not said who it is"


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
        from laya_build.atomic import write_json

        command = " ".join(["doit", *sys.argv[1:]])
        write_json(_holder_file(path), {"pid": os.getpid(), "command": command, "started": time.time()})
        yield
    finally:
        lock.release()
