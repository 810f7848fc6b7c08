"""Processes of a build: the one runner of stage functions and of their children.

* :mod:`.process`: :func:`run` a function in a fresh interpreter or a fork-server child
  (:class:`Child` says how), timeouts that end a process group; :mod:`.child`: the child's
  side (its environment, running one request);
* :mod:`.forkserver`: the build's fork server, shared by doit's workers;
* :mod:`.folders`: a user's folders outside every checkout (server places, Inductor caches);
* :mod:`.stage`: running a :class:`laya_build.stage.Stage` (immutability, outputs, record).

``python -m laya_build.runner`` is the stage process itself (a request on stdin) or, with
``--server``, a fork server.  This package imports only the standard library and
:mod:`laya_build.errors` at first: the fresh verification process loads it and must not
load more than the serving runtime.
"""

from __future__ import annotations

import json
import sys

from laya_build.runner.child import execute
from laya_build.runner.process import Child, run

__all__ = ["Child", "run", "execute"]


def _main() -> int:
    if sys.argv[1:2] == ["--server"]:
        from laya_build.runner.forkserver import serve

        return serve(sys.argv[2], int(sys.argv[3]))
    from laya_build.runner import lifetime

    lifetime.lead_own_group()  # a fresh stage process: its group (and compilers) end when its parent dies
    return execute(json.loads(sys.stdin.read()))
