"""Child process of the latency stage: time the model variants on the saved inputs.

Run as ``python -m laya_build.stages._latency_child JOB.json`` with a fresh, empty
``TORCHINDUCTOR_CACHE_DIR`` (``torch.compile`` writes there).  Variants:

- ``eager_amp``: fp32 weights under ``torch.autocast(amp_dtype)``;
- ``eager_bf16``: a separate eval copy with explicit bf16 weights, no autocast;
- ``compiled_bf16``: ``torch.compile`` of that copy (``dynamic=True`` by default);
- ``package``: the AOTInductor package (its sha256 was checked by the parent).

Per variant and batch: the first call (compilation for ``compiled_bf16``), outputs compared
with ``eager_amp`` (decision probabilities calibrated as upstream Laya publishes them:
``_aoti_runtime.decision_probabilities``), then warm-ups and the median of synchronised
groups of forwards.
"""
from __future__ import annotations

import faulthandler
import json
import sys
import time

import torch
import torch._inductor

from ..model.checkpoint import load_checkpoint
from ..model.decision import eval_copy
from . import _aoti_runtime as rt


def make_variant(name: str, job: dict, model):
    device = job["device"]
    if name == "eager_amp":
        fp32 = eval_copy(model, torch.float32, device)
        amp_dtype = getattr(torch, job["amp_dtype"])

        def amp(*args):
            with torch.autocast(device_type=device, dtype=amp_dtype):
                return fp32(*args)
        return amp
    if name == "eager_bf16":
        return eval_copy(model, torch.bfloat16, device)
    if name == "compiled_bf16":
        mode = job["compile"].get("mode", "default")
        return torch.compile(eval_copy(model, torch.bfloat16, device),
                             dynamic=job["compile"].get("dynamic", True),
                             mode=None if mode == "default" else mode)
    if name == "package":
        rt.preload_modules(job["preload"])
        return torch._inductor.aoti_load_package(job["package"]["path"])
    raise ValueError(f"unknown latency variant {name!r}")


def measure(name: str, job: dict, model, inputs: dict, reference) -> dict:
    start = time.perf_counter()
    fn = make_variant(name, job, model)
    setup_s = time.perf_counter() - start
    batches = inputs["batches"]
    start = time.perf_counter()
    outputs = rt.run_batches(fn, batches, inputs["arg_names"], job["device"])
    first_call_s = time.perf_counter() - start
    timed = [{"batch": i, "latency": rt.time_forwards(
        fn, rt.batch_args(b, inputs["arg_names"], job["device"]), job["timing"], job["device"])}
        for i, b in enumerate(batches)]
    parity = None if reference is None else rt.summarize(
        [rt.compare_heads(r, o, b, inputs["calibration"])
         for r, o, b in zip(reference, outputs, batches)])
    return {"name": name, "setup_s": setup_s, "first_calls_s": first_call_s, "batches": timed,
            "parity_vs_eager_amp": parity, "_outputs": outputs}


def main(job_path: str) -> int:
    faulthandler.enable()
    with open(job_path, encoding="utf-8") as fh:
        job = json.load(fh)
    model = load_checkpoint(job["checkpoint"])[0]
    inputs = rt.load_weights_only(job["inputs"], "inputs", rt.INPUTS_FORMAT)
    order = sorted(job["variants"], key=lambda v: v != "eager_amp")  # the reference first
    results, reference = [], None
    for name in order:
        result = measure(name, job, model, inputs, reference)
        outputs = result.pop("_outputs")
        if name == "eager_amp":
            reference = outputs
        results.append(result)
    results.sort(key=lambda r: job["variants"].index(r["name"]))
    rt.write_json_atomic(job["result"], {"variants": results})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
