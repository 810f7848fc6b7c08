"""One stage task, described once: what it runs, reads, writes and compares.

A :class:`Stage` is built once per task from the validated configuration
(:mod:`laya_build.tasks`); the task package turns it into a doit task, the up-to-date checks
read it (:mod:`laya_build.tasks.checks`), and the runner executes it and alone writes its
record (:func:`laya_build.runner.stage.run_stage`).  Every path in it comes from
:mod:`laya_build.layout`.  Like DVC's ``Stage``, it carries its dependencies and outputs from
load to run; unlike doit's task dicts, it knows nothing of doit.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from laya_build import filedigests
from laya_build.layout import tmp_leftovers

# How a stage's function runs: a child forked from the build's fork server (torch and
# TileLang imported once), a fresh interpreter, or in the doit process itself (no heavy import).
PROCESSES = ("fork", "fresh", "inline")


@dataclass(frozen=True)
class Stage:
    basename: str  # the doit task: "export"
    name: str | None  # its sub-task: "cpu-float32" (None: a task of its own, e.g. "release")
    doc: str
    entry: str  # "module:function", called with ``**spec``
    spec: dict = field(default_factory=dict)  # the function's keyword arguments (JSON)
    process: str = "fork"
    record: Path | None = None  # the record the runner validates and writes (the function returns it)
    files: tuple[Path, ...] = ()  # output files besides the record
    dirs: tuple[Path, ...] = ()  # output folders, owned with everything in them
    inputs: tuple[Path, ...] = ()  # files read besides the project's code
    schemas: tuple[str, ...] = ()  # schemas of the records it writes and reads
    config: dict = field(default_factory=dict)  # the configuration slice its up-to-date check compares
    code: tuple[str, ...] = ()  # modules beyond ``entry`` whose import closure it depends on
    code_excluded: tuple[str, ...] = ()  # project packages its code dependencies leave out (``kernels``)
    sys_path: tuple[str, ...] = ()  # folders put first on the process's ``sys.path``
    env: dict = field(default_factory=dict)  # environment of its process
    writes_into: Path | None = None  # the version folder it writes into (never a released one)
    outputs_record: Path | None = None  # the digest of its outputs after its last complete run
    always: bool = False  # never up to date (verify)
    task_dep: tuple[str, ...] = ()
    verbose: bool = False  # show its progress lines as they come
    tools: tuple[str, ...] = ()  # compilers this task runs beyond its module's ``TOOLS`` (its configuration's)

    def __post_init__(self):
        if self.process not in PROCESSES:
            raise ValueError(f"{self.task}: process {self.process!r} is not one of {', '.join(PROCESSES)}")

    @property
    def task(self) -> str:
        """The doit task name: ``basename:name``."""
        return f"{self.basename}:{self.name}" if self.name else self.basename

    @property
    def module(self) -> str:
        return self.entry.split(":", 1)[0]

    @property
    def function(self) -> str:
        return self.entry.split(":", 1)[1]

    @property
    def label(self) -> str:
        """How progress lines and errors name it: ``export cpu-float32``."""
        return f"{self.basename} {self.name}" if self.name else self.basename

    @property
    def targets(self) -> tuple[Path, ...]:
        return (*self.files, *((self.record,) if self.record else ()))

    @property
    def outputs(self) -> Outputs:
        return Outputs(self.targets, self.dirs, self.outputs_record)


def outputs_digest(files: tuple[Path, ...], dirs: tuple[Path, ...]) -> dict[str, str | None]:
    """sha256 of every output: the files (None when missing; an interrupted write's temporary
    file beside one counts as an output of its own) and every file under the folders (hashed
    once while unchanged: :mod:`laya_build.filedigests`)."""
    digest: dict[str, str | None] = {}
    for path in files:
        digest[str(path)] = filedigests.sha256(path) if path.is_file() else None
        for tmp in tmp_leftovers(path):
            digest[str(tmp)] = "unfinished write"
    for folder in dirs:
        if folder.is_dir():
            for path in sorted(folder.rglob("*")):
                if path.is_file():
                    digest[str(path)] = filedigests.sha256(path)
        else:
            digest[str(folder)] = None
    return digest


class Outputs:
    """The outputs a stage owns (files, and folders with everything in them) and the digest its
    last complete run left (``artifacts/.doit/outputs/<version>/<task>.json``: written once the
    outputs are complete, removed when a run starts)."""

    def __init__(self, files=(), dirs=(), sidecar: Path | None = None):
        self.files = tuple(Path(f) for f in files)
        self.dirs = tuple(Path(d) for d in dirs)
        self.sidecar = Path(sidecar) if sidecar else None

    def digest(self) -> dict[str, str | None]:
        return outputs_digest(self.files, self.dirs)

    def saved(self) -> dict | None:
        if self.sidecar is None:
            return None
        try:
            return json.loads(self.sidecar.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def changes(self) -> list[str]:
        saved = self.saved()
        if saved is None:
            return ["no complete run recorded"]
        now = self.digest()
        return [
            f"{path}: {_what(saved.get(path), now.get(path))}"
            for path in sorted(set(saved) | set(now))
            if saved.get(path) != now.get(path)
        ]

    def altered(self) -> list[tuple[str, str, str]]:
        """(path, sha256 now, sha256 written) of every output changed since its task wrote it
        (a missing one is not altered: an interrupted run never leaves a digest)."""
        saved = self.saved() or {}
        now = self.digest() if saved else {}
        return [(p, now[p], h) for p, h in saved.items() if h is not None and now.get(p) not in (None, h)]

    def save(self) -> None:
        if self.sidecar is None:
            return
        from laya_build.atomic import write_json

        write_json(self.sidecar, self.digest())

    def forget(self) -> None:
        if self.sidecar is not None:
            self.sidecar.unlink(missing_ok=True)

    def clear(self) -> None:
        """Remove the outputs and whatever an interrupted run left (temporary files beside its
        files, anything in its folders)."""
        for path in self.files:
            path.unlink(missing_ok=True)
            for tmp in tmp_leftovers(path):
                tmp.unlink(missing_ok=True)
        for folder in self.dirs:
            shutil.rmtree(folder, ignore_errors=True)


def _what(before, after) -> str:
    if before is None and after is not None:
        return "appeared" if after != "unfinished write" else "unfinished write left behind"
    if after is None:
        return "missing"
    return f"bytes changed (sha256 {after[:12]}... != {before[:12]}... after the last run)"
