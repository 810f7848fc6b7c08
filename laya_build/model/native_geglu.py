"""An encoder MLP's first GEMM and its gated GELU as one op of the native library (``export.native_geglu``).

ModernBERT's MLP computes ``input, gate = Wi(x).chunk(2, -1)``, then ``act(input) * gate``:
compiled as written, a GEMM that writes ``2 x intermediate`` columns a position and a pointwise
kernel that reads them all back and writes half as many.  On the H100 at 7 x 256 that kernel took
8.8 µs a layer beside the GEMM's 26.7 µs (docs/measurements/runtime-h200.md).

Here each layer's MLP calls ``laya_native::geglu_linear(x, weight, bias, configs)`` instead, with
``Wi``'s weight (and bias) rows interleaved in place in blocks of :data:`BLOCK` (:func:`interleave`:
the input half's rows 0-7, the gate half's rows 0-7, the input half's rows 8-15, ...).  On CUDA the
op is one CUTLASS kernel for Hopper (laya_build/native/laya_native.cu): a warp-specialized GEMM in
whose accumulator each thread holds two adjacent outputs' input and gate products, and whose
epilogue rounds them to bf16 (as the GEMM's output would be) and writes ``gelu(input) * gate``.
``configs`` (``export.cutlass_configs.geglu``) names its launch configuration by row count.  On
the CPU the op puts the rows back in order and computes the module's own arithmetic: the same bits
as the layers it replaces.  With a least number of positions (``export.native_geglu.<target>`` a
number) the op runs from that many positions on; below it the MLP multiplies by the interleaved
weight as a plain linear layer and takes the gated GELU of its columns block by block
(:func:`plain`): a ``torch.cond`` on the size, so that small shapes keep cuBLAS's GEMM and
Inductor's pointwise kernel.

With ``export.skip_padding.<target>`` the op is also handed each row's count of real positions,
the counts the fused attention makes once a forward (:func:`laya_build.model.attention.counted_forward`
hands them to every MLP for the forward's length): its output at padding positions is 0, and on
CUDA its kernel computes only the row tiles that hold a real position.  Nothing of the model reads a
padding position's MLP output but that position's own later layers: the real positions' outputs
are the same bits.

The op lives in the project's native op library (:mod:`laya_build.native`), built with its CUDA
kernels by nvcc when ``export.native_geglu.cuda`` is on; the package calls it through torch's
dispatcher, the library beside it.
"""

from __future__ import annotations

import types

import torch

from laya_build.model.native_linear import check_bfloat16, register_fake

ACTIVATIONS = ("gelu",)  # transformers' hidden_activation names the kernel computes
# The interleaving's block, in rows: on Hopper's warpgroup MMA a thread's accumulator holds two
# adjacent columns, then the two 8 columns on (laya_native.cu's kBlock).
BLOCK = 8


def interleave(t: torch.Tensor) -> torch.Tensor:
    """``t``'s rows (a ``[2H, ...]`` weight or ``[2H]`` bias: the input half, then the gate half;
    ``H`` a multiple of :data:`BLOCK`) interleaved in blocks of :data:`BLOCK`: the input half's
    first block, the gate half's first block, the input half's second block, ..."""
    blocks = t.shape[0] // (2 * BLOCK)
    inputs, gates = t.reshape(2, blocks, BLOCK, *t.shape[1:]).unbind(0)
    return torch.stack((inputs, gates), dim=1).reshape(t.shape)


