"""Folders of a user that outlive one build but belong in no checkout's artifacts: the fork
servers' places and the Inductor caches of stage children."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from laya_build.locks import held


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
    """Where :func:`laya_build.stages.children.vec_isa.check_vec_isas` keeps Inductor's CPU-ISA checks, one folder
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
    with held(root / f"{key}.lock", f"the Inductor cache {key} (another build compiles the same stage)"):
        shutil.rmtree(cache.path, ignore_errors=True)
        cache.path.mkdir()
        try:
            yield cache
        finally:
            shutil.rmtree(cache.path, ignore_errors=True)
            cache.removed = not cache.path.exists()
