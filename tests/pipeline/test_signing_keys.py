"""Keys that cannot be used stop ``doit release`` and ``doit verify`` before their first task,
with one message naming the key and what is wrong (exit status 3), and nothing written."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from laya_build.errors import SigningKeyError
from laya_build.release import keys, signing
from tests.pipeline.project import Project


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return Project(tmp_path_factory.mktemp("keys-project"))


def _pem(key, password: bytes | None = None) -> bytes:
    enc = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)


def test_a_new_key_pair_signs_and_is_never_replaced(tmp_path):
    private, public, kid = keys.new(str(tmp_path / "team"))
    assert private.stat().st_mode & 0o777 == 0o600
    assert signing.signing_key({"key": str(private)}, tmp_path, environ={}).key_id == kid
    assert [k.key_id for k in signing.trusted_keys({"keys": [str(public)]}, tmp_path, environ={})] == [kid]
    with pytest.raises(SigningKeyError, match="exists; a key is never replaced"):
        keys.new(str(tmp_path / "team"))


@pytest.mark.parametrize(
    "case",
    ["missing", "a directory", "not PEM", "a public key", "ed25519", "P-192", "no password", "wrong password"]
    + ["required"],
)
def test_doit_release_refuses_a_key_it_cannot_sign_with_before_building(project, tmp_path, case):
    path = tmp_path / "release.key"
    env = {"LAYA_BUILD_SIGNING_KEY": str(path)}
    cfg = {}
    if case == "missing":
        said = "no such file"
    elif case == "a directory":
        path.mkdir()
        said = "a directory, not a PEM key file"
    elif case == "not PEM":
        path.write_text("hello\n")
        said = "not a usable PEM private key"
    elif case == "a public key":
        pub = ec.generate_private_key(ec.SECP256R1()).public_key()
        path.write_bytes(pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        said = "not a usable PEM private key"
    elif case == "ed25519":
        path.write_bytes(_pem(ed25519.Ed25519PrivateKey.generate()))
        said = "releases are signed with elliptic-curve keys"
    elif case == "P-192":
        path.write_bytes(_pem(ec.generate_private_key(ec.SECP192R1())))
        said = "curve secp192r1 is not one of secp256r1, secp384r1, secp521r1"
    elif case == "no password":
        path.write_bytes(_pem(ec.generate_private_key(ec.SECP256R1()), b"secret"))
        said = "signing.password_env names the password's variable"
    elif case == "wrong password":
        path.write_bytes(_pem(ec.generate_private_key(ec.SECP256R1()), b"secret"))
        cfg = {"signing": {"password_env": "RELEASE_KEY_PASSWORD"}}
        env["RELEASE_KEY_PASSWORD"] = "not it"
        said = "not a usable PEM private key"
    else:
        env = {}
        cfg = {"signing": {"required": True}}
        said = "signing.required is true, but no signing key is configured"
    original = (project.path / "pipeline.yaml").read_text()
    try:
        project.edit_config(lambda data: data.update(cfg))
        run = project.doit("version=7.7.7", "release", env=env, timeout=120)
    finally:
        (project.path / "pipeline.yaml").write_text(original)
    out = run.stdout + run.stderr
    assert run.returncode == 3, out
    assert "SigningKeyError" in out and said in out, out
    assert out.count("SigningKeyError:") == 1, out
    assert not (project.artifacts / "7.7.7").exists(), "nothing is built with a key that cannot sign"


def test_an_encrypted_key_with_its_password_signs(tmp_path):
    path = tmp_path / "release.key"
    path.write_bytes(_pem(ec.generate_private_key(ec.SECP384R1()), b"secret"))
    key = signing.signing_key({"key": "release.key", "password_env": "PW"}, tmp_path, environ={"PW": "secret"})
    assert key.path == path and key.password == b"secret"
    with pytest.raises(SigningKeyError, match="its password variable PW .* is not set"):
        signing.signing_key({"key": "release.key", "password_env": "PW"}, tmp_path, environ={})


@pytest.mark.parametrize("case", ["missing", "a private key", "not PEM"])
def test_doit_verify_refuses_a_trusted_key_it_cannot_read(project, tmp_path, case):
    path = tmp_path / "team.pub"
    if case == "a private key":
        path.write_bytes(_pem(ec.generate_private_key(ec.SECP256R1())))
        said = "not a PEM public key (a private key? trust the .pub)"
    elif case == "not PEM":
        path.write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
        said = "not a PEM public key"
    else:
        said = "no such file"
    run = project.doit("verify", env={"LAYA_BUILD_TRUSTED_KEYS": str(path)}, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 3, out
    assert f"trusted key (LAYA_BUILD_TRUSTED_KEYS) {path}: {said}" in out, out


def test_trusted_keys_are_named_by_file_and_counted_once(tmp_path):
    _, public, kid = keys.new(str(tmp_path / "release-team"))
    found = signing.trusted_keys(
        {"keys": ["release-team.pub"]}, tmp_path, environ={"LAYA_BUILD_TRUSTED_KEYS": f"{public}:{public}"}
    )
    assert [(k.name, k.key_id) for k in found] == [("release-team", kid)]


def test_a_config_key_is_refused_by_the_schema(project):
    original = (project.path / "pipeline.yaml").read_text()
    try:
        project.edit_config(lambda data: data.update(trust={"keys": "team.pub"}))
        run = project.doit("list", timeout=120)
    finally:
        (project.path / "pipeline.yaml").write_text(original)
    assert run.returncode == 3 and "trust.keys" in run.stdout + run.stderr, run.stdout + run.stderr


def test_without_keys_nothing_of_the_signing_libraries_is_needed(tmp_path):
    """A machine that builds and verifies without signing or trusted keys (a GPU builder's image)
    may lack cryptography and model-signing: the key checks that run before every release and
    verification import neither."""
    import subprocess
    import sys

    from laya_build import PROJECT_ROOT

    code = (
        "import sys\n"
        "for name in ('cryptography', 'model_signing', 'OpenSSL'):\n"
        "    sys.modules[name] = None  # importing any of them now fails\n"
        "from laya_build.release import signing\n"
        "import laya_build.tasks.release\n"
        f"assert signing.signing_key(None, {str(tmp_path)!r}, {{}}) is None\n"
        f"assert signing.signing_key({{'required': False}}, {str(tmp_path)!r}, {{}}) is None\n"
        f"assert signing.trusted_keys(None, {str(tmp_path)!r}, {{}}) == []\n"
        f"assert signing.trusted_keys({{'keys': []}}, {str(tmp_path)!r}, {{'LAYA_BUILD_TRUSTED_KEYS': ''}}) == []\n"
        "try:\n"
        f"    signing.trusted_keys({{'keys': ['k.pub']}}, {str(tmp_path)!r}, {{}})\n"
        "except ImportError:\n"
        "    print('a key needs the library')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "a key needs the library"
