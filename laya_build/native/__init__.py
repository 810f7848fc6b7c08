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

With ``cuda_kernels`` (a CUDA export with ``export.native_geglu`` or ``export.native_cutlass``)
the library also holds the CUDA kernels of ``laya_native::geglu_linear`` and of
``laya_native::linear``'s CUTLASS path: :data:`CUDA_SOURCE`, CUTLASS kernels for Hopper,
compiled by nvcc (the ``nvcc`` role) for ``sm_90a`` against CUTLASS's headers (:func:`cutlass_include`:
``CUTLASS_PATH``, else the copy TileLang ships) and linked in with the static CUDA runtime, so the
library still loads on a machine without CUDA.  The CUDA source compiles in a fixed number of
parts (its ``LAYA_PARTS``, :func:`cuda_parts`), one object each, all at the same time on the
cores the process may use, then linked in the parts' order: the same objects whatever the number
of cores.  nvcc names internal symbols after the absolute path of the file it compiles, so it
compiles a copy of the source at a path fixed by the source's content (:func:`fixed_source`); the
rest of its names come from a fixed seed, one a part (``-frandom-seed``), and its temporary file
names go with the symbol table (``-s``): the same sources, compilers, CUTLASS and torch give the
same bytes, wherever the checkout lives.

The compile runs in a process of its own (:func:`laya_build.runner.run`): a timeout ends the
compilers with it.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from laya_build.atomic import atomic_path
from laya_build.environment import tool_line, tool_path, usable_cores
from laya_build.errors import StageError
from laya_build.layout import NATIVE_BUILD_LOG_NAME, NATIVE_LIBRARY_NAME
from laya_build.records import file_entry, sha256_file

SOURCE = Path(__file__).with_name("laya_native.cpp")
SOURCE_REL = "laya_build/native/laya_native.cpp"  # how the library's strings name its source
CUDA_SOURCE = Path(__file__).with_name("laya_native.cu")
CUDA_SOURCE_REL = "laya_build/native/laya_native.cu"
CUDA_ARCH = "sm_90a"  # warpgroup MMA and TMA: Hopper's own instructions
NVCC_FLAGS = (
    "-std=c++17",
    "-O3",
    f"-gencode=arch=compute_{CUDA_ARCH[3:]},code={CUDA_ARCH}",
    "--expt-relaxed-constexpr",
    "-DNDEBUG",
    "-w",
    "-frandom-seed=laya_native",
    "-Xcompiler=-fPIC",
)
CUDA_LINK = ("-lcudart_static", "-lrt", "-lpthread", "-s")  # and -s: nvcc's temporary file names go
NAMESPACE = "laya_native"
STANDARD = "-std=c++20"
FLAGS = (STANDARD, "-O2", "-fPIC", "-shared", "-w")  # and the ABI define, the prefix maps, the include folders
LIBRARIES = ("-lc10", "-ltorch_cpu", "-ldl")
TIMEOUT_S = 600


def compile_command(out: Path, cuda_objects: Sequence[Path] = ()) -> list[str]:
    """The compiler's command line that writes the library to ``out``, linking in the CUDA
    kernels' objects ``cuda_objects`` (:func:`cuda_compile_command`), in their order, when given."""
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
    cuda = [*map(str, cuda_objects), f"-L{cuda_library_dir()}", *CUDA_LINK] if cuda_objects else []
    return [
        cxx,
        *FLAGS,
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        f"-ffile-prefix-map={SOURCE.parent.resolve()}={Path(SOURCE_REL).parent}",
        f"-ffile-prefix-map={torch_root}=torch",
        *(f"-isystem{d}" for d in cpp_extension.include_paths()),
        str(SOURCE.resolve()),
        *cuda,
        "-o",
        str(out),
        *(f"-L{d}" for d in cpp_extension.library_paths()),
        *LIBRARIES,
        *loaded_cxx_runtime(),
    ]


_CUDA_HINT = "or turn export.native_geglu.cuda off and empty export.native_cutlass.cuda"
_CUDA_WHAT = "the native library's CUDA kernels (export.native_geglu.cuda, export.native_cutlass.cuda)"


def nvcc() -> str:
    """The CUDA compiler of the ``nvcc`` role, or a ``StageError`` that says what to install."""
    found = tool_path("nvcc")
    if found is None:
        raise StageError(
            f"{_CUDA_WHAT} are compiled by nvcc, and no nvcc was found on PATH",
            hint=f"install the CUDA toolkit (nvcc 12.3 or later, for {CUDA_ARCH}), its bin on PATH, {_CUDA_HINT}",
        )
    return found


