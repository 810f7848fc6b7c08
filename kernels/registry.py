"""What is known about each kernel factory, in one place, without importing TileLang or torch.

One :class:`Kernel` per ``@tilelang.jit`` factory of this package: the module that defines
it, the runtime sizes its numerical check (``cpu_checks.shapes``) needs, and the argument
rules the factory enforces.  The rules are plain Python: every factory calls
:func:`check_args` first thing, and ``laya_build.config`` runs the same rules on a
``pipeline.yaml`` variant when the configuration is loaded, so a bad argument is refused
with its key path before any task runs, by the same code that would refuse it at ``tir``.

A factory's parameters and defaults are written once, in its own ``def``:
:attr:`Kernel.params` reads them from the source (``ast``, not an import) and
:meth:`Kernel.bind` fills the defaults, so no caller restates them.

A rule violation is a plain ``ValueError`` (the probe records the exception type) whose
``param`` attribute names the offending parameter, or ``None``.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "ACTIVATIONS",
    "CPU_DTYPE",
    "GPU_DTYPES",
    "KERNELS",
    "STAGE_PARAMS",
    "Kernel",
    "Param",
    "check_args",
    "check_dtype",
    "check_choice",
    "check_positive",
    "jit_factories",
]

KERNELS_DIR = Path(__file__).resolve().parent

GPU_DTYPES = ("bfloat16", "float16")
CPU_DTYPE = "float32"
ACTIVATIONS = ("none", "gelu", "relu")  # the GEMM epilogues (kernels/reference.py implements them too)
# Parameters that a stage chooses (the specialisation), never a pipeline.yaml variant.
STAGE_PARAMS = ("dtype", "cpu")


def _error(param: str | None, message: str) -> ValueError:
    exc = ValueError(message)
    exc.param = param
    return exc


# ------------------------------------------------------------------------------------- rules


def check_dtype(dtype: str, cpu: bool) -> str:
    """Validate a kernel's storage dtype.

    The GPU path takes bf16/fp16 only.  ``cpu=True`` builds TIR for any float dtype so the
    probe can show what the C target rejects; :func:`kernels.compile_cpu` forces fp32.
    """
    if cpu:
        if dtype not in (CPU_DTYPE, *GPU_DTYPES):
            raise _error(
                "dtype",
                f"dtype={dtype!r} is not supported with cpu=True; allowed: float32 (compile_cpu), bfloat16, float16",
            )
        return dtype
    if dtype not in GPU_DTYPES:
        raise _error(
            "dtype",
            f"dtype={dtype!r} is not supported on the GPU path; allowed dtypes: {', '.join(GPU_DTYPES)} "
            f"(fp32 runs only on the CPU specialisation: compile_cpu(...) or cpu=True)",
        )
    return dtype


def check_choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise _error(name, f"{name}={value!r} is not supported; allowed: {', '.join(map(str, allowed))}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_positive(**dims) -> None:
    """Compile-time shape arguments must be positive Python ints."""
    for name, value in dims.items():
        if not _is_int(value) or value <= 0:
            raise _error(name, f"{name} must be a positive int, got {value!r}")


def check_positive_or_none(**dims) -> None:
    """Sizes that may also be ``None``: a runtime dimension (``T.dynamic``)."""
    check_positive(**{name: value for name, value in dims.items() if value is not None})


def check_non_negative(**values) -> None:
    for name, value in values.items():
        if not _is_int(value) or value < 0:
            raise _error(name, f"{name} must be an int >= 0, got {value!r}")


def check_flag(**values) -> None:
    for name, value in values.items():
        if not isinstance(value, bool):
            raise _error(name, f"{name} must be true or false, got {value!r}")


def _gemm_rules(a: dict) -> None:
    check_choice("act", a["act"], ACTIVATIONS)
    check_positive(
        N=a["N"], K=a["K"], block_M=a["block_M"], block_N=a["block_N"], block_K=a["block_K"], threads=a["threads"]
    )
    check_non_negative(num_stages=a["num_stages"])
    check_flag(bias=a["bias"])


def _geglu_rules(a: dict) -> None:
    check_positive(
        F=a["F"], K=a["K"], block_M=a["block_M"], block_N=a["block_N"], block_K=a["block_K"], threads=a["threads"]
    )
    check_non_negative(num_stages=a["num_stages"])


def _add_ln_rules(a: dict) -> None:
    check_positive(D=a["D"], block_M=a["block_M"], threads=a["threads"])
    eps = a["eps"]
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0:
        raise _error("eps", f"eps must be positive, got {eps!r}")
    check_flag(residual=a["residual"], bias=a["bias"])


def _rope_rules(a: dict) -> None:
    check_positive(H=a["H"], Dh=a["Dh"], block_M=a["block_M"], threads=a["threads"])
    if a["Dh"] % 2:
        raise _error("Dh", f"Dh must be even for rotate-half RoPE, got {a['Dh']}")


def _attn_rules(a: dict) -> None:
    window = a["window"]
    if not _is_int(window) or window < 0:
        raise _error("window", f"window must be >= 0 (0 = full attention), got {window!r}")
    check_positive_or_none(B=a["B"], L=a["L"])
    check_positive(H=a["H"], Dh=a["Dh"], block_M=a["block_M"], block_N=a["block_N"], threads=a["threads"])
    check_non_negative(num_stages=a["num_stages"])


def _attn_shape_rules(a: dict, shape: dict) -> None:
    if "lens" in shape:
        batch = shape.get("B", a["B"])
        if len(shape["lens"]) != batch:
            raise _error("lens", f"{len(shape['lens'])} lengths for B={batch}")


# ---------------------------------------------------------------------------------- registry

REQUIRED = object()  # the default of a parameter that has none


@dataclass(frozen=True)
class Param:
    name: str
    default: object = REQUIRED
    keyword_only: bool = False

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True)
class Kernel:
    """One kernel factory: ``kernels/<module>.py``'s ``<factory>``."""

    factory: str
    module: str
    rules: Callable[[dict], None]
    # Runtime sizes of the numerical check: check-shape key -> the parameter that fixes it at
    # compile time (None: always a runtime symbol, e.g. M).
    check_sizes: dict[str, str | None]
    check_extra: tuple[str, ...] = ()  # other keys a check shape may give
    shape_rules: Callable[[dict, dict], None] = field(default=lambda a, shape: None)

    @property
    def path(self) -> Path:
        return KERNELS_DIR / f"{self.module}.py"

    @property
    def params(self) -> tuple[Param, ...]:
        return _signature(self.path, self.factory)

    @property
    def config_params(self) -> tuple[Param, ...]:
        """The parameters a variant of ``pipeline.yaml`` may give (not the stage's dtype/cpu)."""
        return tuple(p for p in self.params if p.name not in STAGE_PARAMS)

    @property
    def positional(self) -> tuple[str, ...]:
        """The variant parameters that ``args`` fills, in order."""
        return tuple(p.name for p in self.config_params if not p.keyword_only)

    def bind(self, args=(), kwargs=None, **stage) -> dict:
        """Every argument of a call ``factory(*args, **kwargs, **stage)``, defaults filled in.

        ``args``/``kwargs`` are a variant's (shape, option and tile arguments); ``stage`` the
        specialisation (``dtype``, ``cpu``).  Refuses, as Python would, too many positional
        arguments, unknown or repeated names and missing required ones; ``param`` names the
        parameter (None for too many positional arguments).
        """
        kwargs = dict(kwargs or {})
        names = [p.name for p in self.params]
        if len(args) > len(self.positional):
            raise _error(
                None,
                f"{self.factory} takes at most {len(self.positional)} positional arguments "
                f"({', '.join(self.positional)}), got {len(args)}",
            )
        bound = dict(zip(self.positional, args))
        for key, value in {**kwargs, **stage}.items():
            if key not in names:
                raise _error(key, f"{self.factory} has no parameter {key!r}; parameters: {', '.join(sorted(names))}")
            if key in bound:
                raise _error(key, f"{key!r} is already given in args")
            bound[key] = value
        missing = [p.name for p in self.params if p.required and p.name not in bound]
        if missing:
            raise _error(
                missing[0],
                f"{self.factory} needs {', '.join(missing)} (required: "
                f"{', '.join(p.name for p in self.params if p.required)})",
            )
        return {p.name: bound.get(p.name, p.default) for p in self.params}

    def check(self, bound: dict) -> None:
        """The factory's argument rules on a full set of arguments (:meth:`bind`)."""
        check_dtype(bound["dtype"], bound["cpu"])
        self.rules(bound)

    def runtime_sizes(self, bound: dict) -> list[str]:
        """The check-shape keys a numerical check of this call must give."""
        return sorted(k for k, param in self.check_sizes.items() if param is None or bound[param] is None)

    def check_shape(self, bound: dict, shape: dict) -> None:
        """A ``cpu_checks.shapes`` entry for the call ``bound``; ``param`` names the key."""
        runtime = self.runtime_sizes(bound)
        missing = [k for k in runtime if k not in shape]
        if missing:
            raise _error(None, f"{self.factory} checks need {', '.join(missing)}")
        for key, value in shape.items():
            if key in runtime or key in self.check_extra:
                continue
            if key in self.check_sizes:  # fixed by the arguments: a check cannot change it
                fixed = bound[self.check_sizes[key]]
                if value != fixed:
                    raise _error(key, f"{key} is fixed at {fixed} by the variant's arguments, got {value}")
                continue
            raise _error(
                key,
                f"{self.factory} checks take {', '.join([*runtime, *self.check_extra]) or 'no sizes'}; "
                f"{key!r} is not one of them",
            )
        self.shape_rules(bound, shape)


