"""The verify stage's child process: load a ``.pt2`` package and check it against ``eager.pt``.

Run by :func:`laya_build.runner.run` (``verify(job)``) in a fresh interpreter.  It imports
only ``torch``, the standard library and laya-build's runtime layer (:mod:`laya_build.runtime`:
serving, buckets, formats, parity, timing; :mod:`laya_build.errors` and :mod:`laya_build.layout`; all
torch + stdlib, and the process runner itself): no transformers, no laya_build model code, no
checkpoint.  The result records which of those modules were present at the end, to prove it.

Order of work:

1. ``AOTI_RUNTIME_CHECK_INPUTS=1`` before torch is imported; ``faulthandler`` on.
2. The inputs' hash and every eager file's metadata (program, target, dtype, inputs hash)
   and shapes must match the package.
3. Preload: import the configured modules when installed
   (:func:`laya_build.runtime.preload_modules`), and what the loader needs: the loader is the
   one the runtime serves with (:func:`laya_build.runtime.serving.fastest_loader`: torch's
   C++ package loader where torch has it, which imports no Inductor; else
   ``aoti_load_package``, with Inductor's loader modules).
4. Mask ``torch.compile``, ``torch.export.export``, ``torch._inductor.aoti_compile_and_package``,
   ``torch._export.aot_compile`` and Inductor's C++ builder (``CppBuilder.build``) with
   functions that raise: the process cannot compile anything.  A module not imported yet is
   masked the moment it is imported (:class:`MaskOnImport`), so the check costs no import.
5. Load each package with :func:`laya_build.runtime.load_package`: its sha256 must equal
   its record's BEFORE it is loaded (a ``.pt2`` runs native code); the CPU's vector features
   are checked against the ISA the package records (with ``aoti_load_package``, its ISA
   question is answered from the package: no probe compiles); single-threaded, as the
   runtime serves it.  What appeared in the (empty, temporary) Inductor cache during the
   load is listed.
6. The decision program also goes behind :class:`laya_build.runtime.DecisionRunner` with
   the configured buckets (CUDA graphs on CUDA, padded plain calls on the CPU); its first
   call on batch 0 is the process's first answer.  ``fresh_load`` breaks the time to it
   down: imports, sha256, ISA answer, load, graph capture, first call.
7. Run every saved batch through the package and (decision program) the runner; per head
   and row record the max |logit delta|, max |probability delta| (the calibrated
   probabilities upstream Laya publishes: ``decision_probabilities`` with the checkpoint's
   temperatures saved in the inputs) and both argmaxes; on
   CUDA the largest difference between each graph replay and the plain package call on
   the same padded inputs; time the package's calls.

Errors are raised as their own classes (:class:`PackageIntegrityError`,
:class:`PackageIsaError`, :class:`InputsMismatchError`, :class:`VerificationError`), which
the runner raises again in the parent.  A native crash kills the process by a signal, which
the parent reports as a failure naming the signal.  For tests
only, ``LAYA_VERIFY_CHILD_CRASH=SIGSEGV`` (any signal name) makes the process kill itself
with that signal just before loading, to simulate the GPU image's crash on any machine.
"""

from __future__ import annotations

import os
import time

STARTED = time.perf_counter()
os.environ["AOTI_RUNTIME_CHECK_INPUTS"] = "1"

import faulthandler  # noqa: E402
import importlib.abc  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

import torch  # noqa: E402

from laya_build.errors import (  # noqa: E402
    InputsMismatchError,
    NativeLibraryError,
    PackageIntegrityError,
    PackageIsaError,
    VerificationError,
)
from laya_build.runtime import serving as runtime  # noqa: E402
from laya_build.runtime.formats import (  # noqa: E402
    EAGER_FORMAT,
    HEADS,
    INPUTS_FORMAT,
    batch_args,
    list_tree,
    load_weights_only,
    outputs_dict,
)
from laya_build.runtime.parity import compare_heads, summarize  # noqa: E402
from laya_build.runtime.serving import preload_modules, sha256_file  # noqa: E402
from laya_build.runtime.timing import synchronize, time_calls  # noqa: E402

IMPORTED = time.perf_counter()
CRASH_ENV = "LAYA_VERIFY_CHILD_CRASH"
# The runtime layer of laya_build (torch + stdlib); any other laya_build module, or
# transformers, in this process would mean it ran more than the package.
RUNTIME_PACKAGES = ("laya_build.runtime", "laya_build.runner")  # with their modules
RUNTIME_MODULES = {
    "laya_build",
    "laya_build.errors",
    "laya_build.layout",
    "laya_build.stages",
    "laya_build.stages.children",
    "laya_build.stages.children.verify",
}


