"""Folders of a user that outlive one build but belong in no checkout's artifacts: the fork
servers' places and the Inductor caches of stage children."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from laya_build.locks import held
from laya_build.log import get_logger

log = get_logger(__name__)


class InductorCache:
    """The path a child uses as ``TORCHINDUCTOR_CACHE_DIR``; ``removed`` is set when the
    context exits, checked while the lock is still held (another build of the same key may
    re-create the folder the moment the lock is released)."""

    def __init__(self, path: Path):
        self.path = path
        self.removed: bool | None = None
        self.tmp: Path | None = None  # in the shared compile folder, the compile's temporary folder inside it

    @property
    def shared(self) -> bool:
        """In the folder every user compiles in (:func:`inductor_cache`'s ``shared``)."""
        return self.tmp is not None

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
    """Where :func:`laya_build.stages.children.vec_isa.check_vec_isas` keeps Inductor's CPU-ISA checks, one folder
    per torch, compiler and CPU: paid once per toolchain, not once per compile."""
    return inductor_root() / "vec-isa"


# Where a package is compiled, whoever compiles it: AOTInductor writes the path into the package,
# so a folder under $TMPDIR or named by the user would give each user another package.
SHARED_COMPILE_ROOT = Path("/tmp/laya-build-compile")


def shared_compile_root() -> tuple[Path | None, str]:
    """:data:`SHARED_COMPILE_ROOT`, made (sticky and open to every user, as ``/tmp`` is) when
    missing, or None and why it cannot be used: it is not a directory of its own, it belongs to
    another user than this one or root (who could swap a folder inside it), or everyone may write
    to it and it is not sticky."""
    import stat

    root = SHARED_COMPILE_ROOT
    try:
        root.mkdir(mode=0o700)
        os.chmod(root, 0o1777)  # each user's folders in it are that user's alone (sticky bit)
    except FileExistsError:
        pass
    except OSError as exc:
        return None, f"it cannot be made ({exc})"
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode):
        return None, "it is not a directory"
    if st.st_uid not in (0, os.getuid()):
        return None, (
            f"it belongs to uid {st.st_uid}, neither this user nor root (to share it, have root make it as /tmp "
            f"is: `install -d -o root -m 1777 {root}`, once its owner has removed it)"
        )
    if st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
        return None, "everyone may write to it and it is not sticky"
    return root, ""


# The compile's TMPDIR inside its folder, and the one user name of every compile in the shared folder:
# Inductor keeps its precompiled headers in <TMPDIR>/torchinductor_<user>/precompiled_headers (the
# user from getpass: LOGNAME first) and writes that path into each compile command the package keeps.
COMPILE_TMP = "tmp"
COMPILE_USER = "laya-build"
HEADERS = "precompiled_headers"
COMPILE_PYTHON = "python"  # the compile folder's link to torch (:func:`torch_link`)


def precompiled_headers() -> Path:
    """This user's store of Inductor's precompiled headers for the shared compile folder, kept from
    one compile to the next (a header is built again only for another compiler, flags or torch)."""
    store = inductor_root() / "precompiled-headers"
    store.mkdir(mode=0o700, exist_ok=True)
    return store


def torch_link(folder: Path) -> Path:
    """``<folder>/python``, holding ``torch``: a link to the torch package this Python imports.
    First on the compile child's ``PYTHONPATH``, it makes the child import torch by that path, so
    the include folders AOTInductor compiles with, which each compile command and the compiled
    library's strings name, are the compile folder's and not the Python environment's (another
    checkout's ``.venv``, another user's environment)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    python = folder / COMPILE_PYTHON
    python.mkdir(mode=0o700)
    (python / "torch").symlink_to(os.path.realpath(Path(spec.origin).parent), target_is_directory=True)
    return python


def _compile_tmp(folder: Path) -> Path:
    """``<folder>/tmp``, the compile's ``TMPDIR``, with Inductor's folder of precompiled headers for
    :data:`COMPILE_USER` a link to this user's own store (:func:`precompiled_headers`): the same
    path in every user's compile, and no header another user could have written."""
    tmp = folder / COMPILE_TMP
    inductor = tmp / f"torchinductor_{COMPILE_USER}"
    inductor.mkdir(parents=True, mode=0o700)
    (inductor / HEADERS).symlink_to(precompiled_headers(), target_is_directory=True)
    return tmp


def _own_empty_folder(path: Path) -> tuple[str, int | None]:
    """Make ``path`` an empty folder of this user's alone (mode 700): ("", None), or why not and,
    where another user's folder stands there (which a sticky root does not let this user remove),
    that user's uid."""
    import stat

    for _ in range(10):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
                shutil.rmtree(path, ignore_errors=True)
            elif stat.S_ISLNK(st.st_mode) and st.st_uid == os.getuid():
                path.unlink()
            else:
                return f"{path} is left by uid {st.st_uid}", st.st_uid
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:  # another user's build made it in between: look again
            continue
        except OSError as exc:
            return f"{path} cannot be made ({exc})", None
        return "", None
    return f"{path} cannot be emptied (it is made again as it is removed)", None


