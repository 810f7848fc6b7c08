"""Where a stage task runs: here, or (``executor: ray``) as a Ray task on a machine that can
build its target, its outputs coming back through the shared cache.

This module decides, from the configuration alone and without importing Ray, which stages go
to the cluster and which resource they ask for; :mod:`.ray_dispatch` sends them (the only
module that imports Ray, and only when a stage is dispatched).

A stage is bound to a target when it is one of :data:`TARGET_STAGES` (its configuration names
``target: cpu`` or ``cuda``).  ``verify`` of a build is one: it runs every time, so a verification
sent to the cluster runs on a worker every time (see :mod:`laya_build.tasks.cache`).

A stage runs remotely when its target is in ``executor.remote_targets``, or when this machine
cannot build that target: ``cuda`` without a visible NVIDIA GPU.  It asks for one unit of the
target's resource: by default ``laya_target:cuda-<arch>`` (the first of ``cuda.archs``: ``laya_target:cuda-sm90``) or
``laya_target:cpu-<machine>`` (``laya_target:cpu-x86_64``); ``executor.resources`` renames them.

Environment (over the file): ``LAYA_BUILD_EXECUTOR`` (``local`` or ``ray``),
``LAYA_BUILD_RAY_ADDRESS``, ``LAYA_BUILD_REMOTE_TARGETS`` (``cpu,cuda``) and, on a worker,
``LAYA_BUILD_WORKER_ROOT`` (its checkout of the project).
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from laya_build.errors import ConfigError

ENV_EXECUTOR = "LAYA_BUILD_EXECUTOR"
ENV_ADDRESS = "LAYA_BUILD_RAY_ADDRESS"
ENV_REMOTE = "LAYA_BUILD_REMOTE_TARGETS"
ENV_WORKER_ROOT = "LAYA_BUILD_WORKER_ROOT"
ENVIRONMENT = {
    ENV_EXECUTOR: "local or ray: where stage tasks run",
    ENV_ADDRESS: "the Ray cluster's address (else executor.address, RAY_ADDRESS, auto)",
    ENV_REMOTE: "targets whose stages always run on the cluster, comma-separated (cpu,cuda)",
    ENV_WORKER_ROOT: "on a Ray worker: its checkout of the project (else executor.worker_root)",
}
TARGET_STAGES = ("export", "aoti_package", "latency", "verify")  # stages bound to one target
ALWAYS_REMOTE = ("verify",)  # stages that run every time and may still run on the cluster
RESOURCE_PREFIX = "laya_target:"
TARGETS = ("cpu", "cuda")


@dataclass(frozen=True)
class ExecutorSettings:
    kind: str = "local"
    address: str | None = None
    remote_targets: tuple[str, ...] = ()
    resources: tuple[tuple[str, str], ...] = ()
    worker_root: str | None = None
    num_cpus: float = 1.0
    timeout_s: float = 3600.0


def executor_settings(cfg: dict | None, *, label: str = "pipeline.yaml", env=None) -> ExecutorSettings | None:
    """``executor:`` with the environment's overrides; None for a local build."""
    env = os.environ if env is None else env
    cfg = dict(cfg or {})
    kind = env.get(ENV_EXECUTOR) or cfg.get("kind", "local")
    if kind not in ("local", "ray"):
        raise ConfigError(f"environment {ENV_EXECUTOR}={kind!r}: expected local or ray", hint=f"{ENV_EXECUTOR}=ray")
    if kind == "local":
        return None
    remote = cfg.get("remote_targets", [])
    if env.get(ENV_REMOTE):
        remote = [t.strip() for t in env[ENV_REMOTE].split(",") if t.strip()]
        unknown = [t for t in remote if t not in TARGETS]
        if unknown:
            raise ConfigError(
                f"environment {ENV_REMOTE}={env[ENV_REMOTE]!r}: unknown target {unknown[0]!r}",
                hint=f"targets: {', '.join(TARGETS)}",
            )
    return ExecutorSettings(
        kind=kind,
        address=env.get(ENV_ADDRESS) or cfg.get("address") or env.get("RAY_ADDRESS") or "auto",
        remote_targets=tuple(remote),
        resources=tuple(sorted((cfg.get("resources") or {}).items())),
        worker_root=cfg.get("worker_root"),
        num_cpus=float(cfg.get("num_cpus", 1)),
        timeout_s=float(cfg.get("timeout_s", 3600)),
    )


