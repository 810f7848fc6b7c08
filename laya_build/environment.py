"""The toolchain and machine a build runs on: what its up-to-date checks compare, what its
records snapshot, and what it can build here.

Up-to-date checks (read without importing anything heavy):

* Distributions: the third-party packages a stage imports (found by :mod:`laya_build.deps`),
  mapped to their distributions (``tvm_ffi`` -> ``apache-tvm-ffi``) and closed over their
  own requirements (torch.export's output depends on sympy's version too), each with its
  installed version from ``importlib.metadata``.
* Tools: compilers a stage runs (``cc``, ``cxx``, ``nvcc``), identified by the first line of
  ``<tool> --version`` (the last for nvcc, whose first line is a banner).
* Python itself.

Everything is computed at most once per process (one ``doit`` invocation) and only when an
up-to-date check asks: ``doit list`` pays nothing.

Snapshots for records (:func:`versions`, :func:`device_snapshot`,
:func:`env_info` with ``torch.utils.collect_env``, :func:`nvidia_smi_q`) and support checks
(:func:`unsupported_reason`: missing CUDA, AOTInductor APIs or C++ compiler become explicit
skip records, never silent passes).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata as md
import os
import platform
import re
import shutil
import subprocess
import sys

# Compilers by role: the environment variable that overrides them, then the names tried.
TOOLS = {
    "cc": ("CC", ("cc", "gcc", "clang")),
    "cxx": ("CXX", ("g++", "c++", "clang++")),
    "nvcc": (None, ("nvcc",)),
}


@functools.lru_cache(maxsize=1)
def _packages_distributions() -> dict[str, tuple[str, ...]]:
    return {k: tuple(v) for k, v in md.packages_distributions().items()}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def _requirements(dist: str) -> tuple[str, ...]:
    """Names of ``dist``'s unconditional requirements (no extras) that are installed."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        reqs = md.requires(dist) or []
    except md.PackageNotFoundError:
        return ()
    out = []
    for text in reqs:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        out.append(_canonical(req.name))
    return tuple(out)


@functools.cache
def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


@functools.cache
def distributions(imports: frozenset[str]) -> dict[str, str | None]:
    """{distribution: installed version} for the top-level ``imports`` and everything they
    require (transitively).  Imports with no distribution (a package bundled inside another,
    like TileLang's ``tvm``) are covered by the distribution that ships them."""
    mapping = _packages_distributions()
    todo = [_canonical(d) for name in imports for d in mapping.get(name, ())]
    out: dict[str, str | None] = {}
    while todo:
        dist = todo.pop()
        if dist in out:
            continue
        out[dist] = _version(dist)
        todo.extend(_requirements(dist))
    return dict(sorted(out.items()))


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the platform tells it)."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def tool_path(role: str) -> str | None:
    """The compiler of a role of :data:`TOOLS` (its environment variable, else the first of
    its names on PATH); None where there is none."""
    env_var, names = TOOLS[role]
    candidates = [os.environ[env_var]] if env_var and os.environ.get(env_var) else list(names)
    return next((found for name in candidates if (found := shutil.which(name))), None)


@functools.cache
def _version_lines(exe: str) -> list[str] | str:
    """The non-empty lines ``<exe> --version`` prints, or the name of the error that stopped it."""
    try:
        proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return type(exc).__name__
    return [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]


@functools.cache
def tool_identity(role: str) -> str | None:
    """First (nvcc: last) line of ``<compiler> --version`` for a role of :data:`TOOLS`;
    None where no such compiler is installed."""
    exe = tool_path(role)
    if exe is None:
        return None
    lines = _version_lines(exe)
    if isinstance(lines, str):
        return f"{exe}: {lines}"
    if not lines:
        return exe
    return f"{exe}: {lines[-1] if role == 'nvcc' else lines[0]}"


def fingerprint(imports: frozenset[str], tools: tuple[str, ...]) -> dict:
    """What the up-to-date check of a stage compares: python, distributions, compilers."""
    return {
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "distributions": distributions(frozenset(imports)),
        "tools": {role: tool_identity(role) for role in sorted(tools)},
    }


def describe_changes(old: dict, new: dict) -> list[str]:
    """Human-readable differences between two fingerprints (for ``doit info``)."""
    changes = []
    if old.get("python") != new.get("python"):
        changes.append(f"python {old.get('python')} -> {new.get('python')}")
    for kind in ("distributions", "tools"):
        before, after = old.get(kind, {}), new.get(kind, {})
        for name in sorted(set(before) | set(after)):
            if before.get(name) != after.get(name):
                changes.append(f"{name} {before.get(name, 'absent')} -> {after.get(name, 'absent')}")
    return changes


# ------------------------------------------------------------------ snapshots for records


def versions() -> dict:
    """Versions of the stack (from metadata: initialising no CUDA)."""
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": _version("transformers"),
        "tokenizers": _version("tokenizers"),
        "safetensors": _version("safetensors"),
        "tilelang": _version("tilelang"),
        "platform": platform.platform(),
        "cxx": tool_line("cxx"),
    }


def tool_line(role: str) -> str | None:
    """The identifying line of a role's compiler (first line of ``--version``; nvcc: the
    last), found as the up-to-date checks find it (:func:`tool_path`)."""
    exe = tool_path(role)
    lines = _version_lines(exe) if exe else []
    if not lines or isinstance(lines, str):
        return None
    return lines[-1] if role == "nvcc" else lines[0]


