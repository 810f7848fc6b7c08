"""The fresh verification process: load a ``.pt2`` package and check it against ``eager.pt``.

Run as a standalone script, ``python laya_build/stages/_verify_child.py JOB.json``.  It
imports only ``torch``, the standard library and its sibling ``_aoti_runtime`` (itself
torch + stdlib): no transformers, no laya_build model code, no checkpoint.  The result
records which of those modules were present at the end, to prove it.

Order of work:

1. ``AOTI_RUNTIME_CHECK_INPUTS=1`` before torch is imported; ``faulthandler`` on.
2. Integrity: each package's sha256 must equal its record's, BEFORE anything loads it (a
   ``.pt2`` runs native code).  Then the inputs' hash and every eager file's metadata
   (program, target, dtype, inputs hash) and shapes must match the package.
3. Preload: import the configured modules when installed (``tilelang`` for CUDA targets: on
   the GPU image a fresh-process ``aoti_load_package`` of a CUDA package segfaulted unless
   ``import tilelang`` ran first; the cause is unknown).
4. Mask ``torch.compile``, ``torch.export.export``, ``torch._inductor.aoti_compile_and_package``
   and ``torch._export.aot_compile`` with functions that raise.
5. Load each package with ``torch._inductor.aoti_load_package`` and list what appeared in the
   (empty, temporary) Inductor cache during the load.
6. Run every saved batch; per head and row record the max |logit delta|, max |probability
   delta| (the calibrated probabilities upstream Laya publishes: ``rt.decision_probabilities``
   with the checkpoint's temperatures saved in the inputs) and both argmaxes; time the forwards.

Errors are written to the result as ``{"status": "error", "kind": ..., "message": ...}``
(kinds: integrity, inputs, runtime) and the process exits 3.  A native crash kills the
process by a signal, which the parent reports as a failure naming the signal.  For tests
only, ``LAYA_VERIFY_CHILD_CRASH=SIGSEGV`` (any signal name) makes the process kill itself
with that signal just before loading, to simulate the GPU image's crash on any machine.
"""
from __future__ import annotations

import os

os.environ["AOTI_RUNTIME_CHECK_INPUTS"] = "1"

import faulthandler  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

if __package__:
    from . import _aoti_runtime as rt  # noqa: E402
else:  # run as a script: this file's directory is sys.path[0]
    import _aoti_runtime as rt  # noqa: E402

CRASH_ENV = "LAYA_VERIFY_CHILD_CRASH"
FORBIDDEN_MODULES = ("transformers", "laya_build")
EXIT_ERROR = 3


