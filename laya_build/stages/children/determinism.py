"""What the package child does so that one export and one tuning file give one package's bytes
on CUDA (besides the seeded tuning, :mod:`laya_build.stages.package_tuning`).

Three things varied between two compiles of one export with the same launch configurations
(measured on an H200, torch 2.11, Triton 3.6: docs/measurements/aoti-h200.md, Reproducible bytes,
and docs/measurements/runtime-h200.md, "The rotary tables' halves gathered once a forward"):

* **Every ``.cubin``**, in two bytes: Triton compiles with line information (``ptxas
  -lineinfo``), the PTX names each kernel's source file (``.file 1 "<cache>/xx/<hash>.py"``,
  no time stamp), and ``ptxas`` writes that file's modification time into the cubin's DWARF
  line table.  Inductor writes the source at every compile, so the time differs; the cubins'
  names in the package are hashes of their bytes, so the wrapper that loads them changed too.
  :func:`fixed_mtime_ptxas` puts a ``ptxas`` in front of Triton's (``TRITON_PTXAS_PATH``) that
  sets the modification time of every source file the PTX names inside the compile cache to
  :data:`SOURCE_MTIME` first (the sources' bytes are already a function of the export: their
  names are hashes of them).
* **The wrapper's int-array declarations**: Inductor's C++ wrapper caches each size/stride
  array it declares under an ``id()``: torch 2.13 takes that of the object ``writeline`` is
  bound to, and the torch 2.11 builds behaved as if it took that of the bound method itself,
  a new object at every attribute access that dies after the call.  A later object can get a
  dead one's address and "find" its declaration: whether two allocations of one shape share an
  array depended on memory addresses.  :func:`keep_int_array_targets`
  keeps every ``writeline``, its object and graph alive while the wrapper is generated, so an
  ``id`` never comes back.

* **The graph itself, now and then**: Inductor's ``pad_mm`` pass (``shape_padding``, on by
  default) pads a GEMM's operands to aligned sizes where a timing at compile time says the padded
  GEMM is faster.  In one compile of the H200 package from its tuning file the act head's first
  GEMM (1,028 input features) was padded to 1,032: three more Triton kernels, which the file, made
  without them, lacked, so that build was refused.  :func:`no_timed_padding` turns the pass off
  unless ``package.inductor_configs`` sets ``shape_padding`` (the package stage refuses ``true``
  together with a tuning file).

Each returns what it did, for the package record.
"""

from __future__ import annotations

import functools
import os
import shlex
import stat
from pathlib import Path

SOURCE_MTIME = 315532800  # 1980-01-01T00:00:00Z, the earliest time a zip member can carry

# Sets the modification time of the kernel sources that the .ptx input names inside the
# compile cache, then runs the real ptxas with the same arguments.
PTXAS_WRAPPER = """#!/bin/sh
# ptxas with fixed source times (written by laya_build/stages/children/determinism.py)
real={real}
cache={cache}
for a in "$@"; do
  case "$a" in
    *.ptx)
      sed -n 's/^[[:space:]]*[.]file[^"]*"\\([^"]*\\)".*/\\1/p' "$a" |
        while IFS= read -r f; do
          case "$f" in "$cache"/*) touch -c -m -d @{mtime} "$f" ;; esac
        done ;;
  esac
done
exec "$real" "$@"
"""


def real_ptxas() -> str | None:
    """The ``ptxas`` Triton would run for this device: ``TRITON_PTXAS_PATH`` or Triton's own
    choice (None where Triton, its NVIDIA backend or a CUDA device is missing)."""
    if os.environ.get("TRITON_PTXAS_PATH"):
        return os.environ["TRITON_PTXAS_PATH"]
    try:
        import torch
        from triton.backends.nvidia.compiler import get_ptxas
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    try:
        tool = get_ptxas(major * 10 + minor)  # a knobs.NvidiaTool, or (path, version) in older Triton
    except TypeError:  # Triton versions with one ptxas for every architecture
        tool = get_ptxas()
    return tool[0] if isinstance(tool, tuple) else getattr(tool, "path", None)


def fixed_mtime_ptxas(folder, cache_dir) -> dict:
    """Write the wrapper into ``folder`` (a path that is the same for every build) and point
    ``TRITON_PTXAS_PATH`` at it, for this process and the compile workers it starts; it fixes
    the times of the sources under ``cache_dir`` (the compile cache)."""
    path = Path(folder) / "ptxas"
    current = os.environ.get("TRITON_PTXAS_PATH")
    if current and Path(current).resolve() == path.resolve() and path.is_file():
        return {"applied": True, "ptxas": current}  # already in front (never in front of itself)
    real = real_ptxas()
    if real is None:
        return {"applied": False, "reason": "no Triton NVIDIA backend or no CUDA device"}
    path.parent.mkdir(parents=True, exist_ok=True)
    text = PTXAS_WRAPPER.format(real=shlex.quote(real), cache=shlex.quote(str(cache_dir)), mtime=SOURCE_MTIME)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.environ["TRITON_PTXAS_PATH"] = str(path)
    return {"applied": True, "ptxas": real, "source_mtime": SOURCE_MTIME}


def keep_int_array_targets() -> dict:
    """Make the C++ wrapper's int-array cache keys unambiguous (see the module docstring).

    Wraps ``CppWrapperCpu.codegen_int_array_var`` where it keys its cache by ``id()``
    (``codegen_int_array_var_cache``); the wrapper only holds a reference to each
    ``writeline``, its object and the graph on the wrapper object, so the cache, the
    declarations and the generated code are Inductor's own."""
    try:
        from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    except ImportError:
        return {"applied": False, "reason": "no torch._inductor.codegen.cpp_wrapper_cpu"}
    original = CppWrapperCpu.codegen_int_array_var
    if getattr(original, "keeps_targets", False):
        return {"applied": True}
    if not hasattr(CppWrapperCpu, "_codegen_int_array_var_impl"):
        return {"applied": False, "reason": "this torch keys no int-array cache by id()"}

    @functools.wraps(original)
    def codegen_int_array_var(self, int_array, writeline, known_statically=False, graph=None):
        kept = self.__dict__.setdefault("_kept_int_array_targets", {})
        for target in (writeline, getattr(writeline, "__self__", None), graph):
            if target is not None:
                kept.setdefault(id(target), target)
        return original(self, int_array, writeline, known_statically, graph)

    codegen_int_array_var.keeps_targets = True
    CppWrapperCpu.codegen_int_array_var = codegen_int_array_var
    return {"applied": True}


def no_timed_padding(inductor_configs: dict) -> dict:
    """Turn Inductor's ``shape_padding`` off for the compiles of this process (see the module
    docstring), unless ``inductor_configs`` (``package.inductor_configs``) sets it."""
    if "shape_padding" in inductor_configs:
        return {
            "applied": False,
            "reason": f"package.inductor_configs sets shape_padding: {inductor_configs['shape_padding']}",
        }
    from torch._inductor import config

    config.shape_padding = False
    return {"applied": True}
