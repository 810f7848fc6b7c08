"""CPU end to end: export -> AOTInductor package -> fresh-process verification, and the ways
verification must fail (tampered package, mismatched inputs, a crashing child)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from stage_build import DTYPES, FAST_TIMING

from laya_build.config.sections import section
from laya_build.errors import (
    ConfigError,
    InputsMismatchError,
    LogitParityError,
    PackageIntegrityError,
    StageError,
    VerifyChildCrashError,
)
from laya_build.layout import record_name
from laya_build.records import read_record, sha256_file
from laya_build.release import model_report
from laya_build.schema import validate
from laya_build.stages.latency import target_variants
from tests.pipeline.project import ROOT
from tests.stage_calls import run_export, run_latency, run_package, run_verify

pytestmark = pytest.mark.build(seconds=180)  # two CPU packages, one torch.compile

EVIDENCE = Path(__file__).resolve().parents[2] / "docs" / "measurements" / "data"


def copy_package(build, dtype, dest):
    """A private copy of a package folder (record + .pt2 files) to tamper with."""
    return shutil.copytree(build.package_dir(dtype), dest)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fresh_process_verification_passes(build, dtype, tmp_path, verify_cfg):
    record = run_verify(verify_cfg, build.package_record(dtype), build.inputs, build.eager(dtype), tmp_path)
    assert record == read_record(tmp_path / "verify.json")
    assert record["status"] == "ok" and record["dtype"] == dtype
    names = [p["name"] for p in record["programs"]]
    assert names == (["decision", "decision_single_slot"] if dtype == "float32" else ["decision"])
    main = record["programs"][0]
    assert [b["shape"] for b in main["batches"]] == [
        {"rows": 1, "tokens": 32, "slots": 2},
        {"rows": 2, "tokens": 64, "slots": 3},
        {"rows": 4, "tokens": 512, "slots": 8},
    ]
    for head in ("decision", "act"):
        assert main["summary"][head]["argmax_agree"] == main["summary"][head]["rows"] == 7
        assert main["summary"][head]["max_logit_delta"] <= record["thresholds"][head]["logit_atol"]
    child = record["child"]
    assert child["forbidden_modules_loaded"] == [] and child["aoti_runtime_check_inputs"] == "1"
    assert child["loader"] == "direct"  # the runtime's own loader: no Inductor in the process
    assert child["omp_wait_policy"] == (os.environ.get("OMP_WAIT_POLICY") or "PASSIVE")  # verifications share cores
    assert set(child["masked"]) == {
        "torch.compile",
        "torch.export.export",
        "torch._inductor.aoti_compile_and_package",
        "torch._export.aot_compile",
        "torch._inductor.cpp_builder.CppBuilder.build",
    }
    # the package loaded without Inductor's ISA question: nothing was compiled or cached
    assert record["inductor_cache"] == {"initial": [], "after_run": [], "removed": True}
    assert all(p["cache_during_load"] == [] for p in record["programs"])
    fresh = record["fresh_load"]
    assert fresh["isa"]["mode"] == "not-asked" and fresh["runner"] == "padded_calls"
    assert fresh["isa"]["package"] and fresh["isa"]["cpu"]  # the CPU's features checked against the package's
    phases = ("import_s", "sha256_s", "probe_s", "load_s", "capture_s", "first_call_s")
    assert fresh["total_s"] == pytest.approx(sum(fresh[k] for k in phases)) and fresh["capture_s"] == 0
    # the runtime's runner (default cpu buckets 1x32, 4x128) against eager.pt
    runner = main["runner"]
    assert [b["bucket"] for b in runner["batches"]] == [
        {"rows": 1, "tokens": 32, "slots": 8},
        {"rows": 4, "tokens": 128, "slots": 8},
        None,
    ]
    assert all(b["replay_vs_plain"] is None for b in runner["batches"])  # no graphs on the CPU
    for head in ("decision", "act"):
        assert runner["summary"][head]["argmax_agree"] == 7
        assert runner["summary"][head]["max_logit_delta"] <= record["thresholds"][head]["logit_atol"]
    assert all("runner" not in p for p in record["programs"][1:])
    for b in main["batches"]:
        lat = b["latency"]
        assert lat["median_ms"] > 0 and lat["runs"] == lat["block_size"] * len(lat["blocks_ms"]) >= 1
    assert record["timing"] == verify_cfg["timing"]["cpu"]
    assert not (tmp_path / "verify_job.json").exists()  # transient files are cleaned up


def test_records_validate_and_describe_the_build(build):
    model = read_record(build.root / "model" / "model.json")
    assert model["inputs"]["rows"] == 7 and model["source"] == "generated"
    for dtype in DTYPES:
        exp = read_record(build.export_dir(dtype) / record_name("export"))
        assert exp["dims"]["tokens"] == {"min": 32, "max": 512}
        assert exp["rotary"] == "table" and exp["attention"] == "sdpa"  # the defaults, recorded
        assert exp["last_head_layer"] == "all" and exp["head_attention"] == "sdpa" and exp["zero_bias"] == []
        assert exp["fused_linears"] == []
        constraints = sorted(exp["programs"][0]["range_constraints"].values())
        assert [1, 4] in constraints and [2, 8] in constraints and [32, 512] in constraints
        pkg = read_record(build.package_record(dtype))
        assert pkg["status"] == "ok" and pkg["compile_cache"]["removed"]
        for program in pkg["programs"]:
            package = build.package_dir(dtype) / program["package"]["path"]
            assert program["package"]["sha256"] == sha256_file(package)
            assert program["package_s"] > 0 and program["export_s"] > 0
        assert pkg["versions"]["torch"] == torch.__version__
        assert "PyTorch version" in pkg["env_info"]
    assert not list(build.root.rglob("*.partial.pt2"))


def test_exported_program_round_trips(build):
    ep = torch.export.load(build.export_dir("float32") / "exported.pt2")
    inputs = torch.load(build.inputs, weights_only=True)
    eager = torch.load(build.eager("float32"), weights_only=True)
    batch = inputs["batches"][0]  # 1 row: unlike the export example (2 rows)
    decision, act = ep.module()(*(batch[k] for k in inputs["arg_names"]))
    assert torch.allclose(decision, eager["outputs"][0]["decision"], atol=1e-5)
    assert torch.allclose(act, eager["outputs"][0]["act"], atol=1e-5)


def test_exported_programs_name_no_folder_of_the_machine_that_built_them(build):
    """Stack traces stay in ``exported.pt2`` (debug info), naming files import-relative: the
    same bytes from any checkout and environment (release_diff compares them across builds)."""
    for dtype, name in (
        ("float32", "exported.pt2"),
        ("float32", "exported_single_slot.pt2"),
        ("bfloat16", "exported.pt2"),
    ):
        with zipfile.ZipFile(build.export_dir(dtype) / name) as archive:
            model = next(archive.read(n).decode() for n in archive.namelist() if n.endswith("models/model.json"))
        for folder in {str(ROOT), sys.prefix, str(build.root)}:
            assert folder not in model, (dtype, name, folder)
        assert '"stack_trace": "File \\"laya_build/model/decision.py\\", line' in model, (dtype, name)
        assert 'File \\"transformers/models/modernbert/modeling_modernbert.py\\"' in model, (dtype, name)


def test_tampered_package_fails_before_loading(build, tmp_path, verify_cfg):
    pkg_dir = copy_package(build, "bfloat16", tmp_path / "pkg")
    package = pkg_dir / "decision.pt2"
    expected = sha256_file(package)
    data = bytearray(package.read_bytes())
    data[len(data) // 2] ^= 0xFF
    package.write_bytes(bytes(data))
    actual = sha256_file(package)
    with pytest.raises(PackageIntegrityError) as err:
        run_verify(verify_cfg, pkg_dir / "aoti_package.json", build.inputs, build.eager("bfloat16"), tmp_path / "v")
    message = err.value.message  # without the hint and reference lines
    assert str(package) in message and expected in message and actual in message
    log = (tmp_path / "v" / "verify_child.log").read_text()
    # raised in the fresh verification process by the check that precedes every load
    assert f"LAYA-ERROR PackageIntegrityError: {message}" in log and "aoti_load_package failed" not in log
    assert not (tmp_path / "v" / "verify.json").exists()


def test_eager_outputs_of_another_dtype_are_rejected(build, tmp_path, verify_cfg):
    with pytest.raises(InputsMismatchError, match=r"eager\.pt: dtype is 'float32' but the package .*needs 'bfloat16'"):
        run_verify(verify_cfg, build.package_record("bfloat16"), build.inputs, build.eager("float32"), tmp_path)


def test_changed_eager_tensor_names_batch_row_and_head(build, tmp_path, verify_cfg):
    eager = torch.load(build.eager("float32"), weights_only=True)
    eager["outputs"][2]["decision"][1, 3] += 0.5
    changed = tmp_path / "eager" / "eager.pt"
    changed.parent.mkdir()
    torch.save(eager, changed)
    shutil.copy(build.export_dir("float32") / "eager_single_slot.pt", changed.parent)
    with pytest.raises(LogitParityError) as err:
        run_verify(verify_cfg, build.package_record("float32"), build.inputs, changed, tmp_path / "v")
    message = str(err.value)
    assert re.match(
        r"decision logits of batch 2 row 1 differ by 0\.5 > atol 0\.0001 \(package .*decision\.pt2 "
        r"vs .*eager\.pt\)",
        message,
    ), message
    assert not (tmp_path / "v" / "verify.json").exists()


def test_changed_inputs_are_rejected(build, tmp_path, verify_cfg):
    inputs = torch.load(build.inputs, weights_only=True)
    inputs["batches"][1]["input_ids"][0, 5] += 1
    changed = tmp_path / "inputs.pt"
    torch.save(inputs, changed)
    with pytest.raises(InputsMismatchError, match=r"inputs\.pt: sha256 \w+ is not that of the inputs"):
        run_verify(verify_cfg, build.package_record("bfloat16"), changed, build.eager("bfloat16"), tmp_path / "v")


def test_child_crash_is_a_failure_naming_the_signal(build, tmp_path, verify_cfg, monkeypatch):
    monkeypatch.setenv("LAYA_VERIFY_CHILD_CRASH", "SIGSEGV")
    with pytest.raises(VerifyChildCrashError, match=r"died by signal SIGSEGV \(11\); this is a failure") as err:
        run_verify(verify_cfg, build.package_record("bfloat16"), build.inputs, build.eager("bfloat16"), tmp_path)
    assert err.value.signal == "SIGSEGV"
    assert not (tmp_path / "verify.json").exists()


def test_cuda_target_gives_skip_records(build, tmp_path, verify_cfg):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    exp = run_export({}, build.checkpoint, build.inputs, tmp_path / "e", "cuda", "bfloat16")
    pkg = run_package({}, tmp_path / "e", tmp_path / "p", "cuda")
    ver = run_verify(
        verify_cfg, tmp_path / "p" / "aoti_package.json", build.inputs, tmp_path / "e" / "eager.pt", tmp_path / "v"
    )
    lat = run_latency(
        {}, build.checkpoint, build.inputs, [tmp_path / "p" / "aoti_package.json"], tmp_path / "l", "cuda"
    )
    for record, stage in ((exp, "export"), (pkg, "aoti_package"), (ver, "verify"), (lat, "latency")):
        assert record["status"] == "skipped" and record["target"] == "cuda" and "CUDA" in record["reason"]
        assert record == read_record(
            tmp_path / {"export": "e", "aoti_package": "p", "verify": "v", "latency": "l"}[stage] / f"{stage}.json"
        )
    assert "dtype" not in lat  # one latency record for the whole target
    assert not (tmp_path / "e" / "exported.pt2").exists()


def test_missing_compiler_gives_a_skip_record(build, tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    record = run_package({}, build.export_dir("bfloat16"), tmp_path, "cpu")
    assert record["status"] == "skipped" and "no C++ compiler" in record["reason"]
    assert read_record(tmp_path / "aoti_package.json") == record


def test_an_unknown_inductor_option_is_a_config_error_before_compiling(build, tmp_path):
    configs = {"aot_inductor.check_lowerbound": False, "no_such_inductor_option": 1, "aot_inductor.no_such": 2}
    with pytest.raises(
        ConfigError,
        match=r"(?m)^package\.inductor_configs\.aot_inductor\.no_such: not an Inductor "
        r"option of torch 2\.\S+ \(nor no_such_inductor_option\)$",
    ):
        run_package({"inductor_configs": configs}, build.export_dir("bfloat16"), tmp_path / "p", "cpu")
    assert not (tmp_path / "p").exists(), "nothing compiled, nothing written"


@pytest.mark.parametrize(
    "key, value, wants",
    [
        ("triton.autotune_pointwise", "false", "bool.*write true or false, unquoted"),  # quoted in the YAML
        ("aot_inductor.check_lowerbound", 0, "bool"),
        ("max_autotune_gemm_backends", ["ATEN"], "str"),
        ("max_fusion_size", True, "int"),  # a bool is no count
    ],
)
def test_an_inductor_option_of_the_wrong_type_is_a_config_error_before_compiling(build, tmp_path, key, value, wants):
    """A value Inductor would take as something else (a quoted "false" is truthy) is refused,
    naming the option, the value's type and the type the option takes; right types pass the check."""
    from laya_build.stages.package import check_inductor_configs

    with pytest.raises(ConfigError, match=rf"^package\.inductor_configs\.{re.escape(key)}: .* takes a {wants}"):
        run_package({"inductor_configs": {key: value}}, build.export_dir("bfloat16"), tmp_path / "p", "cpu")
    assert not (tmp_path / "p").exists(), "nothing compiled, nothing written"
    check_inductor_configs(
        {
            "triton.autotune_pointwise": False,
            "aot_inductor.check_lowerbound": False,
            "max_autotune_gemm_backends": "ATEN,TRITON",
            "max_fusion_size": 64,
            "coordinate_descent_tuning": True,
        }
    )


