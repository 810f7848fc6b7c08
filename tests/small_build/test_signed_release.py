"""Signed releases, checked away from the machine that made them: the small pipeline's release,
signed by ``doit release`` with a key made for the test (``conftest.py``), copied to another
checkout that trusts that key, and tampered with there as an attacker with write access to the
copy would: every file, record, manifest entry and ``SHA256SUMS`` line re-hashed to match."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys

import pytest

from laya_build.records import sha256_file
from laya_build.release.sbom import purl
from tests.pipeline.project import Project
from tests.small_build.conftest import make_key

pytestmark = pytest.mark.build(seconds=20)

PACKAGE = "aoti_package/cpu-float32/decision.pt2"
RECORD = "aoti_package/cpu-float32/aoti_package.json"


@pytest.fixture(scope="module")
def keys(small_builds):
    return small_builds.signing_key, small_builds.public_key


def copy_trusting(released, tmp_path_factory, name: str, public_key) -> Project:
    """A checkout elsewhere holding a copy of the release, with ``trust.keys`` naming
    ``public_key`` (copied into the checkout, as a verifier keeps the keys it trusts)."""
    project, _ = released
    other = Project(tmp_path_factory.mktemp(name))
    shutil.copytree(project.version_dir(), other.version_dir("0.1.0"))
    (other.path / "keys").mkdir()
    shutil.copy2(public_key, other.path / "keys" / public_key.name)
    other.edit_config(lambda cfg: cfg.update(trust={"keys": [f"keys/{public_key.name}"]}))
    return other


def rehash(vdir, changed: list[str]) -> None:
    """Make the manifest and SHA256SUMS agree with the files as they are now, as someone who
    changed ``changed`` would: a checksum list alone cannot tell."""
    from laya_build.release import sums_text

    manifest = json.loads((vdir / "manifest.json").read_text())
    for entry in manifest["files"]:
        if entry["path"] in changed:
            entry.update(sha256=sha256_file(vdir / entry["path"]), bytes=(vdir / entry["path"]).stat().st_size)
    manifest["totals"]["bytes"] = sum(f["bytes"] for f in manifest["files"])
    (vdir / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    (vdir / "SHA256SUMS").write_text(sums_text(vdir, manifest["files"]))


def flip_package(vdir) -> None:
    """One byte of the package changed, and its record's sha256 with it."""
    target = vdir / PACKAGE
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    record = json.loads((vdir / RECORD).read_text())
    for program in record["programs"]:
        if program["name"] == "decision":
            program["package"]["sha256"] = sha256_file(target)
    (vdir / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    rehash(vdir, [PACKAGE, RECORD])


def test_the_release_carries_a_signature_provenance_and_sha256sums(released, keys):
    project, run = released
    vdir = project.version_dir()
    manifest = json.loads((vdir / "manifest.json").read_text())
    _, public = keys
    from cryptography.hazmat.primitives import serialization

    from laya_build.release.signing import key_id, signed_files

    kid = key_id(serialization.load_pem_public_key(public.read_bytes()))
    assert manifest["signature"] == {"file": "release.sig", "key_id": kid}
    assert f"signed with release-team.key (key {kid[:16]})" in run.stdout
    # sha256sum -c works without laya-build, the manifest included
    check = subprocess.run(["sha256sum", "-c", "--strict", "SHA256SUMS"], cwd=vdir, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    sums = (vdir / "SHA256SUMS").read_text().splitlines()
    assert len(sums) == len(manifest["files"]) + 1 and any(line.endswith("  manifest.json") for line in sums)
    # the signature covers every other file of the folder, with the digests on disk
    every = {p.relative_to(vdir).as_posix() for p in vdir.rglob("*") if p.is_file()} - {"release.sig"}
    assert signed_files(vdir / "release.sig") == {rel: sha256_file(vdir / rel) for rel in every}
    # ... in model-signing's own format: its command line verifies it as well
    cli = subprocess.run(
        [sys.executable, "-m", "model_signing", "verify", "key", "--signature", str(vdir / "release.sig"),
         "--public_key", str(public), str(vdir)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert cli.returncode == 0 and "Verification succeeded" in cli.stdout + cli.stderr, cli.stdout + cli.stderr
    # the provenance: every other released file a subject, the build's inputs and the builder
    statement = json.loads((vdir / "provenance.json").read_text())
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    assert subjects == {f["path"]: f["sha256"] for f in manifest["files"] if f["path"] != "provenance.json"}
    build = statement["predicate"]["buildDefinition"]
    assert build["externalParameters"]["pipeline"]["digest"]["sha256"] == manifest["pipeline"]["sha256"]
    assert build["externalParameters"]["version"] == "0.1.0"
    deps = build["resolvedDependencies"]
    assert deps[0]["digest"] == {"gitCommit": manifest["git"]["commit"]}
    torch_version = manifest["environment"]["packages"]["torch"]
    assert {"name": "torch", "uri": purl("torch", torch_version)} in deps
    assert purl("torch", "2.13.0+cpu") == "pkg:pypi/torch@2.13.0%2Bcpu"
    assert any(d.get("name") == "cc" for d in deps)
    details = statement["predicate"]["runDetails"]
    assert details["builder"]["id"] and details["metadata"]["startedOn"] <= details["metadata"]["finishedOn"]
    # the bill of materials: CycloneDX, the same distributions, the compilers
    bom = json.loads((vdir / "sbom.cdx.json").read_text())
    assert bom["bomFormat"] == "CycloneDX" and bom["specVersion"] == "1.6"
    refs = {c["bom-ref"] for c in bom["components"]}
    assert {d["uri"] for d in deps if d.get("uri", "").startswith("pkg:")} <= refs and "tool:cc" in refs
    assert manifest["sbom"] == "sbom.cdx.json" and "sbom.cdx.json" in subjects
    # machine settings are not part of what a release records
    effective = json.loads((vdir / "pipeline.effective.json").read_text())
    assert "signing" not in effective and "trust" not in effective


def test_a_signed_release_verifies_elsewhere_and_names_its_signer(released, keys, tmp_path_factory):
    other = copy_trusting(released, tmp_path_factory, "trusting", keys[1])
    before = {p: sha256_file(p) for p in other.version_dir("0.1.0").rglob("*") if p.is_file()}
    run = other.doit("verify", "version=0.1.0")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "verify 0.1.0: signed by release-team (key " in run.stdout
    assert "verify 0.1.0 cpu-float32: ok" in run.stdout
    assert before == {p: sha256_file(p) for p in other.version_dir("0.1.0").rglob("*") if p.is_file()}


def test_trusted_keys_from_the_environment(released, keys, tmp_path_factory):
    project, _ = released
    other = Project(tmp_path_factory.mktemp("trusting-env"))
    run = other.doit("verify", f"release={project.version_dir()}", env={"LAYA_BUILD_TRUSTED_KEYS": str(keys[1])})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "signed by release-team" in run.stdout


@pytest.mark.parametrize(
    "attack", ["re-hashed package", "re-signed by another key", "unsigned", "damaged signature", "added file"]
)
def test_a_release_that_its_signature_does_not_prove_is_refused_before_anything_is_loaded(
    released, keys, tmp_path_factory, attack
):
    other = copy_trusting(released, tmp_path_factory, "attacked", keys[1])
    vdir = other.version_dir("0.1.0")
    if attack == "re-hashed package":
        flip_package(vdir)
        said = ["SignatureMismatchError", "not the ones release-team signed", f"Hash mismatch for '{PACKAGE}'"]
    elif attack == "re-signed by another key":
        flip_package(vdir)
        attacker, attacker_pub, attacker_id = make_key(tmp_path_factory.mktemp("attacker") / "attacker")
        manifest = json.loads((vdir / "manifest.json").read_text())
        manifest["signature"]["key_id"] = attacker_id
        (vdir / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        rehash(vdir, [])
        from laya_build.release import signing

        signing.sign(vdir, signing.signing_key({"key": str(attacker)}, other.path, environ={}))
        said = ["UnknownSignerError", f"signed by an unknown key (key id {attacker_id})", "trusted: release-team"]
    elif attack == "unsigned":
        (vdir / "release.sig").unlink()
        manifest = json.loads((vdir / "manifest.json").read_text())
        manifest["signature"] = None
        (vdir / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        rehash(vdir, [])
        said = ["UnsignedReleaseError", "the release is not signed (no release.sig)"]
    elif attack == "damaged signature":
        bundle = json.loads((vdir / "release.sig").read_text())
        sig = bytearray(base64.b64decode(bundle["dsseEnvelope"]["signatures"][0]["sig"]))
        sig[-1] ^= 0x01
        bundle["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
        (vdir / "release.sig").write_text(json.dumps(bundle))
        said = ["SignatureMismatchError", "release.sig: damaged: the signature does not verify with release-team"]
    else:  # a file the manifest lists, added with its digest everywhere but in the signature
        (vdir / "lower_c" / "extra.c").write_text("int extra;\n")
        manifest = json.loads((vdir / "manifest.json").read_text())
        manifest["files"].append({"path": "lower_c/extra.c", "bytes": 11, "sha256": "0" * 64, "task": "lower_c:rope"})
        manifest["files"].sort(key=lambda f: f["path"])
        manifest["totals"]["files"] += 1
        (vdir / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        rehash(vdir, ["lower_c/extra.c"])
        said = ["SignatureMismatchError", "Extra files found", "lower_c/extra.c"]
    run = other.doit("verify", "version=0.1.0", timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    for text in said:
        assert text in out, out
    assert not (other.artifacts / "verifications").exists(), "no package is loaded from such a release"
    assert "verify:cpu-float32" not in run.stdout


def test_the_runtime_can_require_the_signature(released, keys, tmp_path_factory):
    from laya_build import runtime
    from laya_build.errors import SignatureMismatchError, UnknownSignerError

    project, _ = released
    runner = runtime.open_release(project.version_dir(), "cpu-float32", trusted_keys=[keys[1]])
    assert [str(b) for b in runner.buckets] == ["1x32x8", "4x128x8"]
    _, other_pub, _ = make_key(tmp_path_factory.mktemp("stranger") / "stranger")
    with pytest.raises(UnknownSignerError, match="trusted: stranger"):
        runtime.open_release(project.version_dir(), "cpu-float32", trusted_keys=[other_pub])
    copy = shutil.copytree(project.version_dir(), tmp_path_factory.mktemp("served") / "0.1.0")
    flip_package(copy)
    from laya_build.release import check_files

    check_files(copy)  # the digests alone cannot tell ...
    with pytest.raises(SignatureMismatchError, match="decision.pt2"):  # ... the signature can
        runtime.open_release(copy, "cpu-float32", trusted_keys=[keys[1]])
