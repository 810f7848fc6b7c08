"""The small pipeline (``small_pipeline``: every kind of task, cheaply, on a checkpoint that
upstream Laya wrote) built twice at once, once per session, for the dependency oracle, the
robustness tests and the release tests:

* ``traced``: a clean build of every stage in one ``doit`` run, with the file tracer
  (``tracer/sitecustomize.py``) in every process: what each task reads (test_dependencies);
* ``killed``: a checkout whose build is stopped at several points while the traced build runs
  beside it (shared compiler-cache paths and locks, one user), each time in another way: SIGINT
  to its process group (a terminal's Ctrl-C), SIGTERM to the ``doit`` process alone (a CI
  timeout), SIGKILL to the ``doit`` process alone and to its whole group; then re-run as ``doit
  release`` (test_robustness); its release is the one test_release inspects and tampers with
  (in copies).

The traced checkout builds the next version (``TRACED_VERSION``) of the same sources, so its
outputs are compared with the killed one's byte for byte, and test_release later changes one
kernel there and releases it, to diff against the killed checkout's release (a release copied
in, as a release engineer compares a release built elsewhere).

One fixture runs both so that they really overlap (a second checkout building from scratch
all along the kills), and the small pipeline is built from scratch twice, not four times.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from laya_build.records import read_record, sha256_file
from tests.pipeline.project import DoitRun, Project, small_pipeline
from tests.upstream_checkpoint import write_upstream_checkpoint

TRACER = Path(__file__).with_name("tracer")
# the kill runs' stages, in the order `doit -n 1` runs them
BUILD = ("tir", "probe_c", "lower_c", "cuda_diff", "aoti_package", "verify")
KILL_POINTS = {  # (task, seconds after it started): each runs for several seconds
    "kernel child": ("tir:rope.cpu-float32", 1.0),
    "model stage": ("model:build", 2.0),
    "torch.export": ("export:cpu-float32", 3.0),
    "AOTInductor compile": ("aoti_package:cpu-float32", 8.0),
    "verification": ("verify:cpu-float32", 1.0),  # its fresh process imports torch for longer
}
# how each point stops the build: (signal, to the whole process group or the doit process alone,
# doit's worker processes); a `-n 1` run does the tasks one after the other
STOPS = {
    "kernel child": (signal.SIGINT, "group", 2),
    "model stage": (signal.SIGKILL, "doit", 1),
    "torch.export": (signal.SIGTERM, "doit", 1),
    "AOTInductor compile": (signal.SIGINT, "group", 1),
    "verification": (signal.SIGKILL, "group", 1),
}
BUILD_ENV = "LAYA_BUILD_ID"  # laya_build.runner.lifetime: every process of a build carries it


@dataclass
class Stop:
    """What a stopped build left: its exit status, how long doit took to exit, its output and
    every process of it still running after that (from the process table)."""

    point: str
    signal: str
    to: str
    returncode: int
    exit_s: float
    output: str
    had_running: list[str]  # the build's processes when it was stopped (names)
    left: list[str]  # ... and those still running after doit exited
    half_written: list[str] = field(default_factory=list)  # temporary and .partial. files left in artifacts/


# the killed checkout builds and releases the project's version; the traced one builds the next
# (test_release makes it a release with one kernel changed, to diff against the killed one's)
KILLED_VERSION, TRACED_VERSION = "0.1.0", "0.2.0"
# outputs compared between the two checkouts
COMPARED = (
    "export/cpu-float32/eager.pt",
    "aoti_package/cpu-float32/decision.pt2",
    "lower_c/rope.c",
    "cuda/rope/bfloat16-sm_90.cu",
    "model/inputs.pt",
)


def _order(name: str) -> int:
    stages = (
        "tir",
        "probe_c",
        "lower_c",
        "cuda_source",
        "cuda_diff:baseline_kernels",
        "cuda_diff:baseline",
        "cuda_diff",
        "model",
        "export",
        "aoti_package",
        "verify",
        "latency",
    )
    return next(i for i, s in enumerate(stages) if name.startswith(s))


def start(project: Project, *args: str, env: dict | None = None) -> subprocess.Popen:
    """``doit args`` in ``project``, in a process group of its own (a kill takes all of it)."""
    full = {**os.environ, "HF_HUB_OFFLINE": "1"}
    full.pop("PYTHONPATH", None)
    full.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-m", "doit", *args],
        cwd=project.path,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def build_processes(doit_pid: int) -> list[str]:
    """``pid name`` of every running process of the build that ``doit_pid`` leads (from the
    process table: every process of a build carries its id, ``<doit pid>-...``)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "name"]):
        try:
            tag = proc.environ().get(BUILD_ENV, "")
            if tag.startswith(f"{doit_pid}-") and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.pid} {proc.info['name']}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def half_written(artifacts: Path) -> list[str]:
    """Temporary files of atomic writes and ``.partial.`` files under ``artifacts`` (the shared
    compiler caches aside)."""
    return sorted(
        str(p.relative_to(artifacts))
        for p in artifacts.rglob(".*")
        if p.is_file() and (p.name.endswith(".tmp") or ".partial." in p.name) and ".cache" not in p.parts
    )


