"""Stage ``export``: ``torch.export`` of the decision model in one dtype for one target.

A separate eval copy is converted to ``dtype`` outside autocast and exported with dynamic
rows ``Dim("rows")``, tokens ``16 * Dim("tokens16")`` (the attention alignment guard wants
16-token multiples) and marker slots ``Dim("slots")``, rows and tokens independent, all from
``export.dims``.  Outputs in ``out_dir``: ``exported.pt2`` (``torch.export.save``),
``eager.pt`` (that copy's outputs on every saved batch: the parity reference of the
package) and ``export.json``.  With ``export.single_slot`` the one-slot branch (slots fixed
at 1) is exported too, as ``exported_single_slot.pt2`` / ``eager_single_slot.pt``.  With
``export.native_linears.<target>`` naming layers, the project's native op library is compiled
into ``out_dir`` first (``liblaya_native.so``, :mod:`laya_build.native`) and loaded: the named
layers call its op, with the cuBLASLt algorithms of ``export.native_algorithms.<target>-<dtype>``;
with ``export.native_residual.<target>`` the residual adds after those calls move into them, in
the exported program (:func:`laya_build.model.native_linear.take_residuals`).  With
``export.native_geglu.<target>`` each encoder MLP's first GEMM and gated GELU call the library's
``geglu_linear`` (:mod:`laya_build.model.native_geglu`), for CUDA a CUTLASS kernel nvcc compiles
into the library; with ``export.native_cutlass.<target>`` the named native layers' calls at large
row counts run the library's CUTLASS stream-K GEMM; ``export.cutlass_configs`` says which launch
configuration at which row count, checked against the library.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from laya_build import PROJECT_ROOT
from laya_build.atomic import atomic_path, torch_save
from laya_build.environment import unsupported_reason, versions
from laya_build.errors import ConfigError, InputsMismatchError
from laya_build.layout import NATIVE_BUILD_LOG_NAME, NATIVE_LIBRARY_NAME, build_name, eager_name, exported_name
from laya_build.log import get_logger
from laya_build.records import file_entry, sha256_file
from laya_build.runtime.formats import EAGER_FORMAT, batch_args, run_batches
from laya_build.stages.common import skip
from laya_build.targets import check_target, torch_dtype

log = get_logger(__name__)


@dataclass(frozen=True)
class Program:
    name: str
    batches_key: str
    single_slot: bool
    exported: str
    eager: str


PROGRAMS = (
    Program("decision", "batches", False, exported_name(), eager_name()),
    Program(
        "decision_single_slot", "single_slot_batches", True, exported_name("_single_slot"), eager_name("_single_slot")
    ),
)


def dynamic_shapes(dims: dict, single_slot: bool) -> dict:
    from torch.export import Dim

    rows = Dim("rows", min=dims["rows"]["min"], max=dims["rows"]["max"])
    tokens = 16 * Dim("tokens16", min=dims["tokens16"]["min"], max=dims["tokens16"]["max"])
    per_slot = (
        {0: rows} if single_slot else {0: rows, 1: Dim("slots", min=dims["slots"]["min"], max=dims["slots"]["max"])}
    )
    return {
        "input_ids": {0: rows, 1: tokens},
        "attention_mask": {0: rows, 1: tokens},
        "marker_pos": per_slot,
        "marker_mask": dict(per_slot),
        "qtype": {0: rows},
    }


def range_constraints(ep) -> dict:
    def bound(v):
        try:
            return int(v)
        except (TypeError, ValueError, OverflowError):
            return None

    return {str(sym): [bound(r.lower), bound(r.upper)] for sym, r in ep.range_constraints.items()}


_TRACE_FILE = re.compile(r'File "([^"]+)"')


def import_relative(path: str, roots: list[str]) -> str:
    """``path`` relative to the import root it lies in (the longest of ``roots``), as Python
    names the module's file (``laya_build/model/decision.py``, ``torch/nn/modules/linear.py``);
    unchanged when it lies in none."""
    for root in roots:
        if path.startswith(root + os.sep):
            return path[len(root) + 1 :]
    return path


def portable_stack_traces(ep) -> None:
    """Name every source file in the stack traces ``torch.export`` keeps per node by its
    import-relative path instead of where this checkout and its environment happen to live,
    so that ``exported.pt2`` is the same bytes whichever folder built it."""
    roots = sorted({str(PROJECT_ROOT), *(os.path.abspath(p or os.curdir) for p in sys.path)}, key=len, reverse=True)
    rewrite = lambda m: f'File "{import_relative(m.group(1), roots)}"'
    for module in ep.graph_module.modules():
        graph = getattr(module, "graph", None)
        for node in graph.nodes if graph is not None else ():
            if trace := node.meta.get("stack_trace"):
                node.meta["stack_trace"] = _TRACE_FILE.sub(rewrite, trace)


def export_program(model, inputs: dict, program: Program, cfg: dict, device: str, out: Path, meta: dict) -> dict:
    import torch

    from laya_build.model.inputs import batch_shape

    batches = inputs[program.batches_key]
    index = 0 if program.single_slot else cfg["example_batch"]  # checked by check_export_layout
    example = batch_args(batches[index], inputs["arg_names"], device)
    start = time.perf_counter()
    with torch.inference_mode():
        ep = torch.export.export(model, example, dynamic_shapes=dynamic_shapes(cfg["dims"], program.single_slot))
    export_s = time.perf_counter() - start
    log.info(f"[laya] torch.export of {program.name} ({device}, {meta['dtype']}): {export_s:.1f} s")
    residual = moved_residuals(ep, cfg, device)
    norms = taken_norms(ep, cfg, device)
    portable_stack_traces(ep)
    with atomic_path(out / program.exported) as tmp, open(tmp, "wb") as fh:
        torch.export.save(ep, fh)  # a file object: the temp name does not end in .pt2

    start = time.perf_counter()
    outputs = run_batches(model, batches, inputs["arg_names"], device)
    eager_s = time.perf_counter() - start
    torch_save(
        {
            "format": EAGER_FORMAT,
            "program": program.name,
            "batches_key": program.batches_key,
            **meta,
            "outputs": outputs,
        },
        out / program.eager,
    )
    return {
        "name": program.name,
        "single_slot": program.single_slot,
        "batches_key": program.batches_key,
        "example_batch": index,
        "example_shape": batch_shape(batches[index]),
        "exported": file_entry(out / program.exported, out),
        "eager": file_entry(out / program.eager, out),
        "range_constraints": range_constraints(ep),
        **residual,
        **norms,
        "export_s": round(export_s, 4),
        "eager_s": round(eager_s, 4),
    }


def moved_residuals(ep, cfg: dict, target: str) -> dict:
    """With ``export.native_residual.<target>``, the residual adds moved into the native op's
    calls of ``ep`` as the program record's ``residual_adds``; a program that has none to move
    is refused (the setting would change nothing)."""
    if not cfg["native_residual"].get(target):
        return {}
    from laya_build.model.native_linear import take_residuals

    moved = take_residuals(ep)
    if moved == 0:
        raise ConfigError(
            f"export.native_residual.{target} is true and no residual add follows a call of the native op",
            hint=f"name the layers that end a branch (attn.Wo, mlp.Wo) in export.native_linears.{target}, "
            f"or set export.native_residual.{target} to false",
        )
    return {"residual_adds": moved}


def by_size(setting) -> tuple[int, str]:
    """A per-target setting that is true (at every size) or a least number of positions
    (``export.add_norms``, ``export.native_geglu``): that least (0: every size) and the setting as
    the configuration writes it."""
    return (0 if setting is True else int(setting or 0)), ("true" if setting is True else str(setting))


def padding_skipped(cfg: dict, target: str) -> bool:
    """``export.skip_padding.<target>``, refused where the export has no op to tell (the native
    GeGLU op) or no counts to tell it (the fused attention makes them)."""
    if not cfg["skip_padding"].get(target):
        return False
    if not cfg["native_geglu"].get(target):
        raise ConfigError(
            f"export.skip_padding.{target} is true and export.native_geglu.{target} is off: the padding is skipped "
            "by the native GeGLU op",
            hint=f"set export.native_geglu.{target} to true, or export.skip_padding.{target} to false",
        )
    if cfg["attention"][target] != "fused":
        raise ConfigError(
            f"export.skip_padding.{target} is true and export.attention.{target} is {cfg['attention'][target]}: the "
            "rows' counts of real positions are made once a forward by the fused attention",
            hint=f"set export.attention.{target} to fused, or export.skip_padding.{target} to false",
        )
    return True


def taken_norms(ep, cfg: dict, target: str) -> dict:
    """With ``export.add_norms.<target>``, the layer norms of residual adds in ``ep`` replaced by
    ``laya::add_norm`` calls, counted as the program record's ``add_norms``; a program with none
    is refused (the setting would change nothing)."""
    setting = cfg["add_norms"].get(target)
    if not setting:
        return {}
    from laya_build.model.add_norm import take_norms

    least, shown = by_size(setting)
    taken = take_norms(ep, min_rows=least)
    if taken == 0:
        moved = cfg["native_residual"].get(target)  # its adds are inside the native op by now
        raise ConfigError(
            f"export.add_norms.{target} is {shown} and no layer norm in the exported program reads an add"
            + (f" of {least} positions or more" if least else ""),
            hint=f"export.native_residual.{target} moves the residual adds into the native op: set one of the two "
            "to false"
            if moved
            else f"set export.add_norms.{target} to false for this model",
        )
    return {"add_norms": taken}


def native_algorithms(cfg: dict, target: str, dtype: str, root) -> tuple[list[dict], dict | None]:
    """The entries of the algorithms file ``export.native_algorithms.<target>-<dtype>`` names
    (relative to ``root``, the project root) and how the record describes it; ``([], None)``
    without one."""
    from laya_build.model.native_linear import read_algorithms

    name = build_name(target, dtype)
    rel = (cfg.get("native_algorithms") or {}).get(name)
    if rel is None:
        return [], None
    key = f"export.native_algorithms.{name}"
    if not cfg["native_linears"].get(target):
        raise ConfigError(f"{key} names {rel}, and export.native_linears.{target} names no layer to run with it")
    path = Path(root) / rel
    entries = read_algorithms(path, key)
    return entries, {**file_entry(path), "path": rel, "entries": len(entries)}


def cutlass_configs(cfg: dict, ops: list[str], cuda_kernels: bool) -> dict | None:
    """``export.cutlass_configs`` of the ``ops`` (geglu, linear) this export calls, checked: groups
    of two, and, where the library holds the CUDA kernels (loaded), configurations it has
    (``laya_native::cutlass_configs``); how the record describes them (None: no op)."""
    if not ops:
        return None
    import torch

    described: dict = {"names": {}}
    for op in ops:
        groups = list(cfg["cutlass_configs"][op])
        key = f"export.cutlass_configs.{op}"
        if len(groups) % 2:
            raise ConfigError(f"{key} holds {len(groups)} integers, not [m_max, configuration] groups")
        chosen = groups[1::2]
        if op == "geglu" and min(chosen) < 0:
            raise ConfigError(f"{key} names configuration -1, cuBLASLt, which the gated GELU kernel has no path to")
        if cuda_kernels:
            names = list(torch.ops.laya_native.cutlass_configs(op))
            unknown = [c for c in chosen if c >= len(names)]
            if unknown:
                raise ConfigError(
                    f"{key} names configuration {unknown[0]}, and the library holds {len(names)} for {op} (0-"
                    f"{len(names) - 1})",
                    hint=f"laya_native::cutlass_configs({op!r}) names them: " + "; ".join(names),
                )
            described["names"].update({f"{op} {c}": names[c] for c in chosen if c >= 0})
        described[op] = groups
    return described


def native_library(out: Path, *, cuda_kernels: bool = False) -> dict:
    """Build the project's native op library (with its CUDA kernels: ``cuda_kernels``) into
    ``out`` and load it into this process."""
    from laya_build import native
    from laya_build.runtime.serving import load_library

    record = native.build(out, cuda_kernels=cuda_kernels)
    load_library(out / record["path"], record["sha256"], what="export")
    return record


def run_export(
    export_cfg: dict,
    checkpoint_dir,
    inputs_path,
    out_dir,
    target: str,
    dtype: str,
    *,
    root=".",
    fresh_process: bool = False,
) -> dict:
    """Export (or skip, with the reason) ``target`` x ``dtype``.  A CUDA export that can run
    initialises CUDA, which a process forked from one that imported torch must not do: unless
    ``fresh_process`` says this already is a fresh interpreter, it runs in one
    (:func:`laya_build.runner.run`) and this process only decides whether to skip."""
    from laya_build.model.batches import BATCH_KEYS, DimsError, check_export_layout
    from laya_build.model.checkpoint import WEIGHTS, load_checkpoint
    from laya_build.model.decision import eval_copy
    from laya_build.model.inputs import batch_shape, load_inputs

    start = time.perf_counter()
    cfg = export_cfg
    check_target(target)
    torch_dtype(dtype)
    if dtype not in cfg["targets"].get(target, []):
        raise ConfigError(f"export.targets.{target} does not list {dtype}")
    out = Path(out_dir)
    if reason := unsupported_reason(target):
        return skip("export", reason, target=target, dtype=dtype)
    if target == "cuda" and not fresh_process:
        from laya_build.runner import Child, run

        spec = {
            "export_cfg": export_cfg,
            "checkpoint_dir": str(checkpoint_dir),
            "inputs_path": str(inputs_path),
            "out_dir": str(out_dir),
            "target": target,
            "dtype": dtype,
            "root": str(root),
            "fresh_process": True,
        }
        return run(
            "laya_build.stages.export:run_export",
            spec,
            Child(label=f"torch.export ({target}, {dtype})", reraise=True),
            result=True,
        )

    inputs = load_inputs(inputs_path)
    try:  # the rules pipeline.yaml was checked against at load, now on the saved tensors
        check_export_layout({key: [batch_shape(b) for b in inputs[key]] for key in BATCH_KEYS}, cfg)
    except DimsError as exc:
        raise InputsMismatchError(f"{inputs_path}: {exc.detail}") from None
    programs = [p for p in PROGRAMS if cfg["single_slot"] or not p.single_slot]

    from laya_build.model import (
        attention,
        fused_linear,
        head,
        linear_bias,
        native_geglu,
        native_linear,
        padded_linear,
        rotary,
    )

    model, _, _ = load_checkpoint(checkpoint_dir)
    model = eval_copy(model, torch_dtype(dtype), target)
    zero_bias = list(cfg["zero_bias"].get(target, []))
    fused_linears = list(cfg["fused_linears"].get(target, []))
    padded_linears = list(cfg["padded_linears"].get(target, []))
    relu_epilogue = bool(cfg["relu_epilogue"].get(target))
    native_linears = list(cfg["native_linears"].get(target, []))
    geglu_setting = cfg["native_geglu"].get(target) or False
    geglu = bool(geglu_setting)
    geglu_least, geglu_shown = by_size(geglu_setting)
    if geglu and "mlp.Wi" in native_linears:
        raise ConfigError(
            f"export.native_geglu.{target} is {geglu_shown} and export.native_linears.{target} names mlp.Wi: the MLP's "
            "first GEMM runs in one op or the other",
            hint=f"drop mlp.Wi from export.native_linears.{target}, or set export.native_geglu.{target} to false",
        )
    skip_padding = padding_skipped(cfg, target)
    cutlass = list(cfg["native_cutlass"].get(target, []))
    algorithms, algorithms_in = native_algorithms(cfg, target, dtype, root)
    try:  # before the library's compile
        native_linear.check(model, native_linears)
        native_linear.check_cutlass(model, native_linears, cutlass, target, zero_bias)
        if geglu:
            native_geglu.check(model, target)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    out.mkdir(parents=True, exist_ok=True)
    wants_library = bool(native_linears) or geglu
    cuda_kernels = target == "cuda" and (geglu or bool(cutlass))
    ops = [op for op, used in (("geglu", geglu), ("linear", bool(cutlass))) if used]
    cutlass_configs(cfg, ops, cuda_kernels=False)  # their form, before the library's compile
    library = native_library(out, cuda_kernels=cuda_kernels) if wants_library else None
    configs = cutlass_configs(cfg, ops, cuda_kernels)
    if library is None:  # a library an earlier export left here belongs to no program of this one
        for name in (NATIVE_LIBRARY_NAME, NATIVE_BUILD_LOG_NAME):
            (out / name).unlink(missing_ok=True)
    try:
        attention.use(model, cfg["attention"][target])
        head_attention = head.use(model, cfg["attention"][target], cfg["last_head_layer"], relu_epilogue)
        rotary.use(model, cfg["rotary"], halves=cfg["attention"][target] == "fused")
        linear_bias.use(model, zero_bias)
        named = native_linear.use(model, native_linears, algorithms, cutlass, cfg["cutlass_configs"]["linear"])
        if geglu:
            native_geglu.use(model, cfg["cutlass_configs"]["geglu"], geglu_least, skip_padding=skip_padding)
        padded_linear.use(model, padded_linears, fused=fused_linears)
        fused_linear.use(model, fused_linears)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if algorithms_in is not None:
        algorithms_in["layers"] = named
    meta = {"target": target, "dtype": dtype, "inputs_sha256": sha256_file(inputs_path)}
    records = [export_program(model, inputs, p, cfg, target, out, meta) for p in programs]
    dims = cfg["dims"]
    return {
        "stage": "export",
        "status": "ok",
        "target": target,
        "dtype": dtype,
        "dims": {**dims, "tokens": {"min": 16 * dims["tokens16"]["min"], "max": 16 * dims["tokens16"]["max"]}},
        "single_slot": cfg["single_slot"],
        "rotary": cfg["rotary"],
        "attention": cfg["attention"][target],
        "zero_bias": zero_bias,
        "fused_linears": fused_linears,
        "padded_linears": padded_linears,
        "native_linears": native_linears,
        "native_residual": bool(cfg["native_residual"].get(target)),
        "add_norms": cfg["add_norms"].get(target) or False,
        "native_cutlass": cutlass,
        **({"cutlass_configs": configs} if configs else {}),
        "native_geglu": geglu_setting,
        "skip_padding": skip_padding,
        "relu_epilogue": relu_epilogue,
        "native_library": library,
        "native_algorithms": algorithms_in,
        "last_head_layer": cfg["last_head_layer"],
        "head_attention": head_attention,
        "inputs": {"sha256": meta["inputs_sha256"], "bytes": Path(inputs_path).stat().st_size},
        "checkpoint": {"weights_sha256": sha256_file(Path(checkpoint_dir) / WEIGHTS)},
        "programs": records,
        "versions": versions(),
        "elapsed_s": round(time.perf_counter() - start, 4),
    }
