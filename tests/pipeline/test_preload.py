"""What a process loads before a package (``<stage>.preload.<target>``): a module is imported;
``lib:<package>`` loads only the package's native library, globally, without importing the package;
an entry not installed is reported missing.  The configuration accepts both forms and nothing else."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import yaml

from laya_build import PROJECT_ROOT, config

PROBE = r"""
import json, sys
from laya_build.runtime.preload import library_of, preload_all
result = preload_all(sys.argv[1:])
maps = open("/proc/self/maps").read()
lib = library_of("tvm_ffi")
print(json.dumps({
    **result,
    "modules": sorted(m for m in ("tvm_ffi", "tilelang", "torch", "json") if m in sys.modules),
    "library": str(lib) if lib else None,
    "library_mapped": bool(lib) and str(lib.resolve()) in maps,
}))
"""


def preloaded(*names: str) -> dict:
    run = subprocess.run(
        [sys.executable, "-c", PROBE, *names], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_library_preload_loads_the_library_alone():
    out = preloaded("lib:tvm_ffi")
    assert out["library"] and out["library"].endswith("tvm_ffi/lib/libtvm_ffi.so")
    assert out["imported"] == ["lib:tvm_ffi"] and out["missing"] == []
    assert out["library_mapped"] is True
    assert "tvm_ffi" not in out["modules"] and "torch" not in out["modules"]


def test_modules_are_imported_and_what_is_not_installed_is_missing():
    out = preloaded("json", "lib:no_such_package_here", "no_such_module_here", "lib:json")
    assert out["imported"] == ["json"]
    assert out["missing"] == ["lib:no_such_package_here", "no_such_module_here", "lib:json"]  # json ships no lib/
    assert out["library_mapped"] is False


def _with_preload(entry: str) -> dict:
    data = copy.deepcopy(yaml.safe_load((PROJECT_ROOT / "pipeline.yaml").read_text()))
    data.setdefault("verify", {})["preload"] = {"cpu": [entry], "cuda": []}
    return data


@pytest.mark.parametrize("entry", ["lib:tvm_ffi", "tilelang", "cuda.bindings.runtime"])
def test_the_configuration_takes_modules_and_libraries(tmp_path, entry):
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(_with_preload(entry)))
    assert config.load(tmp_path / "pipeline.yaml", root=tmp_path).data["verify"]["preload"]["cpu"] == [entry]


@pytest.mark.parametrize(
    "entry", ["lib:", "lib:tvm_ffi/lib/libtvm_ffi.so", "/usr/lib/libx.so", "lib:../x", "so:tvm_ffi"]
)
def test_the_configuration_refuses_anything_else(tmp_path, entry):
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(_with_preload(entry)))
    with pytest.raises(config.ConfigError) as info:
        config.load(tmp_path / "pipeline.yaml", root=tmp_path)
    assert "verify.preload.cpu.0" in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipeline.yaml"]
