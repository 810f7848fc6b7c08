"""doit's task state, kept across a killed build.

doit's ``sqlite3`` backend (``SqliteDB``) keeps every task's new state in memory and writes it
all in ``dump()``, when the run ends: a build killed after an hour of compiles (SIGKILL, a lost
session, an out-of-memory kill) forgets every task it finished, and the next run does them
all again, although their outputs are whole and recorded (``.doit/outputs``).  :func:`install`
makes ``SqliteDB`` commit a task's state as soon as doit has recorded it: doit's
``Dependency.save_success`` ends with the task's ``deps:`` entry, so that entry commits the
task; a removed state (a failed or forgotten task) is committed at once.  ``dump()`` still
writes whatever is left (``ignore``, ``forget --all``).

Installed when the task graph is built (``laya_build.tasks``, imported by ``dodo.py``), like
:mod:`.dispatch`: only a doit run of this project is changed, from whatever folder it runs,
and an older checkout run with the same environment keeps doit's own behaviour.  (A doit
backend plugin would be cleaner but is found through the folder doit starts in, or through
an entry point that every doit run in the environment loads.)  Each commit is one short write
transaction, so two ``doit`` runs in one checkout still take turns at SQLite's lock.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys

from doit.dependency import FileChangedChecker, SqliteDB, get_file_md5

from laya_build import filedigests

MD5_HEX = 32  # the length of a digest doit's own checker saved
LAST_ENTRY = "deps:"  # the last entry Dependency.save_success sets for a task
# doit's own methods (``__wrapped__`` if another import of this module has installed already)
_SET = getattr(SqliteDB.set, "__wrapped__", SqliteDB.set)
_REMOVE = getattr(SqliteDB.remove, "__wrapped__", SqliteDB.remove)


def _set(self, task_id, dependency, value):
    _SET(self, task_id, dependency, value)
    if dependency == LAST_ENTRY:
        with _stopping_when_full(self):
            self._conn.execute(
                "insert or replace into doit values (?,?)", (task_id, self.codec.encode(self._cache[task_id]))
            )
            self._conn.commit()
        self._dirty.discard(task_id)


def _remove(self, task_id):
    _REMOVE(self, task_id)
    with _stopping_when_full(self):
        self._conn.commit()


@contextlib.contextmanager
def _stopping_when_full(db):
    """A state that cannot be written for lack of space stops the build (as an interrupt does:
    nothing unrecorded is taken as built, nothing half-written is left) with one message,
    instead of doit's traceback."""
    try:
        yield
    except sqlite3.OperationalError as exc:  # "database or disk is full", or on a full disk "disk I/O error"
        from laya_build.diskspace import full_near

        if "full" not in str(exc) and full_near([db.name]) is None:
            raise
        from laya_build.errors import DiskFullError
        from laya_build.tasks.run import stop_build

        error = DiskFullError(f"{db.name}: doit's task state cannot be written ({exc})")
        print(f"laya-build: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        stop_build()
        os._exit(1)


_set.__wrapped__, _remove.__wrapped__ = _SET, _REMOVE


def install() -> None:
    """Make doit's sqlite3 backend commit each task's state when it is recorded (idempotent)."""
    SqliteDB.set, SqliteDB.remove = _set, _remove


def installed() -> bool:
    return SqliteDB.set is _set and SqliteDB.remove is _remove


class Sha256Checker(FileChangedChecker):
    """doit's check of file dependencies by sha256, the digest the cache keys and the outputs'
    record use (:mod:`laya_build.filedigests`: hashed once while the file is unchanged), in place
    of doit's md5, which hashed every large input (a 745 MB export) once more after each run.

    A state is ``(mtime, size, sha256)``, as doit's md5 states are ``(mtime, size, md5)``; a
    dependency saved by doit's md5 checker is compared as that checker does (mtime, then md5)
    until its task next runs."""

    def check_modified(self, file_path, file_stat, state):
        mtime, size, saved = state
        if file_stat.st_size != size:
            return True
        if len(saved) == MD5_HEX:  # doit's own rule for its states: the same mtime is the same file
            return file_stat.st_mtime != mtime and saved != get_file_md5(file_path)
        return saved != filedigests.sha256(file_path)

    def get_state(self, dep, current_state):
        st = os.stat(dep)
        state = (st.st_mtime, st.st_size, filedigests.sha256(dep))
        return None if state == (tuple(current_state) if current_state else None) else state
