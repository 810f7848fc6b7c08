"""The helpers the GPU benchmark scripts share (benchmarks/copies.sh): a build in a copy of the
project stopped at its time limit with every process it started, so a script bound by a deadline
hands back its log instead of being killed with it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pipeline.project import ROOT

# A stand-in for `python -m doit ...`: a build that starts a worker and never ends.
STAND_IN = """#!/bin/bash
sleep 300 &
echo $! > "$WORK/worker.pid"
echo $$ > "$WORK/build.pid"
wait
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return stat[0] != "Z"  # a zombie has ended


def run_helpers(tmp_path: Path, script: str, **env) -> tuple[subprocess.CompletedProcess, float]:
    work = tmp_path / "work"
    (work / "copy").mkdir(parents=True)
    python = tmp_path / "python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    start = time.monotonic()
    run = subprocess.run(
        ["bash", "-c", f"set -u; . benchmarks/copies.sh; {script}"],
        cwd=ROOT,
        env={
            **os.environ,
            "SRC": str(ROOT),
            "WORK": str(work),
            "log": str(tmp_path / "run.log"),
            "PY": str(python),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    return run, time.monotonic() - start


def test_a_build_past_its_limit_is_stopped_with_every_process_it_started(tmp_path):
    run, took = run_helpers(tmp_path, 'LIMIT_S=2 doit_in copy pipeline.yaml aoti_package:cpu-float32; echo "rc $?"')
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "rc 124"
    assert took < 60, took
    log = (tmp_path / "run.log").read_text()
    assert "copy: doit aoti_package:cpu-float32 stopped at its limit of 2 s" in log
    assert "copy: doit aoti_package:cpu-float32 rc 124 in" in log
    work = tmp_path / "work"
    for name in ("build.pid", "worker.pid"):
        pid = int((work / name).read_text())
        deadline = time.monotonic() + 30
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pid), f"{name} {pid} still runs"


def test_without_a_limit_a_build_runs_to_its_end(tmp_path):
    run, _ = run_helpers(tmp_path, 'PY=true; doit_in copy pipeline.yaml verify:cpu-float32; echo "rc $?"')
    assert run.stdout.splitlines()[-1] == "rc 0"
    assert "stopped at its limit" not in (tmp_path / "run.log").read_text()


@pytest.mark.parametrize(("deadline", "reserve", "left"), [(100, 10, 90), (100, 100, 0), (5, 60, 0)])
def test_the_time_left_before_the_deadline_is_never_negative(tmp_path, deadline, reserve, left):
    run, _ = run_helpers(tmp_path, f"until_deadline {reserve}", DEADLINE_S=str(deadline))
    # bash's SECONDS counts whole seconds since the script started: one may have passed
    assert int(run.stdout.strip()) in {left, max(left - 1, 0)}, run.stdout


@pytest.mark.parametrize(("deadline", "needed", "skipped"), [(100, 10, False), (100, 100, True), (5, 60, True)])
def test_a_step_that_would_run_past_the_deadline_is_skipped_and_said(tmp_path, deadline, needed, skipped):
    run, _ = run_helpers(tmp_path, f'late {needed} "the step" && echo skip || echo run', DEADLINE_S=str(deadline))
    assert run.stdout.splitlines()[-1] == ("skip" if skipped else "run")
    log = tmp_path / "run.log"
    assert (log.exists() and "deadline: the step skipped" in log.read_text()) == skipped


def test_named_test_functions_run_each_in_a_fresh_interpreter_and_anything_else_is_said_not_run(tmp_path):
    (tmp_path / "gpu_checks.py").write_text("def passes():\n    pass\n\ndef fails():\n    raise AssertionError('no')\n")
    run, _ = run_helpers(
        tmp_path,
        "run_tests none no gpu_checks.py::passes gpu_checks.py::fails; echo done",
        PY=sys.executable,
        PYTHONPATH=str(tmp_path),
        DEADLINE_S="600",
    )
    assert run.returncode == 0, run.stderr
    log = (tmp_path / "run.log").read_text()
    assert "tests: no is not a test's node id (FILE.py::FUNCTION); not run" in log
    assert "none" not in log.replace("not run", "")
    assert "PASSED gpu_checks.py::passes" in log
    assert "FAILED gpu_checks.py::fails" in log and "AssertionError: no" in log


def test_a_profile_summary_lists_one_forward_in_order_with_the_idle_time_before_each_event():
    """package_latency's profile of a trace: GPU events only (kernels, memsets, copies), per forward;
    the kernels by name, the most time first; the first replay's events in the order they ran, each
    with the idle time since the one before and a memset's bytes, whatever order the trace lists them in."""
    from benchmarks.package_latency import trace_summary

    def event(cat, name, ts, dur, **args):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, **({"args": args} if args else {})}

    replay = [
        event("kernel", "gemm", 0.0, 10.0),
        event("gpu_memset", "Memset (Unknown)", 12.0, 1.0, bytes=4),
        event("kernel", "norm", 16.0, 5.0),
    ]
    second = [{**e, "ts": e["ts"] + 100.0} for e in replay]
    events = [*reversed(second), event("cpu_op", "aten::mm", 1.0, 50.0), *reversed(replay)]
    summary = trace_summary(events, calls=2)
    assert summary["events_per_forward"] == 3 and summary["kernels_per_forward"] == 2
    assert summary["gpu_us_per_forward"] == 16.0 and summary["span_us_per_forward"] == 60.5
    assert [t["name"] for t in summary["top"]] == ["kernel: gemm", "kernel: norm", "gpu_memset: Memset (Unknown)"]
    assert summary["forward"] == [
        ["kernel: gemm", 0.0, 10.0, None],
        ["gpu_memset: Memset (Unknown)", 2.0, 1.0, 4],
        ["kernel: norm", 3.0, 5.0, None],
    ]
    assert trace_summary([event("cpu_op", "aten::mm", 0.0, 1.0)], calls=2) == {"calls": 2, "events_per_forward": 0}