class ChildFailure(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def check_integrity(programs: list[dict]) -> None:
    for p in programs:
        actual = rt.sha256_file(p["package"])
        if actual != p["sha256"]:
            raise ChildFailure("integrity", (
                f"{p['package']}: sha256 {actual} does not match the package record's "
                f"{p['sha256']}; refusing to load it (a .pt2 runs native code)"))


def check_inputs(job: dict, inputs: dict, eagers: list[dict]) -> None:
    actual = rt.sha256_file(job["inputs"])
    if actual != job["inputs_sha256"]:
        raise ChildFailure("inputs", f"{job['inputs']}: sha256 {actual} is not that of the "
                                     f"inputs the package was exported with ({job['inputs_sha256']})")
    for p, eager in zip(job["programs"], eagers):
        expected = {"program": p["name"], "target": job["target"], "dtype": job["dtype"],
                    "inputs_sha256": job["inputs_sha256"], "batches_key": p["batches_key"]}
        for field, want in expected.items():
            if eager.get(field) != want:
                raise ChildFailure("inputs", f"{p['eager']}: {field} is {eager.get(field)!r} but the "
                                             f"package {p['package']} needs {want!r}")
        batches = inputs[p["batches_key"]]
        if len(eager["outputs"]) != len(batches):
            raise ChildFailure("inputs", f"{p['eager']}: {len(eager['outputs'])} batches of outputs "
                                         f"for {len(batches)} saved batches")
        for b, (batch, out) in enumerate(zip(batches, eager["outputs"])):
            rows, slots = batch["marker_pos"].shape
            if tuple(out["decision"].shape) != (rows, slots) or out["act"].shape[0] != rows:
                raise ChildFailure("inputs", (
                    f"{p['eager']}: batch {b} outputs have decision {tuple(out['decision'].shape)} / "
                    f"act {tuple(out['act'].shape)} for a batch of {rows} rows x {slots} slots"))


def mask_compilers() -> list[str]:
    import torch._export
    import torch._inductor

    targets = [(torch, "compile"), (torch.export, "export"),
               (torch._inductor, "aoti_compile_and_package"), (torch._export, "aot_compile")]
    masked = []
    for owner, attr in targets:
        name = f"{owner.__name__}.{attr}"

        def blocked(*args, _name=name, **kwargs):
            raise RuntimeError(f"{_name} is disabled in the verification process: it may only "
                               "load the package, never compile or export")

        setattr(owner, attr, blocked)
        masked.append(name)
    return masked


def simulate_crash() -> None:
    name = os.environ.get(CRASH_ENV)
    if name:
        faulthandler.disable()  # a simulated crash needs no traceback dump
        os.kill(os.getpid(), getattr(signal, name))


def verify(job: dict) -> dict:
    programs = job["programs"]
    check_integrity(programs)
    inputs = rt.load_weights_only(job["inputs"], "inputs", rt.INPUTS_FORMAT)
    eagers = [rt.load_weights_only(p["eager"], "eager outputs", rt.EAGER_FORMAT) for p in programs]
    check_inputs(job, inputs, eagers)

    preloaded = rt.preload_modules(job["preload"])
    masked = mask_compilers()
    simulate_crash()
    cache_dir = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    cache_initial = rt.list_tree(cache_dir)
    results = []
    for p, eager in zip(programs, eagers):
        cache_before = rt.list_tree(cache_dir)
        start = time.perf_counter()
        try:
            runner = torch._inductor.aoti_load_package(p["package"])
        except Exception as exc:
            raise ChildFailure("runtime", f"{p['package']}: aoti_load_package failed: "
                                          f"{type(exc).__name__}: {exc}") from exc
        load_s = time.perf_counter() - start
        cache_after_load = rt.list_tree(cache_dir)
        batches = []
        for b, (batch, ref) in enumerate(zip(inputs[p["batches_key"]], eager["outputs"])):
            args = rt.batch_args(batch, inputs["arg_names"], job["device"])
            try:
                with torch.inference_mode():
                    got = rt.outputs_dict(runner(*args))
            except Exception as exc:
                raise ChildFailure("runtime", f"{p['package']}: batch {b} failed: "
                                              f"{type(exc).__name__}: {exc}") from exc
            rows, tokens = batch["input_ids"].shape
            batches.append({
                "batch": b, "shape": {"rows": rows, "tokens": tokens,
                                      "slots": batch["marker_pos"].shape[1]},
                "compare": rt.compare_heads(ref, got, batch, inputs["calibration"]),
                "latency": rt.time_forwards(runner, args, job["timing"], job["device"]),
            })
        results.append({"name": p["name"], "load_s": load_s,
                        "cache_during_load": [f for f in cache_after_load if f not in cache_before],
                        "batches": batches})
    return {
        "status": "ok", "programs": results,
        "cache_initial": cache_initial, "cache_after_run": rt.list_tree(cache_dir),
        "child": {
            "pid": os.getpid(), "python": sys.version.split()[0], "torch": torch.__version__,
            "preload": preloaded, "masked": masked,
            "aoti_runtime_check_inputs": os.environ.get("AOTI_RUNTIME_CHECK_INPUTS"),
            "forbidden_modules_loaded": sorted(m for m in FORBIDDEN_MODULES if m in sys.modules),
        },
    }


def main(job_path: str) -> int:
    faulthandler.enable()
    with open(job_path, encoding="utf-8") as fh:
        job = json.load(fh)
    try:
        result = verify(job)
    except ChildFailure as exc:
        rt.write_json_atomic(job["result"], {"status": "error", "kind": exc.kind,
                                             "message": str(exc)})
        print(f"verification failed ({exc.kind}): {exc}", file=sys.stderr)
        return EXIT_ERROR
    rt.write_json_atomic(job["result"], result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
