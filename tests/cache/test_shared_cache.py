"""A shared, content-addressed cache between checkouts: real builds of the small pipeline.

One checkout releases with an empty folder cache; a second checkout of the same commit in
another folder (a ``git worktree``) releases from it: no stage runs there (the cache report
says every cacheable task was fetched; ``verify`` and ``release`` run, as they always do) and
its artifacts are byte-identical to the first's.  Then, in a third checkout: a corrupted blob
is reported and never served, the task built here; a cache that cannot be reached gives a
local build and one warning; an ``s3://`` cache on a moto server started here stores and
serves through s3fs.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from laya_build.records import sha256_file
from tests.pipeline.project import Project, small_pipeline

pytestmark = pytest.mark.build(seconds=240)  # a cold small release, a cached one, a few kernel tasks

ALWAYS = {"verify", "release"}  # never answered from the cache
NO_OUTPUTS = {"cuda_diff:baseline_kernels"}  # extracts kernels/ of a revision into a compiler cache
# what a release writes of its own run: the report, the manifest, the provenance and SBOM (times,
# run id) and SHA256SUMS (the manifest's digest)
RELEASE_FILES = {"REPORT.md", "manifest.json", "provenance.json", "sbom.cdx.json", "SHA256SUMS"}


def report(project: Project, version: str = "0.1.0") -> list[dict]:
    path = project.artifacts / ".doit" / "cache" / f"{version}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def tree(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def worktree(project: Project, path: Path) -> Project:
    project.git("worktree", "add", "-q", "--detach", str(path))
    other = Project.__new__(Project)
    other.path = path
    return other


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("shared-cache")
    first = Project(base / "first")
    first.edit_config(small_pipeline)
    first.commit("small pipeline")
    cache = base / "cache"
    env = {"LAYA_BUILD_CACHE": "on", "LAYA_BUILD_CACHE_URL": str(cache)}
    run = first.doit("release", env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    second = worktree(first, base / "second")
    again = second.doit("release", env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    return {"first": first, "second": second, "cache": cache, "env": env, "again": again, "base": base}


def test_a_second_checkout_builds_nothing_from_a_warm_cache(built):
    first, second = built["first"], built["second"]
    stored = {r["task"] for r in report(first) if r["result"] == "stored"}
    assert stored and all(r["result"] != "fetched" for r in report(first))
    results = {r["task"]: r["result"] for r in report(second)}
    assert set(results.values()) == {"fetched"}, results
    ran = set(built["again"].executed) - set(results)
    assert {t for t in ran if t.split(":")[0] not in ALWAYS} <= NO_OUTPUTS
    assert set(results) == stored  # every task the first stored, the second fetched
    for task in stored:
        assert f"laya-build: cache: {task}: fetched" in built["again"].stderr


def test_fetched_artifacts_are_byte_identical(built):
    one, two = tree(built["first"].version_dir()), tree(built["second"].version_dir())
    assert set(one) == set(two)
    differ = {p for p in one if one[p] != two[p]}
    # what the second checkout made itself: the verification (timings) and the release files naming it
    assert differ <= RELEASE_FILES | {p for p in one if p.startswith("verify/")}, differ
    assert "aoti_package/cpu-float32/decision.pt2" in one and "export/cpu-float32/exported.pt2" in one
    # the release's manifest hashes the bytes on disk: the fetched files are listed with the same sha256
    manifests = [json.loads((p.version_dir() / "manifest.json").read_text()) for p in (built["first"], built["second"])]
    files = [{f["path"]: f["sha256"] for f in m["files"] if f["path"] not in differ} for m in manifests]
    assert files[0] == files[1]
    # the next run in the second checkout takes every fetched task as up to date
    status = built["second"].status(env=built["env"])
    assert {t for t, mark in status.items() if mark == "R" and t.split(":")[0] not in ALWAYS} <= NO_OUTPUTS


def _entry_blob(cache: Path, project: Project, task: str, suffix: str) -> tuple[Path, str]:
    key = next(r["key"] for r in report(project) if r["task"] == task)
    entry = json.loads((cache / "entries" / key[:2] / f"{key}.json").read_text())
    rel, sha = next((rel, sha) for rel, sha in entry["files"].items() if rel.endswith(suffix))
    return cache / "blobs" / sha[:2] / sha, rel


@pytest.fixture(scope="module")
def third(built):
    return worktree(built["first"], built["base"] / "third")


def test_a_corrupt_blob_is_reported_never_served_and_rebuilt(built, third):
    cache, first = built["cache"], built["first"]
    blob, rel = _entry_blob(cache, first, "lower_c:rope", ".c")
    good = blob.read_bytes()
    blob.write_bytes(good.replace(b"float", b"flaot", 1))
    run = third.doit("lower_c:rope", env=built["env"])
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"cache blob {blob.name} ({rel}) of lower_c:rope is corrupt" in run.stderr
    assert [r["result"] for r in report(third)] == ["corrupt", "built", "stored"]
    assert (third.path / rel).read_bytes() == good  # built here, the bytes of the first build
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name  # replaced by the rebuilt one
    assert (
        not any((third.artifacts / ".cache" / "fetch").rglob("*"))
        if (third.artifacts / ".cache" / "fetch").is_dir()
        else True
    )


@pytest.mark.parametrize("where", ["s3 on a closed port", "a folder under a file"])
def test_an_unreachable_cache_gives_a_local_build_and_one_warning(built, third, where):
    port = free_port()  # nothing listens there
    env = {
        "s3 on a closed port": {
            "LAYA_BUILD_CACHE_URL": "s3://laya/cache",
            "LAYA_BUILD_CACHE_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
        },
        "a folder under a file": {"LAYA_BUILD_CACHE_URL": str(third.path / "pipeline.yaml" / "cache")},
    }[where]
    third.doit("clean", "tir:rope.cpu-float32")
    env = {**env, "LAYA_BUILD_CACHE": "on", "LAYA_BUILD_CACHE_TIMEOUT_S": "3"}
    run = third.doit("tir:rope.cpu-float32", env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.executed == ["tir:rope.cpu-float32"]
    assert run.stderr.count("laya-build: warning: cache unavailable, building locally") == 1, run.stderr
    assert f"building locally: reaching {env['LAYA_BUILD_CACHE_URL']}: " in run.stderr  # names the cache
    assert (third.version_dir() / "tir" / "rope" / "cpu-float32.tir.py").read_bytes() == (
        built["first"].version_dir() / "tir" / "rope" / "cpu-float32.tir.py"
    ).read_bytes()


def test_an_s3_cache_through_s3fs_on_a_moto_server(built, third):
    import s3fs
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        creds = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
        fs = s3fs.S3FileSystem(key="test", secret="test", client_kwargs={"endpoint_url": endpoint})
        fs.mkdir("laya-cache")
        env = {
            **creds,
            "LAYA_BUILD_CACHE": "on",
            "LAYA_BUILD_CACHE_URL": "s3://laya-cache/ci",
            "LAYA_BUILD_CACHE_ENDPOINT_URL": endpoint,
        }
        task = "tir:rope.bfloat16"
        third.doit("clean", task)
        stored = third.doit(task, env=env)
        assert stored.returncode == 0, stored.stdout + stored.stderr
        assert [r["result"] for r in report(third)] == ["miss", "built", "stored"]
        blobs = fs.find("laya-cache/ci/blobs")
        assert len(blobs) == 2 and all(Path(b).name == hashlib.sha256(fs.cat(b)).hexdigest() for b in blobs)
        assert len(fs.find("laya-cache/ci/entries")) == 1
        built_here = {n: h for n, h in tree(third.version_dir() / "tir" / "rope").items() if n.startswith("bfloat16")}
        third.doit("clean", task)
        fetched = third.doit(task, env=env)
        assert fetched.returncode == 0, fetched.stdout + fetched.stderr
        assert [r["result"] for r in report(third)] == ["fetched"]
        assert f"laya-build: cache: {task}: fetched (2 files" in fetched.stderr
        fetched_here = {n: h for n, h in tree(third.version_dir() / "tir" / "rope").items() if n.startswith("bfloat16")}
        assert fetched_here == built_here and len(built_here) == 2  # the script and its record, as stored
        # a reader that may not write: nothing more is stored
        before = sorted(fs.find("laya-cache/ci", refresh=True))
        third.doit("clean", "tir:rope.cpu-float32")
        run = third.doit("tir:rope.cpu-float32", env={**env, "LAYA_BUILD_CACHE_WRITE": "no"})
        assert run.returncode == 0 and [r["result"] for r in report(third)] == ["miss", "built"]
        assert sorted(fs.find("laya-cache/ci", refresh=True)) == before
    finally:
        server.stop()


def test_a_build_with_a_cache_imports_no_ray(built, third):
    """A build in the doit process itself (``-n 1``: the actions run there) with a cache:
    fsspec is imported, Ray is not."""
    code = (
        "import json, sys; sys.argv = ['doit']; import dodo\n"
        "from doit.cmd_base import ModuleTaskLoader; from doit.doit_cmd import DoitMain\n"
        "assert DoitMain(ModuleTaskLoader(dodo)).run(['-n', '1', 'lower_c:rope']) == 0\n"
        "print(json.dumps([m in sys.modules for m in ('ray', 'fsspec')]))\n"
    )
    third.doit("clean", "lower_c:rope")
    env = {**os.environ, **built["env"], "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=third.path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "laya-build: cache: lower_c:rope: fetched" in proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [False, True]
