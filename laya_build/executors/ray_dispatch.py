"""Stages run as Ray tasks on the machines that can build them (``executor: ray``).

The build (the *dispatcher*) sends a stage to the cluster when this machine cannot build its
target (:func:`laya_build.executors.remote_resource`):

1. it stores the files the stage reads (every file of its inputs' folders) in the shared
   cache, as blobs, and sends a request: the stage (its paths written relative to the
   checkout), its cache key and the parts of it, the commit, the cache's settings;
2. the Ray task asks for one unit of the target's resource (``laya_target:cuda-sm90``) and
   ``executor.num_cpus`` CPUs; on the worker it imports the project from the worker's own
   checkout (``executor.worker_root`` or the worker's ``LAYA_BUILD_WORKER_ROOT``), refuses a
   checkout at another commit or whose code, toolchain or inputs give another key
   (:class:`~laya_build.errors.RemoteMismatchError`, naming what differs), fetches the inputs
   (each blob's sha256 checked), runs the stage exactly as a local build would (in a fresh
   process of its own) and stores its outputs in the cache under the key;
3. the dispatcher fetches them from the cache, checked like any cached result.

This is the only module that imports Ray, and only when a stage is dispatched.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from laya_build.cache import keys
from laya_build.stage import Stage

PATH_FIELDS = ("record", "writes_into", "outputs_record")
PATHS_FIELDS = ("files", "dirs", "inputs")
TUPLE_FIELDS = ("schemas", "code", "code_excluded", "sys_path", "task_dep")


def stage_document(stage: Stage, root: Path) -> dict:
    """``stage`` as JSON, its checkout's folder written as ``<root>``."""
    doc = {f.name: getattr(stage, f.name) for f in dataclasses.fields(stage)}
    for name in PATH_FIELDS:
        doc[name] = str(doc[name]) if doc[name] is not None else None
    for name in PATHS_FIELDS + TUPLE_FIELDS:
        doc[name] = [str(v) for v in doc[name]]
    return keys.relative(doc, Path(root).resolve())


def stage_from(doc: dict, root: Path) -> Stage:
    """The stage of :func:`stage_document`, in the checkout ``root``."""
    text = json.dumps(doc).replace(f'"{keys.ROOT_MARK}/', f'"{root}/').replace(f'"{keys.ROOT_MARK}"', f'"{root}"')
    doc = json.loads(text)
    for name in PATH_FIELDS:
        doc[name] = Path(doc[name]) if doc[name] is not None else None
    for name in PATHS_FIELDS:
        doc[name] = tuple(Path(v) for v in doc[name])
    for name in TUPLE_FIELDS:
        doc[name] = tuple(doc[name])
    return Stage(**doc)


def input_files(stage: Stage) -> list[Path]:
    """What a remote run of ``stage`` needs of the build's tree: every file of the folders
    holding its inputs (an input record's folder holds what the record describes), and of the
    folders of the version that its arguments name (``verify`` reads ``eager.pt`` of the export)."""
    found: set[Path] = set()
    named = [
        Path(value)
        for name, value in stage.spec.items()
        if name.endswith("_path")
        and isinstance(value, str)
        and stage.writes_into is not None
        and Path(value).is_relative_to(stage.writes_into)
    ]
    own = {Path(d) for d in stage.dirs}
    for path in [*stage.inputs, *named]:
        folder = Path(path).parent
        if folder in own:
            continue
        if folder.is_dir():
            found |= {f for f in folder.rglob("*") if f.is_file() and not f.name.startswith(".")}
        elif Path(path).is_file():
            found.add(Path(path))
    return sorted(found)


