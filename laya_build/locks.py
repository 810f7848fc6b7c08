"""File locks that say what they wait for (``filelock``), shared by every checkout of a user."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from filelock import FileLock, Timeout

from laya_build.log import get_logger

log = get_logger(__name__)


@contextlib.contextmanager
def held(path: str | os.PathLike, what: str):
    """Hold the lock file ``path`` (created if missing) for the block.  When another process
    holds it, say once what this process waits for, then wait."""
    lock = FileLock(str(Path(path)), mode=0o600)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info(f"[laya] waiting for {what} (lock {path}, held by another process)")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
