"""laya_build.runtime.gpu_state: the GPU's clocks, power and clock limits sampled beside a timing.

These machines have no GPU, so ``nvidia-smi`` is a stand-in on ``PATH`` that answers the query
as the real one does (``--format=csv,noheader,nounits``, a line every ``-lms`` milliseconds),
records what it was asked and its process id, and ends on a broken pipe as a C program does.
The summaries, the schema, the process table and the messages are then the real ones.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import jsonschema
import pytest

from laya_build.runtime import gpu_state
from laya_build.schema import _registry

FAKE = textwrap.dedent(
    """\
    #!{python}
    import json, os, sys, time
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "asked.tmp"), "w") as fh:
        json.dump({{"argv": sys.argv[1:], "pid": os.getpid()}}, fh)
    os.replace(os.path.join(here, "asked.tmp"), os.path.join(here, "asked.json"))
    mode = os.environ.get("FAKE_SMI_MODE", "ok")
    if mode == "fail":
        print('Field "clocks_event_reasons.active" is not a valid field to query.', flush=True)
        sys.exit(2)
    lines = json.loads(os.environ["FAKE_SMI_LINES"])
    interval = int(sys.argv[sys.argv.index("-lms") + 1]) / 1000
    i = 0
    try:
        while True:
            sys.stdout.write(lines[i % len(lines)] + "\\n")
            sys.stdout.flush()
            i += 1
            time.sleep(interval)
    except BrokenPipeError:  # the reader is gone: end, as SIGPIPE ends nvidia-smi
        os._exit(141)
    """
)

LINES = [
    "1980, 3201, 512.30, 52, 0x0000000000000000",
    "1890, 3201, 699.80, 58, 0x0000000000000004",
    "1860, 3201, 701.20, 59, 0x0000000000000004",
    "1935, 3201, [N/A], 59, 0x0000000000000000",
]


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    folder = tmp_path / "bin"
    folder.mkdir()
    exe = folder / "nvidia-smi"
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SMI_LINES", json.dumps(LINES))
    return folder


def until(condition, what: str, timeout: float = 60) -> None:
    """Wait for what a freshly started stand-in does: a loaded machine starts Python slowly."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.02)


