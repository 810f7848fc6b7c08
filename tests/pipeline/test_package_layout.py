"""The package's shape: no import circle among laya_build's modules (any import, at the top of a
module or inside a function), and file names of records spelled in layout only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "laya_build"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports, at its top or inside its functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    graph = {}
    for name, path in files.items():
        deps = imports(path, set(files))
        # importing a.b.c runs a/__init__ and a/b/__init__ first
        graph[name] = {d for d in deps if d != name} | {p for p in _parents(name) if p in files}
    return graph


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports in ``graph`` (module -> the modules it imports), or None.  A package's
    ``__init__`` importing its own submodules is no circle (Python imports the package first)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        # Python imports a module's packages before the module itself starts
        for parent in _parents(node):
            if parent in graph and parent not in state and (found := visit(parent)):
                return found
        if node in state:  # imported by its own package's __init__
            return None
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1 and dep not in _parents(node):
                return stack[stack.index(dep) :] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle():
    circle = find_circle(import_graph())
    assert circle is None, "import circle: " + " -> ".join(circle)


def test_a_circle_is_found():
    graph = {"laya_build.a": {"laya_build.b"}, "laya_build.b": {"laya_build.c"}, "laya_build.c": {"laya_build.a"}}
    assert find_circle(graph) == ["laya_build.a", "laya_build.b", "laya_build.c", "laya_build.a"]
    assert find_circle({"laya_build.p": {"laya_build.p.x"}, "laya_build.p.x": {"laya_build.p"}}) is None
    # importing p.leaf first runs p/__init__, which imports p.user, which imports p.leaf: no circle
    parents_first = {
        "laya_build.p": {"laya_build.p.user"},
        "laya_build.p.user": {"laya_build.p", "laya_build.p.leaf"},
        "laya_build.p.leaf": {"laya_build.p"},
        "laya_build.a": {"laya_build.p.leaf"},
    }
    assert find_circle(parents_first) is None
    parents_first["laya_build.p.leaf"].add("laya_build.a")  # ... unless the leaf imports back
    assert find_circle(parents_first) is not None


STAGE_RECORDS = re.compile(r'"(model|export|aoti_package|verify|latency|cuda_diff|manifest)\.json"')


def test_record_file_names_come_from_layout():
    spelled = [
        f"{p.relative_to(ROOT)}:{m.group(0)}"
        for p in PACKAGE.rglob("*.py")
        if p.name != "layout.py"
        for m in STAGE_RECORDS.finditer(p.read_text())
    ]
    assert not spelled, f"record file names spelled outside laya_build/layout.py: {spelled}"


def test_the_tree_is_linted_and_formatted():
    """``ruff check`` and ``ruff format --check`` (configured in pyproject.toml) find nothing."""
    import subprocess
    import sys

    for args in (["check", "."], ["format", "--check", "."]):
        run = subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)
        assert run.returncode == 0, f"ruff {' '.join(args)}:\n{run.stdout}{run.stderr}"
