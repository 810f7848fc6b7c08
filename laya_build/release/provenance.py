"""A release's provenance: an in-toto Statement v1 with a SLSA Provenance v1 predicate.

``provenance.json`` names every released file with its sha256 (the subjects), how the release
was built (the effective configuration's digest, the source revision, the toolchain: Python
distributions, compilers, TVM, CUDA) and by whom and when (the builder, the run's start and
end).  It is a file of the release, so the release's signature covers it.

References: https://in-toto.io/Statement/v1, https://slsa.dev/spec/v1.0/provenance.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import UTC, datetime

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:laya-build:release:v1"  # `doit release` of a pipeline.yaml at a source revision
BUILDER_ENV = "LAYA_BUILD_BUILDER_ID"  # who builds (a CI runner's URI); default: this host


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def run_started(environ=os.environ) -> float | None:
    """When the ``doit`` run that publishes started: its build id is ``<pid>-<ns since epoch>``
    (:data:`laya_build.runner.lifetime.BUILD_ENV`)."""
    from laya_build.runner.lifetime import BUILD_ENV

    _, _, ns = environ.get(BUILD_ENV, "").partition("-")
    return int(ns) / 1e9 if ns.isdigit() else None


def distributions() -> list[tuple[str, str]]:
    """(normalised name, version) of every Python distribution of the build's environment."""
    from laya_build.environment import installed

    return sorted((name, version) for name, (_, version) in installed().items())


def toolchain(env: dict) -> dict[str, str | None]:
    """Python, TVM, the C/C++/CUDA compilers and CUDA of an environment snapshot
    (:func:`laya_build.environment.snapshot`): name -> version line."""
    torch_env = env.get("collect_env") or {}
    return {
        "python": env.get("python"),
        "tvm": env.get("tvm"),
        **{k: env.get(k) for k in ("cc", "cxx", "nvcc")},
        "cuda": torch_env.get("cuda_runtime_version") or torch_env.get("cuda_compiled_version"),
    }


def dependencies(git: dict, env: dict, source_uri: str | None) -> list[dict]:
    """SLSA resolvedDependencies: the source revision, then every Python distribution
    (package URLs), then the toolchain."""
    from laya_build.release.sbom import purl

    deps = []
    if git.get("commit"):
        deps.append(
            {
                "uri": source_uri or "urn:laya-build:source",
                "digest": {"gitCommit": git["commit"]},
                "annotations": {"dirty": git.get("dirty")},
            }
        )
    deps += [{"name": name, "uri": purl(name, version)} for name, version in distributions()]
    deps += [{"name": n, "annotations": {"version": v}} for n, v in toolchain(env).items() if v]
    return deps


def statement(
    subjects: list[dict],
    *,
    version: str,
    config_sha256: str,
    effective: str,
    git: dict,
    env: dict,
    source_uri: str | None = None,
    finished: float | None = None,
    environ=os.environ,
) -> dict:
    """The statement of a release whose files are ``subjects`` (``{"path", "sha256"}``)."""
    from importlib import metadata

    try:
        own = metadata.version("laya-build")
    except metadata.PackageNotFoundError:
        own = None
    started = run_started(environ)
    metadata = {"invocationId": environ.get("LAYA_BUILD_ID") or f"{os.getpid()}"}
    if started is not None:
        metadata["startedOn"] = _iso(started)
    metadata["finishedOn"] = _iso(finished if finished is not None else time.time())
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": s["path"], "digest": {"sha256": s["sha256"]}} for s in subjects],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "command": "doit release",
                    "version": version,
                    "pipeline": {"effective": effective, "digest": {"sha256": config_sha256}},
                },
                "internalParameters": {"platform": env.get("collect_env", {}).get("os")},
                "resolvedDependencies": dependencies(git, env, source_uri),
            },
            "runDetails": {
                "builder": {
                    "id": environ.get(BUILDER_ENV) or f"urn:laya-build:host:{socket.gethostname()}",
                    "version": {"laya-build": own},
                },
                "metadata": metadata,
            },
        },
    }
