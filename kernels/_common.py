"""Pieces shared by the five kernels: dtype rules, the GPU/CPU scope switch, pass configs.

Every kernel is written once. ``cpu=True`` changes only *where* buffers live and *how*
loops are scheduled (see :func:`alloc` and :func:`loop`); tiling, padding predicates,
masks and the online softmax are the same statements for both specialisations.
"""
from __future__ import annotations

import tilelang
import tilelang.language as T

from .reference import ACTIVATIONS  # the GEMM epilogues, shared with the references

GPU_DTYPES = ("bfloat16", "float16")
CPU_DTYPE = "float32"
ACCUM_DTYPE = "float32"

# Pass configuration of the GPU build ("FAST" in the spec).
GPU_PASS_CONFIGS = {
    tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: False,
}
# The CPU specialisation: scalar C, vectorisation off.
CPU_PASS_CONFIGS = {
    tilelang.PassConfigKey.TIR_DISABLE_VECTORIZE: True,
    tilelang.PassConfigKey.TL_DISABLE_VECTORIZE_256: True,
}


def check_dtype(dtype: str, cpu: bool) -> str:
    """Validate a kernel's storage dtype.

    The GPU path takes bf16/fp16 only.  ``cpu=True`` builds TIR for any float dtype so the
    probe can show what the C target rejects; :func:`kernels.compile_cpu` forces fp32.
    """
    if cpu:
        if dtype not in (CPU_DTYPE, *GPU_DTYPES):
            raise ValueError(f"dtype={dtype!r} is not supported with cpu=True; allowed: float32 (compile_cpu), bfloat16, float16")
        return dtype
    if dtype not in GPU_DTYPES:
        raise ValueError(
            f"dtype={dtype!r} is not supported on the GPU path; allowed dtypes: {', '.join(GPU_DTYPES)} "
            f"(fp32 runs only on the CPU specialisation: compile_cpu(...) or cpu=True)"
        )
    return dtype


def alloc(shape, dtype, cpu: bool, scope: str = "fragment"):
    """A tile buffer: fragment/shared on the GPU, thread-local on the CPU."""
    if cpu:
        return T.alloc_local(shape, dtype)
    if scope == "fragment":
        return T.alloc_fragment(shape, dtype)
    if scope == "shared":
        return T.alloc_shared(shape, dtype)
    raise ValueError(f"unknown scope {scope!r}")


def loop(*extents, cpu: bool):
    """Element-wise loop nest: ``T.Parallel`` on the GPU, sequential ``T.grid`` on the CPU."""
    return T.grid(*extents) if cpu else T.Parallel(*extents)


def threads(gpu_threads: int, cpu: bool) -> int:
    return 1 if cpu else gpu_threads


def stages(gpu_stages: int, cpu: bool) -> int:
    """Software-pipelining depth of a ``T.Pipelined`` loop: none on the CPU."""
    return 0 if cpu else gpu_stages


def rasterize(panel_size: int, cpu: bool):
    """The GPU's threadblock swizzle (L2-friendly block order); dropped on the CPU."""
    return T.use_swizzle(panel_size, enable=not cpu)


_INV_SQRT2 = 0.7071067811865476


def check_choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; allowed: {', '.join(map(str, allowed))}")


def check_positive(**dims) -> None:
    """Compile-time shape arguments must be positive Python ints."""
    for name, value in dims.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def gelu(x):
    """Exact (erf) GELU of an fp32 expression."""
    return 0.5 * x * (1.0 + T.erf(x * _INV_SQRT2))


def activation(x, act: str):
    """The GEMM epilogue on an fp32 expression: ``none``, exact ``gelu`` or ``relu``."""
    if act == "gelu":
        return gelu(x)
    if act == "relu":
        return T.max(x, T.float32(0))
    return x
