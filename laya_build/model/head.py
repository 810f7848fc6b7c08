"""The decision head's layers as an export runs them (``export.attention``, ``export.last_head_layer``).

Upstream's head is an ``nn.TransformerEncoder`` (norm first) run layer by layer over every
position; the forward then reads two things of its output: the first position (the act head's
class state) and each marker's position (the scorer).  Two ways of running it give the same
outputs up to rounding:

- attention ``fused``: each layer's attention is ``laya::packed_attention``
  (:mod:`laya_build.model.rotary_attention`, the encoder's kernel without rotary) on the packed
  in-projection, given each row's key count: no mask tensor and no cuDNN call in the package.
- ``last_head_layer: read``: the last layer's keys and values are every position's as before,
  but its queries, output projection, residual, norm and feed-forward are at the positions read
  only: ``1 + slots`` a row instead of the row's tokens (with ``fused``, the queries through
  ``laya::gathered_attention``).  At 7 rows of 256 tokens that is three quarters of a layer's
  GEMM work of the forward's 30.

With ``export.relu_epilogue`` the layers' feed-forward runs as :func:`feed_forward` does: the ReLU
after the first GEMM is that GEMM's epilogue (on CUDA cuBLASLt's bias-and-ReLU), not a kernel of its
own.

Semantics as the encoder's ``fused`` (right padding: each row's real positions first): every
position attends to its row's real keys; a row of padding alone gets 0 where upstream's
attention gives NaN (no real row reads it).
"""

from __future__ import annotations

import functools
import types

import torch

LAST_LAYER = ("all", "read")  # export.last_head_layer's values


def use(model: torch.nn.Module, attention: str, last_layer: str, relu_epilogue: bool = False) -> str | None:
    """Run ``model``'s head with ``attention`` (``fused``: the packed kernel; anything else:
    the layers' own attention), its last layer at ``last_layer``'s positions, and with
    ``relu_epilogue`` its feed-forward as :func:`feed_forward` (which needs one of the two).  Returns the
    head's attention as it runs (``fused`` or ``sdpa``; None: no head layers): a CUDA head whose
    head dim or dtype the kernel cannot take keeps its layers' own attention, the encoder's
    choice stands (:func:`laya_build.model.rotary_attention.cuda_refusal` names why)."""
    if last_layer not in LAST_LAYER:
        raise ValueError(f"export.last_head_layer {last_layer!r} is not one of {', '.join(LAST_LAYER)}")
    if model.head is None:
        return None
    fused, read = attention == "fused", last_layer == "read"
    if fused:
        attn = model.head.layers[0].self_attn
        weight = attn.in_proj_weight
        fused = not (weight.is_cuda and _kernel().cuda_refusal(attn.head_dim, weight.dtype))
        model.encoder.keeps_counts = fused  # the encoder's key counts, when it makes them, are the head's
    if relu_epilogue and not (fused or read):
        raise ValueError(
            "export.relu_epilogue runs the decision head's layers as laya-build writes them out, which it does "
            "with export.attention fused or export.last_head_layer read: set one of them, or leave it false"
        )
    if fused or read:  # layer_forward writes out the norm-first layer
        if not all(layer.norm_first for layer in model.head.layers):
            raise ValueError("the decision head's layers must be norm_first (upstream's) to run them otherwise")
        model.run_head = types.MethodType(
            functools.partial(run_head, fused=fused, read=read, epilogue=relu_epilogue), model
        )
    return "fused" if fused else "sdpa"


def _kernel():
    from laya_build.model.attention import rotary_attention_module

    return rotary_attention_module()


def run_head(
    model,
    states: torch.Tensor,
    attention_mask: torch.Tensor,
    marker_pos: torch.Tensor,
    *,
    fused: bool,
    read: bool,
    epilogue: bool = False,
):
    """:meth:`DecisionModel.run_head` run as :func:`use` chose: ``(states, index)``, the head's
    output and where the markers are in it."""
    from laya_build.model.attention import forward_counts

    padding = attention_mask == 0
    counts = forward_counts(model.encoder, attention_mask) if fused else None  # the encoder's, when it made them
    layers = list(model.head.layers)
    for number, layer in enumerate(layers):
        at = None
        if read and number == len(layers) - 1:  # the class position, then each marker's
            at = torch.cat((torch.zeros_like(marker_pos[:, :1]), marker_pos.clamp(min=0)), dim=1)
        states = layer_forward(layer, states, padding, counts, at, epilogue)
    if not read:
        return states, marker_pos
    rows, slots = marker_pos.shape
    return states, torch.arange(1, slots + 1, device=marker_pos.device, dtype=marker_pos.dtype).expand(rows, slots)


def pick(x: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """``x[b, at[b, i]]``: ``[B, S, d]``, ``[B, P]`` -> ``[B, P, d]``."""
    return torch.gather(x, 1, at[:, :, None].expand(-1, -1, x.shape[-1]))


def layer_forward(
    layer,
    x: torch.Tensor,
    padding: torch.Tensor,
    counts: torch.Tensor | None,
    at: torch.Tensor | None,
    epilogue: bool = False,
):
    """One norm-first ``nn.TransformerEncoderLayer`` over ``x`` (``padding``: True where a key is
    padding): with the packed kernel when ``counts`` (each row's real keys) are given, only at the
    positions ``at`` past the attention when given, and its feed-forward as :func:`feed_forward`
    with ``epilogue``."""
    if counts is None and at is None and not epilogue:
        return layer(x, src_key_padding_mask=padding)  # upstream's call
    sa = layer.self_attn
    h = layer.norm1(x)
    if counts is not None:
        B, S, d = h.shape
        qkv = torch.nn.functional.linear(h, sa.in_proj_weight, sa.in_proj_bias).view(B, S, 3, sa.num_heads, sa.head_dim)
        if at is None:
            attended = torch.ops.laya.packed_attention(qkv, counts, sa.head_dim**-0.5, -1).reshape(B, S, d)
        else:  # the queries at the positions read only
            attended = torch.ops.laya.gathered_attention(qkv, counts, at, sa.head_dim**-0.5).reshape(B, -1, d)
            x = pick(x, at)
        x = x + layer.dropout1(sa.out_proj(attended))
    else:  # the layer's own attention, its queries at the positions read only (when given)
        attended = sa(h if at is None else pick(h, at), h, h, key_padding_mask=padding, need_weights=False)[0]
        x = (x if at is None else pick(x, at)) + layer.dropout1(attended)
    return x + (feed_forward(layer, layer.norm2(x)) if epilogue else layer._ff_block(layer.norm2(x)))


def feed_forward(layer, h: torch.Tensor) -> torch.Tensor:
    """A norm-first ``nn.TransformerEncoderLayer``'s feed-forward block on ``h`` (its ``_ff_block``,
    in eval mode), a ReLU layer's first GEMM as ``aten._addmm_activation``: on CUDA cuBLASLt adds the
    bias and takes the ReLU in the GEMM's epilogue, in fp32 before rounding (the same numbers:
    rounding and ReLU commute), where the exported ``linear`` and ``relu`` compile to a GEMM and a
    pointwise kernel that reads its output again (AOTInductor calls the op through ATen; it has no
    lowering of its own).  Another activation, or a layer without a bias, runs as upstream's."""
    first = layer.linear1
    if layer.activation_relu_or_gelu != 1 or first.bias is None:
        return layer._ff_block(h)
    hidden = torch._addmm_activation(first.bias, h.reshape(-1, h.shape[-1]), first.weight.t())
    return layer.dropout2(layer.linear2(layer.dropout(hidden.view(*h.shape[:-1], -1))))