KERNELS: dict[str, Kernel] = {
    k.factory: k
    for k in (
        Kernel("gemm_kernel", "gemm", _gemm_rules, {"M": None}),
        Kernel("gemm_geglu_kernel", "geglu", _geglu_rules, {"M": None}),
        Kernel("add_ln_kernel", "add_ln", _add_ln_rules, {"M": None}),
        Kernel("rope_kernel", "rope", _rope_rules, {"M": None, "L": None}),
        Kernel("attn_kernel", "attention", _attn_rules, {"B": "B", "L": "L"}, ("lens",), _attn_shape_rules),
    )
}


def check_args(factory: str, **arguments) -> None:
    """Called by every factory with all of its arguments: run its rules (``ValueError``)."""
    kernel = KERNELS[factory]
    names = [p.name for p in kernel.params]
    if sorted(arguments) != sorted(names):
        raise TypeError(
            f"{factory} must pass all of its parameters ({', '.join(names)}) to check_args, got {', '.join(arguments)}"
        )
    kernel.check(arguments)


# ------------------------------------------------------------------------- reading the sources


class RegistryError(RuntimeError):
    """The registry and the kernel sources disagree (a programming error, not a config one)."""


@functools.cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _is_jit(node: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in node.decorator_list)


def jit_factories(kernels_dir: Path = KERNELS_DIR) -> dict[str, str]:
    """``{factory: module}`` of every ``@tilelang.jit`` ``*_kernel`` function in ``kernels_dir``
    (parsed, not imported): what :data:`KERNELS` must list."""
    found = {}
    for path in sorted(kernels_dir.glob("*.py")):
        if path.name.startswith("_"):
            continue
        for node in _parse(path).body:
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel") and _is_jit(node):
                found[node.name] = path.stem
    return found


