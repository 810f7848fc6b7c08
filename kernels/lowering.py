"""CUDA source of a kernel's GPU specialisation, lowered without a GPU (no nvcc, no device).

Its own module so that generating one kernel's source depends on this file, ``_common`` and
that kernel alone (not on the probe, its pins or the other kernels).
"""

from __future__ import annotations

import tilelang

from ._common import GPU_PASS_CONFIGS


def cuda_source(factory, args=(), kwargs=None, dtype: str = "bfloat16", arch: str = "sm_90") -> str:
    """CUDA C++ source of the GPU specialisation, lowered without a GPU."""
    import tvm
    from tilelang.transform.pass_config import normalize_pass_configs
    from tvm.target import Target

    prim_func = factory.get_tir(*args, dtype=dtype, cpu=False, **(kwargs or {}))
    target = Target({"kind": "cuda", "arch": arch})
    # Same context as tilelang.compile: the pass configuration, and the target that layout
    # inference asks for.
    with tvm.transform.PassContext(opt_level=3, config=normalize_pass_configs(GPU_PASS_CONFIGS)), target:
        return tilelang.lower(prim_func, target=target).kernel_source
