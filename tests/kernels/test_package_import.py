"""``import kernels`` must stay light: transformers imports any ``kernels`` package it finds
(while probing for Hugging Face's own), so the model stages would otherwise import tilelang."""

import subprocess
import sys

from tests.conftest import ROOT


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"import sys; {code}; print(' '.join(sys.modules))"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


def test_import_kernels_does_not_import_tilelang():
    assert "tilelang" not in _modules_after("import kernels")


def test_public_names_resolve_lazily():
    loaded = _modules_after("import kernels; kernels.rope_kernel")
    assert "tilelang" in loaded and "kernels.rope" in loaded and "kernels.gemm" not in loaded


def test_transformers_model_import_does_not_import_tilelang():
    loaded = _modules_after("from transformers import ModernBertModel")
    assert "tilelang" not in loaded
