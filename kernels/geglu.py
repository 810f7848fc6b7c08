"""ModernBERT's GLU up-projection, fused: ``C[M, F] = gelu(A @ W[:F]^T) * (A @ W[F:]^T)``.

``W`` is the ``[2F, K]`` weight of ModernBERT's ``Wi`` linear layer (gate rows first, then
the "up" rows); ``gelu`` is exact (erf).  Each block computes the gate and the up tiles of
the same output columns with two ``T.gemm`` into two fp32 accumulators and multiplies them in
the epilogue, so the ``[M, 2F]`` intermediate never reaches memory.

``M`` is a runtime symbol.  Padding: loads are zero-padded by ``T.copy``'s predicates against
``W``'s ``2F`` rows; a partial last column tile of the gate half therefore reads (finite) rows
of the up half, whose products land only in columns ``>= F`` that the ``c < F`` store
predicate discards.
"""

from __future__ import annotations

import tilelang
import tilelang.language as T

from ._common import ACCUM_DTYPE, GPU_PASS_CONFIGS, alloc, check_args, gelu, loop, rasterize, stages
from ._common import threads as launch_threads


@tilelang.jit(pass_configs=GPU_PASS_CONFIGS)
def gemm_geglu_kernel(
    F: int,
    K: int,
    block_M: int = 128,
    block_N: int = 128,
    block_K: int = 64,
    num_stages: int = 3,
    threads: int = 256,
    dtype: str = "bfloat16",
    *,
    cpu: bool = False,
):
    """Build the fused GEGLU PrimFunc ``geglu(A, W, C)`` (see the module docstring).

    Default tiles: the best of a small sweep on an H200 at M=8192, F=2624, K=1024
    (two 128x128 fp32 accumulators per block).
    """
    check_args(
        "gemm_geglu_kernel",
        F=F,
        K=K,
        block_M=block_M,
        block_N=block_N,
        block_K=block_K,
        num_stages=num_stages,
        threads=threads,
        dtype=dtype,
        cpu=cpu,
    )
    M = T.dynamic("M")

    @T.prim_func
    def geglu(
        A: T.Tensor((M, K), dtype),
        W: T.Tensor((2 * F, K), dtype),
        C: T.Tensor((M, F), dtype),
    ):
        with T.Kernel(T.ceildiv(F, block_N), T.ceildiv(M, block_M), threads=launch_threads(threads, cpu)) as (bx, by):
            A_s = alloc((block_M, block_K), dtype, cpu, "shared")
            Wg_s = alloc((block_N, block_K), dtype, cpu, "shared")
            Wu_s = alloc((block_N, block_K), dtype, cpu, "shared")
            gate = alloc((block_M, block_N), ACCUM_DTYPE, cpu)
            up = alloc((block_M, block_N), ACCUM_DTYPE, cpu)
            rasterize(10, cpu)
            T.clear(gate)
            T.clear(up)
            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=stages(num_stages, cpu)):
                T.copy(A[by * block_M, ko * block_K], A_s)
                T.copy(W[bx * block_N, ko * block_K], Wg_s)
                T.copy(W[F + bx * block_N, ko * block_K], Wu_s)
                T.gemm(A_s, Wg_s, gate, transpose_B=True)
                T.gemm(A_s, Wu_s, up, transpose_B=True)
            for i, j in loop(block_M, block_N, cpu=cpu):
                r = by * block_M + i
                c = bx * block_N + j
                if r < M and c < F:
                    C[r, c] = T.cast(gelu(gate[i, j]) * up[i, j], dtype)

    return geglu
