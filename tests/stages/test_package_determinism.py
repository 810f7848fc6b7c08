"""What the package child fixes for reproducible CUDA bytes
(laya_build/stages/children/determinism.py), checked without a GPU: the ptxas wrapper against a
stand-in ptxas, the int-array cache of Inductor's C++ wrapper on torch's own class, the GEMM
padding decided by timings turned off."""

from __future__ import annotations

import itertools
import os
import subprocess

import pytest

from laya_build.stages.children import determinism

STAND_IN = """#!/bin/sh
echo "args: $*"
stat -c '%n %Y' {files}
"""


@pytest.fixture
def ptxas(tmp_path, monkeypatch):
    """A stand-in ptxas that prints its arguments and the sources' modification times, and a
    compile cache with one kernel source (another file outside it)."""
    cache = tmp_path / "cache"
    (cache / "gp").mkdir(parents=True)
    kernel, outside = cache / "gp" / "ckernel.py", tmp_path / "standard.py"
    for path in (kernel, outside):
        path.write_text("source\n")
        os.utime(path, (1_796_000_000, 1_796_000_000))
    real = tmp_path / "real-ptxas"
    real.write_text(STAND_IN.format(files=f"{kernel} {outside}"))
    real.chmod(0o755)
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(real))
    ptx = tmp_path / "tmpab12cd34.ptx"
    ptx.write_text(f'.version 8.7\n.target sm_90a\n\t.file\t1 "{kernel}"\n\t.file\t2 "{outside}"\n')
    return cache, kernel, outside, ptx


def test_the_ptxas_wrapper_fixes_the_times_of_the_caches_sources_only(ptxas, tmp_path):
    cache, kernel, outside, ptx = ptxas
    done = determinism.fixed_mtime_ptxas(tmp_path / "wrapper", cache)
    assert done == {"applied": True, "ptxas": str(tmp_path / "real-ptxas"), "source_mtime": determinism.SOURCE_MTIME}
    wrapper = os.environ["TRITON_PTXAS_PATH"]
    assert wrapper == str(tmp_path / "wrapper" / "ptxas")
    args = ["-lineinfo", "-v", "--gpu-name=sm_90a", str(ptx), "-o", f"{ptx}.o"]
    out = subprocess.run([wrapper, *args], capture_output=True, text=True, check=True).stdout
    assert f"args: {' '.join(args)}" in out  # the real ptxas gets the same command line
    assert f"{kernel} {determinism.SOURCE_MTIME}" in out and f"{outside} 1796000000" in out
    # a second call in the same process leaves the wrapper in front, never in front of itself
    assert determinism.fixed_mtime_ptxas(tmp_path / "wrapper", cache) == {"applied": True, "ptxas": wrapper}
    version = subprocess.run([wrapper, "--version"], capture_output=True, text=True, check=True).stdout
    assert version.startswith("args: --version")


def test_without_triton_the_wrapper_is_not_written(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    monkeypatch.setattr(determinism, "real_ptxas", lambda: None)
    assert determinism.fixed_mtime_ptxas(tmp_path / "wrapper", tmp_path)["applied"] is False
    assert not (tmp_path / "wrapper").exists() and "TRITON_PTXAS_PATH" not in os.environ


def new_wrapper():
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    from torch.utils._ordered_set import OrderedSet

    wrapper = CppWrapperCpu.__new__(CppWrapperCpu)
    wrapper.int_array_id = itertools.count()
    wrapper.declared_int_array_vars = OrderedSet()
    wrapper.codegen_int_array_var_cache = {}
    return wrapper


def test_every_fresh_writeline_target_gets_its_own_declaration():
    """Short-lived buffers (and bound methods) that die after the call must never hand their
    ``id`` to a later one: each fresh buffer holds the declaration of the name it was given."""
    from torch._inductor.utils import IndentedBuffer

    assert determinism.keep_int_array_targets()["applied"] is True
    wrapper = new_wrapper()
    for _ in range(64):
        buffer = IndentedBuffer()
        name = wrapper.codegen_int_array_var("{2L, 3L}", buffer.writeline)
        assert f"{name}[] = {{2L, 3L}};" in buffer.getvalue()
        del buffer


def test_a_live_target_still_shares_its_declaration():
    from torch._inductor.utils import IndentedBuffer

    determinism.keep_int_array_targets()
    wrapper = new_wrapper()
    buffer = IndentedBuffer()
    first = wrapper.codegen_int_array_var("{2L, 3L}", buffer.writeline)
    assert wrapper.codegen_int_array_var("{2L, 3L}", buffer.writeline) == first
    assert buffer.getvalue().count(f"{first}[] = {{2L, 3L}};") == 1


def test_gemm_padding_by_timing_is_off_unless_the_config_sets_it(monkeypatch):
    from torch._inductor import config

    monkeypatch.setattr(config, "shape_padding", True)  # Inductor's default
    assert determinism.no_timed_padding({"shape_padding": True}) == {
        "applied": False,
        "reason": "package.inductor_configs sets shape_padding: True",
    }
    assert config.shape_padding is True
    assert determinism.no_timed_padding({"aot_inductor.check_lowerbound": False}) == {"applied": True}
    assert config.shape_padding is False
