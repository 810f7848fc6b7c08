"""What a stage can read, derived from the sources: the dependencies of its tasks.

A stage task depends on every project file its process can import or read: the import
closure of its entry modules (``import`` statements anywhere in a module, function bodies
included), the project modules and files its code names in string constants (a child
module named ``"laya_build.stages.children.package"``, a script named by its file name, a
data file ``probe_pins.json``), the JSON Schemas it validates against (with their ``$ref``
closure) and the third-party distributions it imports (for the toolchain check).  Nothing
is imported to find this: sources are parsed with :mod:`ast`, once per process.

Standard-library and installed modules are not files of the project; they enter the
up-to-date check through the installed versions instead (:mod:`laya_build.environment`).
"""

from __future__ import annotations

import ast
import atexit
import functools
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from laya_build import PROJECT_ROOT, SCHEMA_DIR
from laya_build.layout import ARTIFACTS_DIR, CACHE_DIR, DEPS_CACHE_NAME
from laya_build.stage import Stage

# The project's own top-level packages: their modules are files of the build.
PROJECT_PACKAGES = ("laya_build", "kernels")
SOURCE_SUFFIXES = (".py",)
# Non-Python files a module can name (data, pinned diagnostics, configuration defaults).
DATA_SUFFIXES = (".json", ".yaml", ".yml", ".txt")
# Installed packages that import a project package by its name: transformers probes for
# Hugging Face's optional ``kernels`` package with ``importlib.util.find_spec`` and, finding
# ours on sys.path without a version, imports it (transformers/utils/import_utils.py,
# ``_is_package_available``).  Seen by the file tracer of tests/pipeline/test_dependencies.py.
IMPORTS_BY_NAME = {"transformers": ("kernels",)}


@dataclass(frozen=True)
class ModuleInfo:
    """What one source file imports and names, as parsed."""

    path: Path
    imports: frozenset[str]  # absolute dotted names (project and third-party)
    strings: frozenset[str]  # string constants (candidate module and file names)
    names: frozenset[tuple[str, str]]  # (package, name): ``from package import name``, ``package.name``
    exports: dict  # a package's name -> defining module (its imports and lazy export tables)


