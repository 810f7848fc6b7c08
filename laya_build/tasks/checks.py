"""doit up-to-date checks beyond ``config_changed``: the outputs and the toolchain.

Each is an object with ``configure_task`` (saving the state after a successful run, like
doit's own ``config_changed``) and ``__call__(task, values)`` (True when unchanged).  When a
check fails, its ``repr`` says what changed, which is what ``doit info <task>`` prints.
"""

from __future__ import annotations

from laya_build import environment
from laya_build.stage import Outputs


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


class toolchain_unchanged:  # noqa: N801
    """Up to date only while the installed distributions the stage imports (and what they
    require), its compilers and Python are the versions of the last successful run."""

    KEY = "_toolchain"

    def __init__(self, imports: frozenset[str], tools: tuple[str, ...] = ()):
        self.imports = frozenset(imports)
        self.tools = tuple(tools)
        self.changes: list[str] = []

    def fingerprint(self) -> dict:
        return environment.fingerprint(self.imports, self.tools)

    def configure_task(self, task):
        task.value_savers.append(lambda: {self.KEY: self.fingerprint()})

    def __call__(self, task, values):
        saved = values.get(self.KEY)
        if saved is None:
            self.changes = ["no record of a successful run"]
            return False
        self.changes = environment.describe_changes(saved, self.fingerprint())
        return not self.changes

    def __repr__(self):
        return "toolchain_unchanged: " + ("; ".join(self.changes) if self.changes else "unchanged")
