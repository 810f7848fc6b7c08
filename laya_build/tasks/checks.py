"""doit up-to-date checks beyond ``config_changed``: the outputs and the toolchain.

Each is an object with ``configure_task`` (saving the state after a successful run, like
doit's own ``config_changed``) and ``__call__(task, values)`` (True when unchanged).  When a
check fails, its ``repr`` says what changed, which is what ``doit info <task>`` prints.
"""
from __future__ import annotations

import json
from pathlib import Path

from laya_build import environment as toolchain
from laya_build.errors import OutputsTampered  # noqa: F401  (OutputsTampered re-exported)
from laya_build.layout import tmp_leftovers
from laya_build.records import sha256_file


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




class Outputs:
    """The outputs a task owns (files, and folders with everything in them) and the digest
    its last successful run left, kept beside doit's state
    (``artifacts/.doit/outputs/<version>/<task>.json``, written by the action itself once the
    outputs are complete, removed when a run starts)."""

    def __init__(self, files=(), dirs=(), sidecar: Path | None = None):
        self.files = tuple(Path(f) for f in files)
        self.dirs = tuple(Path(d) for d in dirs)
        self.sidecar = Path(sidecar) if sidecar else None

    def digest(self) -> dict[str, str | None]:
        return outputs_digest(self.files, self.dirs)

    def saved(self) -> dict | None:
        try:
            return json.loads(self.sidecar.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def changes(self) -> list[str]:
        saved = self.saved()
        if saved is None:
            return ["no complete run recorded"]
        now = self.digest()
        return [f"{path}: {_what(saved.get(path), now.get(path))}"
                for path in sorted(set(saved) | set(now)) if saved.get(path) != now.get(path)]

    def check_untampered(self, task: str) -> None:
        """Refuse to build over outputs that were modified after this task wrote them (an
        interrupted run never leaves a record, so this is never a kill's leftover)."""
        saved = self.saved()
        if saved is None:
            return
        now = self.digest()
        altered = [p for p, h in saved.items() if h is not None and now.get(p) not in (None, h)]
        if altered:
            raise OutputsTampered(
                f"{task}: {', '.join(altered)} changed after {task} wrote {'them' if len(altered) > 1 else 'it'} "
                f"(sha256 {now[altered[0]]} != {saved[altered[0]]}); nothing builds on or verifies altered "
                f"outputs. `doit clean {task}` removes them so that the next run rebuilds them")

    def save(self) -> None:
        from laya_build.atomic import write_json

        write_json(self.sidecar, self.digest())

    def forget(self) -> None:
        if self.sidecar is not None:
            self.sidecar.unlink(missing_ok=True)


class outputs_unchanged:  # noqa: N801  (named like doit's config_changed)
    """Up to date only while every output still has the bytes the last complete run left:
    a missing output, an extra file in an owned folder or an interrupted write's leftover
    re-runs the task; an output whose bytes changed fails it, naming the file."""

    def __init__(self, outputs: Outputs):
        self.outputs = outputs
        self.found: list[str] = []

    def __call__(self, task, values):
        self.found = self.outputs.changes()
        return not self.found

    def __repr__(self):
        return "outputs_unchanged: " + ("; ".join(self.found) if self.found else "unchanged")


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