def cutlass_include() -> Path:
    """CUTLASS's ``include`` folder: ``$CUTLASS_PATH/include``, else the copy TileLang's wheel
    ships (``tilelang/3rdparty/cutlass``); a ``StageError`` where neither holds CUTLASS 3's
    headers."""
    env = os.environ.get("CUTLASS_PATH")
    if env:
        root, where = Path(env), f"CUTLASS_PATH={env}"
    else:
        from importlib.util import find_spec

        spec = find_spec("tilelang")
        origin = spec.origin if spec is not None else None
        root = Path(origin).parent / "3rdparty" / "cutlass" if origin else Path("tilelang-not-installed")
        where = "TileLang's copy of CUTLASS"
    include = root / "include"
    if not (include / "cutlass" / "gemm" / "collective" / "collective_builder.hpp").is_file():
        raise StageError(
            f"{_CUDA_WHAT} are CUTLASS kernels and {where} has no CUTLASS 3 headers "
            f"({include}/cutlass/gemm/collective/collective_builder.hpp)",
            hint=f"install the pinned tilelang, or point CUTLASS_PATH at a CUTLASS 3.5+ checkout, {_CUDA_HINT}",
        )
    return include


def cuda_library_dir() -> Path:
    """The folder of the toolkit's static CUDA runtime (``libcudart_static.a``): among the
    library folders nvcc itself links from (``nvcc --dryrun``'s ``LIBRARIES``)."""
    import re
    import shlex

    exe = nvcc()
    proc = subprocess.run(
        [exe, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    folders = [
        Path(arg[2:])
        for line in (proc.stdout + proc.stderr).splitlines()
        if (found := re.match(r"#\$ LIBRARIES=(.*)", line))
        for arg in shlex.split(found.group(1))
        if arg.startswith("-L")
    ]
    for folder in folders:
        if (folder / "libcudart_static.a").is_file():
            return folder.resolve()
    raise StageError(
        f"the CUDA toolkit of {exe} has no libcudart_static.a in the folders nvcc links from "
        f"({', '.join(map(str, folders)) or 'none named by nvcc --dryrun'})",
        hint=f"install the toolkit's CUDA runtime development files, {_CUDA_HINT}",
    )


FIXED_ROOT = Path("/tmp/laya-native-src")


def fixed_source() -> Path:
    """A copy of :data:`CUDA_SOURCE` at ``/tmp/laya-native-src/<its sha256's first 16 digits>/``
    (written whole, under a temporary name, when missing), the same path on every machine for the
    same source."""
    digest = sha256_file(CUDA_SOURCE)
    copy = FIXED_ROOT / digest[:16] / CUDA_SOURCE.name
    if not (copy.is_file() and sha256_file(copy) == digest):
        copy.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(copy) as tmp:
            Path(tmp).write_bytes(CUDA_SOURCE.read_bytes())
    return copy


def cuda_parts() -> int:
    """How many parts :data:`CUDA_SOURCE` compiles in (its ``LAYA_PARTS``): one object each,
    compiled at the same time."""
    import re

    found = re.search(r"^#define LAYA_PARTS (\d+)$", CUDA_SOURCE.read_text(), re.MULTILINE)
    if found is None:
        raise StageError(
            f"{CUDA_SOURCE_REL} defines no LAYA_PARTS (how many parts its kernels compile in)",
            hint="restore the file from the release of laya-build it came with",
        )
    return int(found.group(1))


def cuda_compile_command(out: Path, part: int | None = None) -> list[str]:
    """nvcc's command line that compiles :data:`CUDA_SOURCE` (:func:`fixed_source`'s copy) into
    the object ``out``: its part ``part`` (``-DLAYA_PART``), or with None all of it."""
    exe = nvcc()
    include = cutlass_include()
    source = fixed_source()
    flags = list(NVCC_FLAGS)
    if part is not None:  # each part's own seed, and the part's define
        flags = [f"{f}.{part}" if f.startswith("-frandom-seed=") else f for f in flags] + [f"-DLAYA_PART={part}"]
    return [
        exe,
        *flags,
        f"-Xcompiler=-ffile-prefix-map={source.parent}={Path(CUDA_SOURCE_REL).parent}",
        f"-Xcompiler=-ffile-prefix-map={include.parent.resolve()}=cutlass",
        f"-isystem={include}",
        f"-isystem={include.parent / 'tools' / 'util' / 'include'}",
        "-c",
        str(source),
        "-o",
        str(out),
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


def run_together(commands: list[list[str]], jobs: int) -> tuple[list[tuple[int | None, str, float]], int | None]:
    """Run ``commands`` at the same time, ``jobs`` at most: each one's exit status (None: not
    started), output and seconds, in their order, and the index of the first that failed, or None.
    The first that fails ends the others, and those not started yet do not start."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    lock, running, failed = threading.Lock(), [], []

    def one(i: int) -> tuple[int | None, str, float]:
        with lock:
            if failed:
                return None, "not run: another compile of its step failed\n", 0.0
            start = time.perf_counter()
            proc = subprocess.Popen(commands[i], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            running.append(proc)
        output, _ = proc.communicate()
        with lock:
            if proc.returncode != 0 and not failed:
                failed.append(i)
                for other in running:
                    if other.poll() is None:
                        other.terminate()
        return proc.returncode, output, round(time.perf_counter() - start, 2)

    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(commands)))) as pool:
        results = list(pool.map(one, range(len(commands))))
    return results, (failed[0] if failed else None)


def compile_library(steps: list[list[list[str]]], log: str, jobs: int = 1) -> None:
    """Run the compilers, the commands of a step at the same time (:func:`run_together`) and the
    steps one after the other (in the runner's child: its process group, every compiler with it,
    ends with a timeout); their output, all of it, into ``log``, in the commands' order."""
    Path(log).write_text("")
    for step in steps:
        results, first = run_together(step, jobs)
        with open(log, "a") as f:
            for command, (code, output, seconds) in zip(step, results):
                f.write(f"$ {' '.join(command)}\n{output}# exit status {code} in {seconds} s\n")
        if first is not None:
            command, (code, output, _) = step[first], results[first]
            source = CUDA_SOURCE_REL if Path(command[0]).name.startswith("nvcc") else SOURCE_REL
            tail = "\n".join(output.strip().splitlines()[-15:])
            raise StageError(
                f"compiling the native op library ({source}) failed with exit status {code}:\n{tail}",
                hint=f"{log} has the compilers' whole output",
            )


def build(out_dir, *, cuda_kernels: bool = False) -> dict:
    """Compile :data:`SOURCE` (and with ``cuda_kernels`` :data:`CUDA_SOURCE`) into
    ``out_dir``/:data:`NATIVE_LIBRARY_NAME` (written under a temporary name, renamed when whole)
    and describe it for the export record."""
    import tempfile

    import torch

    from laya_build.runner import Child, run

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    final = out / NATIVE_LIBRARY_NAME
    start = time.perf_counter()
    cuda = {}
    with atomic_path(final) as tmp, tempfile.TemporaryDirectory(dir=out, prefix=".cuda-") as objects:
        steps, objs = [], []
        if cuda_kernels:
            objs = [Path(objects) / f"laya_native_cuda.{part}.o" for part in range(cuda_parts())]
            steps.append([cuda_compile_command(obj, part) for part, obj in enumerate(objs)])
            include = cutlass_include()
            cuda = {
                "cuda_source": {"path": CUDA_SOURCE_REL, "sha256": sha256_file(CUDA_SOURCE)},
                "cuda_compiler": tool_line("nvcc"),
                "cuda_flags": [*NVCC_FLAGS, *CUDA_LINK],
                "cuda_parts": len(objs),
                "cutlass": cutlass_version(include),
            }
        steps.append([compile_command(tmp, objs)])
        run(
            "laya_build.native:compile_library",
            {"steps": steps, "log": str(out / NATIVE_BUILD_LOG_NAME), "jobs": usable_cores()},
            Child(
                timeout=TIMEOUT_S,
                reraise=True,
                label=f"the compile of {SOURCE_REL}" + (f" and {CUDA_SOURCE_REL}" if cuda_kernels else ""),
            ),
        )
    return {
        **file_entry(final, out),
        "source": {"path": SOURCE_REL, "sha256": sha256_file(SOURCE)},
        "compiler": tool_line("cxx"),
        "flags": [*FLAGS, *LIBRARIES],
        **cuda,
        "torch": torch.__version__,
        "build_s": round(time.perf_counter() - start, 4),
    }


def cutlass_identity() -> str | None:
    """The version of the CUTLASS an export would compile against (:func:`cutlass_include`), or
    None where there is none: part of the up-to-date check of an export that compiles the CUDA
    kernels, so that another CUTLASS (another TileLang, or ``CUTLASS_PATH``) builds it again."""
    try:
        return cutlass_version(cutlass_include())
    except (StageError, OSError):
        return None


def cutlass_version(include: Path) -> str:
    """CUTLASS's version (``major.minor.patch``), from its ``cutlass/version.h``."""
    import re

    text = (include / "cutlass" / "version.h").read_text(errors="replace")
    parts = [re.search(rf"#define CUTLASS_{name} (\d+)", text) for name in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(p.group(1) if p else "?" for p in parts)
