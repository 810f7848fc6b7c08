"""What fp8 GEMMs would do to the decision model's answers, simulated on the CPU.

    python benchmarks/fp8_parity.py artifacts/<version>/model --out fp8.json

Every ``nn.Linear`` of the encoder computes as a row-wise scaled fp8 (e4m3) GEMM would
(``torch._scaled_mm`` with per-row scales): the weight quantised per output row, the input per
token, each to e4m3 with its row's absolute maximum mapped to 448, multiplied in fp32 and
rounded to the model's bf16.  The saved batches then run through it and through the bf16 model
(what ``eager.pt`` holds for a bf16 package), and the two are compared as ``doit verify``
compares a package with ``eager.pt``: the largest logit and probability differences and the
argmax agreement of both heads.  fp32 is the third column, for scale.  No GPU needed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="a build's model folder (checkpoint/ and inputs.pt)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import torch
    from torch import nn

    from laya_build.model.checkpoint import load_checkpoint
    from laya_build.model.decision import eval_copy
    from laya_build.model.inputs import load_inputs
    from laya_build.runtime.formats import run_batches
    from laya_build.runtime.parity import compare_heads, summarize

    f8 = torch.float8_e4m3fn
    top = torch.finfo(f8).max

    def rowwise(t):
        scale = t.float().abs().amax(-1, keepdim=True).clamp(min=1e-12) / top
        return (t.float() / scale).to(f8).float() * scale

    class Fp8Linear(nn.Module):
        def __init__(self, linear):
            super().__init__()
            self.weight = rowwise(linear.weight.detach())
            self.bias = None if linear.bias is None else linear.bias.detach().float()
            self.dtype = linear.weight.dtype

        def forward(self, x):
            y = rowwise(x) @ self.weight.t()
            return (y if self.bias is None else y + self.bias).to(self.dtype)

    def swap(module) -> int:
        n = 0
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, Fp8Linear(child))
                n += 1
            else:
                n += swap(child)
        return n

    start = time.monotonic()
    model, _, _ = load_checkpoint(args.model_dir / "checkpoint")
    inputs = load_inputs(args.model_dir / "inputs.pt")
    batches, names, calibration = inputs["batches"], inputs["arg_names"], inputs.get("calibration")

    def compare(ref, got):
        return summarize([compare_heads(r, g, b, calibration) for r, g, b in zip(ref, got, batches)])

    bf16 = run_batches(eval_copy(model, torch.bfloat16), batches, names, "cpu")
    fp32 = run_batches(eval_copy(model, torch.float32), batches, names, "cpu")
    quantised = eval_copy(model, torch.bfloat16)
    swapped = swap(quantised.encoder)
    fp8 = run_batches(quantised, batches, names, "cpu")
    result = {
        "command": "benchmarks/fp8_parity.py",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__,
        "encoder_linears_in_fp8": swapped,
        "rows": sum(len(b["input_ids"]) for b in batches),
        "bf16_vs_fp32": compare(fp32, bf16),
        "fp8_vs_bf16": compare(bf16, fp8),
        "fp8_vs_fp32": compare(fp32, fp8),
        "elapsed_s": round(time.monotonic() - start, 1),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
