"""The MLP's first GEMM and its gated GELU in one Triton kernel (``export.geglu_linear``).

A ModernBERT layer's MLP computes ``input, gate = Wi(x).chunk(2, -1)`` and then
``act(input) * gate``: compiled as written, a GEMM that writes ``2 x intermediate`` columns a
position, then a pointwise kernel that reads them all back and writes half as many.  On the H100 at
7 x 256 that kernel took 8.8 µs a layer beside the GEMM's 26.7 µs
(docs/measurements/runtime-h200.md).  Here one kernel computes, for a tile of positions and of
``intermediate`` columns, both halves' products (two fp32 accumulators over the same ``x`` tile),
rounds each to the model's dtype as the GEMM's output would be, and writes ``act(input) * gate``
(computed in fp32, rounded once): the ``2 x intermediate`` columns never reach memory.

The op is ``laya::geglu_linear``, a :func:`torch.library.triton_op`: AOTInductor compiles its
kernel into the package.  Its launch configurations are fixed (:data:`CONFIGS`, no autotuning),
chosen by the row count at run time as the attention kernel's are (the others get a grid of 0
programs).  Off CUDA it runs :func:`reference`, the MLP's own arithmetic (the same bits as the
module it replaces on the CPU).  The outputs on CUDA differ from a cuBLAS GEMM and a pointwise
kernel by the order the products are summed in.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import nn
from torch.library import triton_op, wrap_triton

from laya_build.model import rotary_attention

# Launch configurations, the largest row block first: a block of positions x a block of each
# half's columns x a step over the inputs.  ``MIN_ROWS``: the fewest rows that select it.
CONFIGS = (
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3, "MIN_ROWS": 512},
    {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4, "MIN_ROWS": 0},
)
ACTIVATIONS = ("gelu",)  # transformers' hidden_activation names the kernel computes
SQRT_HALF = 1 / math.sqrt(2)


@triton.jit
def _geglu_linear_kernel(
    X,
    W,
    BIAS,
    OUT,
    M,
    HALF,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    WAIT: tl.constexpr = False,
):
    pid = tl.program_id(0)
    blocks_m = tl.cdiv(M, BLOCK_M)
    blocks_n = tl.cdiv(HALF, BLOCK_N)
    group = GROUP_M * blocks_n  # programs that share GROUP_M row blocks: their x tiles stay in L2
    first_m = (pid // group) * GROUP_M
    size_m = tl.minimum(blocks_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < HALF
    x_ptr = X + rows.to(tl.int64)[:, None] * stride_xm + ks[None, :]
    a_ptr = W + cols.to(tl.int64)[None, :] * stride_wn + ks[:, None]  # the input half's rows, as [K, N]
    g_ptr = a_ptr + HALF * stride_wn  # the gate half's
    if WAIT:  # as in the attention kernel (export.programmatic_launch)
        tl.extra.cuda.gdc_wait()
    acc_a = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(0, K, BLOCK_K):
        k_ok = ks < K - k
        x = tl.load(x_ptr, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        wa = tl.load(a_ptr, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        wg = tl.load(g_ptr, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc_a = tl.dot(x, wa, acc_a)
        acc_g = tl.dot(x, wg, acc_g)
        x_ptr += BLOCK_K
        a_ptr += BLOCK_K
        g_ptr += BLOCK_K
    if HAS_BIAS:
        acc_a += tl.load(BIAS + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        acc_g += tl.load(BIAS + HALF + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    # each half rounded as the GEMM writes it, then the gated GELU in fp32, rounded once
    a = acc_a.to(OUT.dtype.element_ty).to(tl.float32)
    g = acc_g.to(OUT.dtype.element_ty).to(tl.float32)
    h = 0.5 * a * (1.0 + tl.math.erf(a * 0.7071067811865476)) * g
    o_ptr = OUT + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
    tl.store(o_ptr, h.to(OUT.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The MLP's arithmetic: ``gelu(input) * gate`` of ``F.linear(x, weight, bias).chunk(2, -1)``."""
    a, g = torch.nn.functional.linear(x, weight, bias).chunk(2, dim=-1)
    return torch.nn.functional.gelu(a) * g


