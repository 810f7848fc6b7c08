"""Asking L2 for a layer's weights from its attention kernel: a 28-layer chain on a GPU, with and without.

    python benchmarks/l2_prefetch_probe.py --out prefetch.json [--rounds 3]

At 1 row x 128 tokens each of a layer's four GEMMs costs a launch's fixed time, and with its
weights already in L2 a layer's GEMMs take about 5 us less (docs/measurements/runtime-h200.md,
"The GEMMs with their weights in L2").  The attention kernel (``laya::rotary_attention``) can
ask L2 for the weights the kernels after it read (``prefetch``: Hopper's bulk L2 prefetch, one
instruction a lane, nothing waits for it).  This probe runs the H200 configuration's layer
(hidden 1024, 16 heads of 64, GLU 2624, every third layer global, the others a window of 64)
28 times on 28 layers' own weights, as eager torch ops captured in one CUDA graph, at both
serving shapes, in interleaved rounds:

- ``none``: no prefetch;
- ``layer:<programs>x<lanes>``: each attention kernel asks for its layer's ``Wo``, ``Wi`` and
  MLP ``Wo`` and the next layer's ``Wqkv``, from at most ``programs`` of its programs with
  ``lanes`` bulk prefetches each a tensor;
- ``mlp:<programs>x<lanes>``: the same without ``Wo`` (the GEMM right after the kernel);
- ``l2``: every layer on the first layer's weights, no prefetch: the weights stay in L2, the
  most any prefetch could give.

The outputs of ``none`` and ``layer`` are compared bit for bit (prefetching changes no value).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemm_probe import finish, graphed_ms, probe_result, saver  # noqa: E402

HIDDEN, HEADS, GLU, LAYERS, WINDOW, EVERY = 1024, 16, 2624, 28, 64, 3
SHAPES = {"1x128": (1, 128), "7x256": (7, 256)}
PREFETCH = {"layer": ((32, 128), (32, 1), (8, 1), (32, 16), (2, 1)), "mlp": ((32, 1),)}
VARIANTS = ("none", "l2", *(f"{what}:{p}x{n}" for what, tiles in PREFETCH.items() for p, n in tiles))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    start = time.monotonic()

    import torch
    import torch.nn.functional as F

    from laya_build.model import rotary_attention as ra

    result = probe_result(torch, "benchmarks/l2_prefetch_probe.py", layers=LAYERS, rounds=args.rounds)
    save = saver(result, args.out)
    torch.manual_seed(0)
    dt, dev = torch.bfloat16, "cuda"
    D = HIDDEN // HEADS

    def weight(n, k):
        return (torch.randn(n, k, device=dev, dtype=dt) / k**0.5).contiguous()

    layers = [
        {
            "qkv": weight(3 * HIDDEN, HIDDEN),
            "wo": weight(HIDDEN, HIDDEN),
            "wi": weight(2 * GLU, HIDDEN),
            "mlp_out": weight(HIDDEN, GLU),
            "ln1": torch.ones(HIDDEN, device=dev, dtype=dt),
            "ln2": torch.ones(HIDDEN, device=dev, dtype=dt),
        }
        for _ in range(LAYERS + 1)  # (the one after the last: the next Wqkv the last layer asks for)
    ]
    pos = torch.arange(8192, device=dev)[:, None] * (1.0 / 160000 ** (torch.arange(0, D, 2, device=dev) / D))[None]
    emb = torch.cat((pos, pos), -1)

    def chain(B, S, variant):
        M = B * S
        x0 = torch.randn(M, HIDDEN, device=dev, dtype=dt, generator=torch.Generator(dev).manual_seed(M))
        cos, sin = emb[:S].cos().to(dt)[None], emb[:S].sin().to(dt)[None]
        counts = torch.full((B,), S, device=dev, dtype=torch.int32)
        out = torch.empty_like(x0)
        what, _, tile = variant.partition(":")
        programs, lanes = map(int, tile.split("x")) if tile else (1, 1)

        def run():
            x = x0
            for i in range(LAYERS):
                w = layers[0 if variant == "l2" else i]
                after = layers[0 if variant == "l2" else i + 1]
                ask = {
                    "layer": [w["wo"], w["wi"], w["mlp_out"], after["qkv"]],
                    "mlp": [w["wi"], w["mlp_out"], after["qkv"]],
                }.get(what, [])
                h = F.layer_norm(x, (HIDDEN,), w["ln1"])
                qkv = torch.mm(h, w["qkv"].t()).view(B, S, 3, HEADS, D)
                window = -1 if i % EVERY == 0 else WINDOW
                a = torch.empty(B, S, HEADS, D, device=dev, dtype=dt)
                config = {"PF_PROGRAMS": programs, "PF_LANES": lanes}
                ra.launch(qkv, cos, sin, counts, D**-0.5, window, a, config=config, prefetch=ask)
                x = x + torch.mm(a.view(M, HIDDEN), w["wo"].t())
                h = torch.mm(F.layer_norm(x, (HIDDEN,), w["ln2"]), w["wi"].t())
                x = x + torch.mm(F.gelu(h[:, :GLU]) * h[:, GLU:], w["mlp_out"].t())
            out.copy_(x)

        return run, out

    for shape, (B, S) in SHAPES.items():
        runs = {v: chain(B, S, v) for v in VARIANTS}
        times = {v: [] for v in VARIANTS}
        for _ in range(args.rounds):
            for v in VARIANTS:
                times[v].append(graphed_ms(torch, [runs[v][0]]))
        for v in VARIANTS:
            runs[v][0]()
        torch.cuda.synchronize()
        same = all(torch.equal(runs["none"][1], runs[v][1]) for v in VARIANTS if ":" in v)
        for v in VARIANTS:
            row = {
                "shape": shape,
                "variant": v,
                "ms": [round(t, 4) for t in times[v]],
                "median_ms": round(statistics.median(times[v]), 4),
                "us_per_layer": round(statistics.median(times[v]) * 1e3 / LAYERS, 2),
                "same_output_as_none": same if ":" in v else None,
            }
            result["rows"].append(row)
            print(row, flush=True)
        save()
    return finish(result, save, start)


if __name__ == "__main__":
    sys.exit(main())
