"""laya-build task graph. Run `doit list` to see the tasks; see README.md.

Thin on purpose: load and validate pipeline.yaml, then hand doit the tasks that
laya_build.tasks builds from it.  Nothing here imports torch, tilelang or transformers.
A configuration or command-line error exits 3 (doit's status for a user error), with a hint.
"""

import sys

from laya_build import tasks
from laya_build.errors import LayaBuildError

try:
    PIPELINE = tasks.load_pipeline()
except LayaBuildError as exc:
    print(f"laya-build: {type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(exc.exit_code)

DOIT_CONFIG = tasks.doit_config(PIPELINE)


def task_tir():
    """TileLang TIR script + structural hash of every kernel variant."""
    yield from tasks.tir_tasks(PIPELINE)


def task_probe_c():
    """GPU specialisations compiled for target c: diagnostics vs the pinned ones."""
    yield from tasks.probe_c_tasks(PIPELINE)


def task_lower_c():
    """fp32 C specialisation: C source + numerical check against the torch reference."""
    yield from tasks.lower_c_tasks(PIPELINE)


def task_cuda_source():
    """CUDA source per kernel x dtype x arch (no GPU needed)."""
    yield from tasks.cuda_source_tasks(PIPELINE)


def task_cuda_diff():
    """Byte-level diff of CUDA sources against the configured baseline."""
    yield from tasks.cuda_diff_tasks(PIPELINE)


def task_model():
    """Decision-model checkpoint (generated from a seed or local) and the saved inputs."""
    yield from tasks.model_tasks(PIPELINE)


def task_export():
    """torch.export with symbolic rows / 16*tokens16 / slots, per target and dtype."""
    yield from tasks.export_tasks(PIPELINE)


def task_aoti_package():
    """AOTInductor .pt2 package per target and dtype."""
    yield from tasks.aoti_package_tasks(PIPELINE)


def task_verify():
    """Fresh-process verification of every package (of a release: files vs manifest first)."""
    yield from tasks.verify_tasks(PIPELINE)


def task_latency():
    """Latency table per target: eager AMP, eager bf16 (torch.compile bf16 on cuda) once, then each package."""
    yield from tasks.latency_tasks(PIPELINE)


def task_release():
    """Build every stage, then REPORT.md and manifest.json: the version becomes immutable."""
    return tasks.release_task(PIPELINE)


def task_release_diff():
    """What changed between two releases: doit release_diff --old A --new B."""
    return tasks.release_diff_task(PIPELINE)