def _static_value(node: ast.AST, module: ast.Module, where: str):
    """The value of a default written as a literal, a module-level constant, ``dict(k=literal)``
    or a subscript of one (``TILE_DEFAULTS["block_M"]``)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    if isinstance(node, ast.Name):
        for stmt in module.body:
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id for t in stmt.targets):
                return _static_value(stmt.value, module, where)
    elif isinstance(node, ast.Subscript):
        return _static_value(node.value, module, where)[_static_value(node.slice, module, where)]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
        return {kw.arg: _static_value(kw.value, module, where) for kw in node.keywords}
    raise RegistryError(f"{where}: default {ast.unparse(node)!r} is not a static value the registry can read")


@functools.cache
def _signature(path: Path, factory: str) -> tuple[Param, ...]:
    module = _parse(path)
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == factory:
            break
    else:
        raise RegistryError(f"{path} defines no function {factory}")
    a, where = node.args, f"{path.name}:{factory}"
    if a.posonlyargs or a.vararg or a.kwarg:
        raise RegistryError(f"{where}: positional-only, *args and **kwargs parameters are not supported")
    positional = a.args
    defaults = [REQUIRED] * (len(positional) - len(a.defaults)) + [_static_value(d, module, where) for d in a.defaults]
    params = [Param(arg.arg, default) for arg, default in zip(positional, defaults)]
    params += [
        Param(arg.arg, REQUIRED if d is None else _static_value(d, module, where), keyword_only=True)
        for arg, d in zip(a.kwonlyargs, a.kw_defaults)
    ]
    return tuple(params)
