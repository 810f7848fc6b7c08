"""The fused rotary + attention kernel (``laya::rotary_attention``) on a GPU, against the calls it replaces.

    python benchmarks/rotary_attention_probe.py --out rotary_attention.json [--configs JSON]

The H200 configuration's attention layer (16 heads of 64, bf16) at the two serving shapes (1 x 128
and 7 x 256 tokens), global (every key) and local (±64): 28 calls on 28 distinct packed ``Wqkv``
outputs in one CUDA graph, replayed; the time per call is the replay's median over 28.  Rows:

- ``fused BMxBN wW sS [prefetch]``: the kernel at each launch configuration of ``--configs`` (a
  JSON list of keys of the module's ``CONFIG``, the others its values: the blocks, warps and
  stages, ``PREFETCH`` (each key block's loads issued an iteration ahead), any other constant of
  the kernel (named in the row where it differs from the module's), and Triton's ``maxnreg``
  (registers a thread at most, ``rN`` in the row); default: the module's own and a few around it),
  with every row's key count;
- ``rotary + cudnn``: what the ``bias`` package runs in its place: the rotation in torch ops
  (fp32, rounded to bf16), then cuDNN's SDPA with the additive mask of the layer;
- ``cudnn``: that SDPA call alone, on inputs already rotated.

Every fused result is compared with :func:`laya_build.model.rotary_attention.reference` (SDPA
with the boolean masks) and with the same in fp32, on rows of 128 / 77 / 16 / 0 real positions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemm_probe import failed, finish, graphed_ms, probe_result, saver  # noqa: E402  (shared by the GPU probes)

HEADS, HEAD_DIM, LAYERS, HALF_WINDOW = 16, 64, 28, 64
SHAPES = {"1x128": (1, 128), "7x256": (7, 256)}
CONFIGS = [
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "PREFETCH": False},
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2},
    {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
]


def tables(torch, S, base=10000.0):
    inv = 1.0 / base ** (torch.arange(0, HEAD_DIM, 2, device="cuda").float() / HEAD_DIM)
    emb = torch.cat([torch.arange(S, device="cuda").float()[:, None] * inv[None]] * 2, -1)[None]
    return emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)


def timings(torch, ra, result, save, configs, shape, B, S, window) -> None:
    """The rows of one shape and kind of layer: the fused kernel at each configuration, then the
    calls it replaces."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    scale = HEAD_DIM**-0.5
    packed = [torch.randn(B, S, 3, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
    cos, sin = tables(torch, S)
    counts = torch.full((B,), S, device="cuda", dtype=torch.int32)
    outs = [torch.empty(B, S, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
    pos = torch.arange(S, device="cuda")
    seen = torch.ones(S, S, dtype=torch.bool, device="cuda")
    if window >= 0:
        seen = (pos[:, None] - pos[None, :]).abs() <= window
    bias = torch.zeros(B, 1, S, S, device="cuda", dtype=torch.bfloat16).masked_fill(
        ~seen, torch.finfo(torch.bfloat16).min
    )
    c4, s4 = cos[:, None], sin[:, None]
    rotated = [
        (ra.rotate(p[:, :, 0].transpose(1, 2), c4, s4), ra.rotate(p[:, :, 1].transpose(1, 2), c4, s4)) for p in packed
    ]

    def record(name, calls, config=None):
        try:
            ms = graphed_ms(torch, calls)
            row = {"shape": shape, "window": window, "name": name, "us": round(ms / LAYERS * 1e3, 2)}
            if config:
                row["config"] = config
        except Exception as exc:  # noqa: BLE001 - a probe records what failed and goes on
            row = {"shape": shape, "window": window, "name": name, "error": failed(exc)}
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        save()

    halves = ra.half(cos).contiguous(), ra.half(sin).contiguous()  # what the kernel reads

    def fused(i, config):
        ra.launch(packed[i], *halves, counts, scale, window, outs[i], config=config)

    def rotary_cudnn(i):
        p = packed[i]
        q = ra.rotate(p[:, :, 0].transpose(1, 2), c4, s4)
        k = ra.rotate(p[:, :, 1].transpose(1, 2), c4, s4)
        return F.scaled_dot_product_attention(q, k, p[:, :, 2].transpose(1, 2), attn_mask=bias)

    def cudnn(i):
        return F.scaled_dot_product_attention(*rotated[i], packed[i][:, :, 2].transpose(1, 2), attn_mask=bias)

    for config in configs:
        full = {**ra.CONFIG, **config}
        flags = " prefetch" if full["PREFETCH"] else ""
        other = {
            k: v for k, v in full.items() if isinstance(v, bool) and k != "PREFETCH" and v != ra.CONFIG.get(k, False)
        }
        flags += "".join(f" {'' if v else 'no-'}{k.lower()}" for k, v in other.items())
        flags += f" r{full['maxnreg']}" if full.get("maxnreg") else ""
        tag = f"fused {full['BLOCK_M']}x{full['BLOCK_N']} w{full['num_warps']} s{full['num_stages']}{flags}"
        record(tag, [lambda i=i, config=config: fused(i, config) for i in range(LAYERS)], config)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        record("rotary + cudnn", [lambda i=i: rotary_cudnn(i) for i in range(LAYERS)])
        record("cudnn", [lambda i=i: cudnn(i) for i in range(LAYERS)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--configs", default=json.dumps(CONFIGS))
    args = parser.parse_args()
    start = time.monotonic()

    import torch

    from laya_build.model import rotary_attention as ra

    result = probe_result(torch, "benchmarks/rotary_attention_probe.py", default_config=ra.CONFIG)
    save = saver(result, args.out)
    torch.manual_seed(0)
    scale = HEAD_DIM**-0.5

    # parity on padded rows, every configuration, both kinds of layer
    B, S = 4, 128
    qkv = torch.randn(B, S, 3, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    cos, sin = (ra.half(t).contiguous() for t in tables(torch, S))  # the halves the kernel reads
    counts = torch.tensor([128, 77, 16, 0], device="cuda", dtype=torch.int32)
    for window in (-1, HALF_WINDOW):
        ref = ra.reference(qkv, cos, sin, counts, scale, window)
        ref32 = ra.reference(qkv.float(), cos.float(), sin.float(), counts, scale, window)
        for config in json.loads(args.configs):
            out = torch.empty(B, S, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            try:
                ra.launch(qkv, cos, sin, counts, scale, window, out, config=config)
                torch.cuda.synchronize()
                row = {
                    "parity": f"{B}x{S} counts {counts.tolist()}",
                    "window": window,
                    "config": config,
                    "max_abs_vs_reference": (out.float() - ref.float()).abs().max().item(),
                    "max_abs_vs_fp32": (out.float() - ref32).abs().max().item(),
                    "reference_vs_fp32": (ref.float() - ref32).abs().max().item(),
                    "padding_rows_zero": bool((out[3] == 0).all()),
                }
            except Exception as exc:  # noqa: BLE001 - a probe records what failed and goes on
                row = {"parity": "failed", "config": config, "error": failed(exc)}
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
            save()

    for shape, (B, S) in SHAPES.items():
        for window in (-1, HALF_WINDOW):
            timings(torch, ra, result, save, json.loads(args.configs), shape, B, S, window)
    return finish(result, save, start)


if __name__ == "__main__":
    raise SystemExit(main())
