"""Stage ``probe_c``: the unmodified GPU specialisation compiled for TileLang's C target with
the GPU pass config (and ``cpu=True`` kept in 16-bit), recorded as data.

A probe that fails to compile is the expected, informative outcome, not a stage failure.
The record says whether the observed diagnostic matches the one pinned in
``kernels/probe_pins.json`` for the installed TileLang version; a mismatch (or no pin for
this version) is flagged in the record for a human to re-probe.
"""

from __future__ import annotations

import time

from laya_build.stages.kernelgen import call_args, kernel_toolchain, load_factory

# Compilers this stage runs (TileLang builds target c with the C++ compiler): part of its
# up-to-date check (laya_build.environment).
TOOLS = ("cxx",)


def pin_key(factory_name: str) -> str | None:
    """The probe-case name (``gemm``, ``attention``, ...) whose pins cover ``factory_name``."""
    from kernels.probe import PROBE_CASES

    return next((key for key, case in PROBE_CASES.items() if case.factory_name == factory_name), None)


def run_probe_c(**spec) -> dict:
    """spec: variant, factory, args, kwargs, dtype, cpu."""
    from kernels import probe as kprobe

    start = time.perf_counter()
    args, kwargs = call_args(spec)
    result = kprobe.probe(load_factory(spec["factory"]), args, kwargs, spec["dtype"], cpu=spec["cpu"])
    flavour = "cpu" if spec["cpu"] else "gpu"
    key = pin_key(spec["factory"])
    pin = kprobe.pinned(key, flavour, spec["dtype"]) if key else None
    if pin is None:
        status = "unpinned"
    else:
        status = "matches_pin" if kprobe.matches_pin(result, pin) else "differs_from_pin"
    return {
        "stage": "probe_c",
        "variant": spec["variant"],
        "factory": spec["factory"],
        "args": args,
        "kwargs": kwargs,
        "dtype": spec["dtype"],
        "specialisation": flavour,
        "target": "c",
        **result,
        "pin": {"kernel": key, "tilelang": kprobe.tilelang_version(), "expected": pin, "status": status},
        "toolchain": kernel_toolchain(),
        "elapsed_s": round(time.perf_counter() - start, 4),
    }
