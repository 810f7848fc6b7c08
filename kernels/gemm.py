"""GEMM with a fused epilogue: ``C[M, N] = act(A[M, K] @ W[N, K]^T + b)``.

``W`` is stored like ``torch.nn.Linear.weight`` ([out, in]); ``b`` is an fp32 ``[N]`` vector
read only when ``bias=True`` (it is always a parameter, so every specialisation has the same
signature ``k(A, W, b, C)``).  ``act`` is ``"none"``, ``"gelu"`` (exact, erf) or ``"relu"``.
Accumulation and the epilogue are fp32; ``C`` is stored in ``dtype``.

``M`` is a runtime symbol: one compiled kernel serves every row count.  Partial tiles are
handled by the zero-padding predicates of ``T.copy`` on the loads and an explicit
``r < M and c < N`` predicate on the store, identical on the GPU and the CPU.
"""

from __future__ import annotations

import tilelang
import tilelang.language as T

from ._common import ACCUM_DTYPE, GPU_PASS_CONFIGS, activation, alloc, check_args, loop, rasterize, stages
from ._common import threads as launch_threads


@tilelang.jit(pass_configs=GPU_PASS_CONFIGS)
def gemm_kernel(
    N: int,
    K: int,
    bias: bool = False,
    act: str = "none",
    block_M: int = 128,
    block_N: int = 256,
    block_K: int = 64,
    num_stages: int = 3,
    threads: int = 256,
    dtype: str = "bfloat16",
    *,
    cpu: bool = False,
):
    """Build the GEMM PrimFunc ``gemm(A, W, b, C)`` (see the module docstring).

    Default tiles: the best of a small sweep on an H200 at ModernBERT-large shapes
    (M=8192, N x K = 3072x1024 and 1024x2624), see ``benchmarks/bench_kernels.py``.
    """
    check_args(
        "gemm_kernel",
        N=N,
        K=K,
        bias=bias,
        act=act,
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
    def gemm(
        A: T.Tensor((M, K), dtype),
        W: T.Tensor((N, K), dtype),
        b: T.Tensor((N,), ACCUM_DTYPE),
        C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=launch_threads(threads, cpu)) as (bx, by):
            A_s = alloc((block_M, block_K), dtype, cpu, "shared")
            W_s = alloc((block_N, block_K), dtype, cpu, "shared")
            acc = alloc((block_M, block_N), ACCUM_DTYPE, cpu)
            rasterize(10, cpu)
            T.clear(acc)
            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=stages(num_stages, cpu)):
                T.copy(A[by * block_M, ko * block_K], A_s)
                T.copy(W[bx * block_N, ko * block_K], W_s)
                T.gemm(A_s, W_s, acc, transpose_B=True)
            for i, j in loop(block_M, block_N, cpu=cpu):
                r = by * block_M + i
                c = bx * block_N + j
                if r < M and c < N:
                    v = acc[i, j]
                    if bias:
                        v = v + b[c]
                    C[r, c] = T.cast(activation(v, act), dtype)

    return gemm
