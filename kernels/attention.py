"""Flash attention (online softmax) over a packed ``QKV`` tensor, for the GPU and the CPU.

Layout::

    QKV  [B, L, 3, H, Dh]  dtype     (index 0/1/2 of axis 2 = Q/K/V)
    Lens [B]               int32     valid tokens per sequence
    O    [B, L, H * Dh]    dtype     written for every row; padded rows are 0

Key ``j`` is visible from query ``i`` of sequence ``b`` iff ``i < Lens[b]``,
``j < Lens[b]`` and, when ``window > 0``, ``abs(i - j) <= window`` (bidirectional
sliding window).  A query row that sees no key (padding, ``Lens[b] == 0``) gets 0:
the final division is guarded, the kernel never produces NaN/Inf from padding.

``B`` and/or ``L`` may be ``None``: they become runtime dimensions (``T.dynamic``),
so one compiled kernel serves several batch sizes and sequence lengths.  Partial
tiles are handled by padding predicates on every load and store.

One algorithm for both specialisations.  The body of :func:`attn_kernel` (tiling,
tile ranges, masks, online softmax, guarded normalisation) is shared; ``cpu=True``
only changes the small helper layer below (``_load_rows``, ``_gemm``, ``_row_max``,
``_row_sum``, ``_kv_tiles``) and the allocation scopes/loop kinds of
:mod:`kernels._common`:

======================  ==================================  ==============================
piece                   GPU (``cpu=False``)                 CPU (``cpu=True``, target "c")
======================  ==================================  ==============================
tile buffers            shared / fragment                   local
element-wise loops      ``T.Parallel``                      sequential ``T.grid``
QK^T, PV                ``T.gemm`` (tensor cores)           ``T.gemm`` (TileLang's scalar
                                                            CPU GEMM on local buffers)
row max / row sum       ``T.reduce_max`` / ``T.reduce_sum`` sequential loops
key-tile loop           ``T.Pipelined(num_stages)``         ``T.serial``
block rasterisation     ``T.use_swizzle``                   (omitted)
probabilities for PV    cast to the storage dtype           fp32
======================  ==================================  ==============================
"""
from __future__ import annotations

import math

import tilelang
import tilelang.language as T

from . import _common
from ._common import ACCUM_DTYPE, alloc, loop

__all__ = ["attn_kernel", "PROBE_ARGS", "TILE_DEFAULTS"]

# Canonical small shape for the compile probe (kernels/probe.py): one partial
# key/query tile pair per (batch, head) with the default tiles.
PROBE_ARGS = dict(B=2, L=128, H=4, Dh=64)

# Tile defaults (TileLang's example_mha_fwd_bshd configuration for Dh=64).
TILE_DEFAULTS = dict(block_M=64, block_N=64, num_stages=1, threads=128)

_LOG2E = 1.44269504088896340736
_SWIZZLE_PANEL = 10
_NEG_INF = -T.infinity(ACCUM_DTYPE)


# --------------------------------------------------------------------------------------
# The helper layer: the only place where the GPU and CPU specialisations differ.
# --------------------------------------------------------------------------------------
def _load_rows(QKV, dst, b, row0, part, h, n_valid, *, cpu: bool):
    """``dst[r, :] = QKV[b, row0 + r, part, h, :]`` for ``row0 + r < n_valid``, else 0.

    The predicate is the padding guard of partial tiles (never reads past ``L``) and
    zeroes keys/values past the sequence's valid length, so garbage in padded
    positions cannot reach the products.
    """

    @T.macro
    def body():
        for r, d in loop(dst.shape[0], dst.shape[1], cpu=cpu):
            dst[r, d] = T.if_then_else(row0 + r < n_valid, QKV[b, row0 + r, part, h, d], T.cast(0, dst.dtype))

    return body()


def _gemm(A, Bm, C, *, transpose_B: bool, clear: bool, cpu: bool):
    """``C = A @ B(^T)`` (``clear=True``) or ``C += A @ B(^T)``.

    GPU: tensor-core ``T.gemm`` with the FullRow warp policy of TileLang's attention
    examples; CPU: the same tile op, which TileLang lowers to its scalar triple loop on
    local buffers for the ``c`` target.
    """
    policy = T.GemmWarpPolicy.Square if cpu else T.GemmWarpPolicy.FullRow
    return T.gemm(A, Bm, C, transpose_B=transpose_B, clear_accum=clear, policy=policy)


def _row_max(src, dst, *, cpu: bool):
    """``dst[i] = max(dst[i], max_j src[i, j])`` (running maximum: no clear)."""
    if not cpu:
        return T.reduce_max(src, dst, dim=1, clear=False)

    @T.macro
    def body():
        for i, j in T.grid(src.shape[0], src.shape[1]):
            dst[i] = T.max(dst[i], src[i, j])

    return body()


def _row_sum(src, dst, *, cpu: bool):
    """``dst[i] = sum_j src[i, j]``."""
    if not cpu:
        return T.reduce_sum(src, dst, dim=1, clear=True)

    @T.macro
    def body():
        for i in T.serial(src.shape[0]):
            dst[i] = T.cast(0, dst.dtype)
            for j in T.serial(src.shape[1]):
                dst[i] += src[i, j]

    return body()


def _kv_tiles(begin, end, num_stages: int, *, cpu: bool):
    """The loop over key/value tiles: software-pipelined on the GPU, plain on the CPU."""
    return T.serial(begin, end) if cpu else T.Pipelined(begin, end, num_stages=num_stages)


def _visible(i, j, n, window: int):
    """Mask predicate: query ``i`` sees key ``j`` (both valid; within the window if any)."""
    valid = (i < n) & (j < n)
    return valid & (T.abs(i - j) <= window) if window > 0 else valid


