"""Real builds stopped at several points, damaged releases, and two builds at once.

Stops are real (``conftest.py``, ``small_builds``): ``doit`` runs in its own process group and
gets a signal when the build reaches a point (a fork-server child generating a kernel, the
model stage, torch.export, the AOTInductor compile, the fresh-process verification): SIGINT to
the group (Ctrl-C), SIGTERM to the doit process alone (a CI timeout), SIGKILL to it alone or
to the whole group.  After every stop no process of the build is left (the process table),
nothing is accepted that is not complete, and a plain
``doit release`` carries on, while another checkout (the dependency oracle's traced build)
builds from scratch all along (shared compiler-cache paths and locks, one user); the release
verifies, and its packages are byte-identical to the other checkout's.
"""

from __future__ import annotations

import shutil

import pytest

from laya_build.records import read_record
from tests.pipeline.project import Project
from tests.small_build.conftest import KILL_POINTS, STOPS, digests

pytestmark = pytest.mark.build(seconds=200)  # builds killed at five points beside another checkout's build


def test_every_kill_point_was_reached(small_builds):
    assert small_builds.kills == list(KILL_POINTS)


def test_every_stop_was_made_as_planned(small_builds):
    assert [(s.point, s.signal, s.to) for s in small_builds.stops] == [
        (point, sig.name, to) for point, (sig, to, _) in STOPS.items()
    ]
    assert any(s.signal == "SIGINT" and "cc1plus" in s.had_running for s in small_builds.stops), [
        (s.point, s.had_running) for s in small_builds.stops
    ]  # a Ctrl-C reached the build while the C++ compiler ran


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_no_process_of_a_stopped_build_outlives_it(small_builds, point):
    stop = next(s for s in small_builds.stops if s.point == point)
    assert stop.had_running, "the build had processes when it was stopped"
    assert stop.left == [], f"{stop.signal} to {stop.to}: still running after doit exited: {stop.left}"
    assert stop.returncode != 0


@pytest.mark.parametrize("point", [p for p, (sig, _, _) in STOPS.items() if sig.name != "SIGKILL"])
def test_an_interrupted_build_says_so_and_exits_at_once(small_builds, point):
    """SIGINT to the group and SIGTERM to doit alone: exit 128 + the signal within seconds (a
    generous bound: the stop itself is a freeze and a kill), one line saying so."""
    stop = next(s for s in small_builds.stops if s.point == point)
    number = 2 if stop.signal == "SIGINT" else 15
    assert stop.returncode == 128 + number, stop.output[-2000:]
    assert stop.exit_s < 15, stop.exit_s
    said = [line for line in stop.output.splitlines() if "interrupted" in line]
    assert said == [
        f"laya-build: build interrupted by {stop.signal}: stopping every process of the build; what it "
        "left unfinished is not taken as built, and a re-run goes on from the tasks that finished"
    ]
    assert "Traceback" not in stop.output and "KeyboardInterrupt" not in stop.output
    assert stop.half_written == [], "an interrupted build removes what its processes were writing"


def test_a_plain_rerun_completes_after_the_kills(small_builds):
    killed, resumed = small_builds.killed, small_builds.resumed
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert not list(killed.version_dir().rglob("*.tmp")), "leftovers are cleared by the tasks that own them"
    assert read_record(killed.version_dir() / "verify" / "cpu-float32" / "verify.json")["status"] == "ok"


def test_what_a_killed_build_finished_is_not_done_again(small_builds):
    """The task state is committed task by task (``laya_build.tasks.state``): the re-run does
    only what no killed run had finished (and what always runs)."""
    finished = small_builds.finished_before_kills
    assert {"model:build", "export:cpu-float32", "aoti_package:cpu-float32"} <= finished
    redone = {t for t in small_builds.resumed.executed if not small_builds.graph.get(t, {}).get("always")}
    assert not redone & finished, sorted(redone & finished)


def test_concurrent_builds_both_succeed(small_builds):
    for run in (small_builds.resumed, small_builds.traced_run):
        assert run.returncode == 0, run.stdout + run.stderr
        assert "compile_cache" not in run.stdout or "True was expected" not in run.stdout


def test_killed_and_concurrent_builds_are_byte_identical(small_builds):
    assert small_builds.traced_digests, "the other checkout's build failed"
    assert digests(small_builds.killed) == small_builds.traced_digests


def test_a_serial_build_matches_a_parallel_one(small_builds):
    """The killed checkout's kernel stages ran in ``doit -n 1`` runs (between kills), the other
    checkout's in one ``doit`` on every core: the same sources, byte for byte, and the same
    records but for timings and each checkout's own commit."""
    (traced_sources, traced_records), (killed_sources, killed_records) = (
        small_builds.kernel_outputs[name] for name in ("traced", "killed")
    )
    assert killed_sources and killed_sources == traced_sources
    assert {r.split("/")[0] for r in killed_records} == {"tir", "probe_c", "lower_c", "cuda", "cuda_diff"}
    assert killed_records == traced_records


def test_release_after_the_kills(small_builds):
    """The re-run released the version: manifest written, nothing pending.  That release is
    the one test_release.py checks (every hash against the manifest; ``doit verify`` of a
    copy: files, then the fresh-process verification of its package)."""
    killed, resumed = small_builds.killed, small_builds.resumed
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "release" in resumed.executed
    assert (killed.version_dir() / "manifest.json").is_file()
    assert not (killed.version_dir() / ".release-pending").exists()


def test_a_release_without_its_manifest_is_refused_not_rebuilt(small_builds, tmp_path):
    killed = small_builds.killed
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
