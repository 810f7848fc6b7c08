"""Stage ``cuda_source``: CUDA C++ for one kernel variant x dtype x arch, with no GPU.

``tilelang.lower`` runs TileLang's device lowering and codegen only; nothing is compiled
with nvcc and no CUDA device is touched, so this works on a CPU-only machine.  Each
generation runs in its own process (see :mod:`laya_build.runner`): the source then depends
only on the kernel and its arguments, not on what else the process generated before.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path

from laya_build.stages.kernelgen import call_args, kernel_toolchain, load_factory, publish, sha256_text

# The module of ``kernels`` that lowers to CUDA (a baseline revision from before it existed
# names its own, ``kernels.probe``: see laya_build.stages.gitrev.lowering_module).
LOWERING_MODULE = "kernels.lowering"


def generate(
    factory_name: str, args: list, kwargs: dict, dtype: str, target: dict, lowering: str = LOWERING_MODULE
) -> str:
    """CUDA source of the GPU specialisation: ``cuda_source`` of the kernels' lowering module,
    the same lowering (GPU pass config, target context) that the kernel tests check."""
    cuda_source = importlib.import_module(lowering).cuda_source
    return cuda_source(load_factory(factory_name), args, kwargs, dtype, arch=target["arch"])


def kernels_origin(spec: dict) -> str:
    """Where ``kernels`` was imported from: ``worktree``, or ``git:<sha>`` for a baseline
    (checked: generating a baseline from the working tree would make every diff vacuous)."""
    import kernels

    root = spec.get("kernels_root")
    if root is None:
        return "worktree"
    if not Path(kernels.__file__).resolve().is_relative_to(Path(root).resolve()):
        raise ImportError(f"kernels was imported from {kernels.__file__}, not from the baseline at {root}")
    return f"git:{spec['kernels_commit']}"


def run_cuda_source(**spec) -> dict:
    """spec: variant, factory, args, kwargs, dtype, target (TileLang target dict), source (path);
    for a baseline also kernels_root and kernels_commit."""
    start = time.perf_counter()
    origin = kernels_origin(spec)
    args, kwargs = call_args(spec)
    source = generate(
        spec["factory"], args, kwargs, spec["dtype"], spec["target"], spec.get("lowering", LOWERING_MODULE)
    )
    record = {
        "stage": "cuda_source",
        "variant": spec["variant"],
        "factory": spec["factory"],
        "args": args,
        "kwargs": kwargs,
        "dtype": spec["dtype"],
        "target": spec["target"],
        "kernels": origin,
        "source": spec["source_rel"],
        "sha256": sha256_text(source),
        "bytes": len(source.encode("utf-8")),
        "toolchain": kernel_toolchain(),
        "elapsed_s": round(time.perf_counter() - start, 4),
    }
    return publish(record, spec["source"], source)
