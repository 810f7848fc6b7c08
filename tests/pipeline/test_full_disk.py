"""A full disk: artifacts/ on a small tmpfs, filled at several points of a real build of the small
pipeline.  Each time the build fails with one DiskFullError naming the file (or the filesystem)
and the cause, leaves no partial file and no record that is not whole; once there is space again
(the tmpfs is made larger), a plain re-run releases and verifies."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from laya_build.records import read_record
from tests.pipeline.project import Project, small_pipeline

pytestmark = pytest.mark.build(seconds=150)
MB = 1 << 20
# the small pipeline's artifacts are ~6 MB (its package alone ~3 MB): runs fail early, at the
# package, and late; each re-run goes on from what the one before finished
FILL_POINTS = (1 * MB, 3 * MB, 5 * MB)


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("fulldisk"))
    project.edit_config(small_pipeline)
    project.commit("small pipeline")
    project.artifacts.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FILL_POINTS[0]}", "tmpfs", str(project.artifacts)],
        capture_output=True,
        text=True,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for artifacts/ (needs root): {mount.stderr.strip()}")
    try:
        yield project
    finally:
        subprocess.run(["umount", "-l", str(project.artifacts)], check=False)


def resize(project: Project, size: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(project.artifacts)], check=True)


def leftovers(project: Project) -> list[str]:
    return sorted(
        str(p.relative_to(project.artifacts))
        for p in project.artifacts.rglob(".*")
        if p.is_file() and (p.name.endswith(".tmp") or ".partial." in p.name)
    )


def test_each_fill_point_fails_naming_the_disk_then_a_rerun_releases(small_disk):
    project = small_disk
    failures = []
    for size in FILL_POINTS:
        resize(project, size)
        run = project.doit("release", timeout=900)
        out = run.stdout + run.stderr
        assert run.returncode == 1, out[-3000:]
        assert "laya-build: DiskFullError: " in out, out[-3000:]
        said = re.search(r"laya-build: DiskFullError: (.*)", out).group(1)
        assert "no space left" in said or "is full" in said, said
        named = re.search(rf"{re.escape(str(project.artifacts))}/\S*", said)  # the file or folder, under artifacts/
        assert named, said
        assert "Traceback" not in out, out[-3000:]
        assert leftovers(project) == [], "a partial file survived the failure"
        for path in project.version_dir().rglob("*.json"):  # every record is whole and valid, or absent
            if "stage" in json.loads(path.read_text()):
                read_record(path)
        failures.append(named.group(0))
    assert len(set(failures)) > 1, f"every fill point failed at the same place: {failures}"
    resize(project, 256 * MB)
    run = project.doit("release", timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    verify = project.doit("verify", timeout=600)
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
    assert read_record(project.artifacts / "verifications" / "0.1.0" / "cpu-float32" / "verify.json")["status"] == "ok"
