"""Test-wide setup: offline, project root importable, and how tests share the cores.

The suite runs on every core with pytest-xdist (``-n auto``, pyproject.toml): most of its
time is real builds, and a build has long one-core stretches (an AOTInductor compile,
``torch.compile``, TileLang's layout inference) that another test can use.  What runs where:

* a work unit is a test module, or a whole test directory whose ``conftest.py`` has
  session-scoped fixtures (``tests/stages`` builds its packages once per session): nothing
  built once is built again by another worker (:func:`work_unit`; the scheduler below);
* modules marked ``build`` (real builds, minutes on the CI machine) go first, heaviest first
  by their marker's ``seconds`` estimate, so no long unit starts last while the other worker
  idles.  ``pytest -m "not build"`` leaves them out (the quick loop).
"""

import ast
import functools
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# One OpenMP thread per process: the suite already keeps every core busy with one worker per
# core and their builds' processes, and torch's default (a thread per core in every process)
# only oversubscribes them (2-core machine, 2026-11-30: 390 s with one thread, 407 s with two).  Timings in the
# tests' records are not compared with anything; a build outside the suite is unaffected.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# No build cache unless a test asks for one (``LAYA_BUILD_CACHE=on`` with its own url): a
# developer's LAYA_BUILD_CACHE_URL must not answer the builds a test means to run.
os.environ["LAYA_BUILD_CACHE"] = "off"
# The processes a test starts write each line when it is printed: tests read doit's task lines
# and a stage's messages as they come, to act between them (a kill at a task, a second run).
os.environ.setdefault("PYTHONUNBUFFERED", "1")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "build(seconds): the module runs real builds (about `seconds` on the "
        "2-core CI machine); `-m 'not build'` leaves them out",
    )


@functools.cache
def _session_fixtures_in(directory: str) -> bool:
    """Whether ``directory/conftest.py`` defines a session-scoped fixture."""
    conftest = ROOT / directory / "conftest.py"
    if not conftest.is_file():
        return False
    for node in ast.walk(ast.parse(conftest.read_text())):
        if isinstance(node, ast.Call) and any(
            k.arg == "scope" and getattr(k.value, "value", None) == "session" for k in node.keywords
        ):
            return True
    return False


def work_unit(nodeid: str) -> str:
    """The unit of tests one worker runs together: the module, or its directory when that
    directory's conftest builds something once per session."""
    module = nodeid.split("::")[0]
    directory = os.path.dirname(module)
    return directory if _session_fixtures_in(directory) else module


@pytest.hookimpl(optionalhook=True)  # a run without pytest-xdist (-p no:xdist) has no such hook
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        """xdist's loadscope with :func:`work_unit` as the scope (units in collection order:
        ``--no-loadscope-reorder``)."""

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WorkUnitScheduling(config, log)


def _cost(item) -> float:
    marker = item.get_closest_marker("build")
    return float(marker.kwargs.get("seconds", 60)) if marker else 0.0


def pytest_collection_modifyitems(config, items):
    """Heaviest work unit first (the sum of its modules' ``build`` estimates), otherwise in
    collection order."""
    module_cost = {item.nodeid.split("::")[0]: (work_unit(item.nodeid), _cost(item)) for item in items}
    cost: dict[str, float] = {}
    for unit, seconds in module_cost.values():
        cost[unit] = cost.get(unit, 0.0) + seconds
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(work_unit(item.nodeid), i)
    # a stable sort: within a unit, collection order
    items.sort(key=lambda it: (-cost[work_unit(it.nodeid)], first[work_unit(it.nodeid)]))
