"""Flash attention (online softmax) over a packed ``QKV`` tensor, for the GPU and the CPU.

Layout::

    QKV  [B, L, 3, H, Dh]  dtype     axis 2 holds Q, K, V
    Lens [B]               int32     valid tokens of each sequence
    O    [B, L, H * Dh]    dtype     every row is written; padded rows are 0

Query ``i`` of sequence ``b`` sees key ``j`` iff ``i < Lens[b]``, ``j < Lens[b]`` and,
when ``window > 0``, ``abs(i - j) <= window`` (bidirectional sliding window).  The
scores are scaled by ``1/sqrt(Dh)``.  A query row that sees no key (padding,
``Lens[b] == 0``) is written as 0: the final division is guarded, so padding never
produces NaN/Inf.  Values stored at padded positions are never selected by the mask but
are multiplied by zero probabilities, so they must be finite (any projection output is).

``B`` and/or ``L`` may be ``None``: they become runtime dimensions (``T.dynamic``), so
one compiled kernel serves several batch sizes and sequence lengths.  Partial tiles
(``L`` not a multiple of the block sizes) are covered by the padding predicates of the
tile copies: rows past ``L`` load as 0 and are never stored.

One algorithm serves both specialisations.  The body of :func:`attn_kernel` (tiling,
key-tile ranges, masks, online softmax, guarded normalisation) is shared; ``cpu=True``
only switches the allocation scopes and loop kinds of :mod:`kernels._common` and the
small helper layer below:

=====================  ====================================  ===============================
piece                  GPU (``cpu=False``)                   CPU (``cpu=True``, target "c")
=====================  ====================================  ===============================
tile buffers           shared / fragment                     local
element-wise loops     ``T.Parallel``                        sequential ``T.grid``
QK^T, PV               ``T.gemm`` (tensor cores)             ``T.gemm`` (TileLang's scalar
                                                             CPU GEMM on local buffers)
row max / row sum      ``T.reduce_max`` / ``T.reduce_sum``   sequential loops
key-tile loop          ``T.Pipelined(num_stages)``           ``T.serial``
block rasterisation    ``T.use_swizzle``                     (omitted)
PV probabilities       cast to the storage dtype             fp32 (the scores buffer itself)
=====================  ====================================  ===============================
"""

from __future__ import annotations

import math

import tilelang
import tilelang.language as T

from . import _common
from ._common import ACCUM_DTYPE, alloc, loop

__all__ = ["attn_kernel", "PROBE_ARGS", "TILE_DEFAULTS"]

# Canonical probe arguments (kernels/probe.py): a small static shape with whole tiles.
PROBE_ARGS = dict(B=2, L=128, H=4, Dh=64)

# GPU tile defaults, measured on an H200 (bf16, B=8, L=512, H=16, Dh=64; see
# benchmarks/bench_attention.py): 128x64 tiles and two warpgroups were the fastest with a
# 64-token window and within 4% of 128x128 for full attention.  One stage: with TileLang
# 0.1.15, num_stages >= 2 does not lower for sm_80 (cp.async pipeline over the runtime
# key-tile range: "Downcast from tirx.Sub to ir.IntImm failed" in CUDA codegen).
TILE_DEFAULTS = dict(block_M=128, block_N=64, num_stages=1, threads=256)

_LOG2E = 1.4426950408889634
_SWIZZLE_PANEL = 10
_NEG_INF = -T.infinity(ACCUM_DTYPE)


# --------------------------------------------------------------------------------------
# Helper layer: the only code that differs between the GPU and CPU specialisations.
# --------------------------------------------------------------------------------------
def _row_max(src, dst, *, cpu: bool):
    """Running row maximum: ``dst[i] = max(dst[i], max_j src[i, j])``."""
    if not cpu:
        return T.reduce_max(src, dst, dim=1, clear=False)

    @T.macro
    def serial_max():
        for i, j in T.grid(src.shape[0], src.shape[1]):
            dst[i] = T.max(dst[i], src[i, j])

    return serial_max()


