"""Run a function in a process of its own: the one process runner of laya-build.

Compiling stages run here rather than in the doit process because TileLang renames
PrimFuncs whose names collide within one process (which changes generated source), because
CUDA cannot be re-initialised in a forked worker, and because a crashing native compiler
must not take the build down with it.  The model stages use it a second time for their
children (:mod:`laya_build.stages.children`): the AOTInductor compile, the fresh-process
verification and the latency measurement, each in a new interpreter with its own
environment (an empty Inductor cache, ``AOTI_RUNTIME_CHECK_INPUTS=1``), log file and timeout.

Two ways to start that process, one protocol:

* fresh (default): a new interpreter, ``python -m laya_build.runner``;
* ``fork=True``: a child forked from a *fork server*, an interpreter started once per build
  (on first use; doit's parallel workers share it, :func:`share_servers`) that imports torch
  and TileLang (3-12 s) and nothing of the project, then forks one child per request, any
  number at once.  Each child starts from that same clean state, so no generation sees
  another's (the bytes equal a fresh interpreter's: tested), a crash takes only the child
  down, and CUDA is never initialised in the server (a child may initialise it: the server
  never did).

Protocol: the parent sends ``{"module", "function", "spec", "record", "result"}`` as JSON;
the child imports ``module``, calls ``function(spec)`` (``function(**spec)`` for
``call: kwargs``) and, if ``record`` is set, validates and writes the returned record there;
if ``result`` is set, writes the returned value there as JSON (the parent returns it).  A
failure in the child is reported as one ``LAYA-ERROR <type>: <message>`` line on stderr:
the parent raises :class:`StageFailed` with it, or with ``reraise`` the child's own
:mod:`laya_build.errors` class with the child's message.  A child killed by a signal raises
``crash_error`` naming the signal; one past its ``timeout`` is killed and raises
:class:`StageError`: neither can ever pass as success.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import importlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from laya_build import PROJECT_ROOT, errors
from laya_build.errors import StageError, StageFailed

ERROR_PREFIX = "LAYA-ERROR "
# What the fork server imports before forking: the heavy modules the stages use.
SERVER_PRELOAD = ("torch", "tilelang", "jsonschema", "referencing")
TAIL_LINES = 25


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
    out["PYTHONUNBUFFERED"] = "1"
    out.update(env or {})
    return out


def run(module: str, function: str, spec: dict, *, record: str | os.PathLike | None = None,
        result: bool = False, extra_path: list[str] | None = None, env: dict | None = None,
        label: str | None = None, kwargs: bool = False, fork: bool = False, log: str | os.PathLike | None = None,
        timeout: float | None = None, crash_error: type[StageFailed | errors.ChildCrashError] = StageFailed,
        reraise: bool = False, task: str | None = None):
    """Run ``module.function(spec)`` (``function(**spec)`` with ``kwargs=True``) in a process
    of its own (forked from the fork server with ``fork``); return what it returned when
    ``result`` is set.  ``log``: a file that keeps the child's output (else it is shown as
    it comes, fresh, or once it succeeded, forked); ``timeout``: seconds (fresh only);
    ``task``: the doit task it serves, exported to the process and its children as
    ``LAYA_TASK`` (a process of a build names its task)."""
    if fork and timeout is not None:
        raise ValueError("a timeout needs a fresh process (fork=False)")
    what = label or f"{module}.{function}"
    with tempfile.TemporaryDirectory(prefix="laya-run-") as scratch:
        request = {"module": module, "function": function, "spec": spec, "call": "kwargs" if kwargs else "spec",
                   "record": str(record) if record else None, "sys_path": list(extra_path or []),
                   "result": str(Path(scratch) / "result.json") if result else None, "task": task,
                   "error": str(Path(scratch) / "error.json")}
        log_path = Path(log) if log else Path(scratch) / "output.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if log:
            _log(f"[laya] {what}: started (log {log_path.name})")
        start = time.perf_counter()
        if fork:
            returncode = _fork_run(request, env, log_path, show=not log)
        else:
            returncode = _run_fresh(request, env, log_path, show=not log, timeout=timeout, what=what)
        if log:
            _log(f"[laya] {what}: finished in {time.perf_counter() - start:.1f} s (exit status {returncode})")
        text = log_path.read_text(encoding="utf-8", errors="replace")
        if returncode == 0:
            return json.loads(Path(request["result"]).read_text()) if result else None
        error = Path(request["error"])
        reported = json.loads(error.read_text()) if error.is_file() else None
    _raise(what, returncode, text, reported, log, crash_error, reraise)


def _log(message: str) -> None:
    from laya_build.log import get_logger

    get_logger(__name__).info(message)


def tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _raise(what: str, returncode: int, text: str, reported: dict | None, log, crash_error, reraise: bool):
    if reported:
        cls = getattr(errors, reported["type"], None)
        if reraise and isinstance(cls, type) and issubclass(cls, errors.LayaBuildError):
            raise cls(reported["message"])
        raise StageFailed(f"{what}: {reported['type']}: {reported['message']}".replace("\n", " | "))
    where = f"Last output ({log})" if log else "Last output"
    if returncode < 0:
        name = signal.Signals(-returncode).name
        if issubclass(crash_error, errors.ChildCrashError):
            raise crash_error(f"{what} died by signal {name} ({-returncode}); this is a failure, not a pass. "
                              f"{where}:\n{tail(text)}", signal=name)
        raise crash_error(f"{what}: process failed (killed by signal {name})\n{tail(text, 20)}")
    raise StageFailed(f"{what}: process failed (exit status {returncode})\n{tail(text, 20)}")


def _run_fresh(request: dict, env: dict | None, log_path: Path, *, show: bool, timeout: float | None,
               what: str) -> int:
    with open(log_path, "w", encoding="utf-8") as out:
        proc = subprocess.Popen([sys.executable, "-m", "laya_build.runner"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE if show else out, stderr=out, text=True, cwd=PROJECT_ROOT,
                                env=child_env(env))
        lines: list[str] = []
        reader = None
        if show:  # progress lines of long stages, shown as they come (and kept for the error)
            def relay():
                for line in proc.stdout:
                    print(line, end="", flush=True)
                    lines.append(line)
            reader = threading.Thread(target=relay, daemon=True)
            reader.start()
        proc.stdin.write(json.dumps(request))
        proc.stdin.close()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise StageError(f"{what} ran past its {timeout:g} s timeout (log: {log_path})") from None
        if reader:
            reader.join()
            out.write("".join(lines))
    return proc.returncode


class ServerPlace:
    """Where the fork servers of one build live: a private folder for their sockets and start
    locks, and a pipe whose read end each server watches.  The write end stays open in the
    process that made the place and in every process forked from it (doit's workers): when
    the last of them ends, however it ends, the servers see end-of-file and exit."""

    def __init__(self):
        root = user_folder("forkservers")
        if len(str(root)) > 60:  # a Unix socket path has ~107 bytes
            root = user_folder("forkservers", Path("/tmp"))
        _remove_stale_places(root)
        self.folder = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root))
        self.life_r, self.life_w = os.pipe()
        self.owner = os.getpid()
        atexit.register(self._remove)

    def _remove(self) -> None:
        if os.getpid() == self.owner:
            shutil.rmtree(self.folder, ignore_errors=True)

    def socket_path(self, env: dict | None) -> Path:
        key = hashlib.sha256(json.dumps(env or {}, sort_keys=True).encode()).hexdigest()[:16]
        return self.folder / f"{key}.sock"

    def connect(self, env: dict | None) -> socket.socket:
        """A connection to the server for ``env``, started first if no server answers (under a
        lock: two workers asking at once start one server)."""
        path = self.socket_path(env)
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return _connect(path)
            except (FileNotFoundError, ConnectionRefusedError):
                pass
            proc = subprocess.Popen([sys.executable, "-m", "laya_build.runner", "--server", str(path),
                                     str(self.life_r)], stdout=subprocess.PIPE, text=True, cwd=PROJECT_ROOT,
                                    stdin=subprocess.DEVNULL, env=child_env(env), pass_fds=(self.life_r,))
            ready = proc.stdout.readline()  # listening (its imports follow; requests queue meanwhile)
            proc.stdout.close()
            if ready.strip() != "listening":
                raise StageFailed(f"the stage fork server did not start (exit status {proc.wait()})")
            return _connect(path)


def _remove_stale_places(root: Path) -> None:
    """Remove the places of processes that ended without removing theirs (killed builds, forked
    workers that exit without cleanup): a place folder is named after its maker's pid."""
    for folder in root.iterdir():
        pid = folder.name.split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:
            pass  # alive, another user's


def _connect(path: Path) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        raise
    return conn


_PLACE: ServerPlace | None = None
_PLACE_LOCK = threading.Lock()  # threads asking at once make one place (and start one server)


def share_servers() -> None:
    """Make this process's server place now, so that processes forked from it later (doit's
    parallel workers) share its fork servers: one server's imports per build, not per worker."""
    global _PLACE
    with _PLACE_LOCK:
        if _PLACE is None:
            _PLACE = ServerPlace()


def _fork_run(request: dict, env: dict | None, log_path: Path, *, show: bool) -> int:
    """Send ``request`` to the fork server for ``env`` (one connection per request: workers
    ask concurrently) and return the child's exit status (``-signal`` if killed)."""
    share_servers()
    log_path.write_text("")
    with _PLACE.connect(env) as conn:
        conn.sendall((json.dumps({**request, "log": str(log_path)}) + "\n").encode())
        with conn.makefile("r", encoding="utf-8") as answers:
            answer = answers.readline()
    if not answer:
        raise StageFailed("the stage fork server ended before answering")
    returncode = json.loads(answer)["returncode"]
    if show and returncode == 0:
        text = log_path.read_text(encoding="utf-8", errors="replace")
        out = [ln for ln in text.splitlines() if ln and not ln.startswith(ERROR_PREFIX)]
        if out:
            print("\n".join(out), flush=True)
    return returncode


# ------------------------------------------------------------------------ Inductor caches

class InductorCache:
    """The path a child uses as ``TORCHINDUCTOR_CACHE_DIR``; ``removed`` is set when the
    context exits, checked while the lock is still held (another build of the same key may
    re-create the folder the moment the lock is released)."""

    def __init__(self, path: Path):
        self.path = path
        self.removed: bool | None = None

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)


