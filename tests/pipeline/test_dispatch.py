"""The order doit starts ready tasks in (``laya_build.tasks.dispatch``): a task whose dependency
just finished goes before tasks that were ready all along, so a started chain keeps going."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

DODO = '''
import os, time
from pathlib import Path
if os.environ["UNBLOCKED_FIRST"] == "1":
    from laya_build.tasks import dispatch
    dispatch.install()

DOIT_CONFIG = {"backend": "json", "dep_file": ".doit.json"}

def log(name, seconds=0.0):
    def act():
        time.sleep(seconds)
        with open("order.txt", "a") as f:
            f.write(name + "\\n")
        if name == "chain_1":
            Path("chain_1.out").write_text("x")
    return act

def task_top():  # as `release` asks for its stages: the chain first, then independent work
    return {"actions": None, "task_dep": ["chain_1", "chain_2", "other"], "uptodate": [False]}

def task_chain_1():
    return {"actions": [log("chain_1")], "targets": ["chain_1.out"], "uptodate": [False]}

def task_chain_2():  # waits for chain_1 (its target is this task's file_dep)
    return {"actions": [log("chain_2")], "file_dep": ["chain_1.out"], "uptodate": [False]}

def task_other():  # ready from the start
    for i in range(6):
        yield {"name": str(i), "actions": [log(f"other_{i}", 0.3)], "uptodate": [False]}
'''


def _order(tmp_path, unblocked_first: bool) -> list[str]:
    (tmp_path / "dodo.py").write_text(DODO)
    env = {**os.environ, "UNBLOCKED_FIRST": "1" if unblocked_first else "0"}
    run = subprocess.run([sys.executable, "-m", "doit", "-n", "2", "top"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return (tmp_path / "order.txt").read_text().split()


@pytest.mark.parametrize("unblocked_first", [True, False], ids=["laya-build", "doit-alone"])
def test_an_unblocked_task_starts_before_tasks_ready_all_along(tmp_path, unblocked_first):
    order = _order(tmp_path, unblocked_first)
    assert sorted(order) == sorted(["chain_1", "chain_2", *[f"other_{i}" for i in range(6)]])
    assert order.index("chain_1") < order.index("chain_2")
    if unblocked_first:  # the next free worker takes chain_2: only other_0 (started beside chain_1) is before it
        assert order.index("chain_2") <= 2, order
    else:  # doit's own queue: chain_2 after every task that was ready before it
        assert order[-1] == "chain_2", order


def test_release_asks_for_the_model_chain_first():
    """Every stage once; the model chain (longest tasks, each waiting for the one before) before
    the kernel stages, latency (long) before verify (short)."""
    from laya_build.tasks.release import STAGE_GENERATORS, build_order, stage_name

    order = build_order()
    assert sorted(order) == sorted(stage_name(g) for g in STAGE_GENERATORS)
    assert order[:5] == ["model", "export", "aoti_package", "latency", "verify"]