def test_changed_exported_program_is_not_compiled(build, tmp_path):
    export_dir = shutil.copytree(build.export_dir("bfloat16"), tmp_path / "e")
    (export_dir / "exported.pt2").write_bytes(b"not a program")
    with pytest.raises(PackageIntegrityError, match=r"exported\.pt2: sha256 \w+ does not match the export record's"):
        run_package({}, export_dir, tmp_path / "p", "cpu")
    assert not (tmp_path / "p").exists()


def test_export_checks_its_config(build, tmp_path):
    with pytest.raises(ConfigError, match=r"export.targets.cuda does not list float32"):
        run_export({}, build.checkpoint, build.inputs, tmp_path, "cuda", "float32")
    with pytest.raises(InputsMismatchError, match=r"export range of rows 1\.\.8"):
        run_export({"dims": {"rows": {"min": 1, "max": 8}}}, build.checkpoint, build.inputs, tmp_path, "cpu", "float32")
    with pytest.raises(ConfigError, match=r"has one row"):
        run_export({"example_batch": 0}, build.checkpoint, build.inputs, tmp_path, "cpu", "float32")


@pytest.fixture(scope="module")
def target_latency(build, tmp_path_factory):
    """``latency`` of target cpu over both session packages with the default (cpu) variants."""
    out = tmp_path_factory.mktemp("latency-cpu")
    runtime_cfg = {"buckets": {"cpu": [{"rows": 2, "tokens": 64, "slots": 3}]}}
    record = run_latency(
        {"timing": dict(FAST_TIMING)},
        build.checkpoint,
        build.inputs,
        [build.package_record(d) for d in DTYPES],
        out,
        "cpu",
        runtime_cfg=runtime_cfg,
    )
    return out, record