def check_inputs(job: dict, inputs: dict, eagers: list[dict]) -> None:
    actual = sha256_file(job["inputs"])
    if actual != job["inputs_sha256"]:
        raise InputsMismatchError(
            f"{job['inputs']}: sha256 {actual} is not that of the "
            f"inputs the package was exported with ({job['inputs_sha256']})"
        )
    for p, eager in zip(job["programs"], eagers):
        expected = {
            "program": p["name"],
            "target": job["target"],
            "dtype": job["dtype"],
            "inputs_sha256": job["inputs_sha256"],
            "batches_key": p["batches_key"],
        }
        for field, want in expected.items():
            if eager.get(field) != want:
                raise InputsMismatchError(
                    f"{p['eager']}: {field} is {eager.get(field)!r} but the package {p['package']} needs {want!r}"
                )
        batches = inputs[p["batches_key"]]
        if len(eager["outputs"]) != len(batches):
            raise InputsMismatchError(
                f"{p['eager']}: {len(eager['outputs'])} batches of outputs for {len(batches)} saved batches"
            )
        for b, (batch, out) in enumerate(zip(batches, eager["outputs"])):
            rows, slots = batch["marker_pos"].shape
            if tuple(out["decision"].shape) != (rows, slots) or out["act"].shape[0] != rows:
                raise InputsMismatchError(
                    f"{p['eager']}: batch {b} outputs have decision {tuple(out['decision'].shape)} / "
                    f"act {tuple(out['act'].shape)} for a batch of {rows} rows x {slots} slots"
                )


def forbidden_modules() -> list[str]:
    return sorted(
        m
        for m in sys.modules
        if m.split(".")[0] == "transformers"
        or (
            m.split(".")[0] == "laya_build"
            and m not in RUNTIME_MODULES
            and not any(m == p or m.startswith(p + ".") for p in RUNTIME_PACKAGES)
        )
    )


def _blocked(name: str):
    def blocked(*args, **kwargs):
        raise RuntimeError(
            f"{name} is disabled in the verification process: it may only load the package, never compile or export"
        )

    return blocked


# (module, attribute path in it): every entry point that compiles or exports
COMPILERS = (
    ("torch", "compile"),
    ("torch.export", "export"),
    ("torch._inductor", "aoti_compile_and_package"),
    ("torch._export", "aot_compile"),
    ("torch._inductor.cpp_builder", "CppBuilder.build"),
)


def _mask(module, attr_path: str) -> None:
    *owners, attr = attr_path.split(".")
    owner = module
    for name in owners:
        owner = getattr(owner, name)
    setattr(owner, attr, _blocked(f"{module.__name__}.{attr_path}"))


class _MaskingLoader(importlib.abc.Loader):
    """A module's own loader, and the masks run right after it has executed the module."""

    def __init__(self, loader, finder: MaskOnImport, name: str):
        self._loader, self._finder, self._name = loader, finder, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._finder.executed(self._name, module)

    def __getattr__(self, attr):  # get_source, get_resource_reader...: the module's own loader's
        return getattr(self._loader, attr)


class MaskOnImport(importlib.abc.MetaPathFinder):
    """Masks the entry points of a module the moment it is imported: the finder asks the
    finders after it for the module's spec and gives it a loader that runs the masks right
    after the module's own loader has executed it, before any importer sees it.  A module
    counts as masked only once that has happened (a spec looked up and never loaded, or an
    import that failed half-way, leaves it pending); the finder leaves ``sys.meta_path`` when
    nothing is pending."""

    def __init__(self, pending: dict[str, list[str]]):
        self.pending = pending
        self._lock = threading.Lock()

    def find_spec(self, name, path, target=None):
        if name not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            raise ImportError(f"{name} cannot be imported in the verification process: its compilers cannot be masked")
        spec.loader = _MaskingLoader(spec.loader, self, name)
        return spec

    def executed(self, name: str, module) -> None:
        with self._lock:
            for attr in self.pending.pop(name, ()):
                _mask(module, attr)
            if not self.pending and self in sys.meta_path:
                sys.meta_path.remove(self)


def mask_compilers() -> list[str]:
    """Mask every entry point of :data:`COMPILERS`: now where its module is imported, else
    as it is imported.  Returns their names."""
    pending: dict[str, list[str]] = {}
    for module, attr in COMPILERS:
        if module in sys.modules:
            _mask(sys.modules[module], attr)
        else:
            pending.setdefault(module, []).append(attr)
    if pending:
        sys.meta_path.insert(0, MaskOnImport(pending))
    return [f"{module}.{attr}" for module, attr in COMPILERS]


def simulate_crash() -> None:
    name = os.environ.get(CRASH_ENV)
    if name:
        faulthandler.disable()  # a simulated crash needs no traceback dump
        os.kill(os.getpid(), getattr(signal, name))


def load(p: dict, loader: str):
    try:
        return runtime.load_package(
            p["package"], p["sha256"], what="package record", single_threaded=True, loader=loader, library=p["library"]
        )
    except (PackageIntegrityError, PackageIsaError, NativeLibraryError):
        raise
    except Exception as exc:
        raise VerificationError(f"{p['package']}: loading it ({loader}) failed: {type(exc).__name__}: {exc}") from exc


def call(fn, args, what: str):
    try:
        with torch.inference_mode():
            return outputs_dict(fn(*args))
    except Exception as exc:
        raise VerificationError(f"{what} failed: {type(exc).__name__}: {exc}") from exc


def max_abs(a: dict, b: dict) -> dict:
    return {h: float((a[h].float() - b[h].float()).abs().max()) for h in HEADS}


