"""Zero biases on the encoder's linear layers (``export.zero_bias``): their GEMMs through cuBLASLt.

ModernBERT's linear layers have no bias, so each is an ``aten.mm``, which torch runs through
cuBLAS on CUDA.  A bf16 or fp16 ``aten.addmm`` whose bias is a vector goes to cuBLASLt instead,
the bias added in the GEMM's epilogue, and Inductor keeps such an ``addmm`` whole for those
dtypes.  A zero bias adds nothing to the product: the layer computes what it computed, with the
kernel cuBLASLt picks for the problem.  On the H200 the MLP's output GEMM at 128 positions then
runs in one kernel instead of cuBLAS's split-K kernel and its reduction, 0.9 µs faster a layer;
at 1,792 positions it is 0.2 µs slower, and the other three GEMMs are slower at both
(docs/measurements/runtime-h200.md, "Attention blocks by shape, the MLP's output GEMM through
cuBLASLt").  The outputs differ from cuBLAS's by rounding.
"""

from __future__ import annotations

import torch

LINEARS = ("attn.Wqkv", "attn.Wo", "mlp.Wi", "mlp.Wo")  # an encoder layer's linear layers: export.zero_bias's values
HALF_DTYPES = (torch.bfloat16, torch.float16)  # where Inductor keeps an addmm whole


def use(model: torch.nn.Module, names: list[str]) -> None:
    """Give every encoder layer's linear layers ``names`` (of :data:`LINEARS`) a zero bias of
    their weight's dtype and device."""
    unknown = [n for n in names if n not in LINEARS]
    if unknown:
        raise ValueError(f"export.zero_bias {unknown[0]!r} is not one of {', '.join(LINEARS)}")
    dtype = model.encoder.embeddings.tok_embeddings.weight.dtype
    if names and dtype not in HALF_DTYPES:
        raise ValueError(
            f"export.zero_bias sends a GEMM to cuBLASLt in bf16 or fp16 exports only (this one is "
            f"{str(dtype).removeprefix('torch.')}; Inductor splits an addmm of other dtypes into a GEMM and an add): "
            "leave export.zero_bias.cuda empty for it"
        )
    for layer in model.encoder.layers:
        for name in names:
            linear = layer.get_submodule(name)
            if linear.bias is not None:
                raise ValueError(f"export.zero_bias {name}: this model's {name} has a bias of its own; leave it out")
            weight = linear.weight
            linear.bias = torch.nn.Parameter(
                torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device), requires_grad=False
            )
