"""Load and validate ``pipeline.yaml``.

Everything decidable from the configuration is decided here, before any task exists, and
refused with :class:`ConfigError` naming the file (or the ``doit`` argument) and the key path:

* the file itself: missing, a directory, unreadable, not UTF-8, not YAML, duplicate or
  non-string keys, values JSON cannot carry (timestamps, NaN, ...);
* the schemas (``schemas/pipeline.schema.json``, ``model_sections.schema.json``): unknown
  keys, types, versions and names matched in full (:func:`laya_build.records.ecma_regex`),
  ranges with ``min <= max`` (the ``ascending`` keyword);
* the kernel variants, through the kernel registry (:mod:`kernels.registry`): a known factory,
  its arguments bound as the call would bind them (required ones present) and checked by the
  factory's own argument rules, and check shapes that give exactly the runtime sizes;
* the model sections over their defaults: the decision batches as laid out in the config
  (:mod:`laya_build.model.batches`: known decisions, export ranges reached, the example
  batch) and verification thresholds for every target x dtype that is built.

Command-line values (``doit config=... version=...``) are reported as such.  Nothing here
imports torch, tilelang or transformers, and nothing is written.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from kernels.registry import CPU_DTYPE, KERNELS
from laya_build import PROJECT_ROOT
from laya_build.errors import ConfigError, RecordError, UsageError, message_of
from laya_build.layout import ArtifactsLayout, VersionLayout
from laya_build.model.batches import LayoutError, check_export_layout, planned_shapes
from laya_build.schema import ecma_regex, load_schema, validate

ARTIFACTS_DIRNAME = "artifacts"


@dataclass(frozen=True)
class Pipeline:
    """The validated configuration plus the paths derived from it."""

    data: dict
    path: Path
    root: Path  # project root
    release_folder: Path | None = None  # ``doit verify release=<folder>``: a release folder where it lies
    wait: bool = True  # ``wait=no``: refuse at once when another run builds the same version
    # Where stage results are shared and where stages run (``cache:``, ``executor:``): kept out
    # of ``data``, which is what is built (and what a release records), not where.
    cache: dict | None = None
    executor: dict | None = None

    @property
    def version(self) -> str:
        return self.data["version"]

    @property
    def output_root(self) -> Path:
        return (self.root / self.data["output_root"]).resolve()

    @property
    def version_dir(self) -> Path:
        return self.output_root / self.version

    @property
    def verify_dir(self) -> Path:
        """The folder ``doit verify`` checks: ``release=<folder>``, else the version's own."""
        return self.release_folder or self.version_dir

    @property
    def artifacts(self) -> ArtifactsLayout:
        return ArtifactsLayout(self.output_root)

    @property
    def layout(self) -> VersionLayout:
        """Every path of the version being built (:mod:`laya_build.layout`)."""
        return self.artifacts.version(self.version)


def model_builds(data: dict) -> list[tuple[str, str]]:
    """(target, dtype) of every package an (effective) configuration builds."""
    targets = data["export"]["targets"]
    return [(t, d) for t in data["package"]["targets"] for d in targets.get(t, [])]


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser when built: ~9x faster
    """SafeLoader that refuses duplicate mapping keys (YAML silently keeps the last one)."""


