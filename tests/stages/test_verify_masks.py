"""The verification process cannot compile or export, whether or not the compilers' modules were
imported when it masked them: a module imported later is masked as it is imported, and the masks
themselves import nothing."""

from __future__ import annotations

import json
import subprocess
import sys

from laya_build import PROJECT_ROOT

PROBE = r"""
import json, sys
import torch
from laya_build.stages.children import verify
before = sorted(m for m in ("torch._inductor", "torch._inductor.cpp_builder", "torch._dynamo") if m in sys.modules)
masked = verify.mask_compilers()
after_mask = sorted(m for m in ("torch._inductor", "torch._inductor.cpp_builder", "torch._dynamo") if m in sys.modules)
import importlib.util
looked_up = importlib.util.find_spec("torch._inductor") is not None  # a look-up alone masks nothing
import torch._inductor
from torch._inductor.cpp_builder import CppBuilder
calls = {
    "torch.compile": lambda: torch.compile(lambda x: x),
    "torch.export.export": lambda: torch.export.export(torch.nn.Identity(), (torch.ones(1),)),
    "torch._inductor.aoti_compile_and_package": lambda: torch._inductor.aoti_compile_and_package(None),
    "torch._export.aot_compile": lambda: torch._export.aot_compile(None, ()),
    "torch._inductor.cpp_builder.CppBuilder.build": lambda: CppBuilder.build(None),
}
refused = {}
for name, call in calls.items():
    try:
        call()
        refused[name] = "ran"
    except RuntimeError as exc:
        refused[name] = str(exc)
finders = [type(f).__name__ for f in sys.meta_path if type(f).__name__ == "MaskOnImport"]
print(json.dumps({"before": before, "after_mask": after_mask, "masked": masked, "refused": refused,
                  "looked_up": looked_up, "finders_left": finders}))
"""


def probe(preimport: str = "") -> dict:
    run = subprocess.run(
        [sys.executable, "-c", preimport + PROBE], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def assert_refused(out: dict) -> None:
    assert set(out["refused"]) == set(out["masked"])
    for name, answer in out["refused"].items():
        assert answer == (
            f"{name} is disabled in the verification process: it may only load the package, never compile or export"
        )


def test_compilers_imported_after_the_masks_are_masked_on_import():
    out = probe()
    assert out["before"] == out["after_mask"] == []  # masking imported no compiler
    assert out["looked_up"] is True  # a spec asked for first: the import after it is masked all the same
    assert_refused(out)
    assert out["finders_left"] == []  # once every module is masked, the import system is as it was


def test_compilers_imported_before_the_masks_are_masked_at_once():
    out = probe("import torch._inductor.cpp_builder\n")
    assert "torch._inductor.cpp_builder" in out["before"]
    assert_refused(out)
