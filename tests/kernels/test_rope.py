"""Rotate-half RoPE in place on packed QKV (``kernels.rope.rope_kernel``).

Q/K columns vs the fp64 reference at 2e-6; V columns must be bitwise untouched.  Row ``r``
has position ``r % L`` with ``L`` bound at run time from ``cos``'s shape.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from kernels import rope_kernel
from kernels.reference import rope_reference, rope_tables
from kernels.testing import GPU_TOL, ROPE_ATOL, as_16bit, randn

H, DH = 3, 8


def check(kernel, M, L, heads=H, dh=DH):
    qkv = randn(M, 3 * heads * dh)
    cos, sin = rope_tables(L, dh)
    before = qkv.clone()
    kernel(qkv, cos, sin)
    v = slice(2 * heads * dh, None)
    assert torch.equal(qkv[:, v], before[:, v]), "V columns must be untouched"
    assert_close(qkv.double(), rope_reference(before, cos, sin, heads, dh), atol=ROPE_ATOL, rtol=0)


@pytest.mark.parametrize(
    "M,L",
    [(23, 5), (3, 5), (10, 5), (1, 7), (16, 16), (41, 7)],
    ids=["wrap-partial", "shorter-than-L", "two-sequences", "single-row", "one-sequence", "wrap-other-L"],
)
def test_positions_wrap_around(cpu_kernel, M, L):
    """One compiled kernel: M and L are both runtime symbols."""
    check(cpu_kernel(rope_kernel, H, DH, block_M=4), M, L)


def test_default_tiles_model_heads(cpu_kernel):
    check(cpu_kernel(rope_kernel, 4, 64), 300, 128, heads=4, dh=64)


def test_positions_are_rows_mod_L(cpu_kernel):
    """Rows r and r + L of the same content get the same rotation."""
    kernel = cpu_kernel(rope_kernel, H, DH, block_M=4)
    L = 5
    row = randn(1, 3 * H * DH)
    qkv = row.repeat(2 * L + 3, 1)
    kernel(qkv, *rope_tables(L, DH))
    assert torch.equal(qkv[:L], qkv[L : 2 * L])


def test_odd_head_dim_rejected():
    with pytest.raises(ValueError, match="Dh must be even"):
        rope_kernel.get_tir(2, 7)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gpu_matches_cpu(cpu_kernel, gpu_kernel, dtype):
    heads, dh, L = 4, 64, 128
    qkv16 = as_16bit(randn(300, 3 * heads * dh), dtype)
    cos, sin = rope_tables(L, dh)
    qkv_cpu, qkv_gpu = qkv16.float(), qkv16.cuda()
    cpu_kernel(rope_kernel, heads, dh)(qkv_cpu, cos, sin)
    gpu_kernel(rope_kernel, heads, dh, dtype=dtype)(qkv_gpu, cos.cuda(), sin.cuda())
    v = slice(2 * heads * dh, None)
    assert torch.equal(qkv_gpu[:, v].cpu(), qkv16[:, v])
    assert_close(qkv_gpu.float().cpu(), qkv_cpu, **GPU_TOL[dtype])
