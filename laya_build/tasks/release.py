"""Release tasks: ``release`` (REPORT.md + manifest.json, last) and ``release_diff``."""

from __future__ import annotations

from pathlib import Path

from laya_build import config as config_mod
from laya_build import release
from laya_build.errors import UsageError
from laya_build.layout import RELEASE_DIFF_RECORD_NAME, RELEASE_DIFF_REPORT_NAME
from laya_build.log import get_logger
from laya_build.stage import Stage
from laya_build.tasks import kernels, model
from laya_build.tasks.build import doit_task, reported

STAGE_GENERATORS = (
    kernels.tir_tasks,
    kernels.probe_c_tasks,
    kernels.lower_c_tasks,
    kernels.cuda_source_tasks,
    kernels.cuda_diff_tasks,
    model.model_tasks,
    model.export_tasks,
    model.aoti_package_tasks,
    model.verify_tasks,
    model.latency_tasks,
)

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
    chain leaves (started after them, the chain would run alone at the end, one core busy for
    its compiles; with doit starting unblocked tasks first, :mod:`.dispatch`, the kernel
    stages are the tail, on every core)."""
    chain = [g for g in STAGE_GENERATORS if g.__module__ == model.__name__]
    chain.sort(key=lambda g: g is model.verify_tasks)  # latency (long) before verify (short)
    return [stage_name(g) for g in chain + [g for g in STAGE_GENERATORS if g not in chain]]


def release_stage(p, owners_of: dict[str, str]) -> Stage:
    """REPORT.md, pipeline.effective.json and manifest.json of ``p``'s version (the manifest
    last: it is what makes the version released); ``owners_of``: the task of every file.  A
    fresh process: the environment snapshot imports torch."""
    return Stage(
        basename="release",
        name=None,
        doc=f"build every stage, then REPORT.md + manifest.json: releases version {p.version}",
        entry="laya_build.release.publish:publish",
        process="fresh",
        spec={
            "version": p.version,
            "version_dir": str(p.version_dir),
            "root": str(p.root),
            "config": p.data,
            "signing": p.data.get("signing"),
            "owners": owners_of,
        },
        writes_into=p.version_dir,
        always=True,
        verbose=True,
    )


def check_keys(p, selected: list[str]) -> None:
    """Before a run's first task: the signing key of a run that releases, and the trusted keys
    of one that verifies, load (:mod:`laya_build.release.signing`), so that a wrong path or
    password stops the run at once, not after the build."""
    from laya_build.release import signing

    basenames = {name.split(":", 1)[0] for name in selected}
    if "release" in basenames:
        signing.signing_key(p.data.get("signing"), p.root)
    if "verify" in basenames:
        signing.trusted_keys(p.data.get("trust"), p.root)


def release_task(p) -> dict:
    """Build every stage for the version, then write REPORT.md and manifest.json (last)."""
    stages = build_order()
    if release.state(p.version_dir) in ("released", "damaged"):
        stages = []  # nothing may run against a released version; the action refuses
    task = doit_task(p, release_stage(p, {}))

    @reported()
    def act():
        from laya_build.runner.stage import run_stage

        release.clear_interrupted(p.version_dir)
        log.info(f"release {p.version}: writing REPORT.md and {release.MANIFEST} (environment snapshot)")
        run_stage(release_stage(p, owners(p)))  # the owners of the files, computed when it runs
        log.info(f"release {p.version}: {release.manifest_path(p.version_dir)}")

    return {**task, "actions": [act], "task_dep": stages, "file_dep": [], "targets": []}


RELEASE_DIFF_PARAMS = [
    {"name": "old", "long": "old", "type": str, "default": "", "help": "the earlier released version (e.g. 0.1.0)"},
    {"name": "new", "long": "new", "type": str, "default": "", "help": "the later released version (e.g. 0.2.0)"},
]


def release_diff_stage(p, old: str, new: str) -> Stage:
    """The report of what changed between two released versions of ``p``'s artifacts."""
    missing = [f"--{name}" for name, value in (("old", old), ("new", new)) if not value]
    if missing:
        raise UsageError(
            f"release_diff needs two released versions: {' and '.join(missing)} missing",
            hint=f"`doit release_diff --old <version> --new <version>`; released here: {_released_list(p)}",
        )
    for name, value in (("old", old), ("new", new)):
        config_mod.check_version(value, f"doit release_diff --{name}")
        if release.state(p.artifacts.version(value).root) != "released":
            raise UsageError(
                f"release_diff --{name} {value}: {p.artifacts.version(value).root} is not a release "
                f"(no {release.MANIFEST})",
                hint=f"release it first (`doit version={value} release`) or name a released version; "
                f"released here: {_released_list(p)}",
            )
    out = p.artifacts.release_diff(old, new)
    return Stage(
        basename="release_diff",
        name=None,
        doc=f"what changed from release {old} to {new}",
        entry="laya_build.stages.release_diff:run_release_diff",
        process="fresh",
        spec={
            "artifacts": str(p.output_root),
            "old": old,
            "new": new,
            "out": str(out),
            "out_rel": out.relative_to(p.output_root).as_posix(),
        },
        record=out / RELEASE_DIFF_RECORD_NAME,
        dirs=(out,),
        always=True,
        verbose=True,
    )


def _released_list(p) -> str:
    return ", ".join(release.released_versions(p.output_root)) or "none"


def release_diff_task(p) -> dict:
    """``doit release_diff --old A --new B``: both versions must be released."""

    @reported()
    def act(old, new):
        from laya_build.runner.stage import run_stage

        stage = release_diff_stage(p, old, new)
        run_stage(stage)
        log.info(Path(stage.spec["out"], RELEASE_DIFF_REPORT_NAME).read_text())

    return {
        "actions": [act],
        "params": RELEASE_DIFF_PARAMS,
        "uptodate": [False],
        "verbosity": 2,
        "doc": "what changed between two releases: doit release_diff --old <version> --new <version>",
    }
