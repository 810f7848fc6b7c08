"""The installed toolchain a stage's bytes depend on, read without importing it.

* Distributions: the third-party packages a stage imports (found by :mod:`laya_build.deps`),
  mapped to their distributions (``tvm_ffi`` -> ``apache-tvm-ffi``) and closed over their
  own requirements (torch.export's output depends on sympy's version too), each with its
  installed version from ``importlib.metadata``.
* Tools: compilers a stage runs (``cc``, ``cxx``, ``nvcc``), identified by the first line of
  ``<tool> --version`` (the last for nvcc, whose first line is a banner).
* Python itself.

Everything is computed at most once per process (one ``doit`` invocation) and only when an
up-to-date check asks: ``doit list`` pays nothing.
"""
from __future__ import annotations

import functools
import importlib.metadata as md
import os
import platform
import re
import shutil
import subprocess

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


@functools.lru_cache(maxsize=None)
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


@functools.lru_cache(maxsize=None)
def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
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


@functools.lru_cache(maxsize=None)
def tool_identity(role: str) -> str | None:
    """First (nvcc: last) line of ``<compiler> --version`` for a role of :data:`TOOLS`;
    None where no such compiler is installed."""
    env_var, names = TOOLS[role]
    candidates = [os.environ[env_var]] if env_var and os.environ.get(env_var) else list(names)
    exe = next((found for name in candidates if (found := shutil.which(name))), None)
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{exe}: {type(exc).__name__}"
    lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
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
