"""laya_build.runtime on the session's CPU packages: padded calls equal the plain package on the
real rows, integrity and ISA checks come before loading, bad calls name what is wrong."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from stage_build import DTYPES
from torch.testing import assert_close

from laya_build.config.sections import section
from laya_build.errors import ConfigError, PackageIntegrityError, PackageIsaError, RuntimeInputError
from laya_build.records import read_record
from laya_build.runtime import serving as runtime
from laya_build.runtime.buckets import Bucket, ExportDims, parse_buckets, smallest_holding

# Batch 0 (1x32x2) is bucket 0 exactly; batch 1 (2x64x3) is padded in rows, tokens and
# slots to bucket 1; batch 2 (4x512x8) is larger than every bucket (the plain package).
BUCKETS = [{"rows": 1, "tokens": 32, "slots": 2}, {"rows": 4, "tokens": 128}]


@pytest.fixture(scope="module")
def inputs(build):
    return torch.load(build.inputs, weights_only=True)


@pytest.fixture(scope="module", params=DTYPES)
def dtype(request):
    return request.param


@pytest.fixture(scope="module")
def runner(build, dtype):
    return runtime.open_build(build.package_record(dtype), buckets=BUCKETS)


def args_of(batch, inputs, tokens=None, slots=None):
    """A batch's five tensors, cut or widened (with padding) to ``tokens`` and ``slots``."""
    ids, mask, pos, pmask, qtype = (batch[k] for k in inputs["arg_names"])

    def resize(t, width, fill):
        if width is None or width == t.shape[1]:
            return t
        if width < t.shape[1]:
            return t[:, :width].contiguous()
        return torch.cat([t, torch.full((t.shape[0], width - t.shape[1]), fill, dtype=t.dtype)], 1)

    pad = inputs["special_ids"]["pad_token_id"]
    return (resize(ids, tokens, pad), resize(mask, tokens, 0), resize(pos, slots, 0), resize(pmask, slots, 0), qtype)


