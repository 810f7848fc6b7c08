"""Triton tuning files (laya_build/stages/package_tuning.py): harvested from a compile cache,
written back into a fresh one where Inductor reads them, checked against the build they are
used for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from laya_build import PROJECT_ROOT
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


def test_a_tuning_file_that_names_no_file_is_refused_when_the_config_is_loaded(tmp_path):
    import yaml

    from laya_build import config
    from tests.pipeline.project import ROOT

    data = yaml.safe_load((ROOT / "pipeline.yaml").read_text())
    data.setdefault("package", {})["tuning"] = {"cuda-bfloat16": "tuning/cuda-bfloat16.json"}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"invalid at package\.tuning\.cuda-bfloat16: 'tuning/cuda-bfloat16.json'"):
        config.load(path, root=tmp_path)
    (tmp_path / "tuning").mkdir()
    (tmp_path / "tuning" / "cuda-bfloat16.json").write_text("{}")
    assert config.load(path, root=tmp_path).data["package"]["tuning"] == {"cuda-bfloat16": "tuning/cuda-bfloat16.json"}
    # GEMM padding decided by timing beside a tuning file: refused at load, naming the key
    data["package"]["inductor_configs"] = {"shape_padding": True}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(
        ConfigError, match=r"invalid at package\.inductor_configs\.shape_padding: true .*remove shape_padding"
    ) as info:
        config.load(path, root=tmp_path)
    assert "package.tuning.cuda-bfloat16" in str(info.value)
    data["package"]["inductor_configs"] = {"shape_padding": False}
    path.write_text(yaml.safe_dump(data))
    assert config.load(path, root=tmp_path).data["package"]["inductor_configs"]["shape_padding"] is False


def fake_child(monkeypatch, autotuned):
    """The package stage with its compiling child replaced: it writes each package and answers
    as the child does, having tuned ``autotuned`` itself."""
    from laya_build.stages import package

    def run(target, args, child, result):
        job = args["job"]
        for spec in job["programs"]:
            open(spec["package_tmp"], "wb").write(b"a package")
        harvested = {**job["tuning"], **dict.fromkeys(autotuned, ENTRY)}
        return {
            "programs": [
                {"name": p["name"], "package_s": 1.0, "load_s": 0.1, "restored_hints": []} for p in job["programs"]
            ],
            "tuning": harvested,
            "tuning_use": tuning.compare(job["tuning"], harvested),
            "kernels": {
                e: {"name": f"triton_poi_fused_{i}", "source": f"# kernel {i}\n"}
                for i, e in enumerate(sorted(harvested))
            },
            "determinism": {
                "ptxas_source_mtime": {"applied": False, "reason": "test"},
                "int_array_targets_kept": {"applied": True},
                "no_timed_padding": {"applied": True},
            },
            "env_info": None,
            "preload": {"imported": [], "missing": []},
            "cache": {"files": 0, "bytes": 0},
        }

    monkeypatch.setattr(package, "run", run)


def write_tuning(tmp_path, dtype):
    import torch

    path = tmp_path / "tuning.json"
    doc = tuning.document({"ab/k1.best_config": ENTRY}, torch_version=torch.__version__, target="cpu", dtype=dtype)
    path.write_text(tuning.dumps(doc))
    return path


def test_a_seeded_compile_records_its_input_and_writes_the_same_tuning(build, tmp_path, monkeypatch):
    from laya_build.records import sha256_file
    from tests.stage_calls import run_package

    fake_child(monkeypatch, autotuned=[])
    path = write_tuning(tmp_path, "float32")
    cfg = {"tuning": {"cpu-float32": "tuning.json"}}
    record = run_package(cfg, build.export_dir("float32"), tmp_path / "out", "cpu", root=tmp_path)
    assert record["tuning"]["input"] == {
        "path": "tuning.json",
        "bytes": path.stat().st_size,
        "sha256": sha256_file(path),
        "entries": 1,
    }
    assert record["tuning"]["autotuned"] == 0 and record["tuning"]["entries"] == 1
    assert (tmp_path / "out" / tuning.FILE).read_bytes() == path.read_bytes()
    assert record["tuning"]["file"]["sha256"] == sha256_file(path)


def test_a_compile_that_had_to_tune_fails_and_leaves_its_tuning(build, tmp_path, monkeypatch):
    from laya_build.errors import StageError
    from tests.stage_calls import run_package

    fake_child(monkeypatch, autotuned=["cd/k2.best_config"])
    write_tuning(tmp_path, "float32")
    cfg = {"tuning": {"cpu-float32": "tuning.json"}}
    out = tmp_path / "out"
    with pytest.raises(StageError, match=r"holds no launch configuration for 1 of the 2 tuned") as info:
        run_package(cfg, build.export_dir("float32"), out, "cpu", root=tmp_path)
    message = str(info.value)
    assert f"copy {out / tuning.FILE}" in message and "(triton_poi_fused_1)" in message
    assert f"their Inductor sources are in {out / tuning.UNTUNED_DIR}" in message
    assert f"the files of the same names in {tuning.SOURCES_DIR}/" in message
    # no package, no record
    assert sorted(p.name for p in out.iterdir()) == sorted([tuning.SOURCES_DIR, tuning.UNTUNED_DIR, tuning.FILE])
    assert "cd/k2.best_config" in json.loads((out / tuning.FILE).read_text())["entries"]
    assert [(p.name, p.read_text()) for p in (out / tuning.UNTUNED_DIR).iterdir()] == [
        ("triton_poi_fused_1.py", "# kernel 1\n")
    ]
    assert sorted((p.name, p.read_text()) for p in (out / tuning.SOURCES_DIR).iterdir()) == [
        ("triton_poi_fused_0.py", "# kernel 0\n"),
        ("triton_poi_fused_1.py", "# kernel 1\n"),
    ]
    # the same build once the file holds them: a package, the sources of its kernels, and no
    # untuned kernels left from before
    fake_child(monkeypatch, autotuned=[])
    run_package(cfg, build.export_dir("float32"), out, "cpu", root=tmp_path)
    assert not (out / tuning.UNTUNED_DIR).exists()
    assert [p.name for p in (out / tuning.SOURCES_DIR).iterdir()] == ["triton_poi_fused_0.py"]


def test_gemm_padding_by_timing_with_a_tuning_file_is_refused_before_the_compile(build, tmp_path, monkeypatch):
    from tests.stage_calls import run_package

    fake_child(monkeypatch, autotuned=[])
    write_tuning(tmp_path, "float32")
    out = tmp_path / "out"
    cfg = {"tuning": {"cpu-float32": "tuning.json"}, "inductor_configs": {"shape_padding": True}}
    with pytest.raises(ConfigError, match=r"package.inductor_configs.shape_padding: true .* remove shape_padding"):
        run_package(cfg, build.export_dir("float32"), out, "cpu", root=tmp_path)
    assert not out.exists()
    # without a tuning file the build's bytes are not claimed reproducible: it compiles
    cfg = {"inductor_configs": {"shape_padding": True}}
    assert run_package(cfg, build.export_dir("float32"), out, "cpu", root=tmp_path)["status"] == "ok"


def test_an_entry_names_the_inductor_kernel_it_configures(tmp_path):
    """kernel_sources finds the kernel module beside a .best_config as Inductor itself writes
    both (its code cache and its autotune cache, in a fresh interpreter with its own cache)."""
    script = textwrap.dedent(
        """
        import json, os, sys
        import triton
        from torch._inductor.codecache import PyCodeCache
        from torch._inductor.runtime.autotune_cache import AutotuneCache
        from laya_build.stages import package_tuning
        from laya_build.stages.children.package import kernel_sources

        sources = {}
        for name in ("triton_poi_fused_add_0", "triton_per_fused_native_layer_norm_1"):
            source = f"import triton\\n\\n@triton.jit\\ndef {name}(in_ptr0, xnumel, XBLOCK):\\n    pass\\n"
            _, path = PyCodeCache.write(source)
            AutotuneCache.create({"autotune_local_cache": True}, path, "h").save(
                triton.Config({"XBLOCK": 128}, num_warps=4, num_stages=1), 1000
            )
            sources[name] = source
        PyCodeCache.write("def helper():\\n    pass\\n")  # a module no entry configures
        cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        entries = package_tuning.harvest(cache)
        found = kernel_sources(cache, list(entries))
        print(json.dumps({"entries": len(entries), "found": {v["name"]: v["source"] for v in found.values()},
                          "sources": sources, "none": kernel_sources(cache, ["zz/none.best_config"])}))
        """
    )
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(PROJECT_ROOT)}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["entries"] == 2 and got["found"] == got["sources"] and got["none"] == {}


def test_the_h200_configuration_names_a_tuning_file_of_its_build(tmp_path):
    """pipeline.h200.yaml compiles its CUDA package with the committed tuning file: it loads as
    that build's file for the stack it was made on.  With pointwise kernels untimed nothing of
    that export is timed, so the file holds no entry (a build that would time a kernel fails);
    the file of the same export with pointwise kernels timed holds its 9 kernels' entries, and
    each seeds a cache."""
    import yaml

    from laya_build import PROJECT_ROOT

    cfg = yaml.safe_load((PROJECT_ROOT / "pipeline.h200.yaml").read_text())
    assert cfg["package"]["inductor_configs"]["triton.autotune_pointwise"] is False
    for rel, count in ((cfg["package"]["tuning"]["cuda-bfloat16"], 0), ("tuning/h200-cuda-bfloat16-read.json", 9)):
        doc = json.loads((PROJECT_ROOT / rel).read_text())
        entries = tuning.read(
            PROJECT_ROOT / rel, torch_version=doc["torch"], target="cuda", dtype="bfloat16", key="cuda-bfloat16"
        )
        assert doc["torch"].endswith("+cu130") and len(entries) == len(doc["entries"]) == count, rel
        assert all(k.endswith(tuning.SUFFIX) and "time_taken_ms" not in v for k, v in entries.items())
        assert tuning.seed(tmp_path / rel, entries) == count
        assert len(list((tmp_path / rel).rglob(f"*{tuning.SUFFIX}"))) == count


def test_untuned_kernels_of_one_name_in_two_programs_keep_both_sources(tmp_path):
    kernels = {
        "ab/k1.best_config": {"name": "triton_poi_fused_0", "source": "# one\n"},
        "cd/k2.best_config": {"name": "triton_poi_fused_0", "source": "# two\n"},
        "ef/k3.best_config": {"name": None, "source": "# unnamed\n"},
    }
    folder = tuning.write_sources(tmp_path, tuning.UNTUNED_DIR, kernels)
    assert {p.name: p.read_text() for p in folder.iterdir()} == {
        "triton_poi_fused_0.py": "# one\n",
        "triton_poi_fused_0-k2.py": "# two\n",
        "k3.py": "# unnamed\n",
    }
    assert tuning.write_sources(tmp_path, tuning.UNTUNED_DIR, {}) is None and not folder.exists()
