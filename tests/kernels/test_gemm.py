"""GEMM (``kernels.gemm.gemm_kernel``): CPU fp32 kernel vs the fp64 reference, GPU vs CPU."""

from __future__ import annotations

import pytest
import torch

from kernels import compile_cpu, gemm_kernel
from kernels.reference import ACTIVATIONS, gemm_reference
from kernels.testing import CPU_ATOL, GPU_TOL, as_16bit, nan_like, randn, weight

# Tiles that no test shape is a multiple of: every kernel sees partial M, N and K tiles.
SMALL_TILES = dict(block_M=16, block_N=32, block_K=16)
N, K = 70, 67


def run(kernel, A, W, b):
    C = nan_like((A.shape[0], W.shape[0]), A.dtype, A.device)
    kernel(A, W, b, C)
    return C


def check(kernel, M, n, k, bias, act):
    A, W, b = randn(M, k), weight(n, k), randn(n)
    expected = gemm_reference(A, W, b if bias else None, act)
    torch.testing.assert_close(run(kernel, A, W, b).double(), expected, atol=CPU_ATOL, rtol=0)


def test_spec_seed_example():
    """The reference document's example, default tiles: 17x67 @ 70x67^T + b, gelu."""
    A, W, b, C = torch.randn(17, 67), torch.randn(70, 67), torch.randn(70), torch.empty(17, 70)
    kernel = compile_cpu(gemm_kernel, 70, 67, bias=True, act="gelu")
    kernel(A, W, b, C)
    # Unscaled randn weights give |C| ~ 10; the fp32 kernel still meets the spec's 2e-5
    # (worst over 20 seeds: 1.1e-5).
    torch.testing.assert_close(C.double(), gemm_reference(A, W, b, "gelu"), atol=CPU_ATOL, rtol=0)


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_epilogues(cpu_kernel, act, bias):
    check(cpu_kernel(gemm_kernel, N, K, bias=bias, act=act, **SMALL_TILES), 37, N, K, bias, act)


@pytest.mark.parametrize("M", [1, 16, 17, 50])
def test_one_kernel_serves_every_M(cpu_kernel, M):
    """M = 1, exactly one tile, one row past a tile, several tiles: the same compiled kernel."""
    check(cpu_kernel(gemm_kernel, N, K, bias=True, act="relu", **SMALL_TILES), M, N, K, True, "relu")


@pytest.mark.parametrize(
    "n,k",
    [(5, 3), (64, 32), (33, 100)],
    ids=["smaller-than-tiles", "exact-tiles", "several-K-tiles"],
)
def test_shapes(cpu_kernel, n, k):
    check(cpu_kernel(gemm_kernel, n, k, bias=True, act="gelu", **SMALL_TILES), 21, n, k, True, "gelu")


def test_bias_ignored_without_bias(cpu_kernel):
    """``b`` is read only when ``bias=True``: NaN there must not reach C."""
    kernel = cpu_kernel(gemm_kernel, N, K, bias=False, act="none", **SMALL_TILES)
    A, W = randn(9, K), weight(N, K)
    C = run(kernel, A, W, torch.full((N,), float("nan")))
    torch.testing.assert_close(C.double(), gemm_reference(A, W), atol=CPU_ATOL, rtol=0)


def test_empty_batch(cpu_kernel):
    kernel = cpu_kernel(gemm_kernel, N, K, bias=True, act="relu", **SMALL_TILES)
    C = torch.empty(0, N)
    kernel(torch.empty(0, K), weight(N, K), randn(N), C)
    assert C.shape == (0, N)


def test_options_are_validated():
    with pytest.raises(ValueError, match="act='tanh'.*none, gelu, relu"):
        gemm_kernel.get_tir(N, K, act="tanh")
    with pytest.raises(ValueError, match="K must be a positive int"):
        gemm_kernel.get_tir(N, 0)


# -- GPU (bf16/fp16) vs the CPU fp32 kernel on the same rounded inputs ----------------------
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("act,bias", [("none", False), ("gelu", True), ("relu", True)])
def test_gpu_matches_cpu(cpu_kernel, gpu_kernel, dtype, act, bias):
    n, k = 300, 200
    A16, W16, b = as_16bit(randn(77, k), dtype), as_16bit(weight(n, k), dtype), randn(n)
    expected = run(cpu_kernel(gemm_kernel, n, k, bias=bias, act=act), A16.float(), W16.float(), b)
    got = run(gpu_kernel(gemm_kernel, n, k, bias=bias, act=act, dtype=dtype), A16.cuda(), W16.cuda(), b.cuda())
    torch.testing.assert_close(got.float().cpu(), expected, **GPU_TOL[dtype])