def gpu_visible() -> bool:
    """Whether an NVIDIA GPU is visible here, asked without initialising CUDA or importing torch."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    gpus = Path("/proc/driver/nvidia/gpus")
    return (gpus.is_dir() and any(gpus.iterdir())) or Path("/dev/nvidia0").exists()


def stage_target(stage) -> str | None:
    """The target a stage's bytes come from, for the stages bound to one."""
    if stage.basename not in TARGET_STAGES:
        return None
    target = stage.config.get("target")
    return target if target in TARGETS else None


UNIDENTIFIED_GPU = "unidentified"  # local_cuda_archs() where nothing names the GPU: never cached


def _visible(rows: list[list[str]], visible: str | None) -> list[list[str]]:
    """The rows (index, uuid, compute capability) of the GPUs ``CUDA_VISIBLE_DEVICES`` leaves to
    CUDA, or all of them where that cannot be told for certain: indices count in CUDA's order,
    which is ``nvidia-smi``'s only with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; UUIDs (or their
    prefixes) match case-insensitively; a MIG or other name keeps every GPU of the host."""
    if not visible:
        return rows
    chosen = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry:
            continue
        if entry.lstrip("-").isdigit():
            if int(entry) < 0:
                break  # CUDA stops at the first invalid index
            if os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
                return rows
            found = [r for r in rows if r[0] == entry]
        elif entry.upper().startswith("GPU-"):
            found = [r for r in rows if r[1].upper().startswith(entry.upper())]
        else:
            return rows
        if not found:
            return rows
        chosen += found
    return chosen or rows


@functools.cache
def local_cuda_archs() -> tuple[str, ...]:
    """The compute capabilities of the GPUs CUDA would use here (``("sm90",)``), asked of
    ``nvidia-smi`` (CUDA is not initialised, torch not imported), as ``CUDA_VISIBLE_DEVICES``
    leaves them (:func:`_visible`: every GPU of the host where that is uncertain).  Empty
    without a visible GPU; where ``nvidia-smi`` cannot say, the GPUs' model names from the
    driver; where nothing names them, ``(UNIDENTIFIED_GPU,)``."""
    if not gpu_visible():
        return ()
    smi = shutil.which("nvidia-smi")
    rows = []
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=index,uuid,compute_cap", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            rows = [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.count(",") == 2]
        except (OSError, subprocess.TimeoutExpired):
            rows = []
    rows = [r for r in rows if r[2].replace(".", "").isdigit()]
    archs = {f"sm{r[2].replace('.', '')}" for r in _visible(rows, os.environ.get("CUDA_VISIBLE_DEVICES"))}
    if archs:
        return tuple(sorted(archs))
    models = set()
    for info in Path("/proc/driver/nvidia/gpus").glob("*/information"):
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Model:"):
                models.add(line.split(":", 1)[1].strip().replace(" ", "_"))
    return tuple(sorted(models)) or (UNIDENTIFIED_GPU,)


def key_resource(p, stage, settings: ExecutorSettings | None) -> str | None:
    """The machine type in the cache key of ``stage`` (:func:`laya_build.cache.keys.machine`):
    the resource it is sent to; for a stage bound to ``cuda`` built here, the resource a worker
    like this machine offers by default (``laya_target:cuda-<arch of its GPU>``), so a package
    built on a worker and one built here on the same kind of GPU share a key, and GPUs of two
    architectures never do; None otherwise."""
    remote = remote_resource(p, stage, settings)
    if remote is not None:
        return remote
    if stage_target(stage) == "cuda" and (archs := local_cuda_archs()):
        return f"{RESOURCE_PREFIX}cuda-{'+'.join(archs)}"
    return None


def resource_name(target: str, data: dict, settings: ExecutorSettings) -> str:
    named = dict(settings.resources)
    if target in named:
        return named[target]
    if target == "cuda":
        arch = data["cuda"]["archs"][0]["arch"].replace("_", "")
        return f"{RESOURCE_PREFIX}cuda-{arch}"
    return f"{RESOURCE_PREFIX}cpu-{platform.machine()}"


def remote_resource(p, stage, settings: ExecutorSettings | None) -> str | None:
    """The Ray resource ``stage`` is sent to, or None when it runs here."""
    if settings is None or settings.kind != "ray":
        return None
    target = stage_target(stage)
    if target is None or (stage.always and stage.basename not in ALWAYS_REMOTE):
        return None
    if target in settings.remote_targets or (target == "cuda" and not gpu_visible()):
        return resource_name(target, p.data, settings)
    return None
