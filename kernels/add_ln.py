"""Residual add + LayerNorm: ``X += R`` (in place, fp32), then ``Y = LayerNorm(X) * w (+ b)``.

``X`` is the fp32 residual stream ``[M, D]``; ``R`` (the branch output, ``dtype``) is added
to it in place when ``residual=True``; with ``residual=False`` ``X`` is only read and ``R`` is
ignored (it stays a parameter so every specialisation has the signature ``k(X, R, w, b, Y)``).
``w`` and ``b`` are fp32 ``[D]``; ``b`` is read only when ``bias=True``.  ``Y`` is stored in
``dtype``.  Statistics are fp32 and two-pass (mean, then the mean of squared deviations:
biased variance, like ``torch.nn.LayerNorm``), which keeps residual values of ~1e4 accurate.

Each block normalises ``block_M`` whole rows (``D`` is a compile-time constant); ``M`` is a
runtime symbol and the ``r < M`` predicate guards the partial last row tile.  The updated
residual ``X + R`` is a single fp32 addition, bitwise equal to ``torch``'s ``X + R``.
"""

from __future__ import annotations

import tilelang
import tilelang.language as T

from ._common import ACCUM_DTYPE, GPU_PASS_CONFIGS, alloc, check_args, loop
from ._common import threads as launch_threads


@tilelang.jit(pass_configs=GPU_PASS_CONFIGS)
def add_ln_kernel(
    D: int,
    residual: bool = True,
    bias: bool = False,
    eps: float = 1e-5,
    block_M: int = 4,
    threads: int = 128,
    dtype: str = "bfloat16",
    *,
    cpu: bool = False,
):
    """Build the PrimFunc ``add_ln(X, R, w, b, Y)`` (see the module docstring)."""
    check_args(
        "add_ln_kernel",
        D=D,
        residual=residual,
        bias=bias,
        eps=eps,
        block_M=block_M,
        threads=threads,
        dtype=dtype,
        cpu=cpu,
    )
    f32 = ACCUM_DTYPE
    M = T.dynamic("M")

    @T.prim_func
    def add_ln(
        X: T.Tensor((M, D), f32),
        R: T.Tensor((M, D), dtype),
        w: T.Tensor((D,), f32),
        b: T.Tensor((D,), f32),
        Y: T.Tensor((M, D), dtype),
    ):
        with T.Kernel(T.ceildiv(M, block_M), threads=launch_threads(threads, cpu)) as bx:
            x = alloc((block_M, D), f32, cpu)
            sq = alloc((block_M, D), f32, cpu)
            stat = alloc((block_M,), f32, cpu)
            # Load (and update) the residual stream; padded rows hold zeros.
            for i, j in loop(block_M, D, cpu=cpu):
                r = bx * block_M + i
                v = T.if_then_else(r < M, X[r, j], T.float32(0))
                if residual:
                    v = v + T.if_then_else(r < M, T.cast(R[r, j], f32), T.float32(0))
                x[i, j] = v
            if residual:
                for i, j in loop(block_M, D, cpu=cpu):
                    if bx * block_M + i < M:
                        X[bx * block_M + i, j] = x[i, j]
            # Two-pass statistics: centre by the mean, then the biased variance.
            T.reduce_sum(x, stat, dim=1)
            for i, j in loop(block_M, D, cpu=cpu):
                x[i, j] = x[i, j] - stat[i] / D
            for i, j in loop(block_M, D, cpu=cpu):
                sq[i, j] = x[i, j] * x[i, j]
            T.reduce_sum(sq, stat, dim=1)
            for i, j in loop(block_M, D, cpu=cpu):
                r = bx * block_M + i
                if r < M:
                    y = x[i, j] * T.rsqrt(stat[i] / D + eps) * w[j]
                    if bias:
                        y = y + b[j]
                    Y[r, j] = T.cast(y, dtype)

    return add_ln
