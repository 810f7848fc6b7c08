"""Releases of every format verify with today's code, each by its own format's rules.

The releases are in ``tests/fixtures/releases/`` (``README.md`` there: which commit made each,
with which configuration and command): whole release folders, byte for byte as ``doit release``
of that commit wrote them.  Each is copied and verified with ``doit verify release=<copy>`` of a
checkout of today's code; a copy with a newer format, or with an altered file, is refused.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from laya_build.errors import ManifestMismatch, RecordError, ReleaseFormatError
from laya_build.records import read_record, sha256_file
from laya_build.release import check_files, formats
from tests.pipeline.project import Project

pytestmark = pytest.mark.build(seconds=120)  # a fresh verification process per release

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "releases"
RELEASES = sorted(p for p in FIXTURES.iterdir() if (p / "manifest.json").is_file())

# What sets each release apart from today's format, as formats.Release.variant() finds it.
COUNTS = "timing by counts (warmup/groups/group_size)"
NO_RUNTIME = "no runtime section"
RAW_SOFTMAX = "inputs format 1 (raw-softmax probabilities)"
NO_PRELOAD = "package records without preload"
VARIANTS = {
    "9c66970": [COUNTS, NO_RUNTIME, RAW_SOFTMAX, NO_PRELOAD],
    "d24aa14": [COUNTS, NO_RUNTIME, RAW_SOFTMAX],
    "2b1470b": [RAW_SOFTMAX],
    "1eb8554": [COUNTS, NO_RUNTIME],
    "1f58314": [],
    "bc8bea5": [],
    "81569e4": [],  # format 2: signed, with provenance, SBOM and SHA256SUMS
}
SIGNER = FIXTURES / "keys" / "fixture-signer.pub"  # the public key of the format-2 fixture's signer


def _commit(release: Path) -> str:
    return release.name.rsplit("-", 1)[-1]


def _manifest(release: Path) -> dict:
    return json.loads((release / "manifest.json").read_text())


def _digests(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    """A checkout of today's code that verifies releases made elsewhere."""
    return Project(tmp_path_factory.mktemp("reader"))


def _copy(release: Path, tmp_path: Path) -> Path:
    copy = tmp_path / release.name
    shutil.copytree(release, copy)
    return copy


def test_the_schemas_of_each_format_are_valid_and_refer_within_their_folder():
    import jsonschema

    from laya_build import SCHEMA_DIR
    from laya_build.schema import _registry, load_schema

    for fmt in formats.FORMATS.values():
        for name in (fmt.manifest_schema, fmt.package_schema, fmt.config_schema):
            if name is None:
                continue
            schema = load_schema(name)
            jsonschema.validators.validator_for(schema).check_schema(schema)
            assert schema["$id"] == f"{name}.schema.json", name
    frozen = sorted((SCHEMA_DIR / "formats").rglob("*.schema.json"))
    assert frozen
    for path in frozen:
        schema = json.loads(path.read_text())
        jsonschema.validators.validator_for(schema).check_schema(schema)
        assert schema["$id"] == path.relative_to(SCHEMA_DIR).as_posix(), path
        for ref in re.findall(r'"\$ref": "([^"#]+)', path.read_text()):
            assert (path.parent / ref).is_file(), f"{path}: {ref} is not beside it"
            resolved = _registry().get_or_retrieve(f"{path.parent.relative_to(SCHEMA_DIR).as_posix()}/{ref}")
            assert resolved.value.contents["$id"] == (path.parent / ref).relative_to(SCHEMA_DIR).as_posix()


def test_the_fixtures_are_the_releases_the_readme_names():
    readme = (FIXTURES / "README.md").read_text()
    assert RELEASES, f"no release under {FIXTURES}"
    for release in RELEASES:
        assert f"`{release.name}/`" in readme, release.name
        assert _commit(release) in VARIANTS, release.name
        manifest = _manifest(release)
        assert manifest["git"]["commit"].startswith(_commit(release)), release.name
        assert not [p for p in _digests(release) if p.endswith((".pyc", ".tmp")) or "__pycache__" in p]


@pytest.mark.parametrize("release", RELEASES, ids=[p.name for p in RELEASES])
def test_each_release_is_read_by_its_own_format(release):
    found = formats.read_release(release)
    assert found.format.number == _manifest(release).get("format", 1)
    assert found.variant() == VARIANTS[_commit(release)]
    verify, runtime = found.verify_config()
    assert set(verify["timing"]) <= {"cpu", "cuda"} and "buckets" in runtime


