"""The six config sections: defaults.yaml validates, bad values name their key."""

from __future__ import annotations

import pytest
import yaml

from laya_build.config.sections import DEFAULTS_PATH, section
from laya_build.errors import ConfigError
from laya_build.schema import load_schema, validate

SECTIONS = ("model", "export", "package", "verify", "latency", "runtime")


def test_defaults_validate():
    defaults = yaml.safe_load(DEFAULTS_PATH.read_text())
    assert set(defaults) == set(SECTIONS)
    validate("model_sections", defaults)
    schema = load_schema("model_sections")
    assert schema["$id"] == "model_sections.schema.json" and set(SECTIONS) <= set(schema["$defs"])
    assert defaults["export"]["targets"] == {"cpu": ["float32", "bfloat16"], "cuda": ["bfloat16"]}


@pytest.mark.parametrize(
    "name, cfg, key",
    [
        ("export", {"dims": {"rows": {"min": 0, "max": 4}}}, "export.dims.rows.min"),
        ("export", {"dims": {"slots": {"min": 1, "max": 4}}}, "export.dims.slots.min"),
        (
            "verify",
            {"thresholds": {"cpu": {"float32": {"decision": {"logit_atol": -1, "prob_atol": 0}}}}},
            "verify.thresholds.cpu.float32",
        ),
        ("latency", {"variants": ["eager_fp8"]}, "latency.variants.0"),
        ("model", {"generate": {"seed": "x"}}, "model.generate.seed"),
        ("package", {"targets": ["tpu"]}, "package.targets.0"),
        ("verify", {"timing": {"groups": 5}}, "verify.timing"),
        ("latency", {"timing": {"cpu": {"min_run_time_s": 0}}}, "latency.timing.cpu.min_run_time_s"),
        ("runtime", {"buckets": {"cuda": [{"rows": 1, "tokens": 100}]}}, "runtime.buckets.cuda.0.tokens"),
        ("runtime", {"buckets": {"cuda": [{"rows": 1}]}}, "runtime.buckets.cuda.0"),
    ],
)
def test_bad_values_name_their_key(name, cfg, key):
    with pytest.raises(ConfigError, match=rf"invalid at {key}"):
        section(name, cfg)


def test_partial_sections_take_defaults():
    cfg = section("verify", {"timing": {"cpu": {"warmup": 0}}})
    assert cfg["timing"] == {
        "cpu": {"warmup": 0, "min_run_time_s": 0.1, "max_run_time_s": 0.5},
        "cuda": {"warmup": 10, "min_run_time_s": 1.0, "max_run_time_s": 5.0},
    }
    assert cfg["preload"] == {"cpu": [], "cuda": ["lib:tvm_ffi"]}
    assert section("runtime", {"buckets": {"cuda": []}})["buckets"]["cpu"] == [
        {"rows": 1, "tokens": 32},
        {"rows": 4, "tokens": 128},
    ]


def test_buckets_outside_the_export_ranges_stop_the_config(tmp_path):
    from pathlib import Path

    from laya_build import config

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "kernels").symlink_to(root / "kernels")
    data = yaml.safe_load((root / "pipeline.yaml").read_text())
    data["runtime"] = {"buckets": {"cuda": [{"rows": 1, "tokens": 128}, {"rows": 5, "tokens": 256}]}}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(
        ConfigError,
        match=r"pipeline\.yaml: invalid at runtime\.buckets\.cuda\.1\.rows: 5 is "
        r"outside the export range 1\.\.4 \(export\.dims\)",
    ):
        config.load(path, root=tmp_path)
    data["runtime"]["buckets"]["cuda"][1]["rows"] = 4  # the range's end is admitted
    path.write_text(yaml.safe_dump(data))
    assert config.load(path, root=tmp_path).data["runtime"]["buckets"]["cuda"][1] == {"rows": 4, "tokens": 256}
