"""TileLang kernels of the Laya decision model (GPU bf16/fp16) and their scalar fp32 CPU
specialisation.

Factories (``@tilelang.jit``, lazy: ``factory.get_tir(...)`` returns the PrimFunc)::

    gemm_kernel(N, K, bias=False, act="none", ...)   k(A, W, b, C)
    gemm_geglu_kernel(F, K, ...)                       k(A, W, C)
    add_ln_kernel(D, residual=True, bias=False, ...)   k(X, R, w, b, Y)
    rope_kernel(H, Dh, ...)                            k(QKV, cos, sin)
    attn_kernel(B, L, H, Dh, window=0, ...)            k(QKV, Lens, O)

``compile_cpu(factory, *args, **kwargs)`` builds the checked scalar fp32 CPU kernel.
"""
from .add_ln import add_ln_kernel
from .attention import attn_kernel
from .cpu import CpuKernel, compile_cpu
from .geglu import gemm_geglu_kernel
from .gemm import gemm_kernel
from .rope import rope_kernel

__all__ = [
    "gemm_kernel",
    "gemm_geglu_kernel",
    "add_ln_kernel",
    "rope_kernel",
    "attn_kernel",
    "compile_cpu",
    "CpuKernel",
]
