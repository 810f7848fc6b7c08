"""Shared fixtures of the kernel tests (helpers and tolerances: :mod:`kernels.testing`).

* every test starts from ``torch.manual_seed(1234)``;
* ``cpu_kernel(factory, *args, **kwargs)`` compiles through ``compile_cpu`` once per session
  and argument set (CI has 2 cores: compiles are the expensive part of these tests);
* ``gpu_kernel(factory, *args, **kwargs)`` likewise for the GPU specialisation (CUDA only).
"""

from __future__ import annotations

import pytest
import torch

from kernels import compile_cpu
from kernels.testing import SEED


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(SEED)


def _cached(build):
    cache = {}

    def get(factory, *args, **kwargs):
        key = (id(factory), args, tuple(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = build(factory, *args, **kwargs)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def cpu_kernel():
    return _cached(compile_cpu)


@pytest.fixture(scope="session")
def gpu_kernel():
    if not torch.cuda.is_available():
        pytest.skip("GPU comparison: torch.cuda.is_available() is False")
    # A @tilelang.jit factory called with its arguments compiles for the local GPU.
    return _cached(lambda factory, *args, **kwargs: factory(*args, **kwargs))
