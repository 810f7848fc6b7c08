"""How the encoder's attention runs (``export.attention``): ``sdpa``, ``bias``, ``varlen`` or ``fused``.

With ``sdpa`` (transformers' default here) every layer reads a boolean ``[B, 1, S, S]`` mask —
padding for the global layers, padding and the ±window band for the local ones — which torch
turns into an additive mask inside each layer's call, so a fused kernel before each attention
makes it again.  ``bias`` hands SDPA the additive masks themselves (transformers' eager masks: 0
where a key is seen, the dtype's minimum where not), made once a forward, one for each kind of
layer; the outputs are sdpa's.  ``varlen`` calls FlashAttention's variable-length
entry (``aten._flash_attention_forward``) on the packed ``[B * S, H, Dh]`` layout instead, each
row cut in two sequences: its first ``count`` positions, then its padding.  The local layers'
window is its size, so no mask is made or read.  On the H200 with torch 2.11 that is no faster:
FlashAttention 2's kernel is slower than cuDNN's by about what the mask costs the sdpa package
(docs/measurements/runtime-h200.md, "The sdpa and varlen packages side by side").  ``fused``
runs each layer's rotary and attention as one Triton kernel on the packed ``Wqkv`` output, given
each row's key count (:mod:`laya_build.model.rotary_attention`): no rotated copies of q and k, no
mask tensor.

Semantics of ``varlen`` and ``fused``, for a padding mask that is a prefix of ones in each row (right padding: the
tokenizer's batches and the runtime's buckets): every real position attends to its row's
``count`` real positions, within the window on local layers, as with the masks it replaces.  With
``varlen`` the padded positions of a row attend to each other only, with ``fused`` to the row's
real keys as with the masks: no real position ever reads them, so the model's outputs are those
of the masks.  Why two sequences a row: FlashAttention aligns a
window with the end of the keys (query ``i`` sees keys ``i + len_k - len_q ± window``), so the
row's real queries and keys must be a sequence of one length (``seqused_k`` with the whole row
as queries would shift the window of every padded row).  Off CUDA (the tests) the same segments
and window build the boolean mask and call ``scaled_dot_product_attention``: the reference the
CUDA path is compared with.

Registered with transformers' attention and mask interfaces under :data:`NAME` by :func:`use`
(importing this module imports no transformers: the package child needs only the op); the
exported program holds it as one op, ``laya::varlen_attention``, which the package child has
Inductor compile as the ops it runs (:func:`compile_through`).
"""

from __future__ import annotations

import contextlib

import torch

NAME = "laya_varlen"
BIAS_NAME = "laya_bias"
FUSED_NAME = "laya_fused"
IMPLEMENTATIONS = ("sdpa", "bias", "varlen", "fused")  # export.attention's values


def key_lengths(counts: torch.Tensor, length: int) -> torch.Tensor:
    """The sequences the attention of every layer reads (int32 ``[2 B + 1]``): the offsets, in the
    packed ``[B * S]`` layout, of each row's real positions and then of its padding, each its own
    sequence: ``0, c0, S, S + c1, 2 S, ..., B S``.  Made once a forward, by the mask function,
    not once a layer."""
    rows = counts.shape[0]
    starts = torch.arange(rows, dtype=torch.int32, device=counts.device) * length
    ends = starts + counts.to(torch.int32)
    return torch.cat((torch.stack((starts, ends), dim=1).reshape(-1), starts[-1:] + length))


def row_counts(lengths: torch.Tensor) -> torch.Tensor:
    """Each row's number of real positions, from :func:`key_lengths`."""
    return lengths[1::2] - lengths[0:-1:2]


def key_counts(attention_mask: torch.Tensor | None = None, kv_length: int | None = None, **_) -> torch.Tensor | None:
    """The mask function: :func:`key_lengths` of each row's number of keys, from its 2D padding
    mask (None: every key of every row)."""
    if attention_mask is None:
        return None
    if kv_length is not None:
        attention_mask = attention_mask[:, -kv_length:]
    return key_lengths(attention_mask.sum(-1, dtype=torch.int32), attention_mask.shape[-1])


def row_key_counts(
    attention_mask: torch.Tensor | None = None, kv_length: int | None = None, **_
) -> torch.Tensor | None:
    """The ``fused`` mask function: each row's number of keys (int32 ``[B]``), from its 2D
    padding mask (None: every key of every row).  Made once a forward, not once a layer."""
    if attention_mask is None:
        return None
    if kv_length is not None:
        attention_mask = attention_mask[:, -kv_length:]
    return attention_mask.sum(-1, dtype=torch.int32)


