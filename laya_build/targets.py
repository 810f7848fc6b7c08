"""The targets and dtypes the model sections name (``export.targets.<target>: [<dtype>]``)."""

from __future__ import annotations

from laya_build.errors import ConfigError

DTYPES = ("float32", "bfloat16", "float16")
TARGETS = ("cpu", "cuda")


def torch_dtype(name: str):
    import torch

    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r}; allowed: {', '.join(DTYPES)}")
    return getattr(torch, name)


def check_target(target: str) -> str:
    if target not in TARGETS:
        raise ConfigError(f"unknown target {target!r}; allowed: {', '.join(TARGETS)}")
    return target
