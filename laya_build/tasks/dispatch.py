"""How doit hands out tasks: a task whose dependencies just finished goes first, and the
parallel workers share one fork server.

doit keeps one queue of ready tasks and appends to its end both the tasks that are ready
from the start and those a finished dependency unblocks.  In a cold ``doit release`` the 57
kernel tasks are ready at once, so the model chain (model -> export -> aoti_package ->
latency, verify: the long compiles, each waiting for the one before) stalled behind all of
them: its first export started after 76 s of kernel work and the chain then ran alone at the
end (one core busy for minutes of a 2-core machine).  Putting the unblocked task at the front
keeps a started chain going (depth-first), and the independent tasks fill the other cores.

This changes one method of doit's ``TaskDispatcher`` (doit 0.37.0, pinned in requirements.txt):
the queue is a ``collections.deque``; the patched method runs doit's own and moves what it
appended to the front, in order.  Which tasks run, and what each depends on, is unchanged.

doit's parallel runner forks its workers once it has a first task to hand each; left alone,
every worker would start its own fork server (:mod:`laya_build.runner.forkserver`), paying
torch's and TileLang's imports once per worker.  The runner makes the server place before it
forks (:func:`laya_build.runner.forkserver.share_servers`): the first worker to need a server
starts it and the others connect to it.  Nothing is started for a run that executes no task.
"""

from __future__ import annotations

from doit import control, runner

from laya_build.runner import forkserver

_ORIGINAL = control.TaskDispatcher._update_waiting
_START_PROCESSES = runner.MRunner._run_start_processes


def _update_waiting_unblocked_first(self, processed):
    before = len(self.ready)
    _ORIGINAL(self, processed)
    unblocked = [self.ready.pop() for _ in range(len(self.ready) - before)]  # last first
    self.ready.extendleft(unblocked)  # front, in the order doit unblocked them


def _start_processes_sharing_servers(self, job_q, result_q):
    forkserver.share_servers()
    return _START_PROCESSES(self, job_q, result_q)


def install() -> None:
    """Idempotent: the dispatcher of this process starts unblocked tasks first, and the
    workers of a parallel run share their fork servers."""
    control.TaskDispatcher._update_waiting = _update_waiting_unblocked_first
    runner.MRunner._run_start_processes = _start_processes_sharing_servers