def test_latency_stage(build, target_latency):
    """One record for the target: eager AMP and eager bf16 measured once (torch.compile is not
    a cpu default), then package and package_graphed for each package dtype, each against
    eager AMP."""
    out, record = target_latency
    assert record == read_record(out / "latency.json")
    assert record["target"] == "cpu" and "dtype" not in record and record["skipped_packages"] == []
    assert [(v["name"], v.get("dtype")) for v in record["variants"]] == [
        ("eager_amp", None),
        ("eager_bf16", None),
        ("package", "float32"),
        ("package_graphed", "float32"),
        ("package", "bfloat16"),
        ("package_graphed", "bfloat16"),
    ]
    packages = {d: build.package_dir(d) / "decision.pt2" for d in DTYPES}
    assert record["packages"] == [{"dtype": d, "sha256": sha256_file(packages[d])} for d in DTYPES]
    assert record["variants"][0]["parity_vs_eager_amp"] is None
    for variant in record["variants"]:
        assert len(variant["batches"]) == 3
        for b in variant["batches"]:
            assert b["latency"]["median_ms"] > 0 and b["latency"]["runs"] >= 1
        if variant["name"] != "eager_amp":
            assert variant["parity_vs_eager_amp"]["decision"]["rows"] == 7
    for dtype in DTYPES:
        package, graphed = (v for v in record["variants"] if v.get("dtype") == dtype)
        assert package["description"] == f"AOTInductor package ({dtype})"
        assert graphed["runner"]["mode"] == "padded_calls" and graphed["runner"]["capture_s"] == 0
        assert [b["bucket"] for b in graphed["batches"]] == [{"rows": 2, "tokens": 64, "slots": 3}] * 2 + [None]
        for head in ("decision", "act"):  # padding changes nothing the argmax can see
            assert (
                graphed["parity_vs_eager_amp"][head]["argmax_agree"]
                == package["parity_vs_eager_amp"][head]["argmax_agree"]
            )
    assert record["timing"] == FAST_TIMING["cpu"]
    table = (out / "latency.md").read_text()
    assert table.startswith("# Latency: cpu\n")
    assert f"Packages measured: float32 (sha256 {record['packages'][0]['sha256'][:16]}), bfloat16 " in table
    assert "| variant | what | batch 0 (1x32x2) | batch 1 (2x64x3) | batch 2 (4x512x8) |" in table
    assert "adaptive_autorange for 0.01 to 0.05 s" in table
    assert "| package (float32) | AOTInductor package (float32) |" in table
    assert "| package_graphed (bfloat16) | AOTInductor package (bfloat16) behind the runtime:" in table
    assert "compiled_bf16" not in table
    assert table.count("\n| ") == 1 + 6  # the header, one row per variant