def counted_forward(self, input_ids=None, attention_mask=None, *args, **kwargs):
    """The encoder's own forward with each row's key count made here, once a forward, and handed
    to every layer as transformers' mask mapping (a mask function would be called for each kind
    of layer); with ``keeps_counts`` set (by :mod:`laya_build.model.head`) they are kept for the
    decision head, which takes them later in the same forward (:func:`forward_counts`).  A
    tabulated rotary that gives halves serves every kind of layer from one gather within the
    forward (:meth:`laya_build.model.rotary.RotaryTable.one_forward`).  With ``mlp_counts`` set
    (by :func:`laya_build.model.native_geglu.use`, for export.skip_padding) every layer's MLP holds
    them for the forward's length.  Nothing of one forward is used by the next: the kept counts are
    dropped when the next forward starts."""
    self.key_counts = None
    counts = None
    if attention_mask is not None and not isinstance(attention_mask, dict):
        if attention_mask.dim() != 2:
            raise ValueError(
                f"{FUSED_NAME} attention takes a [rows, tokens] padding mask, got one of shape "
                f"{tuple(attention_mask.shape)}: pass the tokenizer's 2D attention mask"
            )
        device = self.embeddings.tok_embeddings.weight.device
        counts = row_key_counts(attention_mask.to(device) != 0)
        if getattr(self, "keeps_counts", False):
            self.key_counts = (attention_mask, counts)
        attention_mask = dict.fromkeys(sorted(set(self.config.layer_types)), counts)
    mlps = [layer.mlp for layer in self.layers] if getattr(self, "mlp_counts", False) else []
    for mlp in mlps:
        mlp.laya_counts = counts
    scope = getattr(self.rotary_emb, "one_forward", None)
    try:
        with scope() if scope is not None else contextlib.nullcontext():
            return type(self).forward(self, input_ids, attention_mask, *args, **kwargs)
    finally:
        for mlp in mlps:
            mlp.laya_counts = None


def forward_counts(encoder, attention_mask: torch.Tensor) -> torch.Tensor:
    """Each row's key count of ``attention_mask``: those the encoder made for it in this forward
    (:func:`counted_forward`; taken, so nothing of the forward is held), else made here."""
    kept = getattr(encoder, "key_counts", None)
    if kept is not None and kept[0] is attention_mask:
        encoder.key_counts = None
        return kept[1]
    return row_key_counts(attention_mask != 0)


def fused_forward(self, hidden_states: torch.Tensor, position_embeddings=None, attention_mask=None, **_):
    """A ModernBERT attention layer's forward with rotary and attention as one op
    (``laya::rotary_attention``) on the packed ``Wqkv`` output; ``attention_mask`` is
    :func:`row_key_counts`'s."""
    if self.training and self.attention_dropout:
        raise ValueError(f"{FUSED_NAME} attention is for inference: dropout {self.attention_dropout} in training")
    shape = hidden_states.shape[:-1]
    qkv = self.Wqkv(hidden_states).view(*shape, 3, -1, self.head_dim)
    cos, sin = position_embeddings
    if cos.shape[-1] == self.head_dim:  # whole tables (a computed rotary): the kernel reads one half
        half = rotary_attention_module().half
        cos, sin = half(cos), half(sin)
    counts = attention_mask
    if counts is None:
        counts = torch.full(shape[:1], shape[1], dtype=torch.int32, device=qkv.device)
    window = self.sliding_window - 1 if self.sliding_window is not None else -1
    out = torch.ops.laya.rotary_attention(qkv, cos, sin, counts, self.head_dim**-0.5, window)
    return self.out_drop(self.Wo(out.reshape(*shape, -1))), None


def _fused_only(*_, **__):
    raise RuntimeError(f"{FUSED_NAME}: the attention layers' own forward runs this attention (use(model, 'fused'))")


def rotary_attention_module():
    """:mod:`laya_build.model.rotary_attention` (it registers ``laya::rotary_attention``), or a
    ValueError that says what is missing."""
    import importlib

    try:
        return importlib.import_module("laya_build.model.rotary_attention")
    except ImportError as exc:
        raise ValueError(
            f"export.attention fused needs Triton, which does not import here ({exc}); "
            "install the project's requirements.txt or choose sdpa or bias"
        ) from None


def varlen_attention(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **_,
) -> tuple[torch.Tensor, None]:
    """transformers' attention function: ``[B, H, S, Dh]`` query, key and value, the lengths of
    :func:`key_counts` (None: every key) -> ``([B, S, H, Dh], None)``.  ``sliding_window`` is
    transformers' (the half-window + 1)."""
    if dropout:
        raise ValueError(f"{NAME} attention is for inference: dropout {dropout} given")
    B, H, S, D = query.shape
    if attention_mask is None:
        attention_mask = key_lengths(torch.full((B,), S, dtype=torch.int32, device=query.device), S)
    scale = scaling if scaling is not None else D**-0.5
    window = sliding_window - 1 if sliding_window is not None else -1
    return torch.ops.laya.varlen_attention(query, key, value, attention_mask, scale, window), None


