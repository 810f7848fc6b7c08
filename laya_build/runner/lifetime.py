"""How long the processes of a build live: never longer than the build.

Every process a build starts is tied to the one that started it:

* doit's workers and the fork server die with their parent (``PR_SET_PDEATHSIG`` = SIGKILL);
* a stage process (a fork-server child or a fresh interpreter) leads a process group of its
  own, and when its parent dies it is sent SIGTERM, on which it ends its whole group (the
  compilers it started included) with SIGKILL;

so a ``doit`` killed with SIGKILL leaves nothing running.  A ``doit`` that is interrupted
(SIGINT, SIGTERM: :mod:`laya_build.tasks.run`) stops every process of its build at once:
:func:`stop_tree` freezes (SIGSTOP) every descendant, so that none can start another, then
kills them all.  The ``doit`` process is a child subreaper, so a process whose parent ended
is still its descendant, and every process of a build carries :data:`BUILD_ENV` in its
environment, by which the tests (and :func:`build_processes`) find them.

Linux only (``prctl``); elsewhere the ties are not made and only :func:`stop_tree` applies.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

BUILD_ENV = "LAYA_BUILD_ID"  # names the build every process of it belongs to
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(option, value, 0, 0, 0) == 0


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> None:
    """Be sent ``sig`` when the parent ends; end now if it already has (``parent``: its pid,
    known before the fork)."""
    _prctl(PR_SET_PDEATHSIG, int(sig))
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def become_subreaper() -> None:
    """Orphaned descendants are re-parented to this process instead of init (so they stay
    descendants that :func:`stop_tree` finds)."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def _end_group(signum, frame) -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)  # this process and everything of its group


def lead_own_group(parent: int | None = None) -> None:
    """A stage process: lead a process group of its own (its compilers join it) and, when its
    parent dies, end that whole group."""
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, _end_group)
    die_with_parent(signal.SIGTERM, parent)


def preexec_stage(parent: int):
    """``preexec_fn`` of a fresh stage process (started with ``process_group=0``)."""
    return lambda: die_with_parent(signal.SIGTERM, parent)


def descendants(pid: int | None = None) -> list:
    """Every live descendant of ``pid`` (default: this process), as psutil processes."""
    import psutil

    try:
        return psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def build_processes(build_id: str, exclude: int | None = None) -> list:
    """Every live process whose environment names ``build_id`` (a build's processes, wherever
    they were re-parented), ``exclude`` left out."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        if proc.pid == exclude:
            continue
        try:
            if proc.environ().get(BUILD_ENV) == build_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def stop_tree(build_id: str | None = None, rounds: int = 20) -> int:
    """Kill every descendant of this process (and every process of ``build_id``): freeze them
    all first, round after round until no new one appears, then SIGKILL them.  Returns how
    many were killed."""
    import psutil

    frozen: dict[int, psutil.Process] = {}
    for _ in range(rounds):
        found = descendants() + (build_processes(build_id, exclude=os.getpid()) if build_id else [])
        new = [p for p in found if p.pid not in frozen]
        if not new:
            break
        for proc in new:
            try:
                proc.send_signal(signal.SIGSTOP)
                frozen[proc.pid] = proc
            except psutil.NoSuchProcess:
                pass
    for proc in frozen.values():
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(list(frozen.values()), timeout=5)
    return len(frozen)