def git_commit(root: Path) -> str | None:
    proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def dispatch(
    stage: Stage,
    *,
    root: Path,
    key: str,
    parts: dict,
    resource: str,
    executor,
    cache_settings,
    code_request: dict,
) -> dict:
    """Run ``stage`` on the cluster; return the worker's answer once its outputs are in the
    cache under ``key`` (raises :class:`~laya_build.errors.RemoteStageError` otherwise)."""
    from laya_build import cache
    from laya_build.errors import RemoteStageError

    root = Path(root).resolve()
    store = cache.store_for(cache_settings)
    inputs: dict[str, str] = {}
    for path in input_files(stage):
        sha = keys.file_sha(path)
        if not store.has_blob(sha):
            store.put_blob(sha, path)
        inputs[path.relative_to(root).as_posix()] = sha
    request = {
        "stage": stage_document(stage, root),
        "key": key,
        "parts": parts,
        "resource": resource,
        "commit": git_commit(root),
        "inputs": inputs,
        "cache": dataclasses.asdict(cache_settings),
        "worker_root": executor.worker_root,
        "dispatcher": {"host": socket.gethostname(), "root": str(root)},
        **code_request,
    }
    import ray

    if not ray.is_initialized():
        ray.init(address=executor.address, namespace="laya-build", log_to_driver=False, logging_level="ERROR")
    if resource not in ray.cluster_resources():  # an autoscaler may still add such a node
        cache.note(
            f"{stage.task}: no node of the Ray cluster offers {resource} now; waiting up to "
            f"{executor.timeout_s:g} s (executor.timeout_s) for one"
        )
    task = ray.remote(_on_worker).options(
        resources={resource: 1}, num_cpus=executor.num_cpus, max_retries=0, name=f"laya-build {stage.task}"
    )
    ref = task.remote(json.dumps(request))
    ready, _ = ray.wait([ref], timeout=executor.timeout_s)
    if not ready:
        ray.cancel(ref, force=True)
        raise RemoteStageError(
            f"{stage.task}: no answer from the Ray cluster ({executor.address}) within {executor.timeout_s:g} s "
            f"(resource {resource})",
            hint=f"start a worker with `ray start --address=<head> --resources='{{\"{resource}\": 1}}'`, "
            "or raise executor.timeout_s",
        )
    try:
        answer = json.loads(ray.get(ref))
    except Exception as exc:  # a RayTaskError carries the worker's exception
        raise RemoteStageError(f"{stage.task}: the remote run on the cluster failed: {_cause(exc)}") from None
    if answer.get("error"):
        from laya_build import errors

        cls = getattr(errors, answer["error"]["type"], None)
        if isinstance(cls, type) and issubclass(cls, errors.LayaBuildError):
            raise cls(
                f"{stage.task} on worker {answer.get('host')}: {answer['error']['message']}",
                hint=answer["error"].get("hint"),
            )
        raise RemoteStageError(f"{stage.task} on worker {answer.get('host')}: {answer['error']['message']}")
    return answer


def _cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:500]


def _on_worker(request_json: str) -> str:
    """The Ray task (sent by value): import the project from the worker's checkout, then
    :func:`serve` there."""
    import json
    import os
    import sys

    request = json.loads(request_json)
    root = request.get("worker_root") or os.environ.get("LAYA_BUILD_WORKER_ROOT")
    if not root:
        return json.dumps(
            {
                "error": {
                    "type": "RemoteMismatchError",
                    "message": (
                        "the worker knows no checkout of the project: neither executor.worker_root nor the worker's "
                        "LAYA_BUILD_WORKER_ROOT is set"
                    ),
                    "hint": "start the worker with LAYA_BUILD_WORKER_ROOT=<checkout> ray start ...",
                }
            }
        )
    for name in [m for m in sys.modules if m.split(".")[0] in ("laya_build", "kernels")]:
        del sys.modules[name]
    if root in sys.path:
        sys.path.remove(root)
    sys.path.insert(0, root)
    from laya_build.executors.ray_dispatch import serve

    return json.dumps(serve(request, root))


