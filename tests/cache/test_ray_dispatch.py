"""Stages dispatched to a Ray cluster started here: a CPU stage sent to a worker (forced with
``LAYA_BUILD_REMOTE_TARGETS=cpu``) comes back through the cache byte-identical to a local
build, and a worker whose checkout would build other bytes refuses, saying what differs.

The cluster is one head node on 127.0.0.1 with one CPU and the resource
``laya_target:cpu-<machine>``, its workers importing the project from a checkout of their own
(``LAYA_BUILD_WORKER_ROOT``), stopped at the end.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from laya_build.records import sha256_file
from tests.pipeline.project import Project, small_pipeline

pytestmark = pytest.mark.build(seconds=150)  # a cluster start, two model builds, three exports

RESOURCE = f"laya_target:cpu-{platform.machine()}"
EXPORT = "export:cpu-float32"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worktree(project: Project, path: Path) -> Project:
    project.git("worktree", "add", "-q", "--detach", str(path))
    other = Project.__new__(Project)
    other.path = path
    return other


def report(project: Project) -> list[tuple[str, str]]:
    path = project.artifacts / ".doit" / "cache" / "0.1.0.jsonl"
    return [(r["task"], r["result"]) for r in map(json.loads, path.read_text().splitlines())]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("ray")
    local = Project(base / "local")
    local.edit_config(small_pipeline)
    local.commit("small pipeline")
    worker = worktree(local, base / "worker")
    dispatcher = worktree(local, base / "dispatcher")
    port = free_port()
    ray = str(Path(sys.executable).with_name("ray"))
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "LAYA_BUILD_WORKER_ROOT": str(worker.path), "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    env.pop("LAYA_BUILD_CACHE", None)  # the workers use the cache each request names
    start = [
        ray,
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        "--num-cpus=1",
        f"--resources={json.dumps({RESOURCE: 1})}",
        f"--temp-dir={temp}",
        "--include-dashboard=false",
        "--disable-usage-stats",
    ]
    proc = subprocess.run(start, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    try:
        yield {"local": local, "worker": worker, "dispatcher": dispatcher, "address": f"127.0.0.1:{port}", "base": base}
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)


def _env(cluster, cache: str) -> dict:
    return {
        "LAYA_BUILD_CACHE": "on",
        "LAYA_BUILD_CACHE_URL": str(cluster["base"] / cache),
        "LAYA_BUILD_EXECUTOR": "ray",
        "LAYA_BUILD_RAY_ADDRESS": cluster["address"],
        "LAYA_BUILD_REMOTE_TARGETS": "cpu",
    }


def test_a_cpu_stage_runs_on_the_cluster_and_equals_a_local_build(cluster):
    local, dispatcher, worker = cluster["local"], cluster["dispatcher"], cluster["worker"]
    here = local.doit(EXPORT)  # no cache, no cluster: the reference
    assert here.returncode == 0, here.stdout + here.stderr
    run = dispatcher.doit(EXPORT, env=_env(cluster, "cache"), timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"laya-build: cache: {EXPORT}: sent to the Ray cluster (resource {RESOURCE})" in run.stderr
    assert report(dispatcher) == [
        ("model:build", "miss"),  # not bound to a target: built here
        ("model:build", "built"),
        ("model:build", "stored"),
        (EXPORT, "miss"),
        (EXPORT, "remote"),
        (EXPORT, "fetched"),
    ]
    folder = Path("export") / "cpu-float32"
    names = sorted(p.name for p in (local.version_dir() / folder).iterdir())
    assert "exported.pt2" in names and "eager.pt" in names
    for name in names:
        ours, theirs = dispatcher.version_dir() / folder / name, local.version_dir() / folder / name
        built_there = worker.version_dir() / folder / name
        if name.endswith(".json"):  # the record: its timings are the worker's
            assert json.loads(ours.read_text()) == json.loads(built_there.read_text())
        else:
            assert sha256_file(ours) == sha256_file(theirs) == sha256_file(built_there), name
    again = dispatcher.doit(EXPORT, env=_env(cluster, "cache"))
    assert again.returncode == 0 and again.executed == []  # fetched outputs are up to date


def test_a_worker_with_other_sources_refuses(cluster):
    dispatcher, worker = cluster["dispatcher"], cluster["worker"]
    edited = worker.path / "laya_build" / "stages" / "export.py"
    original = edited.read_bytes()
    edited.write_bytes(original + b"\n# an edit on the worker only\n")
    try:
        dispatcher.doit("clean", EXPORT)
        run = dispatcher.doit(EXPORT, env=_env(cluster, "other-cache"), timeout=900)
    finally:
        edited.write_bytes(original)
    assert run.returncode == 1, run.stdout + run.stderr
    out = run.stdout + run.stderr
    assert "laya-build: RemoteMismatchError" in out
    assert "its key differs in code: laya_build/stages/export.py" in out
    assert "hint:" in out
    assert not (dispatcher.version_dir() / "export" / "cpu-float32" / "exported.pt2").exists()


def test_a_verification_sent_to_the_cluster_runs_on_the_worker_every_time(cluster):
    """``verify`` of a build whose target goes to the cluster runs there, on the build's bytes
    (sent through the cache), every time it is asked for; its record comes back."""
    dispatcher, worker = cluster["dispatcher"], cluster["worker"]
    built = dispatcher.doit("aoti_package")  # here, without the cluster (the cuda package: a skip record)
    assert built.returncode == 0, built.stdout + built.stderr
    env = _env(cluster, "verify-cache")
    records = []
    for _ in range(2):
        run = dispatcher.doit("verify", env=env, timeout=900)
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"laya-build: cache: verify:cpu-float32: sent to the Ray cluster (resource {RESOURCE})" in run.stderr
        assert report(dispatcher) == [("verify:cpu-float32", "remote"), ("verify:cpu-float32", "fetched")]
        path = dispatcher.artifacts / ".doit" / "cache" / "0.1.0.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        records.append(lines[0]["key"])
        ours = dispatcher.version_dir() / "verify" / "cpu-float32" / "verify.json"
        theirs = worker.version_dir() / "verify" / "cpu-float32" / "verify.json"
        assert json.loads(ours.read_text()) == json.loads(theirs.read_text())
        assert json.loads(ours.read_text())["status"] == "ok"
    assert records[0] != records[1]  # a key for each run: never answered from the cache
    ours_pkg = dispatcher.version_dir() / "aoti_package" / "cpu-float32" / "decision.pt2"
    theirs_pkg = worker.version_dir() / "aoti_package" / "cpu-float32" / "decision.pt2"
    assert sha256_file(ours_pkg) == sha256_file(theirs_pkg)  # the worker verified the build's bytes


def test_a_stage_no_worker_takes_fails_after_the_timeout_naming_its_resource(cluster):
    """No node offers the resource: the build says so at once, waits executor.timeout_s for one,
    then fails naming the resource and how to start such a worker; nothing of the stage is written."""
    lonely = worktree(cluster["local"], cluster["base"] / "lonely")
    lonely.edit_config(
        lambda c: c.update(executor={"kind": "ray", "timeout_s": 5, "resources": {"cpu": "laya_target:nowhere"}})
    )
    run = lonely.doit(EXPORT, env=_env(cluster, "lonely-cache"), timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "no node of the Ray cluster offers laya_target:nowhere now; waiting up to 5 s" in run.stderr
    assert "laya-build: RemoteStageError" in out and "within 5 s (resource laya_target:nowhere)" in out
    assert "--resources='{\"laya_target:nowhere\": 1}'" in out
    assert not (lonely.version_dir() / "export" / "cpu-float32" / "exported.pt2").exists()
