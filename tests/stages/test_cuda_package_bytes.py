"""CUDA package bytes (GPU only): two clean builds of one export, compiled with the tuning file
a first build wrote, are the same ``decision.pt2`` bytes (docs/concepts/reproducibility.md).

Each build is the package stage as a build runs it: a fresh child process with an emptied
Inductor and Triton cache.  On a machine without CUDA the module is skipped, saying why.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from laya_build.records import read_record, sha256_file
from laya_build.stages import package_tuning
from tests.stage_calls import run_export, run_model, run_package

pytestmark = [
    pytest.mark.build(seconds=420),  # three CUDA compiles of the tiny model
    pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA packages: torch.cuda.is_available() is False"),
]


def test_two_cuda_builds_with_one_tuning_file_are_byte_identical(tmp_path):
    run_model({}, tmp_path / "model")
    export_dir = tmp_path / "export"
    run_export({}, tmp_path / "model" / "checkpoint", tmp_path / "model" / "inputs.pt", export_dir, "cuda", "bfloat16")

    tuned = run_package({}, export_dir, tmp_path / "tuned", "cuda")  # Inductor tunes
    assert tuned["tuning"]["input"] is None
    shutil.copy(tmp_path / "tuned" / package_tuning.FILE, tmp_path / "tuning.json")
    cfg = {"tuning": {"cuda-bfloat16": "tuning.json"}}
    builds = [run_package(cfg, export_dir, tmp_path / name, "cuda", root=tmp_path) for name in ("a", "b")]

    digests = [sha256_file(tmp_path / name / "decision.pt2") for name in ("a", "b")]
    assert digests[0] == digests[1], "two builds with one tuning file gave different package bytes"
    for name, record in zip(("a", "b"), builds):
        assert record == read_record(tmp_path / name / "aoti_package.json")
        assert record["tuning"]["autotuned"] == 0
        assert record["determinism"]["no_timed_padding"] == {"applied": True}  # no GEMM padded by a timing
        assert record["tuning"]["input"]["sha256"] == sha256_file(tmp_path / "tuning.json")
        # what the build harvested is the file it was given: tuning it again gives it again
        assert (tmp_path / name / package_tuning.FILE).read_bytes() == (tmp_path / "tuning.json").read_bytes()
