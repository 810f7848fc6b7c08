"""The compile probe (``kernels.probe``) and the CUDA lowering of every GPU specialisation.

Pinned diagnostics are asserted only on the TileLang version they were observed on; on
another version the cases skip (re-probe with ``python -m kernels.probe`` and pin).
"""

from __future__ import annotations

import pytest

from kernels import gemm_kernel
from kernels.probe import (
    PROBE_CASES,
    as_pin,
    cuda_source,
    load_pins,
    matches_pin,
    normalise_message,
    pinned,
    probe,
    probe_case,
    tilelang_version,
)
from kernels.reference import ACTIVATIONS

PROBES = [("gpu", "bfloat16"), ("gpu", "float16"), ("cpu", "bfloat16")]


@pytest.mark.parametrize("variant,dtype", PROBES, ids=[f"{v}-{d}" for v, d in PROBES])
def test_pinned_diagnostic(variant, dtype):
    """``probe_case`` against the pins, on the cheapest kernel; every kernel's diagnostic is
    compared with its pin by the default pipeline's ``probe_c`` tasks
    (tests/pipeline/test_kernel_pipeline.py), which probe the same cases (attention alone
    spends ~20 s per probe in TileLang's layout inference)."""
    kernel = "rope"
    pin = pinned(kernel, variant, dtype)
    if pin is None:
        pytest.skip(
            f"no probe pin for TileLang {tilelang_version()} (pinned: {', '.join(sorted(load_pins()['tilelang']))}); "
            "re-probe with `python -m kernels.probe` and pin the new diagnostics"
        )
    result = probe_case(kernel, variant, dtype)
    assert matches_pin(result, pin), f"probe of {kernel}/{variant}/{dtype} changed: {result} vs pin {pin}"


def test_every_case_is_pinned_for_some_version():
    for version, kernels in load_pins()["tilelang"].items():
        assert set(kernels) == set(PROBE_CASES), version
        for variants in kernels.values():
            assert {(v, d) for v, dts in variants.items() for d in dts} == set(PROBES)


def test_fp32_cpu_specialisation_compiles_where_the_probe_fails():
    """The probe's control: the same kernel, fp32 + cpu=True, compiles for the C target."""
    case = PROBE_CASES["rope"]
    assert probe(case.factory, case.args, case.kwargs, "float32", cpu=True)["outcome"] == "compiled"


def test_probe_reports_build_errors_too():
    result = probe(gemm_kernel, (70, 67), {"act": "tanh"}, "bfloat16")
    assert result == {
        "outcome": "failed",
        "exception_type": "builtins.ValueError",
        "message": "act='tanh' is not supported; allowed: none, gelu, relu",
    }


def test_normalise_message_is_stable():
    import tilelang

    root = tilelang.__path__[0]
    exc = RuntimeError(
        f"Compilation Failed! ['g++', '/tmp/tmpab12cd_x.cpp', '-I{root}/src', "
        "'-o', '/tmp/tmpab12cd_x.so'] at 0x7f00deadbeef\nsource..."
    )
    assert normalise_message(exc) == "Compilation Failed! ['g++', '<tmp>', '-I<tilelang>/src', '-o', '<tmp>'] at 0x?"


def test_match_modes():
    result = {"outcome": "failed", "exception_type": "builtins.RuntimeError", "message": "Compilation Failed! ['g++']"}
    pin = as_pin(result)
    assert pin["match"] == "prefix" and pin["message"] == "Compilation Failed!"
    assert matches_pin(result, pin)
    assert matches_pin(result, dict(pin, match="regex", message=r"^Compilation Failed! \["))
    assert not matches_pin(result, dict(pin, match="exact"))
    assert not matches_pin(result, dict(pin, exception_type="tvm.error.InternalError"))
    assert pinned("gemm", "gpu", "bfloat16", tilelang_version_="0.0.0") is None


# -- every GPU specialisation lowers to CUDA (no GPU needed) ------------------------------------
MY_KERNELS = ["gemm", "geglu", "add_ln", "rope"]  # attention's lowering: tests/kernels/test_attention.py
TYPE_NAME = {"bfloat16": "bfloat16_t", "float16": "half_t"}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("kernel", MY_KERNELS)
def test_lowers_to_cuda(kernel, dtype):
    case = PROBE_CASES[kernel]
    src = cuda_source(case.factory, case.args, case.kwargs, dtype=dtype)
    prim_name = case.factory.get_tir(*case.args, **case.kwargs, dtype=dtype).attrs["global_symbol"]
    assert "__global__ void __launch_bounds__" in src and f"{prim_name}_kernel(" in src
    assert TYPE_NAME[dtype] in src
    if kernel in ("gemm", "geglu"):
        assert "wgmma" in src and "rasterization2DRow" in src  # tensor cores + block swizzle


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_gemm_epilogues_lower_to_cuda(act, bias):
    src = cuda_source(gemm_kernel, (1024, 1024), {"bias": bias, "act": act}, dtype="bfloat16")
    assert ("erf" in src) == (act == "gelu")
