"""Real builds killed with SIGKILL at several points, damaged releases, and two builds at once.

Kills are real: ``doit`` runs in its own process group and the whole group gets SIGKILL when
the build reaches a point (a fork-server child generating a kernel, the model stage, torch.export,
the AOTInductor compile, the fresh-process verification).  After every kill nothing is
accepted that is not complete, and a plain ``doit release`` carries on, while another checkout
builds from scratch all along (shared compiler-cache paths and locks, one user); the release
verifies, and its packages are byte-identical to the other checkout's.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from laya_build.records import read_record, sha256_file
from tests.pipeline.project import Project
from tests.pipeline.test_dependencies import small

pytestmark = pytest.mark.build(seconds=200)  # builds killed at five points beside another checkout's build

BUILD = ("tir", "probe_c", "lower_c", "cuda_diff", "aoti_package", "verify")  # in the order doit -n 1 runs them


def _start(project: Project, *args: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    return subprocess.Popen([sys.executable, "-m", "doit", *args], cwd=project.path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _kill_when(proc: subprocess.Popen, reached, timeout: float = 900) -> bool:
    """SIGKILL ``proc``'s whole process group as soon as ``reached(started)`` holds, where
    ``started`` maps each task doit started (its ``.  task`` line) to when; False if the
    build ended first."""
    started: dict[str, float] = {}

    def read():
        for line in proc.stdout:
            if line.startswith(". "):
                started.setdefault(line[1:].strip(), time.monotonic())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if reached(dict(started)):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError("the build reached no kill point in time")


def _running_for(task: str, seconds: float):
    """Kill point: ``task`` started ``seconds`` ago (each of these runs for longer)."""
    return lambda started: task in started and time.monotonic() - started[task] > seconds


def _assert_nothing_half_done(project: Project) -> None:
    """Every task whose outputs are recorded complete has exactly those outputs; everything
    else is out of date (a later run redoes it), and no record under the version is invalid."""
    vdir = project.version_dir()
    for path in vdir.rglob("*.json"):
        doc = json.loads(path.read_text())  # never a torn file
        if isinstance(doc, dict) and "stage" in doc:
            read_record(path)  # a record is whole and valid, or absent
    recorded = project.artifacts / ".doit" / "outputs" / project.config["version"]
    for sidecar in recorded.glob("*.json") if recorded.is_dir() else []:
        for file, digest in json.loads(sidecar.read_text()).items():
            if digest is not None:
                assert Path(file).is_file() and sha256_file(file) == digest, (sidecar.name, file)
    # the status of every task can be computed (nothing a killed run left confuses it)
    project.status()


KILL_POINTS = {  # (task, seconds after it started): each runs for several seconds
    "kernel child": ("tir:rope.cpu-float32", 1.0),
    "model stage": ("model:build", 2.0),
    "torch.export": ("export:cpu-float32", 3.0),
    "AOTInductor compile": ("aoti_package:cpu-float32", 8.0),
    "verification": ("verify:cpu-float32", 2.0),
}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """(killed-and-resumed project, the kill points reached, its resumed run, the other
    checkout (built from scratch all along), both builds' (exit status, output))."""
    killed = Project(tmp_path_factory.mktemp("killed"))
    others = [Project(tmp_path_factory.mktemp("concurrent"))]
    for project in (killed, *others):
        project.edit_config(small)
        project.commit("small pipeline")
    # another checkout builds from scratch while the kills and the resumed run happen
    other = _start(others[0], *BUILD)
    other_out: list[str] = []
    reader = threading.Thread(target=lambda: other_out.append(other.communicate()[0]))
    reader.start()
    kills = []
    for point, (task, after) in KILL_POINTS.items():
        proc = _start(killed, "-n", "1", *BUILD)
        if _kill_when(proc, _running_for(task, after)):
            kills.append(point)
            _assert_nothing_half_done(killed)
    resumed = killed.doit("release")  # the plain re-run: carries on to the release
    reader.join()
    return killed, kills, resumed, others, [(resumed.returncode, resumed.stdout), (other.returncode, other_out[0])]


def test_every_kill_point_was_reached(builds):
    _, kills, *_ = builds
    assert kills == list(KILL_POINTS)


def test_a_plain_rerun_completes_after_the_kills(builds):
    killed, _, resumed, *_ = builds
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert not list(killed.version_dir().rglob("*.tmp")), "leftovers are cleared by the tasks that own them"
    assert read_record(killed.version_dir() / "verify" / "cpu-float32" / "verify.json")["status"] == "ok"


def test_concurrent_builds_both_succeed(builds):
    *_, results = builds
    for code, out in results:
        assert code == 0, out
        assert "compile_cache" not in out or "True was expected" not in out


def test_killed_and_concurrent_builds_are_byte_identical(builds):
    killed, _, _, others, _ = builds

    def digests(project):  # (exported.pt2 names the checkout's source paths in its stack traces)
        v = project.version_dir()
        return {rel: sha256_file(v / rel) for rel in ("export/cpu-float32/eager.pt",
                                                      "aoti_package/cpu-float32/decision.pt2", "lower_c/rope.c",
                                                      "cuda/rope/bfloat16-sm_90.cu", "model/inputs.pt")}

    first = digests(killed)
    for other in others:
        assert digests(other) == first


def test_release_after_the_kills_and_it_verifies(builds, tmp_path):
    killed, _, resumed, *_ = builds
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert (killed.version_dir() / "manifest.json").is_file()
    assert not (killed.version_dir() / ".release-pending").exists()
    check = killed.doit("verify")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "files match manifest.json" in check.stdout


def test_a_release_without_its_manifest_is_refused_not_rebuilt(builds, tmp_path):
    killed, *_ = builds
    copy = Project.__new__(Project)
    copy.path = tmp_path / "copy"
    shutil.copytree(killed.path, copy.path, ignore=shutil.ignore_patterns(".doit", ".cache"))
    vdir = copy.version_dir()
    (vdir / "manifest.json").unlink()
    package = vdir / "aoti_package" / "cpu-float32" / "decision.pt2"
    data = package.read_bytes()
    package.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # tampered, and the evidence removed
    before = {p: p.stat().st_mtime_ns for p in vdir.rglob("*") if p.is_file()}
    for args in (("verify",), ("aoti_package",), ("release",), ("lower_c",)):
        run = copy.doit(*args)
        assert run.returncode != 0, args
        assert "damaged release" in run.stdout + run.stderr and "manifest.json" in run.stdout + run.stderr, args
    assert {p: p.stat().st_mtime_ns for p in vdir.rglob("*") if p.is_file()} == before, "nothing rebuilt into it"
    clean = copy.doit("clean", "aoti_package")
    assert clean.returncode == 0 and package.is_file(), "doit clean leaves a damaged release alone"
