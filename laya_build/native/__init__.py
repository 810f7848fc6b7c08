"""The project's native op library (``laya_native``): built by an export, shipped beside its package.

AOTInductor compiles the ops it knows into the package; a custom op written in C++ it calls
through torch's dispatcher, so the library that registers the op must be loaded into the
process before the package (``Could not find schema for laya_native::linear`` otherwise).  The
library is one C++ file, :data:`SOURCE`, compiled against the installed torch's headers by the
C++ compiler of the ``cxx`` role (:func:`laya_build.environment.tool_path`) with fixed flags and
without debug information: the same source, compiler and torch give the same bytes, wherever
the checkout and the environment live (``-ffile-prefix-map``; no run path: ``c10``, ``torch_cpu``
and the C++ runtime are found among the libraries the loading process has already loaded).

Who reads what:

* the export stage builds the library into its folder when ``export.native_linears.<target>``
  names layers (:func:`build`), loads it (:func:`laya_build.runtime.serving.load_library`) and
  records it (``native_library`` in ``export.json``);
* the package stage copies it beside ``decision.pt2`` and records it in ``aoti_package.json``; a
  release lists it in its manifest like every other file;
* every process that loads the package (the package child's load back, ``verify``, the
  runtime) checks its sha256 against the record, then loads it, before the package.

The compile runs in a process of its own (:func:`laya_build.runner.run`): a timeout ends the
compiler with it.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from laya_build.atomic import atomic_path
from laya_build.environment import tool_line, tool_path
from laya_build.errors import StageError
from laya_build.layout import NATIVE_BUILD_LOG_NAME, NATIVE_LIBRARY_NAME
from laya_build.records import file_entry, sha256_file

SOURCE = Path(__file__).with_name("laya_native.cpp")
SOURCE_REL = "laya_build/native/laya_native.cpp"  # how the library's strings name its source
NAMESPACE = "laya_native"
STANDARD = "-std=c++20"
FLAGS = (STANDARD, "-O2", "-fPIC", "-shared", "-w")  # and the ABI define, the prefix maps, the include folders
LIBRARIES = ("-lc10", "-ltorch_cpu", "-ldl")
TIMEOUT_S = 600


def compile_command(out: Path) -> list[str]:
    """The compiler's command line that writes the library to ``out``."""
    import torch
    from torch.utils import cpp_extension

    cxx = tool_path("cxx")
    if cxx is None:
        raise StageError(
            "export.native_linears names layers, which needs the project's native op library, and no C++ "
            "compiler was found (CXX, g++, c++, clang++)",
            hint="install g++ (or name a compiler in CXX), or leave export.native_linears of this target empty",
        )
    torch_root = Path(torch.__file__).resolve().parent
    return [
        cxx,
        *FLAGS,
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        f"-ffile-prefix-map={SOURCE.parent.resolve()}={Path(SOURCE_REL).parent}",
        f"-ffile-prefix-map={torch_root}=torch",
        *(f"-isystem{d}" for d in cpp_extension.include_paths()),
        str(SOURCE.resolve()),
        "-o",
        str(out),
        *(f"-L{d}" for d in cpp_extension.library_paths()),
        *LIBRARIES,
        *loaded_cxx_runtime(),
    ]


def loaded_cxx_runtime() -> list[str]:
    """The C++ runtime this process (torch) has loaded, to link against by name: a compiler whose
    own runtime is only a static archive would otherwise put a private copy of it into the
    library, whose streams and locale torch's never set up (seen: a GCC whose libstdc++ is
    static, and a crash in the op's first message)."""
    for line in Path("/proc/self/maps").read_text().splitlines() if Path("/proc/self/maps").is_file() else ():
        path = line.split()[-1]
        if "/libstdc++.so" in path and Path(path).is_file():
            return [path]
    return []


def compile_library(command: list[str], log: str) -> None:
    """Run the compiler (in the runner's child: its process group ends with a timeout)."""
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    Path(log).write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise StageError(
            f"compiling the native op library ({SOURCE_REL}) failed with exit status {proc.returncode}:\n{tail}",
            hint=f"{log} has the compiler's whole output",
        )


def build(out_dir) -> dict:
    """Compile :data:`SOURCE` into ``out_dir``/:data:`NATIVE_LIBRARY_NAME` (written under a
    temporary name, renamed when whole) and describe it for the export record."""
    import torch

    from laya_build.runner import Child, run

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    final = out / NATIVE_LIBRARY_NAME
    start = time.perf_counter()
    with atomic_path(final) as tmp:
        command = compile_command(tmp)
        run(
            "laya_build.native:compile_library",
            {"command": command, "log": str(out / NATIVE_BUILD_LOG_NAME)},
            Child(timeout=TIMEOUT_S, reraise=True, label=f"the C++ compile of {SOURCE_REL}"),
        )
    return {
        **file_entry(final, out),
        "source": {"path": SOURCE_REL, "sha256": sha256_file(SOURCE)},
        "compiler": tool_line("cxx"),
        "flags": [*FLAGS, *LIBRARIES],
        "torch": torch.__version__,
        "build_s": round(time.perf_counter() - start, 4),
    }