def assert_same_answers(got, ref, dtype: str):
    """Decision and act logits within the package dtype's tolerance (the ``logit_atol`` of
    ``verify.thresholds.cpu.<dtype>``: a bf16 package's fp32 decision logits come from bf16
    states, and a padded shape changes the order of their sums), and the same argmax per row."""
    thresholds = section("verify", None)["thresholds"]["cpu"][dtype]
    for head, g, r in zip(("decision", "act"), got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype
        assert_close(g.float(), r.float(), atol=thresholds[head]["logit_atol"], rtol=0)
        assert torch.equal(g.float().argmax(-1), r.float().argmax(-1))


def test_padded_calls_equal_the_plain_package_on_every_saved_batch(runner, dtype, inputs):
    used = []
    for batch in inputs["batches"]:
        args = args_of(batch, inputs)
        used.append(runner.bucket_for(*runner.shape(args)))
        assert_same_answers(runner(*args), runner.plain(*args), dtype)
    assert used == [Bucket(1, 32, 2), Bucket(4, 128, 8), None]
    assert runner.mode == "padded_calls" and runner.capture_s == 0


def test_bucket_boundaries(runner, dtype, inputs):
    """A call one past a bucket's tokens or slots takes the next bucket (or the plain
    package), shapes the package cannot take are padded, and every answer equals the
    saved batch's on the real rows and slots."""
    b0, b1, _ = inputs["batches"]
    assert max(b0["valid_tokens"]) <= 29 and max(b1["valid_tokens"]) <= 117  # cuts keep every real token
    ref0, ref1 = runner.plain(*args_of(b0, inputs)), runner.plain(*args_of(b1, inputs))
    cases = [  # (call, bucket it must take, reference)
        (args_of(b0, inputs, tokens=29), Bucket(1, 32, 2), ref0),  # 29 tokens (not a multiple of 16)
        (args_of(b0, inputs, tokens=48), Bucket(4, 128, 8), ref0),  # one 16-step past bucket 0's tokens
        (args_of(b1, inputs, tokens=128), Bucket(4, 128, 8), ref1),  # exactly bucket 1
        (args_of(b1, inputs, tokens=117), Bucket(4, 128, 8), ref1),  # inside bucket 1
        (args_of(b1, inputs, tokens=144), None, ref1),  # past every bucket: the plain package
        (args_of(b1, inputs, tokens=129), None, ref1),  # plain, 129 tokens padded to 144
    ]
    for args, bucket, ref in cases:
        assert runner.bucket_for(*runner.shape(args)) == bucket
        assert_same_answers(runner(*args), ref, dtype)
    three = args_of(b0, inputs, slots=3)  # one slot past bucket 0: bucket 1, and three slots back
    assert runner.bucket_for(*runner.shape(three)) == Bucket(4, 128, 8)
    decision, act = runner(*three)
    assert_same_answers((decision[:, :2], act), ref0, dtype)
    assert decision[0, 2].item() == -1e4  # the model's own masked-slot logit


def test_one_option_rows_padded_to_two_slots_equal_the_single_slot_program(build, inputs):
    """slots = 1 is below the main program's minimum (2): the runner pads a masked slot,
    which must give what the separately exported one-slot branch gives."""
    record = read_record(build.package_record("float32"))
    single = next(p for p in record["programs"] if p["name"] == "decision_single_slot")
    package = runtime.load_package(
        build.package_dir("float32") / single["package"]["path"], single["package"]["sha256"]
    )
    runner = runtime.open_build(build.package_record("float32"), buckets=BUCKETS)
    for batch in inputs["single_slot_batches"]:
        args = args_of(batch, inputs)
        assert runner.shape(args)[2] == 1
        assert_same_answers(runner(*args), package(*args), "float32")


def test_calls_that_do_not_fit_name_what_is_wrong(runner, inputs):
    b2 = inputs["batches"][2]
    args = args_of(b2, inputs)
    five_rows = tuple(torch.cat([a, a[:1]]) for a in args)
    with pytest.raises(RuntimeInputError, match=r"5 rows x 512 tokens x 8 slots exceeds .*rows = 5 > 4"):
        runner(*five_rows)
    wide = tuple(torch.cat([a, a[:, :16]], 1) if a.dim() == 2 and a.shape[1] == 512 else a for a in args)
    with pytest.raises(RuntimeInputError, match=r"tokens = 528 > 512"):
        runner(*wide)
    with pytest.raises(RuntimeInputError, match=r"attention_mask must be an int64 tensor, got torch.float32"):
        runner(args[0], args[1].float(), *args[2:])
    with pytest.raises(RuntimeInputError, match=r"marker_mask has shape \(4, 7\); .* need \(4, 8\)"):
        runner(*args[:3], args[3][:, :7], args[4])
    with pytest.raises(RuntimeInputError, match=r"expected 5 tensors"):
        runner(*args[:4])


def test_tampered_package_is_refused_before_loading(build, tmp_path):
    pkg_dir = shutil.copytree(build.package_dir("bfloat16"), tmp_path / "pkg")
    package = pkg_dir / "decision.pt2"
    data = bytearray(package.read_bytes())
    data[len(data) // 3] ^= 0x01
    package.write_bytes(bytes(data))
    expected = read_record(pkg_dir / "aoti_package.json")["programs"][0]["package"]["sha256"]
    with pytest.raises(
        PackageIntegrityError,
        match=rf"decision\.pt2: sha256 \w+ does not match the package "
        rf"record's {expected}; refusing to load it",
    ):
        runtime.open_build(pkg_dir / "aoti_package.json", buckets=BUCKETS)


def test_a_skipped_build_and_a_missing_program_are_named(build, tmp_path):
    skipped = tmp_path / "aoti_package.json"
    skipped.write_text(
        json.dumps({"stage": "aoti_package", "status": "skipped", "reason": "target cuda: no CUDA", "target": "cuda"})
    )
    with pytest.raises(PackageIntegrityError, match=r"the build was skipped \(target cuda: no CUDA\)"):
        runtime.open_build(skipped)
    with pytest.raises(PackageIntegrityError, match=r"no program 'decision_single_slot' \(has decision\)"):
        runtime.open_build(build.package_record("bfloat16"), program="decision_single_slot")


def test_the_isa_question_is_answered_from_the_package(build):
    """The recorded ISA answers aoti_load_package's question only during the load, and the
    package's outputs are bit-identical to a default load (which asks torch's probe)."""
    from torch._inductor import cpu_vec_isa

    original = cpu_vec_isa.valid_vec_isa_list
    path = build.package_dir("float32") / "decision.pt2"
    sha = read_record(build.package_record("float32"))["programs"][0]["package"]["sha256"]
    package = runtime.load_package(path, sha, loader="aoti_load_package")
    assert cpu_vec_isa.valid_vec_isa_list is original
    recorded = runtime.package_metadata(path)["AOTI_CPU_ISA"]
    assert package.isa["package"] == recorded
    if runtime.cpu_isa_flags() is not None:
        assert package.isa["mode"] == "pre-answered" and package.isa["cpu"] == runtime.cpu_isa_flags()
    default = torch._inductor.aoti_load_package(str(path))
    inputs = torch.load(build.inputs, weights_only=True)
    with torch.inference_mode():
        for batch in inputs["batches"]:
            args = args_of(batch, inputs)
            for a, b in zip(package(*args), default(*args)):
                assert torch.equal(a, b)


def test_a_cpu_without_the_packages_isa_is_refused(build, monkeypatch):
    from torch._inductor import cpu_vec_isa

    # runtime reads the CPU's features as Inductor does, without importing Inductor
    assert runtime.cpu_isa_flags() == (cpu_vec_isa.x86_isa_checker() if runtime.cpu_isa_flags() is not None else None)
    path = build.package_dir("float32") / "decision.pt2"
    recorded = runtime.package_metadata(path)["AOTI_CPU_ISA"]
    if runtime.cpu_isa_flags() is None or recorded == runtime.INVALID_ISA:
        pytest.skip(f"no vector ISA to lack (package records {recorded})")
    monkeypatch.setattr(runtime, "cpu_isa_flags", lambda: ["avx2"] if "AVX2" not in recorded.split() else [])
    sha = read_record(build.package_record("float32"))["programs"][0]["package"]["sha256"]
    first = next(f for f in recorded.lower().split() if f not in runtime.cpu_isa_flags())
    for loader in runtime.LOADERS:
        with pytest.raises(
            PackageIsaError,
            match=rf"built for the CPU vector ISA {recorded}, but this CPU lacks "
            rf"{first}.*refusing to load it",
        ):
            runtime.load_package(path, sha, loader=loader)


def test_the_direct_loader_gives_the_same_bits_and_checks_the_call_spec(build, inputs):
    record = read_record(build.package_record("bfloat16"))
    path, sha = build.package_dir("bfloat16") / "decision.pt2", record["programs"][0]["package"]["sha256"]
    direct = runtime.load_package(path, sha, loader="direct")
    usual = runtime.load_package(path, sha, loader="aoti_load_package")
    assert direct.isa["mode"] == "not-asked" and direct.device == usual.device == torch.device("cpu")
    with torch.inference_mode():
        for batch in inputs["batches"]:
            args = args_of(batch, inputs)
            assert all(torch.equal(a, b) for a, b in zip(direct(*args), usual(*args)))
    with pytest.raises(ValueError, match=r"loader must be one of aoti_load_package, direct, got 'fast'"):
        runtime.load_package(path, sha, loader="fast")


def test_a_fresh_process_answers_without_importing_inductor(build, inputs, tmp_path):
    """benchmarks/runtime_bench.py fresh-load (the H200 script's probe of the first answer),
    on the CPU package: the direct loader never imports Inductor and answers as verify does."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "runtime_bench.py"
    out = tmp_path / "fresh.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            "fresh-load",
            str(build.package_record("bfloat16")),
            "--inputs",
            str(build.inputs),
            "--buckets",
            json.dumps(BUCKETS),
            "--loader",
            "direct",
            "--repeat",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = json.loads(out.read_text())["runs"][0]
    assert run["ended"] == "exit 0" and run["inductor_imported"] is False and run["loader"] == "direct"
    assert set(run["phases"]) == {
        "import_torch_s",
        "preload_s",
        "import_loader_s",
        "sha256_s",
        "probe_s",
        "load_s",
        "capture_s",
        "first_call_s",
        "total_s",
    }
    assert run["runner"]["mode"] == "padded_calls"
    record = read_record(build.package_record("bfloat16"))
    package = runtime.load_package(
        build.package_dir("bfloat16") / "decision.pt2", record["programs"][0]["package"]["sha256"]
    )
    decision, _ = package(*args_of(inputs["batches"][0], inputs))
    assert run["answer"] == int(decision[0].argmax())


@pytest.mark.parametrize(
    "entries, message",
    [
        ([{"rows": 5, "tokens": 64}], r"invalid at b\.0\.rows: 5 is outside the export range 1\.\.4"),
        ([{"rows": 1, "tokens": 16}], r"invalid at b\.0\.tokens: 16 is outside the export range 32\.\.512"),
        ([{"rows": 1, "tokens": 40}], r"invalid at b\.0\.tokens: 40 is not a multiple of 16"),
        ([{"rows": 1, "tokens": 32, "slots": 9}], r"invalid at b\.0\.slots: 9 is outside the export range 2\.\.8"),
        (
            [{"rows": 1, "tokens": 32}, {"rows": 1, "tokens": 32, "slots": 8}],
            r"invalid at b\.1: bucket 1x32x8 repeats b\.0",
        ),
    ],
)
def test_buckets_must_lie_inside_the_export_ranges(entries, message):
    dims = {"rows": {"min": 1, "max": 4}, "tokens16": {"min": 2, "max": 32}, "slots": {"min": 2, "max": 8}}
    with pytest.raises(ConfigError, match=message):
        parse_buckets(entries, dims, where="b")


def test_the_cheapest_holding_bucket_is_chosen():
    dims = ExportDims.from_dims(
        {"rows": {"min": 1, "max": 8}, "tokens16": {"min": 2, "max": 32}, "slots": {"min": 2, "max": 8}}
    )
    buckets = parse_buckets(
        [{"rows": 8, "tokens": 64}, {"rows": 1, "tokens": 256}, {"rows": 2, "tokens": 128}, {"rows": 4, "tokens": 64}],
        dims,
    )
    # by positions (rows x tokens), then fewer tokens (attention grows with tokens squared)
    assert [str(b) for b in buckets] == ["4x64x8", "2x128x8", "1x256x8", "8x64x8"]
    assert smallest_holding(buckets, 1, 64, 3) == Bucket(4, 64, 8)
    assert smallest_holding(buckets, 1, 100, 3) == Bucket(2, 128, 8)
    assert smallest_holding(buckets, 5, 64, 8) == Bucket(8, 64, 8)
    assert smallest_holding(buckets, 1, 200, 2) == Bucket(1, 256, 8)
    assert smallest_holding(buckets, 2, 256, 2) is None
    assert dims.fitted(1, 20, 1) == Bucket(1, 32, 2)


@pytest.mark.parametrize(
    "timing", [{"warmup": 2, "min_run_time_s": 0.02}, {"warmup": 0, "min_run_time_s": 0.02, "max_run_time_s": 2.0}]
)
def test_timing_to_a_budget_says_what_each_figure_rests_on(timing):
    from laya_build.runtime.timing import time_calls

    calls = []
    x = torch.ones(64)
    result = time_calls(lambda t: calls.append(1) or t.sum(), (x,), timing, "cpu")
    assert result["runs"] == result["block_size"] * len(result["blocks_ms"])
    assert len(calls) >= timing["warmup"] + result["runs"]  # warm-ups and block-size probes come on top
    assert result["median_ms"] > 0 and result["iqr_ms"] >= 0
    if "max_run_time_s" in timing:  # adaptive: at least four blocks unless max_run_time_s ran out
        assert len(result["blocks_ms"]) >= 4 or sum(result["blocks_ms"]) * result["block_size"] / 1e3 > 2.0


def test_calls_the_caller_just_made_count_as_warm_up_calls():
    from laya_build.runtime.timing import time_calls

    timing = {"warmup": 3, "groups": 2, "group_size": 5}  # fixed counts: the same calls every time
    x = torch.ones(8)

    def counted(called: int) -> int:
        calls = []
        time_calls(lambda t: calls.append(1) or t.sum(), (x,), timing, "cpu", called=called)
        return len(calls)

    alone = counted(0)
    assert [alone - counted(c) for c in (1, 2, 3, 5)] == [1, 2, 3, 3]  # never fewer than none


def test_a_graph_replay_that_differs_from_the_plain_call_fails_verify():
    from laya_build.errors import GraphReplayMismatchError
    from laya_build.stages.verify import runner_checks

    def program(diff):
        batch = {"batch": 1, "bucket": {"rows": 4, "tokens": 128, "slots": 8}, "compare": {}, "replay_vs_plain": diff}
        return {"name": "decision", "batches": [], "runner": {"batches": [batch]}}

    same = program({"decision": 0.0, "act": 0.0})
    assert runner_checks([same, {"name": "decision_single_slot"}]) == [
        {"name": "decision runner", "batches": same["runner"]["batches"]}
    ]
    assert runner_checks([program(None)])[0]["name"] == "decision runner"  # no graph: nothing to compare
    with pytest.raises(
        GraphReplayMismatchError,
        match=r"decision: the CUDA graph of bucket .*'tokens': 128.* replayed "
        r"batch 1 with max \|difference\| .*'act': 0\.001",
    ):
        runner_checks([program({"decision": 0.0, "act": 0.001})])
