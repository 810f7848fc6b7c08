"""Fused GEGLU (``kernels.geglu.gemm_geglu_kernel``): CPU fp32 kernel vs the fp64 reference,
GPU vs CPU."""

from __future__ import annotations

import pytest
from torch.testing import assert_close

from kernels import gemm_geglu_kernel
from kernels.reference import geglu_reference
from kernels.testing import CPU_ATOL, GPU_TOL, as_16bit, nan_like, randn, weight

SMALL_TILES = dict(block_M=16, block_N=16, block_K=16)
F, K = 37, 67  # F is not a multiple of block_N: the last gate tile overlaps the up rows


def run(kernel, A, W):
    C = nan_like((A.shape[0], W.shape[0] // 2), A.dtype, A.device)
    kernel(A, W, C)
    return C


def check(kernel, M, f, k):
    A, W = randn(M, k), weight(2 * f, k)
    assert_close(run(kernel, A, W).double(), geglu_reference(A, W), atol=CPU_ATOL, rtol=0)


@pytest.mark.parametrize("M", [1, 17, 40])
def test_one_kernel_serves_every_M(cpu_kernel, M):
    check(cpu_kernel(gemm_geglu_kernel, F, K, **SMALL_TILES), M, F, K)


@pytest.mark.parametrize("f,k", [(5, 8), (32, 48)], ids=["smaller-than-tiles", "exact-tiles"])
def test_shapes(cpu_kernel, f, k):
    check(cpu_kernel(gemm_geglu_kernel, f, k, **SMALL_TILES), 19, f, k)


def test_default_tiles(cpu_kernel):
    check(cpu_kernel(gemm_geglu_kernel, 40, 48), 130, 40, 48)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gpu_matches_cpu(cpu_kernel, gpu_kernel, dtype):
    f, k = 300, 256
    A16, W16 = as_16bit(randn(77, k), dtype), as_16bit(weight(2 * f, k), dtype)
    expected = run(cpu_kernel(gemm_geglu_kernel, f, k), A16.float(), W16.float())
    got = run(gpu_kernel(gemm_geglu_kernel, f, k, dtype=dtype), A16.cuda(), W16.cuda())
    assert_close(got.float().cpu(), expected, **GPU_TOL[dtype])
