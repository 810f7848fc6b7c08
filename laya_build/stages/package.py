"""Stage ``aoti_package``: AOTInductor packages (``decision.pt2``) of an export stage's programs.

Compilation runs in a fresh interpreter (:mod:`laya_build.stages.children.package`, started by
:func:`laya_build.runner.run`): CUDA cannot be re-initialised
in a forked worker, a crashing native compiler must not take the build down, and memory
stays bounded.  The child gets its own initially empty ``TORCHINDUCTOR_CACHE_DIR`` in a temp
directory outside the artifacts, removed afterwards (compiler caches are never artifacts).

Triton launch configurations (:mod:`laya_build.stages.package_tuning`): the child harvests
what Inductor tuned into ``tuning.json`` beside the packages; ``package.tuning.<target>-<dtype>``
names such a file to compile with instead of timing candidates again, which makes the package's
bytes a function of the export and that file.  A compile that had to tune a kernel the file
does not hold fails (its packages would not be reproducible) and leaves its ``tuning.json``
and those kernels' sources; every build keeps the sources of the kernels its entries configure
(``kernel-sources/``), what a refused build's kernels are compared with.

The child loads each package back once (load time; a package that cannot load fails here
already), after importing ``package.preload.<target>`` (:func:`laya_build.runtime.preload_modules`).

Missing CUDA (target cuda), missing AOTInductor APIs, no C++ compiler or a skipped export
give an explicit skip record; an ``inductor_configs`` key that is no Inductor option is a
config error before any compile; on a supported install a compile failure raises.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from laya_build.atomic import atomic_path
from laya_build.environment import device_snapshot, versions
from laya_build.errors import ConfigError, PackageIntegrityError, StageError
from laya_build.layout import NATIVE_LIBRARY_NAME, build_name, child_log_name, package_name, record_name
from laya_build.records import file_entry
from laya_build.runner import Child, run
from laya_build.runner.folders import COMPILE_USER, inductor_cache, torch_link, vec_isa_root
from laya_build.stages import package_tuning
from laya_build.stages.common import check_sha256, skip_if_blocked, upstream
from laya_build.targets import check_target

# Compilers this stage runs: part of its up-to-date check (laya_build.environment).
TOOLS = ("cxx", "nvcc")
CHILD_MODULE = "laya_build.stages.children.package"


def check_inductor_configs(configs: dict) -> None:
    """Every key of ``package.inductor_configs`` names an Inductor option of the installed
    torch: a misspelt one is a config error here, not a compile failure in the child after
    its imports and the exported program's load."""
    if not configs:
        return
    import torch
    from torch._inductor import config as inductor_config

    known = inductor_config.get_config_copy()
    unknown = sorted(k for k in configs if k not in known)
    if unknown:
        raise ConfigError(
            f"package.inductor_configs.{unknown[0]}: not an Inductor option of torch "
            f"{torch.__version__}" + (f" (nor {', '.join(unknown[1:])})" if unknown[1:] else "")
        )
    for key, value in sorted(configs.items()):
        if (want := _option_type(known[key])) and not _of_type(value, want):
            raise ConfigError(
                f"package.inductor_configs.{key}: {value!r} is a {type(value).__name__}, and this Inductor "
                f"option takes a {want.__name__} (its default: {known[key]!r}); "
                + ("write true or false, unquoted" if want is bool else f"give a {want.__name__}")
            )


def _option_type(default) -> type | None:
    """The type an Inductor option's value must have, from its default (None: any: a default of
    None or of another type says nothing)."""
    if isinstance(default, tuple):
        return list
    return type(default) if type(default) in (bool, int, float, str, list, dict) else None


def _of_type(value, want: type) -> bool:
    if want is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if want is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if want is list:
        return isinstance(value, (list, tuple))
    return isinstance(value, want)


def tuning_input(cfg: dict, target: str, dtype: str, root) -> tuple[dict, dict | None]:
    """The entries of the tuning file ``package.tuning.<target>-<dtype>`` names (relative to
    ``root``, the project root) and how the record describes it; ``({}, None)`` without one."""
    import torch

    name = build_name(target, dtype)
    rel = (cfg.get("tuning") or {}).get(name)
    if rel is None:
        return {}, None
    if padding := package_tuning.padding_refusal(cfg["inductor_configs"], name):
        raise ConfigError(f"package.inductor_configs.shape_padding: {padding}")
    path = Path(root) / rel
    entries = package_tuning.read(
        path, torch_version=torch.__version__, target=target, dtype=dtype, key=f"package.tuning.{name}"
    )
    return entries, {**file_entry(path), "path": rel, "entries": len(entries)}


