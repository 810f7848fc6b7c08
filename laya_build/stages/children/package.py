"""The aoti_package stage's child process: compile each exported program into a ``.pt2``.

Run by :func:`laya_build.runner.run` (``compile_packages(job)``) in a fresh interpreter with
a fresh, empty ``TORCHINDUCTOR_CACHE_DIR``.  It first writes the job's Triton tuning entries
into that cache (:mod:`laya_build.stages.package_tuning`), so that Inductor reads the launch
configurations instead of timing candidates, and harvests every entry after compiling; what
else it fixes for reproducible bytes is :mod:`laya_build.stages.children.determinism`.  For
every program it loads ``exported.pt2``,
calls ``torch._inductor.aoti_compile_and_package`` and loads the package back (after
importing the ``preload`` modules, see :func:`laya_build.runtime.serving.preload_modules`), reporting
compile and load times (parity is the fresh-process verify stage's job).  An export that calls
the project's native ops (:mod:`laya_build.native`) has its library checked and loaded first.
"""

from __future__ import annotations

import faulthandler
import os
import time
from pathlib import Path

import torch
import torch._inductor

from laya_build.environment import env_info
from laya_build.runtime.formats import list_tree
from laya_build.runtime.serving import preload_modules
from laya_build.stages import package_tuning
from laya_build.stages.children import determinism
from laya_build.stages.children.vec_isa import check_vec_isas


def restore_symbol_hints(ep) -> list[str]:
    """Give back the example-value hints that ``torch.export.load`` drops for derived dims.

    torch 2.13's deserialiser stores a dim's hint under the whole expression
    (``16*s46: 64``) but never under its root symbol (``s46``), so Inductor later fails with
    ``RuntimeError: ('unexpected None!', 512*s46**2)`` when it sizes a buffer of the
    ``16 * Dim("tokens16")`` axis.  Each missing root hint is solved from an expression of
    that symbol alone (``16*s46 == 64`` -> ``s46 = 4``).  A no-op where nothing is missing.
    """
    import sympy

    shape_env = next(
        (
            d.node.shape_env
            for n in ep.graph.nodes
            if n.op == "placeholder"
            for d in getattr(n.meta.get("val"), "shape", ())
            if isinstance(d, torch.SymInt)
        ),
        None,
    )
    if shape_env is None:
        return []
    backed = hasattr(shape_env, "backed_var_to_val")  # torch >= 2.11 deprecates var_to_val
    hints = shape_env.backed_var_to_val if backed else shape_env.var_to_val
    add = shape_env.add_backed_var_to_val if backed else shape_env.add_var_to_val
    restored = []
    for expr, value in list(hints.items()):
        if expr.is_Symbol or len(expr.free_symbols) != 1:
            continue
        sym = next(iter(expr.free_symbols))
        if sym in hints:
            continue
        roots = [r for r in sympy.solve(sympy.Eq(expr, value), sym) if r.is_integer and r > 0]
        if len(roots) == 1:
            add(sym, int(roots[0]))
            restored.append(f"{sym} = {roots[0]} (from {expr} = {value})")
    return restored


def compile_program(program: dict, job: dict) -> dict:
    from laya_build.model import attention  # its op, for torch.export.load

    attention.compile_through()
    ep = torch.export.load(program["exported"])
    restored = restore_symbol_hints(ep)
    start = time.perf_counter()
    path = torch._inductor.aoti_compile_and_package(
        ep, package_path=program["package_tmp"], inductor_configs=job["inductor_configs"] or None
    )
    package_s = time.perf_counter() - start
    print(f"compiled {path} in {package_s:.1f} s; loading it", flush=True)
    start = time.perf_counter()
    torch._inductor.aoti_load_package(path)
    load_s = time.perf_counter() - start
    return {"name": program["name"], "package_s": package_s, "load_s": load_s, "restored_hints": restored}


def kernel_sources(cache_dir, entries) -> dict[str, dict]:
    """For each tuning entry (a cache-relative ``.best_config``): the name and source of the
    Inductor kernel module it configures, the ``.py`` beside it whose autotune key (Inductor's
    own, :class:`AutotuneCache`) names that file.  Entries whose kernel is not found are left out."""
    from torch._inductor.runtime.autotune_cache import AutotuneCache

    meta = {"autotune_local_cache": True, "autotune_remote_cache": False}
    modules = {}  # folder -> entry file name -> the module it configures, each folder's keys made once
    found = {}
    for rel in entries:
        entry = Path(cache_dir, rel)
        if entry.parent not in modules:
            try:  # where Inductor's local autotune cache keeps each module's entry (create writes nothing)
                modules[entry.parent] = {
                    Path(AutotuneCache.create(meta, str(m), "").local_cache[1]).name: m
                    for m in sorted(entry.parent.glob("*.py"))
                }
            except Exception:  # noqa: BLE001  (another torch's internals: no names, the entries stay)
                return found
        if (module := modules[entry.parent].get(entry.name)) is not None:
            source = module.read_text()
            found[rel] = {"name": package_tuning.kernel_name(source), "source": source}
    return found


def compile_packages(job: dict) -> dict:
    faulthandler.enable()
    preloaded = preload_modules(job["preload"])
    check_vec_isas(job["vec_isa_root"])
    cache_dir = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    fixes = {
        "ptxas_source_mtime": determinism.fixed_mtime_ptxas(os.path.join(cache_dir, "ptxas-wrapper"), cache_dir),
        "int_array_targets_kept": determinism.keep_int_array_targets(),
        "no_timed_padding": determinism.no_timed_padding(job["inductor_configs"] or {}),
    }
    if (library := job.get("library")) is not None:  # before torch.export.load: the programs call its ops
        from laya_build.model.native_linear import register_fake
        from laya_build.runtime.serving import load_library

        load_library(library["path"], library["sha256"], what="export record")
        register_fake()
    seeded = job.get("tuning") or {}
    package_tuning.seed(cache_dir, seeded)
    programs = [compile_program(p, job) for p in job["programs"]]
    tuning = package_tuning.harvest(cache_dir)
    cache = list_tree(cache_dir)
    return {
        "programs": programs,
        "tuning": tuning,
        "tuning_use": package_tuning.compare(seeded, tuning),
        # the sources of the kernels the entries configure: with a tuning file, those of the
        # kernels it lacked are what to compare with the same kernels of a build that matched it
        "kernels": kernel_sources(cache_dir, sorted(tuning)),
        "determinism": fixes,
        "env_info": env_info(),
        "preload": preloaded,
        "cache": {"files": len(cache), "bytes": sum(f["bytes"] for f in cache)},
    }
