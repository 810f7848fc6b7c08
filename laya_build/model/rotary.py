"""The encoder's rotary cos and sin as tables (``export.rotary: table``, the default).

transformers' ModernBERT computes each layer type's cos and sin in the forward: the positions
times the inverse frequencies, then ``cos``/``sin``, once a forward.  A compiler that inlines
that small, cheap-looking pointwise chain into its consumers (Inductor does: the result has
few reads and few ops) recomputes both for every element of ``q`` and ``k`` in every layer,
heads and rows included.  On the H200 that made the kernel before each attention compute
bound at 7 rows x 256 tokens (docs/measurements/runtime-h200.md, "Rotary tables and additive
masks").

:func:`use` has the same values computed once, when the model is prepared for export, by the
encoder's own rotary module (so the dtype and device rounding are the export's), for every
position up to ``max_position_embeddings``; the forward then gathers ``table[position_ids]``:
the package reads them instead of computing them.  Only rotary types whose frequencies do not
depend on the sequence (``default`` here) are tabulated; any other is refused with what to do.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

MODES = ("table", "computed")  # export.rotary's values
STATIC_TYPES = ("default",)  # rope types whose cos/sin depend on the position only


class RotaryTable(nn.Module):
    """``forward(x, position_ids, layer_type) -> (cos, sin)`` as ModernBERT's rotary module
    returns them, gathered from tables that module computed for positions ``0 .. length-1``.

    With ``halves`` (the fused attention's, which reads one half of each table) it returns the
    first halves, ``[B', S, D / 2]``, of every kind of layer's tables from one op a forward
    (``laya::rotary_rows``): a compiler keeps an op's output as a buffer, where it would make an
    indexing expression again inside each layer's copy of the tables (20 kernels a forward on the
    H200 instead of 1).  The encoder asks for each kind of layer (``layer_types``: those its layers
    use; default every kind the rotary module knows) once a forward, with the same position ids;
    within :meth:`one_forward` (the fused attention's encoder forward) the first ask gathers the
    rows of all of them and the others take theirs from that one result.
    """

    def __init__(
        self,
        rotary: nn.Module,
        length: int,
        dtype: torch.dtype,
        device: torch.device,
        halves: bool = False,
        layer_types=None,
    ):
        super().__init__()
        self.types = sorted(set(layer_types) if layer_types is not None else rotary.rope_type)
        unknown = sorted(set(self.types) - set(rotary.rope_type))
        if unknown:
            raise ValueError(f"the rotary module has no tables for the layer types {', '.join(unknown)}")
        self._pending: dict | None = None  # within one_forward: the position ids, the kinds not yet asked for
        positions = torch.arange(length, device=device)[None]
        probe = torch.empty(0, dtype=dtype, device=device)
        with torch.no_grad():
            for layer_type in self.types:
                cos, sin = rotary(probe, positions, layer_type)
                self.register_buffer(f"{layer_type}_cos", cos[0].clone(), persistent=False)
                self.register_buffer(f"{layer_type}_sin", sin[0].clone(), persistent=False)
        self.halves = halves

    @property
    def halves(self) -> bool:
        """Whether the table gives the first halves (see the class); once set, the whole tables
        are gone: only the halves are kept, stacked as ``halves_tables`` ``[2 T, P, D / 2]`` (each
        kind's cos, then its sin)."""
        return "halves_tables" in self._buffers

    @halves.setter
    def halves(self, value: bool) -> None:
        if not value:
            if self.halves:
                raise ValueError("a rotary table that gives the tables' first halves cannot give whole tables again")
            return
        if self.halves:
            return
        from laya_build.model import rotary_attention

        tables = []
        for layer_type in self.types:
            for name in (f"{layer_type}_cos", f"{layer_type}_sin"):
                tables.append(rotary_attention.half(self._buffers.pop(name)))
        self.register_buffer("halves_tables", torch.stack(tables).contiguous(), persistent=False)

    @contextlib.contextmanager
    def one_forward(self):
        """Within it (one encoder forward), the asks for the halves of the same position ids share
        one gather; outside, each ask gathers its own (nothing is kept between asks)."""
        self._pending = {"ids": None, "rows": {}}
        try:
            yield
        finally:
            self._pending = None

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str):
        if not self.halves:
            cos, sin = getattr(self, f"{layer_type}_cos"), getattr(self, f"{layer_type}_sin")
            return cos[position_ids].to(x.dtype), sin[position_ids].to(x.dtype)
        pending = self._pending
        if pending is not None and pending["ids"] is position_ids and layer_type in pending["rows"]:
            cos, sin = pending["rows"].pop(layer_type)
        else:  # (halves are set where the fused attention, hence Triton, was chosen)
            from laya_build.model import rotary_attention

            rows = rotary_attention.rotary_rows(self.halves_tables, position_ids)
            kinds = {t: (rows[2 * i], rows[2 * i + 1]) for i, t in enumerate(self.types)}
            cos, sin = kinds.pop(layer_type)
            if pending is not None:  # within one forward: the other kinds' rows, for their asks
                self._pending = {"ids": position_ids, "rows": kinds}
        return (cos, sin) if cos.dtype == x.dtype else (cos.to(x.dtype), sin.to(x.dtype))


def refusal(model: nn.Module) -> str | None:
    """Why ``model``'s encoder rotary cannot be tabulated (None: it can)."""
    rotary = getattr(model.encoder, "rotary_emb", None)
    if rotary is None or not hasattr(rotary, "rope_type"):
        return f"the encoder has no ModernBERT rotary module ({type(rotary).__name__})"
    other = sorted({t for t in rotary.rope_type.values() if t not in STATIC_TYPES})
    if other:
        return f"rope type {', '.join(other)} depends on the sequence length, so one table cannot hold it"
    return None


def use(model: nn.Module, mode: str, halves: bool = False) -> None:
    """Give ``model``'s encoder the rotary of ``mode`` (one of :data:`MODES`); call it after the
    model is on its export dtype and device.  ``halves``: the table gives its first halves
    (:class:`RotaryTable`), for the fused attention (``laya_build.model.attention.use`` sets it on
    a table made before it)."""
    if mode not in MODES:
        raise ValueError(f"rotary {mode!r} is not one of {', '.join(MODES)}")
    if mode == "computed" or isinstance(model.encoder.rotary_emb, RotaryTable):
        return
    if reason := refusal(model):
        raise ValueError(f"export.rotary table: {reason}; set export.rotary: computed")
    encoder = model.encoder
    weight = encoder.embeddings.tok_embeddings.weight
    encoder.rotary_emb = RotaryTable(
        encoder.rotary_emb,
        encoder.config.max_position_embeddings,
        weight.dtype,
        weight.device,
        halves=halves,
        layer_types=encoder.config.layer_types,
    )
