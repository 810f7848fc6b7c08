"""What makes a task re-run, checked against what its processes really read.

One small project is built once, in one ``doit`` run, with a file tracer
(``tracer/sitecustomize.py``, an audit hook in every Python process; each line names the task
its process serves; ``conftest.py``, where it is the robustness tests' concurrent checkout).
Then:

* the oracle: every project file a task's processes opened (sources, imports, data, schemas)
  is among the task's ``file_dep``;
* every project file: appending to it re-runs exactly the tasks whose derived dependencies
  hold it (and only those);
* every output: altering it fails the task that owns it, naming the file; removing it, or
  leaving an interrupted write's temporary file beside it, re-runs that task;
* the toolchain: another installed version of a distribution (a fake dist-info first on
  ``PYTHONPATH``) or another compiler re-runs exactly the tasks that use it, and
  ``doit info`` names the change;
* the version: one version's task state never answers for another's.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections import defaultdict
from pathlib import Path

import pytest

from tests.pipeline.project import Project

pytestmark = pytest.mark.build(seconds=140)  # a traced build, then one edit at a time

PROJECT_DIRS = ("laya_build", "kernels", "schemas")


def _traced_files(trace_dir: Path, root: Path) -> dict[str, set[str]]:
    """Project files (relative) opened by the processes of each task (not doit's own: it
    loads the graph, all of laya_build.tasks; nor the fork server's before it forks)."""
    seen = defaultdict(set)
    for path in trace_dir.glob("*.txt"):
        for line in path.read_text().splitlines():
            _, opened, task = line.split("\t")
            if not task:
                continue
            p = Path(opened)
            if p.parent.name == "__pycache__":  # a cached import: its source is the dependency
                p = p.parent.parent / (p.name.split(".")[0] + ".py")
            try:
                rel = p.resolve().relative_to(root)
            except ValueError:
                continue
            if rel.parts and rel.parts[0] in PROJECT_DIRS and p.is_file():
                seen[task].add(rel.as_posix())
    return seen


@pytest.fixture(scope="module")
def built(small_builds):
    """(the traced project, its graph, the project files each task's processes opened)."""
    run = small_builds.traced_run
    assert run.returncode == 0, run.stdout + run.stderr
    assert set(run.executed) == set(small_builds.graph), run.stdout
    return small_builds.traced, small_builds.graph, _traced_files(small_builds.trace_dir, small_builds.traced.path)


def _rel(project: Project, paths) -> set[str]:
    out = set()
    for p in paths:
        try:
            out.add(Path(p).relative_to(project.path).as_posix())
        except ValueError:
            pass
    return out


def test_every_file_a_task_reads_is_a_dependency(built):
    project, graph, traces = built
    in_process = ("cuda_diff:compare", "cuda_diff:baseline_kernels")  # run inside doit: not traceable apart
    for name in graph:
        if name in in_process:
            continue
        opened = traces[name]
        assert opened, f"{name}: the tracer saw no project file (is it active?)"
        undeclared = opened - _rel(project, graph[name]["file_dep"])
        assert not undeclared, f"{name} reads {sorted(undeclared)} but does not depend on them"
    # the files the issue found missing, among them
    assert "kernels/lowering.py" in traces["cuda_source:rope.bfloat16-sm_90"]
    assert "kernels/cpu.py" in traces["lower_c:rope"]


def test_nothing_runs_again_after_a_build(built):
    project, graph, _ = built
    status = project.status()
    always = {n for n, t in graph.items() if t["always"]}
    assert always == {n for n in graph if n.startswith("verify:")}, "only verification is never answered from the cache"
    assert {n for n, s in status.items() if s == "R"} == always


def _project_files(project: Project) -> list[Path]:
    return sorted(
        p for d in PROJECT_DIRS for p in (project.path / d).rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )


def test_every_project_file_reruns_exactly_the_tasks_that_read_it(built):
    """Appending to each project file makes exactly the tasks whose derived dependencies hold
    it out of date; a file outside every closure re-runs nothing.  (doit's own status after
    each edit, asked in one process; ``doit list --status`` itself agrees on a sample.)"""
    project, graph, _ = built
    always = {n for n, t in graph.items() if t["always"]}
    users = defaultdict(set)
    for name, task in graph.items():
        for dep in _rel(project, task["file_dep"]):
            users[dep].add(name)
    edits = [(path, "\n# an edit\n" if path.suffix in (".py", ".yaml") else "\n") for path in _project_files(project)]
    statuses = project.status_after_each_edit([(p, e.encode()) for p, e in edits])
    outside = []
    for (path, _), status in zip(edits, statuses, strict=True):
        rel = path.relative_to(project.path).as_posix()
        rerun = {n for n, s in status.items() if s == "R"} - always
        expected = users[rel] - always
        assert rerun == expected, f"editing {rel} re-runs {sorted(rerun)}, expected {sorted(expected)}"
        if not users[rel]:
            outside.append(rel)
    assert outside, "some project files (the task graph, reports) are read by no stage"
    sample = [
        edits[0],
        next(e for e in edits if e[0].name == "lower_c.py"),
        next(e for e in edits if e[0].relative_to(project.path).as_posix() == outside[0]),
    ]
    for path, extra in sample:  # the CLI, one process per edit, agrees
        original = path.read_bytes()
        path.write_bytes(original + extra.encode())
        try:
            cli = project.status()
        finally:
            path.write_bytes(original)
        assert cli == statuses[edits.index((path, extra))], path


def test_an_edit_really_reruns_the_task(built):
    project, *_ = built
    path = project.path / "kernels" / "lowering.py"
    original = path.read_bytes()
    path.write_bytes(original + b"\n# an edit\n")
    try:
        run = project.doit("cuda_source", "cuda_diff")
        assert run.returncode == 0, run.stdout + run.stderr
        assert "cuda_source:rope.bfloat16-sm_90" in run.executed
    finally:
        path.write_bytes(original)
    assert project.doit("cuda_source").executed == ["cuda_source:rope.bfloat16-sm_90"]  # back to the original


def _outputs_by_task(project: Project, graph: dict) -> dict[str, list[Path]]:
    """Every file of the version folder, by the task that owns it (declared target, or a
    file inside the folder a build task owns)."""
    vdir = project.version_dir()
    owners = {}
    for name, task in graph.items():
        for t in task["targets"]:
            owners[Path(t)] = name
    out = defaultdict(list)
    for path in sorted(vdir.rglob("*")):
        if not path.is_file():
            continue
        owner = owners.get(path) or next(
            (owners[t] for t in owners if t.name.endswith(".json") and t.parent in path.parents and t.parent != vdir),
            None,
        )
        assert owner, f"{path} belongs to no task"
        out[owner].append(path)
    return out


def _downstream(graph: dict, tasks: set[str]) -> set[str]:
    """``tasks`` and every task that reads (transitively) what they write."""
    out = set(tasks)
    while True:
        targets = {t for n in out for t in graph[n]["targets"]}
        more = {n for n, t in graph.items() if n not in out and set(t["file_dep"]) & targets}
        if not more:
            return out
        out |= more


def _without_trace(project: Project, *args: str):
    """Run doit, then put its task state back as it was (a failed task loses its state in
    doit, which would make it out of date for the tests that follow)."""
    state = project.artifacts / ".doit"
    saved = state.with_name(".doit-saved")
    shutil.copytree(state, saved)
    try:
        return project.doit(*args)
    finally:
        shutil.rmtree(state)
        saved.rename(state)


def _flip(path: Path) -> bytes:
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]) if data else b"x")
    return data