def halves(t: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`interleave`: the input half's rows, then the gate half's."""
    blocks = t.shape[0] // (2 * BLOCK)
    return t.reshape(blocks, 2, BLOCK, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def check(model: torch.nn.Module, target: str) -> None:
    """The model's MLPs can run through the op on ``target`` (ValueError otherwise): checked
    before the library is built."""
    activation = getattr(model.encoder.config, "hidden_activation", None)
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"export.native_geglu computes {' or '.join(ACTIVATIONS)} and this model's hidden_activation is "
            f"{activation!r}: set export.native_geglu.{target} to false"
        )
    intermediate = model.encoder.layers[0].mlp.Wi.weight.shape[0] // 2
    if intermediate % BLOCK:
        raise ValueError(
            f"export.native_geglu interleaves Wi's rows in blocks of {BLOCK} and this model's intermediate_size "
            f"is {intermediate}: set export.native_geglu.{target} to false"
        )
    if target != "cuda":
        return
    check_bfloat16(model, "export.native_geglu's CUDA kernel is", "leave export.native_geglu.cuda off for it")
    if any(layer.mlp.Wi.bias is not None for layer in model.encoder.layers):
        raise ValueError(
            "export.native_geglu's CUDA kernel adds no bias and this model's MLPs have one (mlp_bias): "
            "leave export.native_geglu.cuda off for it"
        )


def use(model: torch.nn.Module, configs: list[int], least: int = 0, *, skip_padding: bool = False) -> int:
    """Run every encoder layer's MLP's first GEMM and gated GELU through
    ``laya_native::geglu_linear`` with the launch configurations ``configs`` (``[m_max,
    configuration]`` groups), its ``Wi`` rows interleaved in place; how many layers.  With
    ``least``, the op only from that many positions on (the product of the input's dimensions but
    the last), :func:`plain` below.  With ``skip_padding`` the op takes the rows' counts of real
    positions the encoder hands its MLPs (which needs the fused attention, installed before).  The
    op's library must be loaded (:func:`laya_build.runtime.serving.load_library`)."""
    from laya_build.model.attention import counted_forward

    if skip_padding and getattr(model.encoder.forward, "__func__", None) is not counted_forward:
        raise ValueError(
            "export.skip_padding hands the MLPs the rows' counts of real positions that the fused attention makes: "
            "set export.attention to fused for this target"
        )
    model.encoder.mlp_counts = skip_padding
    register_fake()
    with torch.no_grad():
        for layer in model.encoder.layers:
            mlp = layer.mlp
            mlp.Wi.weight.copy_(interleave(mlp.Wi.weight))
            if mlp.Wi.bias is not None:
                mlp.Wi.bias.copy_(interleave(mlp.Wi.bias))
            mlp.laya_geglu_configs = list(configs)
            mlp.laya_geglu_least = least
            mlp.laya_counts = None  # the forward's counts of real positions, while one runs (skip_padding)
            mlp.forward = types.MethodType(_forward, mlp)
    return len(model.encoder.layers)


def plain(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act) -> torch.Tensor:
    """What the op computes, as a linear layer of the interleaved ``weight`` (and ``bias``) and
    ``act(input) * gate`` over its output's blocks of :data:`BLOCK` columns, input and gate in turn."""
    both = torch.nn.functional.linear(x, weight, bias).unflatten(-1, (-1, 2, BLOCK))
    return (act(both[..., 0, :]) * both[..., 1, :]).flatten(-2)


def _forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    configs, weight, bias, least = self.laya_geglu_configs, self.Wi.weight, self.Wi.bias, self.laya_geglu_least
    counts = self.laya_counts if hidden_states.dim() == 3 else None
    if not least:  # the op at every size (no size is asked for: the export traces the call alone)
        return self.Wo(self.drop(torch.ops.laya_native.geglu_linear(hidden_states, weight, bias, configs, counts)))
    # The output's width. Traced inside a cond the weight's rows are a size of their own; each
    # branch ties them to this constant, so both give [..., width], as a cond's branches must.
    width = int(weight.shape[0]) // 2

    def native(x, *counted):
        torch._check(weight.shape[0] == 2 * width)
        return torch.ops.laya_native.geglu_linear(x, weight, bias, configs, *counted)

    def as_linear(x, *counted):  # every position computed: the padding's outputs are no one's
        torch._check(weight.shape[0] == 2 * width)
        return plain(x, weight, bias, self.act)

    operands = (hidden_states,) if counts is None else (hidden_states, counts)
    rows = hidden_states.numel() // hidden_states.shape[-1]
    if isinstance(rows, int):  # a static size: one branch
        both = (native if rows >= least else as_linear)(*operands)
    else:
        both = torch.cond(rows >= least, native, as_linear, operands)
    return self.Wo(self.drop(both))
