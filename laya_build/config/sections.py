"""The model sections of ``pipeline.yaml`` (model, export, package, verify, latency, runtime):
their defaults (``laya_build/model/defaults.yaml``), merging and validation, and the names
of targets and dtypes they use."""

from __future__ import annotations

import copy
import functools

from laya_build import PROJECT_ROOT
from laya_build.errors import ConfigError, RecordError, message_of
from laya_build.schema import validate

DEFAULTS_PATH = PROJECT_ROOT / "laya_build" / "model" / "defaults.yaml"


@functools.cache
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
        raise ConfigError(message_of(exc)) from None
    return merged
