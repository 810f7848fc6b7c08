"""The decision model's attention call on a GPU, one SDPA backend at a time.

    python benchmarks/sdpa_probe.py --out sdpa.json

The H200 configuration's attention (16 heads of 64, bf16) at the two serving shapes (1 x 128 and
7 x 256 tokens), called as the model calls it: ``q``/``k`` after the rotary embedding,
``v`` a strided view of the packed QKV, a boolean ``[B, 1, S, S]`` mask (padding only for the
global layers, and the ±64 window of the local ones).  Each backend is timed the way the graphed
runner runs it: 28 calls on 28 distinct inputs in one CUDA graph, replayed; the time per call is
the replay's median over 28.  ``none`` is the call without a mask (a backend that takes no mask
can only run that one).  ``flash_varlen`` is FlashAttention called directly
(``aten._flash_attention_forward``) on the packed ``[B * S, H, Dh]`` layout: padding as each
sequence's key count (``seqused_k``) and the window as ``window_size_left/right``, so no mask
is made or read.  Every result is compared with the math backend in fp32 with the mask it stands for.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemm_probe import finish, graphed_ms, probe_result, saver  # noqa: E402  (shared by the GPU probes)

HEADS, HEAD_DIM, LAYERS, HALF_WINDOW = 16, 64, 28, 64
SHAPES = {"1x128": (1, 128), "7x256": (7, 256)}
BACKENDS = ("CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "MATH")


def flash_varlen(torch, result, save, qkv, mask_name, ref, B, S) -> None:
    """FlashAttention on the packed layout, the padding as key counts, the window as its sizes."""
    if mask_name == "none":
        return
    name = "flash_varlen"
    try:
        starts = torch.arange(0, (B + 1) * S, S, device="cuda", dtype=torch.int32)
        lengths = torch.full((B,), S, device="cuda", dtype=torch.int32)  # every key of each sequence used
        window = HALF_WINDOW if mask_name == "window" else None
        packed = [tuple(t.transpose(1, 2).reshape(B * S, HEADS, HEAD_DIM) for t in triple) for triple in qkv]
        outs = [None] * LAYERS

        def call(i):
            q, k, v = packed[i]
            outs[i] = torch.ops.aten._flash_attention_forward(
                q,
                k,
                v,
                starts,
                starts,
                S,
                S,
                0.0,
                False,
                False,
                window_size_left=window,
                window_size_right=window,
                seqused_k=lengths,
            )[0]

        call(0)
        got = outs[0].reshape(B, S, HEADS, HEAD_DIM).transpose(1, 2)
        err = (got.float() - ref).abs().max().item()
        ms = graphed_ms(torch, [lambda i=i: call(i) for i in range(LAYERS)])
        row = {
            "backend": name,
            "shape": f"{B}x{S}",
            "mask": mask_name,
            "us": round(ms / LAYERS * 1e3, 2),
            "max_abs_vs_math_fp32": round(err, 5),
        }
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    except Exception as exc:  # noqa: BLE001
        result["errors"].append(f"{name} {B}x{S} {mask_name}: {type(exc).__name__}: {str(exc)[:200]}")
    save()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    start = time.monotonic()

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    result = probe_result(torch, "benchmarks/sdpa_probe.py", cudnn=torch.backends.cudnn.version())
    save = saver(result, args.out)

    torch.manual_seed(0)
    for shape, (B, S) in SHAPES.items():
        packed = [torch.randn(B, S, 3, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
        qkv = [
            (
                p[:, :, 0].transpose(1, 2).contiguous(),
                p[:, :, 1].transpose(1, 2).contiguous(),
                p[:, :, 2].transpose(1, 2),
            )
            for p in packed
        ]
        pos = torch.arange(S, device="cuda")
        window = (pos[None, :] - pos[:, None]).abs() <= HALF_WINDOW
        masks = {
            "none": None,
            "padding": torch.ones(B, 1, S, S, device="cuda", dtype=torch.bool),
            "window": window.expand(B, 1, S, S),
        }
        for mask_name, mask in masks.items():
            q, k, v = qkv[0]
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
            for backend in BACKENDS:
                name = f"{backend.lower()}"
                try:
                    outs = [None] * LAYERS

                    def call(i, mask=mask, qkv=qkv, outs=outs):
                        q, k, v = qkv[i]
                        outs[i] = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

                    with sdpa_kernel(getattr(SDPBackend, backend)):
                        call(0)
                        err = (outs[0].float() - ref).abs().max().item()
                        ms = graphed_ms(torch, [lambda i=i: call(i) for i in range(LAYERS)])
                    row = {
                        "backend": name,
                        "shape": shape,
                        "mask": mask_name,
                        "us": round(ms / LAYERS * 1e3, 2),
                        "max_abs_vs_math_fp32": round(err, 5),
                    }
                    result["rows"].append(row)
                    print(json.dumps(row), flush=True)
                except Exception as exc:  # noqa: BLE001 - a probe records what failed and goes on
                    result["errors"].append(f"{name} {shape} {mask_name}: {type(exc).__name__}: {str(exc)[:200]}")
                save()
            flash_varlen(torch, result, save, qkv, mask_name, ref, B, S)
    return finish(result, save, start)


if __name__ == "__main__":
    raise SystemExit(main())
