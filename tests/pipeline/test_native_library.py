"""The project's native op library (``export.native_linears``): built by the export, shipped
beside the package and in the release, checked and loaded before the package by every process
that loads it, refused when it is not the recorded bytes.

One small pipeline with two encoder linear layers through ``laya_native::linear`` on the CPU,
built and released by ``doit release`` as a release engineer runs it; the processes that open
the package are fresh interpreters, as a serving process is.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from laya_build.errors import ConfigError
from laya_build.layout import NATIVE_LIBRARY_NAME
from laya_build.model import native_linear
from laya_build.records import read_record, sha256_file
from tests.pipeline.project import ROOT, Project, small_pipeline

pytestmark = pytest.mark.build(seconds=240)

LAYERS = ["attn.Wqkv", "mlp.Wo"]  # mlp.Wi: through laya_native::geglu_linear (export.native_geglu)
ENCODER_LAYERS = 2  # the generated model's (laya_build/model/defaults.yaml)
BUILD = "cpu-float32"
LIBRARY_REL = f"aoti_package/{BUILD}/{NATIVE_LIBRARY_NAME}"


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("no C++ compiler: the native op library cannot be built here")
    project = Project(tmp_path_factory.mktemp("native"))

    def edit(cfg):
        small_pipeline(cfg)
        cfg["export"]["native_linears"] = {"cpu": LAYERS}
        cfg["export"]["native_residual"] = {"cpu": True}
        cfg["export"]["native_geglu"] = {"cpu": True, "cuda": True}
        cfg["export"]["native_cutlass"] = {"cpu": ["mlp.Wo"]}

    project.edit_config(edit)
    project.commit("encoder linear layers and the MLP's gated GELU through the native ops, the residual add in mlp.Wo")
    run = project.doit("release")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return project


def python(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``python *args`` in a fresh interpreter from the project root, offline; with ``check`` it
    must exit 0."""
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0 or not check, proc.stdout + proc.stderr
    return proc


def fresh(code: str, *args: str) -> dict:
    """Run ``code`` in a fresh interpreter (as a serving process starts); its last stdout line, as JSON."""
    return json.loads(python("-c", textwrap.dedent(code), *args).stdout.strip().splitlines()[-1])


OPEN = """
    import json, sys, torch
    from laya_build.runtime import serving
    from laya_build.runtime.formats import batch_args
    from laya_build.model.inputs import load_inputs

    def registered():
        try:
            torch.ops.laya_native.linear
            return True
        except (AttributeError, RuntimeError):
            return False

    out = {}
    try:
        runner = {open}
        inputs = load_inputs(sys.argv[2])
        decision, act = runner(*batch_args(inputs["batches"][0], inputs["arg_names"], "cpu"))
        out["answer"] = [list(decision.shape), list(act.shape)]
    except Exception as exc:
        out["error"] = type(exc).__name__
        out["message"] = str(exc)
    out["op_registered"] = registered()
    print(json.dumps(out))
"""


LOADED = """
    import json, sys, torch
    from laya_build.runtime import serving
    serving.load_library(sys.argv[1], sys.argv[2])
    ep = torch.export.load(sys.argv[3])
"""


def in_export(released, code: str, *args: str) -> dict:
    """``code`` in a fresh interpreter with the released library loaded and its export as ``ep``
    (``sys.argv[4:]``: ``args``)."""
    vdir = released.version_dir()
    library = vdir / LIBRARY_REL
    exported = vdir / f"export/{BUILD}/exported.pt2"
    code = textwrap.dedent(LOADED) + textwrap.dedent(code)
    return fresh(code, str(library), sha256_file(library), str(exported), *args)


def _open(how: str, where: Path, inputs: Path) -> dict:
    return fresh(OPEN.replace("{open}", how), str(where), str(inputs))


def test_the_release_lists_the_library_its_package_record_names(released):
    vdir = released.version_dir()
    manifest = read_record(vdir / "manifest.json")
    listed = {f["path"]: f for f in manifest["files"]}
    package = read_record(vdir / f"aoti_package/{BUILD}/aoti_package.json")
    export = read_record(vdir / f"export/{BUILD}/export.json")
    assert package["native_library"]["path"] == NATIVE_LIBRARY_NAME
    assert listed[LIBRARY_REL]["sha256"] == package["native_library"]["sha256"] == sha256_file(vdir / LIBRARY_REL)
    assert export["native_library"]["sha256"] == package["native_library"]["sha256"]
    assert export["native_library"]["source"]["sha256"] == sha256_file(ROOT / "laya_build/native/laya_native.cpp")
    assert export["native_linears"] == LAYERS
    text = (vdir / f"export/{BUILD}/exported.pt2").read_bytes()
    assert b"laya_native.linear" in text, "the exported program calls the native op"
    assert export["native_residual"] is True
    assert [p["residual_adds"] for p in export["programs"]] == [ENCODER_LAYERS]  # each layer's mlp.Wo


