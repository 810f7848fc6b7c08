"""Running a :class:`~laya_build.stage.Stage`: the one place a stage's outputs and record are written."""

from __future__ import annotations

import contextlib
import importlib
import os

from laya_build import errors
from laya_build.diskspace import full_near, is_no_space
from laya_build.errors import DiskFullError, OutputsTampered
from laya_build.layout import partial_files
from laya_build.runner.process import Child, run
from laya_build.stage import Outputs, Stage


def run_stage(stage: Stage):
    """Run ``stage``: refuse to write into a released (or damaged) version, or over outputs
    altered since their task wrote them; clear its outputs (nothing of an earlier or
    interrupted run survives into a release); run its function in its process; validate and
    write the record it returns; record the digest of its outputs once they are complete.
    Returns what the function returned."""
    outputs = prepare_outputs(stage)
    try:
        if stage.process == "inline":
            value = _call(stage)
        else:
            child = Child(
                fork=stage.process == "fork",
                env=stage.env or None,
                label=stage.label,
                sys_path=stage.sys_path,
                task=stage.task,
            )
            value = run(stage.entry, stage.spec, child, record=stage.record, result=True)
        outputs.save()
    except DiskFullError:
        remove_partial(stage)
        raise
    except Exception as exc:
        full = _full_disk(stage, exc)  # asked before the partial files are removed
        remove_partial(stage)
        if full is not None:
            raise full from exc
        raise
    return value


def prepare_outputs(stage: Stage) -> Outputs:
    """Before anything writes ``stage``'s outputs (a run, or a fetch from the cache): refuse a
    released (or damaged) version and outputs altered since their task wrote them; then forget
    their digest and clear them."""
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
            hint=f"`doit clean {stage.task}` removes them so that the next run rebuilds them",
        )
    outputs.forget()
    outputs.clear()
    return outputs


def remove_partial(stage: Stage) -> list[str]:
    """Remove what a failed run of ``stage`` left half-written: the temporary files of atomic
    writes and ``.partial`` files (e.g. a package being compiled) in its outputs."""
    return remove_partial_files({*stage.dirs, *(f.parent for f in stage.targets)})


def remove_partial_files(folders) -> list[str]:
    """Remove every half-written file under ``folders`` (:func:`laya_build.layout.partial_files`)."""
    removed = []
    for folder in folders:
        for path in partial_files(folder):
            path.unlink(missing_ok=True)
            removed.append(str(path))
    return removed


def _full_disk(stage: Stage, exc: Exception) -> DiskFullError | None:
    """The disk-full error a stage's failure stands for: the disk of its outputs (or of doit's
    state) ran out of space."""
    if isinstance(exc, DiskFullError):
        return None
    places = [*stage.dirs, *stage.targets, *([stage.outputs_record] if stage.outputs_record else [])]
    found = full_near(places)
    if found is None and not is_no_space(exc):
        return None
    if found:
        path, free = found
    else:
        path, free = str(getattr(exc, "filename", None) or (places[0] if places else stage.task)), None
    cause = (
        errors.message_of(exc).splitlines()[0][:300]
        if isinstance(exc, errors.LayaBuildError)
        else f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    )
    room = f"{free:,} bytes free" if free is not None else "no space"
    return DiskFullError(
        f"{stage.task}: the filesystem of {path} is full ({room}); the stage failed with: {cause}; "
        "its partial files were removed"
    )


def _call(stage: Stage):
    """An inline stage: its function in this process, its record validated and written here,
    with the stage's environment (and ``LAYA_TASK``) set while it runs, as a stage process has
    it, so that the processes it starts inherit it."""
    from laya_build.records import write_record

    with _environment({**stage.env, **({"LAYA_TASK": stage.task} if stage.task else {})}):
        value = getattr(importlib.import_module(stage.module), stage.function)(**stage.spec)
    if stage.record is not None:
        write_record(stage.record, value)
    return value


@contextlib.contextmanager
def _environment(env: dict):
    """``env`` in ``os.environ`` within the block, what was there before restored after it (doit
    runs one task at a time in a process)."""
    before = {name: os.environ.get(name) for name in env}
    os.environ.update({name: str(value) for name, value in env.items()})
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
