"""Residual add + LayerNorm (``kernels.add_ln.add_ln_kernel``).

Y is compared with the fp64 reference at 2e-5; the fp32 residual update must be *bitwise*
``X + R``, and ``X`` must stay untouched without ``residual``.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from kernels import add_ln_kernel
from kernels.reference import add_ln_reference
from kernels.testing import CPU_ATOL, GPU_TOL, as_16bit, nan_like, randn

D = 67
TILES = dict(block_M=4)  # M = 17, 9, ... leave a partial row tile


def run(kernel, X, R, w, b):
    Y = nan_like(X.shape, R.dtype, X.device)
    kernel(X, R, w, b, Y)
    return Y


def check(kernel, X, R, w, b, residual, bias, eps=1e-5):
    X_before = X.clone()
    Y = run(kernel, X, R, w, b)
    X_expected, Y_expected = add_ln_reference(X_before, R, w, b if bias else None, eps=eps, residual=residual)
    assert torch.equal(X, X_expected), "the residual update must be exactly X + R (or X untouched)"
    assert_close(Y.double(), Y_expected, atol=CPU_ATOL, rtol=0)


def inputs(M, d, scale=1.0):
    return randn(M, d, scale=scale), randn(M, d, scale=scale), 1.0 + 0.1 * randn(d), randn(d)


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("residual", [False, True], ids=["noresidual", "residual"])
def test_residual_bias_combinations(cpu_kernel, residual, bias):
    kernel = cpu_kernel(add_ln_kernel, D, residual=residual, bias=bias, **TILES)
    check(kernel, *inputs(17, D), residual, bias)


@pytest.mark.parametrize("residual", [False, True], ids=["noresidual", "residual"])
def test_large_residual_values(cpu_kernel, residual):
    """A residual stream of ~3e4 (R adds another ~3e4): two-pass fp32 statistics hold 2e-5."""
    kernel = cpu_kernel(add_ln_kernel, D, residual=residual, bias=True, **TILES)
    check(kernel, *inputs(17, D, scale=3e4), residual, True)


@pytest.mark.parametrize("M", [1, 4, 9])
def test_one_kernel_serves_every_M(cpu_kernel, M):
    check(cpu_kernel(add_ln_kernel, D, residual=True, bias=True, **TILES), *inputs(M, D), True, True)


def test_default_tiles_wide_rows(cpu_kernel):
    check(cpu_kernel(add_ln_kernel, 256, bias=True), *inputs(11, 256), True, True)


def test_eps_is_used(cpu_kernel):
    """Rows whose variance (~2.5e-3) is comparable to eps=1e-2: Y depends on eps."""
    kernel = cpu_kernel(add_ln_kernel, D, residual=False, bias=True, eps=1e-2, **TILES)
    X, R, w, b = 3.0 + randn(5, D, scale=0.05), randn(5, D), randn(D), randn(D)
    check(kernel, X, R, w, b, False, True, eps=1e-2)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("residual", [False, True], ids=["noresidual", "residual"])
def test_gpu_matches_cpu(cpu_kernel, gpu_kernel, dtype, residual):
    d = 1024
    X, R, w, b = inputs(100, d)
    R16 = as_16bit(R, dtype)
    X_cpu, X_gpu = X.clone(), X.cuda()
    Y_cpu = run(cpu_kernel(add_ln_kernel, d, residual=residual, bias=True), X_cpu, R16.float(), w, b)
    Y_gpu = run(
        gpu_kernel(add_ln_kernel, d, residual=residual, bias=True, dtype=dtype), X_gpu, R16.cuda(), w.cuda(), b.cuda()
    )
    # fp32 + (16-bit value upcast) is exact on both sides: the residual streams are identical.
    assert torch.equal(X_gpu.cpu(), X_cpu)
    assert_close(Y_gpu.float().cpu(), Y_cpu, **GPU_TOL[dtype])
