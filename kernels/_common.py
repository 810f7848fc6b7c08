"""Pieces shared by the five kernels: the GPU/CPU scope switch, pass configs, epilogues.

Every kernel is written once. ``cpu=True`` changes only *where* buffers live and *how*
loops are scheduled (see :func:`alloc` and :func:`loop`); tiling, padding predicates,
masks and the online softmax are the same statements for both specialisations.
"""

from __future__ import annotations

import tilelang
import tilelang.language as T

# The argument rules (and the dtypes and epilogues they allow) live in the registry, which
# laya_build.config runs on pipeline.yaml without importing TileLang.
from .registry import CPU_DTYPE, GPU_DTYPES, check_args  # noqa: F401  (used by the kernel modules)

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
