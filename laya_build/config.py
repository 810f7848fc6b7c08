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
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import PROJECT_ROOT
from .errors import ConfigError  # noqa: F401  (re-exported: config.ConfigError)
from .records import RecordError, load_schema, validate

ARTIFACTS_DIRNAME = "artifacts"


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


@dataclass(frozen=True)
class Factory:
    """A kernel factory as declared in its source: where, and its parameters."""

    module: str  # relative to the project root
    positional: tuple[str, ...]  # parameters that may be passed positionally
    keyword: frozenset[str]  # every parameter name


@functools.lru_cache(maxsize=None)
def kernel_factories(kernels_dir: Path) -> dict[str, Factory]:
    """The ``@tilelang.jit`` ``*_kernel`` factories of ``kernels/*.py``, found by parsing the
    sources without importing them (building the task graph must stay light)."""
    found: dict[str, Factory] = {}
    for path in sorted(kernels_dir.glob("*.py")):
        if path.name.startswith("_"):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel") and any(
                "jit" in ast.unparse(d) for d in node.decorator_list
            ):
                a = node.args
                positional = tuple(x.arg for x in a.posonlyargs + a.args)
                keyword = frozenset(positional) | {x.arg for x in a.kwonlyargs}
                found[node.name] = Factory(f"kernels/{path.name}", positional, keyword)
    return found


# Runtime sizes each factory's numerical check needs (laya_build/stages/lower_c.py).
CHECK_SHAPE_KEYS = {
    "gemm_kernel": {"M"},
    "gemm_geglu_kernel": {"M"},
    "add_ln_kernel": {"M"},
    "rope_kernel": {"M", "L"},
    "attn_kernel": {"B", "L"},
}


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
    _merge_model_defaults(data, path)
    return Pipeline(data=data, path=path, root=root)


MODEL_SECTIONS = ("model", "export", "package", "verify", "latency", "runtime")


def _merge_model_defaults(data: dict, path: Path) -> None:
    """Fill the model sections from ``laya_build/model/defaults.yaml``: ``Pipeline.data`` is
    then the effective configuration that every task reads and a release records."""
    from .stages._model_common import section

    from .buckets import check_config as check_buckets

    for name in MODEL_SECTIONS:
        try:
            data[name] = section(name, data.get(name))
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    try:
        check_buckets(data)  # runtime.buckets must lie inside export.dims
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def check_version(value: str, what: str) -> str:
    """A version given outside pipeline.yaml (a doit argument) must match the schema's pattern."""
    pattern = load_schema("pipeline")["$defs"]["version"]["pattern"]
    if not isinstance(value, str) or not re.fullmatch(pattern, value):
        raise ConfigError(f"{what}: {value!r} is not a version (expected e.g. 1.2.0)")
    return value


def _fail(path: Path, key: str, message: str):
    raise ConfigError(f"{path}: invalid at {key}: {message}")


def _check_semantics(data: dict, path: Path, root: Path) -> None:
    artifacts = (root / ARTIFACTS_DIRNAME).resolve()
    out = (root / data["output_root"]).resolve()
    if out != artifacts:  # a subfolder could be a (released) version folder
        _fail(path, "output_root", f"{data['output_root']!r} resolves to {out}; outputs must go to {artifacts}")

    factories = kernel_factories(root / "kernels")
    variants = data["kernels"]["variants"]
    for name, variant in variants.items():
        factory = factories.get(variant["factory"])
        if factory is None:
            known = ", ".join(sorted(factories)) or "none found"
            _fail(path, f"kernels.variants.{name}.factory", f"unknown kernel {variant['factory']!r}; known: {known}")
        shape_args = [a for a in factory.positional if a not in ("dtype", "cpu")]
        args = variant.get("args", [])
        if len(args) > len(shape_args):
            _fail(path, f"kernels.variants.{name}.args",
                  f"{variant['factory']} takes at most {len(shape_args)} positional arguments ({', '.join(shape_args)}), "
                  f"got {len(args)}")
        for key in variant.get("kwargs", {}):
            if key not in factory.keyword:
                _fail(path, f"kernels.variants.{name}.kwargs.{key}",
                      f"{variant['factory']} has no parameter {key!r}; parameters: {', '.join(sorted(factory.keyword))}")
            if key in shape_args[:len(args)]:
                _fail(path, f"kernels.variants.{name}.kwargs.{key}", f"{key!r} is already given in args")

    checks = data["cpu_checks"]
    for section in ("shapes", "atol_overrides"):
        for name in checks.get(section, {}):
            if name not in variants:
                _fail(path, f"cpu_checks.{section}.{name}", f"no kernel variant named {name!r}")
    for name, variant in variants.items():
        if name not in checks["shapes"]:
            _fail(path, "cpu_checks.shapes", f"kernel variant {name!r} has no check shapes")
        bound = dict(zip(factories[variant["factory"]].positional, variant.get("args", [])))
        needed = {k for k in CHECK_SHAPE_KEYS.get(variant["factory"], set()) if bound.get(k) is None}
        for i, shape in enumerate(checks["shapes"][name]):
            missing = sorted(needed - set(shape))
            if missing:
                _fail(path, f"cpu_checks.shapes.{name}.{i}", f"{variant['factory']} checks need {', '.join(missing)}")
            if "lens" in shape and "B" in shape and len(shape["lens"]) != shape["B"]:
                _fail(path, f"cpu_checks.shapes.{name}.{i}.lens", f"{len(shape['lens'])} lengths for B={shape['B']}")

    baseline = data["cuda"].get("baseline")
    if baseline and baseline.get("version") == data["version"]:
        _fail(path, "cuda.baseline.version", f"the baseline cannot be the version being built ({data['version']})")
