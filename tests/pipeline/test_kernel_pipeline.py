"""End-to-end runs of the kernel stages in throw-away copies of the project.

A clean build of the default pipeline (doit's default: every core) must produce valid
records for every task, probes that match their pins and CUDA sources identical to a
fresh-process generation; a no-op re-run executes nothing.  (A serial build, ``doit -n 1``,
gives the same sources and records as a parallel one: tests/small_build/test_robustness.py.)
"""

from __future__ import annotations

import pytest

from laya_build.records import read_record, sha256_file
from tests.pipeline.project import KERNEL_STAGES, Project

pytestmark = pytest.mark.build(seconds=100)  # the default kernel build


def _expected_tasks(project: Project) -> set[str]:
    run = project.doit("list", "--all", "--quiet", *KERNEL_STAGES)
    assert run.returncode == 0, run.stderr
    return {line.split()[0] for line in run.stdout.splitlines() if ":" in line}


@pytest.fixture(scope="module")
def parallel(tmp_path_factory):
    """The default pipeline, built as a plain ``doit`` builds it (one worker per core)."""
    project = Project(tmp_path_factory.mktemp("parallel"))
    return project, project.doit(*KERNEL_STAGES)


def test_build_runs_every_task(parallel):
    project, run = parallel
    assert run.returncode == 0, run.stdout + run.stderr
    assert set(run.executed) == _expected_tasks(project)
    assert run.up_to_date == []


def test_every_record_is_valid(parallel):
    project, _ = parallel
    records = list(project.version_dir().rglob("*.json"))
    stages = {read_record(path)["stage"] for path in records}  # read_record validates
    assert stages == set(KERNEL_STAGES)
    variants = project.config["kernels"]["variants"]
    lower = [read_record(project.version_dir() / "lower_c" / f"{v}.json") for v in variants]
    assert all(r["passed"] and r["max_abs_err"] <= min(c["atol"] for c in r["checks"]) for r in lower)


def test_every_probe_matches_its_pin(parallel):
    """The default pipeline probes every kernel of kernels.probe in every pinned (variant,
    dtype): each diagnostic is the pinned one for the installed TileLang."""
    from kernels.probe import PROBE_CASES, load_pins, tilelang_version

    project, _ = parallel
    records = [read_record(p) for p in (project.version_dir() / "probe_c").rglob("*.json")]
    pins = load_pins()["tilelang"].get(tilelang_version())
    if pins is None:
        pytest.skip(f"no probe pins for TileLang {tilelang_version()}: re-probe with `python -m kernels.probe`")
    probed = {(r["pin"]["kernel"], r["specialisation"], r["dtype"]) for r in records}
    assert probed == {(k, v, d) for k, variants in pins.items() for v, dtypes in variants.items() for d in dtypes}
    assert {k for k, *_ in probed} == set(PROBE_CASES)
    differ = [
        (r["variant"], r["specialisation"], r["dtype"], r["pin"]["status"])
        for r in records
        if r["pin"]["status"] != "matches_pin"
    ]
    assert not differ, differ


def test_cuda_sources_cover_every_variant_dtype_arch(parallel):
    project, _ = parallel
    cfg = project.config
    expected = {
        f"cuda/{v}/{d}-{a['arch']}.cu"
        for v in cfg["kernels"]["variants"]
        for d in cfg["cuda"]["dtypes"]
        for a in cfg["cuda"]["archs"]
    }
    assert {k for k in project.generated() if k.startswith("cuda/")} == expected
    for rel in expected:
        record = read_record(project.version_dir() / rel.replace(".cu", ".json"))
        assert record["sha256"] == sha256_file(project.version_dir() / rel)
        assert "__global__" in (project.version_dir() / rel).read_text()


def test_cuda_diff_against_head_is_identical(parallel):
    project, run = parallel
    record = read_record(project.version_dir() / "cuda_diff" / "cuda_diff.json")
    n = len(record["files"])
    assert n == 10 and record["summary"] == f"{n}/{n} identical"
    assert f"cuda_diff: {n}/{n} identical" in run.stdout


def test_noop_rerun_executes_nothing(parallel):
    project, _ = parallel
    run = project.doit(*KERNEL_STAGES)
    assert run.returncode == 0, run.stderr
    assert run.executed == []
    assert set(run.up_to_date) == _expected_tasks(project)


def test_generation_is_independent_of_process_history(parallel):
    """Generating every variant in ONE process, in reverse order, and one of them twice, gives the same bytes
    as the fresh-process generation of the pipeline: the source depends only on the kernel and
    its arguments."""
    from laya_build.stages.cuda_source import generate

    project, _ = parallel
    cfg = project.config
    arch = cfg["cuda"]["archs"][0]
    cases = [
        (name, v, dtype)
        for name, v in reversed(list(cfg["kernels"]["variants"].items()))
        for dtype in reversed(cfg["cuda"]["dtypes"])
    ]
    # every variant after the others, then the first again (its PrimFunc name now collides
    # with the one generated before: TileLang renames on a collision)
    for name, v, dtype in cases + cases[:1]:
        text = generate(v["factory"], v.get("args", []), v.get("kwargs", {}), dtype, arch)
        path = project.version_dir() / "cuda" / name / f"{dtype}-{arch['arch']}.cu"
        assert text.encode() == path.read_bytes(), f"{path.name} of {name} changed when generated in-process"
