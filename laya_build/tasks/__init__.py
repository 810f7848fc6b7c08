"""The doit task graph, built from a validated :class:`~laya_build.config.Pipeline`.

This package is the only code that knows doit: :mod:`.build` (a :class:`laya_build.stage.Stage`
as a doit task: the one builder), :mod:`.deps` (dependencies derived from the sources),
:mod:`.checks` (outputs and toolchain up-to-date checks), :mod:`.kernels`, :mod:`.model` and
:mod:`.release` (the stages of each task), :mod:`.dispatch` (the order doit starts ready tasks
in), :mod:`.state` (doit's task state, kept across a kill), :mod:`.exits` (exit status 3 for
configuration and command-line errors).  Building the graph imports no torch, tilelang or
transformers.
"""

from __future__ import annotations

import sys
from pathlib import Path

from doit import doit_cmd

from laya_build import PROJECT_ROOT, filedigests
from laya_build import config as config_mod
from laya_build.environment import usable_cores
from laya_build.locks import run_lock
from laya_build.runner.stage import remove_partial_files
from laya_build.tasks import cache, dispatch, exits, run, state
from laya_build.tasks.kernels import cuda_diff_tasks, cuda_source_tasks, lower_c_tasks, probe_c_tasks, tir_tasks
from laya_build.tasks.model import (
    aoti_package_tasks,
    check_verifiable,
    export_tasks,
    latency_tasks,
    model_builds,
    model_tasks,
    verify_tasks,
)
from laya_build.tasks.release import STAGE_GENERATORS, check_keys, release_diff_task, release_task

__all__ = [
    "load_pipeline",
    "doit_config",
    "tir_tasks",
    "probe_c_tasks",
    "lower_c_tasks",
    "cuda_source_tasks",
    "cuda_diff_tasks",
    "model_tasks",
    "export_tasks",
    "aoti_package_tasks",
    "verify_tasks",
    "latency_tasks",
    "release_task",
    "release_diff_task",
    "model_builds",
    "STAGE_GENERATORS",
]

dispatch.install()  # a task whose dependencies just finished starts first (see dispatch)
state.install()  # doit's sqlite3 backend commits each task's state when it is recorded (see state)
exits.install()  # a run whose failures are all configuration or command-line errors exits 3 (see exits)

DEFAULT_TASKS = ["tir", "probe_c", "lower_c", "cuda_source", "cuda_diff"]


def load_pipeline(root: Path = PROJECT_ROOT) -> config_mod.Pipeline:
    """The pipeline of ``root``, with ``doit config=... version=... release=...`` applied."""
    variables = dict(doit_cmd._CMDLINE_VARS or {})
    pipeline = config_mod.from_command_line(variables, root=root, given=typed_variables(variables))
    run.install(
        lambda selected: (
            check_keys(pipeline, selected),  # keys that cannot be used stop the run before its first task
            check_verifiable(pipeline, selected),  # verify builds nothing
            cache.before_run(pipeline, selected),  # one warning for a cache that does not answer
        ),
        lambda: run_lock(
            pipeline.artifacts.run_lock(pipeline.version), f"version {pipeline.version}", wait=pipeline.wait
        ),
        lambda: remove_partial_files(pipeline.artifacts.written_by_run(pipeline.version)),
    )  # one run per version at a time
    return pipeline


def typed_variables(variables: dict) -> list[tuple[str, str]] | None:
    """Every ``name=value`` of this process's command line as typed (doit keeps only the last
    value of a name), when that command line is the one doit parsed (not when doit runs
    inside another program)."""
    typed = [tuple(arg.split("=", 1)) for arg in sys.argv[1:] if arg[:1] != "-" and "=" in arg]
    return typed if dict(typed) == variables else None


def default_processes() -> int:
    """``doit -n`` when none is given: every core (stages are separate processes)."""
    return usable_cores()


def doit_config(p: config_mod.Pipeline) -> dict:
    db = p.artifacts.doit_db(p.version)
    db.parent.mkdir(parents=True, exist_ok=True)
    filedigests.use(p.artifacts.digests_db())  # doit's processes hash a file once while it is unchanged
    return {
        # sqlite3: transactional, unlike dbm (locks and corrupts under concurrent runs) and json
        # (rewritten whole with a plain open(): an interrupted dump leaves it truncated), and
        # committed task by task (.state: a killed build keeps what it finished).  One
        # database per version: the task state of one version never answers for another.
        "backend": "sqlite3",
        "dep_file": str(db),
        "default_tasks": DEFAULT_TASKS,
        "num_process": default_processes(),
        "check_file_uptodate": state.Sha256Checker,
    }
