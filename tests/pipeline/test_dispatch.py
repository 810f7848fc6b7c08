"""The order doit starts ready tasks in (``laya_build.tasks.dispatch``): a task whose dependency
just finished goes before tasks that were ready all along, so a started chain keeps going."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

DODO = """
import os, time
from pathlib import Path
if os.environ["UNBLOCKED_FIRST"] == "1":
    from laya_build.tasks import dispatch
    dispatch.install()

DOIT_CONFIG = {"backend": "json", "dep_file": ".doit.json"}

def started(name):
    return Path("started.txt").exists() and name in Path("started.txt").read_text().split()

def wait_for(name):  # what another worker does, however slowly a loaded machine runs it
    deadline = time.monotonic() + 60
    while not started(name) and time.monotonic() < deadline:
        time.sleep(0.01)

def run(name, seconds, after=None, until=None):
    def act():
        if after:
            wait_for(after)
        with open("started.txt", "a") as f:
            f.write(name + "\\n")
        time.sleep(seconds)
        if until:
            wait_for(until)
        if name == "chain_1":
            Path("chain_1.out").write_text("x")
    return act

def task_top():  # as `release` asks for its stages: the chain first, then independent work
    return {"actions": None, "task_dep": ["chain_1", "chain_2", "other"], "uptodate": [False]}

def task_chain_1():  # long enough that doit has queued every `other` task when it ends
    return {"actions": [run("chain_1", 1.0, until="other_2")], "targets": ["chain_1.out"], "uptodate": [False]}

def task_chain_2():  # waits for chain_1 (its target is this task's file_dep)
    return {"actions": [run("chain_2", 0.0)], "file_dep": ["chain_1.out"], "uptodate": [False]}

def task_other():  # ready from the start
    for i in range(OTHERS):
        yield {"name": str(i), "actions": [run(f"other_{i}", 0.4, after="chain_1")], "uptodate": [False]}
"""
OTHERS = 10


def _order(tmp_path, unblocked_first: bool) -> list[str]:
    (tmp_path / "dodo.py").write_text(DODO.replace("OTHERS", str(OTHERS)))
    env = {**os.environ, "UNBLOCKED_FIRST": "1" if unblocked_first else "0"}
    run = subprocess.run(
        [sys.executable, "-m", "doit", "-n", "2", "top"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return (tmp_path / "started.txt").read_text().split()


@pytest.mark.parametrize("unblocked_first", [True, False], ids=["laya-build", "doit-alone"])
def test_an_unblocked_task_starts_before_tasks_ready_all_along(tmp_path, unblocked_first):
    """Start order with two workers: chain_1 (at least 1 s, and until the third `other` task has
    started) beside the 0.4 s `other` tasks, which start after it."""
    order = _order(tmp_path, unblocked_first)
    assert sorted(order) == sorted(["chain_1", "chain_2", *[f"other_{i}" for i in range(OTHERS)]])
    assert order[0] == "chain_1" and order.index("other_2") < order.index("chain_2"), order
    if unblocked_first:  # the next free worker takes chain_2, before the others still queued
        assert order.index("chain_2") < len(order) - 3, order
    else:  # doit's own queue: chain_2 after every task that was ready before it
        assert order[-1] == "chain_2", order


def test_release_asks_for_the_model_chain_first():
    """Every stage once; the model chain (longest tasks, each waiting for the one before) before
    the kernel stages, latency (long) before verify (short)."""
    from laya_build.tasks.release import STAGE_GENERATORS, build_order, stage_name

    order = build_order()
    assert sorted(order) == sorted(stage_name(g) for g in STAGE_GENERATORS)
    assert order[:5] == ["model", "export", "aoti_package", "latency", "verify"]
