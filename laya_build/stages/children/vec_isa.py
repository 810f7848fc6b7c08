"""Inductor's CPU vector-ISA check, paid once per torch, compiler and CPU (the compile and
latency children ask it before compiling)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path

import torch

from laya_build.runtime.serving import cpu_isa_flags


def _compiler_identity() -> str:
    from torch._inductor.cpp_builder import get_cpp_compiler

    cxx = get_cpp_compiler()
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    return f"{cxx}: {(out.stdout.splitlines() or [''])[0]}"


def vec_isa_key() -> str:
    """What Inductor's answer to "which CPU vector ISAs can be built and loaded here" depends
    on: torch, the C++ compiler, the CPU's vector features and the architecture."""
    facts = {
        "torch": torch.__version__,
        "cxx": _compiler_identity(),
        "cpu": cpu_isa_flags(),
        "machine": platform.machine(),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]


def check_vec_isas(root) -> list[str]:
    """Inductor's own check of the CPU vector ISAs (``cpu_vec_isa.valid_vec_isa_list``: a dry
    compile and load of a test kernel per ISA, ~12 s), run with its cache at
    ``root/<vec_isa_key()>`` instead of the process's ``TORCHINDUCTOR_CACHE_DIR``.

    The check's products are keyed by their source and flags, so a later process with the same
    torch, compiler and CPU finds them built and only loads them (Inductor's own warm-cache
    path): the answer is Inductor's, paid once per toolchain instead of once per compile.  The
    answer stays cached in this process (torch caches it), so the compile that follows asks
    nothing again; the build's own (empty) cache is untouched.  Serialised by a lock."""
    from torch._inductor import cpu_vec_isa

    folder = Path(root) / vec_isa_key()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.with_suffix(".lock"), "w") as lock, _env("TORCHINDUCTOR_CACHE_DIR", str(folder)):
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]
        picked = str(cpu_vec_isa.pick_vec_isa())
    print(f"CPU vector ISAs: {', '.join(found) or 'none'} (picked {picked or 'none'}; checked in {folder})", flush=True)
    return found


@contextlib.contextmanager
def _env(name: str, value: str):
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