def test_a_benchmark_call_fills_every_position_or_keeps_each_rows_saved_length():
    """``benchmarks/runtime_bench.synthetic_call``: with ``full`` (the latency benchmarks' default)
    every position of every row is real, the saved tokens repeated; with ``saved`` each row is its
    saved decision's own tokens and then padding, its markers inside the real part."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from runtime_bench import synthetic_call

    lengths, pad = [5, 9, 3], 0
    ids = torch.full((3, 16), pad)
    for r, n in enumerate(lengths):
        ids[r, :n] = torch.arange(1, n + 1) + 10 * r
    inputs = {
        "special_ids": {"pad_token_id": pad},
        "batches": [{"input_ids": ids, "valid_tokens": lengths, "qtype": torch.tensor([0, 1, 2])}],
    }
    full = synthetic_call(inputs, 4, 8, 3)
    assert (
        full[1].all() and full[0][0].tolist() == [1, 2, 3, 4, 5, 1, 2, 3] and full[0][3].tolist()[:5] == [1, 2, 3, 4, 5]
    )
    assert full[2].tolist() == [[4, 7, 7]] * 4 and full[4].tolist() == [0, 1, 2, 0]
    saved = synthetic_call(inputs, 4, 8, 3, "saved")
    assert saved[1].sum(1).tolist() == [5, 8, 3, 5]  # the second row cut at the call's 8 tokens
    assert saved[0][2].tolist() == [21, 22, 23, pad, pad, pad, pad, pad]
    assert saved[2].tolist() == [[4, 4, 4], [4, 7, 7], [2, 2, 2], [4, 4, 4]]
    assert bool((saved[2] < saved[1].sum(1, keepdim=True)).all())
    with pytest.raises(ValueError, match="fill 'half' is not one of full, saved"):
        synthetic_call(inputs, 1, 8, 3, "half")
