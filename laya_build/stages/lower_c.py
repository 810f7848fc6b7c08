"""Stage ``lower_c``: the fp32 C specialisation (``kernels.compile_cpu``), its generated C
source, and a numerical check against the torch reference on the configured shapes.

The check fails the stage (:class:`NumericalCheckFailed`, numbers in the message) when a
kernel's output differs from the reference by more than ``atol``, or when an in-place
update is not exact (LayerNorm's residual stream must equal ``X + R`` bit for bit and stay
untouched with ``residual=False``; RoPE must leave V bit for bit unchanged).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from laya_build.errors import NumericalCheckFailed  # noqa: F401  (NumericalCheckFailed re-exported)
from laya_build.stages.kernelgen import call_args, kernel_toolchain, load_factory, publish, sha256_text

# Compilers this stage runs (TileLang builds target c with the C++ compiler): part of its
# up-to-date check (laya_build.environment).
TOOLS = ("cxx",)


@dataclass
class Case:
    """One numerical case: the kernel's call arguments and what its outputs must equal."""

    inputs: tuple
    compare: list = field(default_factory=list)  # (name, actual_fn, expected, valid_mask|None)
    exact: list = field(default_factory=list)  # (name, actual_fn, expected)


def _rand(gen, *shape, scale=1.0):
    import torch

    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).float()


# Each case builder takes the factory's full arguments (kernels.registry's bind: defaults
# filled in, however the variant passed them) and one check shape.
def _gemm_case(a, shape, gen):
    import torch

    from kernels.reference import gemm_reference

    N, K = a["N"], a["K"]
    M = shape["M"]
    A, W, b = _rand(gen, M, K), _rand(gen, N, K, scale=K**-0.5), _rand(gen, N)
    C = torch.empty(M, N)
    ref = gemm_reference(A, W, b if a["bias"] else None, a["act"])
    return Case((A, W, b, C), compare=[("C", lambda: C, ref, None)])


def _geglu_case(a, shape, gen):
    import torch

    from kernels.reference import geglu_reference

    F, K = a["F"], a["K"]
    M = shape["M"]
    A, W = _rand(gen, M, K), _rand(gen, 2 * F, K, scale=K**-0.5)
    C = torch.empty(M, F)
    return Case((A, W, C), compare=[("C", lambda: C, geglu_reference(A, W), None)])


def _add_ln_case(a, shape, gen):
    import torch

    from kernels.reference import add_ln_reference

    D = a["D"]
    M = shape["M"]
    residual, bias = a["residual"], a["bias"]
    X, R = _rand(gen, M, D, scale=3e4), _rand(gen, M, D)
    w, b = _rand(gen, D), _rand(gen, D)
    Y = torch.empty(M, D)
    x_new, ref = add_ln_reference(X, R, w, b if bias else None, a["eps"], residual)
    return Case(
        (X, R, w, b, Y), compare=[("Y", lambda: Y, ref, None)], exact=[("X (residual stream)", lambda: X, x_new)]
    )


def _rope_case(a, shape, gen):
    from kernels.reference import rope_reference, rope_tables

    H, Dh = a["H"], a["Dh"]
    M, L = shape["M"], shape["L"]
    QKV = _rand(gen, M, 3 * H * Dh)
    cos, sin = rope_tables(L, Dh)
    ref = rope_reference(QKV, cos, sin, H, Dh)
    v = QKV[:, 2 * H * Dh :].clone()
    return Case(
        (QKV, cos, sin),
        compare=[("QK columns", lambda: QKV[:, : 2 * H * Dh], ref[:, : 2 * H * Dh], None)],
        exact=[("V columns", lambda: QKV[:, 2 * H * Dh :], v)],
    )


