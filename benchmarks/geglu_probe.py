"""The gated GELU kernel (``laya::geglu``) on a GPU at each launch configuration, against Inductor's and eager's.

    python benchmarks/geglu_probe.py --out geglu.json [--configs JSON]

The H200 configuration's MLP (GLU width 2,624, bf16) at the two serving shapes (128 and 1,792
positions): 28 calls on 28 distinct ``Wi`` outputs captured in one CUDA graph, replayed; the time
per call is the replay's median over 28.  Rows:

- ``geglu ROWSxBLOCK_N wW``: the kernel at each configuration of ``--configs`` (default: a grid around
  the module's), with whether its output is eager's bit for bit;
- ``inductor``: ``torch.compile`` of the same reference at that exact shape (Inductor times its
  candidates for it: the best it would pick had the example been this size);
- ``eager``: the module's ops (``chunk``, ``F.gelu``, the product).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemm_probe import finish, graphed_ms, probe_result, saver  # noqa: E402  (shared by the GPU probes)

LAYERS, WIDTH = 28, 2624
POSITIONS = {"1x128": 128, "7x256": 1792}
CONFIGS = [
    {"ROWS": r, "BLOCK_N": n, "num_warps": w}
    for r, n in ((1, 1024), (2, 512), (4, 256), (8, 128), (16, 64), (4, 512), (8, 256), (16, 128), (2, 1024))
    for w in (2, 4, 8)
]


def probe_shape(torch, geglu, result: dict, save, shape: str, m: int, configs: list) -> None:
    """The rows of one shape: the kernel at each configuration, then Inductor's and eager's."""
    xs = [torch.randn(m, 2 * WIDTH, device="cuda", dtype=torch.bfloat16) * 2 for _ in range(LAYERS)]
    outs = [torch.empty(m, WIDTH, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
    eager = geglu.reference(xs[0])

    def record(name, calls, out0=None, **extra):
        row = {"shape": shape, "positions": m, "name": name, **extra}
        try:
            row["us"] = round(graphed_ms(torch, calls) / LAYERS * 1e3, 2)
            if out0 is not None:
                out = out0()
                row["max_abs_vs_eager"] = float((out.float() - eager.float()).abs().max())
                row["equal_to_eager"] = bool(torch.equal(out, eager))
        except Exception as exc:  # noqa: BLE001 - a probe records what failed and goes on
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        save()

    for config in configs:

        def once(config=config):
            out = torch.empty(m, WIDTH, device="cuda", dtype=torch.bfloat16)
            geglu.launch(xs[0], out, config=config)
            return out

        calls = [lambda i=i, config=config: geglu.launch(xs[i], outs[i], config=config) for i in range(LAYERS)]
        record(f"geglu {config['ROWS']}x{config['BLOCK_N']} w{config['num_warps']}", calls, once, config=config)
    compiled = torch.compile(geglu.reference, dynamic=False)
    record("inductor", [lambda i=i: compiled(xs[i]) for i in range(LAYERS)], lambda: compiled(xs[0]))
    record("eager", [lambda i=i: geglu.reference(xs[i]) for i in range(LAYERS)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--configs", default=json.dumps(CONFIGS))
    args = parser.parse_args()
    start = time.monotonic()

    import torch

    from laya_build.model import geglu

    result = probe_result(torch, "benchmarks/geglu_probe.py", default_config=geglu.CONFIG)
    save = saver(result, args.out)
    torch.manual_seed(0)
    for shape, m in POSITIONS.items():
        probe_shape(torch, geglu, result, save, shape, m, json.loads(args.configs))
    return finish(result, save, start)


if __name__ == "__main__":
    raise SystemExit(main())
