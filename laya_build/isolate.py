"""Run a stage function in a process of its own: the one process runner of laya-build.

Compiling stages run here rather than in the doit process because TileLang renames
PrimFuncs whose names collide within one process (which changes generated source), because
CUDA cannot be re-initialised in a forked worker, and because a crashing native compiler
must not take the build down with it.

Two ways to start that process, one protocol:

* fresh (default): a new interpreter, ``python -m laya_build.isolate``;
* ``fork=True`` (kernel stages): a child forked from a *fork server*, an interpreter started
  once per doit process that imports torch and TileLang (5-12 s) and nothing of the project,
  then forks one child per request.  Each child starts from that same clean state, so no
  generation sees another's (the bytes equal a fresh interpreter's: tested), a crash takes
  only the child down, and CUDA is never initialised in the server.  Stages that use CUDA
  or compile packages keep the fresh interpreter.

Protocol: the parent sends ``{"module", "function", "spec", "record"}`` as JSON on stdin;
the child imports ``module``, calls ``function(spec)`` and, if ``record`` is set, validates
and writes the returned record there.  A failure in the child is reported as one
``LAYA-ERROR <type>: <message>`` line on stderr, which the parent re-raises as
:class:`StageFailed` with that message.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

from . import PROJECT_ROOT
from .errors import StageFailed  # noqa: F401  (StageFailed re-exported)

ERROR_PREFIX = "LAYA-ERROR "
# What the fork server imports before forking: the heavy modules the kernel stages use.
SERVER_PRELOAD = ("torch", "tilelang", "jsonschema", "referencing")




def child_env(env: dict | None = None) -> dict:
    """Environment of a stage process: offline, the project importable, a fixed hash seed."""
    out = dict(os.environ)
    paths = [str(PROJECT_ROOT)]
    if out.get("PYTHONPATH"):
        paths.append(out["PYTHONPATH"])
    out["PYTHONPATH"] = os.pathsep.join(paths)
    out["HF_HUB_OFFLINE"] = "1"
    out["TRANSFORMERS_OFFLINE"] = "1"
    # Reproducible outputs: with a random str hash seed, torch.export orders some nodes by
    # set iteration (the two rotary inv_freq buffers of ModernBERT), so exported.pt2 bytes
    # changed from run to run.
    out["PYTHONHASHSEED"] = "0"
    out.update(env or {})
    return out


def run(module: str, function: str, spec: dict, *, record: str | os.PathLike | None = None,
        extra_path: list[str] | None = None, env: dict | None = None, label: str | None = None,
        kwargs: bool = False, fork: bool = False) -> None:
    """Run ``module.function(spec)`` (``function(**spec)`` with ``kwargs=True``) in a process
    of its own (forked from the fork server with ``fork``); raise :class:`StageFailed` on
    failure."""
    request = {"module": module, "function": function, "spec": spec, "call": "kwargs" if kwargs else "spec",
               "record": str(record) if record else None, "sys_path": list(extra_path or [])}
    what = label or f"{module}.{function}"
    if fork:
        returncode, err_text = _server(env).run(request)
    else:
        returncode, err_text = _run_fresh(request, env)
    if returncode == 0:
        return
    errors = [line[len(ERROR_PREFIX):] for line in err_text.splitlines() if line.startswith(ERROR_PREFIX)]
    if errors:
        raise StageFailed(f"{what}: {errors[-1]}")
    if returncode < 0:
        reason = f"killed by signal {signal.Signals(-returncode).name}"
    else:
        reason = f"exit status {returncode}"
    tail = "\n".join(err_text.strip().splitlines()[-20:])
    raise StageFailed(f"{what}: process failed ({reason})\n{tail}")


def _run_fresh(request: dict, env: dict | None) -> tuple[int, str]:
    proc = subprocess.Popen([sys.executable, "-m", "laya_build.isolate"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=PROJECT_ROOT,
                            env=child_env(env))
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True)
    reader.start()
    proc.stdin.write(json.dumps(request))
    proc.stdin.close()
    for line in proc.stdout:  # progress lines of long stages, shown as they come
        print(line, end="", flush=True)
    proc.wait()
    reader.join()
    return proc.returncode, "".join(stderr)


class ForkServer:
    """A pre-imported interpreter that forks one child per request (see the module doc).

    Requests go as JSON lines on its stdin; it answers each with one JSON line
    ``{"returncode": <exit status, or -signal>}`` once the child has ended.  The child's
    stdout and stderr go to a log file the client reads.  The server ends when its stdin
    closes (the doit process ended, however it ended)."""

    def __init__(self, env: dict | None):
        self.proc = subprocess.Popen([sys.executable, "-m", "laya_build.isolate", "--server"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=PROJECT_ROOT,
                                     env=child_env(env))
        self.lock = threading.Lock()

    def run(self, request: dict) -> tuple[int, str]:
        fd, log = tempfile.mkstemp(prefix="laya-stage-", suffix=".log")
        os.close(fd)
        try:
            with self.lock:
                self.proc.stdin.write(json.dumps({**request, "log": log}) + "\n")
                self.proc.stdin.flush()
                answer = self.proc.stdout.readline()
            if not answer:
                raise StageFailed(f"the stage fork server died (exit status {self.proc.poll()})")
            text = Path(log).read_text(encoding="utf-8", errors="replace")
        finally:
            os.unlink(log)
        out = [ln for ln in text.splitlines() if ln and not ln.startswith(ERROR_PREFIX)]
        if out and json.loads(answer)["returncode"] == 0:
            print("\n".join(out), flush=True)
        return json.loads(answer)["returncode"], text


_SERVERS: dict[str, ForkServer] = {}


def _server(env: dict | None) -> ForkServer:
    """This process's fork server for ``env`` (started on first use; a forked doit worker
    starts its own: a server is never shared across a fork)."""
    key = f"{os.getpid()}:{json.dumps(env or {}, sort_keys=True)}"
    server = _SERVERS.get(key)
    if server is None or server.proc.poll() is not None:
        server = _SERVERS[key] = ForkServer(env)
    return server


def _execute(request: dict) -> int:
    """Run one request in this process (a fresh interpreter or a forked child)."""
    # ``python -m`` puts the working directory first on sys.path; paths the parent asked for
    # (a baseline revision's kernels/) must win over the project's own.
    sys.path[:0] = request.get("sys_path", [])
    try:
        func = getattr(importlib.import_module(request["module"]), request["function"])
        spec = request["spec"]
        record = func(**spec) if request["call"] == "kwargs" else func(spec)
        if request.get("record"):
            from .records import write_record

            write_record(Path(request["record"]), record)
    except Exception as exc:  # reported to the parent, which raises StageFailed
        traceback.print_exc()
        message = str(exc).replace("\n", " | ")
        print(f"{ERROR_PREFIX}{type(exc).__name__}: {message}", file=sys.stderr)
        return 1
    return 0


def _serve() -> int:
    for name in SERVER_PRELOAD:
        importlib.import_module(name)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:  # the child: its own log, one request, then exit without cleanup
            code = 1
            try:
                fd = os.open(request["log"], os.O_WRONLY | os.O_TRUNC)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.close(fd)
                sys.stdin.close()
                code = _execute(request)
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        sys.stdout.write(json.dumps({"returncode": returncode}) + "\n")
        sys.stdout.flush()
    return 0


def _main() -> int:
    if sys.argv[1:] == ["--server"]:
        return _serve()
    return _execute(json.loads(sys.stdin.read()))


if __name__ == "__main__":
    sys.exit(_main())
