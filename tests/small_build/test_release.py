"""Versioned releases: manifest, report, immutability, the runtime, verification of a copied or
tampered release, release_diff against a second release.  The release is the small pipeline's
(``conftest.py``), released by ``doit release`` after its build was killed at several points."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
import torch

from laya_build.records import read_record, sha256_file
from tests.pipeline.project import Project
from tests.small_build.conftest import KILLED_VERSION
from tests.upstream_checkpoint import upstream_agent, upstream_forward

pytestmark = pytest.mark.build(seconds=20)  # a second release, of a version built beside the first


def _snapshot(vdir):
    return {
        p.relative_to(vdir).as_posix(): (p.stat().st_mtime_ns, sha256_file(p))
        for p in sorted(vdir.rglob("*"))
        if p.is_file()
    }


def test_manifest_is_valid_and_every_hash_right(released):
    project, run = released
    vdir = project.version_dir()
    manifest = read_record(vdir / "manifest.json")
    assert manifest["version"] == "0.1.0"
    listed = {f["path"]: f for f in manifest["files"]}
    unlisted = ("manifest.json", "SHA256SUMS", "release.sig")  # what lists, and what signs, the rest
    on_disk = {p.relative_to(vdir).as_posix() for p in vdir.rglob("*") if p.is_file() and p.name not in unlisted}
    assert set(listed) == on_disk
    assert manifest["format"] == 2 and manifest["provenance"] == "provenance.json"
    for rel, entry in listed.items():
        assert sha256_file(vdir / rel) == entry["sha256"], rel
        assert (vdir / rel).stat().st_size == entry["bytes"], rel
    assert listed["aoti_package/cpu-float32/aoti_package.json"]["task"] == "aoti_package:cpu-float32"
    assert listed["lower_c/rope.c"]["task"] == "lower_c:rope"
    assert listed["latency/cpu/latency.json"]["task"] == "latency:cpu"  # one latency task per target
    assert not [p for p in listed if p.startswith("latency/cpu-")]
    assert listed["REPORT.md"]["task"] == "release"
    assert not [p for p in listed if ".cache" in p or p.endswith(".tmp")], "compiler caches are never released"
    effective = json.loads((vdir / "pipeline.effective.json").read_text())
    assert effective["kernels"]["variants"].keys() == project.config["kernels"]["variants"].keys() == {"rope"}
    assert manifest["git"]["commit"] == project.git("rev-parse", "HEAD").strip() and manifest["git"]["dirty"] is False
    env = manifest["environment"]
    assert env["collect_env"]["torch_version"].startswith("2.") and env["packages"]["tilelang"]
    assert env["cc"] and env["nvidia_smi"] is None  # no GPU on CI


def test_report_is_readable(released):
    project, _ = released
    report = (project.version_dir() / "REPORT.md").read_text()
    for heading in (
        "# Release 0.1.0",
        "## Stages",
        "## CPU (C target) numerical checks",
        "## AOTInductor packages",
        "## Fresh-process verification",
        "## Runtime runner vs eager.pt",
        "## Latency cpu (median ms",
    ):
        assert heading in report
    assert "Fresh verification process, time to its first answer" in report
    assert re.search(r"\| cpu-float32 \| padded_calls \| 1×32×8, 4×128×8 \| 0 \|", report)
    assert (
        "| batch | rows×tokens×slots | eager_amp | eager_bf16 | package (float32) | package_graphed (float32) |"
        in report
    )
    assert re.search(r"## Latency cuda\n\nskipped: target cuda: .*CUDA", report)
    assert re.search(r"Each figure rests on \d+ to \d+ timed calls", report)
    assert re.search(r"\| rope \| 2 \| [0-9.e-]+ \| 2e-06 \| exact \| pass \|", report)
    assert "| cuda-bfloat16 | skipped |" in report


def test_release_of_an_upstream_written_checkpoint(released, tmp_path):
    """``model.path`` at a checkpoint upstream's save_checkpoint wrote: the release installs it
    as it is, its eager reference equals upstream's own forward (fp32, both heads, 1e-5) and
    its package verifies with the checkpoint's calibrated probabilities."""
    project, _ = released
    vdir = project.version_dir()
    source = project.config["model"]["path"]
    model = read_record(vdir / "model" / "model.json")
    assert model["source"] == "local" and model["config"]["path"] == source
    assert model["checkpoint"]["weights_dtypes"] == ["float16"] and model["architecture"]["head_layers"] == 0
    assert model["calibration"]["applied"]["temperature"] == [0.7, 1.8, 5.0]
    for entry in model["checkpoint"]["files"]:
        assert sha256_file(f"{source}/{entry['path'].removeprefix('checkpoint/')}") == entry["sha256"]
    inputs = read_torch(vdir / "model" / "inputs.pt")
    eager = read_torch(vdir / "export" / "cpu-float32" / "eager.pt")
    upstream_model = upstream_agent(source, tmp_path / "copy").model
    for batch, outputs in zip(inputs["batches"], eager["outputs"], strict=True):
        decision, act = upstream_forward(upstream_model, batch)
        torch.testing.assert_close(outputs["decision"], decision, atol=1e-5, rtol=0)
        torch.testing.assert_close(outputs["act"], act, atol=1e-5, rtol=0)
    verify = read_record(vdir / "verify" / "cpu-float32" / "verify.json")
    assert verify["status"] == "ok" and verify["inputs"]["sha256"] == sha256_file(vdir / "model" / "inputs.pt")
    assert verify["programs"][0]["summary"]["decision"]["argmax_agree"] == 7