def _lock_name(key: str, uid: int) -> str:
    """The lock file in the shared root of user ``uid``'s builds of ``key``: readable by every
    user, so that another user's build can wait for it (:func:`_wait_for_user`)."""
    return f".{key}.{uid}.lock"


def _wait_for_user(root: Path, key: str, uid: int) -> str:
    """Wait while a build of user ``uid`` holds the shared folder ``root/key`` (holds its lock
    file, which every user may read): "" once it has let go (and removed the folder), else why
    the folder stays theirs (no build of theirs holds it: one that did not finish left it, which
    only they or root may remove; or their lock cannot be read).  Root removes such a folder,
    holding their lock meanwhile (a build of theirs that starts then waits for it), and has ""."""
    import fcntl

    lock = root / _lock_name(key, uid)
    left = "no build of theirs holds it (only that user or root may remove it)"
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return left
    except OSError as exc:
        return f"its lock {lock} cannot be read ({exc.strerror})"
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return _remove_left(root / key, uid) if os.geteuid() == 0 else left
        except BlockingIOError:
            log.info(f"[laya] waiting for the compile folder {root / key} (lock {lock}, held by uid {uid}'s build)")
            fcntl.flock(fd, fcntl.LOCK_EX)
            return ""
    finally:
        os.close(fd)  # and with it this process's hold of their lock


def _remove_left(folder: Path, uid: int) -> str:
    """Remove ``folder``, which an unfinished build of user ``uid`` left (as root, under their
    lock): "" once it is gone, else why it stays."""
    try:
        shutil.rmtree(folder)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"no build of theirs holds it, and it cannot be removed ({exc})"
    log.info(
        f"[laya] removed the compile folder {folder}: uid {uid}'s build left it unfinished (none of theirs holds it)"
    )
    return ""


def _take_shared_folder(root: Path, key: str) -> str:
    """Make ``root/key`` this user's empty folder, waiting for another user's build that holds it:
    "" or why it cannot be had."""
    while True:
        why, theirs = _own_empty_folder(root / key)
        if theirs is None:
            return why
        if stays := _wait_for_user(root, key, theirs):
            return f"{why}, and {stays}"


def _holder_text() -> str:
    """What a build holding a compile folder is, for a build that waits for it: its task (the
    stage process's ``LAYA_TASK``) and its checkout (the working directory)."""
    return f"{os.environ.get('LAYA_TASK') or 'a build'} in {Path.cwd()}"


@contextlib.contextmanager
def inductor_cache(key: str, shared: bool = False):
    """A child process's own empty Inductor cache, at a path that depends only on ``key``
    (stage, target, dtype; for a package also its programs) and the user, outside the artifacts;
    with ``shared`` only on ``key``: ``/tmp/laya-build-compile/<key>`` whoever the user and
    whatever ``$TMPDIR`` (:func:`shared_compile_root`), with the compile's ``TMPDIR`` inside it
    (:func:`_compile_tmp`).

    AOTInductor writes its cache path into the package (compile-command comments, kernel
    file names, debug info), so a random ``mkdtemp`` name would make two builds of one
    exported program differ, and a folder named by the user or ``$TMPDIR`` two users' builds.
    The directory is emptied before and removed after use; an exclusive ``flock`` on a lock file
    of this user's serialises this user's concurrent builds of one key (of any checkout), and
    every check about the folder happens under that lock.  A shared folder is this user's alone
    while it is used (mode 700, in a sticky root); a build of another user that holds it is waited
    for.  Where it cannot be used (the root is not one to trust, another user's folder is left
    there with no build of theirs holding it), the user's own is, with one line saying why, and
    ``cache.shared`` is False.
    """
    with contextlib.ExitStack() as stack:
        cache = None
        if shared:
            root, why = shared_compile_root()
            if root is not None:
                lock = root / _lock_name(key, os.getuid())  # this user's, whatever its $TMPDIR
                try:
                    what = f"the compile folder {root / key} (another build compiles the same programs)"
                    stack.enter_context(held(lock, what, mode=0o644, holder=_holder_text()))
                    os.chmod(lock, 0o644)  # (a lock file of an earlier version: this user's alone)
                    why = _take_shared_folder(root, key)
                except PermissionError as exc:  # a lock file of this name planted by another user
                    why = f"its lock cannot be taken ({exc})"
                if why:
                    stack.close()
                else:
                    cache = InductorCache(root / key)
                    cache.tmp = _compile_tmp(cache.path)
            if cache is None:
                log.info(
                    f"[laya] the shared compile folder {SHARED_COMPILE_ROOT / key} cannot be used: {why}; compiling "
                    "in this user's own folder, so the package's bytes differ from a build in the shared one"
                )
        if cache is None:
            user = inductor_root()
            stack.enter_context(
                held(
                    user / f"{key}.lock",
                    f"the Inductor cache {key} (another build compiles the same stage)",
                    holder=_holder_text(),
                )
            )
            cache = InductorCache(user / key)
            shutil.rmtree(cache.path, ignore_errors=True)
            cache.path.mkdir()
        try:
            yield cache
        finally:
            shutil.rmtree(cache.path, ignore_errors=True)
            cache.removed = not cache.path.exists()