def selection(rows) -> list[tuple[dict, object]]:
    """``(config, use)`` for each of :data:`CONFIGS`: ``use`` is 1 for the first one whose
    ``MIN_ROWS`` the row count reaches and 0 for the others (symbolic for a symbolic count)."""
    chosen, before = [], 0
    for config in CONFIGS[:-1]:
        now = torch.sym_min(1, torch.sym_max(0, rows - (config["MIN_ROWS"] - 1)))  # rows >= MIN_ROWS
        chosen.append((config, now - before))
        before = now
    chosen.append((CONFIGS[-1], 1 - before))
    return chosen


def launch(x2, weight, bias, out, config: dict, use=1, kernel=None) -> None:
    """Run the kernel (``kernel``: the JIT function or a wrapper of it) on the ``[M, K]`` rows
    ``x2`` into ``out`` (``[M, HALF]``) with ``config``; ``use`` multiplies the grid (0: no program)."""
    kernel = kernel if kernel is not None else _geglu_linear_kernel
    M, K = x2.shape
    half = weight.shape[0] // 2
    launch_cfg = {k: v for k, v in config.items() if k != "MIN_ROWS"}
    grid = triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(half, config["BLOCK_N"]) * use
    kernel[(grid,)](
        x2,
        weight,
        bias if bias is not None else weight,  # (not read without a bias)
        out,
        M,
        half,
        K,
        x2.stride(0),
        weight.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None,
        WAIT=rotary_attention._WAITS.get(),
        **launch_cfg,
    )


@triton_op("laya::geglu_linear", mutates_args={})
def geglu_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``[..., K]`` inputs, ``[2 * HALF, K]`` weight, ``[2 * HALF]`` bias or None -> ``[..., HALF]``:
    ``gelu(input) * gate`` of the linear layer's two halves."""
    torch._check(
        weight.dim() == 2 and weight.shape[0] % 2 == 0, lambda: f"weight must be [2 * N, K], got {tuple(weight.shape)}"
    )
    torch._check(
        x.shape[-1] == weight.shape[1], lambda: f"x's last axis {x.shape[-1]} is not the weight's {weight.shape[1]}"
    )
    if x.device.type != "cuda":
        return reference(x, weight, bias)
    half = weight.shape[0] // 2
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    w = weight.contiguous()
    out = torch.empty((x2.shape[0], half), dtype=x.dtype, device=x.device)
    for config, use in selection(x2.shape[0]):
        if isinstance(use, int) and use == 0:
            continue
        launch(x2, w, bias, out, config, use, wrap_triton(_geglu_linear_kernel))
    return out.reshape(*x.shape[:-1], half)


class GegluMLP(nn.Module):
    """ModernBERT's MLP (the same ``Wi``, ``drop`` and ``Wo`` modules, so the same state dict)
    with ``act(input) * gate`` of ``Wi`` as one op."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.Wi, self.drop, self.Wo = mlp.Wi, mlp.drop, mlp.Wo

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.Wo(self.drop(geglu_linear(hidden_states, self.Wi.weight, self.Wi.bias)))


def refusal(model: nn.Module) -> str | None:
    """Why :func:`use` cannot replace the MLPs of ``model``, or None."""
    config = getattr(model, "config", None)
    encoder_config = getattr(getattr(model, "encoder", None), "config", config)
    act = getattr(encoder_config, "hidden_activation", None)
    if not mlps(model):
        return "the model has no ModernBERT MLP (a module with Wi, act, drop and Wo)"
    if act not in ACTIVATIONS:
        return f"the kernel computes a {', '.join(ACTIVATIONS)} gate; this model's hidden_activation is {act!r}"
    return None


def mlps(model: nn.Module) -> list[str]:
    """The module paths of the encoder's MLPs: modules with ``Wi``, ``act``, ``drop`` and ``Wo``."""
    return [
        name
        for name, m in model.named_modules()
        if all(isinstance(getattr(m, a, None), nn.Module) for a in ("Wi", "act", "drop", "Wo"))
        and isinstance(m.Wi, nn.Linear)
    ]


def use(model: nn.Module) -> int:
    """Replace every encoder MLP of ``model`` by a :class:`GegluMLP`; how many were replaced."""
    if (why := refusal(model)) is not None:
        raise ValueError(f"export.geglu_linear: {why}")
    names = mlps(model)
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, child, GegluMLP(getattr(owner, child)))
    return len(names)