def serve(request: dict, root: str) -> dict:
    """A remote run of a stage on this worker (see the module's docstring); returns the answer."""
    from laya_build import PROJECT_ROOT, errors

    host = socket.gethostname()
    try:
        return {"host": host, **_serve(request, Path(root).resolve())}
    except errors.LayaBuildError as exc:
        return {"host": host, "error": {"type": type(exc).__name__, "message": exc.message, "hint": exc.hint}}
    except Exception as exc:
        return {
            "host": host,
            "error": {"type": "RemoteStageError", "message": f"{type(exc).__name__}: {exc}", "root": str(PROJECT_ROOT)},
        }


def _serve(request: dict, root: Path) -> dict:
    from laya_build import PROJECT_ROOT, cache
    from laya_build.cache.settings import CacheSettings, cache_settings
    from laya_build.errors import RemoteMismatchError, RemoteStageError
    from laya_build.runner.stage import run_stage

    if Path(PROJECT_ROOT).resolve() != root:
        raise RemoteMismatchError(f"the worker imported laya_build from {PROJECT_ROOT}, not from its checkout {root}")
    dispatcher = request["dispatcher"]
    if dispatcher["host"] == socket.gethostname() and Path(dispatcher["root"]).resolve() == root:
        raise RemoteMismatchError(
            f"the worker's checkout {root} is the dispatching build's own; a remote run would write into it",
            hint="give the workers a checkout of their own (LAYA_BUILD_WORKER_ROOT=<another checkout>)",
        )
    commit = git_commit(root)
    if request.get("commit") and commit != request["commit"]:
        raise RemoteMismatchError(
            f"the worker's checkout {root} is at commit {commit or '(none)'}, the build's at {request['commit']}",
            hint=f"check out the build's commit on every worker (`git -C {root} checkout {request['commit'][:12]}`)",
        )
    stage = stage_from(request["stage"], root)
    settings = CacheSettings(**request["cache"])
    env_settings = cache_settings(None) if os.environ.get("LAYA_BUILD_CACHE_URL") else None
    if env_settings is not None:  # the worker reaches the cache by a url of its own (another mount)
        settings = dataclasses.replace(env_settings, read=True, write=env_settings.write)
    store = cache.store_for(settings)
    # the inputs, as the build has them (each blob checked), in place of whatever this checkout had
    for rel, sha in request["inputs"].items():
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.remote.tmp")
        store.fetch_blob(sha, tmp)
        os.replace(tmp, dest)
    folders = {(root / rel).parent for rel in request["inputs"]}
    for folder in folders:  # nothing but the build's files in the input folders
        for path in folder.rglob("*"):
            if path.is_file() and path.relative_to(root).as_posix() not in request["inputs"]:
                path.unlink()
    from laya_build.deps import code_deps, stage_tools

    code, third_party = code_deps(root, stage)
    tools = stage_tools(stage, root)
    mine = keys.key_parts(
        root,
        stage,
        code=code,
        version=request["version"],
        third_party=third_party,
        tools=tools,
        resource=request["resource"],
    )
    if keys.RUN_PART in request["parts"]:  # a stage run every time (verify): the run's id is part of its key
        mine[keys.RUN_PART] = request["parts"][keys.RUN_PART]
    if keys.digest(mine) != request["key"]:
        differ = keys.differences(mine, request["parts"])
        raise RemoteMismatchError(
            f"the worker's checkout {root} would build {stage.task} from other sources than the build: "
            f"its key differs in {'; '.join(differ) or 'its digest'}",
            hint="give the worker the build's commit with no local edits, and the same requirements.txt installed",
        )
    start = time.perf_counter()
    run_stage(dataclasses.replace(stage, process="fresh" if stage.process == "fork" else stage.process))
    elapsed = time.perf_counter() - start
    if not cache.store(
        stage,
        request["key"],
        root=root,
        settings=dataclasses.replace(settings, write=True),
        built_by={"host": socket.gethostname(), "resource": request["resource"]},
    ):
        raise RemoteStageError(
            f"{stage.task} was built on the worker, but its outputs could not be stored in the cache {settings.url}"
            + (f" ({cache.disabled()})" if cache.disabled() else "")
        )
    return {"key": request["key"], "seconds": round(elapsed, 3), "python": sys.executable}