def user_folder(name: str, tmp: Path | None = None) -> Path:
    """``<tmp>/laya-build-<uid>/<name>`` (``tmp``: the temp directory), made private to this
    user: what outlives one build but belongs in no checkout's artifacts."""
    root = Path(tmp or tempfile.gettempdir()) / f"laya-build-{os.getuid()}" / name
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return root


def inductor_root() -> Path:
    """This user's folder of Inductor caches, outside every checkout's artifacts."""
    return user_folder("inductor")


def vec_isa_root() -> Path:
    """Where :func:`laya_build.runtime.aoti.check_vec_isas` keeps Inductor's CPU-ISA checks, one folder
    per torch, compiler and CPU: paid once per toolchain, not once per compile."""
    return inductor_root() / "vec-isa"


@contextlib.contextmanager
def inductor_cache(key: str):
    """A child process's own empty Inductor cache, at a path that depends only on ``key``
    (stage, target, dtype) and the user, outside the artifacts.

    AOTInductor writes its cache path into the package (compile-command comments, kernel
    file names, debug info), so a random ``mkdtemp`` name would make two builds of one
    exported program differ.  The directory is emptied before and removed after use; an
    exclusive ``flock`` on a sibling lock file serialises concurrent builds of one key (of
    any checkout of this user), and every check about the folder happens under that lock.
    """
    root = inductor_root()
    cache = InductorCache(root / key)
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(cache.path, ignore_errors=True)
        cache.path.mkdir()
        try:
            yield cache
        finally:
            shutil.rmtree(cache.path, ignore_errors=True)
            cache.removed = not cache.path.exists()


