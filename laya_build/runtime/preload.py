"""What a process loads before it loads a package (``<stage>.preload.<target>``; standard library only).

An entry is a module to import (``tilelang``, ``tvm_ffi``) or ``lib:<package>``: only the native
library a package ships as ``<package>/lib/lib<package>.so``, loaded with ``RTLD_GLOBAL`` and
without importing the package (``lib:tvm_ffi``: 1 ms, where ``import tilelang`` takes about 2.8 s).
Why a GPU image may need one: docs/guides/gpu-builds.md, "Preloads".  An entry that is not
installed is reported missing, not an error: the same configuration serves machines with and
without the preloaded package.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
from pathlib import Path

LIB_PREFIX = "lib:"


def library_of(package: str) -> Path | None:
    """``<package>/lib/lib<name>.so`` of an installed package (``name``: its last component),
    found without importing it (a dotted name's parent packages are imported to find it); None
    where the package or the file is missing."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    for where in locations:
        lib = Path(where) / "lib" / f"lib{package.rsplit('.', 1)[-1]}.so"
        if lib.is_file():
            return lib
    return None


def preload(name: str) -> bool:
    """Load one entry; False (nothing done) when it is not installed."""
    if name.startswith(LIB_PREFIX):
        lib = library_of(name[len(LIB_PREFIX) :])
        if lib is None:
            return False
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        return True
    if importlib.util.find_spec(name) is None:
        return False
    importlib.import_module(name)
    return True


def preload_all(names) -> dict:
    """Load every entry in order: ``{"imported": [...], "missing": [...]}``."""
    done, missing = [], []
    for name in names:
        (done if preload(name) else missing).append(name)
    return {"imported": done, "missing": missing}
