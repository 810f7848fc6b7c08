"""What the kernel stages (tir, probe_c, lower_c, cuda_source) share: importing a factory,
its call arguments, the toolchain that determines generated code, and publishing a
generated source with its record."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import platform


def load_factory(name: str):
    """The factory ``name`` from the ``kernels`` package on ``sys.path`` (the project's, or a
    baseline revision's when the stage process was started with that on its path)."""
    kernels = importlib.import_module("kernels")
    try:
        return getattr(kernels, name)
    except AttributeError:
        raise LookupError(f"kernels ({kernels.__file__}) has no factory {name!r}") from None


def kernel_toolchain() -> dict:
    """Versions that determine generated kernel code."""
    import tilelang  # noqa: F401  (puts its bundled tvm on sys.path)
    import torch

    return {
        "tilelang": importlib.metadata.version("tilelang"),
        "tvm": getattr(__import__("tvm"), "__version__", "unknown"),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def call_args(spec: dict, **override) -> tuple[list, dict]:
    kwargs = {**spec.get("kwargs", {}), **override}
    return list(spec.get("args", [])), kwargs


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def publish(record: dict, path: str, text: str) -> dict:
    """Validate a kernel stage's record, then write the source it describes (atomically).

    The record itself is written by the stage runner; an invalid one leaves nothing behind.
    """
    from laya_build.atomic import write_text
    from laya_build.records import check_record

    check_record(path, record)
    write_text(path, text)
    return record
