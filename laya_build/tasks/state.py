"""doit's task state, kept across a killed build: the ``sqlite3-task`` backend.

doit's own ``sqlite3`` backend keeps every task's new state in memory and writes it all in
``dump()``, when the run ends: a build killed after an hour of compiles (SIGKILL, a lost
session, an out-of-memory kill) forgets every task it finished, and the next run does them
all again, although their outputs are whole and recorded (``.doit/outputs``).  This backend
is doit's ``SqliteDB`` that commits a task's state as soon as doit has recorded it: doit's
``Dependency.save_success`` ends with the task's ``deps:`` entry, so that entry commits the
task; a removed state (a failed or forgotten task) is committed at once.  ``dump()`` still
writes whatever is left (``ignore``, ``forget --all``).

Registered as a doit plugin by entry point (``[project.entry-points."doit.BACKEND"]`` in
``pyproject.toml``: doit finds it whatever folder it runs from, once the project is installed)
and chosen by :func:`laya_build.tasks.doit_config` through :func:`backend`.  Each commit is one
short write transaction, so two ``doit`` runs in one checkout still take turns at SQLite's
lock, as before.
"""
from __future__ import annotations

from importlib import metadata

from doit.dependency import SqliteDB

from ..errors import InstallError

NAME = "sqlite3-task"
GROUP = "doit.BACKEND"  # the entry-point group doit reads its backend plugins from
DISTRIBUTION = "laya-build"
LAST_ENTRY = "deps:"  # the last entry Dependency.save_success sets for a task


def backend() -> str:
    """The backend name for ``DOIT_CONFIG``; :class:`InstallError` when doit would not find it
    (the project not installed: doit would fail with ``'NoneType' object is not callable``)."""
    try:
        points = metadata.distribution(DISTRIBUTION).entry_points
    except metadata.PackageNotFoundError:
        points = ()
    if not any(p.group == GROUP and p.name == NAME for p in points):
        raise InstallError(f"doit's task-state backend {NAME!r} is not registered (entry point {GROUP!r} of "
                           f"{DISTRIBUTION!r}): install the project as the README's set-up does "
                           "(pip install --no-deps --no-build-isolation -e .)")
    return NAME


class TaskStateDB(SqliteDB):
    """doit's sqlite3 backend, committing each task's state when it is complete."""

    desc = "sqlite3, each task's state committed when the task is recorded (kept across a killed build)"

    def set(self, task_id, dependency, value):
        super().set(task_id, dependency, value)
        if dependency == LAST_ENTRY:
            self._commit(task_id)

    def remove(self, task_id):
        super().remove(task_id)
        self._conn.commit()

    def _commit(self, task_id) -> None:
        self._conn.execute("insert or replace into doit values (?,?)",
                           (task_id, self.codec.encode(self._cache[task_id])))
        self._conn.commit()
        self._dirty.discard(task_id)
