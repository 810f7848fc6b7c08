"""Stage ``tir``: ``factory.get_tir(...)`` -> TVMScript text and a structural hash."""

from __future__ import annotations

import time

from laya_build.stages.kernelgen import call_args, kernel_toolchain, load_factory, publish, sha256_text


def run_tir(**spec) -> dict:
    """spec: variant, factory, args, kwargs, dtype, cpu, target (TileLang target), script (output path)."""
    import tilelang  # noqa: F401  (puts its bundled tvm on sys.path)
    import tvm

    start = time.perf_counter()
    factory = load_factory(spec["factory"])
    args, kwargs = call_args(spec, dtype=spec["dtype"], cpu=spec["cpu"])
    with tvm.target.Target(spec["target"]):  # TileLang's frontend lowers T.gemm per target
        func = factory.get_tir(*args, **kwargs)
    script = func.script()
    record = {
        "stage": "tir",
        "variant": spec["variant"],
        "factory": spec["factory"],
        "args": spec.get("args", []),
        "kwargs": spec.get("kwargs", {}),
        "dtype": spec["dtype"],
        "cpu": spec["cpu"],
        "target": spec["target"],
        "global_symbol": str(func.attrs["global_symbol"]) if func.attrs and "global_symbol" in func.attrs else None,
        "params": [str(p.name) for p in func.params],
        "structural_hash": int(tvm.ir.structural_hash(func)),
        "script": spec["script_rel"],
        "script_sha256": sha256_text(script),
        "script_bytes": len(script.encode("utf-8")),
        "toolchain": kernel_toolchain(),
        "elapsed_s": round(time.perf_counter() - start, 4),
    }
    return publish(record, spec["script"], script)
