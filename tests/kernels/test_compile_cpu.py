"""``compile_cpu``: what it builds, and the argument validation of every call.

The checks are derived from the PrimFunc's signature, so they are exercised on the GEMM
(constant and symbolic dims), RoPE (two symbols) and attention (int32 lengths).
"""

from __future__ import annotations

import pytest
import torch

from kernels import CpuKernel, attn_kernel, compile_cpu, gemm_kernel, rope_kernel
from kernels.probe import PROBE_CASES
from kernels.reference import rope_tables

N, K, M = 70, 67, 17
TILES = dict(block_M=16, block_N=32, block_K=16)


@pytest.fixture
def gemm(cpu_kernel):
    return cpu_kernel(gemm_kernel, N, K, bias=True, act="gelu", **TILES)


def gemm_args(m=M):
    return dict(A=torch.randn(m, K), W=torch.randn(N, K), b=torch.randn(N), C=torch.empty(m, N))


def call(kernel, **overrides):
    kernel(**{**gemm_args(), **overrides})


# -- what compile_cpu builds ---------------------------------------------------------------
def test_kernel_object(gemm):
    assert isinstance(gemm, CpuKernel)
    assert gemm.prim_func.attrs["global_symbol"] == "gemm"
    assert "gemm_kernel(" in gemm.source and "float* A" in gemm.source  # scalar fp32 C
    assert [p.name for p in gemm.params] == ["A", "W", "b", "C"]


def test_distinct_prim_func_names():
    names = {
        name: case.factory.get_tir(*case.args, **case.kwargs, dtype="float32", cpu=True).attrs["global_symbol"]
        for name, case in PROBE_CASES.items()
    }
    assert names == {"gemm": "gemm", "geglu": "geglu", "add_ln": "add_ln", "rope": "rope", "attention": "attention"}


@pytest.mark.parametrize("kwargs", [{"dtype": "bfloat16"}, {"cpu": False}])
def test_compile_cpu_forces_fp32_cpu(kwargs):
    with pytest.raises(ValueError, match="compile_cpu builds the scalar fp32 specialisation"):
        compile_cpu(gemm_kernel, N, K, **kwargs)


@pytest.mark.parametrize("kernel", sorted(PROBE_CASES))
def test_fp32_gpu_call_raises(kernel):
    case = PROBE_CASES[kernel]
    with pytest.raises(ValueError, match="allowed dtypes: bfloat16, float16"):
        case.factory.get_tir(*case.args, **case.kwargs, dtype="float32")


def test_positional_and_keyword_calls_agree(gemm):
    args = gemm_args()
    C_pos = torch.empty(M, N)
    gemm(args["A"], args["W"], args["b"], C_pos)
    gemm(**args)
    assert torch.equal(C_pos, args["C"])


# -- argument validation ---------------------------------------------------------------------
def test_non_tensor(gemm):
    with pytest.raises(TypeError, match=r"argument 'W' of gemm must be a torch.Tensor, got list"):
        call(gemm, W=[[0.0] * K] * N)


def test_wrong_dtype(gemm):
    with pytest.raises(
        TypeError,
        match=r"^argument 'W' of gemm must be a contiguous CPU float32 tensor, "
        r"got torch.bfloat16 on cpu$",
    ):
        call(gemm, W=torch.randn(N, K).bfloat16())


def test_float64_rejected(gemm):
    with pytest.raises(TypeError, match=r"argument 'b' of gemm .* got torch.float64 on cpu"):
        call(gemm, b=torch.randn(N, dtype=torch.float64))


def test_non_contiguous(gemm):
    with pytest.raises(
        TypeError,
        match=r"argument 'A' of gemm must be a contiguous CPU float32 tensor, "
        r"got non-contiguous torch.float32 on cpu",
    ):
        call(gemm, A=torch.randn(K, M).t())


def test_not_on_cpu(gemm):
    with pytest.raises(TypeError, match=r"argument 'C' of gemm .* got torch.float32 on meta"):
        call(gemm, C=torch.empty(M, N, device="meta"))


def test_wrong_constant_dim(gemm):
    with pytest.raises(ValueError, match=r"argument 'W' of gemm must have shape \(70, 67\), got \(70, 66\)"):
        call(gemm, W=torch.randn(N, K - 1))


def test_wrong_rank(gemm):
    with pytest.raises(ValueError, match=r"argument 'b' of gemm must have shape \(70,\) \(rank 1\), got \(1, 70\)"):
        call(gemm, b=torch.randn(1, N))


def test_symbolic_dim_mismatch(gemm):
    with pytest.raises(
        ValueError,
        match=r"argument 'C' of gemm must have shape \(M, 70\) with M=17 "
        r"\(from argument 'A'\), got \(18, 70\)",
    ):
        call(gemm, C=torch.empty(M + 1, N))


@pytest.mark.parametrize(
    "args,kwargs,message",
    [
        ((1, 2, 3, 4, 5), {}, "gemm takes 4 arguments"),
        ((), {"A": 1}, "missing argument"),
        ((), {**{k: None for k in "AWbC"}, "D": 1}, "unexpected argument 'D'"),
    ],
    ids=["too-many", "missing", "unknown"],
)
def test_bad_call_forms(gemm, args, kwargs, message):
    with pytest.raises(TypeError, match=message):
        gemm(*args, **kwargs)


def test_validation_happens_before_any_write(gemm):
    args = gemm_args()
    args["C"].fill_(7.0)
    with pytest.raises(ValueError):
        gemm(args["A"], args["W"], args["b"][:-1].contiguous(), args["C"])
    assert (args["C"] == 7.0).all()


def test_rope_second_symbol(cpu_kernel):
    kernel = cpu_kernel(rope_kernel, 3, 8, block_M=4)
    cos, _ = rope_tables(5, 8)
    _, sin = rope_tables(6, 8)
    with pytest.raises(
        ValueError,
        match=r"argument 'sin' of rope must have shape \(L, 4\) with L=5 "
        r"\(from argument 'cos'\), got \(6, 4\)",
    ):
        kernel(torch.randn(10, 72), cos, sin)


def test_attention_lengths_must_be_int32(cpu_kernel):
    kernel = cpu_kernel(attn_kernel, None, None, 2, 16, block_M=16, block_N=16)
    qkv, out = torch.randn(2, 5, 3, 2, 16), torch.empty(2, 5, 32)
    with pytest.raises(
        TypeError,
        match=r"argument 'Lens' of attention must be a contiguous CPU int32 tensor, "
        r"got torch.int64 on cpu",
    ):
        kernel(qkv, torch.tensor([5, 3]), out)
    with pytest.raises(
        ValueError,
        match=r"argument 'O' of attention must have shape \(B, L, 32\) with L=5 "
        r"\(from argument 'QKV'\), got \(2, 6, 32\)",
    ):
        kernel(qkv, torch.tensor([5, 3], dtype=torch.int32), torch.empty(2, 6, 32))
