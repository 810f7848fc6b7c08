"""Programmatic dependent launch of a CUDA package's Triton kernels (``export.programmatic_launch``).

In a CUDA graph every kernel waits for the one before it to end, then starts: between two kernels
the GPU idles for the launch of the second (on the H100 about 260 µs of a 3.4 ms forward of the
H200 configuration at 7 x 256, docs/measurements/runtime-h200.md).  Hopper's programmatic
dependent launch lets a kernel start while the one before it is still running; it then waits
inside, at ``griddepcontrol.wait``, until that kernel has ended and its writes are visible.  A
kernel launched that way must wait before it reads what the kernel before it writes.

AOTInductor launches every Triton kernel of a package through one C++ helper of its wrapper
(``launchKernel``, :meth:`CUDADeviceOpOverrides.kernel_driver`), with ``cuLaunchKernel`` and no
launch attributes.  :func:`programmatic_launches` has that helper launch with
``cuLaunchKernelEx`` and ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` instead, for
the compile of one package in the package child.  Every Triton kernel of such a package waits:
Inductor's own with ``triton.enable_pdl`` (its ``gdc_wait`` before a kernel reads what the
kernel before it wrote, and before it lets the next one start), the project's
(:mod:`laya_build.model.rotary_attention`) at their first read, traced with
:func:`~laya_build.model.rotary_attention.programmatic_waits`.  Kernels the wrapper launches
otherwise (cuBLAS, the native op, copies and memsets) keep the stream's order: each starts after
everything before it has ended.
"""

from __future__ import annotations

import re

from laya_build.errors import ConfigError

# the one cuLaunchKernel call of AOTInductor's launchKernel helper (torch 2.11 - 2.13)
LAUNCH = re.compile(
    r"CUDA_DRIVER_CHECK\(cuLaunchKernel\(\s*func,\s*gridX,\s*gridY,\s*gridZ,\s*32\*numWarps,\s*1,\s*1,\s*"
    r"sharedMemBytes,\s*stream,\s*args,\s*nullptr\s*\)\);"
)
PROGRAMMATIC = """CUlaunchAttribute laya_attribute[1];
                laya_attribute[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
                laya_attribute[0].value.programmaticStreamSerializationAllowed = 1;
                CUlaunchConfig laya_launch = {};
                laya_launch.gridDimX = gridX;
                laya_launch.gridDimY = gridY;
                laya_launch.gridDimZ = gridZ;
                laya_launch.blockDimX = 32*numWarps;
                laya_launch.blockDimY = 1;
                laya_launch.blockDimZ = 1;
                laya_launch.sharedMemBytes = sharedMemBytes;
                laya_launch.hStream = stream;
                laya_launch.attrs = laya_attribute;
                laya_launch.numAttrs = 1;
                CUDA_DRIVER_CHECK(cuLaunchKernelEx(&laya_launch, func, args, nullptr));"""
MARK = "CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION"
MIN_CAPABILITY = (9, 0)


def programmatic_source(source: str) -> str:
    """``source`` (AOTInductor's C++ launch helpers) with its one ``cuLaunchKernel`` call made a
    programmatic launch; a ``ConfigError`` where that call is not there exactly once (another
    torch's helpers, which this change does not know)."""
    found = len(LAUNCH.findall(source))
    if found != 1:
        raise ConfigError(
            f"export.programmatic_launch: this torch's AOTInductor launches its kernels otherwise "
            f"({found} calls of the form laya-build changes, not 1), so its kernels cannot be launched "
            "programmatically",
            hint="set export.programmatic_launch.cuda to false for this torch",
        )
    return LAUNCH.sub(lambda _: PROGRAMMATIC, source)


def capability_refusal(capability: tuple[int, int] | None) -> str | None:
    """Why a GPU of compute ``capability`` (None: no GPU) cannot run programmatic launches, or None."""
    if capability is None:
        return "no CUDA GPU is visible to the package stage"
    if tuple(capability) < MIN_CAPABILITY:
        return f"the GPU has compute capability {capability[0]}.{capability[1]}, and it needs 9.0 or newer"
    return None


def programmatic_launches() -> dict:
    """Make the CUDA wrapper's ``launchKernel`` a programmatic launch for the rest of this process
    (the package child, before it compiles); what the record keeps of it."""
    import torch
    from torch._inductor.codegen.cuda import device_op_overrides

    capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    if (refusal := capability_refusal(capability)) is not None:
        raise ConfigError(
            f"export.programmatic_launch.cuda: {refusal}",
            hint="build on a Hopper (sm_90) or newer GPU, or set export.programmatic_launch.cuda to false",
        )
    overrides = device_op_overrides.CUDADeviceOpOverrides
    original = overrides.kernel_driver
    if MARK in original(overrides()):
        return {"launch": "programmatic", "capability": list(capability)}
    programmatic_source(original(overrides()))  # refused here, before anything compiles

    def kernel_driver(self) -> str:
        return programmatic_source(original(self))

    overrides.kernel_driver = kernel_driver
    return {"launch": "programmatic", "capability": list(capability)}