class Project:
    """The sources of one project root, parsed lazily and cached."""

    def __init__(self, root: Path = PROJECT_ROOT):
        self.root = Path(root).resolve()
        self._modules: dict[str, Path] | None = None
        self._files_by_name: dict[str, list[Path]] | None = None

    # ----------------------------------------------------------------------- inventory
    @property
    def modules(self) -> dict[str, Path]:
        """Dotted module name -> source file, for every module of the project packages."""
        if self._modules is None:
            found: dict[str, Path] = {}
            for pkg in PROJECT_PACKAGES:
                for path in sorted((self.root / pkg).rglob("*.py")):
                    rel = path.relative_to(self.root).with_suffix("")
                    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
                    if "__pycache__" not in parts:
                        found[".".join(parts)] = path
            self._modules = found
        return self._modules

    @property
    def files_by_name(self) -> dict[str, list[Path]]:
        """Base name -> project files (sources and data) of that name."""
        if self._files_by_name is None:
            index: dict[str, list[Path]] = {}
            for pkg in PROJECT_PACKAGES:
                for path in sorted((self.root / pkg).rglob("*")):
                    if (
                        path.is_file()
                        and path.suffix in SOURCE_SUFFIXES + DATA_SUFFIXES
                        and "__pycache__" not in path.parts
                    ):
                        index.setdefault(path.name, []).append(path)
            self._files_by_name = index
        return self._files_by_name

    def module_of(self, path: Path) -> str | None:
        if not hasattr(self, "_by_path"):
            self._by_path = {p: name for name, p in self.modules.items()}
        return self._by_path.get(Path(path))

    # ------------------------------------------------------------------------- parsing
    @functools.cache
    def info(self, module: str) -> ModuleInfo:
        """What ``module`` imports and names, parsed (or taken from the parse cache, keyed by
        the sha256 of the source: parsing all the sources is most of building the graph)."""
        path = self.modules[module]
        source = path.read_bytes()
        key = f"{module}:{hashlib.sha256(source).hexdigest()}"
        cached = self._parse_cache().get(key)
        if cached is None:
            cached = self._parse(module, path, source)
            self._parse_cache()[key] = cached
            self._dirty = True
        return ModuleInfo(
            path,
            frozenset(cached["imports"]),
            frozenset(cached["strings"]),
            frozenset(tuple(n) for n in cached["names"]),
            dict(cached["exports"]),
        )

    def _parse_cache(self) -> dict:
        if not hasattr(self, "_cache"):
            try:
                self._cache = json.loads(self._cache_path.read_text())
                if not isinstance(self._cache, dict):
                    self._cache = {}
            except (OSError, ValueError):
                self._cache = {}
            self._dirty = False
        return self._cache

    @property
    def _cache_path(self) -> Path:
        return self.root / ARTIFACTS_DIR / CACHE_DIR / DEPS_CACHE_NAME

    def save_cache(self) -> None:
        """Keep this process's parses for the next (atomically; entries of sources that no
        longer exist are dropped)."""
        if not getattr(self, "_dirty", False):
            return
        live = {f"{m}:{hashlib.sha256(self.modules[m].read_bytes()).hexdigest()}" for m in self.modules}
        from laya_build.atomic import write_json
        from laya_build.errors import DiskFullError

        try:
            write_json(self._cache_path, {k: v for k, v in self._cache.items() if k in live})
            self._dirty = False
        except (OSError, DiskFullError):
            pass  # a cache: a read-only checkout, or a full disk, parses every time

    def _parse(self, module: str, path: Path, source: bytes) -> dict:
        tree = ast.parse(source, filename=str(path))
        is_pkg = path.name == "__init__.py"
        package = module if is_pkg else module.rpartition(".")[0]
        imports: set[str] = set()
        strings: set[str] = set()
        names: set[tuple[str, str]] = set()
        exports: dict[str, str] = {}
        aliases: dict[str, str] = {}  # local name -> project package bound by ``import``
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imports.update(alias.name for alias in node.names)
                aliases.update(
                    {
                        (a.asname or a.name).split(".")[0]: (a.name if a.asname else a.name.split(".")[0])
                        for a in node.names
                        if a.name.split(".")[0] in PROJECT_PACKAGES
                    }
                )
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_from(package, node.module, node.level)
                if base is None:
                    continue
                imports.add(base)
                for alias in node.names:
                    if alias.name != "*":
                        names.add((base, alias.name))
                        exports[alias.asname or alias.name] = base
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 200:
                strings.add(node.value)
            elif isinstance(node, ast.Dict) and is_pkg:
                # a lazy export table (PEP 562 ``__getattr__``): {"name": ".submodule", ...}
                for key, value in zip(node.keys, node.values):
                    if (
                        isinstance(key, ast.Constant)
                        and isinstance(value, ast.Constant)
                        and isinstance(key.value, str)
                        and isinstance(value.value, str)
                    ):
                        sub = value.value.lstrip(".")
                        if f"{module}.{sub}" in self.modules:
                            exports.setdefault(key.value, f"{module}.{sub}")
        for node in ast.walk(tree):  # ``pkg.name`` through a package bound by ``import pkg``
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                names.add((aliases[node.value.id], node.attr))
        return {"imports": sorted(imports), "strings": sorted(strings), "names": sorted(names), "exports": exports}

    # ------------------------------------------------------------------------- closure
    def _with_parents(self, name: str) -> list[str]:
        """``a.b.c`` -> the project modules ``a``, ``a.b``, ``a.b.c`` that exist (importing a
        submodule runs every parent package's ``__init__``)."""
        parts = name.split(".")
        return [m for i in range(1, len(parts) + 1) if (m := ".".join(parts[:i])) in self.modules]

    def _sibling(self, module: str, top: str) -> str | None:
        """The project module ``top`` names when imported from a script run beside it."""
        path = self.modules[module].parent / f"{top}.py"
        return self.module_of(path) if path.is_file() else None

    @functools.cached_property
    def _all_files(self) -> frozenset[str]:
        return frozenset(str(p) for paths in self.files_by_name.values() for p in paths)

    def _named_files(self, module: str, value: str) -> list[Path]:
        """Project files a string constant of ``module`` names: a path relative to the
        module's folder or to the project root, or the base name of exactly one file."""
        if "\n" in value or not value or value.startswith(".") or not value.endswith(SOURCE_SUFFIXES + DATA_SUFFIXES):
            return []
        here = self.modules[module].parent
        for base in (here, self.root):
            candidate = os.path.normpath(os.path.join(base, value))
            if candidate in self._all_files:
                return [Path(candidate)]
        named = self.files_by_name.get(value, [])
        return named if len(named) == 1 else []

    @functools.cache
    def edges(self, module: str) -> tuple[tuple[str, ...], frozenset[Path], frozenset[str]]:
        """What ``module`` itself leads to: (project modules, data files, third-party imports)."""
        info = self.info(module)
        modules: list[str] = []
        files: set[Path] = set()
        third_party: set[str] = set()
        for name in info.imports:
            top = name.split(".")[0]
            if top in PROJECT_PACKAGES:
                modules.extend(self._with_parents(name))
            elif (sibling := self._sibling(module, top)) is not None:
                modules.append(sibling)  # a script's ``import helper`` of a module beside it
            elif top not in sys.stdlib_module_names:
                third_party.add(top)
                modules.extend(m for m in IMPORTS_BY_NAME.get(top, ()) if m in self.modules)
        for pkg, name in info.names:  # ``from pkg import name``: the module defining name
            if f"{pkg}.{name}" in self.modules:
                modules.extend(self._with_parents(f"{pkg}.{name}"))
            elif (
                pkg in self.modules
                and (origin := self.info(pkg).exports.get(name))
                and origin in self.modules
                and origin != pkg
            ):
                modules.extend(self._with_parents(origin))
        for value in info.strings:
            if value.split(".")[0] in PROJECT_PACKAGES and value in self.modules:
                modules.extend(self._with_parents(value))  # a module run as ``-m <name>``
                continue
            for path in self._named_files(module, value):
                if path.suffix == ".py":
                    if (named := self.module_of(path)) is not None:
                        modules.extend(self._with_parents(named))
                else:
                    files.add(path)
        return tuple(dict.fromkeys(modules)), frozenset(files), frozenset(third_party)

    @functools.cache
    def closure(
        self, entries: tuple[str, ...], exclude: tuple[str, ...] = ()
    ) -> tuple[frozenset[Path], frozenset[str]]:
        """(project files, third-party top-level imports) reachable from ``entries``, not
        following the project packages of ``exclude`` (e.g. ``kernels``, when a stage runs
        another revision's)."""
        missing = [e for e in entries if e not in self.modules]
        if missing:
            raise LookupError(f"not project modules: {', '.join(missing)}")
        files: set[Path] = set()
        third_party: set[str] = set()
        todo = [m for e in entries for m in self._with_parents(e)]
        seen: set[str] = set()
        while todo:
            module = todo.pop()
            if module in seen or module.split(".")[0] in exclude:
                continue
            seen.add(module)
            files.add(self.modules[module])
            modules, data, imports = self.edges(module)
            todo.extend(modules)
            files |= data
            third_party |= imports
        return frozenset(files), frozenset(third_party)