def test_compiled_bf16_when_listed(build, tmp_path):
    """torch.compile bf16, listed for cpu (per-target ``variants``), on the first saved batch
    (one row: one Inductor compilation; all three batches compile twice, 60-100 s here): its
    first call (the compilation) recorded apart, its answers against eager AMP."""
    inputs = torch.load(build.inputs, weights_only=True)
    inputs["batches"] = inputs["batches"][:1]
    one_batch = tmp_path / "inputs-one-batch.pt"
    torch.save(inputs, one_batch)
    # static shapes (latency.compile.dynamic, honoured): one Inductor compilation of ~15 s
    # instead of ~30 s for the dynamic one that cuda uses by default
    cfg = {
        "timing": dict(FAST_TIMING),
        "variants": {"cpu": ["eager_amp", "compiled_bf16"]},
        "compile": {"dynamic": False},
    }
    record = run_latency(cfg, build.checkpoint, one_batch, [build.package_record("float32")], tmp_path / "out", "cpu")
    assert record == read_record(tmp_path / "out" / "latency.json")
    amp, compiled = record["variants"]
    assert (amp["name"], compiled["name"]) == ("eager_amp", "compiled_bf16") and record["packages"] == []
    assert compiled["description"] == "torch.compile(dynamic=False, mode=default), explicit bf16"
    assert compiled["first_calls_s"] > 1.0 > compiled["batches"][0]["latency"]["median_ms"] / 1e3
    parity = compiled["parity_vs_eager_amp"]
    assert parity["decision"]["rows"] == parity["act"]["rows"] == 1
    assert parity["decision"]["argmax_agree"] == parity["act"]["argmax_agree"] == 1
    table = (tmp_path / "out" / "latency.md").read_text()
    assert "| compiled_bf16 | torch.compile(dynamic=False, mode=default), explicit bf16 |" in table


