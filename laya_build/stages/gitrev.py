"""Kernels at a git revision, extracted into an isolated folder (for ``cuda_diff`` baselines)."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from laya_build.errors import GitRefError  # noqa: F401  (GitRefError re-exported)


def resolve(root: Path, ref: str) -> str:
    """The commit sha ``ref`` names in the repository at ``root``."""
    proc = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=root, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise GitRefError(f"cuda.baseline.git_ref: {ref!r} is not a commit of the repository at {root}")
    return proc.stdout.strip()


def kernels_tree(root: Path, sha: str) -> str:
    """The git tree id of ``kernels/`` at ``sha``: baseline sources depend on it alone, so a
    commit that leaves kernels/ alone does not regenerate them."""
    proc = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{sha}:kernels"], cwd=root, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise GitRefError(f"cuda.baseline.git_ref: commit {sha} has no kernels/")
    return proc.stdout.strip()


def extract_kernels(root: Path, sha: str, dest: Path) -> Path:
    """Write ``kernels/`` as of ``sha`` to ``dest/kernels`` (atomically: temp dir + rename).

    Returns ``dest``, the folder to put first on ``sys.path`` so ``import kernels`` loads the
    baseline instead of the working tree.
    """
    root, dest = Path(root), Path(dest)
    if (dest / "kernels" / "__init__.py").is_file():
        return dest
    proc = subprocess.run(["git", "archive", "--format=tar", sha, "kernels"], cwd=root, capture_output=True)
    if proc.returncode != 0:
        raise GitRefError(f"cuda.baseline.git_ref: commit {sha} has no kernels/ ({proc.stderr.decode().strip()})")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def lowering_module(root: Path, sha: str) -> str:
    """The module of ``kernels`` at ``sha`` that lowers to CUDA: ``kernels.lowering``, or
    ``kernels.probe`` at revisions from before it was split out."""
    proc = subprocess.run(["git", "cat-file", "-e", f"{sha}:kernels/lowering.py"], cwd=root, capture_output=True)
    return "kernels.lowering" if proc.returncode == 0 else "kernels.probe"
