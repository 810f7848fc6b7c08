"""One doit run per version at a time in a checkout: a second run of the same version waits,
saying which process it waits for (or with ``wait=no`` refuses at once); runs of other versions
go on beside it.  Real doit runs of a small pipeline."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from tests.pipeline.project import Project, small_pipeline

pytestmark = pytest.mark.build(seconds=60)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("lock"))
    project.edit_config(small_pipeline)
    project.commit("small pipeline")
    return project


class Run:
    """A ``doit`` run in the background; when each output line came."""

    def __init__(self, project: Project, *args: str):
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        env.pop("PYTHONPATH", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "doit", "-n", "1", *args],
            cwd=project.path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[tuple[float, str]] = []
        self.ended: float | None = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))
        self.proc.wait()
        self.ended = time.monotonic()

    def wait_for(self, prefix: str, timeout: float = 300) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, line in list(self.lines):
                if line.startswith(prefix):
                    return at
            if self.ended is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no line {prefix!r}: {self.text}")

    def finish(self, timeout: float = 600) -> int:
        self.reader.join(timeout)
        return self.proc.returncode

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def test_a_second_run_of_the_same_version_waits_for_the_first(project):
    first = Run(project, "version=1.0.0", "tir", "lower_c")
    first.wait_for(".  tir:")
    second = Run(project, "version=1.0.0", "tir", "lower_c")
    waiting = second.wait_for("laya-build: waiting: another doit run in this checkout builds version 1.0.0")
    assert f"pid {first.proc.pid}, `doit -n 1 version=1.0.0 tir lower_c`" in second.text
    assert first.finish() == 0, first.text
    assert second.finish() == 0, second.text
    assert waiting < first.ended
    # it ran nothing before the first ended: what the first built, it finds up to date
    assert not [line for _, line in second.lines if line.startswith(".  ")], second.text


def test_wait_no_refuses_naming_the_run_it_would_wait_for(project):
    first = Run(project, "version=1.1.0", "tir", "lower_c")
    first.wait_for(".  tir:")
    refused = subprocess.run(
        [sys.executable, "-m", "doit", "version=1.1.0", "wait=no", "tir"],
        cwd=project.path,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert first.finish() == 0, first.text
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr.startswith(
        "laya-build: BuildBusyError: another doit run in this checkout builds version 1.1.0 "
        f"(pid {first.proc.pid}, `doit -n 1 version=1.1.0 tir lower_c`, started "
    )
    assert "not waiting (wait=no)" in refused.stderr and "hint: wait for that run to end" in refused.stderr
    assert "executed" not in refused.stdout and not refused.stdout.strip().startswith(".")


def test_runs_of_two_versions_go_on_side_by_side(project):
    first = Run(project, "version=2.0.0", "tir", "lower_c")
    first.wait_for(".  tir:")
    second = Run(project, "version=2.1.0", "tir")
    second.wait_for(".  tir:")
    assert first.ended is None, "the second version started while the first still ran"
    assert first.finish() == 0 and second.finish() == 0
    assert "waiting" not in second.text