def _row_sum(src, dst, *, cpu: bool):
    """Row sum: ``dst[i] = sum_j src[i, j]``."""
    if not cpu:
        return T.reduce_sum(src, dst, dim=1, clear=True)

    @T.macro
    def serial_sum():
        for i in T.serial(src.shape[0]):
            dst[i] = T.cast(0, dst.dtype)
            for j in T.serial(src.shape[1]):
                dst[i] += src[i, j]

    return serial_sum()


def _kv_tiles(begin, end, num_stages: int, *, cpu: bool):
    """The loop over key/value tiles: software-pipelined on the GPU, plain on the CPU."""
    return T.serial(begin, end) if cpu else T.Pipelined(begin, end, num_stages=num_stages)


def _visible(i, j, n, window: int):
    """Mask predicate: query ``i`` sees key ``j`` (both valid; within the window if any)."""
    valid = (i < n) & (j < n)
    return valid & (T.abs(i - j) <= window) if window > 0 else valid


def _key_tile_range(q0, n, block_M: int, block_N: int, window: int):
    """``[begin, end)`` of the key tiles that some valid query row of tile ``q0`` sees.

    With a window, only the tiles within ``window`` of the tile's valid rows.  The range
    is never empty: a query tile that lies entirely in the padding (``q0 >= n``) still runs
    one fully masked tile (its rows see no key and are written as 0).  On sm_90 TileLang
    issues the Q tile's TMA load before the pipelined loop but waits for it inside the
    loop's first iteration, and lets the output tile reuse Q's shared memory; an empty loop
    would leave that load in flight while the output is staged (seen on an H200 with
    TileLang 0.1.15: stale Q values in padded rows).
    """
    lo = T.max(q0 - window, 0) if window > 0 else 0
    hi = T.min(T.min(q0 + block_M, n) + window, n) if window > 0 else n
    begin = lo // block_N
    # For q0 < n, hi > lo >= begin * block_N, so ceildiv(hi, block_N) > begin.
    end = T.if_then_else(q0 < n, T.ceildiv(hi, block_N), begin + 1)
    return begin, end


