"""Triton launch configurations of a package build, decided once and then an input.

Inductor tunes each Triton kernel that has several candidate launch configurations by timing
them on the device while it compiles (``XBLOCK``/``R0_BLOCK``, ``num_warps``, ``num_stages``), and
writes the winner beside the kernel's source in its cache as ``<kernel>.best_config``.  Timings
vary from run to run, so two compiles of one exported program can pick different winners, and
the launch configuration is compiled into the package (the ``.cubin`` files, the wrapper's
launch calls): two builds of one export would give different ``decision.pt2`` bytes.

A *tuning file* holds the winners of one build: the cache-relative path of every
``.best_config`` (the kernel source's hash and the torch key name it) and the configuration,
without the tuning time.  The package child harvests one from its cache after every compile
(:func:`harvest`), and, when ``package.tuning.<target>-<dtype>`` names one, writes it into the
fresh cache first (:func:`seed`), so that Inductor reads each kernel's configuration instead of
timing candidates: the same export and tuning file then give the same package bytes.  Entries
of other kernels are never read; a kernel that the file does not hold is tuned as usual and
reported (``autotuned``).

This module imports neither torch nor Inductor (the stage's parent process reads the files).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from laya_build.errors import ConfigError

FILE = "tuning.json"  # beside a build's packages
# beside it, one <kernel name>.py each: the Inductor source of every kernel this compile configured
# from a tuning entry (what a later build's untuned kernels are compared with) ...
SOURCES_DIR = "kernel-sources"
# ... and, when a compile with a tuning file had to tune kernels the file lacks, those kernels'
UNTUNED_DIR = "untuned-kernels"
FORMAT = "laya-build triton tuning 1"
SUFFIX = ".best_config"
# Fields of a .best_config that are no launch configuration: how long tuning took (varies
# from run to run) and Triton's cache hash of the compiled winner (Inductor ignores both when
# it reads an entry back).
VOLATILE = ("time_taken_ms", "triton_cache_hash")


def padding_refusal(inductor_configs: dict, build: str) -> str | None:
    """Why ``package.inductor_configs`` cannot go with a tuning file for ``build`` (None: it can):
    ``shape_padding: true`` lets a compile-time timing decide whether a GEMM is padded, so two
    compiles can make different programs (the compile child turns it off otherwise)."""
    if not (inductor_configs or {}).get("shape_padding"):
        return None
    return (
        f"true has Inductor time GEMMs padded and not while it compiles, so two compiles can make "
        f"different programs; package.tuning.{build} makes that build's bytes reproducible, which "
        "timings must not decide: remove shape_padding (the compile turns it off) or that tuning file"
    )


def harvest(cache_dir) -> dict[str, dict]:
    """Every ``.best_config`` under ``cache_dir``: cache-relative POSIX path -> its launch
    configuration (without :data:`VOLATILE` fields), sorted by path."""
    root = Path(cache_dir)
    entries = {}
    for path in sorted(root.rglob(f"*{SUFFIX}")):
        data = json.loads(path.read_text())
        entries[path.relative_to(root).as_posix()] = {k: v for k, v in sorted(data.items()) if k not in VOLATILE}
    return entries


def seed(cache_dir, entries: dict[str, dict]) -> int:
    """Write ``entries`` (from :func:`harvest` or a tuning file) into the empty ``cache_dir``
    where Inductor looks for them; returns how many."""
    root = Path(cache_dir).resolve()
    for rel, data in entries.items():
        path = (root / rel).resolve()
        if root not in path.parents or not rel.endswith(SUFFIX):
            raise ConfigError(f"tuning entry {rel!r}: not a {SUFFIX} path inside the compile cache")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
    return len(entries)


def document(entries: dict[str, dict], *, torch_version: str, target: str, dtype: str) -> dict:
    """A tuning file's content: the entries and what they were tuned with."""
    return {"format": FORMAT, "torch": torch_version, "target": target, "dtype": dtype, "entries": entries}


def dumps(doc: dict) -> str:
    """A tuning file's bytes: sorted keys, one layout, so that one tuning gives one file."""
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def read(path, *, torch_version: str, target: str, dtype: str, key: str) -> dict[str, dict]:
    """The entries of the tuning file ``path`` (named by config key ``key``), checked against
    the build it is used for; every mismatch is a config error with what to do instead."""
    path = Path(path)
    redo = (
        f"unset {key} to tune afresh, then use the tuning.json that build writes beside its "
        "decision.pt2 (docs/concepts/reproducibility.md, CUDA packages)"
    )
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{key}: {path} does not exist; {redo}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{key}: {path} is no tuning file ({exc}); {redo}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), dict):
        raise ConfigError(f"{key}: {path} is no tuning file (format {FORMAT!r} expected); {redo}")
    want = {"torch": torch_version, "target": target, "dtype": dtype}
    for field, value in want.items():
        if doc.get(field) != value:
            raise ConfigError(
                f"{key}: {path} was tuned for {field} {doc.get(field)!r}, this build is {value!r} "
                f"(Inductor keys its entries by the torch build, so they would not be read); {redo}"
            )
    for rel, data in doc["entries"].items():
        if not isinstance(data, dict) or not rel.endswith(SUFFIX) or rel.startswith("/") or ".." in rel.split("/"):
            raise ConfigError(f"{key}: {path}: entry {rel!r} is no cache-relative {SUFFIX}; {redo}")
    return doc["entries"]


def compare(seeded: dict[str, dict], harvested: dict[str, dict]) -> dict:
    """What a compile did with a seeded tuning: entries it used or ignored, and the kernels it
    had to tune itself (entries that are new or other than the seeded ones)."""
    autotuned = sorted(k for k, v in harvested.items() if seeded.get(k) != v)
    return {
        "seeded": len(seeded),
        "entries": len(harvested),
        "autotuned": autotuned,
    }


def kernel_name(source: str) -> str | None:
    """The name of the Triton kernel an Inductor kernel module defines (``triton_...``), or None."""
    found = re.search(r"^def (triton_\w+)\(", source, re.MULTILINE)
    return found.group(1) if found else None


def write_sources(out, name: str, kernels: dict[str, dict]) -> Path | None:
    """Replace the folder ``out/name`` (:data:`SOURCES_DIR` or :data:`UNTUNED_DIR`) with the
    sources of ``kernels`` (entry -> ``{"name", "source"}``), one ``<name>.py`` each
    (``<name>-<entry>.py`` where two programs' kernels share a name); with none, remove it.
    Returns the folder or None."""
    folder = Path(out) / name
    shutil.rmtree(folder, ignore_errors=True)
    if not kernels:
        return None
    tmp = folder.with_name(f".{name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for rel, kernel in sorted(kernels.items()):
        path = tmp / f"{kernel['name'] or Path(rel).stem}.py"
        if path.exists():
            path = path.with_name(f"{path.stem}-{Path(rel).stem}.py")
        path.write_text(kernel["source"])
    tmp.rename(folder)
    return folder


def describe_path(path) -> str:
    """``path`` relative to the working directory where it lies below it (records stay
    portable between checkouts), else as given."""
    p = Path(path).resolve()
    try:
        return p.relative_to(Path(os.getcwd()).resolve()).as_posix()
    except ValueError:
        return str(path)
