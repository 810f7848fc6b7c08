"""What the model stages (model, export, aoti_package, verify, latency) share.

Config sections (defaults + validation), records and skip records, the support checks that
turn "cannot run here" into an explicit skip, version/device snapshots, fresh child
processes and their private Inductor caches.
"""
from __future__ import annotations

import contextlib
import copy
import fcntl
import functools
import importlib.metadata
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import PROJECT_ROOT
from ..atomic import atomic_path
from ..errors import ChildCrashError, ConfigError, PackageIntegrityError, StageError
from ..log import get_logger
from ..records import RecordError, read_record, sha256_file, validate, write_record

DEFAULTS_PATH = PROJECT_ROOT / "laya_build" / "model" / "defaults.yaml"
DTYPES = ("float32", "bfloat16", "float16")
TARGETS = ("cpu", "cuda")
STAGE_FILES = {"model": "model.json", "export": "export.json", "aoti_package": "aoti_package.json",
               "verify": "verify.json", "latency": "latency.json"}

log = get_logger(__name__)


# --------------------------------------------------------------------------------- config

@functools.lru_cache(maxsize=None)
def _defaults() -> dict:
    import yaml

    return yaml.safe_load(DEFAULTS_PATH.read_text())


def merge(base: dict, override: dict) -> dict:
    """Deep merge of mappings; lists and scalars of ``override`` replace ``base``'s."""
    out = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def section(name: str, cfg: dict | None) -> dict:
    """``cfg`` (a pipeline.yaml section) over the defaults, validated against
    ``model_sections.schema.json#/$defs/<name>``; errors name the key path."""
    merged = merge(_defaults()[name], cfg or {})
    try:
        validate("model_sections", {name: merged}, what=f"{name} config")
    except RecordError as exc:
        raise ConfigError(str(exc)) from None
    return merged


def torch_dtype(name: str):
    import torch

    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r}; allowed: {', '.join(DTYPES)}")
    return getattr(torch, name)


def check_target(target: str) -> str:
    if target not in TARGETS:
        raise ConfigError(f"unknown target {target!r}; allowed: {', '.join(TARGETS)}")
    return target


# -------------------------------------------------------------------------------- records

def torch_save(obj, path) -> Path:
    """``torch.save`` atomically and reproducibly: through a file object, so the archive's
    inner folder is not named after the (random) temporary file."""
    import torch

    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        torch.save(obj, fh)
    return Path(path)


def record_path(out_dir, stage: str) -> Path:
    return Path(out_dir) / STAGE_FILES[stage]


def finish(out_dir, record: dict) -> dict:
    """Validate and atomically write ``record`` as ``out_dir/<stage>.json``; return it."""
    write_record(record_path(out_dir, record["stage"]), record)
    return record


def skip(stage: str, out_dir, reason: str, **fields) -> dict:
    """Write an explicit skip record (never a silent pass)."""
    return finish(out_dir, {"stage": stage, "status": "skipped", "reason": reason, **fields})


def skip_if_blocked(stage: str, out_dir, up: dict, target: str, *, aoti: bool = False) -> dict | None:
    """The skip record of ``stage`` when its upstream record ``up`` was skipped or ``target``
    cannot run here (:func:`unsupported_reason`); ``None`` when the stage can run."""
    if up["status"] == "skipped":
        reason = f"{up['stage']} skipped: {up['reason']}"
    elif not (reason := unsupported_reason(target, aoti=aoti)):
        return None
    return skip(stage, out_dir, reason, target=target, **({"dtype": up["dtype"]} if "dtype" in up else {}))


def check_sha256(path, expected: str, record: str, consequence: str = "") -> str:
    """``path``'s sha256, which must be ``expected`` (from ``record``) before anything uses it."""
    actual = sha256_file(path)
    if actual != expected:
        raise PackageIntegrityError(f"{path}: sha256 {actual} does not match the {record}'s "
                                    f"{expected}{consequence}")
    return actual


def upstream(path, stage: str) -> dict:
    """Read and validate an upstream record, checking it is the expected stage's."""
    record = read_record(path)
    if record["stage"] != stage:
        raise ConfigError(f"{path}: expected a {stage} record, got stage {record['stage']!r}")
    return record


# ------------------------------------------------------------------------- support checks

def cuda_unavailable_reason() -> str | None:
    """Why CUDA cannot be used here, or None.  Asks NVML, so the calling process (possibly
    a doit worker that forks later) does not initialise CUDA."""
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


def cxx_compiler() -> str | None:
    """The C++ compiler Inductor will use (``$CXX``, else g++/c++/clang++ on PATH)."""
    if os.environ.get("CXX"):
        return shutil.which(os.environ["CXX"])
    return next((found for name in ("g++", "c++", "clang++") if (found := shutil.which(name))), None)


