"""Rotary and attention in one Triton kernel (``export.attention.cuda: fused``).

ModernBERT's layer makes ``q``, ``k`` and ``v`` from one packed ``Wqkv`` output, rotates ``q``
and ``k`` by position (in fp32, rounded back to the model's dtype), then attends: each query to
its row's real keys, within ±window on the local layers.  Compiled as transformers writes it,
that is a kernel that writes the rotated ``q`` and ``k``, a masked attention call reading a
``[B, 1, S, S]`` mask, and cuDNN's memset before it (docs/measurements/runtime-h200.md).  Here
one kernel reads the packed ``Wqkv`` output and the rotary tables (their first halves: the two
halves of transformers' tables are equal), rotates each tile of ``q`` and ``k`` as it loads it
(loading the next key block's tiles while it computes on this one), skips the key blocks a local
layer's window cannot reach, and masks by each row's key count: no rotated copy, no mask tensor,
no memset.

The op is ``laya::rotary_attention``, a :func:`torch.library.triton_op`: torch.export keeps it
as one op, and AOTInductor compiles the Triton kernel into the package (it needs nothing of
laya-build to load).  Its launch configurations are fixed (:data:`CONFIGS`; no autotuning), so
two builds give the same kernels.  Which one runs depends on the shape (:func:`selection`): the
largest query block whose programs still fill the GPU once, so a short batch is spread over every
multiprocessor and a long one runs in fewer, larger programs; a head dim above 64 keeps to the
blocks of at most 64 queries (:func:`configs`).  Global and local layers have tables of their own
(:data:`GLOBAL_CONFIGS`, :data:`CONFIGS`): a local layer's program reads at most its window's keys.
The package holds one kernel for every configuration and launches the one its shape selects (the
others get a grid of 0 programs, which AOTInductor's launcher skips), so the choice is made at run
time for every token count.
Off CUDA the op runs :func:`reference`: transformers' rotary and SDPA with the boolean masks,
the semantics the kernel is tested against on a GPU.  ``laya::packed_attention`` is the same
kernel without rotary (``ROTARY`` a compile-time constant: no table is read), for the decision
head's attention layers (:mod:`laya_build.model.head`); ``laya::gathered_attention`` computes such a
layer's queries at given positions only (the head's last layer, whose output is read at ``1 +
slots`` positions a row): one block of 16 a row and head, its own kernel around the same loop.

Semantics (``counts[b]`` real positions at the start of row ``b``, right padding): query ``i``
attends to keys ``j < counts[b]`` (and ``|i - j| <= window`` when ``window >= 0``).  A query
that sees no key (a padded position far from every real one, or a row of padding) gets 0; no
real position ever reads a padded one, so the model's outputs are those of its masks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

# BLOCK_M queries a program, BLOCK_N keys an iteration (benchmarks/rotary_attention_probe.py)
# PREFETCH: each key block's loads issued an iteration ahead, in registers
CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "PREFETCH": True}
SMALL = {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "PREFETCH": True}
# The configurations by shape for the local layers (a window), largest query block first: the best
# of 25 at 7 x 256 (128 x 32), the best over both serving shapes (CONFIG), the best at 1 x 128
# (16 x 64), on the H200 (docs/measurements/runtime-h200.md, "Attention blocks by shape, the MLP's
# output GEMM through cuBLASLt").
CONFIGS = ({"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2, "PREFETCH": True}, CONFIG, SMALL)
# The global layers' (every key): their best at 7 x 256 on the H200 is 128 x 64 with 8 warps, each
# program reading twice the keys an iteration (docs/measurements/runtime-h200.md, "Pointwise kernels
# untimed, and what is left"; the package timed in "Attention blocks by kind of layer adopted").
GLOBAL_CONFIGS = ({"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2, "PREFETCH": True}, CONFIG, SMALL)
ALL_CONFIGS = tuple({repr(c): c for c in (*CONFIGS, *GLOBAL_CONFIGS)}.values())  # each one a shape can select
# gathered queries (a row's few read positions, 1 + slots) take one block of the smallest configuration
GATHERED = SMALL
WAVE = 132  # programs that fill the GPU once: the H200's multiprocessors
# The largest BLOCK_M x head dim a configuration other than CONFIG may hold in fp32 (128 queries of
# a 64 head dim, as measured): larger head dims keep to CONFIG and the smaller blocks
ACCUMULATOR = 128 * 64
LOG2E = 1.4426950408889634
# head dims the kernel indexes: its q·k product is two dots over half a head, and a dot needs 16
HEAD_DIMS = (32, 64, 128, 256)
DTYPES = (torch.bfloat16, torch.float16)  # its fp32 products would be TF32


def cuda_refusal(head_dim: int, dtype: torch.dtype) -> str | None:
    """Why the CUDA kernel cannot run a model of this head dim and dtype, or None."""
    if head_dim not in HEAD_DIMS:
        return f"a head dim of {', '.join(map(str, HEAD_DIMS))} (this model's is {head_dim})"
    if dtype not in DTYPES:
        return f"bf16 or fp16 (this model is {dtype}; its fp32 products would be TF32)"
    return None


@triton.jit
def _tile(x_ptr, cos_ptr, sin_ptr, at, tab, ok, HALF: tl.constexpr, ROTARY: tl.constexpr):
    """The loads of a tile of q or k (``at``: its first half's offsets, ``tab``: the tables'):
    its two halves, then cos and sin (one half each: the tables' two halves are equal).  Without
    ``ROTARY`` no table is read (x's halves stand in their places, unused)."""
    x1 = tl.load(x_ptr + at, mask=ok, other=0.0)
    x2 = tl.load(x_ptr + at + HALF, mask=ok, other=0.0)
    if not ROTARY:
        return x1, x2, x1, x2
    return x1, x2, tl.load(cos_ptr + tab, mask=ok, other=0.0), tl.load(sin_ptr + tab, mask=ok, other=0.0)


@triton.jit
def _key_block(
    k_base,
    v_base,
    cos_base,
    sin_base,
    cols,
    ok,
    stride_qs,
    stride_cs,
    HALF: tl.constexpr,
    D: tl.constexpr,
    ROTARY: tl.constexpr,
):
    """The loads of the key block at positions ``cols`` (``ok``: which of them are read): its k
    tile as :func:`_tile` loads it, then its v tile."""
    half = tl.arange(0, HALF)
    k1, k2, c, s = _tile(
        k_base,
        cos_base,
        sin_base,
        cols[:, None] * stride_qs + half[None, :],
        cols[:, None] * stride_cs + half[None, :],
        ok[:, None],
        HALF,
        ROTARY,
    )
    v = tl.load(v_base + cols[:, None] * stride_qs + tl.arange(0, D)[None, :], mask=ok[:, None], other=0.0)
    return k1, k2, c, s, v


@triton.jit
def _rotate(x1, x2, c, s, ROTARY: tl.constexpr):
    """A tile of q or k rotated as transformers does: ``x * cos + rotate_half(x) * sin`` in
    fp32, then the tensor's dtype; its two halves.  Without ``ROTARY`` the halves as they are."""
    if not ROTARY:
        return x1, x2
    a, b, c, s = x1.to(tl.float32), x2.to(tl.float32), c.to(tl.float32), s.to(tl.float32)
    return (a * c - b * s).to(x1.dtype), (b * c + a * s).to(x1.dtype)


@triton.jit
def _attend(
    q1,
    q2,
    rows,
    start_m,
    count,
    k_base,
    v_base,
    cos_base,
    sin_base,
    stride_qs,
    stride_cs,
    HALF: tl.constexpr,
    D: tl.constexpr,
    WINDOW: tl.constexpr,
    SCALE: tl.constexpr,
    ROTARY: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """A query block's attention (its two halves ``q1``, ``q2`` already rotated; ``rows``: their
    positions, ``start_m`` the first, both read only with a window) over the row's ``count`` real
    keys: the online softmax over key blocks, normalised; ``[BLOCK_M, D]`` in fp32."""
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if WINDOW >= 0:  # the key blocks the window can reach
        lo = (tl.maximum(start_m - WINDOW, 0) // BLOCK_N) * BLOCK_N
        hi = tl.minimum(start_m + BLOCK_M + WINDOW, count)
    else:
        lo = 0
        hi = count
    if PREFETCH:  # the first key block's loads; each iteration then issues the next block's first
        first = lo + tl.arange(0, BLOCK_N)
        n1, n2, nc, ns, nv = _key_block(
            k_base, v_base, cos_base, sin_base, first, first < hi, stride_qs, stride_cs, HALF, D, ROTARY
        )
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < count
        if PREFETCH:
            k1, k2 = _rotate(n1, n2, nc, ns, ROTARY)
            v = nv
            ahead = cols + BLOCK_N
            n1, n2, nc, ns, nv = _key_block(
                k_base, v_base, cos_base, sin_base, ahead, ahead < hi, stride_qs, stride_cs, HALF, D, ROTARY
            )
        else:
            # names of their own: a name assigned before the loop would be carried through it
            b1, b2, bc, bs, v = _key_block(
                k_base, v_base, cos_base, sin_base, cols, col_ok, stride_qs, stride_cs, HALF, D, ROTARY
            )
            k1, k2 = _rotate(b1, b2, bc, bs, ROTARY)
        scores = (
            tl.dot(q1, tl.trans(k1)) + tl.dot(q2, tl.trans(k2))
        ) * SCALE  # a constant: Inductor hands a float argument to a kernel as fp64
        seen = col_ok[None, :]
        if WINDOW >= 0:
            dist = rows[:, None] - cols[None, :]
            seen = seen & (dist <= WINDOW) & (dist >= -WINDOW)
        scores = tl.where(seen, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key seen yet: nothing to scale
        p = tl.exp2(scores - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc / tl.where(l_i > 0, l_i, 1.0)[:, None]


@triton.jit
def _rotary_attention_kernel(
    QKV,
    COS,
    SIN,
    COUNTS,
    OUT,
    S,
    stride_qb,
    stride_qs,
    stride_cb,
    stride_cs,
    stride_ob,
    stride_os,
    H: tl.constexpr,
    D: tl.constexpr,
    WINDOW: tl.constexpr,
    SCALE: tl.constexpr,
    ROTARY: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    HALF: tl.constexpr = D // 2
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    count = tl.load(COUNTS + b)
    rows = start_m + tl.arange(0, BLOCK_M)
    half = tl.arange(0, HALF)
    dims = tl.arange(0, D)
    row_ok = (rows < S)[:, None]
    q_base = QKV + b.to(tl.int64) * stride_qb + h * D
    k_base = q_base + H * D
    v_base = q_base + 2 * H * D
    cos_base = COS + b.to(tl.int64) * stride_cb
    sin_base = SIN + b.to(tl.int64) * stride_cb

    at = rows[:, None] * stride_qs + half[None, :]
    tab = rows[:, None] * stride_cs + half[None, :]
    a1, a2, ac, as_ = _tile(q_base, cos_base, sin_base, at, tab, row_ok, HALF, ROTARY)
    q1, q2 = _rotate(a1, a2, ac, as_, ROTARY)
    out = _attend(
        q1,
        q2,
        rows,
        start_m,
        count,
        k_base,
        v_base,
        cos_base,
        sin_base,
        stride_qs,
        stride_cs,
        HALF,
        D,
        WINDOW,
        SCALE,
        ROTARY,
        BLOCK_M,
        BLOCK_N,
        PREFETCH,
    )
    o_ptr = OUT + b.to(tl.int64) * stride_ob + h * D + rows[:, None] * stride_os + dims[None, :]
    tl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=row_ok)


@triton.jit
def _gathered_attention_kernel(
    QKV,
    COUNTS,
    AT,
    OUT,
    S,
    P,
    stride_qb,
    stride_qs,
    stride_ab,
    stride_ob,
    stride_os,
    H: tl.constexpr,
    D: tl.constexpr,
    SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """The kernel without rotary and without a window, its queries at the positions ``AT[b, :P]``
    of the ``S`` in ``QKV`` (each row's keys and values all of them): output row ``i`` is the
    attention of position ``AT[b, i]``; a position outside ``0 .. S-1`` reads nothing and gets 0."""
    HALF: tl.constexpr = D // 2
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = start_m + tl.arange(0, BLOCK_M)  # output rows
    half = tl.arange(0, HALF)
    dims = tl.arange(0, D)
    pos = tl.load(AT + b.to(tl.int64) * stride_ab + rows, mask=rows < P, other=-1)
    inside = (pos >= 0) & (pos < S)
    count = tl.load(COUNTS + b)
    q_base = QKV + b.to(tl.int64) * stride_qb + h * D
    at = pos.to(tl.int64)[:, None] * stride_qs + half[None, :]
    q1, q2, _, _ = _tile(q_base, q_base, q_base, at, at, inside[:, None], HALF, False)
    out = _attend(
        q1,
        q2,
        rows,
        start_m,
        count,
        q_base + H * D,
        q_base + 2 * H * D,
        q_base,
        q_base,
        stride_qs,
        0,
        HALF,
        D,
        -1,
        SCALE,
        False,
        BLOCK_M,
        BLOCK_N,
        PREFETCH,
    )
    out = tl.where(inside[:, None], out, 0.0)
    o_ptr = OUT + b.to(tl.int64) * stride_ob + h * D + rows[:, None] * stride_os + dims[None, :]
    tl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=(rows < P)[:, None])


@triton.jit
def _rotary_rows_kernel(TABLES, IDS, OUT, N, P, HALF: tl.constexpr, BLOCK: tl.constexpr):
    """Rows ``IDS`` of table ``program_id(1)`` of ``[T, P, HALF]`` tables into ``[T, N, HALF]``;
    an id outside ``0 .. P-1`` gives a row of 0 (nothing outside the tables is read)."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    table = tl.program_id(1).to(tl.int64)
    kept = (rows < N)[:, None]
    ids = tl.load(IDS + rows, mask=rows < N, other=0)
    inside = kept & ((ids >= 0) & (ids < P))[:, None]
    cols = tl.arange(0, HALF)[None, :]
    src = (table * P + ids.to(tl.int64)[:, None]) * HALF + cols
    dst = (table * N + rows.to(tl.int64)[:, None]) * HALF + cols
    tl.store(OUT + dst, tl.load(TABLES + src, mask=inside, other=0.0), mask=kept)


ROWS_BLOCK = 64  # positions a program of the rows kernel


def launch_rows(tables, ids, out, kernel=None) -> None:
    """Run the rows kernel (``kernel``: the JIT function or a wrapper of it): the rows ``ids``
    (contiguous) of each of the contiguous ``[T, P, H]`` ``tables`` into the contiguous ``out``,
    ``[T, *ids.shape, H]``, in one launch."""
    kernel = kernel if kernel is not None else _rotary_rows_kernel
    n = ids.numel()
    kernel[(triton.cdiv(n, ROWS_BLOCK), tables.shape[0])](
        tables, ids, out, n, tables.shape[1], HALF=tables.shape[2], BLOCK=ROWS_BLOCK
    )


def fills(rows, length, heads, block_m: int):
    """1 where ``block_m`` queries a program give at least :data:`WAVE` programs, else 0.  With
    symbolic sizes the result is a symbolic size (``Min``/``Max``): choosing adds no guard to the
    exported program."""
    programs = (length + block_m - 1) // block_m * (rows * heads)
    return torch.sym_min(1, torch.sym_max(0, programs - (WAVE - 1)))


def configs(head_dim: int, window: int = -1) -> tuple[dict, ...]:
    """The configurations a layer of ``head_dim`` and ``window`` (negative: global) may run,
    largest query block first: those of its kind's table whose ``BLOCK_M x head_dim`` fp32
    accumulator is at most :data:`ACCUMULATOR`, and :data:`CONFIG` always (the one configuration
    before there were several, for every head dim)."""
    table = GLOBAL_CONFIGS if window < 0 else CONFIGS
    return tuple(c for c in table if c is CONFIG or c["BLOCK_M"] * head_dim <= ACCUMULATOR)


def selection(rows, length, heads, head_dim: int = 64, window: int = -1) -> list[tuple[dict, object]]:
    """``(config, use)`` for each of :func:`configs`: ``use`` is 1 for the first configuration
    whose programs fill the GPU once (the last when none does) and 0 for the others."""
    candidates = configs(head_dim, window)
    uses, before = [], 0
    for config in candidates[:-1]:
        now = fills(rows, length, heads, config["BLOCK_M"])  # 0 ... 0 1 ... 1 down the list
        uses.append(now - before)
        before = now
    uses.append(1 - before)
    return list(zip(candidates, uses))


def launches(rows, length, heads, head_dim: int, window: int = -1) -> list[tuple[dict, object]]:
    """The launches of one call: the chosen configuration alone for a concrete shape; every
    configuration of :func:`selection` for a symbolic one (the package's), each with its ``use``."""
    chosen = selection(rows, length, heads, head_dim, window)
    return [(c, use) for c, use in chosen if not (isinstance(use, int) and use == 0)]


def launch(qkv, cos, sin, counts, scale: float, window: int, out, kernel=None, config=None, use=1) -> None:
    """Run the kernel (``kernel``: the JIT function or a wrapper of it; ``config``: another
    launch configuration than :data:`CONFIG`) into ``out``.  ``cos`` and ``sin`` None: no
    rotary (q and k as they are).  ``use`` multiplies the grid's first axis (0: no program)."""
    B, S, _, H, D = qkv.shape
    kernel = kernel if kernel is not None else _rotary_attention_kernel
    config = {**CONFIG, **(config or {})}
    rotary = cos is not None
    kernel[(triton.cdiv(S, config["BLOCK_M"]) * use, B * H)](
        qkv,
        cos if rotary else qkv,  # (not read without rotary)
        sin if rotary else qkv,
        counts,
        out,
        S,
        qkv.stride(0),
        qkv.stride(1),
        cos.stride(0) if rotary and cos.shape[0] != 1 else 0,
        cos.stride(1) if rotary else 0,
        out.stride(0),
        out.stride(1),
        H=H,
        D=D,
        WINDOW=window,
        SCALE=scale * LOG2E,
        ROTARY=rotary,
        **config,
    )


def launch_gathered(qkv, counts, at, scale: float, out, kernel=None, config=None) -> None:
    """Run the gathered kernel (``kernel``: the JIT function or a wrapper of it; ``config``:
    another launch configuration than :data:`GATHERED`) into ``out``, ``[B, P, H, D]``: the
    attention of the queries at positions ``at`` (``[B, P]``, its last stride 1)."""
    B, S, _, H, D = qkv.shape
    P = at.shape[1]
    kernel = kernel if kernel is not None else _gathered_attention_kernel
    config = {**GATHERED, **(config or {})}
    kernel[(triton.cdiv(P, config["BLOCK_M"]), B * H)](
        qkv,
        counts,
        at,
        out,
        S,
        P,
        qkv.stride(0),
        qkv.stride(1),
        at.stride(0),
        out.stride(0),
        out.stride(1),
        H=H,
        D=D,
        SCALE=scale * LOG2E,
        **config,
    )


def check(qkv, cos, sin, counts) -> None:
    """The layouts the kernel reads: ``qkv`` a view of ``Wqkv``'s output (its last three strides
    ``H * D, D, 1``), cos and sin ``[1 or B, S, D / 2]`` (or both None), one key count a row."""
    torch._check(qkv.dim() == 5 and qkv.shape[2] == 3, lambda: f"qkv must be [B, S, 3, H, D], got {tuple(qkv.shape)}")
    B, S, _, H, D = qkv.shape
    torch._check(
        qkv.stride(4) == 1 and qkv.stride(3) == D and qkv.stride(2) == H * D,
        lambda: f"qkv must be a view of the packed Wqkv output, strides {qkv.stride()}",
    )
    torch._check(counts.dim() == 1 and counts.shape[0] == B, lambda: f"counts must be [B], got {tuple(counts.shape)}")
    if cos is None:
        return
    torch._check(
        cos.dim() == 3 and cos.shape[1] == S and cos.shape[2] * 2 == D and sin.shape == cos.shape,
        lambda: f"cos and sin must be [1 or B, S, D / 2], got {tuple(cos.shape)}",
    )
    if isinstance(cos.shape[0], int) and cos.shape[0] != 1:  # (a symbolic batch is the rows' own)
        torch._check(cos.shape[0] == B, lambda: f"cos and sin must be [1 or B, S, D / 2], got {tuple(cos.shape)}")


def check_cuda(B: int, H: int, D: int, dtype: torch.dtype) -> None:
    """What the CUDA kernels take: a head dim and dtype :func:`cuda_refusal` accepts, and rows x
    heads programs that a grid's second axis holds."""
    torch._check(cuda_refusal(D, dtype) is None, lambda: f"the kernel needs {cuda_refusal(D, dtype)}")
    torch._check(B * H < 65536, lambda: f"{B} rows of {H} heads is more programs than a grid's second axis holds")


@triton_op("laya::rotary_attention", mutates_args={})
def rotary_attention(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, counts: torch.Tensor, scale: float, window: int
) -> torch.Tensor:
    """``[B, S, 3, H, D]`` packed q, k, v (not yet rotated), ``[1 or B, S, D / 2]`` cos and sin
    (:func:`half`), ``[B]`` int32 key counts -> ``[B, S, H, D]``."""
    return _run(qkv, cos, sin, counts, scale, window)


@triton_op("laya::packed_attention", mutates_args={})
def packed_attention(qkv: torch.Tensor, counts: torch.Tensor, scale: float, window: int) -> torch.Tensor:
    """The same kernel without rotary (the decision head's attention): ``[B, S, 3, H, D]``
    packed q, k, v, ``[B]`` int32 key counts -> ``[B, S, H, D]``."""
    return _run(qkv, None, None, counts, scale, window)


def _run(qkv, cos, sin, counts, scale: float, window: int) -> torch.Tensor:
    check(qkv, cos, sin, counts)
    B, S, _, H, D = qkv.shape
    if qkv.device.type != "cuda":
        return reference(qkv, cos, sin, counts, scale, window)
    check_cuda(B, H, D, qkv.dtype)
    out = torch.empty((B, S, H, D), dtype=qkv.dtype, device=qkv.device)
    tables = (cos.contiguous(), sin.contiguous()) if cos is not None else (None, None)
    counts = counts.to(torch.int32)
    for config, use in launches(B, S, H, D, window):
        launch(qkv, *tables, counts, scale, window, out, wrap_triton(_rotary_attention_kernel), config, use)
    return out


@triton_op("laya::gathered_attention", mutates_args={})
def gathered_attention(qkv: torch.Tensor, counts: torch.Tensor, at: torch.Tensor, scale: float) -> torch.Tensor:
    """:func:`packed_attention` (global: no window) at some queries only: ``[B, S, 3, H, D]`` packed
    q, k, v, ``[B]`` int32 key counts, ``[B, P]`` query positions -> ``[B, P, H, D]``, row ``i``
    the attention of position ``at[:, i]`` over its row's real keys (0 for a position outside
    ``0 .. S-1``): a layer whose output is read at a few positions (the decision head's last,
    :mod:`laya_build.model.head`) computes no other query."""
    check(qkv, None, None, counts)
    B, S, _, H, D = qkv.shape
    torch._check(at.dim() == 2 and at.shape[0] == B, lambda: f"at must be [B, P], got {tuple(at.shape)}")
    if qkv.device.type != "cuda":
        return gathered_reference(qkv, counts, at, scale)
    check_cuda(B, H, D, qkv.dtype)
    out = torch.empty((B, at.shape[1], H, D), dtype=qkv.dtype, device=qkv.device)
    launch_gathered(qkv, counts.to(torch.int32), at.contiguous(), scale, out, wrap_triton(_gathered_attention_kernel))
    return out


@triton_op("laya::rotary_rows", mutates_args={})
def rotary_rows(tables: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """``[T, P, H]`` tables (the first halves of the rotary cos and sin tables of every kind of
    layer, :func:`half`), ``[B', S]`` position ids -> ``[T, B', S, H]``, each table's rows at those
    positions: the tables :func:`rotary_attention` reads, gathered once a forward for every kind of
    layer in one launch (:class:`laya_build.model.rotary.RotaryTable` with ``halves``).  As one op
    its output is a buffer that every layer reads; as an indexing expression a compiler makes the
    gather again inside each layer's copy of the tables."""
    torch._check(tables.dim() == 3, lambda: f"tables must be [T, P, H], got {tuple(tables.shape)}")
    if tables.device.type != "cuda":
        return tables[:, position_ids]
    torch._check(
        tables.shape[2] in {d // 2 for d in HEAD_DIMS},
        lambda: f"the kernel reads halves of a head dim of {HEAD_DIMS}, got tables of {tuple(tables.shape)}",
    )
    ids = position_ids.contiguous()
    out = torch.empty((tables.shape[0], *ids.shape, tables.shape[2]), dtype=tables.dtype, device=tables.device)
    launch_rows(tables.contiguous(), ids, out, wrap_triton(_rotary_rows_kernel))
    return out


def half(table: torch.Tensor) -> torch.Tensor:
    """The first half of the last axis of a rotary cos or sin table (``[..., D]`` -> ``[..., D / 2]``),
    all of it the kernel reads: transformers' tables repeat one half (``cat((freqs, freqs))``;
    :func:`halves_refusal` checks a model's)."""
    return table[..., : table.shape[-1] // 2]


def halves_refusal(rotary, layer_types, length: int, dtype: torch.dtype, device) -> str | None:
    """Why the kernel cannot take the tables of the rotary module ``rotary`` (``forward(x,
    position_ids, layer_type) -> (cos, sin)``) for positions ``0 .. length-1``, or None: their two
    halves must be equal, since it reads the first only."""
    positions = torch.arange(length, device=device)[None]
    probe = torch.empty(0, dtype=dtype, device=device)
    with torch.no_grad():
        for layer_type in sorted(layer_types):
            for name, table in zip(("cos", "sin"), rotary(probe, positions, layer_type)):
                first, second = half(table), table[..., table.shape[-1] // 2 :]
                if not torch.equal(first, second):
                    worst = (first.float() - second.float()).abs().max().item()
                    return f"the {layer_type} {name} table's two halves differ (by up to {worst:.3g})"
    return None


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' ``apply_rotary_pos_emb`` of one tensor: ``x * cos + rotate_half(x) * sin`` in
    fp32, then ``x``'s dtype (``cos``/``sin`` broadcast to ``x``)."""
    f = x.float()
    f1, f2 = f[..., : f.shape[-1] // 2], f[..., f.shape[-1] // 2 :]
    return ((f * cos) + (torch.cat((-f2, f1), dim=-1) * sin)).to(x.dtype)


def reference(qkv, cos, sin, counts, scale: float, window: int) -> torch.Tensor:
    """The kernel's semantics in torch ops: transformers' ``apply_rotary_pos_emb`` with the half
    tables repeated (none when ``cos`` is None), then SDPA with the padding (and band) mask; a
    query that sees no key gets 0."""
    q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=2))  # [B, H, S, D]
    if cos is not None:
        c, s = torch.cat((cos, cos), -1).unsqueeze(1), torch.cat((sin, sin), -1).unsqueeze(1)
        q, k = rotate(q, c, s), rotate(k, c, s)
    S = qkv.shape[1]
    pos = torch.arange(S, device=qkv.device)
    seen = (pos[None, None, :] < counts.to(pos.device)[:, None, None]).expand(-1, S, -1)  # [B, S, S]
    if window >= 0:
        seen = seen & ((pos[:, None] - pos[None, :]).abs() <= window)
    seen = seen[:, None]
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=seen, scale=scale)
    out = torch.where(seen.any(-1, keepdim=True), out, 0.0)
    return out.transpose(1, 2).contiguous()


def gathered_reference(qkv, counts, at, scale: float) -> torch.Tensor:
    """:func:`gathered_attention`'s semantics in torch ops: :func:`reference` without rotary or
    window at every position, its rows at ``at`` (0 where a position is outside the row)."""
    full = reference(qkv, None, None, counts, scale, -1)
    inside = (at >= 0) & (at < qkv.shape[1])
    picked = torch.gather(full, 1, at.clamp(0, qkv.shape[1] - 1)[:, :, None, None].expand(-1, -1, *full.shape[2:]))
    return torch.where(inside[:, :, None, None], picked, 0.0)