def _resolve_from(package: str, module: str | None, level: int) -> str | None:
    if level == 0:
        return module
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return None
    base = parts[: len(parts) - (level - 1)]
    if module:
        base.append(module)
    return ".".join(base) or None


@functools.cache
def _schemas(schema_dir: Path) -> tuple[dict[str, Path], dict[Path, tuple[str, ...]]]:
    """(``$id`` or file name -> schema file, schema file -> the ``$ref`` targets it names)."""
    by_id: dict[str, Path] = {}
    refs: dict[Path, tuple[str, ...]] = {}
    for path in sorted(schema_dir.glob("*.schema.json")):
        doc = json.loads(path.read_text())
        by_id[doc.get("$id", path.name)] = by_id[path.name] = path
        refs[path] = tuple({r.split("#", 1)[0] for r in _refs(doc)} - {""})
    return by_id, refs


@functools.cache
def schema_closure(schema_dir: Path, names: tuple[str, ...]) -> frozenset[Path]:
    """``schemas/<name>.schema.json`` of each name and every schema they ``$ref``."""
    by_id, refs = _schemas(schema_dir)
    out: set[Path] = set()
    todo = [schema_dir / f"{n}.schema.json" for n in names]
    while todo:
        path = todo.pop()
        if path in out or path not in refs:
            continue
        out.add(path)
        for target in refs[path]:
            if found := by_id.get(target) or by_id.get(target.rsplit("/", 1)[-1]):
                todo.append(found)
    return frozenset(out)


def _refs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


@functools.cache
def project(root: Path = PROJECT_ROOT) -> Project:
    """The sources of ``root``; the parse cache is saved when the process ends."""
    found = Project(root)
    atexit.register(found.save_cache)
    return found


@functools.cache
def module_constant(module: str, name: str, default=None, root: Path = PROJECT_ROOT):
    """The literal value of a module-level ``NAME = <literal>`` of a project module, read
    without importing it (e.g. a stage's ``TOOLS``)."""
    path = project(root).modules[module]
    for node in ast.parse(path.read_bytes()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    return default


RUNNER = ("laya_build.runner", "laya_build.runner.__main__")  # what every stage process runs first


STARTS_PROCESSES = "laya_build.runner.process"  # who imports it can start stage processes


def code_deps(root: Path, stage: Stage) -> tuple[list[str], frozenset[str]]:
    """(project files + schema files, third-party imports) of a stage's process: the runner's
    entry as well for a stage run in a process of its own, and for an inline stage that starts
    such processes itself (``verify``: the fresh verification process runs the runner's entry)."""
    graph = project(root)
    files, third_party = graph.closure((stage.module, *stage.code), exclude=stage.code_excluded)
    if stage.process != "inline" or graph.modules.get(STARTS_PROCESSES) in files:
        runner_files, runner_imports = graph.closure(RUNNER, exclude=stage.code_excluded)
        files, third_party = files | runner_files, third_party | runner_imports
    schema_files = schema_closure(root / SCHEMA_DIR.name, stage.schemas)
    return sorted(str(f) for f in files | schema_files), third_party


def stage_tools(stage, root: Path = PROJECT_ROOT) -> tuple[str, ...]:
    """The compilers a stage task runs, part of its up-to-date check and cache key: its module's
    ``TOOLS`` and those its configuration adds (``stage.tools``: the export's C++ compiler when
    it builds the native op library)."""
    return tuple(dict.fromkeys((*module_constant(stage.module, "TOOLS", (), root=root), *stage.tools)))
