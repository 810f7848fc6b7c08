"""The serving runtime of a decision package: open, check, load fast, pad to buckets, replay.

What a process that answers decisions needs, and nothing else: ``torch``, the standard
library, :mod:`laya_build.errors` and :mod:`laya_build.runtime.buckets` (no doit, transformers or
model code).  The fresh verification process uses it as it is.

Opening a package
    :func:`open_release` takes a released version folder and a build (``cuda-bfloat16``):
    every file it reads (the effective configuration, the package record, the ``.pt2``)
    must match ``manifest.json`` by sha256 before it is used.  :func:`open_build` takes an
    ``aoti_package.json`` of a build folder; the ``.pt2`` must match that record.  A
    ``.pt2`` runs native code: nothing loads it before its hash is checked.

Loading fast (:func:`load_package`)
    ``torch._inductor.aoti_load_package`` compares the CPU vector ISA recorded in the
    package (``AOTI_CPU_ISA``) with ``pick_vec_isa()`` of the loading process and only
    *logs a warning* when they differ (``torch/export/pt2_archive/_package.py``
    ``_load_aoti``, torch 2.11 and 2.13); the C++ loader then opens the package's
    precompiled ``.so`` and never asks for the ISA again.  Answering ``pick_vec_isa()``
    costs a dry compile of one probe per candidate ISA, each loaded in a child Python
    (about 11 s on the 2-core CPU machine, ten children of ~4 s on the H200 image).  This
    module answers it with the recorded ISA instead, after checking that the running CPU
    has every feature that ISA names (the cpuinfo checks of ``cpu_vec_isa.x86_isa_checker``,
    no compiler); a CPU that lacks one fails with :class:`PackageIsaError` (torch would only
    warn, then fault on the first vector instruction).  The answer is scoped to the load
    (``valid_vec_isa_list`` is swapped and restored under a lock), so a later
    ``torch.compile`` in the same process still probes for itself.  Not covered by any ISA
    check, by torch or here: the package is compiled with ``-march=native`` and may use
    other features of the build machine's CPU.  The ``direct`` loader skips
    ``aoti_load_package`` (and with it the import of Inductor and Dynamo: 2 s on the CPU
    machine) and calls the C++ loader it wraps, with the flat inputs; it is the default
    wherever torch has that loader (:func:`fastest_loader`), so ``verify`` checks a package
    through the loader a serving process uses.  ``loader="aoti_load_package"`` keeps
    torch's public API (with the ISA answer above).

Buckets and CUDA graphs (:class:`DecisionRunner`)
    Loaded with ``run_single_threaded=True`` (the model pool of a default load queries CUDA
    events during a call, which a capture forbids), one graph per bucket is captured after
    warm-up calls on a side stream, on that same stream, with
    ``capture_error_mode="thread_local"`` (seen to work on the H200, 2026-11-30).  Each
    bucket owns its static inputs, the padding template and the graph's outputs for as long
    as the runner lives.  A call is padded to the cheapest bucket that holds it (padding
    rows attend to their first token only and have no marker slot; padding tokens have
    ``attention_mask`` 0; padding slots have ``marker_mask`` 0 and so a logit of -1e4 and
    probability 0, which changes neither the softmax nor the act features of the real
    slots), copied into the bucket's static inputs and replayed; the real rows' outputs are
    returned as new tensors.  A call larger than every bucket runs the plain package, its
    tokens padded to a multiple of 16 (and every dimension to the package's minimum).  On
    the CPU the same padding runs through plain package calls, without graphs.

    Calls are serialised by a lock: the static inputs and outputs of a bucket are shared,
    and a single-threaded package has no thread synchronisation of its own.  Concurrent
    callers therefore wait for each other; run one runner per thread (each with its own
    load) for parallel serving.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import json
import os
import platform
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch

from laya_build.errors import NativeLibraryError, PackageIntegrityError, PackageIsaError, RuntimeInputError
from laya_build.layout import EFFECTIVE_CONFIG_NAME, MANIFEST_NAME, package_record_path, record_name
from laya_build.runtime.buckets import Bucket, ExportDims, parse_buckets, smallest_holding
from laya_build.runtime.digest import sha256_file
from laya_build.runtime.preload import preload_all

ARG_NAMES = ("input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype")
MODEL_NAME = "model"  # the model inside a .pt2 that aoti_load_package loads
CAPTURE_WARMUP = 3
BACKGROUND = "background"
CAPTURE_MODES = (None, True, False, BACKGROUND)
CAPTURE_DELAY_S = 1.0  # background captures start after the first answer, or after this long without a call
MANIFEST, EFFECTIVE_CONFIG = MANIFEST_NAME, EFFECTIVE_CONFIG_NAME

_ISA_LOCK = threading.Lock()


# ------------------------------------------------------------------------------ integrity


def check_sha256(path, expected: str, what: str, *, digest: str | None = None) -> str:
    """``path``'s sha256, which must be ``expected`` (from ``what``) before anything uses it
    (``digest``: that sha256, already taken of these bytes, e.g. while torch was imported)."""
    actual = digest if digest is not None else sha256_file(path)
    if actual != expected:
        raise PackageIntegrityError(
            f"{path}: sha256 {actual} does not match the {what}'s {expected}; "
            "refusing to load it (a .pt2 runs native code)"
        )
    return actual


# -------------------------------------------------------------------- native op library

NATIVE_NAMESPACE = "laya_native"  # the ops of the project's native library (laya_build/native)
_LIBRARIES: dict[str, Path] = {}  # sha256 -> the file this process loaded those bytes from
_LIBRARIES_LOCK = threading.Lock()


def load_library(path, sha256: str, *, what: str = "package record") -> Path:
    """Load the native op library at ``path`` into this process once its bytes are ``sha256``
    (from ``what``); the path those bytes were first loaded from.

    The file is read once: those bytes are hashed and, when they match, loaded from an anonymous
    in-memory file (``memfd_create``; where there is none, a private temporary file), so what is
    loaded is what was checked whatever happens to ``path`` meanwhile.  The same bytes asked for
    again load nothing.  Another build of the library, once one is loaded, or one loaded into the
    process outside this function (its static registration would end the process), is refused
    (:class:`NativeLibraryError`): a process holds one kernel per op.  A missing or different file
    is a :class:`PackageIntegrityError`."""
    path = Path(path)
    with _LIBRARIES_LOCK:
        if sha256 in _LIBRARIES:
            return _LIBRARIES[sha256]
        if _LIBRARIES:
            (other, where), *_ = _LIBRARIES.items()
            raise NativeLibraryError(
                f"{path}: the {what} names native op library {sha256[:16]}, and this process has already "
                f"loaded another build of it ({other[:16]}, from {where}); a process holds one kernel per "
                f"{NATIVE_NAMESPACE} op"
            )
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise PackageIntegrityError(
                f"{path}: the native op library the {what} names is missing (the package calls its "
                f"{NATIVE_NAMESPACE} ops); refusing to load the package without it"
            ) from None
        check_sha256(path, sha256, what, digest=hashlib.sha256(data).hexdigest())
        if _native_ops_registered():
            raise NativeLibraryError(
                f"{path}: this process already has {NATIVE_NAMESPACE} ops, from a library loaded outside "
                "laya_build.runtime; a second registration of them would end the process"
            )
        try:
            with _loadable_copy(data, path.name) as copy:
                # what torch.ops.load_library does, without resolving the path (a memfd's resolves
                # to no file): the library's static initialisers register its ops with torch
                ctypes.CDLL(copy, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        except (OSError, RuntimeError) as exc:
            raise NativeLibraryError(
                f"{path}: loading the native op library failed: {exc} (a library built for another torch "
                "cannot load: build the package with the torch that serves it)"
            ) from exc
        _LIBRARIES[sha256] = path
        return path


def _native_ops_registered() -> bool:
    """Whether this process has ops of :data:`NATIVE_NAMESPACE` (from any library)."""
    prefix = f"{NATIVE_NAMESPACE}::"
    return any(op.startswith(prefix) for op in torch._C._dispatch_get_all_op_names())


@contextlib.contextmanager
def _loadable_copy(data: bytes, name: str):
    """A path that holds ``data`` for as long as the block runs, readable by this process alone."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name, 0)
        try:
            with open(fd, "wb", closefd=False) as fh:
                fh.write(data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="laya-native-") as private:  # mode 0700: this user's
        copy = Path(private, name)
        copy.write_bytes(data)
        yield str(copy)


