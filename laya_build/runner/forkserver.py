"""The fork server of a build: one interpreter that imports torch and TileLang once, then
forks a fresh child for every stage request, any number at once.

A server listens on a Unix socket in a private folder of the build (its *place*); doit's
parallel workers share it (:func:`share_servers`, called before doit forks them).  A handler
per connection forks the request's child, waits for it and answers its exit status.  The
server ends when the last process holding the place's pipe ends (the doit run, however it
ends); the place folder is removed then, or by the next build when the run was killed.
"""

from __future__ import annotations

import atexit
import contextlib
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
from pathlib import Path

from laya_build import PROJECT_ROOT
from laya_build.errors import StageFailed
from laya_build.locks import held
from laya_build.runner import lifetime
from laya_build.runner.child import child_env, execute
from laya_build.runner.folders import user_folder

# What the fork server imports before forking: the heavy modules the stages use.  Only a
# head start: one that does not import here (TileLang without its native libraries, on a
# machine that only packages) is left to the stages that need it, which then say why.
SERVER_PRELOAD = ("torch", "tilelang", "jsonschema", "referencing")


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
        with held(path.with_suffix(".lock"), "the fork server of this build to start"):
            try:
                return _connect(path)
            except (FileNotFoundError, ConnectionRefusedError):
                pass
            proc = subprocess.Popen(
                [sys.executable, "-m", "laya_build.runner", "--server", str(path), str(self.life_r)],
                stdout=subprocess.PIPE,
                text=True,
                cwd=PROJECT_ROOT,
                stdin=subprocess.DEVNULL,
                env=child_env(env),
                pass_fds=(self.life_r,),
            )
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


FOLLOW_S = 0.2  # how often a fork-server child's new log lines are looked for while it runs


class _Follow:
    """The lines a fork-server child writes to its log (its stdout), printed as they come: a stage's
    progress (a long compile, a wait for a lock) while it lasts."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, b""

    def poll(self, final: bool = False) -> None:
        """Print the complete lines written since the last poll (``final``: the rest as well)."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = b"" if final else lines.pop()
        out = [ln.decode("utf-8", "replace") for ln in lines if ln]
        if out:
            print("\n".join(out), flush=True)


def _answer(conn: socket.socket, follow: _Follow | None) -> str:
    """The server's one-line answer on ``conn``, following the child's log while it is awaited."""
    received = b""
    while b"\n" not in received:
        if follow is not None:
            ready, _, _ = select.select([conn], [], [], FOLLOW_S)
            follow.poll()
            if not ready:
                continue
        chunk = conn.recv(4096)
        if not chunk:
            break
        received += chunk
    return received.split(b"\n", 1)[0].decode()


def fork_run(request: dict, env: dict | None, log_path: Path, *, show: bool) -> int:
    """Send ``request`` to the fork server for ``env`` (one connection per request: workers
    ask concurrently) and return the child's exit status (``-signal`` if killed).  The child's
    stdout and stderr go to ``log_path``; with ``show`` its stdout is printed as it comes, however
    the child ends, as a fresh process's is, and its stderr (a failure's traceback) joins the log
    after it."""
    share_servers()
    log_path.write_text("")
    follow, stderr = None, {}
    if show:
        follow = _Follow(log_path)
        stderr_path = log_path.with_name(log_path.name + ".stderr")
        stderr_path.write_text("")
        stderr = {"stderr": str(stderr_path)}
    try:
        with _PLACE.connect(env) as conn:
            conn.sendall((json.dumps({**request, "log": str(log_path), **stderr}) + "\n").encode())
            answer = _answer(conn, follow)
    finally:
        if follow is not None:
            follow.poll(final=True)
            with open(log_path, "ab") as log, open(stderr_path, "rb") as err:
                shutil.copyfileobj(err, log)
            stderr_path.unlink()
    if not answer:
        raise StageFailed("the stage fork server ended before answering")
    return json.loads(answer)["returncode"]


def serve(path: str, life_fd: int) -> int:
    """The fork server: listen on ``path``, import the heavy modules once, then fork a handler
    per connection; it forks the child that runs the request, waits for it and answers
    ``{"returncode": <exit status, or -signal>}``.  Ends at end-of-file on ``life_fd``."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a server of this place that died
    listener.bind(path)
    listener.listen(64)
    print("listening", flush=True)
    # a terminal's Ctrl-C is the doit process's to handle: it stops the whole build, this server
    # included (which ends anyway when the build's last process ends: end-of-file on life_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in SERVER_PRELOAD:
        try:
            importlib.import_module(name)
        except (ImportError, OSError) as exc:
            print(f"not preloaded: {name} ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    server = os.getpid()
    while True:
        ready, _, _ = select.select([listener, life_fd], [], [])
        if life_fd in ready and not os.read(life_fd, 1):
            return 0
        if listener in ready:
            conn, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                os.close(life_fd)
                lifetime.die_with_parent(signal.SIGKILL, server)
                _handle(conn)
            conn.close()


def _wait_or_end(pid: int, conn: socket.socket) -> int:
    """The exit status of the child ``pid``; if the client closes ``conn`` first (it sends
    nothing after its request), the child's group is killed first.  Waits on both at once (a
    pidfd for the child), so the answer goes back the moment the child ends."""
    try:
        child = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd here: look at the child every 50 ms
        child = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            watched = [conn] + ([child] if child is not None else [])
            ready, _, _ = select.select(watched, [], [], None if child is not None else 0.05)
            if conn in ready and not conn.recv(1):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                return os.waitpid(pid, 0)[1]
    finally:
        if child is not None:
            os.close(child)


def _handle(conn: socket.socket) -> None:
    """A handler: run the connection's request in a child of its own and answer its status.
    The child leads a process group of its own and dies with the handler; when the client goes
    away before the child is done (its doit worker was stopped), the child's group is ended."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        with conn.makefile("r", encoding="utf-8") as lines:
            request = json.loads(lines.readline())
        handler = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: its own log, one request, then exit without cleanup
            child_code = 1
            try:
                lifetime.lead_own_group(handler)
                conn.close()
                fd = os.open(request["log"], os.O_WRONLY | os.O_TRUNC)
                os.dup2(fd, 1)
                os.close(fd)
                if request.get("stderr"):  # a file of its own (the parent shows stdout as it comes)
                    fd = os.open(request["stderr"], os.O_WRONLY | os.O_TRUNC)
                    os.dup2(fd, 2)
                    os.close(fd)
                else:  # the log, through the same open file: one offset, lines in the order written
                    os.dup2(1, 2)
                sys.stdin.close()
                child_code = execute(request)
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(child_code)
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # also here: the group exists before the client could go away
        status = _wait_or_end(pid, conn)
        returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        conn.sendall((json.dumps({"returncode": returncode}) + "\n").encode())
        code = 0
    finally:
        os._exit(code)
