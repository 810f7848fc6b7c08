"""Linear layers computed as a product and a sum (``export.fused_linears``), fused with their neighbours.

A linear layer exports as a GEMM, which a package runs as a BLAS call of its own.  For a layer
with a handful of outputs a row, such as the scorer's last layer (one output a marker), the call
costs its launch, not its arithmetic: on the H200 cuBLAS runs it as a dot kernel and a reduction
kernel, 3.4 µs, after a separate GELU kernel.  :class:`FusedLinear` computes the same layer as
``sum(x * weight, -1) + bias`` with an fp32 sum, which a compiler turns into a reduction of its
own and fuses with the pointwise work before and after it (there: one kernel of 1.3 µs).

Each row's product and sum touches the whole weight, so this suits layers whose weight is
small (a compiler re-reads it for every row, from cache); a GEMM stays the right kernel for the
encoder's and the head's large layers. Fewer kernels is not always faster: on the H200 the act
head's two layers fused as well took 8 µs less GPU work a 1x128 forward under the profiler, and the
graph replayed 0.007-0.021 ms faster back to back, but 0.08 ms slower right after the package's
plain call, which makes the other packages' replays faster (docs/measurements/runtime-h200.md, "Top
two without a sort, small linear layers fused" and "two replay speeds"). Measure a choice. The
outputs differ from the GEMM's by rounding: the terms are added in another order, in fp32, and the
result rounded to the layer's dtype once.
"""

from __future__ import annotations

import torch
from torch import nn

READS_WEIGHTS = (nn.MultiheadAttention, nn.TransformerEncoderLayer)  # modules that may bypass a linear layer's forward


class FusedLinear(nn.Module):
    """``linear``'s layer (the same ``weight`` and ``bias`` parameters, so the same state dict)
    as ``sum(x * weight, -1) + bias`` in fp32, rounded to ``x``'s dtype."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = (x.unsqueeze(-2).float() * self.weight.float()).sum(-1)
        if self.bias is not None:
            out = out + self.bias.float()
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def candidates(model: nn.Module) -> list[str]:
    """The names :func:`use` takes: every linear layer the forward always calls as a module.  Not
    the encoder's (GEMM-sized), nor those inside an ``nn.MultiheadAttention`` or an
    ``nn.TransformerEncoderLayer``: those modules may read a layer's weight themselves (the output
    projection; their fused inference path), and a replaced layer would then not be used.  Laya's
    ``scorer.1`` (hidden x hidden) is among them but is no small layer: fused, each of its rows
    re-reads the whole weight."""
    owners = [name for name, m in model.named_modules() if isinstance(m, READS_WEIGHTS)]
    return [
        name
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear)
        and not name.startswith("encoder.")
        and not any(name.startswith(o + ".") for o in owners)
    ]


def use(model: nn.Module, names: list[str]) -> None:
    """Replace each linear layer of ``names`` (module paths, of :func:`candidates`) by a
    :class:`FusedLinear` of the same parameters."""
    replace(model, names, "export.fused_linears", "fuse", FusedLinear)


def replace(model: nn.Module, names: list[str], option: str, verb: str, make, check=None) -> None:
    """Replace each linear layer of ``names`` (module paths, of :func:`candidates`) by
    ``make(layer)``, after every name has been checked: a name :func:`candidates` lacks is refused
    as ``option``'s, with the names it takes; ``check(name)`` may raise a ValueError of its own."""
    allowed = candidates(model)
    for name in names:
        if name not in allowed:
            raise ValueError(
                f"{option} {name!r} is not a linear layer this model's forward can {verb}; "
                f"name one of {', '.join(allowed)}"
            )
        if check is not None:
            check(name)
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, child, make(getattr(owner, child)))