@pytest.mark.parametrize("release", RELEASES, ids=[p.name for p in RELEASES])
def test_a_release_of_an_earlier_commit_verifies(reader, release, tmp_path):
    fixture_before = _digests(release)
    copy = _copy(release, tmp_path)
    before = _digests(copy)
    assert before == fixture_before
    shutil.rmtree(reader.artifacts / "verifications", ignore_errors=True)  # every release is version 0.1.0
    run = reader.doit("verify", f"release={copy}", timeout=900)
    out = run.stdout + run.stderr
    if "PackageIsaError" in out:
        pytest.skip(f"{release.name}: its package needs CPU vector instructions this CPU lacks:\n{out[-800:]}")
    assert run.returncode == 0, out
    manifest = _manifest(release)
    fmt = manifest.get("format", 1)
    assert f"files match manifest.json (release format {fmt})" in run.stdout, out
    assert f"read as release format {fmt}" in run.stdout, out
    builds = formats.read_release(copy).package_records()
    assert builds, release.name
    for rel in builds:
        build = rel.split("/")[1]
        assert f"verify {manifest['version']} {build}: ok" in run.stdout, out
        record = read_record(reader.artifacts / "verifications" / manifest["version"] / build / "verify.json")
        assert record["status"] == "ok"
        own = json.loads((copy / "verify" / build / "verify.json").read_text())  # the release's own verification
        for now, then in zip(record["programs"], own["programs"]):
            for head, summary in now["summary"].items():  # the same rows, the same answers
                assert summary["rows"] == then["summary"][head]["rows"] > 0, (build, head)
                assert summary["argmax_agree"] == then["summary"][head]["argmax_agree"], (build, head)
    assert _digests(copy) == before, "verify wrote into the release"
    assert _digests(release) == fixture_before


def test_a_format_newer_than_this_code_is_refused(reader, tmp_path):
    copy = _copy(RELEASES[-1], tmp_path)
    manifest = _manifest(copy)
    manifest["format"] = formats.CURRENT + 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    shutil.rmtree(reader.artifacts / "verifications", ignore_errors=True)
    run = reader.doit("verify", f"release={copy}", timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert f"ReleaseFormatError: {copy / 'manifest.json'}: the release is of format {formats.CURRENT + 1}" in out, out
    assert f"newer than this laya-build reads (formats 1 to {formats.CURRENT})" in out, out
    assert "upgrade laya-build" in out and "docs/reference/errors.md#release-format-error" in out, out
    assert not (reader.artifacts / "verifications").exists(), "nothing of the release was loaded"


def _restated(release: Path, tmp_path: Path, fmt: int) -> Path:
    """A copy of ``release`` whose manifest states format ``fmt`` (from format 2 on, with the
    ``SHA256SUMS`` that format publishes beside it, and unsigned)."""
    from laya_build.release import sums_text

    copy = _copy(release, tmp_path)
    manifest = _manifest(copy)
    manifest["format"] = fmt
    (copy / "manifest.json").write_text(json.dumps(manifest))
    if fmt >= 2:
        (copy / "SHA256SUMS").write_text(sums_text(copy, manifest["files"]))
    return copy


def test_a_format_2_release_is_read_with_todays_schemas(tmp_path):
    newest = next(r for r in RELEASES if _manifest(r).get("format") == 2)
    assert VARIANTS[_commit(newest)] == [], "the newest release holds what format 2 holds"
    copy = _copy(newest, tmp_path)
    check_files(copy)
    found = formats.read_release(copy)
    assert found.format is formats.FORMATS[2] and found.describe() == "release format 2"
    spec = found.verify_spec("cpu", "float32")
    assert spec["inputs_format"] is None and spec["package_record"]["preload"] == {"imported": [], "missing": []}
    assert spec["verify_cfg"] == found.config["verify"] and spec["runtime_cfg"] == found.config["runtime"]


def test_format_1_content_under_a_format_2_manifest_is_refused(tmp_path):
    oldest = RELEASES[0]
    copy = _restated(oldest, tmp_path, 2)
    check_files(copy)  # the manifest itself is of either format
    with pytest.raises(ReleaseFormatError, match=r"pipeline\.effective\.json \(release format 2\): no runtime section"):
        formats.read_release(copy)


@pytest.mark.parametrize("value", ["2", 0, True, 1.5, None])
def test_a_format_that_is_no_format_number_is_refused(tmp_path, value):
    copy = _copy(RELEASES[0], tmp_path)
    manifest = _manifest(copy)
    manifest["format"] = value
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ReleaseFormatError, match=rf'"format" is {value!r}, which is no release format'):
        check_files(copy)