def _attn_case(a, shape, gen):
    import torch

    from kernels.reference import attn_reference

    H, Dh = a["H"], a["Dh"]
    B, L = shape.get("B", a["B"]), shape.get("L", a["L"])  # kernels.registry checked the shape
    lens = torch.tensor(shape.get("lens", [L] * B), dtype=torch.int32)
    QKV = _rand(gen, B, L, 3, H, Dh)
    O = torch.empty(B, L, H * Dh)
    ref = attn_reference(QKV, lens, window=a["window"])
    valid = torch.arange(L)[None, :] < lens[:, None].long()  # [B, L] valid query rows
    return Case((QKV, lens, O), compare=[("O", lambda: O, ref, valid)])


HARNESS: dict[str, Callable] = {
    "gemm_kernel": _gemm_case,
    "gemm_geglu_kernel": _geglu_case,
    "add_ln_kernel": _add_ln_case,
    "rope_kernel": _rope_case,
    "attn_kernel": _attn_case,
}


def check_case(case: Case, atol: float, where: str) -> dict:
    """Max abs error vs the reference (valid rows only) and exactness of in-place updates."""
    import torch

    result = {"max_abs_err": 0.0, "exact": True, "finite": True}
    for name, actual_fn, expected, valid in case.compare:
        actual = actual_fn().double()
        result["finite"] &= bool(torch.isfinite(actual).all())
        err = (actual - expected).abs()
        if valid is not None:
            err = err[valid]
        worst = float(err.max()) if err.numel() else 0.0
        result["max_abs_err"] = max(result["max_abs_err"], worst)
        if not worst <= atol:  # also catches NaN
            idx = divmod(int(err.argmax()), err.shape[-1]) if err.dim() == 2 else int(err.argmax())
            raise NumericalCheckFailed(
                f"{where}: {name} differs from the reference by {worst:.3e} > atol {atol:.1e} (at {idx})"
            )
    for name, actual_fn, expected in case.exact:
        actual = actual_fn()
        if not torch.equal(actual, expected):
            diff = float((actual.double() - expected.double()).abs().max())
            raise NumericalCheckFailed(f"{where}: {name} is not bitwise exact (max difference {diff:.3e})")
    if not result["finite"]:
        raise NumericalCheckFailed(f"{where}: output contains NaN or Inf")
    return result


def run_lower_c(**spec) -> dict:
    """spec: variant, factory, args, kwargs, shapes, seed, atol, source (path), source_rel."""
    import torch

    import kernels
    from kernels.registry import CPU_DTYPE, KERNELS

    start = time.perf_counter()
    args, kwargs = call_args(spec)
    kernel = kernels.compile_cpu(load_factory(spec["factory"]), *args, **kwargs)
    compile_s = time.perf_counter() - start
    source = kernel.source
    registered = KERNELS[spec["factory"]]
    bound = registered.bind(args, kwargs, dtype=CPU_DTYPE, cpu=True)
    make_case = HARNESS[spec["factory"]]
    gen = torch.Generator().manual_seed(spec["seed"])
    checks = []
    for i, shape in enumerate(spec["shapes"]):
        registered.check_shape(bound, shape)
        case = make_case(bound, shape, gen)
        kernel(*case.inputs)
        # check_case raises NumericalCheckFailed on any failure: a recorded check has passed
        result = check_case(case, spec["atol"], f"{spec['variant']} shape {i} {shape}")
        checks.append({"shape": shape, **result, "atol": spec["atol"], "passed": True})
    record = {
        "stage": "lower_c",
        "variant": spec["variant"],
        "factory": spec["factory"],
        "args": args,
        "kwargs": kwargs,
        "dtype": "float32",
        "target": "c",
        "source": spec["source_rel"],
        "sha256": sha256_text(source),
        "bytes": len(source.encode("utf-8")),
        "seed": spec["seed"],
        "checks": checks,
        "max_abs_err": max(c["max_abs_err"] for c in checks),
        "passed": True,
        "compile_s": round(compile_s, 4),
        "toolchain": kernel_toolchain(),
        "elapsed_s": round(time.perf_counter() - start, 4),
    }
    return publish(record, spec["source"], source)