def read_torch(path):
    return torch.load(path, weights_only=True)


def test_second_release_is_refused_and_changes_nothing(released):
    project, _ = released
    vdir = project.version_dir()
    before = _snapshot(vdir)
    run = project.doit("release")
    assert run.returncode != 0
    assert "version 0.1.0 is released" in run.stdout + run.stderr
    assert _snapshot(vdir) == before


def test_tasks_refuse_to_write_into_a_release(released):
    project, _ = released
    vdir = project.version_dir()
    before = _snapshot(vdir)
    rope = project.path / "kernels" / "rope.py"
    original = rope.read_text()
    rope.write_text(original + "\n# an edit after the release\n")
    try:
        run = project.doit("lower_c:rope")
        assert run.returncode != 0
        assert "is released" in run.stdout + run.stderr and "build a new version" in run.stdout + run.stderr
        clean = project.doit("clean", "lower_c")
        assert "not cleaning" in clean.stdout
    finally:
        rope.write_text(original)
    assert _snapshot(vdir) == before


def test_the_runtime_opens_a_release_and_refuses_a_tampered_one(released, tmp_path):
    import torch

    from laya_build import runtime
    from laya_build.errors import PackageIntegrityError

    project, _ = released
    runner = runtime.open_release(project.version_dir(), "cpu-float32")
    assert [str(b) for b in runner.buckets] == ["1x32x8", "4x128x8"]  # the release's runtime.buckets.cpu
    inputs = torch.load(project.version_dir() / "model" / "inputs.pt", weights_only=True)
    batch = inputs["batches"][1]
    decision, act = runner(*(batch[k] for k in inputs["arg_names"]))
    n_act = read_record(project.version_dir() / "model" / "model.json")["architecture"]["n_act"]
    assert decision.shape == (2, 3) and act.shape == (2, n_act)
    copy = shutil.copytree(project.version_dir(), tmp_path / "0.1.0")
    record = copy / "aoti_package" / "cpu-float32" / "aoti_package.json"
    record.write_text(record.read_text() + " ")  # same JSON, other bytes
    with pytest.raises(
        PackageIntegrityError,
        match=r"aoti_package\.json: sha256 \w+ does not match the release "
        r"manifest's",
    ):
        runtime.open_release(copy, "cpu-float32")
    with pytest.raises(PackageIntegrityError, match=r"aoti_package/cuda-bfloat16/aoti_package\.json.*skipped"):
        runtime.open_release(project.version_dir(), "cuda-bfloat16")


def test_verify_a_release_copied_elsewhere(released, tmp_path_factory):
    project, _ = released
    other = Project(tmp_path_factory.mktemp("elsewhere"))  # the project, and only the release folder
    shutil.copytree(project.version_dir(), other.version_dir("0.1.0"))
    run = other.doit("verify", "version=0.1.0")
    assert run.returncode == 0, run.stdout + run.stderr
    said = r"verify 0.1.0: signature not checked \(no trusted keys.*\), \d+ files match manifest.json"
    assert re.search(said, run.stdout)
    assert "verify 0.1.0 cpu-float32: ok" in run.stdout
    assert "verify 0.1.0 cuda-bfloat16: skipped" in run.stdout
    record = read_record(other.artifacts / "verifications" / "0.1.0" / "cpu-float32" / "verify.json")
    assert record["status"] == "ok"


