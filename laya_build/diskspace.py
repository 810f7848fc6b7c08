"""Telling a full disk from other failures (ENOSPC, EDQUOT, or a library's own error on a write
that ran out of space) and saying so: which file, which filesystem, how much is free."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from laya_build.errors import DiskFullError

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# Below this many free bytes, a filesystem that a failed write was on counts as full (a library
# such as torch's zip writer reports a short write as its own error, not as ENOSPC).
NEARLY_FULL = 1 << 20


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free bytes (for an unprivileged user) on the filesystem of ``path`` or its nearest
    existing parent; None when it cannot be asked."""
    here = Path(path)
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        st = os.statvfs(here)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def is_no_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in NO_SPACE


def full_near(paths) -> tuple[str, int] | None:
    """(path, free bytes) of the first of ``paths`` whose filesystem is (nearly) full."""
    for path in paths:
        free = free_bytes(path)
        if free is not None and free < NEARLY_FULL:
            return str(path), free
    return None


def disk_full(path, exc: BaseException, what: str = "writing it") -> DiskFullError | None:
    """The :class:`DiskFullError` that ``exc`` (raised while ``what`` at ``path``) stands for,
    or None when the disk is not the cause."""
    free = free_bytes(path)
    if is_no_space(exc):
        cause = os.strerror(exc.errno)
    elif free is not None and free < NEARLY_FULL:
        cause = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    else:
        return None
    where = f"; {free:,} bytes free on its filesystem" if free is not None else ""
    return DiskFullError(f"{path}: no space left while {what} ({cause}{where}); the partial file was removed")
