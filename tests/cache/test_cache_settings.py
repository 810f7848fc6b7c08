"""The cache's and the executor's settings: pipeline.yaml, the environment over it, and one
clear error (exit status 3) for a cache or an executor that cannot be used.  No build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from laya_build.cache import keys
from laya_build.cache.settings import cache_settings, default_url
from laya_build.errors import ConfigError
from laya_build.executors import executor_settings, remote_resource, resource_name
from laya_build.stage import Stage
from tests.pipeline.project import ROOT

CLEAN = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_BUILD_")}


def test_no_cache_unless_configured():
    assert cache_settings(None, env={}) is None
    assert cache_settings({"url": "/x"}, env={"LAYA_BUILD_CACHE": "off"}) is None


def test_defaults_and_environment_over_the_file(tmp_path):
    s = cache_settings({}, env={"XDG_CACHE_HOME": str(tmp_path)})
    assert (s.url, s.read, s.write, s.timeout_s) == (str(tmp_path / "laya-build" / "cache"), True, True, 10.0)
    assert default_url().endswith("laya-build/cache")
    env = {
        "LAYA_BUILD_CACHE_URL": "s3://bucket/prefix/",
        "LAYA_BUILD_CACHE_WRITE": "no",
        "LAYA_BUILD_CACHE_TIMEOUT_S": "2.5",
        "LAYA_BUILD_CACHE_ENDPOINT_URL": "http://127.0.0.1:9",
    }
    s = cache_settings({"url": "/elsewhere", "options": {"anon": False}}, env=env)
    assert (s.url, s.write, s.timeout_s) == ("s3://bucket/prefix", False, 2.5)
    assert s.options == {"anon": False, "endpoint_url": "http://127.0.0.1:9"}
    assert cache_settings({"url": "file:///srv/cache"}, env={}).url == "/srv/cache"


@pytest.mark.parametrize(
    ("cfg", "env", "says"),
    [
        ({"url": "ftp://host/cache"}, {}, "protocol 'ftp' is not supported"),
        ({"url": "relative/cache"}, {}, "is a relative path"),
        ({"url": "s3:///prefix"}, {}, "names no bucket"),
        ({}, {"LAYA_BUILD_CACHE_URL": "gs://b/p"}, "environment LAYA_BUILD_CACHE_URL"),
        ({}, {"LAYA_BUILD_CACHE_WRITE": "maybe"}, "expected yes or no"),
        ({}, {"LAYA_BUILD_CACHE_TIMEOUT_S": "-1"}, "expected seconds"),
    ],
)
def test_bad_settings_are_one_config_error(cfg, env, says):
    with pytest.raises(ConfigError) as err:
        cache_settings(cfg, env=env)
    assert says in err.value.message and err.value.hint


def _doit_list(env: dict, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "doit", "list"], cwd=cwd, env={**CLEAN, **env}, capture_output=True, text=True
    )


def test_a_bad_cache_url_exits_3_with_a_hint():
    run = _doit_list({"LAYA_BUILD_CACHE_URL": "ftp://host/cache"})
    assert run.returncode == 3, run.stdout + run.stderr
    assert "laya-build: ConfigError: environment LAYA_BUILD_CACHE_URL: cache url 'ftp://host/cache'" in run.stderr
    assert "hint:" in run.stderr


def test_ray_without_a_writable_cache_exits_3():
    run = _doit_list({"LAYA_BUILD_EXECUTOR": "ray"})
    assert run.returncode == 3, run.stdout + run.stderr
    assert "executor ray sends a stage's inputs" in run.stderr and "no cache is configured" in run.stderr
    run = _doit_list({"LAYA_BUILD_EXECUTOR": "ray", "LAYA_BUILD_CACHE_URL": "/tmp/c", "LAYA_BUILD_CACHE_WRITE": "no"})
    assert run.returncode == 3 and "read-only" in run.stderr


def test_nothing_imports_ray_or_fsspec_without_them():
    """``doit list`` without a cache or an executor imports neither Ray nor fsspec; with a cache,
    Ray still is not imported."""
    code = (
        "import json, sys; sys.argv = ['doit']; import dodo\n"
        "from doit.cmd_base import ModuleTaskLoader; from doit.doit_cmd import DoitMain\n"
        "assert DoitMain(ModuleTaskLoader(dodo)).run(['list', '--all', '-q']) == 0\n"
        "print(json.dumps([m in sys.modules for m in ('ray', 'fsspec', 's3fs')]))\n"
    )
    for env in ({}, {"LAYA_BUILD_CACHE_URL": "/tmp/unused"}):
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env={**CLEAN, **env}, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout.splitlines()[-1]) == [False, False, False]


def test_which_stages_go_to_the_cluster():
    data = {"cuda": {"archs": [{"kind": "cuda", "arch": "sm_90"}]}}
    ray = executor_settings({"kind": "ray", "remote_targets": ["cpu"]}, env={})
    assert resource_name("cuda", data, ray) == "laya_target:cuda-sm90"
    assert resource_name("cpu", data, ray).startswith("laya_target:cpu-")

    class P:
        pass

    p = P()
    p.data = data
    export_cpu = Stage("export", "cpu-float32", "", "m:f", config={"target": "cpu"})
    verify_cpu = Stage("verify", "cpu-float32", "", "m:f", config={"target": "cpu"}, always=True)
    verify_released = Stage("verify", "cpu-float32", "", "m:f", always=True)  # a release's: no target
    release = Stage("release", None, "", "m:f", config={"target": "cpu"}, always=True)
    tir = Stage("tir", "rope.bfloat16", "", "m:f", config={"target": {"kind": "cuda", "arch": "sm_90"}})
    assert remote_resource(p, export_cpu, ray) == resource_name("cpu", data, ray)
    assert remote_resource(p, verify_cpu, ray) == resource_name("cpu", data, ray)  # a build's: on the cluster
    assert remote_resource(p, verify_released, ray) is None  # a release is verified where it is asked
    assert remote_resource(p, release, ray) is None  # runs every time, here
    assert remote_resource(p, tir, ray) is None
    assert remote_resource(p, export_cpu, None) is None
    assert executor_settings(None, env={}) is None
    assert executor_settings({}, env={"LAYA_BUILD_EXECUTOR": "ray"}).address == "auto"


def _fake_smi(tmp_path, monkeypatch, rows: list[str]) -> None:
    from laya_build import executors

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncat <<'EOF'\n" + "\n".join(rows) + "\nEOF\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(executors, "gpu_visible", lambda: True)
    executors.local_cuda_archs.cache_clear()


def test_a_cuda_stage_built_here_is_keyed_by_the_arch_of_its_gpu(tmp_path, monkeypatch):
    """A CUDA package built here and one built on a worker for this kind of GPU share a key;
    packages built on GPUs of two architectures never do (their cubins differ)."""
    from laya_build import executors
    from laya_build.executors import key_resource

    data = {"cuda": {"archs": [{"kind": "cuda", "arch": "sm_90"}]}}

    class P:
        pass

    p = P()
    p.data = data
    package_cuda = Stage("aoti_package", "cuda-bfloat16", "", "m:f", config={"target": "cuda"})
    package_cpu = Stage("aoti_package", "cpu-float32", "", "m:f", config={"target": "cpu"})
    dispatched = key_resource(p, package_cuda, executor_settings({"kind": "ray", "remote_targets": ["cuda"]}, env={}))
    assert dispatched == resource_name("cuda", data, executor_settings({"kind": "ray"}, env={}))
    try:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        _fake_smi(tmp_path, monkeypatch, ["0, GPU-aaaa, 9.0"])
        here = key_resource(p, package_cuda, None)
        assert here == dispatched == "laya_target:cuda-sm90"
        assert keys.machine((), here) == keys.machine((), dispatched)
        assert key_resource(p, package_cpu, None) is None  # a CPU stage: the CPU's type, as before

        _fake_smi(tmp_path, monkeypatch, ["0, GPU-aaaa, 8.0"])
        assert key_resource(p, package_cuda, None) == "laya_target:cuda-sm80"

        _fake_smi(tmp_path, monkeypatch, ["0, GPU-aaaa1111, 8.0", "1, GPU-bbbb2222, 9.0"])
        assert key_resource(p, package_cuda, None) == "laya_target:cuda-sm80+sm90"
        both = "sm80+sm90"  # where CUDA's choice cannot be told for certain: every GPU of the host
        for order, visible, arch in (
            ("PCI_BUS_ID", "1", "sm90"),
            ("PCI_BUS_ID", "0", "sm80"),
            (None, "1", both),  # CUDA counts fastest first unless told PCI_BUS_ID: not nvidia-smi's index
            (None, "GPU-aaaa1111", "sm80"),
            (None, "gpu-BBBB", "sm90"),  # a UUID prefix, in any case, as CUDA takes it
            (None, "MIG-0f3c1e8a-1234", both),
            (None, "GPU-cccc", both),  # names no GPU of nvidia-smi's
            ("PCI_BUS_ID", "1,-1,0", "sm90"),  # CUDA stops at the first invalid index
        ):
            if order:
                monkeypatch.setenv("CUDA_DEVICE_ORDER", order)
            else:
                monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
            executors.local_cuda_archs.cache_clear()
            assert key_resource(p, package_cuda, None) == f"laya_target:cuda-{arch}", (order, visible)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES")

        _fake_smi(tmp_path, monkeypatch, [])  # nothing names the GPU: such a build is never cached
        monkeypatch.setattr(executors, "Path", lambda *a: tmp_path / "no-driver-information")
        executors.local_cuda_archs.cache_clear()
        assert key_resource(p, package_cuda, None) == f"laya_target:cuda-{executors.UNIDENTIFIED_GPU}"
        monkeypatch.undo()

        monkeypatch.setattr(executors, "gpu_visible", lambda: False)  # no GPU here: nothing to name
        executors.local_cuda_archs.cache_clear()
        assert key_resource(p, package_cuda, None) is None
    finally:
        executors.local_cuda_archs.cache_clear()


def test_a_key_does_not_depend_on_the_checkout_folder(tmp_path):
    """The same sources, config and inputs in two folders: one key; one byte changed: another."""
    parts = []
    for name in ("one", "two"):
        root = tmp_path / name
        (root / "pkg").mkdir(parents=True)
        (root / "pkg" / "mod.py").write_text("X = 1\n")
        (root / "in.json").write_text("{}")
        out = root / "artifacts" / "0.1.0"
        stage = Stage(
            "tir",
            "a",
            "",
            "pkg.mod:f",
            spec={"out": str(out / "a.txt"), "n": 3},
            record=out / "a.json",
            inputs=(root / "in.json",),
            config={"n": 3},
            writes_into=out,
        )
        parts.append(
            keys.key_parts(
                root, stage, code=[str(root / "pkg" / "mod.py")], version="0.1.0", third_party=frozenset(), tools=()
            )
        )
    assert keys.digest(parts[0]) == keys.digest(parts[1])
    assert str(tmp_path) not in json.dumps(parts[0])
    (tmp_path / "two" / "pkg" / "mod.py").write_text("X = 2\n")
    changed = keys.key_parts(
        tmp_path / "two",
        stage,
        code=[str(tmp_path / "two" / "pkg" / "mod.py")],
        version="0.1.0",
        third_party=frozenset(),
        tools=(),
    )
    assert keys.digest(changed) != keys.digest(parts[0])
    assert keys.differences(changed, parts[0]) == ["code: pkg/mod.py"]


def test_a_cuda_build_on_a_gpu_nothing_names_is_built_here_neither_fetched_nor_stored(tmp_path, monkeypatch, capsys):
    """Its key could not tell its GPU from any other unnamed one: the cache is not asked."""
    from laya_build import cache, executors
    from laya_build.layout import ArtifactsLayout
    from laya_build.runner import stage as runner_stage
    from laya_build.tasks.cache import cached_action

    class P:
        pass

    p = P()
    p.cache, p.executor, p.root, p.version = {"url": str(tmp_path / "cache")}, None, tmp_path, "0.1.0"
    p.data = {"cuda": {"archs": [{"kind": "cuda", "arch": "sm_90"}]}}
    p.artifacts = ArtifactsLayout(tmp_path / "artifacts")
    version = tmp_path / "artifacts" / "0.1.0"
    stage = Stage(
        "aoti_package",
        "cuda-bfloat16",
        "",
        "m:f",
        config={"target": "cuda"},
        files=(version / "aoti_package" / "decision.pt2",),
        writes_into=version,
        outputs_record=tmp_path / "artifacts" / ".doit" / "outputs" / "0.1.0" / "aoti_package.json",
    )
    for name in ("LAYA_BUILD_CACHE", "LAYA_BUILD_CACHE_URL", "LAYA_BUILD_CACHE_READ", "LAYA_BUILD_CACHE_WRITE"):
        monkeypatch.delenv(name, raising=False)
    assert cache.cacheable(stage)
    done = []
    monkeypatch.setattr(runner_stage, "run_stage", lambda s: done.append("built"))
    monkeypatch.setattr(cache, "fetch", lambda *a, **k: done.append("asked") and False)  # a miss
    monkeypatch.setattr(cache, "store", lambda *a, **k: done.append("stored"))
    monkeypatch.setattr(executors, "local_cuda_archs", lambda: ("sm90",))
    cached_action(p, stage, [], frozenset(), ())()
    assert done == ["asked", "built", "stored"]  # a named GPU: the cache is asked, the build stored
    done.clear()
    monkeypatch.setattr(executors, "local_cuda_archs", lambda: (executors.UNIDENTIFIED_GPU,))
    capsys.readouterr()
    cached_action(p, stage, [], frozenset(), ())()
    assert done == ["built"]
    assert "nothing names this machine's GPU" in capsys.readouterr().err