# --------------------------------------------------------------------------------------
# Kernel factory.
# --------------------------------------------------------------------------------------
@tilelang.jit(pass_configs=_common.GPU_PASS_CONFIGS)
def attn_kernel(
    B,
    L,
    H: int,
    Dh: int,
    window: int = 0,
    block_M: int = TILE_DEFAULTS["block_M"],
    block_N: int = TILE_DEFAULTS["block_N"],
    num_stages: int = TILE_DEFAULTS["num_stages"],
    threads: int = TILE_DEFAULTS["threads"],
    dtype: str = "bfloat16",
    *,
    cpu: bool = False,
):
    """Flash attention ``O = softmax(Q K^T / sqrt(Dh) + mask) V`` on packed ``QKV``.

    ``B``/``L``: ints, or ``None`` for runtime dimensions.  ``window``: 0 = full
    bidirectional attention, ``w > 0`` = keys with ``abs(i - j) <= w``.  Call the compiled
    kernel as ``k(QKV, Lens, O)``.  ``cpu=True`` builds the scalar CPU specialisation;
    compile it with :func:`kernels.compile_cpu`, which also forces fp32.
    """
    _common.check_args(
        "attn_kernel",
        B=B,
        L=L,
        H=H,
        Dh=Dh,
        window=window,
        block_M=block_M,
        block_N=block_N,
        num_stages=num_stages,
        threads=threads,
        dtype=dtype,
        cpu=cpu,
    )
    batch = T.dynamic("B") if B is None else B
    seq = T.dynamic("L") if L is None else L
    accum = ACCUM_DTYPE
    qk_scale = _LOG2E / math.sqrt(Dh)  # exp(s / sqrt(Dh)) == exp2(s * qk_scale)

    @T.prim_func
    def attention(
        QKV: T.Tensor([batch, seq, 3, H, Dh], dtype),
        Lens: T.Tensor([batch], "int32"),
        O: T.Tensor([batch, seq, H * Dh], dtype),
    ):
        with T.Kernel(T.ceildiv(seq, block_M), H, batch, threads=_common.threads(threads, cpu)) as (bx, by, bz):
            Q_t = alloc([block_M, Dh], dtype, cpu, "shared")
            K_t = alloc([block_N, Dh], dtype, cpu, "shared")
            V_t = alloc([block_N, Dh], dtype, cpu, "shared")
            O_t = alloc([block_M, Dh], dtype, cpu, "shared")
            S = alloc([block_M, block_N], accum, cpu)  # scores, then probabilities
            # Probabilities for the PV product in the storage dtype (GPU tensor cores); the CPU
            # keeps them in fp32, in S itself.
            P = None if cpu else alloc([block_M, block_N], dtype, cpu)
            acc_o = alloc([block_M, Dh], accum, cpu)  # unnormalised output
            m = alloc([block_M], accum, cpu)  # running row maximum of the raw scores
            m_prev = alloc([block_M], accum, cpu)
            m_safe = alloc([block_M], accum, cpu)  # m with -inf (no key seen yet) -> 0
            alpha = alloc([block_M], accum, cpu)  # rescale factor of the earlier partials
            row_sum = alloc([block_M], accum, cpu)
            l = alloc([block_M], accum, cpu)  # running softmax denominator

            if not cpu:
                T.use_swizzle(panel_size=_SWIZZLE_PANEL)

            q0 = bx * block_M
            n = T.max(T.min(Lens[bz], seq), 0)  # valid tokens of this sequence
            t_begin, t_end = _key_tile_range(q0, n, block_M, block_N, window)

            T.copy(QKV[bz, q0 : q0 + block_M, 0, by, :], Q_t)
            T.fill(acc_o, 0)
            T.fill(l, 0)
            T.fill(m, _NEG_INF)

            for t in _kv_tiles(t_begin, t_end, num_stages, cpu=cpu):
                k0 = t * block_N
                T.copy(QKV[bz, k0 : k0 + block_N, 1, by, :], K_t)
                T.copy(QKV[bz, k0 : k0 + block_N, 2, by, :], V_t)
                T.gemm(Q_t, K_t, S, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in loop(block_M, block_N, cpu=cpu):
                    S[i, j] = T.if_then_else(_visible(q0 + i, k0 + j, n, window), S[i, j], _NEG_INF)

                # Online softmax.  A row that has seen no visible key keeps m = -inf; m_safe
                # turns its exponentials into exp2(-inf) = 0 instead of exp2(-inf + inf) = NaN.
                T.copy(m, m_prev)
                _row_max(S, m, cpu=cpu)
                for i in loop(block_M, cpu=cpu):
                    m_safe[i] = T.if_then_else(m[i] == _NEG_INF, T.cast(0, accum), m[i])
                    alpha[i] = T.exp2(m_prev[i] * qk_scale - m_safe[i] * qk_scale)
                for i, j in loop(block_M, block_N, cpu=cpu):
                    S[i, j] = T.exp2(S[i, j] * qk_scale - m_safe[i] * qk_scale)
                _row_sum(S, row_sum, cpu=cpu)
                for i in loop(block_M, cpu=cpu):
                    l[i] = l[i] * alpha[i] + row_sum[i]
                for i, d in loop(block_M, Dh, cpu=cpu):
                    acc_o[i, d] *= alpha[i]
                if not cpu:
                    T.copy(S, P)
                T.gemm(S if cpu else P, V_t, acc_o, policy=T.GemmWarpPolicy.FullRow)

            # Guarded normalisation: a row that saw no key (l == 0) is written as 0.
            for i, d in loop(block_M, Dh, cpu=cpu):
                O_t[i, d] = T.cast(T.if_then_else(l[i] > 0, acc_o[i, d] / l[i], T.cast(0, accum)), dtype)
            T.copy(O_t, O[bz, q0 : q0 + block_M, by * Dh : (by + 1) * Dh])

    return attention