def run_runner(p: dict, package, job: dict, batches: list, refs: list, calibration: dict | None) -> tuple[dict, dict]:
    """The decision program behind the runtime's runner: first answer, then every batch
    against eager (and, with CUDA graphs, against the plain call on the same padded inputs)."""
    start = time.perf_counter()
    try:
        runner = runtime.DecisionRunner(
            package, dims=job["dims"], buckets=job["buckets"], capture_warmup=job["capture_warmup"]
        )
    except Exception as exc:
        raise VerificationError(
            f"{p['package']}: the runner could not be set up "
            f"({len(job['buckets'])} buckets): {type(exc).__name__}: {exc}"
        ) from exc
    setup_s = time.perf_counter() - start
    arg_lists = [batch_args(b, job["arg_names"], job["device"]) for b in batches]
    start = time.perf_counter()
    first = call(runner, arg_lists[0], f"{p['package']}: the runner's first call (batch 0)")
    synchronize(job["device"])
    first_call_s = time.perf_counter() - start
    rows = []
    for b, (args, ref) in enumerate(zip(arg_lists, refs)):
        got = first if b == 0 else call(runner, args, f"{p['package']}: the runner on batch {b}")
        shape = runner.shape(args)
        bucket = runner.bucket_for(*shape)
        replay = None
        if runner.graphed and bucket is not None:
            plain = call(runner.plain, runner.padded_inputs(args), f"{p['package']}: plain call of bucket {bucket}")
            rows_, _, slots_ = shape
            plain = {"decision": plain["decision"][:rows_, :slots_], "act": plain["act"][:rows_]}
            replay = max_abs(got, plain)
        rows.append(
            {
                "batch": b,
                "bucket": bucket and bucket.as_dict(),
                "compare": compare_heads(ref, got, batches[b], calibration),
                "replay_vs_plain": replay,
            }
        )
    described = runner.describe()
    return (
        {**described, "setup_s": setup_s, "batches": rows, "summary": summarize([r["compare"] for r in rows])},
        {"capture_s": described["capture_s"], "first_call_s": first_call_s},
    )


def verify(job: dict) -> dict:
    faulthandler.enable()
    programs = job["programs"]
    # an earlier release's inputs are of their own format (laya_build.release.formats); format 1
    # has no calibration: its probabilities are the raw softmax (runtime.parity.head_probabilities)
    inputs = load_weights_only(job["inputs"], "inputs", job.get("inputs_format", INPUTS_FORMAT))
    calibration = inputs.get("calibration")
    eagers = [load_weights_only(p["eager"], "eager outputs", EAGER_FORMAT) for p in programs]
    check_inputs(job, inputs, eagers)
    job = {**job, "arg_names": inputs["arg_names"]}

    start = time.perf_counter()
    preloaded = preload_modules(job["preload"])
    loader = runtime.fastest_loader()
    runtime.import_loader_modules(loader)
    import_s = (IMPORTED - STARTED) + (time.perf_counter() - start)
    masked = mask_compilers()
    simulate_crash()
    cache_dir = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    cache_initial = list_tree(cache_dir)
    results, fresh_load = [], None
    for p, eager in zip(programs, eagers):
        cache_before = list_tree(cache_dir)
        package = load(p, loader)
        cache_after_load = list_tree(cache_dir)
        batches = inputs[p["batches_key"]]
        runner = None
        if p["name"] == "decision":
            runner, answer = run_runner(p, package, job, batches, eager["outputs"], calibration)
            fresh_load = {"import_s": import_s, **package.timings, **answer}
            fresh_load["total_s"] = sum(fresh_load.values())
            fresh_load.update(isa=package.isa, runner=runner["mode"])
        rows = []
        for b, (batch, ref) in enumerate(zip(batches, eager["outputs"])):
            args = batch_args(batch, inputs["arg_names"], job["device"])
            got = call(package, args, f"{p['package']}: batch {b}")
            rows_, tokens = batch["input_ids"].shape
            rows.append(
                {
                    "batch": b,
                    "shape": {"rows": rows_, "tokens": tokens, "slots": batch["marker_pos"].shape[1]},
                    "compare": compare_heads(ref, got, batch, calibration),
                    # the call above, on these inputs, is the first of the warm-up calls
                    "latency": time_calls(package, args, job["timing"], job["device"], called=1),
                }
            )
        results.append(
            {
                "name": p["name"],
                "load_s": package.timings["load_s"],
                "cache_during_load": [f for f in cache_after_load if f not in cache_before],
                "batches": rows,
                **({"runner": runner} if runner else {}),
            }
        )
    return {
        "programs": results,
        "fresh_load": fresh_load,
        "cache_initial": cache_initial,
        "cache_after_run": list_tree(cache_dir),
        "child": {
            "pid": os.getpid(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "preload": preloaded,
            "loader": loader,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "masked": masked,
            "aoti_runtime_check_inputs": os.environ.get("AOTI_RUNTIME_CHECK_INPUTS"),
            "forbidden_modules_loaded": forbidden_modules(),
        },
    }
