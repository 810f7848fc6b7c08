"""The cache key of a stage task: a digest of everything that shapes its outputs' bytes.

The same things its up-to-date check compares, taken so that two checkouts in different
folders (or on different machines of one type) get the same key for the same build:

* the project files of its import closure and its schemas, **by content** and relative name;
* the files it reads (its inputs), by content;
* its configuration slice and the version it builds into; its function's arguments (the
  ``spec``) with the checkout's folder written as ``<root>``;
* the toolchain: Python, the distributions it imports (and their requirements), its compilers;
* the machine type: the architecture and, for stages that compile native code for this CPU
  (their ``TOOLS`` name a C++ compiler), its vector features; for a stage dispatched to other
  machines, the resource it asks for instead, and for a stage bound to ``cuda`` built here, the
  resource a worker with this machine's GPU offers (``laya_target:cuda-sm90``:
  :func:`laya_build.executors.key_resource`), so that GPUs of two architectures never share a key.

Never the checkout's absolute path, a time or a host name.  Computing a key reads no heavy
module (no torch): files are hashed once while they are unchanged (:mod:`laya_build.filedigests`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
from pathlib import Path

from laya_build import environment, filedigests
from laya_build.stage import Stage

KEY_FORMAT = 1  # bumped when what a key covers changes
ROOT_MARK = "<root>"
RUN_PART = "run"  # in the key of a stage run on the cluster every time (verify): that run's id
# CPU features that change what a C++ compiler emits with -march=native (Inductor's names).
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "amx_tile", "asimd", "sve")


def file_sha(path: Path) -> str | None:
    try:
        return filedigests.sha256(path)
    except FileNotFoundError:
        return None


@functools.cache
def cpu_features() -> list[str]:
    """The vector features of this CPU that native code depends on (from /proc/cpuinfo)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return []
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            flags = set(value.split())
            return [f for f in ISA_FLAGS if f in flags]
    return []


def machine(stage_tools: tuple[str, ...], resource: str | None = None) -> dict:
    """The machine type a stage's bytes depend on (see the module's docstring)."""
    if resource is not None:
        return {"arch": platform.machine(), "resource": resource}
    native = "cxx" in stage_tools
    return {"arch": platform.machine(), **({"cpu_features": cpu_features()} if native else {})}


def relative(value, root: Path):
    """``value`` (JSON) with the checkout's folder written as ``<root>``."""
    text = json.dumps(value, sort_keys=True, default=str)
    base = str(root)
    text = text.replace(f'"{base}/', f'"{ROOT_MARK}/').replace(f'"{base}"', f'"{ROOT_MARK}"')
    return json.loads(text)


def rel_name(path: Path, root: Path) -> str:
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except ValueError:
        return str(path)


def key_parts(
    root: Path,
    stage: Stage,
    *,
    code: list[str],
    version: str,
    third_party: frozenset[str],
    tools: tuple[str, ...],
    resource: str | None = None,
) -> dict:
    """What the key of ``stage`` digests, as a JSON document (what ``doit info`` would compare)."""
    root = Path(root).resolve()
    return {
        "format": KEY_FORMAT,
        "task": stage.task,
        "entry": stage.entry,
        "process": stage.process,
        "code": {rel_name(Path(f), root): file_sha(Path(f)) for f in code},
        "inputs": {rel_name(Path(f), root): file_sha(Path(f)) for f in stage.inputs},
        "config": relative({**stage.config, "version": version}, root),
        "spec": relative(stage.spec, root),
        "sys_path": relative(list(stage.sys_path), root),
        "outputs": {
            "files": [rel_name(f, root) for f in stage.targets],
            "dirs": [rel_name(d, root) for d in stage.dirs],
        },
        "toolchain": environment.fingerprint(frozenset(third_party), tuple(tools)),
        "machine": machine(tuple(tools), resource),
    }


def digest(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def differences(mine: dict, theirs: dict) -> list[str]:
    """Which parts of two keys differ, and in what (for a worker that refuses a stage)."""
    out = []
    for part in sorted(set(mine) | set(theirs)):
        a, b = mine.get(part), theirs.get(part)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            names = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            out.append(f"{part}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}")
        else:
            out.append(part)
    return out
