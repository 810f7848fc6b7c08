"""The latency stage's child process: time the model variants of one target on the saved inputs.

Run by :func:`laya_build.runner.run` (``measure_variants(job)``) in a fresh interpreter with
a fresh, empty ``TORCHINDUCTOR_CACHE_DIR`` (``torch.compile`` writes there).  The job's
``variants`` (those that do not depend on a package) are measured once, then its
``package_variants`` for each of its ``packages`` (one per dtype of the target), in order.
Variants:

- ``eager_amp``: fp32 weights under ``torch.autocast(amp_dtype)``;
- ``eager_bf16``: a separate eval copy with explicit bf16 weights, no autocast;
- ``compiled_bf16``: ``torch.compile`` of that copy (``dynamic=True`` by default);
- ``package``: the AOTInductor package, loaded as ``aoti_load_package`` loads it by default
  (its sha256 checked again here, the CPU-ISA question answered from the package:
  :func:`laya_build.runtime.load_package`);
- ``package_graphed``: the package behind :class:`laya_build.runtime.DecisionRunner` (loaded
  single-threaded; a CUDA graph per bucket on CUDA, padded plain calls on the CPU).

Per variant and batch: the first call (compilation for ``compiled_bf16``), outputs compared
with ``eager_amp`` (decision probabilities calibrated as upstream Laya publishes them:
``laya_build.runtime.parity.decision_probabilities``), then warm-ups and the budgeted timing of
:func:`aoti.time_calls`.
"""

from __future__ import annotations

import faulthandler
import time

import torch

from laya_build.model.checkpoint import load_checkpoint
from laya_build.model.decision import eval_copy
from laya_build.runtime import serving as runtime
from laya_build.runtime.formats import INPUTS_FORMAT, batch_args, load_weights_only, run_batches
from laya_build.runtime.parity import compare_heads, summarize
from laya_build.runtime.serving import preload_modules
from laya_build.runtime.timing import time_calls
from laya_build.stages.children.vec_isa import check_vec_isas


def make_variant(name: str, job: dict, model, package: dict | None = None):
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
        if device == "cpu":
            check_vec_isas(job["vec_isa_root"])
        mode = job["compile"].get("mode", "default")
        return torch.compile(
            eval_copy(model, torch.bfloat16, device),
            dynamic=job["compile"].get("dynamic", True),
            mode=None if mode == "default" else mode,
        )
    if name in ("package", "package_graphed"):
        preload_modules(job["preload"])
        # torch's public loader, as every latency record so far measured it (the runtime's own
        # default, the direct loader, is the same program without the per-call pytree parsing)
        loaded = runtime.load_package(
            package["path"],
            package["sha256"],
            single_threaded=name == "package_graphed",
            loader="aoti_load_package",
            library=package.get("library"),
        )
        if name == "package":
            return loaded
        spec = job["runtime"]
        return runtime.DecisionRunner(
            loaded, dims=package["dims"], buckets=spec["buckets"], capture_warmup=spec["capture_warmup"]
        )
    raise ValueError(f"unknown latency variant {name!r}")


def measure(name: str, job: dict, model, inputs: dict, reference, package: dict | None = None) -> dict:
    start = time.perf_counter()
    fn = make_variant(name, job, model, package)
    setup_s = time.perf_counter() - start
    batches = inputs["batches"]
    start = time.perf_counter()
    outputs = run_batches(fn, batches, inputs["arg_names"], job["device"])
    first_call_s = time.perf_counter() - start
    timed = []
    for i, b in enumerate(batches):
        args = batch_args(b, inputs["arg_names"], job["device"])
        row = {"batch": i, "latency": time_calls(fn, args, job["timing"], job["device"])}
        if isinstance(fn, runtime.DecisionRunner):
            bucket = fn.bucket_for(*fn.shape(args))
            row["bucket"] = bucket and bucket.as_dict()
        timed.append(row)
    parity = (
        None
        if reference is None
        else summarize([compare_heads(r, o, b, inputs["calibration"]) for r, o, b in zip(reference, outputs, batches)])
    )
    result = {
        "name": name,
        **({"dtype": package["dtype"]} if package else {}),
        "setup_s": setup_s,
        "first_calls_s": first_call_s,
        "batches": timed,
        "parity_vs_eager_amp": parity,
        "_outputs": outputs,
    }
    if isinstance(fn, runtime.DecisionRunner):
        described = fn.describe()
        result["runner"] = {k: described[k] for k in ("mode", "buckets", "capture_s", "captures")}
    return result


def measure_variants(job: dict) -> dict:
    faulthandler.enable()
    model = load_checkpoint(job["checkpoint"])[0]
    inputs = load_weights_only(job["inputs"], "inputs", INPUTS_FORMAT)
    order = sorted(job["variants"], key=lambda v: v != "eager_amp")  # the reference first
    results, reference = [], None
    for name in order:
        result = measure(name, job, model, inputs, reference)
        outputs = result.pop("_outputs")
        if name == "eager_amp":
            reference = outputs
        results.append(result)
    results.sort(key=lambda r: job["variants"].index(r["name"]))
    for package in job["packages"]:  # one loaded package at a time
        for name in job["package_variants"]:
            result = measure(name, job, model, inputs, reference, package)
            del result["_outputs"]
            results.append(result)
    return {"variants": results}
