"""How a task's expected failure reaches doit: a :class:`~laya_build.errors.LayaBuildError`
becomes a ``TaskFailed`` carrying its message and hint (a user error a
:class:`UserTaskFailed`, which makes ``doit`` exit 3: :mod:`laya_build.tasks.exits`)."""

from __future__ import annotations

import functools

from doit.exceptions import TaskFailed

from laya_build.errors import LayaBuildError, UserError


class UserTaskFailed(TaskFailed):
    """A task that failed because of what it was asked (a configuration or command-line error):
    ``doit`` then exits 3, not 1 (:mod:`laya_build.tasks.exits`)."""


def failure(exc: LayaBuildError, prefix: str = "") -> TaskFailed:
    text = f"laya-build: {type(exc).__name__}: {prefix}{exc}"
    return UserTaskFailed(text) if isinstance(exc, UserError) else TaskFailed(text)


def reported(prefix: str = ""):
    """Decorate a doit python-action: an expected failure (any :class:`LayaBuildError`)
    becomes a ``TaskFailed`` with its message and hint, not a traceback."""

    def wrap(fn):
        @functools.wraps(fn)
        def action(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except LayaBuildError as exc:
                return failure(exc, prefix)

        return action

    return wrap