def unsupported_reason(target: str, *, aoti: bool = False) -> str | None:
    """Why ``target`` cannot be built here (missing CUDA; with ``aoti``, missing AOTInductor
    APIs or C++ compiler), or None when it can."""
    check_target(target)
    if target == "cuda" and (reason := cuda_unavailable_reason()):
        return f"target cuda: {reason}"
    if aoti:
        import torch._inductor as inductor

        missing = [api for api in ("aoti_compile_and_package", "aoti_load_package")
                   if not hasattr(inductor, api)]
        if missing:
            return f"torch {__import__('torch').__version__} lacks torch._inductor.{', '.join(missing)}"
        if cxx_compiler() is None:
            wanted = os.environ.get("CXX") or "g++/c++/clang++"
            return f"no C++ compiler found ({wanted}); AOTInductor needs one"
    return None


# ---------------------------------------------------------------------------- snapshots

def dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict:
    """Versions of the stack (from metadata: importing nothing heavy, initialising no CUDA)."""
    import torch

    cxx = cxx_compiler()
    cxx_version = None
    if cxx:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
        cxx_version = (out.stdout.splitlines() or [""])[0] or None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": dist_version("transformers"),
        "tokenizers": dist_version("tokenizers"),
        "safetensors": dist_version("safetensors"),
        "tilelang": dist_version("tilelang"),
        "platform": platform.platform(),
        "cxx": cxx_version,
    }


def nvidia_smi_q() -> str | None:
    """``nvidia-smi -q`` where there is one (None without a GPU driver or on failure)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    out = subprocess.run([smi, "-q"], capture_output=True, text=True, check=False, timeout=60)
    return out.stdout if out.returncode == 0 else None


def device_snapshot(target: str) -> dict:
    """The machine the artifact was built on: CPU, and ``nvidia-smi -q`` where there is one."""
    return {"target": target, "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count() or 1, "nvidia_smi_q": nvidia_smi_q()}


# ------------------------------------------------------------------------ child processes

class InductorCache:
    """The path a child uses as ``TORCHINDUCTOR_CACHE_DIR``; ``removed`` is set when the
    context exits, checked while the lock is still held (another build of the same key may
    re-create the folder the moment the lock is released)."""

    def __init__(self, path: Path):
        self.path = path
        self.removed: bool | None = None

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)


@contextlib.contextmanager
def inductor_cache(key: str):
    """A child process's own empty Inductor cache, at a path that depends only on ``key``
    (stage, target, dtype) and the user, outside the artifacts.

    AOTInductor writes its cache path into the package (compile-command comments, kernel
    file names, debug info), so a random ``mkdtemp`` name would make two builds of one
    exported program differ.  The directory is emptied before and removed after use; an
    exclusive ``flock`` on a sibling lock file serialises concurrent builds of one key (of
    any checkout of this user), and every check about the folder happens under that lock.
    """
    root = Path(tempfile.gettempdir()) / f"laya-build-{os.getuid()}" / "inductor"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    cache = InductorCache(root / key)
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(cache.path, ignore_errors=True)
        cache.path.mkdir()
        try:
            yield cache
        finally:
            shutil.rmtree(cache.path, ignore_errors=True)
            cache.removed = not cache.path.exists()


def child_env(**extra: str) -> dict:
    from ..isolate import child_env as stage_env

    return stage_env({"PYTHONUNBUFFERED": "1", **extra})


def run_child(argv: list[str], *, env: dict, timeout: float, what: str, log_path,
              crash_error: type[ChildCrashError] = ChildCrashError) -> int:
    """Run ``[sys.executable, *argv]`` to completion; its output goes to ``log_path``.

    Returns the exit status (the caller reads the child's result file for details).  A
    child killed by a signal raises ``crash_error`` naming the signal, a timeout raises
    :class:`StageError`: neither can ever pass as success.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log.info(f"[laya] {what}: started (log {log_path.name})")
    start = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as out:
        try:
            proc = subprocess.run([sys.executable, *argv], env=env, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout, cwd=PROJECT_ROOT)
        except subprocess.TimeoutExpired:
            raise StageError(f"{what} ran past its {timeout:g} s timeout (log: {log_path})") from None
    log.info(f"[laya] {what}: finished in {time.perf_counter() - start:.1f} s (exit status {proc.returncode})")
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        raise crash_error(f"{what} died by signal {name} ({-proc.returncode}); this is a failure, "
                          f"not a pass. Last output ({log_path}):\n{log_tail(log_path)}", signal=name)
    return proc.returncode


def log_tail(path, lines: int = 25) -> str:
    text = Path(path).read_text(encoding="utf-8", errors="replace").strip().splitlines()
    return "\n".join(text[-lines:])