def test_each_mlp_calls_the_geglu_op_with_its_first_gemms_rows_interleaved(released):
    """The released export calls ``laya_native::geglu_linear`` once an encoder layer and holds
    each ``Wi`` with its rows interleaved: the checkpoint's rows, input and gate in turn."""
    vdir = released.version_dir()
    got = in_export(
        released,
        """
        from safetensors.torch import load_file
        from laya_build.model.native_geglu import interleave
        op = torch.ops.laya_native.geglu_linear.default
        calls = [n for n in ep.graph.nodes if n.target is op]
        weights = load_file(sys.argv[4])
        state = ep.state_dict
        same = []
        for name, tensor in weights.items():
            if name.endswith("mlp.Wi.weight"):
                exported = next(v for k, v in state.items() if k.endswith(name.removeprefix("encoder.")))
                same.append(torch.equal(exported, interleave(tensor.to(exported.dtype))))
        print(json.dumps({"calls": len(calls), "interleaved": same, "configs": [list(n.args[3]) for n in calls]}))
        """,
        str(vdir / "model/checkpoint/model.safetensors"),
    )
    from laya_build.config.sections import section

    assert got["calls"] == ENCODER_LAYERS, got
    assert got["interleaved"] == [True] * ENCODER_LAYERS, got
    assert got["configs"] == [section("export", None)["cutlass_configs"]["geglu"]] * ENCODER_LAYERS
    export = read_record(vdir / f"export/{BUILD}/export.json")
    assert export["cutlass_configs"]["geglu"] == got["configs"][0]
    assert export["cutlass_configs"]["names"] == {}, "a CPU library holds no CUDA kernels to name"
    assert export["native_geglu"] is True
    assert "cuda_source" not in export["native_library"], "a CPU export's library holds no CUDA kernels"


def test_the_cuda_export_depends_on_the_cuda_kernels_source_and_the_cpu_one_does_not(released):
    graph = released.graph()
    cuda = graph["export:cuda-bfloat16"]["file_dep"]
    cpu = graph[f"export:{BUILD}"]["file_dep"]
    assert any(p.endswith("laya_build/native/laya_native.cu") for p in cuda), cuda
    assert any(p.endswith("laya_build/native/laya_native.cpp") for p in cuda)
    assert not any(p.endswith(".cu") for p in cpu) and any(p.endswith("laya_native.cpp") for p in cpu), cpu


def test_the_exported_program_adds_each_mlp_residual_inside_the_op(released):
    """In the released export, each encoder layer's last native call takes the residual stream:
    no add reads the output of a native call without one any more, and the program's outputs are the saved eager
    outputs within verify's fp32 thresholds (on the CPU the op adds as torch does)."""
    vdir = released.version_dir()
    got = in_export(
        released,
        """
        from laya_build.runtime.formats import batch_args
        from laya_build.model.inputs import load_inputs
        op = torch.ops.laya_native.linear.default
        calls = [n for n in ep.graph.nodes if n.target is op]
        cutlass = [n.kwargs.get("cutlass") for n in calls]
        plain = [n for n in calls if n.kwargs.get("residual") is None]
        added = [n for n in ep.graph.nodes if n.target is torch.ops.aten.add.Tensor and any(a in plain for a in n.args)]
        eager = torch.load(sys.argv[4], weights_only=False)["outputs"]
        inputs = load_inputs(sys.argv[5])
        same = []
        with torch.inference_mode():
            for batch, want in zip(inputs["batches"], eager):
                out = ep.module()(*batch_args(batch, inputs["arg_names"], "cpu"))
                same.append(max(float((a - want[k]).abs().max()) for a, k in zip(out, ("decision", "act"))))
        print(json.dumps({
            "calls": len(calls),
            "with_residual": sum(n.kwargs.get("residual") is not None for n in calls),
            "adds_of_calls": len(added),
            "cutlass_with_residual": [n.kwargs.get("cutlass") for n in calls if n.kwargs.get("residual") is not None],
            "cutlass": cutlass,
            "same": same,
        }))
        """,
        str(vdir / f"export/{BUILD}/eager.pt"),
        str(vdir / "model/inputs.pt"),
    )
    assert got["calls"] == len(LAYERS) * ENCODER_LAYERS
    assert got["with_residual"] == ENCODER_LAYERS and got["adds_of_calls"] == 0
    # export.native_cutlass: mlp.Wo's calls carry the CUTLASS configurations, also once they take the residual
    linear = read_record(vdir / f"export/{BUILD}/export.json")["cutlass_configs"]["linear"]
    assert linear == [256, -1, -1, 2]  # the default
    assert got["cutlass_with_residual"] == [linear] * ENCODER_LAYERS, got
    assert got["cutlass"].count(None) == ENCODER_LAYERS, "attn.Wqkv's calls stay as they were"
    assert got["same"] and max(got["same"]) <= 1e-5, got