def stop_when(
    proc: subprocess.Popen, reached, point: str, timeout: float = 900, artifacts: Path | None = None
) -> tuple[list[str], Stop] | None:
    """Stop ``proc`` as :data:`STOPS` says for ``point`` as soon as ``reached(started)`` holds,
    where ``started`` maps each task doit started (its ``.  task`` line) to when; returns the
    tasks started, in order, and what the stop left (None if the build ended first)."""
    started: dict[str, float] = {}
    lines: list[str] = []

    def read():
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(". "):
                started.setdefault(line[1:].strip(), time.monotonic())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    sig, to, _ = STOPS[point]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None
        if running := reached(dict(started), proc.pid):
            stopped = time.monotonic()
            os.killpg(proc.pid, sig) if to == "group" else os.kill(proc.pid, sig)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            exit_s = time.monotonic() - stopped
            reader.join(timeout=10)
            left = build_processes(proc.pid)
            for _ in range(50):  # a process dying with its parent may take a moment
                if not left:
                    break
                time.sleep(0.1)
                left = build_processes(proc.pid)
            return list(started), Stop(
                point,
                sig.name,
                to,
                proc.returncode,
                exit_s,
                "".join(lines),
                [r.split(" ", 1)[1] for r in running],
                left,
                half_written(artifacts) if artifacts is not None else [],
            )
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError("the build reached no kill point in time")


def running_for(task: str, seconds: float, compiling: bool = False):
    """Kill point: ``task`` started ``seconds`` ago (each of these runs for longer); with
    ``compiling``, only while the C++ compiler runs (or once ten minutes have passed: the
    compile's Python part is slow on a loaded machine).  Returns the build's processes then."""

    def reached(started, pid):
        if task not in started or time.monotonic() - started[task] <= seconds:
            return False
        running = build_processes(pid)
        if compiling and not any(p.endswith(" cc1plus") for p in running):
            return running if time.monotonic() - started[task] > 600 else False
        return running

    return reached


def assert_nothing_half_done(project: Project) -> None:
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


@dataclass
class SmallBuilds:
    traced: Project
    graph: dict  # every sub-task's file_dep, targets, always (Project.graph)
    trace_dir: Path
    traced_run: DoitRun
    traced_digests: dict  # COMPARED, right after the build
    killed: Project
    # the kernel stages' generated sources and records (Project.generated / kernel_records),
    # of both checkouts, right after the builds (later tests commit in the killed checkout)
    kernel_outputs: dict = field(default_factory=dict)
    kills: list = field(default_factory=list)  # the kill points reached
    stops: list = field(default_factory=list)  # what each stop left (Stop)
    finished_before_kills: set = field(default_factory=set)  # tasks a killed run had finished
    resumed: DoitRun | None = None  # `doit release` after the kills, signed with ``signing_key``
    signing_key: Path | None = None  # the private key that signs the killed checkout's release
    public_key: Path | None = None  # ... and its public key, which a verifier trusts


def make_key(name: Path) -> tuple[Path, Path, str]:
    """A new signing key pair ``<name>.key`` / ``<name>.pub`` and its key id."""
    from laya_build.release import keys

    return keys.new(str(name))


def digests(project: Project) -> dict[str, str]:
    return {rel: sha256_file(project.version_dir() / rel) for rel in COMPARED}


@pytest.fixture(scope="session")
def small_builds(tmp_path_factory) -> SmallBuilds:
    checkpoint = write_upstream_checkpoint(tmp_path_factory.mktemp("upstream") / "checkpoint")
    traced = Project(tmp_path_factory.mktemp("deps"))
    killed = Project(tmp_path_factory.mktemp("killed"))
    for project, version in ((traced, TRACED_VERSION), (killed, KILLED_VERSION)):
        project.edit_config(lambda cfg, version=version: (small_pipeline(cfg, checkpoint), cfg.update(version=version)))
        project.commit("small pipeline")
    graph = traced.graph()
    trace_dir = tmp_path_factory.mktemp("trace")
    stages = sorted({name.split(":")[0] for name in graph}, key=_order)
    proc = start(traced, *stages, env={"PYTHONPATH": str(TRACER), "LAYA_TRACE_DIR": str(trace_dir)})
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.communicate()[0]))
    reader.start()
    builds = SmallBuilds(
        traced=traced, graph=graph, trace_dir=trace_dir, traced_run=None, traced_digests={}, killed=killed
    )
    try:
        for point, (task, after) in KILL_POINTS.items():
            workers = STOPS[point][2]
            run = start(killed, "-n", str(workers), *BUILD)
            reached = running_for(task, after, compiling=point == "AOTInductor compile")
            stopped = stop_when(run, reached, point, artifacts=killed.artifacts)
            if stopped is not None:
                started, stop = stopped
                builds.kills.append(point)
                builds.stops.append(stop)
                if workers == 1:
                    builds.finished_before_kills.update(started[:-1])  # `-n 1`: all but the last ended
                assert_nothing_half_done(killed)
        # the plain re-run carries on to the release, signed with a key made here
        builds.signing_key, builds.public_key, _ = make_key(tmp_path_factory.mktemp("keys") / "release-team")
        builds.resumed = killed.doit("release", env={"LAYA_BUILD_SIGNING_KEY": str(builds.signing_key)})
    finally:
        reader.join()
    builds.traced_run = DoitRun(proc.returncode, out[0], "")
    if proc.returncode == 0:
        builds.traced_digests = digests(traced)
    builds.kernel_outputs = {
        name: (project.generated(), project.kernel_records())
        for name, project in (("traced", traced), ("killed", killed))
    }
    return builds


@pytest.fixture(scope="module")
def released(small_builds):
    """The small pipeline's release 0.1.0, by ``doit release`` after a build killed at several
    points: a release engineer's re-run, signed with a key made for it
    (``small_builds.signing_key``).  Its model is a checkpoint upstream Laya wrote
    (``model.path``), as a release engineer packages a trained one."""
    run = small_builds.resumed
    assert run.returncode == 0, run.stdout + run.stderr
    return small_builds.killed, run