def copy_library(library: dict | None, export_dir: Path, out: Path) -> dict | None:
    """The export's native op library (its record's ``native_library``), checked against that
    record and copied beside the packages under its own name; None when the export has none
    (and a library an earlier build left there is removed: no package of this build calls it)."""
    if library is None:
        (out / NATIVE_LIBRARY_NAME).unlink(missing_ok=True)
        return None
    source = export_dir / library["path"]
    check_sha256(source, library["sha256"], "export record")
    with atomic_path(out / NATIVE_LIBRARY_NAME) as tmp:
        shutil.copyfile(source, tmp)
    copied = file_entry(out / NATIVE_LIBRARY_NAME, out)
    if copied["sha256"] != library["sha256"]:  # the source changed while it was copied
        (out / NATIVE_LIBRARY_NAME).unlink()
        raise PackageIntegrityError(f"{source}: changed while it was copied; its copy was not kept")
    return copied


def compile_cache_key(target: str, dtype: str, programs: list[dict]) -> str:
    """The name of the compile's Inductor cache folder (:func:`laya_build.runner.folders.inductor_cache`),
    which AOTInductor writes into the package: the stage, target and dtype, and a digest of the
    exported programs it compiles.  The same programs compile at the same path, one build at a
    time, into the same bytes; other programs (another configuration, another checkout's
    change) compile beside them at once."""
    import hashlib

    digest = hashlib.sha256("\n".join(f"{p['name']} {p['exported']['sha256']}" for p in programs).encode())
    return f"package-{target}-{dtype}-{digest.hexdigest()[:16]}"


def compile_env(cache) -> dict[str, str]:
    """The compile child's environment beside its own: Inductor's and Triton's caches in its
    private folder (compiler caches are never shared); torch imported through a link in that
    folder (:func:`~laya_build.runner.folders.torch_link`, first on ``PYTHONPATH``), so that no
    path of the Python environment reaches the package; in the shared compile folder also the
    folder's ``tmp`` as ``TMPDIR`` (where Inductor finds the user's precompiled headers) and one
    user name (:data:`~laya_build.runner.folders.COMPILE_USER`), so that no path of the user's or
    of their ``$TMPDIR`` reaches the package."""
    env = {
        "TORCHINDUCTOR_CACHE_DIR": str(cache.path),
        "TRITON_CACHE_DIR": str(cache.path / "triton"),
        "PYTHONPATH": str(torch_link(cache.path)),  # first on the child's own (child_env)
    }
    if cache.tmp is not None:
        env.update(TMPDIR=str(cache.tmp), LOGNAME=COMPILE_USER, USER=COMPILE_USER)
    return env


