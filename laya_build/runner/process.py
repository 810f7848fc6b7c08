"""Run a function in a process of its own: the one process runner of laya-build.

Compiling stages run in processes of their own rather than in the doit process because
TileLang renames PrimFuncs whose names collide within one process (which changes generated
source), because CUDA cannot be re-initialised in a forked worker, and because a crashing
native compiler must not take the build down with it.  The model stages use it a second time
for their children (:mod:`laya_build.stages.children`): the AOTInductor compile, the
fresh-process verification and the latency measurement, each in a new interpreter with its
own environment (an empty Inductor cache, ``AOTI_RUNTIME_CHECK_INPUTS=1``), log and timeout.

Two ways to start that process, one protocol (:class:`Child` says which):

* fresh (default): a new interpreter, ``python -m laya_build.runner``, in a process group of
  its own: a timeout ends the whole group (the compilers it started included);
* ``fork``: a child forked from the build's fork server (:mod:`laya_build.runner.forkserver`),
  which imported torch and TileLang once.

Protocol: the parent sends ``{"entry", "spec", "record", "result", "error", "sys_path",
"task"}`` as JSON; the child imports the entry's module, calls ``function(**spec)`` and, if
``record`` is set, validates and writes the returned record there (the one writer of a
stage's record); if ``result`` is set, writes the returned value there as JSON (the parent
returns it).  A failure in the child is written as ``{"type", "message", "hint"}``: the
parent raises :class:`StageFailed` with it, or with ``reraise`` the child's own
:mod:`laya_build.errors` class (always for a class that ``surfaces``, e.g. a full disk).  A
child killed by a signal raises ``crash_error`` naming the signal; one past its timeout is
killed with its group and raises :class:`StageError`: neither can ever pass as success.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from laya_build import PROJECT_ROOT, errors
from laya_build.errors import StageError, StageFailed
from laya_build.runner import lifetime
from laya_build.runner.child import child_env

TAIL_LINES = 25


@dataclass(frozen=True)
class Child:
    """How a function runs in a process of its own."""

    fork: bool = False  # forked from the fork server (else a fresh interpreter)
    env: dict | None = None  # environment variables on top of :func:`child_env`'s
    label: str | None = None  # how messages name it (default: the entry)
    log: str | os.PathLike | None = None  # a file that keeps its output (else shown as it comes)
    timeout: float | None = None  # seconds (fresh only)
    sys_path: tuple[str, ...] = ()  # folders first on sys.path (a baseline revision's kernels/)
    task: str | None = None  # the doit task it serves, exported as LAYA_TASK
    crash_error: type = StageFailed  # raised when it dies by a signal
    reraise: bool = False  # raise the child's own laya-build error class

    def __post_init__(self):
        if self.fork and self.timeout is not None:
            raise ValueError("a timeout needs a fresh process (fork=False)")


def run(
    entry: str, spec: dict, child: Child = Child(), *, record: str | os.PathLike | None = None, result: bool = False
):
    """Run ``entry`` (``"module:function"``) as ``function(**spec)`` in a process of its own;
    return what it returned when ``result`` is set.  ``record``: where the child validates
    and writes the record the function returns."""
    what = child.label or entry
    with tempfile.TemporaryDirectory(prefix="laya-run-") as scratch:
        request = {
            "entry": entry,
            "spec": spec,
            "record": str(record) if record else None,
            "sys_path": list(child.sys_path),
            "task": child.task,
            "result": str(Path(scratch) / "result.json") if result else None,
            "error": str(Path(scratch) / "error.json"),
        }
        log_path = Path(child.log) if child.log else Path(scratch) / "output.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if child.log:
            _log(f"[laya] {what}: started (log {log_path.name})")
        start = time.perf_counter()
        if child.fork:
            from laya_build.runner.forkserver import fork_run  # its sockets and locks only when asked for

            returncode = fork_run(request, child.env, log_path, show=not child.log)
        else:
            returncode = _run_fresh(request, child, log_path, what=what)
        if child.log:
            _log(f"[laya] {what}: finished in {time.perf_counter() - start:.1f} s (exit status {returncode})")
        text = log_path.read_text(encoding="utf-8", errors="replace")
        if returncode == 0:
            return json.loads(Path(request["result"]).read_text()) if result else None
        error = Path(request["error"])
        reported = json.loads(error.read_text()) if error.is_file() else None
    _raise(what, returncode, text, reported, child)


def _log(message: str) -> None:
    from laya_build.log import get_logger

    get_logger(__name__).info(message)


def tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _raise(what: str, returncode: int, text: str, reported: dict | None, child: Child):
    if reported:
        cls = getattr(errors, reported["type"], None)
        known = isinstance(cls, type) and issubclass(cls, errors.LayaBuildError)
        if child.reraise and known:
            raise cls(reported["message"], hint=reported.get("hint"))
        if known and getattr(cls, "surfaces", False):  # e.g. a full disk: the same error, the stage named
            raise cls(f"{what}: {reported['message']}", hint=reported.get("hint"))
        message = f"{what}: {reported['type']}: {reported['message']}".replace("\n", " | ")
        raise StageFailed(message, hint=reported.get("hint") if known else None)
    where = f"Last output ({child.log})" if child.log else "Last output"
    if returncode < 0:
        name = signal.Signals(-returncode).name
        if issubclass(child.crash_error, errors.ChildCrashError):
            raise child.crash_error(
                f"{what} died by signal {name} ({-returncode}); this is a failure, not a pass. {where}:\n{tail(text)}",
                signal=name,
            )
        raise child.crash_error(f"{what}: process failed (killed by signal {name})\n{tail(text, 20)}")
    raise StageFailed(f"{what}: process failed (exit status {returncode})\n{tail(text, 20)}")


def _kill_group(proc: subprocess.Popen) -> None:
    """End ``proc`` and every process of its group (the compilers it started)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _run_fresh(request: dict, child: Child, log_path: Path, *, what: str) -> int:
    show = not child.log
    with open(log_path, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "laya_build.runner"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE if show else out,
            stderr=out,
            text=True,
            cwd=PROJECT_ROOT,
            env=child_env(child.env),
            process_group=0,
            preexec_fn=lifetime.preexec_stage(os.getpid()),
        )
        lines: list[str] = []
        reader = None
        if show:  # progress lines of long stages, shown as they come (and kept for the error)

            def relay():
                for line in proc.stdout:
                    print(line, end="", flush=True)
                    lines.append(line)

            reader = threading.Thread(target=relay, daemon=True)
            reader.start()
        try:
            proc.stdin.write(json.dumps(request))
            proc.stdin.close()
            proc.wait(timeout=child.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise StageError(
                f"{what} ran past its {child.timeout:g} s timeout; its process group was ended (log: {log_path})",
                hint="raise the stage's timeout_s in the configuration if the work is expected to take longer",
            ) from None
        except BaseException:
            _kill_group(proc)
            raise
        if reader:
            reader.join()
            out.write("".join(lines))
    return proc.returncode
