"""Test-only: record every file a Python process opens (imports included), for the
dependency oracle of tests/pipeline/test_dependencies.py.

Active only when ``LAYA_TRACE_DIR`` is set; every process (fork-server children and the
stages' own child processes included: they inherit PYTHONPATH) appends one line per newly
opened file to ``<LAYA_TRACE_DIR>/<pid>.txt``, as ``<argv0>\\t<path>\\t<task>``, where
``<task>`` is the doit task the process serves (``LAYA_TASK``, set by the process runner
and inherited by the stage's own children; empty in doit and the fork server).
"""

import os
import sys

_DIR = os.environ.get("LAYA_TRACE_DIR")

if _DIR:
    _seen: set = set()
    _busy = [False]

    def _hook(event, args):
        if event != "open" or _busy[0] or not args:
            return
        path = args[0]
        if isinstance(path, int) or path is None:
            return
        try:
            path = os.path.abspath(os.fsdecode(path))
        except TypeError:
            return
        key = (os.getpid(), path)
        if key in _seen:
            return
        _seen.add(key)
        _busy[0] = True
        try:
            fd = os.open(os.path.join(_DIR, f"{os.getpid()}.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                task = os.environ.get("LAYA_TASK", "")
                os.write(fd, f"{sys.argv[0] if sys.argv else ''}\t{path}\t{task}\n".encode())
            finally:
                os.close(fd)
        finally:
            _busy[0] = False

    sys.addaudithook(_hook)