@functools.cache
def installed() -> dict[str, tuple[str, str]]:
    """Every installed distribution on this process's ``sys.path``: canonical name -> (its
    ``Name``, version), the first of a name (the one an import finds, and the one pip lists).
    Read once per process; in a fresh interpreter (the release and package processes) the
    distributions pip lists, while a path added since (``setuptools`` puts its vendored
    packages on ``sys.path`` when imported) adds its own."""
    first: dict[str, tuple[str, str]] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name:
            first.setdefault(_canonical(name), (name, dist.version))
    return first


PIP_SKIPS = frozenset({"python", "wsgiref", "argparse"})  # pip's own stdlib_pkgs: never listed


def _pip_version(version: str) -> str:
    """A version as pip prints it: normalised (``1.0-rc1`` -> ``1.0rc1``), else as written."""
    from packaging.version import InvalidVersion, Version

    try:
        return str(Version(version))
    except InvalidVersion:
        return version


def pip_list_freeze() -> str:
    """What ``python -m pip list --format=freeze`` prints for this interpreter, read from the
    installed distributions' metadata (:func:`installed`): one ``Name==version`` line per
    distribution but pip's own skips, versions normalised as pip prints them, sorted by canonical
    name as pip sorts.  The same text without starting pip (2 s on the project's CPU machine);
    tests/pipeline/test_release_environment.py compares it with pip's."""
    return "\n".join(
        f"{name}=={_pip_version(version)}"
        for key, (name, version) in sorted(installed().items())
        if key not in PIP_SKIPS
    )


@contextlib.contextmanager
def _pip_list_answered(collect_env):
    """``collect_env`` with its one ``pip list`` answered by :func:`pip_list_freeze`; every
    other command it runs (and a ``pip list`` it asks in another form) is run as it asks."""
    run = collect_env.run
    pip_list = [sys.executable, "-mpip", "list", "--format=freeze"]

    def answered(command):
        return (0, pip_list_freeze(), "") if command == pip_list else run(command)

    collect_env.run = answered
    try:
        yield
    finally:
        collect_env.run = run


def collect_env_info() -> dict:
    """``torch.utils.collect_env.get_env_info()`` as a dict (its ``pip list`` from metadata)."""
    from torch.utils import collect_env

    with _pip_list_answered(collect_env):
        return dict(collect_env.get_env_info()._asdict())


def snapshot(tvm_version: str | None = None) -> dict:
    """The build environment a release's manifest records: torch's own ``collect_env``, the
    versions of the stack, TVM's (``tvm_version``: the caller imports TileLang's TVM to ask it,
    so that no stage that snapshots its environment depends on TileLang), the compilers (found
    as the up-to-date checks find them) and the GPU."""
    return {
        "collect_env": collect_env_info(),
        "python": platform.python_version(),
        "packages": {d: _version(d) for d in ("torch", "tilelang", "transformers", "tokenizers", "doit", "jsonschema")},
        "tvm": tvm_version,
        "cc": tool_line("cc"),
        "cxx": tool_line("cxx"),
        "nvcc": tool_line("nvcc"),
        "nvidia_smi": nvidia_smi_q(),
    }


def env_info() -> str | None:
    """``torch.utils.collect_env``'s report (informational: a failure is recorded, not raised)."""
    try:
        from torch.utils import collect_env

        with _pip_list_answered(collect_env):
            return collect_env.get_pretty_env_info()
    except Exception as exc:  # informational only
        return f"collect_env failed: {type(exc).__name__}: {exc}"


def nvidia_smi_q() -> str | None:
    """``nvidia-smi -q`` where there is one (None without a GPU driver or on failure)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    out = subprocess.run([smi, "-q"], capture_output=True, text=True, check=False, timeout=60)
    return out.stdout if out.returncode == 0 else None


def device_snapshot(target: str) -> dict:
    """The machine the artifact was built on: CPU, and ``nvidia-smi -q`` where there is one."""
    return {
        "target": target,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count() or 1,
        "nvidia_smi_q": nvidia_smi_q(),
    }


# ------------------------------------------------------------------------- support checks


def cuda_unavailable_reason() -> str | None:
    """Why CUDA cannot be used here, or None.  Asks NVML, so the calling process (possibly
    a fork server's child) does not initialise CUDA."""
    import torch

    if not torch.version.cuda:
        return f"torch {torch.__version__} is a CPU-only build (no CUDA)"
    saved = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        available = torch.cuda.is_available()
    finally:
        if saved is None:
            os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
        else:
            os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = saved
    return None if available else "no CUDA device is visible"


def unsupported_reason(target: str, *, aoti: bool = False) -> str | None:
    """Why ``target`` cannot be built here (missing CUDA; with ``aoti``, missing AOTInductor
    APIs or C++ compiler), or None when it can."""
    from laya_build.targets import check_target

    check_target(target)
    if target == "cuda" and (reason := cuda_unavailable_reason()):
        return f"target cuda: {reason}"
    if aoti:
        import torch._inductor as inductor

        missing = [api for api in ("aoti_compile_and_package", "aoti_load_package") if not hasattr(inductor, api)]
        if missing:
            return f"torch {__import__('torch').__version__} lacks torch._inductor.{', '.join(missing)}"
        if tool_path("cxx") is None:
            wanted = os.environ.get("CXX") or "g++/c++/clang++"
            return f"no C++ compiler found ({wanted}); AOTInductor needs one"
    return None
