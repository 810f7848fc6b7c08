"""Triton tuning files (laya_build/stages/package_tuning.py): harvested from a compile cache,
written back into a fresh one where Inductor reads them, checked against the build they are
used for."""

from __future__ import annotations

import json

import pytest

from laya_build.errors import ConfigError
from laya_build.stages import package_tuning as tuning

ENTRY = {"XBLOCK": 256, "configs_hash": "1b2c", "found_by_coordesc": False, "num_stages": 1, "num_warps": 4}
BUILD = {"torch_version": "2.11.0+cu130", "target": "cuda", "dtype": "bfloat16"}


def write_best_config(cache, rel, data):
    path = cache / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_harvest_drops_what_varies_and_seed_writes_it_back(tmp_path):
    cache = tmp_path / "cache"
    write_best_config(cache, "ab/kernel1.best_config", {**ENTRY, "time_taken_ms": 17, "triton_cache_hash": "ff"})
    write_best_config(cache, "cd/kernel2.best_config", {**ENTRY, "XBLOCK": 1024})
    (cache / "ab" / "kernel1.py").write_text("# a kernel source, not an entry\n")
    entries = tuning.harvest(cache)
    assert entries == {"ab/kernel1.best_config": ENTRY, "cd/kernel2.best_config": {**ENTRY, "XBLOCK": 1024}}

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert tuning.seed(fresh, entries) == 2
    assert json.loads((fresh / "ab" / "kernel1.best_config").read_text()) == ENTRY
    assert tuning.harvest(fresh) == entries
    assert tuning.compare(entries, tuning.harvest(fresh)) == {"seeded": 2, "entries": 2, "autotuned": []}


def test_compare_names_the_kernels_a_compile_tuned_itself():
    seeded = {"ab/k1.best_config": ENTRY}
    harvested = {**seeded, "cd/k2.best_config": ENTRY, "ef/k3.best_config": ENTRY}
    assert tuning.compare(seeded, harvested)["autotuned"] == ["cd/k2.best_config", "ef/k3.best_config"]
    changed = {"ab/k1.best_config": {**ENTRY, "num_warps": 8}}
    assert tuning.compare(seeded, changed)["autotuned"] == ["ab/k1.best_config"]


def test_one_tuning_gives_one_file(tmp_path):
    a = tuning.dumps(tuning.document({"b/x.best_config": ENTRY, "a/y.best_config": ENTRY}, **BUILD))
    b = tuning.dumps(tuning.document({"a/y.best_config": ENTRY, "b/x.best_config": ENTRY}, **BUILD))
    assert a == b and a.endswith("\n")
    path = tmp_path / "tuning.json"
    path.write_text(a)
    assert tuning.read(path, key="package.tuning.cuda-bfloat16", **BUILD) == {
        "a/y.best_config": ENTRY,
        "b/x.best_config": ENTRY,
    }


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "does not exist"),
        ("{not json", "is no tuning file"),
        (json.dumps({"format": "other", "entries": {}}), "format 'laya-build triton tuning 1' expected"),
        (json.dumps(tuning.document({}, **{**BUILD, "torch_version": "2.13.0+cpu"})), "tuned for torch '2.13.0+cpu'"),
        (json.dumps(tuning.document({}, **{**BUILD, "dtype": "float16"})), "tuned for dtype 'float16'"),
        (json.dumps(tuning.document({"../escape.best_config": ENTRY}, **BUILD)), "no cache-relative"),
        (json.dumps(tuning.document({"ab/kernel.py": ENTRY}, **BUILD)), "no cache-relative"),
    ],
)
def test_a_tuning_file_that_does_not_fit_is_a_config_error(tmp_path, content, expected):
    path = tmp_path / "tuning.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match="package.tuning.cuda-bfloat16") as info:
        tuning.read(path, key="package.tuning.cuda-bfloat16", **BUILD)
    assert expected in str(info.value) and "unset package.tuning.cuda-bfloat16" in str(info.value)


def test_seed_refuses_a_path_outside_the_cache(tmp_path):
    with pytest.raises(ConfigError, match="inside the compile cache"):
        tuning.seed(tmp_path, {"../outside.best_config": ENTRY})