# ------------------------------------------------------------------------------ the child

def _write_json(path: str, obj) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


def _execute(request: dict) -> int:
    """Run one request in this process (a fresh interpreter or a forked child)."""
    # ``python -m`` puts the working directory first on sys.path; paths the parent asked for
    # (a baseline revision's kernels/) must win over the project's own.
    sys.path[:0] = request.get("sys_path", [])
    if request.get("task"):
        os.environ["LAYA_TASK"] = request["task"]
    try:
        func = getattr(importlib.import_module(request["module"]), request["function"])
        spec = request["spec"]
        value = func(**spec) if request["call"] == "kwargs" else func(spec)
        if request.get("record"):
            from laya_build.records import write_record

            write_record(Path(request["record"]), value)
        if request.get("result"):
            _write_json(request["result"], value)
    except Exception as exc:  # reported to the parent (StageFailed, or the class itself)
        traceback.print_exc()
        print(f"{ERROR_PREFIX}{type(exc).__name__}: {exc}".replace("\n", " | "), file=sys.stderr)
        _write_json(request["error"], {"type": type(exc).__name__, "message": str(exc)})
        return 1
    return 0


def _serve(path: str, life_fd: int) -> int:
    """The fork server: listen on ``path``, import the heavy modules once, then fork a handler
    per connection; it forks the child that runs the request, waits for it and answers
    ``{"returncode": <exit status, or -signal>}``.  Ends at end-of-file on ``life_fd``."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a server of this place that died
    listener.bind(path)
    listener.listen(64)
    print("listening", flush=True)
    for name in SERVER_PRELOAD:
        importlib.import_module(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    while True:
        ready, _, _ = select.select([listener, life_fd], [], [])
        if life_fd in ready and not os.read(life_fd, 1):
            return 0
        if listener in ready:
            conn, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                os.close(life_fd)
                _handle(conn)
            conn.close()


def _handle(conn: socket.socket) -> None:
    """A handler: run the connection's request in a child of its own and answer its status."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        with conn.makefile("r", encoding="utf-8") as lines:
            request = json.loads(lines.readline())
        pid = os.fork()
        if pid == 0:  # the child: its own log, one request, then exit without cleanup
            child_code = 1
            try:
                conn.close()
                fd = os.open(request["log"], os.O_WRONLY | os.O_TRUNC)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.close(fd)
                sys.stdin.close()
                child_code = _execute(request)
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(child_code)
        _, status = os.waitpid(pid, 0)
        returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        conn.sendall((json.dumps({"returncode": returncode}) + "\n").encode())
        code = 0
    finally:
        os._exit(code)


def _main() -> int:
    if sys.argv[1:2] == ["--server"]:
        return _serve(sys.argv[2], int(sys.argv[3]))
    return _execute(json.loads(sys.stdin.read()))


if __name__ == "__main__":
    sys.exit(_main())
