"""The serving runtime of a decision package (torch and the standard library only).

* :mod:`.serving`: open a release or a build, check every file against its manifest or record
  before it is used, load the package fast, pad calls to buckets and replay CUDA graphs
  (:func:`open_release`, :func:`open_build`, :class:`DecisionRunner`);
* :mod:`.buckets`: the export ranges and runtime buckets (no torch: the configuration loader
  checks ``runtime.buckets`` with it);
* :mod:`.formats`: the saved-input and eager-output formats, calling a program on saved batches;
* :mod:`.parity`: comparing heads, decision probabilities calibrated as upstream Laya publishes them;
* :mod:`.timing`: timing calls to a budget (``torch.utils.benchmark``);
* :mod:`.gpu_state`: the GPU's clocks, power and clock limits while calls are timed (``nvidia-smi``;
  no torch);
* :mod:`.digest`: a file's sha256 in large blocks (no torch);
* :mod:`.preload`: what a process loads before a package (no torch).

``laya_build.runtime.<name>`` is :mod:`.serving`'s, imported when first asked for, so that
importing :mod:`.buckets` imports no torch.
"""

from __future__ import annotations

import importlib

SUBMODULES = ("serving", "start", "buckets", "digest", "preload", "formats", "parity", "timing", "gpu_state")


def __getattr__(name: str):
    if name.startswith("__") or name in SUBMODULES:  # a submodule is imported by the import system itself
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("laya_build.runtime.serving"), name)
