"""The compile probe of the reference document (section 2), with pinned diagnostics.

:func:`probe` builds a factory's PrimFunc and compiles it for TileLang's C target with the
*GPU* pass configuration.  The GPU specialisation (``cpu=False``: fragment/shared buffers,
``T.Parallel``, ``T.reduce_*``) and the 16-bit dtypes are expected to fail there; the
observed diagnostics are pinned per TileLang version in ``probe_pins.json`` and compared by
the pipeline's ``probe_c`` stage (one fresh process per probe: TileLang keeps global state).

Run ``python -m kernels.probe`` to print every case's outcome as JSON; ``--write`` pins them
for the installed TileLang version (check the new messages first).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import tilelang

from ._common import GPU_DTYPES, GPU_PASS_CONFIGS
from .attention import PROBE_ARGS as ATTN_PROBE_ARGS
from .lowering import cuda_source  # noqa: F401  (public here too: the probe's CUDA-lowering check)

__all__ = [
    "ProbeCase",
    "PROBE_CASES",
    "PINS_PATH",
    "probe",
    "probe_case",
    "observe",
    "as_pin",
    "normalise_message",
    "load_pins",
    "pinned",
    "matches_pin",
    "cuda_source",
    "tilelang_version",
]

PINS_PATH = Path(__file__).with_name("probe_pins.json")
VARIANTS = ("gpu", "cpu")


@dataclass(frozen=True)
class ProbeCase:
    """A canonical shape of one kernel: ``factory.get_tir(*args, dtype=..., cpu=..., **kwargs)``."""

    factory_name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    @property
    def factory(self):
        import kernels

        return getattr(kernels, self.factory_name)


# The five probe shapes: one small, representative specialisation of every kernel, with
# the default (GPU) tiles.  They also serve the CUDA-lowering check (every GPU
# specialisation must lower to CUDA source in bf16 and fp16).
PROBE_CASES: dict[str, ProbeCase] = {
    "gemm": ProbeCase("gemm_kernel", (256, 128), {"bias": True, "act": "gelu"}),
    "geglu": ProbeCase("gemm_geglu_kernel", (128, 128)),
    "add_ln": ProbeCase("add_ln_kernel", (256,), {"residual": True, "bias": True}),
    "rope": ProbeCase("rope_kernel", (4, 64)),
    "attention": ProbeCase("attn_kernel", (), dict(ATTN_PROBE_ARGS)),
}


def tilelang_version() -> str:
    return version("tilelang")


_TMP_PATH = re.compile(r"(/(?:tmp|var/folders|private/var)[^\s'\"]*|[^\s'\"]*tmp[A-Za-z0-9_]{6,}[^\s'\"]*)")
_HEX = re.compile(r"0x[0-9a-fA-F]{6,}")


def normalise_message(exc: BaseException) -> str:
    """The first non-empty line of ``str(exc)``, stable across runs and machines: temporary
    paths become ``<tmp>``, the TileLang installation directory ``<tilelang>`` and long hex
    addresses ``0x?``."""

    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    for root in tilelang.__path__:
        first = first.replace(root, "<tilelang>")
    return _HEX.sub("0x?", _TMP_PATH.sub("<tmp>", first))


def _qualname(exc: BaseException) -> str:
    cls = type(exc)
    return f"{cls.__module__}.{cls.__qualname__}"


def probe(factory, args=(), kwargs=None, dtype: str = "bfloat16", cpu: bool = False) -> dict:
    """Compile ``factory.get_tir(*args, dtype=dtype, cpu=cpu, **kwargs)`` for target ``"c"``
    with ``GPU_PASS_CONFIGS``.

    Returns ``{"outcome": "compiled"|"failed", "exception_type": "<module>.<qualname>" or
    None, "message": <normalised first line> or None}``.  Exceptions raised while building
    the PrimFunc are reported the same way (they are failures of the probe, not of the
    caller).
    """

    try:
        prim_func = factory.get_tir(*args, dtype=dtype, cpu=cpu, **(kwargs or {}))
        tilelang.compile(prim_func, target="c", pass_configs=GPU_PASS_CONFIGS)
    except Exception as exc:  # noqa: BLE001 - the probe records whatever TileLang raises
        return {"outcome": "failed", "exception_type": _qualname(exc), "message": normalise_message(exc)}
    return {"outcome": "compiled", "exception_type": None, "message": None}


def probe_case(kernel: str, variant: str, dtype: str) -> dict:
    """:func:`probe` of ``PROBE_CASES[kernel]``; ``variant`` is ``"gpu"`` or ``"cpu"``."""
    case = PROBE_CASES[kernel]
    return probe(case.factory, case.args, case.kwargs, dtype, cpu=_is_cpu(variant))


def _is_cpu(variant: str) -> bool:
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r}; allowed: {', '.join(VARIANTS)}")
    return variant == "cpu"


def load_pins() -> dict:
    with PINS_PATH.open(encoding="utf-8") as fh:
        return json.load(fh)


def pinned(kernel: str, variant: str, dtype: str, tilelang_version_: str | None = None) -> dict | None:
    """The pinned diagnostic of ``kernel`` x ``variant`` x ``dtype`` for the installed (or
    given) TileLang version, or None when that version (or that combination) is not pinned.

    A pin is ``{"outcome", "exception_type", "message", "match"}`` where ``match`` says how
    ``message`` is compared: ``"exact"``, ``"prefix"`` or ``"regex"`` (``re.search``).
    """
    ver = tilelang_version_ or tilelang_version()
    return load_pins().get("tilelang", {}).get(ver, {}).get(kernel, {}).get(variant, {}).get(dtype)


def matches_pin(result: dict, pin: dict) -> bool:
    """Whether a :func:`probe` result agrees with a pin (outcome, exception type, message)."""
    if result["outcome"] != pin["outcome"] or result["exception_type"] != pin.get("exception_type"):
        return False
    want, got, how = pin.get("message"), result["message"], pin.get("match", "exact")
    if want is None or got is None:
        return want == got
    if how == "exact":
        return got == want
    if how == "prefix":
        return got.startswith(want)
    if how == "regex":
        return re.search(want, got) is not None
    raise ValueError(f"unknown match mode {how!r} in a probe pin")


# A message that starts with one of these is pinned by the prefix alone: the rest is the
# compiler's command line, which names the local compiler and include directories.
_PREFIX_ONLY = ("Compilation Failed!",)


def observe(kernels=None) -> dict:
    """Probe every case (``gpu`` in both 16-bit dtypes, ``cpu`` in bf16) in this process."""
    return {
        kernel: {
            "gpu": {dt: probe_case(kernel, "gpu", dt) for dt in GPU_DTYPES},
            "cpu": {"bfloat16": probe_case(kernel, "cpu", "bfloat16")},
        }
        for kernel in (kernels or PROBE_CASES)
    }


def as_pin(result: dict) -> dict:
    """The pin of an observed result: its exact message, or a prefix (see ``_PREFIX_ONLY``)."""
    pin = dict(result, match="exact")
    for prefix in _PREFIX_ONLY:
        if (result["message"] or "").startswith(prefix):
            pin.update(message=prefix, match="prefix")
    return pin


def _main(argv: list[str]) -> int:
    """``python -m kernels.probe [--write] [KERNEL...]``: print the observations as JSON;
    ``--write`` also pins them for the installed TileLang version in ``probe_pins.json``."""
    write = "--write" in argv
    observed = observe([a for a in argv if a != "--write"] or None)
    json.dump({"tilelang": {tilelang_version(): observed}}, sys.stdout, indent=2)
    print()
    if write:
        pins = load_pins() if PINS_PATH.exists() else {}
        per_version = pins.setdefault("tilelang", {}).setdefault(tilelang_version(), {})
        for kernel, variants in observed.items():
            per_version[kernel] = {v: {dt: as_pin(r) for dt, r in dts.items()} for v, dts in variants.items()}
        PINS_PATH.write_text(json.dumps(pins, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
