"""cuda_diff against a git revision that changed one kernel reports exactly that kernel."""

from __future__ import annotations

import re

import pytest

from laya_build.records import read_record
from tests.pipeline.project import Project

pytestmark = pytest.mark.build(seconds=30)  # kernel builds against baselines


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("diff"))

    def small(cfg):
        keep = ("geglu", "rope", "add_ln")  # three cheap kernels
        cfg["kernels"]["variants"] = {k: v for k, v in cfg["kernels"]["variants"].items() if k in keep}
        cfg["cpu_checks"]["shapes"] = {k: v for k, v in cfg["cpu_checks"]["shapes"].items() if k in keep}

    project.edit_config(small)
    base = project.commit("baseline")
    rope = project.path / "kernels" / "rope.py"
    text, n = re.subn(
        r"block_M: int = (\d+)", lambda m: f"block_M: int = {int(m.group(1)) * 2}", rope.read_text(), count=1
    )
    assert n == 1, "rope_kernel's block_M default not found"
    rope.write_text(text)
    project.commit("rope: larger row tile")
    project.edit_config(lambda c: c["cuda"].update(baseline={"git_ref": base}, expect="report"))
    return project, base


def test_reports_exactly_the_changed_kernel(project):
    project, base = project
    run = project.doit("cuda_diff")
    assert run.returncode == 0, run.stdout + run.stderr
    record = read_record(project.version_dir() / "cuda_diff" / "cuda_diff.json")
    assert record["baseline"]["commit"] == base
    differing = sorted(f["file"] for f in record["files"] if not f["identical"])
    assert differing == ["rope/bfloat16-sm_90.cu", "rope/float16-sm_90.cu"]
    assert record["summary"] == "4/6 identical"
    for f in record["files"]:
        if f["identical"]:
            assert f["current"] == f["baseline"] and f["diff"] is None
        else:
            assert f["current"]["sha256"] != f["baseline"]["sha256"]
            cur = (project.version_dir() / "cuda" / f["file"]).read_bytes()
            old = (project.version_dir() / "cuda_diff" / "baseline" / f["file"]).read_bytes()
            off = f["first_diff_offset"]
            assert cur[:off] == old[:off] and cur[off] != old[off]
            diff = (project.version_dir() / f["diff"]).read_text()
            assert diff.startswith(f"--- baseline/{f['file']}\n+++ current/{f['file']}\n")


def test_expect_identical_fails_naming_the_files(project):
    project, _ = project
    project.edit_config(lambda c: c["cuda"].update(expect="identical"))
    record = project.version_dir() / "cuda_diff" / "cuda_diff.json"
    record.unlink(missing_ok=True)
    run = project.doit("cuda_diff")
    assert run.returncode != 0
    assert "4/6 identical" in run.stdout + run.stderr
    assert "differing: rope/bfloat16-sm_90.cu, rope/float16-sm_90.cu" in run.stdout + run.stderr
    assert not record.exists()


def test_baseline_can_be_a_built_version(project):
    project, _ = project
    project.edit_config(lambda c: c["cuda"].update(baseline={"version": "0.1.0"}, expect="identical"))
    run = project.doit("version=0.2.0", "cuda_diff")
    assert run.returncode == 0, run.stdout + run.stderr
    record = read_record(project.artifacts / "0.2.0" / "cuda_diff" / "cuda_diff.json")
    assert record["baseline"] == {"kind": "version", "version": "0.1.0", "describe": "artifact version 0.1.0"}
    assert record["summary"] == "6/6 identical"


def test_editing_a_section_reruns_its_stage_and_what_depends_on_it(project):
    project, _ = project
    project.edit_config(lambda c: c["cuda"].update(baseline={"version": "0.1.0"}, expect="report"))
    assert project.doit("version=0.2.0", "cuda_diff").returncode == 0
    project.edit_config(lambda c: c["cuda"]["archs"].append({"kind": "cuda", "arch": "sm_80"}))
    run = project.doit("version=0.2.0", "cuda_diff")
    assert run.returncode == 0, run.stdout + run.stderr
    assert sorted(run.executed) == ["cuda_diff:compare"] + [
        f"cuda_source:{v}.{d}-sm_80" for v in ("add_ln", "geglu", "rope") for d in ("bfloat16", "float16")
    ]
    record = read_record(project.artifacts / "0.2.0" / "cuda_diff" / "cuda_diff.json")
    assert record["summary"] == "6/12 identical"  # 0.1.0 has no sm_80 sources
    assert {f["file"] for f in record["files"] if f.get("note") == "missing in baseline"} == {
        f"{v}/{d}-sm_80.cu" for v in ("add_ln", "geglu", "rope") for d in ("bfloat16", "float16")
    }
    project.edit_config(lambda c: c["cuda"]["archs"].pop())


def test_missing_baseline_version_is_a_difference(project):
    project, _ = project
    project.edit_config(lambda c: c["cuda"].update(baseline={"version": "0.0.9"}, expect="identical"))
    run = project.doit("version=0.2.0", "cuda_diff")
    assert run.returncode != 0
    assert "0/6 identical against artifact version 0.0.9" in run.stdout + run.stderr
