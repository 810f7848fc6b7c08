"""laya-build task graph. Run `doit list` to see the tasks; see README.md.

Thin on purpose: load and validate pipeline.yaml, then hand doit the generators that
laya_build.tasks builds from it.  Nothing here imports torch, tilelang or transformers.
"""
import sys

from laya_build import tasks
from laya_build.config import ConfigError

try:
    PIPELINE = tasks.load_pipeline()
except ConfigError as exc:
    sys.exit(f"laya-build: {exc}")

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