def run_package(package_cfg: dict, export_dir, out_dir, target: str, root=".") -> dict:
    """Package the programs of ``export_dir`` into ``out_dir``; ``root`` resolves the
    ``package.tuning`` paths (the project root)."""
    start = time.perf_counter()
    cfg = package_cfg
    check_target(target)
    check_inductor_configs(cfg["inductor_configs"])
    if target not in cfg["targets"]:
        raise ConfigError(f"package.targets does not list {target}")
    export_dir, out = Path(export_dir), Path(out_dir)
    exp = upstream(export_dir / record_name("export"), "export")
    if exp["target"] != target:
        raise ConfigError(f"{export_dir}: export record is for target {exp['target']}, not {target}")
    if (skipped := skip_if_blocked("aoti_package", exp, target, aoti=True)) is not None:
        return skipped

    programs = exp["programs"]
    for p in programs:  # what gets compiled must be what the export stage recorded
        check_sha256(export_dir / p["exported"]["path"], p["exported"]["sha256"], "export record")
    tuning, tuning_in = tuning_input(cfg, target, exp["dtype"], root)
    out.mkdir(parents=True, exist_ok=True)
    library = copy_library(exp.get("native_library"), export_dir, out)
    job = {
        "library": library and {"path": str(out / library["path"]), "sha256": library["sha256"]},
        "inductor_configs": cfg["inductor_configs"],
        "tuning": tuning,
        "preload": cfg["preload"].get(target, []),
        "vec_isa_root": str(vec_isa_root()),
        "programs": [
            {
                "name": p["name"],
                "exported": str(export_dir / p["exported"]["path"]),
                "package_tmp": str(out / f".{p['name']}.partial.pt2"),
            }
            for p in programs
        ],
    }
    with inductor_cache(compile_cache_key(target, exp["dtype"], programs), shared=True) as cache:
        child = Child(
            log=out / child_log_name("package"),
            timeout=cfg["timeout_s"],
            reraise=True,
            env=compile_env(cache),
            label=f"AOTInductor compile of {export_dir} for {target}/{exp['dtype']}",
        )
        result = run(f"{CHILD_MODULE}:compile_packages", {"job": job}, child, result=True)

    import torch

    tuning_path = out / package_tuning.FILE
    tuning_doc = package_tuning.document(
        result["tuning"], torch_version=torch.__version__, target=target, dtype=exp["dtype"]
    )
    tuning_path.write_text(package_tuning.dumps(tuning_doc))
    use = result["tuning_use"]
    kernels = result.get("kernels") or {}
    package_tuning.write_sources(out, package_tuning.SOURCES_DIR, kernels)
    untuned = package_tuning.write_sources(
        out, package_tuning.UNTUNED_DIR, {e: k for e, k in kernels.items() if tuning_in and e in use["autotuned"]}
    )
    if tuning_in is not None and use["autotuned"]:
        for spec in job["programs"]:
            Path(spec["package_tmp"]).unlink(missing_ok=True)
        name = build_name(target, exp["dtype"])
        named = [kernels.get(e, {}).get("name") or e for e in use["autotuned"]]  # the entry where no name
        which = ", ".join(named[:3] + ([f"{len(named) - 3} more"] if len(named) > 3 else []))
        sources = f"; their Inductor sources are in {untuned}" if untuned else ""
        raise StageError(
            f"package.tuning.{name}: {tuning_in['path']} holds no launch configuration for "
            f"{len(use['autotuned'])} of the {use['entries']} tuned Triton kernels ({which}), so this "
            f"compile timed candidates and its package bytes would not be reproducible; no package was "
            f"written{sources}",
            hint=f"if the export changed on purpose, copy {tuning_path} (this compile's tuning) over "
            f"{tuning_in['path']} and build again, or unset package.tuning.{name}; if it did not, compare "
            f"those kernels with the files of the same names in {package_tuning.SOURCES_DIR}/ beside the "
            "package of a build that matched the file",
        )

    entries = []
    for p, spec, res in zip(programs, job["programs"], result["programs"]):
        final = out / package_name(p["name"])
        Path(spec["package_tmp"]).replace(final)
        entries.append(
            {
                "name": p["name"],
                "single_slot": p["single_slot"],
                "batches_key": p["batches_key"],
                "package": file_entry(final, out),
                "exported": {"sha256": p["exported"]["sha256"], "bytes": p["exported"]["bytes"]},
                "eager": {"path": p["eager"]["path"], "sha256": p["eager"]["sha256"]},
                "export_s": p["export_s"],
                "package_s": round(res["package_s"], 4),
                "load_s": round(res["load_s"], 4),
                "restored_hints": res["restored_hints"],
            }
        )
    return {
        "stage": "aoti_package",
        "status": "ok",
        "target": target,
        "dtype": exp["dtype"],
        "dims": exp["dims"],
        "inputs": exp["inputs"],
        "programs": entries,
        "inductor_configs": cfg["inductor_configs"],
        "native_library": library,
        "tuning": {
            "file": file_entry(tuning_path, out),
            "entries": len(result["tuning"]),
            "input": tuning_in,
            "autotuned": len(use["autotuned"]),
        },
        "determinism": result["determinism"],
        "compile_cache": {"path": str(cache.path), **result["cache"], "removed": cache.removed},
        "preload": result["preload"],
        "device": device_snapshot(target),
        "versions": versions(),
        "env_info": result["env_info"],
        "elapsed_s": round(time.perf_counter() - start, 4),
    }
