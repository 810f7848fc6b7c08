"""The encoder MLP's gated GELU as one Triton kernel of a fixed launch configuration (``export.mlp: fused``).

ModernBERT's MLP splits its ``Wi`` output in two along the last axis, ``input`` and ``gate``, and
computes ``gelu(input) * gate`` (exact GELU, with erf) before ``Wo``.  Compiled by Inductor that is
one pointwise kernel whose launch configuration Inductor times among candidates at the export's
example size (``XBLOCK``, warps) and writes into the build's tuning file: the configuration chosen
at 128 positions ran 30 % slower at 1,792 (docs/measurements/runtime-h200.md).  Here the op
``laya::geglu`` is a :func:`torch.library.triton_op` with one configuration (:data:`CONFIG`,
measured at the serving shapes by ``benchmarks/geglu_probe.py``): torch.export keeps it as one op,
AOTInductor compiles the kernel into the package, and nothing of it is tuned at build time.

The kernel rounds as the eager model does: GELU in fp32 rounded to the model's dtype, then the
product in fp32 rounded again.  Off CUDA the op runs :func:`reference`, the module's own ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

# a program's rows and columns, its warps (benchmarks/geglu_probe.py)
CONFIG = {"ROWS": 8, "BLOCK_N": 128, "num_warps": 4}
SQRT1_2 = tl.constexpr(0.7071067811865476)  # a global a kernel reads must be a constexpr
MAX_ELEMENTS = 2**31 - 1  # the kernel's offsets are int32


@triton.jit
def _geglu_kernel(X, OUT, M, WIDTH: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = (rows < M)[:, None] & (cols < WIDTH)[None, :]
    at = rows[:, None] * (2 * WIDTH) + cols[None, :]
    a = tl.load(X + at, mask=ok, other=0.0).to(tl.float32)
    g = tl.load(X + at + WIDTH, mask=ok, other=0.0).to(tl.float32)
    act = (a * 0.5 * (1.0 + tl.math.erf(a * SQRT1_2))).to(OUT.dtype.element_ty)  # F.gelu's rounding
    out = OUT + rows[:, None] * WIDTH + cols[None, :]
    tl.store(out, (act.to(tl.float32) * g).to(OUT.dtype.element_ty), mask=ok)


def launch(x: torch.Tensor, out: torch.Tensor, kernel=None, config=None) -> None:
    """Run the kernel on the contiguous ``[..., 2 * W]`` ``x`` into the contiguous ``[..., W]``
    ``out`` (``kernel``: the JIT function or a wrapper of it; ``config``: another launch
    configuration than :data:`CONFIG`)."""
    kernel = kernel if kernel is not None else _geglu_kernel
    config = {**CONFIG, **(config or {})}
    width = out.shape[-1]
    m = out.numel() // width
    kernel[(triton.cdiv(width, config["BLOCK_N"]), triton.cdiv(m, config["ROWS"]))](x, out, m, WIDTH=width, **config)


@triton_op("laya::geglu", mutates_args={})
def geglu(x: torch.Tensor) -> torch.Tensor:
    """``[..., 2 * W]`` -> ``gelu(x[..., :W]) * x[..., W:]``, ``[..., W]`` (exact GELU)."""
    torch._check(x.dim() >= 1 and x.shape[-1] % 2 == 0, lambda: f"x must end in an even axis, got {tuple(x.shape)}")
    if x.device.type != "cuda":
        return reference(x)
    width = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
    torch._check(out.numel() <= MAX_ELEMENTS, lambda: f"{out.numel()} outputs is more than the kernel indexes")
    launch(x.contiguous(), out, wrap_triton(_geglu_kernel))
    return out


def reference(x: torch.Tensor) -> torch.Tensor:
    """What ModernBERT's MLP computes between ``Wi`` and ``Wo`` (its ``act`` the exact GELU)."""
    a, g = x.chunk(2, dim=-1)
    return F.gelu(a) * g


def refusal(mlp: torch.nn.Module) -> str | None:
    """Why the op cannot stand for ``mlp``'s activation and product (None: it can): the op is
    the exact GELU times the gate, transformers' ``GELUActivation`` over ``F.gelu``."""
    act = getattr(mlp, "act", None)
    if not (hasattr(mlp, "Wi") and hasattr(mlp, "Wo")):
        return f"ModernBERT's MLP (Wi, act, Wo), not {type(mlp).__name__}"
    if type(act).__name__ != "GELUActivation" or getattr(act, "act", None) is not F.gelu:
        return f"the exact GELU as the MLP's activation (hidden_activation gelu), not {act!r}"
    return None