def test_latency_lists_skipped_packages_and_skips_a_target_without_any(build, tmp_path, monkeypatch):
    """A target's skipped package is named with its reason and the others are measured; a
    target whose packages were all skipped gets a skip record."""
    with monkeypatch.context() as m:
        m.setenv("CXX", str(tmp_path / "no-such-c++"))
        skipped = {d: run_package({}, build.export_dir(d), tmp_path / f"skipped-{d}", "cpu") for d in DTYPES}
    assert all(r["status"] == "skipped" for r in skipped.values())
    cfg = {"timing": dict(FAST_TIMING), "variants": ["eager_amp", "package", "package_graphed"]}
    records = [build.package_record("float32"), tmp_path / "skipped-bfloat16" / "aoti_package.json"]
    record = run_latency(cfg, build.checkpoint, build.inputs, records, tmp_path / "some", "cpu")
    assert record == read_record(tmp_path / "some" / "latency.json")
    assert [(v["name"], v.get("dtype")) for v in record["variants"]] == [
        ("eager_amp", None),
        ("package", "float32"),
        ("package_graphed", "float32"),
    ]
    assert [p["dtype"] for p in record["packages"]] == ["float32"]
    reason = f"aoti_package skipped: {skipped['bfloat16']['reason']}"
    assert record["skipped_packages"] == [{"dtype": "bfloat16", "reason": reason}]
    assert "no C++ compiler" in reason
    assert f"Not measured: the bfloat16 package ({reason})." in (tmp_path / "some" / "latency.md").read_text()

    none = run_latency(
        cfg,
        build.checkpoint,
        build.inputs,
        [tmp_path / f"skipped-{d}" / "aoti_package.json" for d in DTYPES],
        tmp_path / "none",
        "cpu",
    )
    assert none == read_record(tmp_path / "none" / "latency.json")
    assert none["status"] == "skipped" and none["target"] == "cpu" and "dtype" not in none
    assert none["reason"] == (
        f"every package of target cpu was skipped: float32: aoti_package skipped: "
        f"{skipped['float32']['reason']}; bfloat16: {reason}"
    )
    assert sorted(p.name for p in (tmp_path / "none").iterdir()) == ["latency.json"]


