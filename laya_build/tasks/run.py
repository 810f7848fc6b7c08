"""A ``doit`` run of this project, from before its first task to its end.

Before any task (:func:`install` changes doit's ``Run`` command, doit 0.37.0, pinned):

* **What is asked.**  ``doit verify version=X`` verifies what exists: a released version (its
  manifest, then each package) or a complete build.  doit itself would first build whatever a
  verify task's inputs need, so that a mistyped version would turn "verify the release I am
  about to ship" into "build a new one and say it is fine".  When every task asked for is
  ``verify`` and the version is neither, the run stops, naming the version and listing the
  versions that can be verified (exit status 3).
* **One run per version.**  A run takes the lock of the version it builds or verifies
  (``artifacts/.doit/<version>.lock``, :mod:`laya_build.locks`); a second run of the same
  version in the checkout waits for it, saying which process it waits for, or with
  ``wait=no`` refuses at once with that message.  Runs of other versions go on in parallel.

While it runs:

* **Interrupts.**  SIGINT (Ctrl-C, to the terminal's process group) and SIGTERM (a CI timeout
  or a supervisor, to the ``doit`` process alone) stop the whole build at once: every process
  of it, doit's workers, the fork server, stage processes and their compilers, is frozen and
  killed (:func:`laya_build.runner.lifetime.stop_tree`), and ``doit`` exits 130 (SIGINT) or
  143 (SIGTERM) with one line saying the build was interrupted.  What the build left
  unfinished is nothing that a later run or ``verify`` takes as built (no task is recorded
  before its outputs are complete), and a re-run goes on from the tasks that finished.  A
  second signal while stopping exits at once.
* **Stops for an error.**  A build that doit ends with an exception, and one whose task state
  cannot be written (a full disk, :mod:`.state`), stops every process of it the same way.
* **Nothing half-written.**  After every such stop the files the killed processes were writing
  (atomic writes' temporary files, ``.partial.`` files) are removed from the folders only a run
  of the version writes into (:meth:`laya_build.layout.ArtifactsLayout.written_by_run`), once no
  process of the build is left and while the run still holds the version's lock; a run that
  waits for the lock removes nothing.  Only a SIGKILL of ``doit`` itself leaves them, for the
  tasks that own them to clear when they next run.
* **Lifetimes.**  doit's workers die with the ``doit`` process, and every stage process with
  its parent (:mod:`laya_build.runner.lifetime`): a ``doit`` killed with SIGKILL leaves no
  process of its build running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable

from doit.cmd_run import Run
from doit.runner import MRunner

from laya_build.errors import LayaBuildError
from laya_build.runner import lifetime

_EXECUTE = getattr(Run._execute, "__wrapped__", Run._execute)
_WORKER = getattr(MRunner.execute_task_subprocess, "__wrapped__", MRunner.execute_task_subprocess)
_RUN: dict = {}  # the check before the run, the version lock, the main process


def _execute(self, *args, **kwargs):
    selected = [name for name in (self.sel_tasks or []) if not name.startswith("-")]
    try:
        if check := _RUN.get("check"):
            check(selected)
        _interrupts()
        lock = _RUN.get("lock")
        with lock() if lock else contextlib.nullcontext():
            _RUN["locked"] = True
            try:
                return _EXECUTE(self, *args, **kwargs)
            except Exception:  # doit has terminated its workers; their stage processes die with them
                stop_build()
                raise
            finally:
                _RUN["locked"] = False
    except LayaBuildError as exc:
        print(f"laya-build: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exc.exit_code


def stop_build() -> None:
    """Stop every process of this build (:func:`laya_build.runner.lifetime.stop_tree`), then,
    while this run holds its version's lock, remove what they left half-written there."""
    lifetime.stop_tree(os.environ.get(lifetime.BUILD_ENV))
    if _RUN.get("locked") and (sweep := _RUN.get("sweep")):
        with contextlib.suppress(OSError):
            sweep()


def _worker(self, *args, **kwargs):
    """A doit worker: dies with the ``doit`` process; a terminal's Ctrl-C is the main process's
    to handle (it stops the workers with everything else)."""
    lifetime.die_with_parent(signal.SIGKILL, _RUN.get("main"))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return _WORKER(self, *args, **kwargs)


_execute.__wrapped__, _worker.__wrapped__ = _EXECUTE, _WORKER


def _interrupts() -> None:
    """This process leads the build: its descendants stay its own, carry the build's id, and
    stop with it."""
    _RUN["main"] = os.getpid()
    os.environ[lifetime.BUILD_ENV] = f"{os.getpid()}-{time.time_ns()}"  # this build's own, never a parent's
    lifetime.become_subreaper()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupted)


def _interrupted(signum, frame) -> None:
    if os.getpid() != _RUN.get("main"):  # a process forked from the main one before it reset its handlers
        os._exit(128 + signum)
    for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal: exit at once
        signal.signal(sig, lambda s, f: os._exit(128 + s))
    name = signal.Signals(signum).name
    print(
        f"laya-build: build interrupted by {name}: stopping every process of the build; what it left unfinished "
        "is not taken as built, and a re-run goes on from the tasks that finished",
        file=sys.stderr,
        flush=True,
    )
    stop_build()
    os._exit(128 + signum)


def install(
    check: Callable[[list[str]], None], lock: Callable | None = None, sweep: Callable[[], object] | None = None
) -> None:
    """Before ``doit run`` starts: ``check(selected task names)``, then ``lock()`` (a context
    manager held for the run); ``sweep()`` removes what a stopped build left half-written in
    the folders the lock guards.  Installing again replaces all three."""
    _RUN.update(check=check, lock=lock, sweep=sweep)
    Run._execute = _execute
    MRunner.execute_task_subprocess = _worker


def only(selected: list[str], basename: str) -> bool:
    """Whether every task asked for is ``basename`` or one of its sub-tasks."""
    return bool(selected) and all(name.split(":", 1)[0] == basename for name in selected)
