"""Load and validate ``pipeline.yaml``.

Validation happens before any task exists: schema errors (unknown key, wrong type, missing
field, bad target, bad version) and semantic errors (unknown kernel factory, an output path
outside ``artifacts/``, checks for variants that do not exist) raise :class:`ConfigError`
with the offending key path.  Nothing here imports torch, tilelang or transformers.
"""
from __future__ import annotations

import ast
import copy
import functools
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import PROJECT_ROOT, SCHEMA_DIR
from .records import RecordError, validate

ARTIFACTS_DIRNAME = "artifacts"


class ConfigError(ValueError):
    """pipeline.yaml is invalid; the message names the file and the key path."""


@dataclass(frozen=True)
class Pipeline:
    """The validated configuration plus the paths derived from it."""

    data: dict
    path: Path
    root: Path  # project root

    @property
    def version(self) -> str:
        return self.data["version"]

    @property
    def output_root(self) -> Path:
        return (self.root / self.data["output_root"]).resolve()

    @property
    def version_dir(self) -> Path:
        return self.output_root / self.version

    def section(self, key: str, default=None):
        return copy.deepcopy(self.data.get(key, default))


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (YAML silently keeps the last one)."""


def _construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(f"duplicate key {key!r} at line {key_node.start_mark.line + 1}")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


@functools.lru_cache(maxsize=None)
def kernel_factories(kernels_dir: Path) -> dict[str, str]:
    """Factory name -> defining module file (relative to the project), found by parsing
    ``kernels/*.py`` without importing them (building the task graph must stay light)."""
    found: dict[str, str] = {}
    for path in sorted(kernels_dir.glob("*.py")):
        if path.name.startswith("_") or path.name in ("reference.py", "probe.py"):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel") and any(
                "jit" in ast.unparse(d) for d in node.decorator_list
            ):
                found[node.name] = f"kernels/{path.name}"
    return found


def load(path: str | Path | None = None, *, root: str | Path = PROJECT_ROOT, overrides: dict | None = None) -> Pipeline:
    """Read, override (``version``), validate and return the pipeline configuration."""
    root = Path(root).resolve()
    path = Path(path) if path is not None else root / "pipeline.yaml"
    if not path.is_absolute():
        path = root / path
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file not found") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    for key, value in (overrides or {}).items():
        if value is not None:
            data[key] = value
    try:
        validate("pipeline", data, what=str(path))
    except RecordError as exc:
        raise ConfigError(str(exc)) from None
    _check_semantics(data, path, root)
    return Pipeline(data=data, path=path, root=root)


def check_version(value: str, what: str) -> str:
    """A version given outside pipeline.yaml (a doit argument) must match the schema's pattern."""
    import re

    pattern = json.loads((SCHEMA_DIR / "pipeline.schema.json").read_text())["$defs"]["version"]["pattern"]
    if not isinstance(value, str) or not re.fullmatch(pattern, value):
        raise ConfigError(f"{what}: {value!r} is not a version (expected e.g. 1.2.0)")
    return value


def _fail(path: Path, key: str, message: str):
    raise ConfigError(f"{path}: invalid at {key}: {message}")


def _check_semantics(data: dict, path: Path, root: Path) -> None:
    artifacts = (root / ARTIFACTS_DIRNAME).resolve()
    out = (root / data["output_root"]).resolve()
    if out != artifacts and artifacts not in out.parents:
        _fail(path, "output_root", f"{data['output_root']!r} resolves to {out}, outside {artifacts}")

    factories = kernel_factories(root / "kernels")
    variants = data["kernels"]["variants"]
    for name, variant in variants.items():
        if variant["factory"] not in factories:
            known = ", ".join(sorted(factories)) or "none found"
            _fail(path, f"kernels.variants.{name}.factory", f"unknown kernel {variant['factory']!r}; known: {known}")

    checks = data["cpu_checks"]
    for section in ("shapes", "atol_overrides"):
        for name in checks.get(section, {}):
            if name not in variants:
                _fail(path, f"cpu_checks.{section}.{name}", f"no kernel variant named {name!r}")
    for name in variants:
        if name not in checks["shapes"]:
            _fail(path, f"cpu_checks.shapes", f"kernel variant {name!r} has no check shapes")

    baseline = data["cuda"].get("baseline")
    if baseline and baseline.get("version") == data["version"]:
        _fail(path, "cuda.baseline.version", f"the baseline cannot be the version being built ({data['version']})")
