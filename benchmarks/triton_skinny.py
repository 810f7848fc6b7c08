"""Skinny-M GEMMs in Triton: the candidates ``benchmarks/gemm_probe.py`` times against cuBLAS.

At the serving shapes of the H200 configuration (M = 128 tokens, N up to 5,248, K up to 2,624)
cuBLAS launches few tiles along N and leaves SMs idle; these kernels cover the 132 SMs with
narrow N tiles and, where N is small (1,024), split K.  A split-K GEMM adds its fp32 partials
in split order in the program that arrives last at its tile (a counter per tile, reset by that
program), so the result does not depend on arrival order and the kernel is one launch.

``skinny_geglu`` is the MLP's first GEMM with its GeGLU epilogue: ``gelu(x @ W[:F]^T) * (x @
W[F:]^T)``, one launch instead of a GEMM and a pointwise kernel.

Tested on the CPU with Triton's interpreter (``TRITON_INTERPRET=1``, fp16/fp32; the
interpreter has no bf16), timed on the GPU by the probe.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def skinny_mm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    part_ptr,
    count_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    """y[M, N] = x[M, K] @ w[N, K]^T in fp32, stored as y's dtype.

    Grid (N tiles, M tiles, SPLIT_K).  With SPLIT_K > 1 each program writes its fp32 partial
    sum; the last of a tile's programs to arrive (a counter per tile) adds the partials in
    split order (so the result does not depend on arrival order) and resets the counter.
    """
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_begin = pid_k * per_split
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(0, per_split):
        kk = (k_begin + i) * BLOCK_K + rk  # past K (an uneven last split) loads zeros
        a = tl.load(
            x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0
        )
        b = tl.load(
            w_ptr + rn[None, :] * stride_wn + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < K), other=0.0
        )
        acc = tl.dot(a, b, acc)
    out_mask = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT_K == 1:
        tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_mask)
    else:
        tile = pid_m * tl.num_programs(0) + pid_n
        part = part_ptr + pid_k * M * N + rm[:, None] * N + rn[None, :]
        tl.store(part, acc, mask=out_mask)
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(SPLIT_K):
                total += tl.load(
                    part_ptr + s * M * N + rm[:, None] * N + rn[None, :], mask=out_mask, other=0.0, cache_modifier=".cg"
                )
            tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], total.to(y_ptr.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed", scope="gpu")


@triton.jit
def skinny_geglu_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    M,
    F,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """y[M, F] = gelu(x @ w[:F]^T) * (x @ w[F:2F]^T), erf GELU, fp32 accumulation."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(
            x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0
        )
        w_mask = (rn[None, :] < F) & (kk[:, None] < K)
        b_up = tl.load(w_ptr + rn[None, :] * stride_wn + kk[:, None], mask=w_mask, other=0.0)
        b_gate = tl.load(w_ptr + (rn[None, :] + F) * stride_wn + kk[:, None], mask=w_mask, other=0.0)
        up = tl.dot(a, b_up, up)
        gate = tl.dot(a, b_gate, gate)
    act = 0.5 * up * (1.0 + tl.math.erf(up * 0.7071067811865476))
    out_mask = (rm[:, None] < M) & (rn[None, :] < F)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], (act * gate).to(y_ptr.dtype.element_ty), mask=out_mask)


