"""A bad pipeline.yaml stops before any task runs, naming the key path; nothing is written."""

from __future__ import annotations

import copy
import shutil

import pytest
import yaml

from laya_build import config
from tests.pipeline.project import ROOT, Project

GOOD = yaml.safe_load((ROOT / "pipeline.yaml").read_text())


def _load(tmp_path, data=None, text=None, **kw):
    (tmp_path / "pipeline.yaml").write_text(text if text is not None else yaml.safe_dump(data))
    return config.load(tmp_path / "pipeline.yaml", root=tmp_path, **kw)


def _mutated(fn):
    data = copy.deepcopy(GOOD)
    fn(data)
    return data


def test_default_pipeline_is_valid(tmp_path):
    p = _load(tmp_path, GOOD)
    assert p.version == GOOD["version"]
    assert p.version_dir == (tmp_path / "artifacts" / GOOD["version"]).resolve()


BAD = {
    "unknown top-level key": (lambda d: d.update(colour="blue"), "<root>", "colour"),
    "unknown key in a variant": (
        lambda d: d["kernels"]["variants"]["rope"].update(tile=3),
        "kernels.variants.rope",
        "tile",
    ),
    "wrong type": (lambda d: d["cpu_checks"].update(seed="1234"), "cpu_checks.seed", "is not of type 'integer'"),
    "missing field": (lambda d: d["cuda"].pop("archs"), "cuda", "'archs' is a required property"),
    "unknown kernel": (
        lambda d: d["kernels"]["variants"]["rope"].update(factory="rope_kernal"),
        "kernels.variants.rope.factory",
        "unknown kernel 'rope_kernal'",
    ),
    "bad target kind": (
        lambda d: d["cuda"]["archs"].append({"kind": "rocm", "arch": "sm_90"}),
        "cuda.archs.1.kind",
        "'cuda' was expected",
    ),
    "bad target arch": (
        lambda d: d["cuda"]["archs"].__setitem__(0, {"kind": "cuda", "arch": "90"}),
        "cuda.archs.0.arch",
        "does not match",
    ),
    "bad dtype": (lambda d: d["cuda"].update(dtypes=["float32"]), "cuda.dtypes.0", "is not one of"),
    "version escaping artifacts": (lambda d: d.update(version="../../etc"), "version", "does not match"),
    "output_root escaping artifacts": (
        lambda d: d.update(output_root="../elsewhere"),
        "output_root",
        "outputs must go to",
    ),
    "output_root not artifacts": (lambda d: d.update(output_root="build"), "output_root", "outputs must go to"),
    "output_root inside a version": (
        lambda d: d.update(output_root="artifacts/0.1.0"),
        "output_root",
        "outputs must go to",
    ),
    "unknown kernel option": (
        lambda d: d["kernels"]["variants"]["attention"]["kwargs"].update(windw=3),
        "kernels.variants.attention.kwargs.windw",
        "attn_kernel has no parameter 'windw'",
    ),
    "too many args": (
        lambda d: d["kernels"]["variants"]["rope"].update(args=[4, 32, 8, 128, 7, 9]),
        "kernels.variants.rope.args",
        "rope_kernel takes at most",
    ),
    "check shape without M": (
        lambda d: d["cpu_checks"]["shapes"]["gemm_gelu"].append({"L": 3}),
        "cpu_checks.shapes.gemm_gelu.3",
        "gemm_kernel checks need M",
    ),
    "symbolic attention check without L": (
        lambda d: d["cpu_checks"]["shapes"]["attention"].append({"B": 2}),
        "cpu_checks.shapes.attention.2",
        "attn_kernel checks need L",
    ),
    "lens not matching B": (
        lambda d: d["cpu_checks"]["shapes"]["attention"].append({"B": 2, "L": 8, "lens": [8]}),
        "cpu_checks.shapes.attention.2.lens",
        "1 lengths for B=2",
    ),
    "checks for a missing variant": (
        lambda d: d["cpu_checks"]["shapes"].update(nope=[{"M": 1}]),
        "cpu_checks.shapes.nope",
        "no kernel variant named 'nope'",
    ),
    "variant without checks": (
        lambda d: d["cpu_checks"]["shapes"].pop("geglu"),
        "cpu_checks.shapes",
        "'geglu' has no check shapes",
    ),
    "dtype passed as a kwarg": (
        lambda d: d["kernels"]["variants"]["rope"].update(kwargs={"dtype": "float32"}),
        "kernels.variants.rope.kwargs",
        "dtype",
    ),
    "varlen attention on the cpu": (
        lambda d: d.setdefault("export", {}).update(attention={"cpu": "varlen"}),
        "export.attention.cpu",
        "is not one of ['sdpa']",
    ),
    "unknown attention": (
        lambda d: d.setdefault("export", {}).update(attention={"cuda": "flash"}),
        "export.attention.cuda",
        "is not one of ['sdpa', 'bias', 'varlen', 'fused']",
    ),
    "unknown rotary": (
        lambda d: d.setdefault("export", {}).update(rotary="cached"),
        "export.rotary",
        "is not one of ['table', 'computed']",
    ),
    "unknown zero-bias layer": (
        lambda d: d.setdefault("export", {}).update(zero_bias={"cuda": ["mlp.Wo", "mlp.Wout"]}),
        "export.zero_bias.cuda.1",
        "is not one of ['attn.Wqkv', 'attn.Wo', 'mlp.Wi', 'mlp.Wo']",
    ),
    "zero bias on the cpu": (
        lambda d: d.setdefault("export", {}).update(zero_bias={"cpu": ["mlp.Wo"]}),
        "export.zero_bias",
        "'cpu' was unexpected",
    ),
    "fused linear not a module path": (
        lambda d: d.setdefault("export", {}).update(fused_linears={"cuda": ["act_head.0", "act head"]}),
        "export.fused_linears.cuda.1",
        "does not match",
    ),
    "fused linears on an unknown target": (
        lambda d: d.setdefault("export", {}).update(fused_linears={"tpu": ["act_head.0"]}),
        "export.fused_linears",
        "'tpu' was unexpected",
    ),
    "unknown native linear": (
        lambda d: d.setdefault("export", {}).update(native_linears={"cpu": ["mlp.Wi", "mlp.Wout"]}),
        "export.native_linears.cpu.1",
        "is not one of ['attn.Wqkv', 'attn.Wo', 'mlp.Wi', 'mlp.Wo']",
    ),
    "native algorithms for a cpu build": (
        lambda d: d.setdefault("export", {}).update(native_algorithms={"cpu-float32": "tuning/a.json"}),
        "export.native_algorithms",
        "cpu-float32",
    ),
    "native algorithms outside the project": (
        lambda d: d.setdefault("export", {}).update(native_algorithms={"cuda-bfloat16": "/tmp/a.json"}),
        "export.native_algorithms.cuda-bfloat16",
        "does not match",
    ),
    "unknown last head layer": (
        lambda d: d.setdefault("export", {}).update(last_head_layer="markers"),
        "export.last_head_layer",
        "is not one of ['all', 'read']",
    ),
    "baseline is itself": (
        lambda d: d["cuda"].update(baseline={"version": d["version"]}),
        "cuda.baseline.version",
        "cannot be the version",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_names_the_key_path(tmp_path, case):
    mutate, key, fragment = BAD[case]
    with pytest.raises(config.ConfigError) as info:
        _load(tmp_path, _mutated(mutate))
    message = str(info.value)
    assert f"invalid at {key}" in message
    assert fragment in message
    assert "pipeline.yaml" in message


def test_duplicate_key_is_refused(tmp_path):
    text = (ROOT / "pipeline.yaml").read_text() + '\nversion: "9.9.9"\n'
    with pytest.raises(config.ConfigError, match="duplicate key 'version'"):
        _load(tmp_path, text=text)


def test_not_yaml(tmp_path):
    with pytest.raises(config.ConfigError, match="not valid YAML"):
        _load(tmp_path, text="version: [1, 2\n")


def test_version_override_is_validated(tmp_path):
    """An override is a command-line value: reported as the doit argument, not as pipeline.yaml."""
    with pytest.raises(config.ConfigError, match=r"^doit argument version=1\.0/\.\./\.\./x: is not a version"):
        _load(tmp_path, GOOD, overrides={"version": "1.0/../../x"})
    assert config.load(tmp_path / "pipeline.yaml", root=tmp_path, overrides={"version": "1.2.0"}).version == "1.2.0"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return Project(tmp_path_factory.mktemp("cfg"))


@pytest.mark.parametrize("case", ["unknown kernel", "version escaping artifacts", "wrong type"])
def test_doit_stops_before_any_task(project, case):
    mutate, key, fragment = BAD[case]
    shutil.rmtree(project.artifacts, ignore_errors=True)
    project.write_config(_mutated(mutate))
    try:
        run = project.doit("tir")
    finally:
        project.write_config(GOOD)
    assert run.returncode != 0
    assert f"invalid at {key}" in run.stderr and fragment in run.stderr
    assert run.executed == []
    assert not project.artifacts.exists(), "a bad config must write nothing"


def test_doit_version_override_on_command_line(project):
    run = project.doit("list", "version=1..2")
    assert run.returncode != 0 and "laya-build: ConfigError: doit argument version=1..2: is not a version" in run.stderr
    assert "pipeline.yaml" not in run.stderr
    assert project.doit("list", "version=1.2.0").returncode == 0


def test_h200_config_is_valid_and_differs_only_where_documented(tmp_path):
    """pipeline.h200.yaml (the GPU evidence run) validates and stays pipeline.yaml plus the
    large-model and CUDA-only overrides."""
    h200 = config.load(ROOT / "pipeline.h200.yaml", root=ROOT).data
    expected = config.load(ROOT / "pipeline.yaml", root=ROOT).data
    expected["version"] = "0.1.0-h200"
    expected["model"]["generate"].update(
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        intermediate_size=2624,
        max_position_embeddings=8192,
        local_attention=128,
    )
    expected["package"]["targets"] = ["cuda"]  # only the CUDA package is built
    # compiled with the Triton launch configurations decided once (reproducible bytes)
    expected["package"]["tuning"] = {"cuda-bfloat16": "tuning/h200-cuda-bfloat16-untimed.json"}
    # pointwise kernels configured by Inductor's size heuristic, not by a timing at the example size
    expected["package"]["inductor_configs"]["triton.autotune_pointwise"] = False
    expected["export"]["attention"]["cuda"] = "fused"  # the export that tuning file was made for
    expected["export"]["last_head_layer"] = "read"
    expected["export"]["zero_bias"]["cuda"] = ["mlp.Wo"]  # the MLP's output GEMM through cuBLASLt
    # the scorer's and the act head's last layers as reductions fused with the GELU before each, the
    # act head's first layer padded to a multiple of 8, the head's ReLUs in their GEMMs' epilogue
    expected["export"]["fused_linears"]["cuda"] = ["scorer.3", "act_head.2"]
    expected["export"]["padded_linears"]["cuda"] = ["act_head.0"]
    expected["export"]["relu_epilogue"]["cuda"] = True
    # each residual add and its layer norm as the project's Triton op from 512 positions on
    expected["export"]["add_norms"]["cuda"] = 512
    # the attention's GEMMs through the native op, with the algorithms chosen on the H200
    expected["export"]["native_linears"]["cuda"] = ["attn.Wqkv", "attn.Wo"]
    expected["export"]["native_algorithms"] = {"cuda-bfloat16": "tuning/h200-cublaslt.json"}
    # the MLP's first GEMM and its gated GELU as one CUTLASS kernel of the native library
    expected["export"]["native_geglu"]["cuda"] = True
    # the residual stored at every layer norm
    expected["package"]["inductor_configs"]["realize_reads_threshold"] = 1
    # a 7-row batch (rows 1..7) and CUDA-graph buckets at the serving shapes and saved batches
    expected["model"]["inputs"]["batches"].append(
        {
            "decisions": [
                "second-charge-hold",
                "duplicate-likelihood",
                "forgotten-cancellation",
                "annual-refund",
                "urgency",
                "failed-payment-step",
                "late-fee-noul",
            ],
            "tokens": 256,
        }
    )
    expected["export"]["dims"]["rows"]["max"] = 7
    expected["runtime"]["buckets"]["cuda"] = [
        {"rows": 1, "tokens": 32},
        {"rows": 1, "tokens": 128},
        {"rows": 2, "tokens": 64},
        {"rows": 4, "tokens": 512},
        {"rows": 7, "tokens": 256},
    ]
    assert h200 == expected
