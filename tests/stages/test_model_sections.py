"""The five config sections: defaults.yaml validates, bad values name their key."""
from __future__ import annotations

import pytest
import yaml

from laya_build.errors import ConfigError
from laya_build.records import load_schema, validate
from laya_build.stages._model_common import DEFAULTS_PATH, section

SECTIONS = ("model", "export", "package", "verify", "latency")


def test_defaults_validate():
    defaults = yaml.safe_load(DEFAULTS_PATH.read_text())
    assert set(defaults) == set(SECTIONS)
    validate("model_sections", defaults)
    schema = load_schema("model_sections")
    assert schema["$id"] == "model_sections.schema.json" and set(SECTIONS) <= set(schema["$defs"])
    assert defaults["export"]["targets"] == {"cpu": ["float32", "bfloat16"], "cuda": ["bfloat16"]}


@pytest.mark.parametrize("name, cfg, key", [
    ("export", {"dims": {"rows": {"min": 0, "max": 4}}}, "export.dims.rows.min"),
    ("export", {"dims": {"slots": {"min": 1, "max": 4}}}, "export.dims.slots.min"),
    ("verify", {"thresholds": {"cpu": {"float32": {"decision": {"logit_atol": -1, "prob_atol": 0}}}}},
     "verify.thresholds.cpu.float32"),
    ("latency", {"variants": ["eager_fp8"]}, "latency.variants.0"),
    ("model", {"generate": {"seed": "x"}}, "model.generate.seed"),
    ("package", {"targets": ["tpu"]}, "package.targets.0"),
])
def test_bad_values_name_their_key(name, cfg, key):
    with pytest.raises(ConfigError, match=rf"invalid at {key}"):
        section(name, cfg)


def test_partial_sections_take_defaults():
    cfg = section("verify", {"timing": {"warmup": 0}})
    assert cfg["timing"] == {"warmup": 0, "groups": 5, "group_size": 30}
    assert cfg["preload"] == {"cpu": [], "cuda": ["tilelang"]}
