"""Atomic file writes: a temp file in the target's directory, fsync, then ``os.replace``.

An interrupted build therefore never leaves a truncated file under its final name.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _file_mode() -> int:
    """What ``open()`` would create: 0o666 less the umask (``mkstemp`` makes 0o600, which
    would leave records and packages unreadable to the rest of a release team)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


FILE_MODE = _file_mode()


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, *, exclusive: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success it is renamed onto ``target``.

    On any exception the temporary file is removed and ``target`` is left untouched.  With
    ``exclusive=True`` the file is published with ``os.link``, which fails with
    ``FileExistsError`` if ``target`` exists (no check-then-write race).
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        from laya_build.diskspace import disk_full

        if (full := disk_full(target, exc)) is not None:
            raise full from exc
        raise
    os.fchmod(fd, FILE_MODE)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        if exclusive:
            os.link(tmp_path, target)
            tmp_path.unlink()
        else:
            os.replace(tmp_path, target)
    except BaseException as exc:
        from laya_build.diskspace import disk_full
        from laya_build.errors import DiskFullError

        # asked before the unlink frees the space
        full = disk_full(target, exc) if isinstance(exc, Exception) and not isinstance(exc, DiskFullError) else None
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        if full is not None:
            raise full from exc
        raise


def write_bytes(target: str | os.PathLike, data: bytes, *, exclusive: bool = False) -> Path:
    with atomic_path(target, exclusive=exclusive) as tmp:
        tmp.write_bytes(data)
    return Path(target)


def write_text(target: str | os.PathLike, text: str, *, exclusive: bool = False) -> Path:
    return write_bytes(target, text.encode("utf-8"), exclusive=exclusive)


def dump_json(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_json(target: str | os.PathLike, obj, *, exclusive: bool = False) -> Path:
    return write_text(target, dump_json(obj), exclusive=exclusive)


def torch_save(obj, target: str | os.PathLike) -> Path:
    """``torch.save`` atomically and reproducibly: through a file object, so the archive's
    inner folder is not named after the (random) temporary file."""
    import torch

    with atomic_path(target) as tmp, open(tmp, "wb") as fh:
        torch.save(obj, fh)
    return Path(target)
