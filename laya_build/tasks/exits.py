"""How ``doit`` exits: 3 when every failed task failed because of what it was asked.

doit exits 3 for its own user errors (an unknown task, a bad option) and 1 for any failed
task.  A task of this project that fails with a configuration or command-line error
(:class:`laya_build.errors.UserError`, e.g. ``release_diff`` of a version that was never
released) returns :class:`~laya_build.tasks.failures.UserTaskFailed`; when every failure of a
run is one of those, the run exits 3, so that CI tells "the command was wrong" from "the
build failed".  A configuration error found while the task graph is built exits 3 from
``dodo.py``.  Changes two methods of doit's ``Runner`` (doit 0.37.0, pinned).
"""

from __future__ import annotations

from doit.runner import Runner

from laya_build.errors import USER_ERROR_EXIT
from laya_build.tasks.failures import UserTaskFailed

_PROCESS = getattr(Runner.process_task_result, "__wrapped__", Runner.process_task_result)
_FINISH = getattr(Runner.finish, "__wrapped__", Runner.finish)


def _process_task_result(self, node, base_fail):
    if base_fail is not None:
        self.__dict__.setdefault("_laya_user_failures", []).append(isinstance(base_fail, UserTaskFailed))
    return _PROCESS(self, node, base_fail)


def _finish(self):
    result = _FINISH(self)
    kinds = self.__dict__.get("_laya_user_failures", [])
    if result == 1 and kinds and all(kinds):
        self.final_result = USER_ERROR_EXIT  # what run_all returns, and doit exits with
        return USER_ERROR_EXIT
    return result


_process_task_result.__wrapped__, _finish.__wrapped__ = _PROCESS, _FINISH


def install() -> None:
    """Idempotent."""
    Runner.process_task_result, Runner.finish = _process_task_result, _finish
