"""A fresh serving process to its first answer: the package's bytes checked while torch imports.

A process that serves a release spends its first seconds importing torch (3.6–4.8 s on the H200
image, docs/measurements/runtime-h200.md), then hashes the package (0.73 s for 745 MB), loads it
and captures a CUDA graph per bucket.  :func:`start_release` and :func:`start_build` overlap the
hashing with the import, and leave the captures behind the first answer:

1. this module imports no torch: it reads the manifest (or the package record) and starts a
   thread that hashes the package (in 32 MiB blocks, :mod:`laya_build.runtime.digest`: the GIL
   is released for each whole read and hash);
   with trusted keys, a second thread checks the release's files and signature;
   for a CUDA package, while torch is not imported yet, a third thread makes the driver's
   primary context of the device torch's ``cuda`` names first (:class:`_CudaContext`), which
   torch's runtime then adopts instead of making it after the import;
2. the calling thread imports torch meanwhile (the release's preload modules are imported by the
   opening, once the configuration that names them is checked; :func:`start_build` imports the
   caller's ``preload`` here);
3. once the threads are done, :func:`laya_build.runtime.serving.open_release` (or
   ``open_build``) opens the package exactly as it always does (every file it reads against the
   manifest, the package against the digest the thread took: nothing is loaded before its bytes
   are checked), with ``capture="background"``: the first calls run the plain package on their
   bucket's padded inputs while the graphs are captured behind them
   (:class:`~laya_build.runtime.serving.DecisionRunner`), and with the ``direct`` loader where
   this torch has it (:func:`~laya_build.runtime.serving.fastest_loader`): the C++ loader that
   ``aoti_load_package`` wraps, the same bits without importing Inductor and Dynamo (about 2 s on
   the CPU machine; ``loader="aoti_load_package"`` keeps the public API).

``runner.start_timings`` says where the time went (``hash_s``, ``import_s``, ``open_s``,
``hash_wait_s``: how long the opening waited for the hash after torch was imported, and
``cuda_context_s`` / ``cuda_context``: how long the context took, and ``made`` or why it was not).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time
from pathlib import Path

from laya_build.layout import MANIFEST_NAME, package_record_path
from laya_build.runtime.digest import sha256_of
from laya_build.runtime.preload import preload_all


class _Hash(threading.Thread):
    """The sha256 of one file, taken in a thread of its own."""

    def __init__(self, path: Path):
        super().__init__(name=f"laya-runtime-sha256 {path.name}", daemon=True)
        self.path = path
        self.digest: str | None = None
        self.identity: tuple | None = None  # (device, inode, size, mtime) of the bytes hashed
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.torch_imported_at_start = "torch" in sys.modules

    def run(self) -> None:
        start = time.perf_counter()
        try:
            with open(self.path, "rb") as fh:
                self.digest = sha256_of(fh)
                self.identity = _identity(os.fstat(fh.fileno()))
        except BaseException as exc:  # reported by the opening, which reads the file itself
            self.error = exc
        self.seconds = time.perf_counter() - start


class _CudaContext(threading.Thread):
    """The CUDA driver's primary context of device 0 (the device a fresh process's ``cuda``
    means, within ``CUDA_VISIBLE_DEVICES``), made while torch imports.

    Making a context is the most expensive step of CUDA's start; the runtime API torch uses
    takes the device's primary context, so made here it is made once and adopted by the
    package's load.  ``cuInit`` and ``cuDevicePrimaryCtxRetain`` are called through ctypes,
    which releases the GIL for each call.  Where the driver is missing or answers with an error
    (no GPU, an empty ``CUDA_VISIBLE_DEVICES``) nothing is made and ``outcome`` says why: the
    load then starts CUDA as it always does, and reports its own errors."""

    CALLS = ("cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain")

    def __init__(self, library: str = "libcuda.so.1"):
        super().__init__(name="laya-runtime cuda-context", daemon=True)
        self.library = library
        self.outcome = "not started"
        self.seconds: float | None = None
        self.started = False

    @classmethod
    def left_out(cls, why: str) -> _CudaContext:
        """A context thread that is never started, saying why."""
        context = cls()
        context.outcome = f"not made here: {why}"
        return context

    def begin(self) -> _CudaContext:
        # torch sets this before it starts CUDA, and the driver reads it once, at cuInit
        os.environ.setdefault("CUDA_MODULE_LOADING", "LAZY")
        self.started = True
        self.start()
        return self

    def finished(self) -> _CudaContext:
        if self.started:
            self.join()
        return self

    def run(self) -> None:
        start = time.perf_counter()
        try:
            lib = ctypes.CDLL(self.library)
            device, context = ctypes.c_int(0), ctypes.c_void_p()
            arguments = ((ctypes.c_uint(0),), (ctypes.byref(device), ctypes.c_int(0)), (ctypes.byref(context), device))
            for name, args in zip(self.CALLS, arguments):
                status = getattr(lib, name)(*args)
                if status != 0:
                    self.outcome = f"{name} returned CUDA error {status}"
                    return
            self.outcome = "made"
        except (OSError, AttributeError) as exc:
            self.outcome = f"no CUDA driver: {exc}"
        except Exception as exc:  # noqa: BLE001  (never the caller's: the load starts CUDA itself)
            self.outcome = f"{type(exc).__name__}: {exc}"
        finally:
            self.seconds = time.perf_counter() - start


def _cuda_context(record: dict | None) -> _CudaContext:
    """The primary context's thread: started for a CUDA package's record while torch is not yet
    imported (once it is, the caller may have chosen another device, and there is no import left
    to overlap); otherwise left out, saying why."""
    if not isinstance(record, dict):
        return _CudaContext.left_out("the package record was not read before the opening")
    if record.get("target") != "cuda":
        return _CudaContext.left_out("not a CUDA package")
    if "torch" in sys.modules:
        return _CudaContext.left_out("torch was imported before the start")
    return _CudaContext().begin()


class _Call(threading.Thread):
    """A function called in a thread of its own; its exception is raised by :meth:`result`."""

    def __init__(self, fn, *args):
        super().__init__(name=f"laya-runtime {fn.__name__}", daemon=True)
        self.fn, self.args = fn, args
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.fn(*self.args)
        except BaseException as exc:
            self.error = exc

    def result(self) -> None:
        self.join()
        if self.error is not None:
            raise self.error


MAX_JSON_BYTES = 16 << 20  # as the opening reads them


def _identity(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _json(path: Path) -> dict | None:
    """A small JSON object of a release, only to find the package to hash, or None when it
    cannot be read so (a link, too large, not a JSON object...): the opening then reads it
    itself, checked, and says what is wrong."""
    try:
        if path.is_symlink():
            return None
        with open(path, "rb") as fh:
            raw = fh.read(MAX_JSON_BYTES + 1)
        doc = json.loads(raw) if len(raw) <= MAX_JSON_BYTES else None
    except Exception:  # noqa: BLE001  (nothing here decides; the opening reads and checks it)
        return None
    return doc if isinstance(doc, dict) else None


def _package_of(record: dict | None, program: str) -> str | None:
    """The package path a package record names for ``program`` (None: it names none)."""
    try:
        entry = next(p for p in record["programs"] if p.get("name") == program)
        path = entry["package"]["path"]
    except Exception:  # noqa: BLE001  (the opening reads the record again, checked)
        return None
    return path if isinstance(path, str) else None


def _import(names) -> float:
    start = time.perf_counter()
    import torch  # noqa: F401

    preload_all(names)
    return time.perf_counter() - start


def _digests(hashed: _Hash | None, wait_from: float) -> tuple[dict, float]:
    """The digest the hashing thread took (path -> sha256), and how long since ``wait_from`` it
    took to finish.  Empty (the opening then hashes the file itself) when the thread could not
    read the file, or when the file is no longer the one it hashed (another inode, size or
    modification time: replaced or rewritten since)."""
    prehashed = {}
    if hashed is not None:
        hashed.join()
        try:
            same = hashed.identity is not None and _identity(os.stat(hashed.path)) == hashed.identity
        except OSError:
            same = False
        if hashed.digest is not None and same:
            prehashed[hashed.path] = hashed.digest
    return prehashed, time.perf_counter() - wait_from


def _finish(runner, started: float, hashed: _Hash | None, import_s: float, opened: float, waited: float, context):
    open_s, total_s = time.perf_counter() - opened, time.perf_counter() - started
    context.finished()  # done long before, beside torch's import
    runner.start_timings = {
        "hash_s": round(hashed.seconds, 4) if hashed else None,
        "import_s": round(import_s, 4),
        "hash_wait_s": round(waited, 4),
        "open_s": round(open_s, 4),
        "total_s": round(total_s, 4),
        "hash_started_before_torch": bool(hashed and not hashed.torch_imported_at_start),
        "cuda_context_s": round(context.seconds, 4) if context.seconds is not None else None,
        "cuda_context": context.outcome,
    }
    return runner


def start_release(
    release_dir,
    build: str,
    *,
    buckets=None,
    program: str = "decision",
    capture="background",
    capture_warmup: int | None = None,
    trusted_keys=None,
    loader: str | None = None,
):
    """The runner of a released build, opened as :func:`~laya_build.runtime.serving.open_release`
    opens it (same checks, same arguments), with the package hashed while torch imports and the
    graphs captured behind the first answers (module docstring)."""
    started = time.perf_counter()
    vdir = Path(release_dir).resolve()
    manifest = _json(vdir / MANIFEST_NAME)
    listed = {}
    if isinstance(manifest, dict) and isinstance(manifest.get("files"), list):
        listed = {f.get("path"): f.get("sha256") for f in manifest["files"] if isinstance(f, dict)}
    record = _json(vdir / package_record_path(build))
    package = _package_of(record, program)
    context = _cuda_context(record)
    hashed = None
    if package is not None:
        rel = f"aoti_package/{build}/{package}"
        if rel in listed and (vdir / rel).is_file() and not (vdir / rel).is_symlink():
            hashed = _Hash(vdir / rel)
            hashed.start()
    signature = None
    keys_given = trusted_keys
    if trusted_keys is None or trusted_keys:
        signature = _Call(_check_signature, vdir, trusted_keys)
        signature.start()
    import_s = _import(())  # the release's preload: by the opening, from its checked configuration
    from laya_build.runtime import serving

    wait_from = time.perf_counter()
    if signature is not None:
        signature.result()
        keys_given = []  # checked above
    prehashed, waited = _digests(hashed, wait_from)
    opened = time.perf_counter()
    runner = serving.open_release(
        vdir,
        build,
        buckets=buckets,
        program=program,
        capture=capture,
        capture_warmup=serving.CAPTURE_WARMUP if capture_warmup is None else capture_warmup,
        trusted_keys=keys_given,
        prehashed=prehashed,
        loader=loader,
    )
    return _finish(runner, started, hashed, import_s, opened, waited, context)


def _check_signature(vdir: Path, trusted_keys) -> None:
    """The release's files and signature against the trusted keys (``None``: those of
    ``LAYA_BUILD_TRUSTED_KEYS``), as :func:`~laya_build.runtime.serving.open_release` checks them."""
    import os

    from laya_build.release import check_files, signing

    environ = os.environ if trusted_keys is None else {}
    keys = signing.trusted_keys({"keys": [str(k) for k in trusted_keys or []]}, Path.cwd(), environ)
    if keys:
        check_files(vdir)
        signing.check(vdir, keys)


def start_build(
    package_record_path,
    *,
    buckets=(),
    program: str = "decision",
    preload=(),
    capture="background",
    loader: str | None = None,
):
    """The runner of a build folder's package, opened as
    :func:`~laya_build.runtime.serving.open_build` opens it, with the package hashed while torch
    imports and the graphs captured behind the first answers."""
    started = time.perf_counter()
    record_path = Path(package_record_path)
    record = _json(record_path)
    package = _package_of(record, program)
    context = _cuda_context(record)
    hashed = None
    if package is not None and (record_path.parent / package).is_file():
        hashed = _Hash(record_path.parent / package)
        hashed.start()
    import_s = _import(preload)
    from laya_build.runtime import serving

    prehashed, waited = _digests(hashed, time.perf_counter())
    opened = time.perf_counter()
    runner = serving.open_build(
        record_path,
        buckets=buckets,
        program=program,
        preload=preload,
        capture=capture,
        prehashed=prehashed,
        loader=loader,
    )
    return _finish(runner, started, hashed, import_s, opened, waited, context)