def _construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        line = key_node.start_mark.line + 1
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`, merged by construct_mapping
            continue
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, str):
            raise ConfigError(
                f"key {key!r} at line {line}: keys must be strings "
                "(YAML reads an unquoted yes/no/on/off as a boolean and 1 as a number: quote it)"
            )
        if key in seen:
            raise ConfigError(f"duplicate key {key!r} at line {line}")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


# ----------------------------------------------------------------------------------- loading


def _shown(value: str) -> str:
    """A command-line value as typed, or its repr when it holds whitespace or control characters."""
    return value if value.isprintable() and not any(c.isspace() for c in value) else repr(value)


def _argument(name: str, value: str) -> str:
    return f"doit argument {name}={_shown(value)}"


def _read(path: Path, argument: str = "") -> str:
    """The text of a configuration file; every way it cannot be read is one ConfigError.
    ``argument`` (``doit argument config=...: ``) prefixes the errors about the path."""
    label = f"{argument}{path}"
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{label}: configuration file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{label}: is a directory, not a configuration file") from None
    except OSError as exc:
        raise ConfigError(f"{label}: cannot be read ({exc.strerror or exc})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{label}: larger than {MAX_CONFIG_BYTES:,} bytes, more than any configuration holds",
            hint="name the pipeline's configuration file (config=...); a real one is a few kB",
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}, line {line})"
        ) from None


# Bounds of a configuration document: far above any real one (pipeline.yaml: ~2 kB, ~300 values),
# far below what makes loading slow.  Aliases are counted expanded (each use of an anchor counts
# its whole value), so a few hundred bytes of nested aliases cannot stand for 10^8 values.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_VALUES = 100_000


def _expanded_sizes(root) -> dict[int, int]:
    """id(node) -> how many values the node stands for with every alias expanded (itself
    included), for the composed YAML ``root``; each node is visited once, so this is linear in
    the document however far the aliases expand.  A node that contains itself (a recursive
    alias) is refused."""
    sizes: dict[int, int] = {}
    stack: list[tuple[object, bool]] = [(root, False)]
    open_: set[int] = set()
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        children = _children(node)
        if done:
            open_.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(c)] for _, c in children)
            continue
        if id(node) in open_:
            raise ConfigError(f"invalid at {_path_to(root, node)}: a recursive alias (the value contains itself)")
        open_.add(id(node))
        stack.append((node, True))
        for key, child in children:
            if id(child) in open_:
                here = _path_to(root, node)
                where = key if here == "<root>" else f"{here}.{key}"
                raise ConfigError(f"invalid at {where}: a recursive alias (the value contains itself)")
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes


def _children(node) -> list[tuple[str, object]]:
    """(key, node) of a composed mapping's values and keys, or a sequence's items."""
    if isinstance(node, yaml.MappingNode):
        out = []
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else "<key>"
            out += [(name, key), (name, value)]
        return out
    if isinstance(node, yaml.SequenceNode):
        return [(str(i), item) for i, item in enumerate(node.value)]
    return []


def _path_to(root, target) -> str:
    """The key path of the first occurrence of ``target`` under ``root`` (breadth first)."""
    queue, seen = [(root, "")], set()
    while queue:
        node, path = queue.pop(0)
        if node is target:
            return path or "<root>"
        if id(node) in seen:
            continue
        seen.add(id(node))
        queue += [(child, f"{path}.{key}" if path else key) for key, child in _children(node)]
    return "<root>"


def _check_expansion(root) -> None:
    """Refuse a document whose aliases expand beyond :data:`MAX_CONFIG_VALUES`, naming the key
    path where the expansion lies (from the top, the largest mapping value, as deep as mappings
    go while it is over the bound)."""
    sizes = _expanded_sizes(root)
    total = sizes[id(root)]
    if total <= MAX_CONFIG_VALUES:
        return
    node, path = root, ""
    while isinstance(node, yaml.MappingNode):
        over = [(k, c) for k, c in _children(node) if sizes[id(c)] > MAX_CONFIG_VALUES]
        if not over:
            break
        key, node = max(over, key=lambda kc: sizes[id(kc[1])])
        path = f"{path}.{key}" if path else key
    raise ConfigError(
        f"invalid at {path or '<root>'}: its YAML aliases expand to {sizes[id(node)]:,} values "
        f"({total:,} in the document), more than the {MAX_CONFIG_VALUES:,} a configuration may hold",
        hint="write the values out, or use anchors for small values only; a real pipeline.yaml "
        "holds a few hundred values",
    )


def _load_yaml(text: str):
    """Compose the document, check its expanded size, then construct it."""
    loader = _UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _parse(text: str, label: str) -> dict:
    try:
        data = _load_yaml(text)
        if not isinstance(data, dict):
            raise ConfigError(f"the top level must be a mapping, got {type(data).__name__}")
        _check_values(data, "")
    except ConfigError as exc:
        raise ConfigError(f"{label}: {message_of(exc)}", hint=exc.hint) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{label}: not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{label}: nested too deeply") from None
    return data


def _check_values(value, key: str, _inside: frozenset = frozenset()) -> None:
    """Only what JSON carries (records and ``pipeline.effective.json`` are JSON): mappings,
    lists, strings, booleans, integers, finite numbers and null, and no list that contains
    itself (a recursive YAML alias)."""
    here = key or "<root>"
    if isinstance(value, (dict, list)):
        if id(value) in _inside:
            raise ConfigError(f"invalid at {here}: a recursive alias (the value contains itself)")
        inside = _inside | {id(value)}
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            _check_values(v, f"{key}.{k}" if key else str(k), inside)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"invalid at {here}: {value!r} is not a finite number")
    elif not (value is None or isinstance(value, (str, bool, int))):
        raise ConfigError(
            f"invalid at {here}: YAML read {value!r} as a {type(value).__name__}, "
            "which a configuration cannot hold (quote it if it is text)"
        )


def check_version(value: str, what: str) -> str:
    """A version given on the command line (``what``: e.g. ``doit argument version``) must
    match the schema's pattern in full: no whitespace, newline or control character anywhere."""
    pattern = load_schema("pipeline")["$defs"]["version"]["pattern"]
    if not isinstance(value, str) or not re.fullmatch(ecma_regex(pattern), value):
        raise ConfigError(
            f"{what}={_shown(str(value))}: is not a version (expected e.g. 1.2.0 or 1.2.0-rc.1; "
            f"the schema's pattern {pattern}, in full)"
        )
    return value


VARIABLES = {
    "version": "the version to build or verify (default: pipeline.yaml's version)",
    "config": "the configuration file (default: pipeline.yaml)",
    "release": "a release folder to verify where it lies (doit verify release=<folder>)",
    "wait": "yes (default) or no: whether a run waits for another run of the same version in this checkout",
}


# Names that are task parameters, not variables (``--old 0.1.0``, not ``old=0.1.0``).
TASK_PARAMETERS = {
    name: "release_diff takes it as a parameter: `doit release_diff --old <version> --new <version>`"
    for name in ("old", "new")
}


def check_variables(variables: dict[str, str], given: list[tuple[str, str]] | None = None) -> None:
    """The ``doit`` variables (``name=value``) must be known ones, each given once (``given``:
    every ``name=value`` in the order typed, where known)."""
    seen: dict[str, str] = {}
    for name, value in given or []:
        if name in seen and seen[name] != value:
            raise UsageError(
                f"doit argument {name}= is given twice ({name}={_shown(seen[name])} and "
                f"{name}={_shown(value)}); which one is meant is not clear",
                hint=f"give {name}= once",
            )
        seen[name] = value
    unknown = sorted(set(variables) - set(VARIABLES))
    if unknown and unknown[0] in TASK_PARAMETERS:
        raise UsageError(
            f"doit argument {unknown[0]}={_shown(variables[unknown[0]])}: not a variable of laya-build; "
            f"{TASK_PARAMETERS[unknown[0]]}",
            hint="`doit help <task>` lists a task's parameters",
        )
    if unknown:
        raise UsageError(
            f"doit argument {unknown[0]}={_shown(variables[unknown[0]])}: not a variable of "
            f"laya-build (known: {', '.join(f'{k}=' for k in VARIABLES)})",
            hint="; ".join(f"{k}=: {v}" for k, v in VARIABLES.items()),
        )


def from_command_line(
    variables: dict[str, str], *, root: str | Path = PROJECT_ROOT, given: list[tuple[str, str]] | None = None
) -> Pipeline:
    """The pipeline as ``doit config=... version=... release=...`` asks for it."""
    check_variables(variables, given)
    root = Path(root).resolve()
    version = variables.get("version")
    folder = None
    if variables.get("release") is not None:
        folder, released = release_folder(variables["release"], root)
        if version is not None and version != released:
            raise UsageError(
                f"doit argument release={_shown(variables['release'])} is version {released}, "
                f"not version={_shown(version)}",
                hint="give release= alone, or the matching version=",
            )
        version = released
    wait = variables.get("wait", "yes")
    if wait not in ("yes", "no"):
        raise UsageError(
            f"doit argument wait={_shown(wait)}: expected yes or no",
            hint="wait=no refuses at once when another run builds the same version; without it a run waits",
        )
    pipeline = load(variables.get("config"), root=root, overrides={"version": version}, path_argument="config")
    return Pipeline(
        data=pipeline.data,
        path=pipeline.path,
        root=root,
        release_folder=folder,
        wait=wait == "yes",
        cache=pipeline.cache,
        executor=pipeline.executor,
    )


def release_folder(value: str, root: Path) -> tuple[Path, str]:
    """A release folder given as ``release=`` (relative to the project root) and its version."""
    import json

    from laya_build.layout import MANIFEST_NAME

    label = f"doit argument release={_shown(value)}"
    folder = (root / value).resolve() if value else root
    manifest = folder / MANIFEST_NAME
    if not value or not folder.is_dir():
        raise UsageError(f"{label}: {folder} is not a folder", hint="name a release folder (one with manifest.json)")
    if not manifest.is_file():
        raise UsageError(
            f"{label}: {folder} is not a release (it has no {MANIFEST_NAME})",
            hint="name the folder of a released version, e.g. release=artifacts/0.1.0",
        )
    try:
        version = json.loads(manifest.read_bytes()[: 1 << 24])["version"]
        check_version(version, f"{label}: its manifest's version")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise UsageError(
            f"{label}: {manifest} does not name a version",
            hint="a release's manifest.json is written by `doit release`; restore it from the release",
        ) from None
    return folder, version


def load(
    path: str | Path | None = None,
    *,
    root: str | Path = PROJECT_ROOT,
    overrides: dict | None = None,
    path_argument: str | None = None,
) -> Pipeline:
    """Read, override, validate and return the pipeline configuration.

    ``overrides`` are command-line values (``doit version=X``): an error in one is reported
    as ``doit argument version=X: ...``.  ``path_argument`` names the doit argument a given
    ``path`` came from, for the same purpose.
    """
    root = Path(root).resolve()
    label_prefix = ""
    if path is None:
        path = root / "pipeline.yaml"
    else:
        if path_argument:
            label_prefix = f"{_argument(path_argument, str(path))}: "
        if str(path) == "":
            raise ConfigError(
                f"{label_prefix}empty; expected the path of a configuration file "
                f"(e.g. {path_argument or 'config'}=pipeline.h200.yaml)"
            )
        path = Path(path)
        if not path.is_absolute():
            path = root / path
    data = _parse(_read(path, label_prefix), str(path))

    given = {key: value for key, value in (overrides or {}).items() if value is not None}
    for key, value in given.items():
        if key != "version":
            raise ConfigError(f"{_argument(key, str(value))}: not a setting that can be given on the command line")
        data[key] = check_version(value, f"doit argument {key}")
    try:
        validate("pipeline", data, what=str(path))
    except RecordError as exc:
        raise ConfigError(message_of(exc)) from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply (a recursive alias?)") from None
    _check_kernels(
        data, path, root, version_from=_argument("version", given["version"]) if "version" in given else None
    )
    infra = {name: data.pop(name, None) for name in INFRA_SECTIONS}
    _check_infra(infra, path)
    _merge_model_defaults(data, path)
    _check_model(data, path, root)
    return Pipeline(data=data, path=path, root=root, **infra)


INFRA_SECTIONS = ("cache", "executor")  # where a build's results are shared and its stages run


def _check_infra(infra: dict, path: Path) -> None:
    """The cache url and the executor, with their environment overrides applied (a bad
    ``LAYA_BUILD_CACHE_URL`` is refused like a bad key)."""
    from laya_build.cache.settings import cache_settings
    from laya_build.executors import executor_settings

    cache = cache_settings(infra["cache"], label=str(path))
    executor = executor_settings(infra["executor"], label=str(path))
    if executor is not None and (cache is None or not cache.write):
        why = "no cache is configured" if cache is None else "the cache is read-only here"
        raise ConfigError(
            f"{path}: invalid at executor.kind: executor ray sends a stage's inputs to the cluster and gets "
            f"its outputs back through the cache, and {why}",
            hint="configure a cache the cluster's workers share and this build may write "
            "(cache: {url: s3://bucket/prefix}, or LAYA_BUILD_CACHE_URL), or executor kind local",
        )


MODEL_SECTIONS = ("model", "export", "package", "verify", "latency", "runtime")


def _merge_model_defaults(data: dict, path: Path) -> None:
    """Fill the model sections from ``laya_build/model/defaults.yaml``: ``Pipeline.data`` is
    then the effective configuration that every task reads and a release records."""
    from laya_build.config.sections import section

    for name in MODEL_SECTIONS:
        try:
            data[name] = section(name, data.get(name))
        except ConfigError as exc:
            raise ConfigError(f"{path}: {message_of(exc)}", hint=exc.hint) from None


def _fail(path: Path, key: str, message: str):
    raise ConfigError(f"{path}: invalid at {key}: {message}")


# ------------------------------------------------------------------------------- the checks


def _check_kernels(data: dict, path: Path, root: Path, version_from: str | None) -> None:
    artifacts = (root / ARTIFACTS_DIRNAME).resolve()
    out = (root / data["output_root"]).resolve()
    if out != artifacts:  # a subfolder could be a (released) version folder
        _fail(path, "output_root", f"{data['output_root']!r} resolves to {out}; outputs must go to {artifacts}")

    variants = data["kernels"]["variants"]
    bound = {}
    for name, variant in variants.items():
        bound[name] = _check_variant(path, name, variant)

    checks = data["cpu_checks"]
    for section in ("shapes", "atol_overrides"):
        for name in checks.get(section, {}):
            if name not in variants:
                _fail(path, f"cpu_checks.{section}.{name}", f"no kernel variant named {name!r}")
    for name, variant in variants.items():
        if name not in checks["shapes"]:
            _fail(path, "cpu_checks.shapes", f"kernel variant {name!r} has no check shapes")
        kernel = KERNELS[variant["factory"]]
        for i, shape in enumerate(checks["shapes"][name]):
            try:
                kernel.check_shape(bound[name], shape)
            except ValueError as exc:
                param = getattr(exc, "param", None)
                _fail(path, f"cpu_checks.shapes.{name}.{i}" + (f".{param}" if param else ""), str(exc))

    baseline = data["cuda"].get("baseline")
    if baseline and baseline.get("version") == data["version"]:
        built = f"{data['version']}, from {version_from}" if version_from else data["version"]
        _fail(path, "cuda.baseline.version", f"the baseline cannot be the version being built ({built})")


def _check_variant(path: Path, name: str, variant: dict) -> dict:
    """Bind a variant's arguments as its factory would and run the factory's own argument
    rules (:mod:`kernels.registry`) for the GPU and the fp32 CPU specialisation; return the
    CPU binding (what ``lower_c``'s numerical checks call)."""
    base = f"kernels.variants.{name}"
    kernel = KERNELS.get(variant["factory"])
    if kernel is None:
        _fail(path, f"{base}.factory", f"unknown kernel {variant['factory']!r}; known: {', '.join(sorted(KERNELS))}")
    args, kwargs = variant.get("args", []), variant.get("kwargs", {})

    def key_of(param: str | None) -> str:
        if param in kwargs:
            return f"{base}.kwargs.{param}"
        if param in kernel.positional[: len(args)]:
            return f"{base}.args.{kernel.positional.index(param)}"
        if param is None or any(p.name == param and p.required for p in kernel.params):
            return f"{base}.args"
        return base  # a default, refused together with a given argument

    bound = None
    for stage in ({"cpu": False}, {"cpu": True, "dtype": CPU_DTYPE}):
        try:
            bound = kernel.bind(args, kwargs, **stage)
        except ValueError as exc:
            _fail(path, key_of(getattr(exc, "param", None)), str(exc))
        try:
            kernel.check(bound)
        except ValueError as exc:
            _fail(path, key_of(getattr(exc, "param", None)), f"{kernel.factory}: {exc}")
    return bound


def _check_model(data: dict, path: Path, root: Path) -> None:
    """The effective model sections: a local checkpoint is a folder, the batch layout fits
    the export ranges, and every package that is built has verification thresholds."""
    from laya_build.runtime.buckets import check_config as check_buckets
    from laya_build.stages.package_tuning import padding_refusal

    local = data["model"].get("path")
    if local is not None and not (root / local).is_dir():
        _fail(path, "model.path", f"{local!r} ({(root / local).resolve()}) is not a checkpoint folder")
    for build, tuning in data["package"].get("tuning", {}).items():
        if not (root / tuning).is_file():
            _fail(
                path,
                f"package.tuning.{build}",
                f"{tuning!r} ({(root / tuning).resolve()}) is no file: a build writes its tuning as "
                "tuning.json beside its packages; copy that one here, or remove the key",
            )
        if padding := padding_refusal(data["package"].get("inductor_configs"), build):
            _fail(path, "package.inductor_configs.shape_padding", padding)
    try:
        check_export_layout(planned_shapes(data["model"]["inputs"]), data["export"])
    except LayoutError as exc:
        _fail(path, exc.key, exc.detail)
    thresholds = data["verify"]["thresholds"]
    for target, dtype in model_builds(data):
        if dtype not in thresholds.get(target, {}):
            _fail(
                path,
                f"verify.thresholds.{target}.{dtype}",
                f"no verification thresholds for the {target} {dtype} package, which is built "
                f"(package.targets has {target}, export.targets.{target} has {dtype})",
            )
    try:
        check_buckets(data)  # runtime.buckets inside export.dims (checked after the batch layout)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {message_of(exc)}", hint=exc.hint) from None
