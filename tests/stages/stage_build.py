"""The session build shared by the stage tests: the tiny model exported and packaged ONCE
(cpu, float32 and bfloat16).

The float32 export also carries the single-slot program, so its package and fresh-process
verification cover the one-slot branch as well.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tests.stage_calls import run_export, run_model, run_package

DTYPES = ("float32", "bfloat16")
FAST_TIMING = {"cpu": {"warmup": 0, "min_run_time_s": 0.01, "max_run_time_s": 0.05}}  # a few calls per figure


@dataclass
class Build:
    root: Path
    checkpoint: Path
    inputs: Path
    records: dict = field(default_factory=dict)

    def export_dir(self, dtype: str) -> Path:
        return self.root / f"export-cpu-{dtype}"

    def package_dir(self, dtype: str) -> Path:
        return self.root / f"package-cpu-{dtype}"

    def package_record(self, dtype: str) -> Path:
        return self.package_dir(dtype) / "aoti_package.json"

    def eager(self, dtype: str) -> Path:
        return self.export_dir(dtype) / "eager.pt"


def make_build(root: Path) -> Build:
    b = Build(root=root, checkpoint=root / "model" / "checkpoint", inputs=root / "model" / "inputs.pt")
    b.records["model"] = run_model({}, root / "model")
    for dtype in DTYPES:
        b.records[f"export-{dtype}"] = run_export(
            {"single_slot": dtype == "float32"}, b.checkpoint, b.inputs, b.export_dir(dtype), "cpu", dtype
        )
        b.records[f"package-{dtype}"] = run_package({}, b.export_dir(dtype), b.package_dir(dtype), "cpu")
    return b
