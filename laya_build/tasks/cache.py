"""The cache and the executor in a doit task: fetch a stage's outputs, or build (here or on
the cluster) and store them.

A stage task's action, when a cache is configured: compute the task's key
(:mod:`laya_build.cache.keys`); when the cache has it, fetch the outputs (doit then records the
task as run, with its up-to-date state, and the outputs' digest is written as after a run);
else run the stage (here, or on a Ray worker for a target this machine cannot build) and, if
this build may write, store its outputs.  A stage that runs every time (``verify``) is never
fetched: sent to the cluster, it runs on a worker under a key made for that one run, and its
outputs (the verification record) come back through the cache under that key.  Without a cache
or an executor, a task's action is :func:`laya_build.tasks.build.stage_action` and nothing of this module is imported.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from laya_build.log import get_logger
from laya_build.stage import Stage

log = get_logger(__name__)


def wanted(p) -> bool:
    """Whether ``p``'s build uses a cache or an executor (read from the config and the environment)."""
    from laya_build.cache.settings import cache_settings
    from laya_build.executors import executor_settings

    return cache_settings(p.cache) is not None or executor_settings(p.executor) is not None


def cached_action(p, stage: Stage, code: list[str], third_party: frozenset[str], tools: tuple[str, ...]):
    """The doit python-action of ``stage`` with the cache (and the executor) in front of it."""
    from laya_build import cache
    from laya_build.cache.settings import cache_settings
    from laya_build.executors import UNIDENTIFIED_GPU, executor_settings, key_resource, remote_resource
    from laya_build.tasks.failures import reported

    settings = cache_settings(p.cache)
    executor = executor_settings(p.executor)
    resource = remote_resource(p, stage, executor)
    root = Path(p.root).resolve()

    @reported()
    def action():
        from laya_build.runner.stage import run_stage

        remote_always = resource is not None and stage.always and _package_built(stage)
        if settings is None or not (cache.cacheable(stage) or remote_always):
            run_stage(stage)
            return None
        from laya_build.cache import keys

        machine_type = key_resource(p, stage, executor)  # the resource, or this machine's GPU for a cuda stage
        if machine_type is not None and machine_type.endswith(UNIDENTIFIED_GPU):
            cache.note(
                f"{stage.task}: nothing names this machine's GPU (no nvidia-smi, no driver information): "
                "built here, neither fetched nor stored"
            )
            run_stage(stage)
            return None
        report_to = p.artifacts.cache_report(p.version)
        start = time.perf_counter()
        parts = keys.key_parts(
            root, stage, code=code, version=p.version, third_party=third_party, tools=tools, resource=machine_type
        )
        if remote_always:  # a verification on the cluster: made for this run, its key never asked for again
            parts[keys.RUN_PART] = uuid.uuid4().hex
        key = keys.digest(parts)
        key_s = round(time.perf_counter() - start, 4)
        scratch = p.artifacts.cache_fetch_dir()
        if not remote_always and cache.fetch(
            stage, key, root=root, settings=settings, scratch=scratch, report_to=report_to
        ):
            return None
        if resource is not None:
            from laya_build.errors import RemoteStageError
            from laya_build.executors import ray_dispatch

            cache.note(f"{stage.task}: sent to the Ray cluster (resource {resource})")
            answer = ray_dispatch.dispatch(
                stage,
                root=root,
                key=key,
                parts=parts,
                resource=resource,
                executor=executor,
                cache_settings=settings,
                code_request={"version": p.version},
            )
            cache.report(report_to, stage.task, "remote", key=key, host=answer.get("host"))
            read = settings if settings.read else _reading(settings)
            if not cache.fetch(stage, key, root=root, settings=read, scratch=scratch, report_to=report_to):
                raise RemoteStageError(
                    f"{stage.task} ran on worker {answer.get('host')}, but its outputs could not be fetched "
                    f"from the cache {settings.url}"
                )
            return None
        run_stage(stage)
        cache.report(report_to, stage.task, "built", key=key, key_s=key_s)
        cache.store(stage, key, root=root, settings=settings, report_to=report_to)
        return None

    action.__name__ = stage.task
    return action


def _package_built(stage: Stage) -> bool:
    """Whether the package a verification checks was built (a skipped package's verification is
    a skip record, written here)."""
    import json

    path = stage.spec.get("package_record_path")
    try:
        return json.loads(Path(path).read_text()).get("status") == "ok"
    except (TypeError, OSError, ValueError, AttributeError):
        return False


def _reading(settings):
    import dataclasses

    return dataclasses.replace(settings, read=True)


def before_run(p, selected: list[str]) -> None:
    """In the ``doit`` process, before its workers start: empty the run's cache report and ask
    the cache once whether it answers; one that does not is reported here, once, and the run
    (its workers included) builds without it."""
    from laya_build.cache.settings import cache_settings

    settings = cache_settings(p.cache)
    if settings is None:
        return
    from laya_build import cache
    from laya_build.executors import executor_settings
    from laya_build.tasks.run import only

    report = p.artifacts.cache_report(p.version)
    report.unlink(missing_ok=True)
    if only(selected, "verify") and executor_settings(p.executor) is None:
        return  # nothing but verifications here: the cache is not used
    try:
        cache.store_for(settings).probe()
    except cache.CacheUnavailable as exc:
        cache.disable(str(exc))