def asked(folder) -> dict:
    until((folder / "asked.json").exists, "the stand-in nvidia-smi started")
    return json.loads((folder / "asked.json").read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is no running process
        return fh.read().split(") ", 1)[1][0] != "Z"


def gpu_state_validator():
    schema = {"$ref": "model_common.schema.json#/$defs/gpu_state"}
    return jsonschema.Draft202012Validator(schema, registry=_registry())


def test_a_sampled_block_reports_clocks_power_and_the_limits_active(fake_smi):
    with gpu_state.GpuSampler("GPU-1234", interval_ms=20) as sampler:
        until(lambda: len(sampler._lines) >= 8, "eight samples")
    summary = sampler.summary
    assert summary["samples"] >= 8 and summary["interval_ms"] == 20
    assert summary["sm_clock_mhz"]["min"] == 1860 and summary["sm_clock_mhz"]["max"] == 1980
    assert 1860 <= summary["sm_clock_mhz"]["median"] <= 1980
    assert summary["memory_clock_mhz"] == {"median": 3201}
    assert summary["power_w"]["max"] == 701.2  # "[N/A]" samples count for the clocks only
    assert summary["temperature_c"] == {"max": 59}
    assert list(summary["clock_limits"]) == ["sw_power_cap"]
    assert 0.3 <= summary["clock_limits"]["sw_power_cap"] <= 0.7  # two lines of four
    gpu_state_validator().validate(summary)
    argv = asked(fake_smi)["argv"]
    assert argv[:2] == ["-i", "GPU-1234"] and argv[-2:] == ["-lms", "20"]
    assert f"--query-gpu={','.join(gpu_state.QUERY)}" in argv and "--format=csv,noheader,nounits" in argv


def test_the_sampler_ends_with_its_block_also_when_the_block_raises(fake_smi):
    with pytest.raises(RuntimeError, match="timed call failed"):
        with gpu_state.GpuSampler("GPU-1234", interval_ms=20) as sampler:
            until(lambda: sampler._lines, "a sample")
            raise RuntimeError("timed call failed")
    pid = asked(fake_smi)["pid"]
    assert not alive(pid)
    assert sampler.summary["samples"] >= 1  # what was sampled before the failure is kept


def test_a_killed_timing_process_leaves_no_sampler_behind(fake_smi):
    code = (
        "import time; from laya_build.runtime.gpu_state import GpuSampler\n"
        "with GpuSampler('GPU-1234', interval_ms=20):\n"
        "    print('sampling', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "sampling"
        pid = asked(fake_smi)["pid"]
        assert alive(pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        until(lambda: not alive(pid), "the sampler ended with the process that timed")
    finally:
        proc.kill()
        proc.wait()


def test_a_failing_or_missing_nvidia_smi_says_why_and_the_timing_stands(fake_smi, monkeypatch):
    monkeypatch.setenv("FAKE_SMI_MODE", "fail")
    with gpu_state.GpuSampler("GPU-1234") as sampler:
        sampler._proc.wait(60)  # it prints its complaint and exits
    assert sampler.summary == {
        "unavailable": 'nvidia-smi gave no sample (exit code 2: Field "clocks_event_reasons.active" '
        "is not a valid field to query.)"
    }
    gpu_state_validator().validate(sampler.summary)
    monkeypatch.setenv("PATH", str(fake_smi / "nowhere"))
    with gpu_state.GpuSampler("GPU-1234") as sampler:
        pass
    assert sampler.summary == {"unavailable": "nvidia-smi is not on PATH"}
    with gpu_state.GpuSampler(None) as sampler:  # no CUDA device: nothing is asked for
        pass
    assert sampler.summary is None


def test_lines_that_are_no_sample_are_left_out():
    assert gpu_state.parse("1980, 3201, 120.5, 36, 0x0000000000000001")["reasons"] == 1
    assert gpu_state.parse("No devices were found") is None
    assert gpu_state.parse("[N/A], 3201, 120.5, 36, 0x1") is None  # no SM clock: no sample
    assert gpu_state.parse("1980, 3201, 120.5, 36, [N/A]")["reasons"] is None


def test_a_cpu_timing_records_no_gpu_state():
    import torch

    from laya_build.runtime.timing import time_calls

    result = time_calls(lambda t: t.sum(), (torch.ones(8),), {"warmup": 1, "min_run_time_s": 0.01}, "cpu")
    assert "gpu" not in result and gpu_state.device_id("cpu") is None


def test_the_sentence_of_a_latency_table_names_the_clocks_and_the_limits():
    limited = gpu_state.summarise([gpu_state.parse(line) for line in LINES])
    free = gpu_state.summarise([gpu_state.parse(LINES[0])])
    assert gpu_state.describe([limited, free]) == (
        "The GPU while timed (2 timings, nvidia-smi): SM clock 1860-1980 MHz; up to 701.2 W; "
        "clock limits active: sw_power_cap in 1 of 2."
    )
    assert gpu_state.describe([free]).endswith("no clock limit active.")
    assert gpu_state.describe([None, None]) is None
    assert gpu_state.describe([{"unavailable": "nvidia-smi is not on PATH"}]) == (
        "The GPU's clocks were not sampled: nvidia-smi is not on PATH."
    )


def test_the_schema_names_every_clock_limit_the_sampler_reports():
    schema = json.loads((gpu_state_schema_path()).read_text())["$defs"]["gpu_state"]
    sampled = next(s for s in schema["oneOf"] if "samples" in s["properties"])
    assert sampled["properties"]["clock_limits"]["propertyNames"]["enum"] == list(gpu_state.REASONS.values())


def gpu_state_schema_path():
    from laya_build.schema import SCHEMA_DIR

    return SCHEMA_DIR / "model_common.schema.json"


def test_latency_md_says_the_gpu_s_state_under_its_table():
    from laya_build.stages.latency import markdown

    limited = gpu_state.summarise([gpu_state.parse(line) for line in LINES])

    def record(gpu):
        latency = {"median_ms": 3.1, "iqr_ms": 0.01, "runs": 40, "block_size": 4, "blocks_ms": [3.1]}
        batch = {"batch": 0, "shape": {"rows": 7, "tokens": 256, "slots": 4}, "latency": {**latency, **gpu}}
        variant = {"name": "package_graphed", "dtype": "bfloat16", "description": "d", "batches": [batch]}
        variant["parity_vs_eager_amp"] = None
        return {
            "target": "cuda",
            "timing": {"warmup": 10, "min_run_time_s": 1.0, "max_run_time_s": 5.0},
            "packages": [{"dtype": "bfloat16", "sha256": "0" * 64}],
            "skipped_packages": [],
            "variants": [variant],
        }

    shapes = [{"rows": 7, "tokens": 256, "slots": 4}]
    text = markdown(record({"gpu": limited}), shapes)
    assert text.rstrip().endswith(
        "The GPU while timed (1 timing, nvidia-smi): SM clock 1860-1980 MHz; up to 701.2 W; "
        "clock limits active: sw_power_cap in 1 of 1."
    )
    assert "The GPU" not in markdown(record({}), shapes)  # a CPU timing: no sentence


def test_release_diff_marks_latencies_taken_at_unlike_clocks():
    from laya_build.release import model_report

    full = gpu_state.summarise([gpu_state.parse(LINES[0])])  # 1,980 MHz, no limit
    capped = gpu_state.summarise([gpu_state.parse(line) for line in LINES[1:3]])  # 1,860-1,890 MHz, power cap

    def release(figures):
        batches = [
            {"batch": i, "shape": {"rows": 1, "tokens": 128, "slots": 3}, "latency": {"median_ms": ms, **gpu}}
            for i, (ms, gpu) in enumerate(figures)
        ]
        variant = {"name": "package_graphed", "dtype": "bfloat16", "batches": batches}
        return {"latency": [("latency.json", {"status": "ok", "target": "cuda", "variants": [variant]})]}

    old = release([(1.00, {"gpu": full}), (3.00, {"gpu": full}), (0.50, {})])
    new = release([(1.01, {"gpu": full}), (3.10, {"gpu": capped}), (0.50, {})])
    rows = model_report.diff(old, new)["latency"]
    assert [(r["old_ms"], r["new_ms"]) for r in rows] == [(1.00, 1.01), (3.00, 3.10), (0.50, 0.50)]
    assert rows[1]["old_sm_clock_mhz"] == 1980 and rows[1]["new_sm_clock_mhz"] == 1875
    assert rows[1]["old_clock_limits"] == [] and rows[1]["new_clock_limits"] == ["sw_power_cap"]
    assert [model_report.unlike_clocks(r) for r in rows] == [False, True, False]
    assert "old_sm_clock_mhz" not in rows[2]  # a figure without a GPU state on either side
    md = "\n".join(model_report.diff_sections({"packages": [], "verify": [], "latency": rows}, "0.1", "0.2"))
    assert "| 0.1 SM MHz | 0.2 SM MHz | clock limits (old / new) |" in md
    assert "| 3 | 3.1 | 1980 | 1875 | - / sw_power_cap (unlike clocks) |" in md
    assert "| 1 | 1.01 | 1980 | 1980 | - / - |" in md
    assert "| 2 | 0.5 | 0.5 |  |  |  |" in md
    plain = model_report.diff(release([(1.0, {})]), release([(1.1, {})]))
    md = "\n".join(model_report.diff_sections({"packages": [], "verify": [], **plain}, "0.1", "0.2"))
    assert "SM MHz" not in md  # releases timed without a GPU state keep the table they had


def test_a_release_report_says_the_gpu_s_state_under_its_latency_tables():
    from laya_build.release import model_report

    capped = gpu_state.summarise([gpu_state.parse(line) for line in LINES])
    latency = {"median_ms": 3.1, "iqr_ms": 0.01, "runs": 40, "block_size": 4, "blocks_ms": [3.1], "gpu": capped}
    batch = {"batch": 0, "shape": {"rows": 7, "tokens": 256, "slots": 4}, "latency": latency}
    variant = {"name": "package_graphed", "dtype": "bfloat16", "description": "d", "batches": [batch]}
    record = {
        "status": "ok",
        "target": "cuda",
        "timing": {"warmup": 10, "min_run_time_s": 1.0, "max_run_time_s": 5.0},
        "variants": [variant],
    }
    heads = {
        h: {"max_logit_delta": 0.1, "max_prob_delta": 0.01, "argmax_agree": 3, "rows": 3} for h in ("decision", "act")
    }
    program = {"name": "decision", "batches": [{**batch, "compare": {}}], "summary": heads, "load_s": 1.0}
    verify = {"status": "ok", "target": "cuda", "dtype": "bfloat16", "programs": [program]}
    sentence = (
        "The GPU while timed (1 timing, nvidia-smi): SM clock 1860-1980 MHz; up to 701.2 W; "
        "clock limits active: sw_power_cap in 1 of 1."
    )
    assert "\n".join(model_report._latency_sections([("latency.json", record)])).rstrip().endswith(sentence)
    assert sentence + "\n" in model_report.sections({"verify": [("verify.json", verify)]})
    latency.pop("gpu")  # CPU figures: no sentence in either place
    assert "The GPU while timed" not in "\n".join(model_report._latency_sections([("latency.json", record)]))
    assert "The GPU while timed" not in "\n".join(model_report.sections({"verify": [("verify.json", verify)]}))
