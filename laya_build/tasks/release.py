"""Release tasks: ``release`` (REPORT.md + manifest.json, last) and ``release_diff``."""
from __future__ import annotations

from pathlib import Path

from doit import get_var
from doit.exceptions import TaskFailed

from laya_build import config as config_mod
from laya_build import release, runner
from laya_build.log import get_logger
from laya_build.tasks import kernels, model
from laya_build.tasks.common import reported

STAGE_GENERATORS = (kernels.tir_tasks, kernels.probe_c_tasks, kernels.lower_c_tasks, kernels.cuda_source_tasks,
                    kernels.cuda_diff_tasks, model.model_tasks, model.export_tasks, model.aoti_package_tasks,
                    model.verify_tasks, model.latency_tasks)

log = get_logger(__name__)


def stage_name(gen) -> str:
    return gen.__name__.removesuffix("_tasks")


def owners(p) -> dict[str, str]:
    """Relative path of every file a task produces -> that task (declared targets, and the
    files of the folders a task owns)."""
    out = {}
    for gen in STAGE_GENERATORS:
        for task in gen(p):
            for target in task.get("targets", []):
                path = Path(target)
                if p.version_dir in path.parents:
                    out[path.relative_to(p.version_dir).as_posix()] = f"{stage_name(gen)}:{task['name']}"
    return out


def build_order() -> list[str]:
    """The stages in the order ``release`` asks for them, which is the order doit starts their
    tasks in: the model chain first (model -> export -> aoti_package -> latency, verify: each
    waits for the one before, and it holds the longest tasks, the compiles), then the kernel
    stages, whose short tasks depend on neither the chain nor each other and fill the cores the
    chain leaves.  Started after them (before 2026-11-30), the chain ran alone at the end, one
    core busy for its compiles; with the chain first (and doit starting unblocked tasks first,
    :mod:`.dispatch`) the kernel stages are the tail, on both cores (README, "Build speed")."""
    chain = [g for g in STAGE_GENERATORS if g.__module__ == model.__name__]
    chain.sort(key=lambda g: g is model.verify_tasks)  # latency (long) before verify (short)
    return [stage_name(g) for g in chain + [g for g in STAGE_GENERATORS if g not in chain]]


def release_task(p) -> dict:
    """Build every stage for the version, then write REPORT.md and manifest.json (last)."""
    stages = build_order()
    if release.state(p.version_dir) in ("released", "damaged"):
        stages = []  # nothing may run against a released version; the action refuses

    @reported()
    def act():
        release.refuse_if_released(p.version_dir, "release")
        release.clear_interrupted(p.version_dir)
        spec = {"version": p.version, "version_dir": str(p.version_dir), "root": str(p.root),
                "config": p.data, "owners": owners(p)}
        log.info(f"release {p.version}: writing REPORT.md and {release.MANIFEST} (environment snapshot)")
        runner.run("laya_build.release", "build_manifest", spec, label="release", task="release")
        log.info(f"release {p.version}: {release.manifest_path(p.version_dir)}")

    return {
        "actions": [act],
        "task_dep": stages,
        "uptodate": [False],  # always checked: a second release into this version is refused
        "verbosity": 2,
        "doc": f"build every stage, then REPORT.md + manifest.json: releases version {p.version}",
    }


def release_diff_task(p) -> dict:
    """``doit release_diff old=A new=B``: both versions must be released."""
    old, new = get_var("old", None), get_var("new", None)
    doc = "what changed between two releases: doit release_diff old=<version> new=<version>"
    if old is None or new is None:
        return {"actions": [lambda: TaskFailed("release_diff needs two released versions: "
                                               "doit release_diff old=<v> new=<v>")],
                "doc": doc, "uptodate": [False]}
    try:
        for name, value in (("old", old), ("new", new)):
            config_mod.check_version(value, f"doit argument {name}")
    except config_mod.ConfigError as exc:
        message = str(exc)
        return {"actions": [lambda: TaskFailed(message)], "doc": doc, "uptodate": [False]}
    out = p.artifacts.release_diff(old, new)
    spec = {"artifacts": str(p.output_root), "old": old, "new": new, "out": str(out),
            "out_rel": out.relative_to(p.output_root).as_posix()}

    @reported()
    def act():
        runner.run("laya_build.stages.release_diff", "run_release_diff", spec, record=out / "release_diff.json",
                    label="release_diff")
        log.info((out / "release_diff.md").read_text())

    return {"actions": [act], "doc": doc, "uptodate": [False], "verbosity": 2,
            "targets": [str(out / "release_diff.json"), str(out / "release_diff.md")]}
