"""Rotate-half rotary position embedding, in place on the Q and K columns of packed QKV.

``QKV[M, 3*H*Dh]`` holds, per row, ``H`` query heads, then ``H`` key heads, then ``H`` value
heads of ``Dh`` columns each.  For every Q/K head and ``d < Dh/2``, with ``x1 = x[d]`` and
``x2 = x[d + Dh/2]``::

    x[d]        = x1 * cos[p, d] - x2 * sin[p, d]
    x[d + Dh/2] = x2 * cos[p, d] + x1 * sin[p, d]

computed in fp32 and stored back in ``dtype``.  V columns are never read or written.

Positions: row ``r`` has position ``p = r % L`` (rows are ``B`` sequences of ``L`` tokens
flattened).  ``L`` is a runtime symbol bound from ``cos``'s shape ``[L, Dh/2]`` (``sin`` must
have the same shape), and ``M`` is another one, so one compiled kernel serves every batch
size and sequence length; ``M`` need not be a multiple of ``L``.
"""

from __future__ import annotations

import tilelang
import tilelang.language as T

from ._common import ACCUM_DTYPE, GPU_PASS_CONFIGS, check_args, loop
from ._common import threads as launch_threads


@tilelang.jit(pass_configs=GPU_PASS_CONFIGS)
def rope_kernel(
    H: int,
    Dh: int,
    block_M: int = 4,
    threads: int = 128,
    dtype: str = "bfloat16",
    *,
    cpu: bool = False,
):
    """Build the in-place PrimFunc ``rope(QKV, cos, sin)`` (see the module docstring)."""
    check_args("rope_kernel", H=H, Dh=Dh, block_M=block_M, threads=threads, dtype=dtype, cpu=cpu)
    half = Dh // 2
    f32 = ACCUM_DTYPE
    M = T.dynamic("M")
    L = T.dynamic("L")

    @T.prim_func
    def rope(
        QKV: T.Tensor((M, 3 * H * Dh), dtype),
        cos: T.Tensor((L, half), f32),
        sin: T.Tensor((L, half), f32),
    ):
        with T.Kernel(T.ceildiv(M, block_M), threads=launch_threads(threads, cpu)) as bx:
            # h runs over the 2*H query and key heads, which are contiguous in a row.
            for i, h, d in loop(block_M, 2 * H, half, cpu=cpu):
                r = bx * block_M + i
                if r < M:
                    p = r % L
                    lo = h * Dh + d
                    x1 = T.cast(QKV[r, lo], f32)
                    x2 = T.cast(QKV[r, lo + half], f32)
                    QKV[r, lo] = T.cast(x1 * cos[p, d] - x2 * sin[p, d], dtype)
                    QKV[r, lo + half] = T.cast(x2 * cos[p, d] + x1 * sin[p, d], dtype)

    return rope
