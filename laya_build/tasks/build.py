"""A :class:`~laya_build.stage.Stage` as a doit task: the one builder of task dicts.

A stage task's dependencies are derived (:mod:`laya_build.deps`): the project files its
process can import or read, the schemas of the records it writes and reads, the inputs it
is given, the config slice it reads plus the version it builds into, the installed
toolchain (:mod:`laya_build.environment`) and the bytes of its own outputs.  With a cache
configured, the same things, by content, are its cache key (:mod:`laya_build.tasks.cache`).
"""

from __future__ import annotations

from pathlib import Path

from doit.tools import config_changed

from laya_build import deps, release
from laya_build.deps import RUNNER, code_deps  # noqa: F401  (RUNNER re-exported)
from laya_build.log import get_logger
from laya_build.stage import Stage
from laya_build.tasks.checks import outputs_unchanged, toolchain_unchanged
from laya_build.tasks.failures import UserTaskFailed, failure, reported  # noqa: F401  (re-exported)

log = get_logger(__name__)


def clean_action(version, version_dir: Path, stage: Stage) -> list:
    """``clean``: remove a task's outputs (and its record of them), never in a released (or
    damaged) version."""

    def clean(task):
        if (state := release.state(version_dir)) in ("released", "damaged"):
            log.info(f"laya-build: not cleaning {task.name}: version {version} is {state} and immutable")
            return None
        outputs = stage.outputs
        outputs.forget()
        outputs.clear()
        return None

    return [clean]


def stage_action(stage: Stage):
    """The doit python-action that runs ``stage`` (:func:`laya_build.runner.stage.run_stage`)."""

    @reported()
    def action():
        from laya_build.runner.stage import run_stage

        run_stage(stage)

    action.__name__ = stage.task
    return action


def doit_task(p, stage: Stage) -> dict:
    """The doit task dict of ``stage`` in the pipeline ``p``."""
    code, third_party = code_deps(p.root, stage)
    tools = deps.stage_tools(stage, p.root)
    uptodate = (
        [False]
        if stage.always
        else [
            config_changed({**stage.config, "version": p.version}),
            toolchain_unchanged(third_party, tools),
            outputs_unchanged(stage.outputs),
        ]
    )
    from laya_build.tasks import cache

    action = cache.cached_action(p, stage, code, third_party, tools) if cache.wanted(p) else stage_action(stage)
    task = {
        "doc": stage.doc,
        "actions": [action],
        "file_dep": code + [str(i) for i in stage.inputs],
        "targets": [str(t) for t in stage.targets],
        "uptodate": uptodate,
        "clean": clean_action(p.version, p.version_dir, stage),
        "task_dep": list(stage.task_dep),
    }
    if stage.name is not None:
        task["name"] = stage.name
    if stage.verbose:
        task["verbosity"] = 2
    return task


def stage_env(p) -> dict:
    # TileLang's compile cache lives beside the versions, never inside a release.
    return {"TILELANG_CACHE_DIR": str(p.artifacts.cache("tilelang"))}


def version_stage(p, basename: str, name: str | None, **fields) -> Stage:
    """A stage that writes into the version ``p`` builds: it refuses a released version, and its
    outputs' digest lives beside doit's state of that version."""
    task = f"{basename}:{name}" if name else basename
    return Stage(
        basename=basename,
        name=name,
        writes_into=p.version_dir,
        env=stage_env(p),
        outputs_record=p.artifacts.outputs_record(p.version, task),
        **fields,
    )
