"""Plain-torch references of the five kernels.

Every reference computes in float64 (promoting whatever it is given) and returns float64
tensors; callers cast to the dtype they compare against.  The references never modify
their inputs: in-place kernels (``add_ln``'s residual update, RoPE) are described by
returning the updated tensor instead.
"""

from __future__ import annotations

import math

import torch

from .registry import ACTIVATIONS  # the GEMM epilogues the kernels accept

__all__ = [
    "ACTIVATIONS",
    "activation",
    "gemm_reference",
    "geglu_reference",
    "add_ln_reference",
    "rope_reference",
    "rope_tables",
    "attn_reference",
]


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(device="cpu", dtype=torch.float64)


def activation(x: torch.Tensor, act: str) -> torch.Tensor:
    """The GEMM epilogue: identity, exact (erf) GELU or ReLU."""
    if act == "none":
        return x
    if act == "gelu":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    if act == "relu":
        return torch.clamp_min(x, 0.0)
    raise ValueError(f"unknown activation {act!r}; allowed: {', '.join(ACTIVATIONS)}")


def gemm_reference(A, W, b=None, act: str = "none") -> torch.Tensor:
    """``act(A[M,K] @ W[N,K]^T + b)`` in float64."""
    out = _f64(A) @ _f64(W).T
    if b is not None:
        out = out + _f64(b)
    return activation(out, act)


def geglu_reference(A, W) -> torch.Tensor:
    """ModernBERT GLU up-projection: ``gelu(A @ W[:F]^T) * (A @ W[F:]^T)`` with W = [2F, K]."""
    F = W.shape[0] // 2
    h = _f64(A) @ _f64(W).T
    return activation(h[:, :F], "gelu") * h[:, F:]


def add_ln_reference(X, R, w, b=None, eps: float = 1e-5, residual: bool = True):
    """Returns ``(X_new, Y)``: ``X_new = X + R`` (fp32, exactly what the kernel stores) when
    ``residual`` else ``X``; ``Y = LayerNorm(X_new) * w (+ b)`` in float64 (biased variance)."""
    x_new = (X + R) if residual else X.clone()
    x = _f64(x_new)
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps) * _f64(w)
    if b is not None:
        y = y + _f64(b)
    return x_new, y


def rope_tables(L: int, Dh: int, base: float = 10000.0, dtype=torch.float32):
    """Standard ``cos``/``sin`` tables of shape ``[L, Dh/2]`` (a convenience for tests)."""
    inv = 1.0 / base ** (torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)
    ang = torch.arange(L, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def rope_reference(QKV, cos, sin, H: int, Dh: int) -> torch.Tensor:
    """Rotate-half RoPE of the Q and K columns of packed ``QKV[M, 3*H*Dh]``.

    Row ``r`` uses position ``r % L`` with ``L = cos.shape[0]``.  For each head and
    ``d < Dh/2``: ``x1' = x1*cos - x2*sin``, ``x2' = x2*cos + x1*sin`` where
    ``x1 = x[d]``, ``x2 = x[d + Dh/2]``.  V columns are returned unchanged.
    """
    M = QKV.shape[0]
    L, half = cos.shape
    assert half * 2 == Dh and QKV.shape[1] == 3 * H * Dh
    pos = torch.arange(M) % L
    c = _f64(cos)[pos][:, None, None, :]  # [M,1,1,half]
    s = _f64(sin)[pos][:, None, None, :]
    x = _f64(QKV).reshape(M, 3, H, Dh).clone()
    qk = x[:, :2]
    x1, x2 = qk[..., :half].clone(), qk[..., half:].clone()
    qk[..., :half] = x1 * c - x2 * s
    qk[..., half:] = x2 * c + x1 * s
    return x.reshape(M, 3 * H * Dh)


def attn_reference(qkv, lens, window: int = 0, scale: float | None = None) -> torch.Tensor:
    """Masked bidirectional attention of packed ``qkv[B, L, 3, H, Dh]`` -> ``O[B, L, H*Dh]``.

    * keys ``j >= lens[b]`` are masked;
    * ``window > 0``: only keys with ``abs(i - j) <= window`` are attended (sliding window);
    * ``scale`` defaults to ``1/sqrt(Dh)``;
    * query rows ``i >= lens[b]`` (unspecified in the kernel) are zeros here, and an empty
      sequence (``lens[b] == 0``) gives all zeros.
    """
    B, L, three, H, Dh = qkv.shape
    assert three == 3, "qkv must be [B, L, 3, H, Dh]"
    if scale is None:
        scale = 1.0 / math.sqrt(Dh)
    x = _f64(qkv)
    out = torch.zeros(B, L, H, Dh, dtype=torch.float64)
    idx = torch.arange(L)
    for bi in range(B):
        n = int(lens[bi])
        if n <= 0:
            continue
        n = min(n, L)
        q = x[bi, :n, 0].transpose(0, 1)  # [H, n, Dh]
        k = x[bi, :n, 1].transpose(0, 1)
        v = x[bi, :n, 2].transpose(0, 1)
        s = (q @ k.transpose(-1, -2)) * scale  # [H, n, n]
        if window > 0:
            far = (idx[:n, None] - idx[None, :n]).abs() > window
            s = s.masked_fill(far, float("-inf"))
        p = torch.softmax(s, dim=-1)  # every valid row keeps at least its diagonal key
        out[bi, :n] = (p @ v).transpose(0, 1)
    return out.reshape(B, L, H * Dh)