def test_every_altered_output_fails_its_task_naming_the_file(built):
    """Each round alters one output of each task (every output gets its turn): the status
    shows exactly those tasks out of date, and running them fails naming the file."""
    project, graph, _ = built
    always = {n for n, t in graph.items() if t["always"]}
    outputs = _outputs_by_task(project, graph)
    outputs = {n: files for n, files in outputs.items() if n not in always}
    rounds = max(len(files) for files in outputs.values())
    for i in range(rounds):
        altered = {n: files[i] for n, files in outputs.items() if i < len(files)}
        originals = {path: _flip(path) for path in altered.values()}
        try:
            status = project.status()
            rerun = {n for n, s in status.items() if s == "R"} - always
            assert set(altered) <= rerun <= _downstream(graph, set(altered)), (i, sorted(rerun))
            if i == 0:  # running them fails, naming each file (once: runs are the slow part)
                run = _without_trace(project, "-c", "-n", "1", *sorted(altered))
                assert run.returncode != 0
                targets = {t for n in altered for t in graph[n]["targets"]}
                first = [n for n in altered if not set(graph[n]["file_dep"]) & targets]  # the others wait on them
                assert first
                for name in first:
                    assert f"{altered[name]} changed after {name} wrote it" in run.stdout + run.stderr, name
        finally:
            for path, data in originals.items():
                path.write_bytes(data)
    assert {n for n, s in project.status().items() if s == "R"} == always


