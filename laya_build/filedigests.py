"""sha256 of the build's files, remembered between processes while a file is unchanged.

A build hashes its large files several times: a stage's outputs once it finishes (their
digest), the next stage's key (its inputs), doit's state of that stage's file dependencies.
A 745 MB package costs ~0.5 s a pass.  This module hashes a file once and remembers the digest
under what the file system says of it, as Bazel's digest cache does (its ``FileContentsProxy``:
inode and ctime): the device, inode, size, mtime and ctime, all in nanoseconds.  Any write,
``chmod``, ``utime`` (an mtime set back included) or rename gives a file a new ctime, which no
user process can set back, and a replaced file has another inode: the digest is hashed again.
File times come from a clock that ticks every few milliseconds, so a file changed within a tick
of being hashed could keep its times; as git does with "racily clean" files, a digest is
remembered only for a file whose last change is older than :data:`RACY_NS` when it is hashed.
A fetch from the cache remembers the digests it checked (:func:`remember`) for files it has just
moved into place itself.

The memory is one SQLite database per checkout (``artifacts/.doit/digests.sqlite3``,
:func:`use`), shared by doit's processes; without one (a worker, a test) files are hashed
every time.  A database that cannot be read or written is the same as none: this never fails a
build.  What must read the bytes themselves does not use it: ``verify`` and ``release`` hash
the files on disk (a release's manifest, the package checked before it is loaded).
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from laya_build.runtime.digest import sha256_file

RACY_NS = 50_000_000  # 50 ms: well above a file-time tick (1-10 ms)
_STATE: dict = {"db": None, "conn": None, "pid": None, "memo": {}}
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS digests (path TEXT PRIMARY KEY, dev INTEGER, ino INTEGER, size INTEGER,"
    " mtime_ns INTEGER, ctime_ns INTEGER, sha256 TEXT)"
)


def use(db: Path | None) -> None:
    """Remember digests in ``db`` from now on in this process and those it forks (None: don't)."""
    _STATE.update(db=Path(db) if db is not None else None, conn=None, pid=None, memo={})


def _stamp(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _conn() -> sqlite3.Connection | None:
    db = _STATE["db"]
    if db is None:
        return None
    if _STATE["conn"] is not None and _STATE["pid"] == os.getpid():
        return _STATE["conn"]
    try:  # a forked process opens its own connection (SQLite's are not shared across fork)
        db.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(db), timeout=10, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(_SCHEMA)
    except (OSError, sqlite3.Error):
        _STATE["db"] = None  # unusable here: hash every time
        return None
    _STATE.update(conn=conn, pid=os.getpid())
    return conn


def _recall(path: str, stamp: tuple) -> str | None:
    memo = _STATE["memo"]
    if (found := memo.get(path)) is not None and found[0] == stamp:
        return found[1]
    conn = _conn()
    if conn is None:
        return None
    try:
        row = conn.execute(
            "SELECT dev, ino, size, mtime_ns, ctime_ns, sha256 FROM digests WHERE path = ?", (path,)
        ).fetchone()
    except sqlite3.Error:
        return None
    if row is None or tuple(row[:5]) != stamp:
        return None
    memo[path] = (stamp, row[5])
    return row[5]


def _record(path: str, stamp: tuple, sha: str) -> None:
    _STATE["memo"][path] = (stamp, sha)
    conn = _conn()
    if conn is None:
        return
    try:
        conn.execute("INSERT OR REPLACE INTO digests VALUES (?, ?, ?, ?, ?, ?, ?)", (path, *stamp, sha))
    except sqlite3.Error:
        pass  # not remembered: hashed again next time


def sha256(path: str | os.PathLike) -> str:
    """The sha256 of ``path``'s bytes: remembered while the file is unchanged, else hashed (and
    remembered when the file had settled before and did not change while it was read)."""
    name = os.path.abspath(path)
    st = os.stat(name)
    now = time.time_ns()
    before = _stamp(st)
    if (sha := _recall(name, before)) is not None:
        return sha
    sha = sha256_file(Path(name))
    settled = now - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_NS
    if settled and _stamp(os.stat(name)) == before:
        _record(name, before, sha)
    return sha


def remember(path: str | os.PathLike, sha: str) -> None:
    """Say that ``path`` (just written by this process, its bytes hashed as they were written)
    has digest ``sha``: a fetch from the cache moves checked blobs into place this way."""
    name = os.path.abspath(path)
    _record(name, _stamp(os.stat(name)), sha)