def test_latency_variants_per_target():
    """A list is every target's; a mapping is per target, merged over the defaults (cpu without
    compiled_bf16, cuda with it); a wrong name is named with its key path."""
    defaults = section("latency", {})
    assert target_variants(defaults, "cpu") == ["eager_amp", "eager_bf16", "package", "package_graphed"]
    assert target_variants(defaults, "cuda") == [
        "eager_amp",
        "eager_bf16",
        "compiled_bf16",
        "package",
        "package_graphed",
    ]
    listed = section("latency", {"variants": ["eager_amp", "package"]})
    assert target_variants(listed, "cpu") == target_variants(listed, "cuda") == ["eager_amp", "package"]
    cpu_only = section("latency", {"variants": {"cpu": ["package"]}})
    assert target_variants(cpu_only, "cpu") == ["package"]
    assert target_variants(cpu_only, "cuda") == target_variants(defaults, "cuda")
    with pytest.raises(ConfigError, match=r"latency\.variants"):
        section("latency", {"variants": {"cpu": ["compiled_fp8"]}})
    with pytest.raises(ConfigError, match=r"latency\.variants"):
        section("latency", {"variants": {"tpu": ["package"]}})


def test_latency_refuses_packages_it_cannot_measure(build, tmp_path):
    """Before anything is measured: a package of another target, two packages of one dtype,
    a package whose bytes are not its record's."""
    args = (build.checkpoint, build.inputs)
    with pytest.raises(StageError, match=r"aoti_package\.json is for target cpu, not cuda"):
        run_latency({}, *args, [build.package_record("float32")], tmp_path / "a", "cuda")
    with pytest.raises(StageError, match=r"two package records for cpu-float32: "):
        run_latency({}, *args, [build.package_record("float32")] * 2, tmp_path / "b", "cpu")
    with pytest.raises(StageError, match=r"latency of target cpu: no package record given"):
        run_latency({}, *args, [], tmp_path / "c", "cpu")
    pkg_dir = copy_package(build, "bfloat16", tmp_path / "pkg")
    package = pkg_dir / "decision.pt2"
    data = bytearray(package.read_bytes())
    data[len(data) // 2] ^= 0xFF
    package.write_bytes(bytes(data))
    with pytest.raises(
        PackageIntegrityError,
        match=rf"{re.escape(str(package))}: sha256 {sha256_file(package)} "
        r"does not match the package record's \w+; refusing to load it",
    ):
        run_latency({}, *args, [build.package_record("float32"), pkg_dir / "aoti_package.json"], tmp_path / "d", "cpu")
    for name in "abcd":
        assert not (tmp_path / name / "latency.json").exists()
    assert not (tmp_path / "d" / "latency_child.log").exists()  # nothing was started


def per_build_records(record: dict) -> list[dict]:
    """The per-(target, dtype) records the latency stage wrote before it measured per target:
    the shared variants again in each, the package variants without a dtype of their own."""
    common = {k: v for k, v in record.items() if k not in ("packages", "skipped_packages", "variants")}
    shared = [v for v in record["variants"] if "dtype" not in v]
    return [
        {
            **common,
            "dtype": p["dtype"],
            "package": {"sha256": p["sha256"]},
            "variants": shared
            + [
                {k: v for k, v in var.items() if k != "dtype"}
                for var in record["variants"]
                if var.get("dtype") == p["dtype"]
            ],
        }
        for p in record["packages"]
    ]


def test_reports_read_releases_made_before_latency_was_per_target(target_latency):
    """REPORT.md and release_diff key latency by target; an older release's per-build records
    (valid records still) label their variants with the build's dtype, so the package
    variants line up with a new release's and nothing is lost."""
    _, record = target_latency
    old = per_build_records(record)
    for r in old:
        validate("latency", r)
    new_recs = {"latency": [("latency/cpu/latency.json", record)]}
    old_recs = {"latency": [(f"latency/cpu-{r['dtype']}/latency.json", r) for r in old]}
    diff = model_report.diff(old_recs, new_recs)
    rows = {(r["target"], r["variant"], r["batch"]): (r["old_ms"], r["new_ms"]) for r in diff["latency"]}
    assert {t for t, _, _ in rows} == {"cpu"}
    ms = {
        (model_report.variant_label(v), b["batch"]): b["latency"]["median_ms"]
        for v in record["variants"]
        for b in v["batches"]
    }
    for dtype in DTYPES:
        for name in ("package", "package_graphed"):
            for batch in range(3):  # the same measurement on both sides
                key = (f"{name} ({dtype})", batch)
                assert rows[("cpu", *key)] == (ms[key], ms[key])
        for name in ("eager_amp", "eager_bf16"):  # measured per build before: old only
            assert rows[("cpu", f"{name} ({dtype})", 0)] == (ms[(name, 0)], None)
    for name in ("eager_amp", "eager_bf16"):
        assert rows[("cpu", name, 0)] == (None, ms[(name, 0)])
    assert len(rows) == len(diff["latency"]) == 3 * (6 + 2 * 2)
    md = "\n".join(model_report.diff_sections(diff, "0.1.0", "0.2.0"))
    assert "| cpu | package (float32) | 0 |" in md and "| cpu | eager_amp (bfloat16) | 0 |" in md
    # REPORT.md of either release, and of the H200 evidence (per-build records, one of them
    # from before figures recorded their calls)
    report = "\n".join(model_report.sections(new_recs))
    assert "## Latency cpu (median ms" in report and "| package (float32) | package_graphed (float32) |" in report
    report = "\n".join(model_report.sections(old_recs))
    assert "## Latency cpu-float32 (median ms" in report and "## Latency cpu-bfloat16 (median ms" in report
    assert "| eager_amp (bfloat16) | eager_bf16 (bfloat16) | package (bfloat16) |" in report
    evidence = [
        json.loads((EVIDENCE / name).read_text())
        for name in ("2026-11-29-h200-latency.json", "2026-11-30-h200-runtime/latency.json")
    ]
    report = "\n".join(model_report.sections({"latency": [(f"e{i}", r) for i, r in enumerate(evidence)]}))
    assert report.count("## Latency cuda-bfloat16 (median ms") == 2
    assert "| compiled_bf16 (bfloat16) |" in report and "package_graphed (bfloat16): cuda_graphs" in report