def test_a_missing_output_an_extra_one_or_a_leftover_reruns_its_task(built):
    project, graph, _ = built
    vdir = project.version_dir()
    source = vdir / "lower_c" / "rope.c"
    leftover = source.with_name(".rope.c.k1ll3d.tmp")  # what a killed atomic write leaves
    leftover.write_text("half a file")
    extra = vdir / "cuda_diff" / "diffs" / "stale.diff"  # a file in a folder the task owns
    extra.parent.mkdir(parents=True, exist_ok=True)
    extra.write_text("from another run")
    script = vdir / "tir" / "rope" / "bfloat16.tir.py"
    script.unlink()
    status = project.status()
    assert {n for n, s in status.items() if s == "R"} >= {"lower_c:rope", "cuda_diff:compare", "tir:rope.bfloat16"}
    run = project.doit("lower_c", "cuda_diff", "tir")
    assert run.returncode == 0, run.stdout + run.stderr
    assert set(run.executed) == {"lower_c:rope", "cuda_diff:compare", "tir:rope.bfloat16"}
    assert not leftover.exists() and not extra.exists() and script.is_file()
    always = {n for n, t in graph.items() if t["always"]}
    assert {n for n, s in project.status().items() if s == "R"} == always


def test_doit_clean_clears_an_altered_output_and_the_next_run_rebuilds_it(built):
    project, *_ = built
    source = project.version_dir() / "cuda" / "rope" / "bfloat16-sm_90.cu"
    good = source.read_bytes()
    source.write_bytes(good + b"// appended\n")
    assert _without_trace(project, "cuda_source").returncode != 0
    assert project.doit("clean", "cuda_source").returncode == 0
    assert not source.exists()
    run = project.doit("cuda_source")
    assert run.returncode == 0 and source.read_bytes() == good


def _fake_dist(tmp_path: Path, name: str, version: str) -> Path:
    site = tmp_path / f"fake-{name}"
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return site


@pytest.mark.parametrize(
    "dist, must, must_not",
    [
        ("tokenizers", {"model:build"}, {"tir:", "probe_c:", "lower_c:", "cuda_source:"}),
        ("apache-tvm-ffi", {"tir:", "probe_c:", "lower_c:", "cuda_source:"}, {"model:build", "export:"}),
        ("sympy", {"tir:", "export:", "aoti_package:"}, set()),
    ],
)
def test_another_installed_version_reruns_exactly_its_users(built, tmp_path, dist, must, must_not):
    project, graph, _ = built
    always = {n for n, t in graph.items() if t["always"]}
    site = _fake_dist(tmp_path, dist, "99.0.0")
    status = project.status(env={"PYTHONPATH": str(site)})
    rerun = {n for n, s in status.items() if s == "R"} - always
    for prefix in must:
        assert any(n.startswith(prefix) for n in rerun), (dist, prefix, sorted(rerun))
    assert not [n for n in rerun for prefix in must_not if n.startswith(prefix)], (dist, sorted(rerun))
    named = sorted(n for n in rerun if any(n.startswith(prefix) for prefix in must))[0]
    info = project.doit("info", named, env={"PYTHONPATH": str(site)})
    assert f"{dist} " in info.stdout and "-> 99.0.0" in info.stdout, info.stdout
    assert {n for n, s in project.status().items() if s == "R"} == always  # the real install: all current


def test_another_compiler_reruns_the_stages_that_compile(built, tmp_path):
    project, graph, _ = built
    always = {n for n, t in graph.items() if t["always"]}
    fake = tmp_path / "bin" / "g++"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'g++ (Fake) 99.1.0'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    rerun = {n for n, s in project.status(env=env).items() if s == "R"} - always
    assert {"lower_c:rope", "probe_c:rope.gpu-bfloat16", "aoti_package:cpu-float32"} <= rerun
    assert not [n for n in rerun if n.startswith(("tir:", "cuda_source:", "model:", "export:"))], sorted(rerun)
    info = project.doit("info", "lower_c:rope", env=env)
    assert "g++ (Fake) 99.1.0" in info.stdout, info.stdout


def test_one_versions_state_never_answers_for_another(built):
    """The built version's model, out of date under another seed, stays out of date after
    another version is built under that seed (each version has its own task state)."""
    project, *_ = built
    assert project.status()["model:build"] == "U"
    project.edit_config(lambda c: c.setdefault("model", {}).setdefault("generate", {}).update(seed=99))
    try:
        assert project.status()["model:build"] == "R"
        run = project.doit("version=0.51.0", "model")
        assert run.executed == ["model:build"], run.stdout + run.stderr
        assert project.status()["model:build"] == "R", "another version's state answered for this one"
    finally:
        project.edit_config(lambda c: c["model"]["generate"].pop("seed"))
    assert project.status()["model:build"] == "U"
    record = json.loads((project.version_dir("0.51.0") / "model" / "model.json").read_text())
    assert record["config"]["generate"]["seed"] == 99
