"""Progress lines of laya-build, through :mod:`logging` (logger ``laya_build``).

Lines go to whatever ``sys.stdout`` is when they are emitted: doit captures a python-action's
stdout and shows it with the task, and a stage process's stdout streams to the doit process
(:mod:`laya_build.runner`).  ``LAYA_LOG_LEVEL`` (default ``INFO``) filters them.
"""

from __future__ import annotations

import logging
import os
import sys


class _CurrentStdout(logging.StreamHandler):
    """A handler bound to the current ``sys.stdout`` at each record, not at creation."""

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ assigns it; the property wins
        pass


def get_logger(name: str = "laya_build") -> logging.Logger:
    root = logging.getLogger("laya_build")
    if not root.handlers:
        handler = _CurrentStdout()
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
        root.setLevel(os.environ.get("LAYA_LOG_LEVEL", "INFO").upper())
        root.propagate = False
    return logging.getLogger(name)
