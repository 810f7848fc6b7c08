"""The README's quick start, run as a release engineer runs it: every line of its ``sh
quickstart`` block, in order, in a fresh copy of the project, each through ``bash -c`` from the
project root (the scratch folder ``/tmp/elsewhere`` is this test's own).  Then what the README
says each leaves where."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.pipeline.project import ROOT, Project

pytestmark = pytest.mark.build(seconds=420)
SCRATCH = "/tmp/elsewhere"


def quickstart_lines() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```sh quickstart\n(.*?)^```", readme, re.S | re.M)
    assert len(blocks) == 1, "README.md has one ```sh quickstart block"
    return [line for line in blocks[0].splitlines() if line.strip() and not line.lstrip().startswith("#")]


def tree(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_the_quickstart_block_is_what_the_readme_promises():
    lines = quickstart_lines()
    assert lines[0].startswith(".venv/bin/doit release")
    assert any("release_diff --old 0.1.0 --new 0.2.0" in line for line in lines)
    assert any("verify release=" in line for line in lines)
    assert any("LAYA_BUILD_SIGNING_KEY=" in line for line in lines), "the quick start signs a release"
    assert any("LAYA_BUILD_TRUSTED_KEYS=" in line and "verify" in line for line in lines)


def test_the_readme_quickstart_runs(tmp_path):
    project = Project(tmp_path / "laya-build")
    (project.path / ".venv").symlink_to(ROOT / ".venv")
    scratch = tmp_path / "elsewhere"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    copied = None
    for line in quickstart_lines():
        command = line.replace(SCRATCH, str(scratch))
        if "verify release=" in command:
            copied = tree(scratch / "0.1.0")
        run = subprocess.run(
            ["bash", "-c", command], cwd=project.path, env=env, capture_output=True, text=True, timeout=1800
        )
        assert run.returncode == 0, f"{line}\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"

    artifacts = project.artifacts
    for version in ("0.1.0", "0.2.0"):
        vdir = artifacts / version
        assert (vdir / "manifest.json").is_file() and (vdir / "REPORT.md").is_file()
        assert (vdir / "pipeline.effective.json").is_file()
        assert json.loads((vdir / "manifest.json").read_text())["version"] == version
    for version in ("0.1.0", "0.2.0"):
        vdir = artifacts / version
        assert (vdir / "provenance.json").is_file() and (vdir / "SHA256SUMS").is_file()
        check = subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=vdir, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
    assert not (artifacts / "0.1.0" / "release.sig").exists(), "no key: 0.1.0 is unsigned"
    assert json.loads((artifacts / "0.2.0" / "manifest.json").read_text())["signature"]["file"] == "release.sig"
    assert (artifacts / "0.2.0" / "release.sig").is_file()
    assert (artifacts / "verifications" / "0.2.0").is_dir(), "the signed release was verified"
    verified = artifacts / "verifications" / "0.1.0"
    records = sorted(verified.glob("*/verify.json"))
    assert records, "verify of a released version writes its results under artifacts/verifications/<version>/"
    assert all(json.loads(r.read_text())["status"] in ("ok", "skipped") for r in records)
    assert any(json.loads(r.read_text())["status"] == "ok" for r in records)
    assert copied is not None and tree(scratch / "0.1.0") == copied, "verify wrote into the copied release"
    diff = artifacts / "release_diff" / "0.1.0..0.2.0"
    assert (diff / "release_diff.md").read_text().startswith("# Release diff 0.1.0 → 0.2.0")
    assert json.loads((diff / "release_diff.json").read_text())["stage"] == "release_diff"
    assert (
        subprocess.run(
            ["git", "status", "--porcelain"], cwd=project.path, capture_output=True, text=True
        ).stdout.strip()
        == ""
    ), "the quick start leaves the checkout clean"