@pytest.mark.parametrize("tamper", ["altered", "missing", "extra"])
def test_tampering_fails_verify_naming_the_file(released, tmp_path_factory, tamper):
    project, _ = released
    other = Project(tmp_path_factory.mktemp(f"tamper-{tamper}"))
    vdir = other.version_dir("0.1.0")
    shutil.copytree(project.version_dir(), vdir)
    if tamper == "altered":
        target = vdir / "aoti_package" / "cpu-float32" / "decision.pt2"
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
        name = "aoti_package/cpu-float32/decision.pt2"
    elif tamper == "missing":
        (vdir / "lower_c" / "rope.c").unlink()
        name = "lower_c/rope.c"
    else:
        (vdir / "cuda" / "rope" / "notes.txt").write_text("not released\n")
        name = "cuda/rope/notes.txt"
    run = other.doit("verify", "version=0.1.0")
    assert run.returncode != 0
    assert f"{tamper}: {name}" in run.stdout + run.stderr
    assert not (other.artifacts / "verifications").exists(), "no package is loaded from a tampered release"


@pytest.mark.parametrize("kind", ["package link", "folder link", "manifest link", "outside path", "special file"])
def test_what_a_release_folder_may_not_hold_is_refused_before_anything_is_loaded(released, tmp_path_factory, kind):
    """A link to identical bytes elsewhere, a manifest path outside the folder, a FIFO: refused
    naming the path, before any file is hashed against the manifest or any package loaded."""
    project, _ = released
    other = Project(tmp_path_factory.mktemp("unsafe"))
    vdir = other.version_dir("0.1.0")
    shutil.copytree(project.version_dir(), vdir)
    elsewhere = tmp_path_factory.mktemp("bytes-elsewhere")
    if kind == "package link":
        target = vdir / "aoti_package" / "cpu-float32" / "decision.pt2"
        shutil.copy2(target, elsewhere / "decision.pt2")
        target.unlink()
        target.symlink_to(elsewhere / "decision.pt2")  # the same bytes: every hash would match
        said = "link: aoti_package/cpu-float32/decision.pt2 (a symbolic link to"
    elif kind == "folder link":
        shutil.move(vdir / "lower_c", elsewhere / "lower_c")
        (vdir / "lower_c").symlink_to(elsewhere / "lower_c")
        said = "link: lower_c (a symbolic link to"
    elif kind == "manifest link":
        shutil.move(vdir / "manifest.json", elsewhere / "manifest.json")
        (vdir / "manifest.json").symlink_to(elsewhere / "manifest.json")
        said = "link: manifest.json (a symbolic link to"
    elif kind == "outside path":
        manifest = json.loads((vdir / "manifest.json").read_text())
        manifest["files"][0]["path"] = "../outside.txt"
        (vdir / "manifest.json").write_text(json.dumps(manifest))
        said = "outside: '../outside.txt'"
    else:
        os.mkfifo(vdir / "lower_c" / "pipe")
        said = "special file: lower_c/pipe"
    run = other.doit("verify", "version=0.1.0", timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert said in out and "ManifestMismatch" in out, out
    assert "files match manifest.json" not in out
    assert not (other.artifacts / "verifications").exists(), "no package is loaded from such a release"


def test_a_release_on_a_read_only_mount_verifies_where_it_lies(released, tmp_path_factory):
    project, _ = released
    source = tmp_path_factory.mktemp("archive") / "0.1.0"
    shutil.copytree(project.version_dir(), source)
    mount = tmp_path_factory.mktemp("ro") / "0.1.0"
    mount.mkdir()
    bind = subprocess.run(["mount", "--bind", str(source), str(mount)], capture_output=True, text=True)
    if bind.returncode != 0:
        pytest.skip(f"cannot bind-mount a folder read-only here (needs root): {bind.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(mount)], check=True)
        with pytest.raises(OSError):
            (mount / "probe").write_text("x")  # read-only indeed
        other = Project(tmp_path_factory.mktemp("reader"))
        run = other.doit("verify", f"release={mount}", timeout=600)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "verify 0.1.0 cpu-float32: ok" in run.stdout
        result = other.artifacts / "verifications" / "0.1.0" / "cpu-float32" / "verify.json"
        assert read_record(result)["status"] == "ok"
        assert not (other.artifacts / "0.1.0").exists(), "the release was verified where it lies"
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_release_diff_lists_exactly_the_changed_kernel(released, small_builds):
    """The other checkout built the next version of the same sources (``conftest.py``): one
    kernel changed there and released, diffed against this checkout's release copied in."""
    old, _ = released
    project = small_builds.traced
    rope = project.path / "kernels" / "rope.py"
    text, n = re.subn(
        r"block_M: int = (\d+)", lambda m: f"block_M: int = {int(m.group(1)) * 2}", rope.read_text(), count=1
    )
    assert n == 1
    rope.write_text(text)
    project.commit("rope: larger row tile")
    run = project.doit("release")
    assert run.returncode == 0, run.stdout + run.stderr
    rebuilt = {task.split(":")[0] for task in run.executed}
    assert not rebuilt & {"model", "export", "aoti_package"}, "a kernel change leaves the model's stages alone"
    shutil.copytree(old.version_dir(KILLED_VERSION), project.version_dir(KILLED_VERSION))
    run = project.doit("release_diff", "--old", "0.1.0", "--new", "0.2.0")
    assert run.returncode == 0, run.stdout + run.stderr
    out = project.artifacts / "release_diff" / "0.1.0..0.2.0"
    record = read_record(out / "release_diff.json")
    assert record["summary"]["cuda_changed"] == ["cuda/rope/bfloat16-sm_90.cu"]
    assert record["summary"]["c_changed"] == ["lower_c/rope.c"]
    assert record["summary"]["tir_changed"] == ["rope.bfloat16", "rope.cpu-float32"]
    changed = next(r for r in record["cuda_sources"] if r["status"] == "changed")
    assert (project.artifacts / changed["diff"]).read_text().startswith("--- baseline/cuda/rope/bfloat16-sm_90.cu")
    packages = {r["build"]: r for r in record["model"]["packages"]}
    assert "cpu-float32" in packages
    # a kernel change leaves the model alone: the same exported programs and, built with a
    # fixed hash seed and a stable Inductor cache path, byte-identical CPU packages, though
    # built in two checkouts (paths in exported programs are import-relative)
    assert all(
        r["exported_identical"]
        and r["old_exported_sha256"] == r["new_exported_sha256"]
        and r["identical"]
        and r["old_sha256"] == r["new_sha256"]
        for r in packages.values()
    ), packages
    md = (out / "release_diff.md").read_text()
    assert "CUDA sources changed: cuda/rope/bfloat16-sm_90.cu" in md
    assert "## Verification deltas" in md and "## Latency" in md
    assert "## Runtime: fresh load to first answer and runner vs eager" in md
    assert {r["build"] for r in record["model"]["runtime"]} == {"cpu-float32"}
    latency = {(r["target"], r["variant"]) for r in record["model"]["latency"]}
    variants = ("eager_amp", "eager_bf16", "package (float32)", "package_graphed (float32)")
    assert latency == {("cpu", v) for v in variants}
    assert all(r["old_ms"] and r["new_ms"] for r in record["model"]["latency"])
    assert "| exported program identical | package identical |" in md


def test_release_diff_needs_released_versions(released):
    """A version that is no release, a malformed one, a missing parameter and the old variable
    form are command-line errors: exit 3, the version named, and a hint with what to run and
    the versions released here."""
    project, _ = released
    run = project.doit("release_diff", "--old", "0.1.0", "--new", "9.9.9")
    out = run.stdout + run.stderr
    assert run.returncode == 3, out
    assert "UsageError: release_diff --new 9.9.9" in out and "is not a release (no manifest.json)" in out
    assert "hint: release it first (`doit version=9.9.9 release`)" in out and "released here: 0.1.0" in out
    run = project.doit("release_diff", "--old", "0.1.0", "--new", "../x")
    assert run.returncode == 3 and "is not a version" in run.stdout + run.stderr
    run = project.doit("release_diff", "--old", "0.1.0")
    assert run.returncode == 3 and "--new missing" in run.stdout + run.stderr
    run = project.doit("release_diff", "old=0.1.0", "new=0.2.0")
    assert run.returncode == 3 and "doit argument new=0.2.0: not a variable" in run.stderr
    assert not (project.artifacts / "release_diff" / "0.1.0..9.9.9").exists()


def test_doit_help_lists_the_parameters_of_release_diff(released):
    project, _ = released
    run = project.doit("help", "release_diff")
    assert run.returncode == 0
    assert "--old=ARG" in run.stdout and "--new=ARG" in run.stdout and "released version" in run.stdout