def _native_ops_missing(exc: BaseException, path: Path) -> NativeLibraryError | None:
    """The error to raise when a load failed because the package calls native ops whose library
    is not loaded (None: it failed for another reason)."""
    if f"{NATIVE_NAMESPACE}::" not in str(exc) or _LIBRARIES:
        return None
    return NativeLibraryError(
        f"{path}: the package calls the project's native ops ({NATIVE_NAMESPACE}) and no native op library "
        "is loaded in this process; its record's native_library names the one it needs"
    )


# ------------------------------------------------------------------------------- vec ISA

LOADERS = ("aoti_load_package", "direct")


def fastest_loader() -> str:
    """``direct`` where this torch has the C++ loader that ``aoti_load_package`` wraps, else
    ``aoti_load_package``."""
    aoti = getattr(torch._C, "_aoti", None)
    return "direct" if hasattr(aoti, "AOTIModelPackageLoader") else "aoti_load_package"


def import_loader_modules(loader: str | None = None) -> None:
    """Import what :func:`load_package` needs, so a caller can time imports apart from the
    load: for ``aoti_load_package`` Inductor's package loader (which imports Dynamo; ~2 s on
    the CPU machine), for ``direct`` nothing beyond torch; ``None``: :func:`fastest_loader`."""
    if (loader or fastest_loader()) == "aoti_load_package":
        import torch._inductor.codecache  # noqa: F401
        import torch._inductor.cpu_vec_isa  # noqa: F401
        import torch._inductor.package  # noqa: F401


