"""laya_build.runtime.start: a fresh serving process hashes the package while torch imports,
then opens it exactly as open_build / open_release do (every check before the load), and the
same answers come out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from laya_build import PROJECT_ROOT
from laya_build.errors import PackageIntegrityError, UnknownSignerError
from laya_build.records import read_record
from laya_build.runtime import serving as runtime
from laya_build.runtime.start import start_build, start_release

BUCKETS = [{"rows": 1, "tokens": 32, "slots": 2}, {"rows": 4, "tokens": 128}]
SIGNED = PROJECT_ROOT / "tests" / "fixtures" / "releases" / "2026-12-01-81569e4"
SIGNER = PROJECT_ROOT / "tests" / "fixtures" / "releases" / "keys" / "fixture-signer.pub"


def _answers(runner, inputs):
    out = []
    for batch in inputs["batches"]:
        out.append(runner(*(batch[k] for k in inputs["arg_names"])))
    return out


def test_a_started_build_answers_as_an_opened_one(build):
    inputs = torch.load(build.inputs, weights_only=True)
    started = start_build(build.package_record("float32"), buckets=BUCKETS)
    opened = runtime.open_build(build.package_record("float32"), buckets=BUCKETS, loader="aoti_load_package")
    for (d1, a1), (d2, a2) in zip(_answers(started, inputs), _answers(opened, inputs)):
        assert torch.equal(d1, d2) and torch.equal(a1, a2)
    timings = started.start_timings
    assert timings["hash_s"] > 0 and timings["open_s"] > 0
    assert started.package.sha256 == read_record(build.package_record("float32"))["programs"][0]["package"]["sha256"]
    assert started.capture_state() == {"capture": "none", "captured": [], "pending": [], "errors": {}, "stopped": None}
    assert (
        started.package.loader == runtime.fastest_loader() == "direct" and opened.package.loader == "aoti_load_package"
    )
    # opened without naming a loader: the runtime's own, the one verify checks packages with
    assert runtime.open_build(build.package_record("float32"), buckets=BUCKETS).package.loader == "direct"


def test_a_started_build_refuses_a_tampered_package_before_loading(build, tmp_path):
    pkg_dir = shutil.copytree(build.package_dir("float32"), tmp_path / "pkg")
    package = pkg_dir / "decision.pt2"
    data = bytearray(package.read_bytes())
    data[len(data) // 2] ^= 0x01
    package.write_bytes(bytes(data))
    with pytest.raises(PackageIntegrityError, match=r"decision\.pt2: sha256 \w+ does not match the package record's"):
        start_build(pkg_dir / "aoti_package.json", buckets=BUCKETS)


def test_in_a_fresh_process_the_hash_starts_before_torch_is_imported(build):
    code = (
        "import json, sys\n"
        "from laya_build.runtime.start import start_build\n"
        "assert 'torch' not in sys.modules, 'importing the start module imported torch'\n"
        f"runner = start_build({str(build.package_record('float32'))!r})\n"
        "print(json.dumps(runner.start_timings))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    timings = json.loads(run.stdout.strip().splitlines()[-1])
    assert timings["hash_started_before_torch"] is True
    assert timings["import_s"] > 0 and timings["total_s"] >= timings["import_s"]
    assert timings["cuda_context"] == "not made here: not a CUDA package"


def _signed_copy(tmp_path) -> Path:
    return Path(shutil.copytree(SIGNED, tmp_path / SIGNED.name))


def test_a_started_release_is_checked_like_an_opened_one(tmp_path):
    copy = _signed_copy(tmp_path)
    try:
        started = start_release(copy, "cpu-float32", trusted_keys=[SIGNER])
    except runtime.PackageIsaError as exc:
        pytest.skip(f"the fixture's package needs CPU vector instructions this CPU lacks: {exc}")
    opened = runtime.open_release(copy, "cpu-float32", trusted_keys=[SIGNER])
    assert started.buckets == opened.buckets and started.package.sha256 == opened.package.sha256
    with pytest.raises(UnknownSignerError):
        start_release(copy, "cpu-float32", trusted_keys=[_another_key(tmp_path)])
    package = copy / "aoti_package" / "cpu-float32" / "decision.pt2"
    package.write_bytes(package.read_bytes() + b"\0")
    with pytest.raises(PackageIntegrityError, match=r"does not match the release manifest's"):
        start_release(copy, "cpu-float32", trusted_keys=[])


def _another_key(tmp_path) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    path = tmp_path / "stranger.pub"
    path.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return path


def test_an_unknown_capture_mode_is_refused(build):
    package = runtime.load_package(
        build.package_dir("float32") / "decision.pt2",
        read_record(build.package_record("float32"))["programs"][0]["package"]["sha256"],
    )
    record = read_record(build.package_record("float32"))
    with pytest.raises(ValueError, match=r"capture must be one of None, True, False, 'background', got 'later'"):
        runtime.DecisionRunner(package, dims=record["dims"], buckets=BUCKETS, capture="later")


def test_a_digest_is_used_only_for_the_bytes_it_was_taken_of(tmp_path):
    """A package replaced or rewritten after its hash was taken is hashed again by the opening."""
    import os
    import time

    from laya_build.runtime import start

    path = tmp_path / "decision.pt2"
    path.write_bytes(b"a" * 4096)
    hashed = start._Hash(path)
    hashed.start()
    kept, _ = start._digests(hashed, time.perf_counter())
    assert kept == {path: hashed.digest}
    other = tmp_path / "other.pt2"
    other.write_bytes(b"b" * 4096)
    os.replace(other, path)  # same size, another inode
    assert start._digests(hashed, time.perf_counter())[0] == {}
    hashed = start._Hash(path)
    hashed.start()
    hashed.join()
    with open(path, "r+b") as fh:  # rewritten in place
        fh.write(b"c")
    os.utime(path, ns=(0, 0))
    assert start._digests(hashed, time.perf_counter())[0] == {}


def test_a_malformed_or_linked_record_is_left_to_the_opening(build, tmp_path):
    pkg_dir = shutil.copytree(build.package_dir("float32"), tmp_path / "pkg")
    record = pkg_dir / "aoti_package.json"
    doc = json.loads(record.read_text())
    doc["programs"] = [{"name": "decision"}]  # no package
    record.write_text(json.dumps(doc))
    with pytest.raises(PackageIntegrityError, match=r"program 'decision' names no package \(path and sha256\)"):
        start_build(record)
    linked = tmp_path / "linked.json"
    linked.symlink_to("/dev/zero")
    from laya_build.runtime import start

    assert start._json(linked) is None


FAKE_DRIVER = r"""
#include <stdlib.h>
static int calls = 0;
int cuInit(unsigned flags) { calls += 1; return flags == 0 ? 0 : 1; }
int cuDeviceGet(int *device, int ordinal) { calls += 10; *device = ordinal + 7; return 0; }
int cuDevicePrimaryCtxRetain(void **context, int device) {
    calls += 100;
    const char *status = getenv("FAKE_CUDA_RETAIN_STATUS");
    if (device != 7) return 101;  /* CUDA_ERROR_INVALID_DEVICE: not the device cuDeviceGet gave */
    *context = (void *)0x1;
    return status ? atoi(status) : 0;
}
int fake_calls(void) { return calls; }
"""


def _fake_driver(tmp_path) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the stand-in CUDA driver with")
    source = tmp_path / "fake_cuda.c"
    source.write_text(FAKE_DRIVER)
    library = tmp_path / "libfakecuda.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


def test_the_primary_context_is_made_through_the_driver_in_order(tmp_path, monkeypatch):
    """The three driver calls, in order, with the device the driver handed back; an error
    status names the call that returned it; no driver is an outcome, not an exception."""
    import ctypes

    from laya_build.runtime import start

    library = _fake_driver(tmp_path)
    made = start._CudaContext(str(library))
    made.start()
    made.join()
    assert made.outcome == "made" and made.seconds > 0
    assert ctypes.CDLL(str(library)).fake_calls() == 111
    monkeypatch.setenv("FAKE_CUDA_RETAIN_STATUS", "2")
    refused = start._CudaContext(str(library))
    refused.run()
    assert refused.outcome == "cuDevicePrimaryCtxRetain returned CUDA error 2"
    missing = start._CudaContext(str(tmp_path / "libnone.so"))
    missing.run()
    assert missing.outcome.startswith("no CUDA driver: ") and "libnone.so" in missing.outcome


def test_only_a_cuda_package_before_torch_starts_the_cuda_context(build, monkeypatch):
    """A CPU package, a record not read, or torch already imported (the caller may have chosen
    another device): no thread, and the timings say why.  A CUDA package in a process without
    torch starts one, with lazy module loading asked for before its cuInit, as torch asks."""
    from laya_build.runtime import start

    assert start._cuda_context({"target": "cpu"}).outcome == "not made here: not a CUDA package"
    assert start._cuda_context(None).outcome == "not made here: the package record was not read before the opening"
    assert start._cuda_context({"target": "cuda"}).outcome == "not made here: torch was imported before the start"
    seen = []
    monkeypatch.setattr(start._CudaContext, "run", lambda self: seen.append(self.library))
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    with monkeypatch.context() as without_torch:
        without_torch.delitem(sys.modules, "torch")
        context = start._cuda_context({"target": "cuda"})
    assert context.finished().started and seen == ["libcuda.so.1"]
    assert os.environ["CUDA_MODULE_LOADING"] == "LAZY"
    runner = start_build(build.package_record("float32"))
    assert runner.start_timings["cuda_context"] == "not made here: not a CUDA package"
    assert runner.start_timings["cuda_context_s"] is None and seen == ["libcuda.so.1"]
