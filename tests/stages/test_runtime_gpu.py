"""The runner's CUDA graphs (GPU only): captured behind the first answers, and still replaying the
plain call's answer, bit for bit, after the same process did other CUDA work (another model, a
``torch.compile`` with CUDA graphs and autotuning, large allocations and frees, the allocator's
cache emptied, cuBLAS workspaces cleared).

The mixed workload (``benchmarks/serving_probe.py mixed``) runs in a child process: a replay that
faults must fail the test with the signal, not take the test run down.  On a machine without
CUDA the module is skipped, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from laya_build import PROJECT_ROOT
from laya_build.config.sections import section
from tests.stage_calls import run_export, run_model, run_package

pytestmark = [
    pytest.mark.build(seconds=600),  # two CUDA compiles of the tiny model, a torch.compile in the child
    pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs: torch.cuda.is_available() is False"),
]

BUCKETS = [{"rows": 1, "tokens": 32}, {"rows": 4, "tokens": 128}]
PRELOAD = section("package", None)["preload"]["cuda"]  # what the image needs before a CUDA package loads


@pytest.fixture(scope="module", params=["sdpa", "fused"])
def cuda_build(tmp_path_factory, request):
    """The tiny model packaged for CUDA, once with SDPA and once with the fused rotary attention (its
    Triton kernel compiled into the package; two heads of 32, a head dim the kernel runs)."""
    model_cfg = {}
    if request.param == "fused":
        pytest.importorskip("triton", reason="export.attention.cuda fused needs Triton")
        model_cfg = {"generate": {"num_attention_heads": 2}}
    base = tmp_path_factory.mktemp(f"cuda-build-{request.param}")
    model = base / "model"
    run_model(model_cfg, model)
    export_cfg = {"attention": {"cuda": request.param}}
    run_export(export_cfg, model / "checkpoint", model / "inputs.pt", base / "export", "cuda", "bfloat16")
    run_package({}, base / "export", base / "package", "cuda")
    return base


def test_background_captures_answer_first_then_replay_the_same_answers(cuda_build):
    from laya_build.runtime import serving

    inputs = torch.load(cuda_build / "model" / "inputs.pt", weights_only=True)
    args = tuple(inputs["batches"][0][k].cuda() for k in inputs["arg_names"])
    runner = serving.open_build(
        cuda_build / "package" / "aoti_package.json", buckets=BUCKETS, capture="background", preload=PRELOAD
    )
    first = runner(*args)  # before any graph: the bucket's plain call
    assert runner.wait_captured(timeout=300)
    state = runner.capture_state()
    assert state["capture"] == "background" and state["errors"] == {} and state["pending"] == []
    assert len(state["captured"]) == len(BUCKETS)
    again = runner(*args)  # a replay now
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    runner.close()


def test_graphs_keep_their_answers_while_the_process_does_other_cuda_work(cuda_build, tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            str(PROJECT_ROOT / "benchmarks" / "serving_probe.py"),
            "mixed",
            str(cuda_build / "package" / "aoti_package.json"),
            str(cuda_build / "model" / "inputs.pt"),
            "--buckets",
            json.dumps(BUCKETS),
            "--preload",
            ",".join(PRELOAD),
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")))),
        },
    )
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert run.returncode == 0, f"the child ended with {run.returncode} after {lines}: {run.stderr[-3000:]}"
    steps = [line for line in lines if "step" in line]
    assert [s["step"] for s in steps] == [
        "another model",
        "torch.compile max-autotune",
        "allocations and frees",
        "cuBLAS workspaces cleared",
    ]
    assert all(s["replay_unchanged"] for s in steps), steps
    # each replay equals the plain call on its padded inputs: when captured, and after all of it
    assert {"done": True, "replay_vs_plain": True, "replay_vs_plain_after": True} in lines