def skinny_mm(x, w, out, block_m, block_n, block_k, split_k, num_warps=4, num_stages=3, part=None, count=None):
    """``out = x @ w^T``; with ``split_k > 1``, ``part`` (fp32, ``split_k * M * N``) and ``count``
    (int32 zeros, one per output tile; left zero again) are allocated unless given."""
    import torch

    M, K = x.shape
    N = w.shape[0]
    grid = (triton.cdiv(N, block_n), triton.cdiv(M, block_m), split_k)
    if split_k > 1:
        if part is None:
            part = torch.empty(split_k * M * N, device=x.device, dtype=torch.float32)
        if count is None:
            count = torch.zeros(grid[0] * grid[1], device=x.device, dtype=torch.int32)
    else:
        part = count = out
    skinny_mm_kernel[grid](
        x,
        w,
        out,
        part,
        count,
        M,
        N,
        K,
        x.stride(0),
        w.stride(0),
        out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        SPLIT_K=split_k,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


def skinny_geglu(x, w, out, block_m, block_n, block_k, num_warps=4, num_stages=3):
    """``out[M, F] = gelu(x @ w[:F]^T) * (x @ w[F:]^T)`` for ``w`` of ``2F`` rows."""
    M, K = x.shape
    F = w.shape[0] // 2
    grid = (triton.cdiv(F, block_n), triton.cdiv(M, block_m))
    skinny_geglu_kernel[grid](
        x,
        w,
        out,
        M,
        F,
        K,
        x.stride(0),
        w.stride(0),
        out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


@triton.jit
def geglu_pointwise_kernel(h_ptr, y_ptr, M, F, BLOCK: tl.constexpr):
    """y[M, F] = gelu(h[:, :F]) * h[:, F:], one pointwise kernel (what Inductor fuses after cuBLAS)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * F
    row = offs // F
    col = offs % F
    up = tl.load(h_ptr + row * (2 * F) + col, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(h_ptr + row * (2 * F) + F + col, mask=mask, other=0.0).to(tl.float32)
    act = 0.5 * up * (1.0 + tl.math.erf(up * 0.7071067811865476))
    tl.store(y_ptr + offs, (act * gate).to(y_ptr.dtype.element_ty), mask=mask)


def geglu_pointwise(h, out, block=1024):
    M, F = out.shape
    geglu_pointwise_kernel[(triton.cdiv(M * F, block),)](h, out, M, F, BLOCK=block)
    return out


@triton.jit
def _grouped_tile(tile, M, F, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Output tile ``tile``'s (row block, column block), GROUP_M row blocks at a time (the weights'
    column blocks are read by GROUP_M programs close together, from L2)."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(F, BLOCK_N)
    in_group = GROUP_M * num_n
    first_m = (tile // in_group) * GROUP_M
    size = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % in_group) % size, (tile % in_group) // size


@triton.jit
def _geglu(up, gate, dtype):
    """gelu(up) * gate in fp32 from the two GEMMs' results rounded to ``dtype`` (as cuBLAS's
    output is before the pointwise kernel reads it), erf GELU."""
    up = up.to(dtype).to(tl.float32)
    gate = gate.to(dtype).to(tl.float32)
    return 0.5 * up * (1.0 + tl.math.erf(up * 0.7071067811865476)) * gate


@triton.jit
def geglu_gemm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    M,
    F,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """y[M, F] = gelu(x @ w[:F]^T) * (x @ w[F:]^T); ``K % BLOCK_K == 0``; tiles in groups of GROUP_M row blocks."""
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, F, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    am = tl.where(rm < M, rm, 0)
    wn = tl.where(rn < F, rn, 0)
    a_ptrs = x_ptr + am[:, None] * stride_xm + rk[None, :]
    u_ptrs = w_ptr + wn[:, None] * stride_wn + rk[None, :]
    g_ptrs = u_ptrs + F * stride_wn
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs)
        up = tl.dot(a, tl.trans(tl.load(u_ptrs)), up)
        gate = tl.dot(a, tl.trans(tl.load(g_ptrs)), gate)
        a_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
    out = _geglu(up, gate, y_ptr.dtype.element_ty)
    mask = (rm[:, None] < M) & (rn[None, :] < F)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], out.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def geglu_gemm_tma_kernel(
    x_desc,
    u_desc,
    g_desc,
    y_desc,
    M,
    F,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PROGRAMS: tl.constexpr,
):
    """The same through Hopper's TMA (host tensor descriptors: x, w[:F], w[F:], y), persistent:
    PROGRAMS programs take the output tiles in turn."""
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(F, BLOCK_N)
    for tile in range(tl.program_id(0), tiles, PROGRAMS):
        pid_m, pid_n = _grouped_tile(tile, M, F, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for off_k in range(0, K, BLOCK_K):
            a = x_desc.load([off_m, off_k])
            up = tl.dot(a, u_desc.load([off_n, off_k]).T, up)
            gate = tl.dot(a, g_desc.load([off_n, off_k]).T, gate)
        y_desc.store([off_m, off_n], _geglu(up, gate, y_desc.dtype).to(y_desc.dtype))


def geglu_gemm(x, w, out, block_m, block_n, block_k, num_warps=4, num_stages=3, group_m=8):
    """``out[M, F] = gelu(x @ w[:F]^T) * (x @ w[F:]^T)``, one kernel, grouped tiles."""
    M, K = x.shape
    F = w.shape[0] // 2
    grid = (triton.cdiv(M, block_m) * triton.cdiv(F, block_n),)
    geglu_gemm_kernel[grid](
        x, w, out, M, F, K, x.stride(0), w.stride(0), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out


def geglu_gemm_tma(x, w, out, block_m, block_n, block_k, num_warps=4, num_stages=3, group_m=8, programs=None):
    """:func:`geglu_gemm` through TMA, persistent over ``programs`` (default: one a multiprocessor)."""
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = x.shape
    F = w.shape[0] // 2
    tiles = triton.cdiv(M, block_m) * triton.cdiv(F, block_n)
    if programs is None:
        programs = torch.cuda.get_device_properties(x.device).multi_processor_count
    programs = min(programs, tiles)
    geglu_gemm_tma_kernel[(programs,)](
        TensorDescriptor.from_tensor(x, [block_m, block_k]),
        TensorDescriptor.from_tensor(w[:F], [block_n, block_k]),
        TensorDescriptor.from_tensor(w[F:], [block_n, block_k]),
        TensorDescriptor.from_tensor(out, [block_m, block_n]),
        M, F, K,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m, PROGRAMS=programs,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out
