"""Test helpers for the kernels (used by ``tests/kernels``): seed, tolerances, fixtures' data.

Tolerances are absolute, for the bounded fixtures made here (unit-variance activations,
Linear-style weights); they are not a guarantee for arbitrary magnitudes.
"""

from __future__ import annotations

import torch

SEED = 1234
CPU_ATOL = 2e-5  # CPU fp32 kernel vs fp64 reference (rtol 0)
ROPE_ATOL = 2e-6  # RoPE has no reduction: tighter
# GPU (16-bit storage, fp32 accumulation) vs the CPU fp32 kernel on the same rounded inputs:
# a couple of ulps of the 16-bit output at O(1..10) magnitudes.
GPU_TOL = {"bfloat16": dict(atol=3e-2, rtol=2e-2), "float16": dict(atol=4e-3, rtol=4e-3)}


def randn(*shape, scale: float = 1.0) -> torch.Tensor:
    """fp32 normal values from the (seeded) global generator."""
    return torch.randn(*shape) * scale


def weight(n_out: int, n_in: int) -> torch.Tensor:
    """A Linear-style fp32 weight ``[n_out, n_in]`` whose products have unit variance."""
    return torch.randn(n_out, n_in) / n_in**0.5


def as_16bit(t: torch.Tensor, dtype: str) -> torch.Tensor:
    """``t`` rounded to a 16-bit storage dtype (``"bfloat16"``/``"float16"``), on the CPU."""
    return t.to(getattr(torch, dtype))


def nan_like(shape, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """An output buffer pre-filled with NaN, so an element the kernel forgets is caught."""
    return torch.full(tuple(shape), float("nan"), dtype=dtype, device=device)
