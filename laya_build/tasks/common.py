"""The one builder of stage tasks, and what every task shares (actions, cleaning, checks).

A stage task's dependencies are derived (:mod:`laya_build.tasks.deps`): the project files its
process can import or read, the schemas of the records it writes and reads, the inputs it
is given, the config slice it reads plus the version it builds into, the installed
toolchain (:mod:`laya_build.environment`) and the bytes of its own outputs.
"""
from __future__ import annotations

import functools
import shutil
from pathlib import Path

from doit.exceptions import TaskFailed
from doit.tools import config_changed

from laya_build import SCHEMA_DIR, release, runner
from laya_build.errors import LayaBuildError
from laya_build.layout import tmp_leftovers
from laya_build.log import get_logger
from laya_build.tasks import deps
from laya_build.tasks.checks import Outputs, outputs_unchanged, toolchain_unchanged

log = get_logger(__name__)

RUNNER = "laya_build.runner"


def reported(prefix: str = "", *extra: type[BaseException]):
    """Decorate a doit python-action: an expected failure (any :class:`LayaBuildError`)
    becomes a ``TaskFailed`` with its own message, not a traceback."""
    errors = (LayaBuildError, *extra)

    def wrap(fn):
        @functools.wraps(fn)
        def action(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except errors as exc:
                return TaskFailed(f"{prefix}{exc}")

        return action

    return wrap


def clear_outputs(files=(), dirs=()) -> None:
    """Remove a task's outputs and whatever an interrupted run of it left (temporary files
    beside its files, anything in its folders)."""
    for path in map(Path, files):
        path.unlink(missing_ok=True)
        for tmp in tmp_leftovers(path):
            tmp.unlink(missing_ok=True)
    for folder in map(Path, dirs):
        shutil.rmtree(folder, ignore_errors=True)


def clean_action(p, outputs: Outputs) -> list:
    """``clean``: remove a task's outputs (and its record of them), never in a released (or
    damaged) version."""

    def clean(task):
        if (state := release.state(p.version_dir)) in ("released", "damaged"):
            log.info(f"laya-build: not cleaning {task.name}: version {p.version} is {state} and immutable")
            return None
        outputs.forget()
        clear_outputs(outputs.files, outputs.dirs)
        return None

    return [clean]


def task_outputs(p, task_name: str, files=(), dirs=()) -> Outputs:
    return Outputs(files, dirs, p.artifacts.outputs_record(p.version, task_name))


def stage_env(p) -> dict:
    # TileLang's compile cache lives beside the versions, never inside a release.
    return {"TILELANG_CACHE_DIR": str(p.artifacts.cache("tilelang"))}


def stage_action(p, task_name: str, module: str, function: str, spec: dict, outputs: Outputs, *,
                 record: Path | None = None, kwargs: bool = False, label: str | None = None, extra_path=None,
                 fork: bool = False):
    """A doit python-action running ``module.function`` in a process of its own (a fork of a
    pre-imported server with ``fork``, else a fresh interpreter).  Refuses to write into a
    released or damaged version, or over outputs altered since they were written; clears
    the task's outputs first (nothing of an earlier or interrupted run survives into a
    release) and records their digest once they are complete."""
    env = stage_env(p)

    @reported()
    def action():
        release.refuse_if_released(p.version_dir, label or module)
        outputs.check_untampered(task_name)
        outputs.forget()
        clear_outputs(outputs.files, outputs.dirs)
        runner.run(module, function, spec, record=record, extra_path=extra_path, label=label, env=env,
                    kwargs=kwargs, fork=fork, task=task_name)
        outputs.save()

    action.__name__ = f"{module.rsplit('.', 1)[-1]}:{label or function}"
    return action


def derived_deps(p, entries: tuple[str, ...], schemas: tuple[str, ...]) -> tuple[list[str], frozenset[str]]:
    """(project files + schema files, third-party imports) of a stage process."""
    files, third_party = deps.project(p.root).closure(entries)
    schema_files = deps.schema_closure(p.root / SCHEMA_DIR.name, schemas)
    return sorted(str(f) for f in files | schema_files), third_party


def stage_task(p, *, name, doc, module: str, function: str, spec: dict, config: dict, record: Path | None = None,
               files=(), dirs=(), inputs=(), schemas=(), kernel_module: str | None = None, kwargs: bool = False,
               label: str | None = None, extra_path=None, fork: bool = False, always: bool = False,
               basename: str, **extra) -> dict:
    """One sub-task dict of a stage: ``module.function(spec)`` writing ``record`` and the
    output ``files`` / ``dirs``; ``inputs`` are the files it reads besides its code;
    ``schemas`` the stages whose records it validates (its own first)."""
    entries = (RUNNER, module) + ((kernel_module,) if kernel_module else ())
    code, third_party = derived_deps(p, entries, schemas)
    tools = tuple(deps.module_constant(module, "TOOLS", (), root=p.root))
    outs = [*files, *([record] if record else [])]
    outputs = task_outputs(p, f"{basename}:{name}", outs, dirs)
    uptodate = [False] if always else [
        config_changed({**config, "version": p.version}),
        toolchain_unchanged(third_party, tools),
        outputs_unchanged(outputs),
    ]
    return {
        "name": name,
        "doc": doc,
        "actions": [stage_action(p, f"{basename}:{name}", module, function, spec, outputs, record=record,
                                 kwargs=kwargs, label=label, extra_path=extra_path, fork=fork)],
        "file_dep": code + [str(i) for i in inputs],
        "targets": [str(t) for t in outs],
        "uptodate": uptodate,
        "clean": clean_action(p, outputs),
        **extra,
    }