def test_a_format_1_manifest_is_checked_against_format_1s_schema(tmp_path):
    """Format 1 never wrote a "format" field nor anything today's manifest may add."""
    copy = _copy(RELEASES[0], tmp_path)
    manifest = _manifest(copy)
    manifest["signature"] = "x"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(RecordError, match=r"\(release format 1\): invalid at <root>: .*'signature' was unexpected"):
        check_files(copy)


@pytest.mark.parametrize("rel", ["lower_c/rope.c", "model/inputs.pt", "pipeline.effective.json"])
def test_a_tampered_release_of_an_earlier_commit_fails_naming_the_file(reader, tmp_path, rel):
    copy = _copy(RELEASES[0], tmp_path)
    with open(copy / rel, "ab") as fh:
        fh.write(b"\n")
    with pytest.raises(ManifestMismatch, match=rf"altered: {rel} \(sha256 "):
        check_files(copy)
    if rel != "lower_c/rope.c":
        return
    shutil.rmtree(reader.artifacts / "verifications", ignore_errors=True)
    run = reader.doit("verify", f"release={copy}", timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 1 and f"altered: {rel}" in out and "ManifestMismatch" in out, out
    assert not (reader.artifacts / "verifications").exists()


def test_every_earlier_format_has_a_fixture():
    found = {_manifest(p).get("format", 1) for p in RELEASES}
    missing = [n for n in range(1, formats.CURRENT) if n not in found]
    assert not missing, f"no release of format(s) {missing} under {FIXTURES}"


def test_the_current_format_has_a_fixture():
    """A release made now stays verifiable by later code: keep one of each format."""
    found = {_manifest(p).get("format", 1) for p in RELEASES}
    assert formats.CURRENT in found, (
        f"no release of format {formats.CURRENT} (formats.CURRENT) under {FIXTURES}: add one made by "
        f"`doit release` of this code, and name it in {FIXTURES / 'README.md'}"
    )


def test_a_signed_release_made_earlier_still_verifies_with_its_signers_key(reader, tmp_path):
    """Signatures made now stay checkable by later code: every fixture of format 2 or later is
    signed, and verifies against its signer's public key, kept beside the fixtures."""
    signed = [r for r in RELEASES if _manifest(r).get("format", 1) >= 2]
    assert signed
    for release in signed:
        copy = _copy(release, tmp_path)
        shutil.rmtree(reader.artifacts / "verifications", ignore_errors=True)
        run = reader.doit("verify", f"release={copy}", timeout=900, env={"LAYA_BUILD_TRUSTED_KEYS": str(SIGNER)})
        out = run.stdout + run.stderr
        if "PackageIsaError" in out:
            pytest.skip(f"{release.name}: its package needs CPU vector instructions this CPU lacks")
        assert run.returncode == 0, out
        assert "signed by fixture-signer (key " in run.stdout, out
        sums = subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=copy, capture_output=True, text=True)
        assert sums.returncode == 0, sums.stdout + sums.stderr


def test_the_runtime_refuses_a_format_newer_than_this_code(tmp_path):
    from laya_build import runtime

    copy = _restated(RELEASES[0], tmp_path, formats.CURRENT + 1)
    with pytest.raises(ReleaseFormatError, match=rf"of format {formats.CURRENT + 1}, newer than this laya-build reads"):
        runtime.open_release(copy, "cpu-float32")


def test_every_file_of_a_signed_release_is_covered_by_its_signature(tmp_path):
    """Not only the package: a change to any file of a signed release (the manifest, SHA256SUMS,
    the provenance included) is named by the signature check, whatever else is re-hashed."""
    from laya_build.errors import SignatureMismatchError
    from laya_build.release import signing

    release = next(r for r in RELEASES if _manifest(r).get("format", 1) >= 2)
    keys = signing.trusted_keys({"keys": [str(SIGNER)]}, tmp_path, environ={})
    copy = _copy(release, tmp_path)
    assert signing.check(copy, keys).name == "fixture-signer"
    for rel in sorted(_digests(copy)):
        if rel == "release.sig":
            continue
        path = copy / rel
        original = path.read_bytes()
        path.write_bytes(original + b"\n")
        with pytest.raises(SignatureMismatchError, match=re.escape(f"Hash mismatch for '{rel}'")):
            signing.check(copy, keys)
        path.write_bytes(original)
    assert signing.check(copy, keys).name == "fixture-signer"
