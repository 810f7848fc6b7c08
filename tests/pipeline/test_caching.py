"""doit's caching: executed-task counts after edits (never timings)."""

from __future__ import annotations

import re

import pytest

from laya_build.records import read_record
from tests.pipeline.project import Project

pytestmark = pytest.mark.build(seconds=45)  # kernel builds and re-runs

STAGES = ("tir", "probe_c", "lower_c", "cuda_source", "cuda_diff")


def _small(cfg: dict) -> None:
    """Two variants, one dtype: enough to see which tasks re-run, cheap enough for CI."""
    keep = ("geglu", "rope")  # cheap kernels (all tasks of geglu ~7 s, of gemm_gelu ~13 s)
    cfg["kernels"]["variants"] = {k: v for k, v in cfg["kernels"]["variants"].items() if k in keep}
    cfg["cpu_checks"]["shapes"] = {k: v for k, v in cfg["cpu_checks"]["shapes"].items() if k in keep}
    cfg["cpu_checks"]["atol_overrides"] = {k: v for k, v in cfg["cpu_checks"]["atol_overrides"].items() if k in keep}
    cfg["cuda"]["dtypes"] = ["bfloat16"]
    cfg["probe"] = {"dtypes": ["bfloat16"]}
    cfg["cuda"]["baseline"] = None


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("cache"))
    project.edit_config(_small)
    project.commit("small pipeline")
    first = project.doit(*STAGES)
    assert first.returncode == 0, first.stdout + first.stderr
    assert len(first.executed) == 2 * 2 + 2 + 2 + 2  # tir (bf16 + cpu), probe, lower_c, cuda_source
    return project


def _rerun(project: Project, *args: str):
    run = project.doit(*(args or STAGES))
    assert run.returncode == 0, run.stdout + run.stderr
    return sorted(run.executed)


def test_noop(project):
    assert _rerun(project) == []


def test_editing_one_kernel_reruns_only_its_tasks(project):
    path = project.path / "kernels" / "rope.py"
    path.write_text(path.read_text() + "\n# an edit\n")
    assert _rerun(project) == [
        "cuda_source:rope.bfloat16-sm_90",
        "lower_c:rope",
        "probe_c:rope.gpu-bfloat16",
        "tir:rope.bfloat16",
        "tir:rope.cpu-float32",
    ]
    assert _rerun(project) == []


def test_editing_one_variants_checks_reruns_only_its_lower_c(project):
    project.edit_config(lambda c: c["cpu_checks"]["shapes"]["rope"].append({"M": 33, "L": 8}))
    assert _rerun(project) == ["lower_c:rope"]
    checks = read_record(project.version_dir() / "lower_c" / "rope.json")["checks"]
    assert checks[-1]["shape"] == {"M": 33, "L": 8}


def test_editing_a_stage_section_reruns_that_stage(project):
    project.edit_config(lambda c: c["cpu_checks"].update(seed=4321))
    assert _rerun(project) == ["lower_c:geglu", "lower_c:rope"]
    assert read_record(project.version_dir() / "lower_c" / "geglu.json")["seed"] == 4321


def test_editing_a_stage_module_reruns_that_stage(project):
    path = project.path / "laya_build" / "stages" / "cuda_source.py"
    path.write_text(path.read_text() + "\n# an edit\n")
    assert _rerun(project) == ["cuda_source:geglu.bfloat16-sm_90", "cuda_source:rope.bfloat16-sm_90"]


def test_adding_an_arch_adds_only_its_sources(project):
    project.edit_config(lambda c: c["cuda"]["archs"].append({"kind": "cuda", "arch": "sm_80"}))
    assert _rerun(project) == ["cuda_source:geglu.bfloat16-sm_80", "cuda_source:rope.bfloat16-sm_80"]


def test_version_override_builds_a_new_version(project):
    listed = project.doit("list", "--all", "--quiet", "version=0.2.0", *STAGES).stdout.split()
    executed = _rerun(project, "version=0.2.0", *STAGES)
    assert executed == sorted(t for t in listed if ":" in t)
    assert (project.artifacts / "0.2.0" / "lower_c" / "rope.json").is_file()
    assert _rerun(project) == [], "the configured version is still up to date"


def test_failed_check_fails_the_task_and_writes_nothing(project):
    project.edit_config(lambda c: c["cpu_checks"]["atol_overrides"].update(geglu=1e-12))
    record = project.version_dir() / "lower_c" / "geglu.json"
    record.unlink()
    run = project.doit("lower_c")
    assert run.returncode != 0
    assert re.search(
        r"geglu shape 0 \{'M': 5\}: C differs from the reference by [0-9.e-]+ > atol 1.0e-12", run.stdout + run.stderr
    )
    assert not record.exists()
    assert not list(record.parent.glob(".*.tmp")), "no temp file left behind"