def package_metadata(path) -> dict:
    """The metadata AOTInductor recorded in the package (``AOTI_DEVICE_KEY``, ``AOTI_CPU_ISA``...)."""
    return dict(torch._C._aoti.AOTIModelPackageLoader.load_metadata_from_package(str(path), MODEL_NAME))


def cpu_isa_flags() -> list[str] | None:
    """Vector features of this CPU as Inductor names them (``avx2``, ``avx512``,
    ``avx512_vnni``, ``amx_tile``), from cpuinfo; ``None`` off x86-64.  The checks of
    ``torch._inductor.cpu_vec_isa.x86_isa_checker``, made without importing Inductor."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    avx512 = torch.cpu._is_avx512_supported()
    found = {
        "avx2": torch.cpu._is_avx2_supported(),
        "avx512": avx512,
        "avx512_vnni": avx512 and torch.cpu._is_vnni_supported(),
        "amx_tile": torch.cpu._is_amx_tile_supported(),
    }
    return [name for name, present in found.items() if present]


INVALID_ISA = "INVALID_VEC_ISA"  # str(cpu_vec_isa.invalid_vec_isa).upper(): no vectorisation


def check_isa(path, metadata: dict) -> dict:
    """The package's recorded ISA against this CPU: ``{"package", "cpu", "mode"}``.

    Raises :class:`PackageIsaError` when this CPU lacks a feature the recorded ISA names.
    Unchecked (``cpu`` None) off x86-64 or without a recorded ISA.
    """
    recorded = metadata.get("AOTI_CPU_ISA")
    flags = cpu_isa_flags()
    if recorded and flags is not None and recorded != INVALID_ISA:
        missing = [f for f in recorded.lower().split() if f not in flags]
        if missing:
            raise PackageIsaError(
                f"{path}: built for the CPU vector ISA {recorded}, but this CPU lacks "
                f"{', '.join(missing)} (it has {', '.join(flags) or 'none of them'}); its "
                "vectorised kernels would fault, refusing to load it"
            )
    return {"package": recorded, "cpu": flags, "mode": "probed"}


def recorded_vec_isa(isa: dict):
    """The VecISA object of a checked recorded ISA, to answer ``pick_vec_isa()`` with
    (``None``: leave the question to torch's probe: unchecked, or unknown to this torch)."""
    from torch._inductor import cpu_vec_isa

    if isa["package"] is None or isa["cpu"] is None:
        return None
    if isa["package"] == INVALID_ISA:
        return cpu_vec_isa.invalid_vec_isa
    return next((i for i in cpu_vec_isa.supported_vec_isa_list if str(i).upper() == isa["package"]), None)


@contextlib.contextmanager
def vec_isa_answered(isa):
    """Within the block, ``pick_vec_isa()`` answers ``isa`` without probing (``None``: no change)."""
    if isa is None:
        yield
        return
    from torch._inductor import cpu_vec_isa

    with _ISA_LOCK:
        original = cpu_vec_isa.valid_vec_isa_list
        answer = [] if isa is cpu_vec_isa.invalid_vec_isa else [isa]
        cpu_vec_isa.valid_vec_isa_list = lambda: list(answer)
        try:
            yield
        finally:
            cpu_vec_isa.valid_vec_isa_list = original


# ------------------------------------------------------------------------------- loading


@dataclass
class LoadedPackage:
    """A loaded ``.pt2``: call it like the model (returns ``(decision_logits, act_logits)``)."""

    path: Path
    sha256: str
    device: torch.device
    single_threaded: bool
    loader: str
    isa: dict
    timings: dict  # sha256_s, probe_s, load_s
    compiled: object = field(repr=False)

    def __call__(self, *args):
        if self.loader == "direct":
            return tuple(self.compiled.boxed_run(list(args)))
        return tuple(self.compiled(*args))


def _check_call_spec(loader, path) -> None:
    """The direct loader is called with the five tensors as a flat list and returns the two
    heads flat: the package's pytree specs must say exactly that."""
    from torch.utils import _pytree

    in_spec, out_spec = (_pytree.treespec_loads(s) for s in loader.get_call_spec())
    if (in_spec.num_leaves, out_spec.num_leaves) != (len(ARG_NAMES), 2):
        raise PackageIntegrityError(
            f"{path}: takes {in_spec.num_leaves} inputs and returns {out_spec.num_leaves} "
            f"outputs; a decision package takes {len(ARG_NAMES)} and returns 2"
        )


def load_package(
    path,
    sha256: str,
    *,
    what: str = "package record",
    single_threaded: bool = True,
    loader: str | None = None,
    digest: str | None = None,
    library: dict | None = None,
) -> LoadedPackage:
    """Check ``path`` against ``sha256`` (from ``what``) and the CPU against the package's
    recorded ISA, then load it (see the module docstring).  ``library``: the native op library
    the package calls (``{"path", "sha256"}``, from the same record), checked and loaded first
    (:func:`load_library`).

    ``loader``: ``aoti_load_package`` (torch's API; its ISA question answered from the
    package) or ``direct``: the ``torch._C._aoti.AOTIModelPackageLoader`` that
    ``aoti_load_package`` wraps, called with the flat inputs, without importing Inductor or
    Dynamo and without the wrapper's per-call pytree parsing (measured in
    ``benchmarks/runtime_bench.py``); ``None``: :func:`fastest_loader`.  ``digest``: the
    package's sha256, already taken (:mod:`laya_build.runtime.start` hashes while torch imports).
    """
    loader = loader or fastest_loader()
    if loader not in LOADERS:
        raise ValueError(f"loader must be one of {', '.join(LOADERS)}, got {loader!r}")
    path = Path(path)
    start = time.perf_counter()
    check_sha256(path, sha256, what, digest=digest)
    if library is not None:
        load_library(library["path"], library["sha256"], what=what)
    hashed = time.perf_counter()
    metadata = package_metadata(path)
    isa = check_isa(path, metadata)
    try:
        if loader == "direct":
            isa["mode"] = "not-asked"
            probed = time.perf_counter()
            compiled = torch._C._aoti.AOTIModelPackageLoader(str(path), MODEL_NAME, single_threaded, 1, -1)
            _check_call_spec(compiled, path)
        else:
            answer = recorded_vec_isa(isa)
            isa["mode"] = "probed" if answer is None else "pre-answered"
            probed = time.perf_counter()
            with vec_isa_answered(answer):
                compiled = torch._inductor.aoti_load_package(str(path), run_single_threaded=single_threaded)
    except RuntimeError as exc:
        if (missing := _native_ops_missing(exc, path)) is not None:
            raise missing from exc
        raise
    loaded = time.perf_counter()
    return LoadedPackage(
        path=path,
        sha256=sha256,
        device=torch.device(metadata.get("AOTI_DEVICE_KEY", "cpu")),
        single_threaded=single_threaded,
        loader=loader,
        isa=isa,
        compiled=compiled,
        timings={"sha256_s": hashed - start, "probe_s": probed - hashed, "load_s": loaded - probed},
    )


def preload_modules(names) -> dict:
    """Load each preload entry that is installed (a module, or ``lib:<package>``'s native
    library: :mod:`laya_build.runtime.preload`), before a package is loaded.

    Every process that loads a package calls this with its stage's ``preload.<target>`` list
    (default ``[lib:tvm_ffi]`` for cuda: the GPU image's load crash, docs/guides/gpu-builds.md,
    "Preloads").
    """
    return preload_all(names)


# ------------------------------------------------------------------------------- runner


def padding_template(bucket: Bucket, device) -> tuple:
    """The five inputs of a call of the bucket's shape that is padding only: every row
    attends to its first token alone and has no marker slot."""
    rows, tokens, slots = bucket.rows, bucket.tokens, bucket.slots
    with torch.inference_mode(False):
        mask = torch.zeros(rows, tokens, dtype=torch.long, device=device)
        mask[:, 0] = 1
        return (
            torch.zeros(rows, tokens, dtype=torch.long, device=device),
            mask,
            torch.zeros(rows, slots, dtype=torch.long, device=device),
            torch.zeros(rows, slots, dtype=torch.long, device=device),
            torch.zeros(rows, dtype=torch.long, device=device),
        )


def fill(static: tuple, template: tuple, args: tuple) -> None:
    """Copy a call into ``static`` (of a bucket's shape): its tensors at the top-left
    corner, the padding template everywhere else."""
    for dst, pad, src in zip(static, template, args):
        if dst.shape == src.shape:
            dst.copy_(src)
        else:
            dst.copy_(pad)
            dst[tuple(slice(0, n) for n in src.shape)].copy_(src)


@dataclass
class _Slot:
    """What one bucket owns: static inputs, the padding template, and on CUDA the graph,
    its outputs and its capture stream (all kept alive as long as the runner)."""

    bucket: Bucket
    static: tuple
    template: tuple
    graph: object = None
    outputs: tuple | None = None
    stream: object = None
    capture_s: float = 0.0


class DecisionRunner:
    """A loaded decision package behind per-bucket CUDA graphs (plain padded calls on the CPU).

    ``runner(input_ids, attention_mask, marker_pos, marker_mask, qtype)`` returns
    ``(decision_logits [rows, slots], act_logits [rows, n_act])`` on the package's device,
    for the call's own rows and slots.  See the module docstring for padding, the choice of
    bucket and the lock that serialises calls.
    """

    def __init__(
        self,
        package: LoadedPackage,
        *,
        dims: dict,
        buckets=(),
        capture: bool | str | None = None,
        capture_warmup: int = CAPTURE_WARMUP,
        capture_delay_s: float = CAPTURE_DELAY_S,
    ):
        if capture not in CAPTURE_MODES:
            raise ValueError(f"capture must be one of {', '.join(map(repr, CAPTURE_MODES))}, got {capture!r}")
        self.package = package
        self.device = package.device
        if self.device.type == "cuda" and self.device.index is None:  # the package records "cuda"
            self.device = torch.device("cuda", torch.cuda.current_device())  # the caller's device
        self.dims = ExportDims.from_dims(dims)
        self.buckets = parse_buckets(buckets, self.dims, where="buckets")
        on_cuda = self.device.type == "cuda"
        self.graphed = on_cuda if capture in (None, BACKGROUND) else bool(capture)
        if self.graphed and not package.single_threaded:
            raise ValueError("CUDA graphs need a package loaded with single_threaded=True")
        self.capture_warmup = capture_warmup
        self.capture_mode = "none" if not self.graphed else ("background" if capture == BACKGROUND else "up-front")
        self.capture_errors: dict[Bucket, str] = {}
        self.capture_failure: str | None = None  # the background captures stopped on this
        self._lock = threading.Lock()
        self._answered = threading.Event()
        self._captured = threading.Event()
        self._closed = False
        self._slots: dict[Bucket, _Slot] = {}
        for bucket in self.buckets:
            template = padding_template(bucket, self.device)
            with torch.inference_mode(False):
                slot = _Slot(bucket, tuple(t.clone() for t in template), template)
            self._slots[bucket] = slot
        self._thread = None
        if self.capture_mode == "background":
            self._thread = threading.Thread(
                target=self._capture_behind, args=(capture_delay_s,), name="laya-runtime-capture", daemon=True
            )
            self._thread.start()
            atexit.register(_close_at_exit, weakref.ref(self))  # no capture left running at exit
        else:
            for slot in self._slots.values():
                if self.graphed:
                    self._capture(slot)
            self._captured.set()

    def _capture_behind(self, delay_s: float) -> None:
        """The background captures: after the first answer (or ``delay_s`` without a call), one
        bucket at a time under the call lock, cheapest first; a call meanwhile runs its bucket's
        plain package call on the same static inputs (the answer a replay gives, bit for bit:
        ``verify`` checks it).  A capture that fails leaves its bucket to plain calls and is
        named in :attr:`capture_errors`."""
        try:
            self._answered.wait(timeout=delay_s)
            with torch.cuda.device(self.device):
                for slot in self._slots.values():
                    with self._lock:
                        if self._closed:
                            return
                        try:
                            self._capture(slot)
                        except Exception as exc:  # the bucket stays on plain calls
                            self.capture_errors[slot.bucket] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # every bucket not captured stays on plain calls
            self.capture_failure = f"{type(exc).__name__}: {exc}"
        finally:
            self._captured.set()

    def wait_captured(self, timeout: float | None = None) -> bool:
        """Wait until the background captures ended: every bucket captured, or failed
        (:meth:`capture_state`), or the runner closed; False if ``timeout`` seconds went by first."""
        return self._captured.wait(timeout)

    def close(self) -> None:
        """Stop background captures that have not started (a running one finishes)."""
        self._closed = True
        if self._thread is not None:
            self._answered.set()
            self._thread.join()

    @property
    def mode(self) -> str:
        return "cuda_graphs" if self.graphed else "padded_calls"

    @property
    def graphs(self) -> dict:
        """Bucket -> its captured ``torch.cuda.CUDAGraph`` (empty without graphs)."""
        return {b: s.graph for b, s in self._slots.items() if s.graph is not None}

    @property
    def capture_s(self) -> float:
        return sum(s.capture_s for s in self._slots.values())

    def _capture(self, slot: _Slot) -> None:
        start = time.perf_counter()
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.no_grad():
            with torch.cuda.stream(stream):
                for _ in range(self.capture_warmup):
                    self.package(*slot.static)
            torch.cuda.synchronize(self.device)
            # The warm-up calls gave the capture stream a cuBLAS workspace from the shared pool; a
            # graph captured with it would keep writing into that block after anything else in the
            # process frees it (torch.compile's CUDA graph trees clear every stream's workspace
            # around their captures; torch.cuda.graph empties the allocator's cache) and the
            # allocator hands it out again.  Dropped before the capture, the workspace the graph
            # uses is allocated inside the graph's own memory pool, which nothing else allocates
            # from while the graph lives; dropped after it, no later call shares it with a replay
            # (torch/_inductor/cudagraph_trees.py, clear_cublass_cache, does both for its graphs).
            torch._C._cuda_clearCublasWorkspaces()
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                    outputs = self.package(*slot.static)
                torch.cuda.synchronize(self.device)
            finally:
                torch._C._cuda_clearCublasWorkspaces()
        slot.graph, slot.outputs, slot.stream = graph, outputs, stream
        slot.capture_s = time.perf_counter() - start

    def shape(self, args) -> tuple[int, int, int]:
        """``(rows, tokens, slots)`` of a call; :class:`RuntimeInputError` for tensors that
        do not form one or that exceed what the package accepts."""
        if len(args) != len(ARG_NAMES):
            raise RuntimeInputError(f"expected {len(ARG_NAMES)} tensors ({', '.join(ARG_NAMES)}), got {len(args)}")
        for name, t in zip(ARG_NAMES, args):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.long:
                got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
                raise RuntimeInputError(f"{name} must be an int64 tensor, got {got}")
        ids, mask, pos, pmask, qtype = args
        if ids.dim() != 2 or pos.dim() != 2 or qtype.dim() != 1:
            raise RuntimeInputError(
                f"input_ids and marker_pos must be 2-d and qtype 1-d, got shapes "
                f"{tuple(ids.shape)}, {tuple(pos.shape)}, {tuple(qtype.shape)}"
            )
        rows, tokens = ids.shape
        slots = pos.shape[1]
        for name, t, want in (
            ("attention_mask", mask, (rows, tokens)),
            ("marker_mask", pmask, (rows, slots)),
            ("marker_pos", pos, (rows, slots)),
            ("qtype", qtype, (rows,)),
        ):
            if tuple(t.shape) != want:
                raise RuntimeInputError(
                    f"{name} has shape {tuple(t.shape)}; input_ids {tuple(ids.shape)} "
                    f"and marker_pos {tuple(pos.shape)} need {want}"
                )
        if min(rows, tokens, slots) < 1:
            raise RuntimeInputError(f"empty call: rows {rows}, tokens {tokens}, slots {slots}")
        if over := self.dims.too_large(rows, tokens, slots):
            raise RuntimeInputError(
                f"a call of {rows} rows x {tokens} tokens x {slots} slots exceeds the "
                f"package's export ranges ({'; '.join(over)}): rows {self.dims.rows}, "
                f"tokens {self.dims.tokens}, slots {self.dims.slots}"
            )
        return rows, tokens, slots

    def bucket_for(self, rows: int, tokens: int, slots: int) -> Bucket | None:
        """The cheapest bucket holding a call of this shape; ``None``: the plain package runs it."""
        return smallest_holding(self.buckets, rows, tokens, slots)

    def _padded(self, shape: Bucket, args) -> tuple:
        template = padding_template(shape, self.device)
        out = tuple(t.clone() for t in template)
        fill(out, template, args)
        return out

    def padded_inputs(self, args) -> tuple:
        """The inputs the package sees for this call (its bucket's shape, or the fitted
        shape of a plain call), as new tensors on the package's device."""
        rows, tokens, slots = self.shape(args)
        return self._padded(self.bucket_for(rows, tokens, slots) or self.dims.fitted(rows, tokens, slots), args)

    def plain(self, *args):
        """The package called directly on ``args`` (no padding, no graph), under the lock."""
        with self._lock, torch.no_grad():
            return self.package(*(t.to(self.device) for t in args))

    def __call__(self, *args):
        rows, tokens, slots = self.shape(args)
        bucket = self.bucket_for(rows, tokens, slots)
        with self._lock, torch.no_grad():
            if bucket is None:
                fitted = self.dims.fitted(rows, tokens, slots)
                if fitted == Bucket(rows, tokens, slots):
                    decision, act = self.package(*(t.to(self.device) for t in args))
                else:
                    decision, act = self.package(*self._padded(fitted, args))
            else:
                slot = self._slots[bucket]
                fill(slot.static, slot.template, args)
                if slot.graph is not None:
                    slot.graph.replay()
                    decision, act = slot.outputs
                else:
                    decision, act = self.package(*slot.static)
            answer = decision[:rows, :slots].clone(), act[:rows].clone()
        self._answered.set()
        return answer

    def describe(self) -> dict:
        return {
            "mode": self.mode,
            "buckets": [b.as_dict() for b in self.buckets],
            "capture_s": self.capture_s,
            "captures": [{**s.bucket.as_dict(), "capture_s": s.capture_s} for s in self._slots.values()],
        }

    def capture_state(self) -> dict:
        """How the graphs are captured (``none``, ``up-front``, ``background``), which buckets
        have one now, which are still to be captured, and why a capture failed (``stopped``:
        why the background captures ended early, or that the runner was closed)."""
        errors = dict(self.capture_errors)  # one copy: the capture thread may add to it
        done = self._captured.is_set()
        stopped = self.capture_failure or ("closed" if self._closed and done else None)
        return {
            "capture": self.capture_mode,
            "captured": [str(s.bucket) for s in self._slots.values() if s.graph is not None],
            "pending": [
                str(s.bucket)
                for s in self._slots.values()
                if self.graphed and not done and s.graph is None and s.bucket not in errors
            ],
            "errors": {str(b): e for b, e in errors.items()},
            "stopped": stopped,
        }


def _close_at_exit(ref) -> None:
    runner = ref()
    if runner is not None:
        runner.close()


# ------------------------------------------------------------------------------ opening

MAX_JSON_BYTES = 16 << 20  # no record or manifest of a release comes near it


def _read_json(path: Path, what: str) -> dict:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        raise PackageIntegrityError(f"{path}: missing ({what})") from None
    if len(raw) > MAX_JSON_BYTES:
        raise PackageIntegrityError(f"{path}: larger than {MAX_JSON_BYTES:,} bytes: not a {what} of a release")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise PackageIntegrityError(f"{path}: not JSON ({what}): {type(exc).__name__}") from None


def _program(record: dict, record_path: Path, program: str) -> dict:
    if record.get("stage") != "aoti_package":
        raise PackageIntegrityError(f"{record_path}: not an aoti_package record")
    if record.get("status") != "ok":
        raise PackageIntegrityError(f"{record_path}: the build was skipped ({record.get('reason')}); no package")
    programs = record.get("programs")
    if not isinstance(programs, list) or not all(isinstance(p, dict) for p in programs):
        raise PackageIntegrityError(f"{record_path}: not an aoti_package record (no list of programs)")
    found = next((p for p in programs if p.get("name") == program), None)
    if found is None:
        names = ", ".join(str(p.get("name")) for p in programs)
        raise PackageIntegrityError(f"{record_path}: no program {program!r} (has {names})")
    package = found.get("package")
    if not (
        isinstance(package, dict) and isinstance(package.get("path"), str) and isinstance(package.get("sha256"), str)
    ):
        raise PackageIntegrityError(f"{record_path}: program {program!r} names no package (path and sha256)")
    return found


def open_build(
    package_record_path,
    *,
    buckets=(),
    program: str = "decision",
    preload=(),
    capture: bool | str | None = None,
    capture_warmup: int = CAPTURE_WARMUP,
    prehashed: dict | None = None,
    loader: str | None = None,
) -> DecisionRunner:
    """The runner of a build folder's package (``aoti_package.json`` beside the ``.pt2``);
    the package must match the record's sha256 (``prehashed``: path -> sha256 already taken;
    ``loader``: as for :func:`load_package`)."""
    record_path = Path(package_record_path)
    record = _read_json(record_path, "package record")
    entry = _program(record, record_path, program)
    preload_modules(preload)
    path = record_path.parent / entry["package"]["path"]
    library = recorded_library(record, record_path)
    package = load_package(
        path,
        entry["package"]["sha256"],
        what="package record",
        single_threaded=True,
        digest=(prehashed or {}).get(path),
        loader=loader,
        library=library and {**library, "path": record_path.parent / library["path"]},
    )
    return DecisionRunner(package, dims=record["dims"], buckets=buckets, capture=capture, capture_warmup=capture_warmup)


def recorded_library(record: dict, record_path: Path) -> dict | None:
    """The native op library a package record names (``{"path", "sha256"}``, the path relative
    to the record's folder; None: the package calls no native ops)."""
    library = record.get("native_library")
    if library is None:
        return None
    path = library.get("path") if isinstance(library, dict) else None
    if not (isinstance(path, str) and isinstance(library.get("sha256"), str)) or "/" in path or path in ("", ".", ".."):
        raise PackageIntegrityError(f"{record_path}: native_library names no file beside the package (path and sha256)")
    return {"path": path, "sha256": library["sha256"]}


def library_beside(package_path) -> dict | None:
    """The native op library the package record beside ``package_path`` names, for
    :func:`load_package` (``{"path", "sha256"}``; None: no record there, or a package that calls
    no native op)."""
    record_path = Path(package_path).parent / record_name("aoti_package")
    if not record_path.is_file():
        return None
    library = recorded_library(_read_json(record_path, "package record"), record_path)
    return library and {**library, "path": record_path.parent / library["path"]}


def _no_link(vdir: Path, rel: str) -> None:
    """``rel`` names a regular file inside ``vdir`` reached through no symbolic link (the bytes
    checked are then the bytes loaded)."""
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise PackageIntegrityError(f"{rel!r}: a release path must name a file inside {vdir}")
    here = vdir
    for part in parts:
        here = here / part
        if here.is_symlink():
            raise PackageIntegrityError(f"{here}: a symbolic link in a release; refusing to load through it")
    if here.exists() and not here.is_file():
        raise PackageIntegrityError(f"{here}: not a regular file")


def open_release(
    release_dir,
    build: str,
    *,
    buckets=None,
    program: str = "decision",
    capture: bool | str | None = None,
    capture_warmup: int = CAPTURE_WARMUP,
    trusted_keys=None,
    prehashed: dict | None = None,
    loader: str | None = None,
) -> DecisionRunner:
    """The runner of a released build (``<target>-<dtype>``, e.g. ``cuda-bfloat16``).

    The effective configuration, the package record and the ``.pt2`` must each match the
    release's ``manifest.json``; buckets default to the release's ``runtime.buckets.<target>``
    and the modules imported before loading to its ``verify.preload.<target>``.

    ``trusted_keys``: public key files (PEM); the release must then be signed by one of them
    over exactly its files (:func:`laya_build.release.signing.check`), checked before anything
    of it is read.  ``None``: the keys of ``LAYA_BUILD_TRUSTED_KEYS`` if it is set; ``[]``: no
    signature is required.

    ``capture``: ``None`` (graphs on CUDA, captured before this returns), ``"background"``
    (captured behind the first answers), ``True`` or ``False``.  ``prehashed``: path -> the
    sha256 already taken of the package's bytes (:mod:`laya_build.runtime.start`).  ``loader``: as
    for :func:`load_package`.
    """
    vdir = Path(release_dir).resolve()
    if trusted_keys is None or trusted_keys:
        from laya_build.release import check_files, signing

        environ = os.environ if trusted_keys is None else {}
        keys = signing.trusted_keys({"keys": [str(k) for k in trusted_keys or []]}, Path.cwd(), environ)
        if keys:
            check_files(vdir)
            signing.check(vdir, keys)
    _no_link(vdir, MANIFEST)
    manifest = _read_json(vdir / MANIFEST, "release manifest")
    from laya_build.release import formats

    formats.format_of(manifest, vdir / MANIFEST)  # a format newer than this code is refused
    listed = {f["path"]: f["sha256"] for f in manifest.get("files", [])}

    def checked(rel: str) -> Path:
        if rel not in listed:
            raise PackageIntegrityError(f"{vdir / rel}: not listed in {vdir / MANIFEST}")
        _no_link(vdir, rel)
        path = vdir / rel
        if not path.is_file():
            raise PackageIntegrityError(f"{path}: listed in {vdir / MANIFEST} but missing")
        check_sha256(path, listed[rel], "release manifest")
        return path

    config = _read_json(checked(EFFECTIVE_CONFIG), "effective configuration")
    record_rel = package_record_path(build)
    record = _read_json(checked(record_rel), "package record")
    entry = _program(record, vdir / record_rel, program)

    def as_recorded(rel: str, sha256: str) -> Path:
        """``rel``: a regular file of the release, listed with the sha256 its record names."""
        _no_link(vdir, rel)
        if rel not in listed or not (vdir / rel).is_file():
            raise PackageIntegrityError(f"{vdir / rel}: missing from the release or its manifest")
        if listed[rel] != sha256:
            raise PackageIntegrityError(
                f"{vdir / rel}: the manifest's sha256 {listed[rel]} is not the package record's {sha256}"
            )
        return vdir / rel

    package_rel = f"aoti_package/{build}/{entry['package']['path']}"
    as_recorded(package_rel, entry["package"]["sha256"])
    target = record["target"]
    if buckets is None:
        buckets = config.get("runtime", {}).get("buckets", {}).get(target, [])
    if (library := recorded_library(record, vdir / record_rel)) is not None:
        rel = f"aoti_package/{build}/{library['path']}"
        library = {"path": as_recorded(rel, library["sha256"]), "sha256": listed[rel]}
    preload_modules(config.get("verify", {}).get("preload", {}).get(target, []))
    package = load_package(
        vdir / package_rel,
        listed[package_rel],
        what="release manifest",
        single_threaded=True,
        digest=(prehashed or {}).get(vdir / package_rel),
        loader=loader,
        library=library,
    )
    return DecisionRunner(package, dims=record["dims"], buckets=buckets, capture=capture, capture_warmup=capture_warmup)
