"""The residual add and layer norm (``laya::add_norm``) on a GPU, against Inductor's fused kernel.

    python benchmarks/norm_probe.py --out norm.json [--configs JSON] [--rows 128,1792] [--rounds 3]

The H200 configuration's norm (hidden 1024, bf16, a weight and no bias) at the serving shapes'
row counts (1 x 128 and 7 x 256 positions): 55 calls (a forward's norms after an add) in one
CUDA graph, replayed; µs a call.  Two ways to feed them: ``cold``, 55 distinct inputs (read from
HBM), and ``hot``, one input read by every call (from L2).  Rows, interleaved over ``--rounds``:

- ``inductor``: ``torch.compile`` (dynamic rows, first compiled at 128 rows, as the package's
  export example) of the add and ``layer_norm``: the kernel a package without the op runs;
- ``eager``: the two torch calls;
- ``add_norm RxW``: the op's kernel at ``ROWS`` rows a program and ``num_warps`` ``W``, each of
  ``--configs`` (a JSON list of ``{"ROWS": R, "num_warps": W}``; default: 1, 2, 4, 8 rows by 1-8
  warps), compared with the eager result (its largest difference, both outputs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gemm_probe import failed, finish, graphed_ms, probe_result, saver  # noqa: E402  (shared by the GPU probes)

HIDDEN, CALLS, EPS = 1024, 55, 1e-5
DEFAULT_CONFIGS = [{"ROWS": r, "num_warps": w} for r in (1, 2, 4, 8) for w in (1, 2, 4, 8)]


def parse_configs(text: str | None) -> list[dict]:
    """``--configs``: a JSON list of ``{"ROWS": R, "num_warps": W}`` (powers of two); the default
    table without it.  A malformed list is refused with the form to write."""
    if text is None:
        return list(DEFAULT_CONFIGS)
    form = 'write a JSON list such as [{"ROWS": 4, "num_warps": 4}], ROWS and num_warps powers of two'
    try:
        configs = json.loads(text)
    except ValueError as exc:
        raise SystemExit(f"--configs is not JSON ({exc}): {form}") from None
    if not isinstance(configs, list) or not configs:
        raise SystemExit(f"--configs must be a non-empty list: {form}")
    for c in configs:
        ok = isinstance(c, dict) and set(c) == {"ROWS", "num_warps"}
        ok = ok and all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0 for v in c.values()
        )
        if not ok:
            raise SystemExit(f"--configs entry {c!r} is not one: {form}")
    return configs


def name(config: dict) -> str:
    return f"add_norm {config['ROWS']}x{config['num_warps']}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--configs", default=None, help="JSON list of {ROWS, num_warps}")
    ap.add_argument("--rows", default="128,1792", help="row counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    configs = parse_configs(args.configs)
    counts = [int(r) for r in args.rows.split(",")]

    import torch
    import torch.nn.functional as F

    from laya_build.model import add_norm as an

    start = time.monotonic()
    result = probe_result(torch, " ".join(sys.argv), hidden=HIDDEN, calls=CALLS, configs=configs)
    save = saver(result, args.out)
    g = torch.Generator(device="cuda").manual_seed(0)
    weight = (1 + 0.1 * torch.randn(HIDDEN, device="cuda", generator=g)).to(torch.bfloat16)

    def eager(a, b):
        s = a + b
        return s, F.layer_norm(s, (HIDDEN,), weight, None, EPS)

    compiled = torch.compile(eager, dynamic=True)
    compiled(*(torch.randn(128, HIDDEN, device="cuda", dtype=torch.bfloat16),) * 2)  # the export's example size

    def kernel(config):
        def run(a, b, s, y):
            an.launch(a, b, weight, None, EPS, s, y, config)
            return s, y

        return run

    for rows in counts:
        by_key = {}  # (feed, way) -> its row
        inputs = [
            tuple(torch.randn(rows, HIDDEN, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
            for _ in range(CALLS)
        ]
        outs = [(torch.empty_like(a), torch.empty_like(a)) for a, _ in inputs]
        ref = eager(*inputs[0])
        ways = {"inductor": lambda a, b, s, y: compiled(a, b), "eager": lambda a, b, s, y: eager(a, b)}
        ways.update({name(c): kernel(c) for c in configs})
        for feed in ("cold", "hot"):
            for way, fn in ways.items():
                row = by_key[(feed, way)] = {"rows": rows, "feed": feed, "way": way, "us": []}
                try:
                    got = fn(*inputs[0], *outs[0])
                    torch.cuda.synchronize()
                    row["max_abs_sum"] = float((got[0].float() - ref[0].float()).abs().max())
                    row["max_abs_norm"] = float((got[1].float() - ref[1].float()).abs().max())
                except Exception as exc:  # noqa: BLE001 - a probe records what failed and goes on
                    row["error"] = failed(exc)
        for _ in range(args.rounds):
            for feed in ("cold", "hot"):
                fed = range(CALLS) if feed == "cold" else [0] * CALLS  # distinct inputs, or one read by every call
                for way, fn in ways.items():
                    row = by_key[(feed, way)]
                    if "error" in row:
                        continue
                    calls = [lambda fn=fn, x=inputs[i], o=outs[i]: fn(*x, *o) for i in fed]
                    try:
                        row["us"].append(round(graphed_ms(torch, calls, 0.2) / CALLS * 1e3, 3))
                    except Exception as exc:  # noqa: BLE001
                        row["error"] = failed(exc)
        for row in by_key.values():
            if row["us"]:
                row["median_us"] = sorted(row["us"])[len(row["us"]) // 2]
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
        save()
        del inputs, outs
        torch.cuda.empty_cache()
    return finish(result, save, start)


if __name__ == "__main__":
    sys.exit(main())
