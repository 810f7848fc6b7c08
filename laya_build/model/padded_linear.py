"""Linear layers whose input width is padded with zeros to a multiple of 8 (``export.padded_linears``).

cuBLAS reads a half-precision matrix in 16-byte vectors only where its leading dimension is a
multiple of 8 elements.  Laya's act head takes ``hidden + 4`` features (the class state, top1,
the margin, the normalised entropy and the option count): 1,028 at a hidden size of 1,024, so its
first layer's GEMM runs one of cuBLAS's kernels for misaligned matrices (on the H200 a CUTLASS
``wmma`` kernel ``..._align2``, 9.9 µs at 7 rows; docs/measurements/runtime-h200.md).
:class:`PaddedLinear` multiplies ``[x, 0]`` by ``[W, 0]`` instead, both ``in_features`` rounded up to
:data:`MULTIPLE`: the same sum with zeros added, so the outputs are the GEMM's up to the order of
its additions.  The padded weight is a buffer made once at export (a constant of the package); the
layer keeps its own ``weight`` and ``bias`` parameters, so the state dict is the checkpoint's.
The input's zeros cost nothing where a compiler writes them with the kernel that makes ``x``
(for the act head: the concatenation of its features).
"""

from __future__ import annotations

import torch
from torch import nn

from laya_build.model.fused_linear import replace

MULTIPLE = 8  # elements: 16 bytes of bf16 or fp16


class PaddedLinear(nn.Module):
    """``linear``'s layer (its ``weight`` and ``bias`` parameters) computed on inputs and weights
    padded with zero columns to a multiple of :data:`MULTIPLE`."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.pad = -self.in_features % MULTIPLE
        padded = nn.functional.pad(linear.weight.detach(), (0, self.pad)).contiguous()
        self.register_buffer("padded_weight", padded, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(nn.functional.pad(x, (0, self.pad)), self.padded_weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features} (+{self.pad} zeros), out_features={self.out_features}"


def use(model: nn.Module, names: list[str], fused: list[str] = ()) -> None:
    """Replace each linear layer of ``names`` (module paths of
    :func:`laya_build.model.fused_linear.candidates`, whose input width is no multiple of
    :data:`MULTIPLE`, none of them in ``fused``: ``export.fused_linears``) by a
    :class:`PaddedLinear` of the same parameters."""

    def check(name: str) -> None:
        if name in fused:
            raise ValueError(
                f"export.padded_linears {name!r} is also in export.fused_linears: a layer is padded or fused, "
                "not both; name it in one of them"
            )
        width = model.get_submodule(name).in_features
        if width % MULTIPLE == 0:
            raise ValueError(
                f"export.padded_linears {name!r} takes {width} inputs, already a multiple of {MULTIPLE}: "
                "it has nothing to pad; leave it out"
            )

    replace(model, names, "export.padded_linears", "pad", PaddedLinear, check)
