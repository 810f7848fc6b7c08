"""How the encoder's MLP runs in an export (``export.mlp``).

- ``module``: transformers' ``ModernBertMLP`` as it is: ``Wi``, ``chunk``, the activation, the
  product, ``Wo``; a compiler fuses the middle into a kernel of its own.
- ``fused``: the activation and product as ``laya::geglu`` (:mod:`laya_build.model.geglu`), one
  Triton kernel of a fixed launch configuration between the two GEMMs.  Off CUDA the op runs the
  module's own ops, so the outputs there are ``module``'s bit for bit.
"""

from __future__ import annotations

import importlib
import types

import torch

MODES = ("module", "fused")  # export.mlp's values


def use(model: torch.nn.Module, mode: str) -> None:
    """Run ``model``'s encoder MLPs as ``mode`` (one of :data:`MODES`)."""
    if mode not in MODES:
        raise ValueError(f"export.mlp {mode!r} is not one of {', '.join(MODES)}")
    if mode == "module":
        return
    kernel = geglu_module()
    for layer in model.encoder.layers:
        refusal = kernel.refusal(layer.mlp)
        if refusal:
            raise ValueError(f"export.mlp fused needs {refusal}: choose module for this model")
        layer.mlp.forward = types.MethodType(fused_forward, layer.mlp)


def fused_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return self.Wo(self.drop(torch.ops.laya.geglu(self.Wi(hidden_states))))


def geglu_module():
    """:mod:`laya_build.model.geglu` (it registers ``laya::geglu``), or a ValueError that says
    what is missing."""
    try:
        return importlib.import_module("laya_build.model.geglu")
    except ImportError as exc:
        raise ValueError(
            f"export.mlp fused needs Triton, which does not import here ({exc}); "
            "install the project's requirements.txt or choose module"
        ) from None
