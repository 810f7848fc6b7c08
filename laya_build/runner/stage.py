"""Running a :class:`~laya_build.stage.Stage`: the one place a stage's outputs and record are written."""

from __future__ import annotations

import importlib

from laya_build.errors import OutputsTampered
from laya_build.runner.process import Child, run
from laya_build.stage import Stage


def run_stage(stage: Stage):
    """Run ``stage``: refuse to write into a released (or damaged) version, or over outputs
    altered since their task wrote them; clear its outputs (nothing of an earlier or
    interrupted run survives into a release); run its function in its process; validate and
    write the record it returns; record the digest of its outputs once they are complete.
    Returns what the function returned."""
    from laya_build import release

    if stage.writes_into is not None:
        release.refuse_if_released(stage.writes_into, stage.label)
    outputs = stage.outputs
    if altered := outputs.altered():
        path, now, then = altered[0]
        names = ", ".join(p for p, _, _ in altered)
        raise OutputsTampered(
            f"{stage.task}: {names} changed after {stage.task} wrote {'them' if len(altered) > 1 else 'it'} "
            f"(sha256 {now} != {then}); nothing builds on or verifies altered outputs",
            hint=f"`doit clean {stage.task}` removes them so that the next run rebuilds them")
    outputs.forget()
    outputs.clear()
    if stage.process == "inline":
        value = _call(stage)
    else:
        child = Child(fork=stage.process == "fork", env=stage.env or None, label=stage.label,
                      sys_path=stage.sys_path, task=stage.task)
        value = run(stage.entry, stage.spec, child, record=stage.record, result=True)
    outputs.save()
    return value


def _call(stage: Stage):
    """An inline stage: its function in this process, its record validated and written here."""
    from laya_build.records import write_record

    value = getattr(importlib.import_module(stage.module), stage.function)(**stage.spec)
    if stage.record is not None:
        write_record(stage.record, value)
    return value
