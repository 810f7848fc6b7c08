"""What ``doit`` is asked to run, checked before anything runs.

``doit verify version=X`` verifies what exists: a released version (its manifest, then each
package) or a complete build (every package of the configuration built).  doit itself would
first build whatever a verify task's inputs need, so that a mistyped version turns "verify the
release I am about to ship" into "build a new one and say it is fine".  When every task asked
for is ``verify`` (or one of its sub-tasks) and the version is neither, the run stops before
any task, naming the version and listing the versions that can be verified (exit status 3).
Changes one method of doit's ``Run`` command (doit 0.37.0, pinned).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from doit.cmd_run import Run

from laya_build.errors import LayaBuildError

_EXECUTE = getattr(Run._execute, "__wrapped__", Run._execute)
_CHECKS: list[Callable[[list[str]], None]] = []


def _execute(self, *args, **kwargs):
    selected = [name for name in (self.sel_tasks or []) if not name.startswith("-")]
    try:
        for check in _CHECKS:
            check(selected)
    except LayaBuildError as exc:
        print(f"laya-build: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exc.exit_code
    return _EXECUTE(self, *args, **kwargs)


_execute.__wrapped__ = _EXECUTE


def install(check: Callable[[list[str]], None]) -> None:
    """Run ``check(selected task names)`` before ``doit run`` starts (this process's one check:
    installing again replaces it)."""
    _CHECKS[:] = [check]
    Run._execute = _execute


def only(selected: list[str], basename: str) -> bool:
    """Whether every task asked for is ``basename`` or one of its sub-tasks."""
    return bool(selected) and all(name.split(":", 1)[0] == basename for name in selected)