# --------------------------------------------------------------------------------------
# The kernel factory.
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
    bidirectional attention, ``w > 0`` = keys with ``abs(i - j) <= w``.  Call the
    compiled kernel as ``k(QKV, Lens, O)``.  ``cpu=True`` builds the scalar CPU
    specialisation (use :func:`kernels.compile_cpu`, which also forces fp32).
    """
    dtype = _common.check_dtype(dtype, cpu)
    if window < 0:
        raise ValueError(f"window must be >= 0 (0 = full attention), got {window}")
    batch = T.dynamic("B") if B is None else B
    seq = T.dynamic("L") if L is None else L
    accum = ACCUM_DTYPE
    # Probabilities feed the PV product: storage dtype on the GPU (tensor cores), fp32 on the CPU.
    prob_dtype = accum if cpu else dtype
    n_threads = _common.threads(threads, cpu)
    qk_scale = _LOG2E / math.sqrt(Dh)  # softmax via exp2: exp(x / sqrt(Dh)) = exp2(x * qk_scale)

    @T.prim_func
    def attention(
        QKV: T.Tensor([batch, seq, 3, H, Dh], dtype),
        Lens: T.Tensor([batch], "int32"),
        O: T.Tensor([batch, seq, H * Dh], dtype),
    ):
        with T.Kernel(T.ceildiv(seq, block_M), H, batch, threads=n_threads) as (bx, by, bz):
            Q_t = alloc([block_M, Dh], dtype, cpu, "shared")
            K_t = alloc([block_N, Dh], dtype, cpu, "shared")
            V_t = alloc([block_N, Dh], dtype, cpu, "shared")
            O_t = alloc([block_M, Dh], dtype, cpu, "shared")
            S = alloc([block_M, block_N], accum, cpu)  # scores, then probabilities
            P = alloc([block_M, block_N], prob_dtype, cpu)  # probabilities for the PV product
            acc_o = alloc([block_M, Dh], accum, cpu)
            m = alloc([block_M], accum, cpu)  # running row maximum (raw scores)
            m_prev = alloc([block_M], accum, cpu)
            m_safe = alloc([block_M], accum, cpu)  # m, with -inf (nothing seen yet) -> 0
            alpha = alloc([block_M], accum, cpu)  # rescale factor of the previous partials
            row_sum = alloc([block_M], accum, cpu)
            l = alloc([block_M], accum, cpu)  # running softmax denominator

            if not cpu:
                T.use_swizzle(panel_size=_SWIZZLE_PANEL)

            q0 = bx * block_M
            n = T.max(T.min(Lens[bz], seq), 0)  # valid tokens of this sequence
            # Key tiles that some valid query row of this tile can see; none for padded tiles.
            k_lo = T.max(q0 - window, 0) if window > 0 else 0
            k_hi = T.min(T.min(q0 + block_M, n) + window, n) if window > 0 else n
            t_begin = k_lo // block_N
            t_end = T.if_then_else(q0 < n, T.max(T.ceildiv(k_hi, block_N), t_begin), t_begin)

            _load_rows(QKV, Q_t, bz, q0, 0, by, n, cpu=cpu)
            for i, d in loop(block_M, Dh, cpu=cpu):
                acc_o[i, d] = 0
            for i in loop(block_M, cpu=cpu):
                l[i] = 0
                m[i] = _NEG_INF

            for t in _kv_tiles(t_begin, t_end, num_stages, cpu=cpu):
                k0 = t * block_N
                _load_rows(QKV, K_t, bz, k0, 1, by, n, cpu=cpu)
                _load_rows(QKV, V_t, bz, k0, 2, by, n, cpu=cpu)
                _gemm(Q_t, K_t, S, transpose_B=True, clear=True, cpu=cpu)

                # Mask: padded queries/keys and, with a window, keys out of reach.
                for i, j in loop(block_M, block_N, cpu=cpu):
                    S[i, j] = T.if_then_else(_visible(q0 + i, k0 + j, n, window), S[i, j], _NEG_INF)

                # Online softmax.  A row that has seen no visible key keeps m = -inf; m_safe
                # makes its exponentials exp2(-inf) = 0 instead of exp2(-inf + inf) = NaN.
                for i in loop(block_M, cpu=cpu):
                    m_prev[i] = m[i]
                _row_max(S, m, cpu=cpu)
                for i in loop(block_M, cpu=cpu):
                    m_safe[i] = T.if_then_else(m[i] == _NEG_INF, T.cast(0, accum), m[i])
                    alpha[i] = T.exp2(m_prev[i] * qk_scale - m_safe[i] * qk_scale)
                for i, j in loop(block_M, block_N, cpu=cpu):
                    S[i, j] = T.exp2(S[i, j] * qk_scale - m_safe[i] * qk_scale)
                _row_sum(S, row_sum, cpu=cpu)
                for i in loop(block_M, cpu=cpu):
                    l[i] = l[i] * alpha[i] + row_sum[i]
                for i, j in loop(block_M, block_N, cpu=cpu):
                    P[i, j] = S[i, j]
                for i, d in loop(block_M, Dh, cpu=cpu):
                    acc_o[i, d] *= alpha[i]
                _gemm(P, V_t, acc_o, transpose_B=False, clear=False, cpu=cpu)

            # Guarded normalisation: rows that saw no key (l == 0) are written as 0.
            for i, d in loop(block_M, Dh, cpu=cpu):
                O_t[i, d] = T.cast(T.if_then_else(l[i] > 0, acc_o[i, d] / l[i], T.cast(0, accum)), dtype)
            for i, d in loop(block_M, Dh, cpu=cpu):
                if q0 + i < seq:
                    O[bz, q0 + i, by * Dh + d] = O_t[i, d]

    return attention
