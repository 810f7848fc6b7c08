"""The package compile's Inductor cache folder (``laya_build.stages.package.compile_cache_key``):
AOTInductor writes its path into the package, so the same exported programs compile at the same
path, one build at a time; other programs compile beside them at once (real processes, each
holding a folder as the package stage does)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from laya_build.stages.package import compile_cache_key

HOLD = """
import sys, time
from pathlib import Path
from laya_build.runner.folders import inductor_cache
with inductor_cache(sys.argv[1]) as cache:
    Path(sys.argv[2]).write_text(str(cache))
    time.sleep(float(sys.argv[3]))
"""


def _programs(*shas: str) -> list[dict]:
    names = ("decision", "decision_single_slot")
    return [{"name": n, "exported": {"sha256": s}} for n, s in zip(names, shas)]


def test_the_key_is_the_stage_target_dtype_and_a_digest_of_the_programs():
    one = compile_cache_key("cuda", "bfloat16", _programs("a" * 64, "b" * 64))
    assert one == compile_cache_key("cuda", "bfloat16", _programs("a" * 64, "b" * 64))
    assert one.startswith("package-cuda-bfloat16-") and len(one.rsplit("-", 1)[1]) == 16
    others = {
        compile_cache_key("cuda", "bfloat16", _programs("a" * 64, "c" * 64)),
        compile_cache_key("cuda", "bfloat16", _programs("a" * 64)),
        compile_cache_key("cuda", "float32", _programs("a" * 64, "b" * 64)),
        compile_cache_key("cpu", "bfloat16", _programs("a" * 64, "b" * 64)),
    }
    assert one not in others and len(others) == 4


def _hold(key: str, marker, seconds: float, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", HOLD, key, str(marker), str(seconds)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_other_programs_compile_at_once_and_the_same_programs_take_turns(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # this user's folders, under the test's own
    mine = compile_cache_key("cpu", "float32", _programs("1" * 64))
    other = compile_cache_key("cpu", "float32", _programs("2" * 64))
    holder = _hold(mine, tmp_path / "held", 120, env)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "held").exists():
            assert holder.poll() is None and time.monotonic() < deadline, holder.communicate()[0]
            time.sleep(0.05)
        beside = _hold(other, tmp_path / "beside", 0, env)
        out = beside.communicate(timeout=60)[0]  # the holder keeps its folder for 120 s
        assert beside.returncode == 0 and "waiting" not in out, out
        assert (tmp_path / "beside").read_text() != (tmp_path / "held").read_text()

        same = _hold(mine, tmp_path / "same", 0, env)
        deadline = time.monotonic() + 60
        lines = []
        for line in same.stdout:  # it says what it waits for, then waits
            lines.append(line)
            if "waiting" in line or time.monotonic() > deadline:
                break
        assert any(f"waiting for the Inductor cache {mine}" in line for line in lines), lines
        assert same.poll() is None and not (tmp_path / "same").exists()
    finally:
        holder.kill()
        holder.wait()
    same.communicate(timeout=60)  # its turn, once the holder is gone
    assert same.returncode == 0 and (tmp_path / "same").read_text() == (tmp_path / "held").read_text()