@torch.library.custom_op("laya::varlen_attention", mutates_args=())
def _varlen_op(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, lengths: torch.Tensor, scale: float, window: int
) -> torch.Tensor:
    """One op in the exported program (``laya::varlen_attention``): FlashAttention's entry has a
    uint64 output (its RNG state) that torch.export cannot save on every torch this runs on.
    The package child has Inductor compile it as :func:`_computed` (:func:`compile_through`), so
    the package calls FlashAttention itself and needs nothing of laya-build to load."""
    return _computed(query, key, value, lengths, scale, window)


@_varlen_op.register_fake
def _(query, key, value, lengths, scale, window):
    B, H, S, D = query.shape
    return query.new_empty((B, S, H, D))


def _computed(query, key, value, lengths, scale, window):
    """``[B, S, H, Dh]``: FlashAttention's variable-length entry on CUDA, else the reference."""
    B, H, S, D = query.shape
    size = window if window >= 0 else None
    torch._check(lengths.shape[0] == 2 * B + 1)
    if query.device.type != "cuda":
        return _reference(query, key, value, row_counts(lengths), scale, size)
    q, k, v = (t.transpose(1, 2).reshape(B * S, H, D) for t in (query, key, value))
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, lengths, lengths, S, S, 0.0, False, False, scale=scale, window_size_left=size, window_size_right=size
    )[0]
    return out.view(B, S, H, D)


def _reference(query, key, value, counts, scale, window):
    """The CUDA path's semantics with a boolean mask: a row's real positions see each other, its
    padded positions each other, each within the window where there is one."""
    S = query.shape[2]
    pos = torch.arange(S, device=query.device)
    real = pos[None, :] < counts[:, None]  # [B, S]
    visible = (real[:, None, :, None] == real[:, None, None, :]).expand(-1, 1, S, S)
    if window is not None:
        visible = visible & ((pos[:, None] - pos[None, :]).abs() <= window)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=visible, scale=scale)
    return out.transpose(1, 2).contiguous()


def compile_through() -> None:
    """Have Inductor compile ``laya::varlen_attention`` as the ops it runs (the package child's
    step before compiling), so that a package calls FlashAttention itself and needs nothing of
    laya-build to load; and register the project's Triton ops an exported program may call."""
    from torch._inductor.decomposition import decompositions, register_decomposition

    op = torch.ops.laya.varlen_attention.default
    if op not in decompositions:
        register_decomposition(op)(_computed)
    try:  # laya::rotary_attention and laya::add_norm, triton_ops: Inductor compiles their kernels into the package
        rotary_attention_module()
        import laya_build.model.add_norm  # noqa: F401
    except (ValueError, ImportError):
        pass  # without Triton no exported program can hold them


def register() -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, varlen_attention)
    AttentionMaskInterface.register(NAME, key_counts)
    # bias: SDPA itself, given the masks as additive tensors of the model's dtype (0 where a key
    # is seen, the dtype's minimum where not), made once a forward by the mask function.  With
    # sdpa's boolean masks torch converts the mask to such a tensor inside every layer's call, and
    # a compiler then makes it again in every layer.
    AttentionInterface.register(BIAS_NAME, sdpa_attention_forward)
    AttentionMaskInterface.register(BIAS_NAME, eager_mask)
    AttentionInterface.register(FUSED_NAME, _fused_only)
    AttentionMaskInterface.register(FUSED_NAME, row_key_counts)


def use(model: torch.nn.Module, implementation: str) -> None:
    """Run ``model``'s encoder attention as ``implementation`` (one of :data:`IMPLEMENTATIONS`)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attention {implementation!r} is not one of {', '.join(IMPLEMENTATIONS)}")
    if implementation == "sdpa":
        return
    register()
    if implementation == "fused":
        import types

        kernel = rotary_attention_module()
        weight = model.encoder.embeddings.tok_embeddings.weight
        refusal = weight.is_cuda and kernel.cuda_refusal(model.encoder.layers[0].attn.head_dim, weight.dtype)
        if refusal:
            raise ValueError(f"export.attention fused on CUDA needs {refusal}: choose sdpa or bias for this model")
        from laya_build.model.rotary import RotaryTable

        encoder = model.encoder
        table = encoder.rotary_emb if isinstance(encoder.rotary_emb, RotaryTable) else None
        halves = (table is None or not table.halves) and kernel.halves_refusal(  # (halves: checked before)
            encoder.rotary_emb,
            set(encoder.config.layer_types),
            encoder.config.max_position_embeddings,
            weight.dtype,
            weight.device,
        )
        if halves:
            raise ValueError(
                f"export.attention fused reads one half of each rotary table, but {halves}: "
                "choose sdpa or bias for this model"
            )
        model.encoder.set_attn_implementation(FUSED_NAME)
        if table is not None:  # (rotary.use(model, "table") before): its first halves, gathered once
            table.halves = True
        for layer in model.encoder.layers:
            layer.attn.forward = types.MethodType(fused_forward, layer.attn)
        if getattr(encoder.forward, "__func__", None) is not counted_forward:
            encoder.forward = types.MethodType(counted_forward, encoder)
        return
    model.encoder.set_attn_implementation(BIAS_NAME if implementation == "bias" else NAME)
