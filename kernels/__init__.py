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

import importlib

from .registry import KERNELS  # plain Python: no tilelang

# Public name -> defining submodule (the factories' from the registry).  Resolved lazily
# (PEP 562): ``import kernels`` stays cheap and does not import tilelang.  That matters
# beyond start-up time: transformers probes for Hugging Face's own ``kernels`` package by
# importing whatever ``kernels`` is on sys.path, so a process that only loads the model must
# not pay for (or need) tilelang.
_EXPORTS = {
    **{name: kernel.module for name, kernel in KERNELS.items()},
    "compile_cpu": "cpu",
    "CpuKernel": "cpu",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
