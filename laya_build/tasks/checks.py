"""doit up-to-date checks beyond ``config_changed``: the outputs and the toolchain.

Each is an object with ``configure_task`` (saving the state after a successful run, like
doit's own ``config_changed``) and ``__call__(task, values)`` (True when unchanged).  When a
check fails, its ``repr`` says what changed, which is what ``doit info <task>`` prints.
"""
from __future__ import annotations

from pathlib import Path

from .. import toolchain
from ..layout import tmp_leftovers
from ..records import sha256_file


def outputs_digest(files: tuple[Path, ...], dirs: tuple[Path, ...]) -> dict[str, str | None]:
    """sha256 of every output: the files (None when missing; an interrupted write's temporary
    file beside one counts as an output of its own) and every file under the folders."""
    digest: dict[str, str | None] = {}
    for path in files:
        digest[str(path)] = sha256_file(path) if path.is_file() else None
        for tmp in tmp_leftovers(path):
            digest[str(tmp)] = "unfinished write"
    for folder in dirs:
        if folder.is_dir():
            for path in sorted(folder.rglob("*")):
                if path.is_file():
                    digest[str(path)] = sha256_file(path)
        else:
            digest[str(folder)] = None
    return digest


class outputs_unchanged:  # noqa: N801  (named like doit's config_changed)
    """Up to date only while every output still has the bytes the last successful run left
    (a tampered, truncated, extra or missing output re-runs the task that owns it)."""

    KEY = "_outputs"

    def __init__(self, files=(), dirs=()):
        self.files = tuple(Path(f) for f in files)
        self.dirs = tuple(Path(d) for d in dirs)
        self.changes: list[str] = []

    def configure_task(self, task):
        task.value_savers.append(lambda: {self.KEY: outputs_digest(self.files, self.dirs)})

    def __call__(self, task, values):
        saved = values.get(self.KEY)
        if saved is None:
            self.changes = ["no record of a successful run"]
            return False
        now = outputs_digest(self.files, self.dirs)
        self.changes = [f"{path}: {_what(saved.get(path), now.get(path))}"
                        for path in sorted(set(saved) | set(now)) if saved.get(path) != now.get(path)]
        return not self.changes

    def __repr__(self):
        return "outputs_unchanged: " + ("; ".join(self.changes) if self.changes else "unchanged")


def _what(before, after) -> str:
    if before is None and after is not None:
        return "appeared" if after != "unfinished write" else "unfinished write left behind"
    if after is None:
        return "missing"
    return f"bytes changed (sha256 {after[:12]}... != {before[:12]}... after the last run)"


class toolchain_unchanged:  # noqa: N801
    """Up to date only while the installed distributions the stage imports (and what they
    require), its compilers and Python are the versions of the last successful run."""

    KEY = "_toolchain"

    def __init__(self, imports: frozenset[str], tools: tuple[str, ...] = ()):
        self.imports = frozenset(imports)
        self.tools = tuple(tools)
        self.changes: list[str] = []

    def fingerprint(self) -> dict:
        return toolchain.fingerprint(self.imports, self.tools)

    def configure_task(self, task):
        task.value_savers.append(lambda: {self.KEY: self.fingerprint()})

    def __call__(self, task, values):
        saved = values.get(self.KEY)
        if saved is None:
            self.changes = ["no record of a successful run"]
            return False
        self.changes = toolchain.describe_changes(saved, self.fingerprint())
        return not self.changes

    def __repr__(self):
        return "toolchain_unchanged: " + ("; ".join(self.changes) if self.changes else "unchanged")
