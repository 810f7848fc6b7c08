"""``compile_cpu``: the scalar fp32 CPU specialisation of a kernel factory, with checked calls.

The C target trusts its caller: a wrong dtype, a strided view or a short tensor would be read
as raw memory.  :class:`CpuKernel` therefore validates every argument against the PrimFunc's
own signature (``buffer_map``: parameter names, dtypes and shapes, symbolic dimensions
included) before the call, so it works unchanged for any kernel of this package:

* not a ``torch.Tensor``                                   -> ``TypeError``
* not on the CPU, wrong dtype, or not contiguous           -> ``TypeError`` naming the argument
* wrong rank or extent, or a symbolic dimension (``M``...)
  that disagrees with the value bound by an earlier argument -> ``ValueError`` naming the
  argument with the expected and the actual shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import tilelang
import torch
from tvm import arith, tirx

from ._common import CPU_DTYPE, CPU_PASS_CONFIGS

__all__ = ["compile_cpu", "CpuKernel", "ParamSpec", "signature"]

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class ParamSpec:
    """One kernel parameter: a buffer (``shape`` is a tuple of ints and TIR expressions of
    symbolic variables) or, when ``shape`` is None, a scalar."""

    name: str
    dtype: str
    shape: tuple | None

    def shape_str(self) -> str:
        return "(" + ", ".join(str(d) for d in self.shape) + ("," if len(self.shape) == 1 else "") + ")"


def signature(prim_func) -> list[ParamSpec]:
    """The parameters of a PrimFunc, in call order."""
    specs = []
    for param in prim_func.params:
        buf = prim_func.buffer_map.get(param)
        if buf is None:
            specs.append(ParamSpec(param.name, str(param.dtype), None))
        else:
            shape = tuple(int(d) if isinstance(d, tirx.IntImm) else d for d in buf.shape)
            specs.append(ParamSpec(buf.name, str(buf.dtype), shape))
    return specs


def _torch_dtype(dtype: str) -> torch.dtype:
    return getattr(torch, dtype)


class CpuKernel:
    """A compiled CPU kernel (``JITKernel`` in :attr:`kernel`) whose calls are validated.

    Call it with the PrimFunc's parameters, positionally or by name.  Outputs are written in
    place; the call returns None.
    """

    def __init__(self, kernel, prim_func):
        self.kernel = kernel
        self.prim_func = prim_func
        self.name = (
            str(prim_func.attrs["global_symbol"])
            if prim_func.attrs and "global_symbol" in prim_func.attrs
            else "kernel"
        )
        self.params = signature(prim_func)

    @property
    def source(self) -> str:
        """The generated C source."""
        return self.kernel.get_kernel_source()

    def __repr__(self) -> str:
        args = ", ".join(f"{p.name}: {p.dtype}{p.shape_str() if p.shape is not None else ''}" for p in self.params)
        return f"<CpuKernel {self.name}({args})>"

    # -- validation -------------------------------------------------------------------------
    def _bind(self, args, kwargs) -> list:
        names = [p.name for p in self.params]
        if len(args) > len(names):
            raise TypeError(f"{self.name} takes {len(names)} arguments ({', '.join(names)}), got {len(args)}")
        bound = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in names:
                raise TypeError(f"{self.name} got an unexpected argument {key!r}; its arguments are {', '.join(names)}")
            if key in bound:
                raise TypeError(f"{self.name} got multiple values for argument {key!r}")
            bound[key] = value
        missing = [n for n in names if n not in bound]
        if missing:
            raise TypeError(
                f"{self.name} is missing argument(s) {', '.join(map(repr, missing))}; "
                f"its arguments are {', '.join(names)}"
            )
        return [bound[n] for n in names]

    def _check_scalar(self, spec: ParamSpec, value):
        want_int = spec.dtype.startswith(("int", "uint"))
        ok = isinstance(value, int) if want_int else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok:
            raise TypeError(
                f"argument {spec.name!r} of {self.name} must be a Python {'int' if want_int else 'float'} "
                f"({spec.dtype}), got {type(value).__name__}"
            )

    def _check_tensor(self, spec: ParamSpec, value) -> None:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"argument {spec.name!r} of {self.name} must be a torch.Tensor, got {type(value).__name__}")
        want = _torch_dtype(spec.dtype)
        if value.device.type != "cpu" or value.dtype != want or not value.is_contiguous():
            layout = "" if value.is_contiguous() else "non-contiguous "
            raise TypeError(
                f"argument {spec.name!r} of {self.name} must be a contiguous CPU {spec.dtype} tensor, "
                f"got {layout}{value.dtype} on {value.device}"
            )

    def _check_shapes(self, values) -> None:
        bindings: dict[str, tuple[int, str]] = {}  # symbol -> (value, argument that bound it)
        tensors = [(s, v) for s, v in zip(self.params, values) if s.shape is not None]

        def mismatch(spec, actual, detail=""):
            return ValueError(
                f"argument {spec.name!r} of {self.name} must have shape {spec.shape_str()}{detail}, got {tuple(actual)}"
            )

        # Pass 1: ranks, constant extents, and bare symbolic dims (bound by first use).
        for spec, t in tensors:
            if t.dim() != len(spec.shape):
                raise mismatch(spec, t.shape, f" (rank {len(spec.shape)})")
            for want, got in zip(spec.shape, t.shape):
                if isinstance(want, int):
                    if want != got:
                        raise mismatch(spec, t.shape)
                elif isinstance(want, tirx.Var):
                    seen = bindings.get(want.name)
                    if seen is None:
                        if got > _INT32_MAX:
                            raise mismatch(spec, t.shape, f" with {want.name} <= {_INT32_MAX}")
                        bindings[want.name] = (int(got), spec.name)
                    elif seen[0] != got:
                        raise mismatch(spec, t.shape, f" with {want.name}={seen[0]} (from argument {seen[1]!r})")
        # Pass 2: compound extents (e.g. 2*F or B*L) once every symbol has a value.
        analyzer = arith.Analyzer()
        for spec, t in tensors:
            for want, got in zip(spec.shape, t.shape):
                if isinstance(want, (int, tirx.Var)):
                    continue
                vmap = {}
                for var in _free_vars(want):
                    if var.name in bindings:
                        vmap[var] = tirx.IntImm(var.dtype, bindings[var.name][0])
                value = analyzer.simplify(tirx.stmt_functor.substitute(want, vmap))
                if isinstance(value, tirx.IntImm) and int(value) != got:
                    env = ", ".join(f"{k}={v[0]}" for k, v in bindings.items())
                    raise mismatch(spec, t.shape, f" with {env}" if env else "")

    def validate(self, *args, **kwargs) -> list:
        """Check the arguments (see the module docstring); returns them in call order."""
        values = self._bind(args, kwargs)
        for spec, value in zip(self.params, values):
            if spec.shape is None:
                self._check_scalar(spec, value)
            else:
                self._check_tensor(spec, value)
        self._check_shapes(values)
        return values

    def __call__(self, *args, **kwargs) -> None:
        self.kernel(*self.validate(*args, **kwargs))


def _free_vars(expr) -> list:
    found = []
    tirx.stmt_functor.post_order_visit(expr, lambda n: found.append(n) if isinstance(n, tirx.Var) else None)
    return found


def compile_cpu(factory, *args, **kwargs) -> CpuKernel:
    """Compile ``factory(*args, **kwargs)`` for TileLang's C target as scalar fp32 code.

    Takes the same shape, option and tile arguments as the factory and forces ``cpu=True``,
    ``dtype="float32"``, target ``"c"`` and vectorisation off (``CPU_PASS_CONFIGS``); passing
    another ``dtype`` or ``cpu=False`` is a ``ValueError``.  Keep the returned kernel: its
    symbolic dimensions (``M``...) let it serve every row count.
    """
    for key, forced in (("cpu", True), ("dtype", CPU_DTYPE)):
        if key in kwargs and kwargs[key] != forced:
            raise ValueError(
                f"compile_cpu builds the scalar fp32 specialisation; it cannot take {key}={kwargs[key]!r} "
                f"(it forces {key}={forced!r})"
            )
    kwargs = {**kwargs, "cpu": True, "dtype": CPU_DTYPE}
    prim_func = factory.get_tir(*args, **kwargs)
    kernel = tilelang.compile(prim_func, target="c", pass_configs=CPU_PASS_CONFIGS)
    return CpuKernel(kernel, prim_func)