def test_a_fresh_process_opens_the_release_with_its_library(released):
    vdir = released.version_dir()
    got = _open(f"serving.open_release(sys.argv[1], {BUILD!r}, trusted_keys=[])", vdir, vdir / "model/inputs.pt")
    assert "error" not in got, got
    assert got["op_registered"]


def test_verify_of_the_release_passes(released):
    run = released.doit("verify", timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def test_a_tampered_library_is_refused_before_it_is_loaded(released, tmp_path):
    copy = tmp_path / "release"
    shutil.copytree(released.version_dir(), copy)
    library = copy / LIBRARY_REL
    data = bytearray(library.read_bytes())
    data[len(data) // 2] ^= 0xFF
    library.write_bytes(bytes(data))
    got = _open(f"serving.open_release(sys.argv[1], {BUILD!r}, trusted_keys=[])", copy, copy / "model/inputs.pt")
    assert got["error"] == "PackageIntegrityError", got
    assert str(library) in got["message"] and "release manifest" in got["message"]
    assert not got["op_registered"], "nothing of the library may be loaded"
    record = copy / f"aoti_package/{BUILD}/aoti_package.json"
    got = _open("serving.open_build(sys.argv[1])", record, copy / "model/inputs.pt")
    assert got["error"] == "PackageIntegrityError" and "package record" in got["message"], got
    assert not got["op_registered"]


def test_a_missing_library_is_named(released, tmp_path):
    build = tmp_path / "build"
    shutil.copytree(released.version_dir() / f"aoti_package/{BUILD}", build)
    (build / NATIVE_LIBRARY_NAME).unlink()
    inputs = released.version_dir() / "model/inputs.pt"
    got = _open("serving.open_build(sys.argv[1])", build / "aoti_package.json", inputs)
    assert got["error"] == "PackageIntegrityError", got
    assert "missing" in got["message"] and NATIVE_LIBRARY_NAME in got["message"]


def test_loading_the_package_without_its_library_says_what_it_needs(released):
    vdir = released.version_dir()
    record = vdir / f"aoti_package/{BUILD}/aoti_package.json"
    entry = read_record(record)["programs"][0]["package"]
    how = f"serving.DecisionRunner(serving.load_package(sys.argv[1], {entry['sha256']!r}), dims={{}})"
    got = _open(how, record.parent / entry["path"], vdir / "model/inputs.pt")
    assert got["error"] == "NativeLibraryError", got
    assert "native_library" in got["message"]


def test_another_build_of_the_library_in_the_process_is_refused(released, tmp_path):
    """A process holds one kernel per op: a package whose library is other bytes than the one
    already loaded is refused, not served by the other build's kernels."""
    vdir = released.version_dir()
    other = tmp_path / NATIVE_LIBRARY_NAME
    other.write_bytes((vdir / LIBRARY_REL).read_bytes() + b"\0" * 16)  # other bytes, the same ELF
    how = f"(serving.load_library({str(other)!r}, {sha256_file(other)!r}), serving.open_build(sys.argv[1]))[1]"
    got = _open(how, vdir / f"aoti_package/{BUILD}/aoti_package.json", vdir / "model/inputs.pt")
    assert got["error"] == "NativeLibraryError", got
    assert "another build" in got["message"]


def test_a_library_loaded_outside_the_runtime_is_named(released, tmp_path):
    vdir = released.version_dir()
    other = tmp_path / "elsewhere.so"
    shutil.copy2(vdir / LIBRARY_REL, other)
    how = f"(torch.ops.load_library({str(other)!r}), serving.open_build(sys.argv[1]))[1]"
    got = _open(how, vdir / f"aoti_package/{BUILD}/aoti_package.json", vdir / "model/inputs.pt")
    assert got["error"] == "NativeLibraryError", got
    assert "outside laya_build.runtime" in got["message"]


def test_the_op_on_the_cpu_is_linear_bit_for_bit(released):
    library = released.version_dir() / LIBRARY_REL
    got = fresh(
        """
        import json, sys, torch
        from laya_build.runtime import serving
        serving.load_library(sys.argv[1], sys.argv[2])
        torch.manual_seed(0)
        same = []
        for dtype in (torch.float32, torch.bfloat16):
            x, w, b = torch.randn(2, 5, 16, dtype=dtype), torch.randn(24, 16, dtype=dtype), torch.randn(24, dtype=dtype)
            for bias in (None, b):
                out = torch.ops.laya_native.linear(x, w, bias, [130100, 128, *range(8)])
                same.append(torch.equal(out, torch.nn.functional.linear(x, w, bias)))
        try:  # the argument's form is checked on the CPU as on CUDA
            torch.ops.laya_native.linear(x, w, None, [128, *range(8)])
            refused = None
        except RuntimeError as exc:
            refused = str(exc).splitlines()[0]
        try:  # the CUTLASS configurations' form too; on the CPU they change nothing
            torch.ops.laya_native.linear(x, w, None, None, cutlass=[-1])
            refused_cutlass = None
        except RuntimeError as exc:
            refused_cutlass = str(exc).splitlines()[0]
        same.append(torch.equal(torch.ops.laya_native.linear(x, w, b, None, cutlass=[256, -1, -1, 0]),
                                torch.nn.functional.linear(x, w, b)))
        empty = torch.ops.laya_native.linear(torch.ones(2, 0), torch.ones(3, 0), torch.ones(3), None)
        r = torch.randn(2, 5, 24, dtype=x.dtype)
        added = torch.ops.laya_native.linear(x, w, b, None, residual=r)
        same.append(torch.equal(added, torch.nn.functional.linear(x, w, b) + r))
        try:  # a residual is added as it is: no broadcasting
            torch.ops.laya_native.linear(x, w, b, None, residual=r[:, :1])
            broadcast = None
        except RuntimeError as exc:
            broadcast = str(exc).splitlines()[0]
        print(json.dumps({"same": same, "refused": refused, "empty": empty.tolist(), "broadcast": broadcast,
                          "refused_cutlass": refused_cutlass}))
        """,
        str(library),
        sha256_file(library),
    )
    assert got["same"] == [True] * 6
    assert "not a cuBLASLt version and groups of 9" in got["refused"]
    assert "cutlass holds 1 integers, not groups of 2" in got["refused_cutlass"]
    assert "residual [2, 1, 24] BFloat16 is not the output's shape [2, 5, 24]" in got["broadcast"]
    assert got["empty"] == [[1.0] * 3] * 2  # K = 0: the bias alone, as F.linear


def test_the_library_is_the_same_bytes_built_from_another_checkout(released, tmp_path, monkeypatch):
    """No path of the checkout or the environment is in the library: another folder, the same bytes."""
    from laya_build import native

    elsewhere = tmp_path / "checkout" / "laya_build" / "native"
    elsewhere.mkdir(parents=True)
    shutil.copy2(native.SOURCE, elsewhere / native.SOURCE.name)
    monkeypatch.setattr(native, "SOURCE", elsewhere / native.SOURCE.name)
    record = native.build(tmp_path / "out")
    assert record["sha256"] == sha256_file(released.version_dir() / LIBRARY_REL)
    assert (tmp_path / "out" / "native_build.log").is_file()
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]


def test_a_change_to_the_library_source_rebuilds_the_export(released):
    status = released.status()
    assert status[f"export:{BUILD}"] == "U", status
    source = released.path / "laya_build/native/laya_native.cpp"
    original = source.read_bytes()
    try:
        source.write_bytes(original + b"// a comment\n")
        status = released.status()
        assert status[f"export:{BUILD}"] == "R", status
    finally:
        source.write_bytes(original)


def test_another_compiler_reruns_an_export_that_builds_the_library(released, tmp_path):
    """The export names the C++ compiler among its tools only when it builds the library (an
    export without native layers does not re-run for a compiler: tests/small_build)."""
    fake = tmp_path / "bin" / "g++"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'g++ (Fake) 99.1.0'\n")
    fake.chmod(0o755)
    status = released.status(env={"PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"})
    assert status[f"export:{BUILD}"] == "R", status


# ---------------------------------------------------------------------- the algorithms file


def _algorithms(tmp_path, entries, fmt=native_linear.ALGORITHMS_FORMAT, version=130100) -> Path:
    path = tmp_path / "algorithms.json"
    path.write_text(json.dumps({"format": fmt, "cublaslt_version": version, "entries": entries}))
    return path


WORDS = [f"0x{i:016x}" for i in range(7)] + ["0xffffffffffffffff"]


def entry(**over):
    return {"n": 1024, "k": 2624, "dtype": "bfloat16", "bias": False, "m_max": 128, "algorithm": WORDS, **over}


def test_algorithms_become_the_op_argument_smallest_bound_first(tmp_path):
    entries = native_linear.read_algorithms(
        _algorithms(tmp_path, [entry(m_max=None), entry(m_max=128), entry(n=3072, k=1024)]), "key"
    )
    arg = native_linear.algorithm_argument(entries, 1024, 2624, "bfloat16", False)
    assert arg == [130100, 128, 0, 1, 2, 3, 4, 5, 6, -1, -1, 0, 1, 2, 3, 4, 5, 6, -1]
    assert native_linear.algorithm_argument(entries, 1024, 2624, "bfloat16", True) == []  # no entry: the heuristic
    with pytest.raises(ConfigError, match="same m_max"):
        native_linear.algorithm_argument(entries + [entry()], 1024, 2624, "bfloat16", False)


@pytest.mark.parametrize(
    "entries, fmt, says",
    [
        ([entry()], "another format", "format is not"),
        ([entry(n=0)], None, r"entries\[0\] needs n"),
        ([entry(), entry(dtype="float32")], None, r"entries\[1\] needs dtype"),
        ([entry(m_max=0)], None, "m_max"),
        ([entry(algorithm=WORDS[:7])], None, "8 words"),
        ([entry(algorithm=[w.upper() for w in WORDS])], None, "8 words"),
        ([entry(bias="no")], None, "bias"),
        ([entry()], None, "version"),
    ],
)
def test_a_bad_algorithms_file_names_the_entry(tmp_path, entries, fmt, says):
    path = _algorithms(tmp_path, entries, fmt or native_linear.ALGORITHMS_FORMAT, version=0 if says == "version" else 1)
    with pytest.raises(ConfigError, match=says) as caught:
        native_linear.read_algorithms(path, "export.native_algorithms.cuda-bfloat16")
    assert str(path) in str(caught.value) and "cublaslt_probe.py --write-algorithms" in str(caught.value)


def test_an_algorithms_file_needs_layers_to_run_with(tmp_path):
    from laya_build.stages.export import native_algorithms

    path = _algorithms(tmp_path, [entry()])
    cfg = {"native_linears": {"cuda": []}, "native_algorithms": {"cuda-bfloat16": path.name}}
    with pytest.raises(ConfigError, match="names no layer"):
        native_algorithms(cfg, "cuda", "bfloat16", tmp_path)
    cfg["native_linears"]["cuda"] = ["mlp.Wo"]
    entries, described = native_algorithms(cfg, "cuda", "bfloat16", tmp_path)
    assert described["entries"] == len(entries) == 1 and described["sha256"] == sha256_file(path)
    assert native_algorithms(cfg, "cuda", "float16", tmp_path) == ([], None)
    with pytest.raises(ConfigError, match="does not exist"):
        native_algorithms({**cfg, "native_algorithms": {"cuda-bfloat16": "nowhere.json"}}, "cuda", "bfloat16", tmp_path)


def test_the_probe_writes_the_fastest_algorithm_of_each_gemm_as_a_file_the_export_reads(tmp_path):
    from benchmarks import cublaslt_probe

    def lt(gemm, n, k, m, us, word):
        return {"gemm": gemm, "N": n, "K": k, "M": m, "name": f"lt #{word}", "us": us, "words": [f"0x{word:016x}"] * 8}

    rows = [
        {"gemm": "Wi", "N": 5248, "K": 1024, "M": 128, "name": "cublas", "us": 6.4},
        lt("Wi", 5248, 1024, 128, 6.5, 1),
        lt("Wi", 5248, 1024, 128, 6.1, 2),
        {**lt("Wi", 5248, 1024, 128, 1.0, 3), "us": None, "error": "RuntimeError: ..."},
        lt("Wi", 5248, 1024, 1792, 34.0, 4),
        lt("Wi", 5248, 1024, 1792, 33.1, 5),
        {**lt("Wi", 5248, 1024, 1792, 32.9, 6), "name": "lt search #0"},  # found beyond the heuristic's list
        {**lt("Wi", 5248, 1024, 1792, 30.0, 7), "name": "cublaslt-torch"},  # no algorithm of the probe's own
    ]
    rows[3].pop("us")
    doc = cublaslt_probe.algorithms_file({"rows": rows, "gpu": "NVIDIA H200", "date": "d", "torch": "t"}, 130100)
    path = tmp_path / "algorithms.json"
    path.write_text(json.dumps(doc))
    entries = native_linear.read_algorithms(path, "export.native_algorithms.cuda-bfloat16")
    assert [(e["m_max"], e["algorithm"][0], e["us"]) for e in entries] == [
        (128, f"0x{2:016x}", 6.1),
        (None, f"0x{6:016x}", 32.9),
    ]
    assert entries[0]["cublas_us"] == 6.4 and doc["cublaslt_version"] == 130100
    assert native_linear.algorithm_argument(entries, 5248, 1024, "bfloat16", False) == [
        130100,
        128,
        *[2] * 8,
        -1,
        *[6] * 8,
    ]


def test_the_probe_writes_from_stored_rows_only_algorithms_within_the_workspace_given(tmp_path):
    """--from-rows writes the file of an earlier run's rows without a GPU; --max-workspace keeps out every
    algorithm needing more workspace, whatever its speed; rows that cannot give a file are refused with
    what is missing, and nothing is written."""

    def lt(m, us, word, workspace):
        config = {"workspace": workspace, "id": 66}
        words = [f"0x{word:016x}"] * 8
        return {
            "gemm": "Wi",
            "N": 5248,
            "K": 1024,
            "M": m,
            "name": f"lt #{word}",
            "us": us,
            "words": words,
            "config": config,
        }

    rows = [
        lt(128, 6.0, 1, 4),
        lt(128, 6.2, 2, 0),
        lt(1792, 33.0, 3, 4),
        lt(1792, 35.0, 4, 1 << 20),
        lt(1792, 36.0, 5, 0),
        {**lt(1792, 30.0, 6, 0), "config": {}},  # its workspace unknown: under no limit
    ]
    stored = tmp_path / "probe.json"
    stored.write_text(json.dumps({"rows": rows, "gpu": "NVIDIA H200", "date": "d", "torch": "t"}))

    def write(*args):
        return python("benchmarks/cublaslt_probe.py", "--from-rows", str(stored), *args, check=False)

    chosen = {}
    for limit, version in ((None, "130100"), ("0", "130100"), ("4", "130100")):
        out = tmp_path / f"algorithms-{limit}.json"
        run = write(
            "--write-algorithms",
            str(out),
            "--cublaslt-version",
            version,
            *(["--max-workspace", limit] if limit else []),
        )
        assert run.returncode == 0, run.stderr
        doc = json.loads(out.read_text())
        assert doc["cublaslt_version"] == 130100 and doc.get("max_workspace") == (int(limit) if limit else None)
        entries = native_linear.read_algorithms(out, "export.native_algorithms.cuda-bfloat16")
        chosen[limit] = [(e["m_max"], int(e["algorithm"][0], 16)) for e in entries]
    assert chosen == {None: [(128, 1), (None, 6)], "0": [(128, 2), (None, 5)], "4": [(128, 1), (None, 3)]}

    out = tmp_path / "refused.json"
    run = write("--write-algorithms", str(out))  # the rows do not say which cuBLASLt timed them
    assert run.returncode == 2 and "give --cublaslt-version" in run.stderr and not out.exists()
    stored.write_text(json.dumps({"rows": rows, "cublaslt_version": 130200}))
    run = write("--write-algorithms", str(out), "--cublaslt-version", "130100")
    assert run.returncode == 2 and "timed with cuBLASLt 130200, not 130100" in run.stderr and not out.exists()
    run = write("--write-algorithms", str(out), "--max-workspace", "-1")
    assert run.returncode == 2 and "no algorithm row fits (--max-workspace -1)" in run.stderr and not out.exists()
    stored.write_text("not json")
    run = write("--write-algorithms", str(out), "--cublaslt-version", "130100")
    assert run.returncode == 2 and "not a probe result" in run.stderr and not out.exists()
    run = write()  # nothing to write to
    assert run.returncode == 2 and "give --write-algorithms" in run.stderr


def test_the_probe_search_starts_from_the_fastest_and_tries_other_algorithm_ids_once(monkeypatch):
    """The search loop over a stand-in cuBLASLt: an algorithm is its 8 words, its time the first
    word; each variation is one step away; the other ids come in after the first round."""
    from benchmarks import cublaslt_probe, gemm_probe

    def algo(value):
        out = cublaslt_probe.HeuristicResult()
        out.algo[0] = value
        return out

    class StandIn:
        varied, others = [], 0

        def variations(self, problem, seed):
            self.varied.append(seed.algo[0])
            return [algo(seed.algo[0] - 1), algo(seed.algo[0] + 7)]

        def other_ids(self, problem, known):
            assert known == {66}
            self.others += 1
            return [algo(3), algo(90)]

        def config(self, result):
            return {"id": 66}

    timed = []

    def graphed_ms(torch, calls, min_run_time):
        timed.append(calls)
        return float(calls)

    monkeypatch.setattr(gemm_probe, "graphed_ms", graphed_ms)
    lt = StandIn()
    best, count = cublaslt_probe.search_algorithms(None, lt, None, [algo(20), algo(12)], lambda a: a.algo[0], 3, 2, 60)
    assert [a.algo[0] for a in best] == [1, 2]  # 3 from another id in round 2, then its neighbours
    assert lt.others == 1 and len(timed) == len(set(timed)) == count  # each candidate timed once
    assert lt.varied == [12, 20, 3, 11, 2]  # each round from the two fastest, each varied once
    timed.clear()
    cublaslt_probe.search_algorithms(None, StandIn(), None, [algo(20), algo(12)], lambda a: a.algo[0], 3, 2, 0)
    assert timed == []  # no budget: nothing timed


def test_the_probe_rounds_time_every_row_in_turn_and_keep_the_median():
    from benchmarks import cublaslt_probe

    order, times = [], {"a": [9.0, 5.0, 6.0], "b": [4.0, 7.0, 8.0]}

    def timer(calls):
        order.append(calls)
        if calls == "c":
            raise RuntimeError("illegal address")
        return times[calls].pop(0)

    rows = [{"us": 5.5}, {"us": 4.5}, {"us": 1.0}, {"error": "failed before"}]
    cublaslt_probe.timing_rounds(list(zip(rows, ["a", "b", "c", "d"])), 3, timer)
    assert order == ["a", "b", "c", "a", "b", "a", "b"]  # round-robin; a failed row is not timed again
    assert rows[0] == {"us": 5.75, "us_timings": [5.5, 9.0, 5.0, 6.0]}
    assert rows[1] == {"us": 5.75, "us_timings": [4.5, 4.0, 7.0, 8.0]}
    assert rows[2]["us"] == 1.0 and rows[2]["error"].startswith("RuntimeError: illegal address")
    assert rows[3] == {"error": "failed before"}  # never timed: no rounds


def test_the_library_beside_a_package_is_found_from_its_record(released, tmp_path):
    from laya_build.runtime import serving

    folder = released.version_dir() / f"aoti_package/{BUILD}"
    found = serving.library_beside(folder / "decision.pt2")
    assert found == {"path": folder / NATIVE_LIBRARY_NAME, "sha256": sha256_file(folder / NATIVE_LIBRARY_NAME)}
    assert serving.library_beside(tmp_path / "decision.pt2") is None  # no record beside it


def test_a_residual_add_moves_into_the_op_only_when_it_is_the_outputs_one_plain_add(released):
    """take_residuals' rule on small programs: the add moves when it is the call's only reader,
    unscaled, of a tensor of the output's shape and dtype; a program with nothing to move under
    export.native_residual is refused with what to do."""
    library = released.version_dir() / LIBRARY_REL
    got = fresh(
        """
        import json, sys, torch
        from torch.export import Dim
        from laya_build.runtime import serving
        from laya_build.model import native_linear
        from laya_build.stages.export import moved_residuals
        from laya_build.errors import ConfigError
        serving.load_library(sys.argv[1], sys.argv[2])
        native_linear.register_fake()
        linear = torch.ops.laya_native.linear

        class Program(torch.nn.Module):
            def __init__(self, body):
                super().__init__()
                self.w = torch.nn.Parameter(torch.randn(8, 8))
                self.body = body

            def forward(self, x):
                return self.body(self, x)

        bodies = {
            "moved": lambda m, x: (x + linear(x, m.w, None, None)).relu(),
            "moved, other first and second": lambda m, x: linear(x + linear(x, m.w, None, None), m.w, None, None) + x,
            "moved, cutlass kept": lambda m, x: x + linear(x, m.w, None, None, cutlass=[256, -1, -1, 0]),
            "two readers": lambda m, x: (lambda y: (x + y, y * 2))(linear(x, m.w, None, None)),
            "broadcast": lambda m, x: linear(x, m.w, None, None) + x[:, :1],
            "scaled": lambda m, x: torch.add(x, linear(x, m.w, None, None), alpha=2),
            "other dtype": lambda m, x: linear(x, m.w, None, None) + x.double(),
            "no native call": lambda m, x: x @ m.w.T + x,
        }
        x = torch.randn(2, 32, 8)
        out = {}
        for name, body in bodies.items():
            ep = torch.export.export(Program(body), (x,), dynamic_shapes=({1: 16 * Dim("t", min=2, max=8)},))
            want = ep.module()(x)
            try:
                record = moved_residuals(ep, {"native_residual": {"cpu": True}}, "cpu")
            except ConfigError as exc:
                record = {"error": str(exc)}
            got = ep.module()(x)
            leaves = torch.utils._pytree.tree_leaves
            same = all(torch.equal(a, b) for a, b in zip(leaves(got), leaves(want)))
            kept = [n.kwargs.get("cutlass") for n in ep.graph.nodes if n.kwargs.get("residual") is not None]
            out[name] = {**record, "same": same, **({"cutlass": kept} if any(kept) else {})}
        print(json.dumps(out))
        """,
        str(library),
        sha256_file(library),
    )
    assert got["moved"] == {"residual_adds": 1, "same": True}
    assert got["moved, other first and second"] == {"residual_adds": 2, "same": True}
    assert got["moved, cutlass kept"] == {"residual_adds": 1, "same": True, "cutlass": [[256, -1, -1, 0]]}
    refused = "export.native_residual.cpu is true and no residual add follows a call of the native op"
    for name in ("two readers", "broadcast", "scaled", "other dtype", "no native call"):
        assert got[name]["same"] and got[name]["error"].startswith(refused), (name, got[name])
        assert "name the layers that end a branch (attn.Wo, mlp.Wo) in export.native_linears.cpu" in got[name]["error"]


def test_the_mlps_first_gemm_named_for_both_native_ops_is_refused_before_anything_is_written(released, tmp_path):
    from tests.stage_calls import run_export

    vdir = released.version_dir()
    cfg = {**released.config["export"], "native_linears": {"cpu": ["mlp.Wi"]}, "native_geglu": {"cpu": True}}
    with pytest.raises(ConfigError, match="native_geglu.cpu is true and export.native_linears.cpu names mlp.Wi") as e:
        run_export(cfg, vdir / "model/checkpoint", vdir / "model/inputs.pt", tmp_path / "e", "cpu", "float32")
    assert "drop mlp.Wi from export.native_linears.cpu" in e.value.hint
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize(
    ("cutlass", "dtype", "zero_bias", "says"),
    [
        (["attn.Wo"], torch.bfloat16, [], "names 'attn.Wo', which export.native_linears.cuda does not"),
        (["mlp.Wo"], torch.float16, [], "kernels are bfloat16 and this export is float16"),
        (["mlp.Wo"], torch.bfloat16, ["mlp.Wo"], "add no bias and mlp.Wo has one"),
    ],
)
def test_a_cutlass_layer_the_kernels_cannot_run_is_refused_before_the_library_is_built(cutlass, dtype, zero_bias, says):
    from types import SimpleNamespace

    layer = SimpleNamespace(get_submodule=lambda name: SimpleNamespace(bias=None))
    model = SimpleNamespace(
        encoder=SimpleNamespace(
            embeddings=SimpleNamespace(tok_embeddings=SimpleNamespace(weight=torch.zeros(1, dtype=dtype))),
            layers=[layer, layer],
        )
    )
    with pytest.raises(ValueError, match=re.escape(says)):
        native_linear.check_cutlass(model, ["mlp.Wo"], cutlass, "cuda", zero_bias)
    native_linear.check_cutlass(model, ["mlp.Wo"], ["mlp.Wo"], "cpu", zero_bias)  # the CPU runs at::linear


def test_another_cutlass_reruns_the_cuda_export_that_compiles_the_kernels_and_no_other(released, tmp_path):
    """The CUDA kernels' headers are part of the CUDA export's up-to-date check (its CUTLASS
    version): another CUTLASS, here through CUTLASS_PATH, builds that export again; the CPU
    export, which compiles no CUDA, stays as it is."""
    other = tmp_path / "cutlass" / "include" / "cutlass"
    (other / "gemm" / "collective").mkdir(parents=True)
    (other / "gemm" / "collective" / "collective_builder.hpp").write_text("// stand-in\n")
    (other / "version.h").write_text("#define CUTLASS_MAJOR 3\n#define CUTLASS_MINOR 9\n#define CUTLASS_PATCH 2\n")
    status = released.status(env={"CUTLASS_PATH": str(tmp_path / "cutlass")})
    assert status["export:cuda-bfloat16"] == "R", status
    assert status[f"export:{BUILD}"] == "U", status
    assert released.status()["export:cuda-bfloat16"] == "U", "the same CUTLASS: up to date"


def test_packages_shipping_different_library_builds_are_timed_side_by_side_each_in_its_own_process(released, tmp_path):
    """``benchmarks/package_latency.py`` over two packages whose records name different builds of
    the native op library (a process can hold only one): each is loaded and timed in a process of
    its own, both answer, and their outputs are compared."""
    vdir = released.version_dir()
    folder = vdir / f"aoti_package/{BUILD}"
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    library = other / NATIVE_LIBRARY_NAME
    library.write_bytes(library.read_bytes() + b"\0" * 16)  # other bytes, the same ELF
    record_path = other / "aoti_package.json"
    record = json.loads(record_path.read_text())
    record["native_library"]["sha256"] = sha256_file(library)
    record_path.write_text(json.dumps(record))
    out = tmp_path / "latency.json"
    python(
        str(ROOT / "benchmarks/package_latency.py"),
        str(vdir / f"export/{BUILD}"),
        str(vdir / "model/inputs.pt"),
        f"released={folder / 'decision.pt2'}",
        f"other={other / 'decision.pt2'}",
        "--shapes=1x32x2,2x64x2",
        "--rounds=2",
        '--timing={"warmup": 1, "min_run_time_s": 0.01}',
        "--preload=",
        f"--out={out}",
    )
    result = json.loads(out.read_text())
    packages = result["packages"]
    assert packages["released"]["native_library"] == sha256_file(folder / NATIVE_LIBRARY_NAME)
    assert packages["other"]["native_library"] == sha256_file(library)
    processes = {packages["released"]["process"], packages["other"]["process"], result["process"]}
    assert len(processes) == 3  # two workers, neither of them the process that compares them
    for shape in ("1x32x2", "2x64x2"):
        row = result["shapes"][shape]
        assert row["outputs_equal_to_first"] == {"released": True, "other": True}
        for name in packages:
            assert len(row["ms"][name]["plain"]) == 2 and all(ms > 0 for ms in row["ms"][name]["plain"])
    for name in packages:  # the workers are gone
        assert not Path(f"/proc/{packages[name]['process']}").exists()
