"""Signed releases: who made a release, checked wherever it travels.

A release (format 2) is signed with the OpenSSF ``model-signing`` library: its signature,
``release.sig``, is a Sigstore bundle holding a DSSE envelope whose in-toto statement lists
every other file of the release folder with its sha256 (the manifest, ``SHA256SUMS`` and the
provenance statement included), signed with an elliptic-curve private key.  Anyone with the
public key can check it offline, with laya-build (``doit verify``, ``open_release``) or with
``model_signing verify key``.

Keys come from the machine, never from the release: the signing key from ``signing.key`` or
the environment variable :data:`SIGNING_KEY_ENV`; the trusted public keys from
``trust.keys`` plus :data:`TRUSTED_KEYS_ENV`.  A trusted key is named by its file's stem
(``release-team.pub`` signs as ``release-team``) and identified by its key id, the sha256 of
its PEM public key (the id the bundle carries, as ``model-signing`` writes it).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from laya_build.errors import (
    SignatureMismatchError,
    SigningKeyError,
    UnknownSignerError,
    UnsignedReleaseError,
)
from laya_build.layout import SIGNATURE_NAME

SIGNING_KEY_ENV = "LAYA_BUILD_SIGNING_KEY"  # the path of the private key file that signs releases
TRUSTED_KEYS_ENV = "LAYA_BUILD_TRUSTED_KEYS"  # public key files verify trusts, ':'-separated
CURVES = ("secp256r1", "secp384r1", "secp521r1")  # what model-signing (and Sigstore) accept
# Files of a release folder that the signature does not cover: itself, and the marker of a
# publication in progress (:data:`laya_build.release.PENDING`).
UNSIGNED = (SIGNATURE_NAME, ".release-pending")


@dataclass(frozen=True)
class SigningKey:
    path: Path
    password: bytes | None
    key_id: str


@dataclass(frozen=True)
class TrustedKey:
    name: str
    path: Path
    key_id: str


def key_id(public_key) -> str:
    """The id of a public key: the sha256 of its PEM (SubjectPublicKeyInfo), as model-signing
    puts it into the bundles it writes."""
    from cryptography.hazmat.primitives import serialization

    pem = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def _resolve(path: str, root: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(root) / p


def _read_key_file(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SigningKeyError(f"{what} {path}: no such file") from None
    except IsADirectoryError:
        raise SigningKeyError(f"{what} {path}: a directory, not a PEM key file") from None
    except OSError as exc:
        raise SigningKeyError(f"{what} {path}: cannot be read ({exc.strerror or exc})") from None
    if len(data) > 64 * 1024:
        raise SigningKeyError(f"{what} {path}: {len(data):,} bytes, not a PEM key file")
    return data


def _check_curve(key, what: str, path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise SigningKeyError(
            f"{what} {path}: a {type(key).__name__.lstrip('_')}; releases are signed with elliptic-curve keys"
        )
    if key.curve.name not in CURVES:
        raise SigningKeyError(f"{what} {path}: curve {key.curve.name} is not one of {', '.join(CURVES)}")


def signing_key(cfg: dict | None, root: Path, environ=os.environ) -> SigningKey | None:
    """The key ``doit release`` signs with, loaded and checked before anything is written
    (``None``: unsigned).  ``cfg``: the ``signing`` section.  Without a key nothing of the
    signing libraries is imported (a machine that only builds or verifies needs none of them)."""
    cfg = cfg or {}
    given = environ.get(SIGNING_KEY_ENV) or cfg.get("key")
    what = f"signing key ({SIGNING_KEY_ENV})" if environ.get(SIGNING_KEY_ENV) else "signing key (signing.key)"
    if not given:
        if cfg.get("required"):
            raise SigningKeyError(
                f"signing.required is true, but no signing key is configured (signing.key, or {SIGNING_KEY_ENV})"
            )
        return None
    from cryptography.hazmat.primitives import serialization

    path = _resolve(given, root)
    password = None
    if env_name := cfg.get("password_env"):
        if env_name not in environ:
            raise SigningKeyError(f"{what} {path}: its password variable {env_name} (signing.password_env) is not set")
        password = environ[env_name].encode()
    data = _read_key_file(path, what)
    try:
        key = serialization.load_pem_private_key(data, password)
    except TypeError as exc:  # encrypted without a password, or a password for a plain key
        raise SigningKeyError(f"{what} {path}: {exc} (signing.password_env names the password's variable)") from None
    except ValueError as exc:
        raise SigningKeyError(f"{what} {path}: not a usable PEM private key ({exc})") from None
    _check_curve(key.public_key(), what, path)
    return SigningKey(path=path, password=password, key_id=key_id(key.public_key()))


def trusted_keys(cfg: dict | None, root: Path, environ=os.environ) -> list[TrustedKey]:
    """The public keys whose releases this machine trusts: ``trust.keys`` plus
    :data:`TRUSTED_KEYS_ENV`; each loaded and checked (none: nothing imported)."""
    listed = [(p, "trust.keys") for p in (cfg or {}).get("keys", [])]
    listed += [(p, TRUSTED_KEYS_ENV) for p in environ.get(TRUSTED_KEYS_ENV, "").split(os.pathsep) if p]
    if not listed:
        return []
    from cryptography.hazmat.primitives import serialization

    keys: dict[str, TrustedKey] = {}
    for given, source in listed:
        path = _resolve(given, root)
        what = f"trusted key ({source})"
        data = _read_key_file(path, what)
        try:
            public = serialization.load_pem_public_key(data)
        except ValueError as exc:
            hint = " (a private key? trust the .pub)" if b"PRIVATE KEY" in data else ""
            raise SigningKeyError(f"{what} {path}: not a PEM public key{hint} ({exc})") from None
        _check_curve(public, what, path)
        trusted = TrustedKey(name=path.name.removesuffix(".pem").removesuffix(".pub"), path=path, key_id=key_id(public))
        keys.setdefault(trusted.key_id, trusted)
    return list(keys.values())


def _hashing():
    """How the signature hashes a release folder: every file by its sha256, no links, nothing
    left out but :data:`UNSIGNED` (``.git*`` names included: a release has none, and any it
    has must be signed or found)."""
    from model_signing import hashing

    return hashing.Config().set_ignored_paths(paths=list(UNSIGNED), ignore_git_paths=False)


def sign(version_dir: Path, key: SigningKey) -> Path:
    """Sign every file of ``version_dir`` (but :data:`UNSIGNED`) into ``release.sig``
    (written to a temporary name, then renamed)."""
    from model_signing import signing

    vdir = Path(version_dir)
    tmp = vdir / f".{SIGNATURE_NAME}.tmp"
    config = signing.Config().use_elliptic_key_signer(
        private_key=key.path, password=key.password.decode() if key.password else None
    )
    config.set_hashing_config(_hashing()).sign(vdir, tmp)
    os.replace(tmp, vdir / SIGNATURE_NAME)
    return vdir / SIGNATURE_NAME


def signed_key_id(signature_path: Path) -> str | None:
    """The key id a signature names (its bundle's ``verificationMaterial.publicKey.hint``)."""
    try:
        bundle = json.loads(Path(signature_path).read_bytes()[: 16 * 1024 * 1024])
        hint = bundle["verificationMaterial"]["publicKey"]["hint"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return hint if isinstance(hint, str) else None


def signed_files(signature_path: Path) -> dict[str, str]:
    """path -> sha256 of every file the signature's statement lists (read, not verified)."""
    bundle = json.loads(Path(signature_path).read_bytes())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    return {r["name"]: r["digest"] for r in statement["predicate"]["resources"]}


def check(version_dir: Path, keys: list[TrustedKey]) -> TrustedKey:
    """Refuse ``version_dir`` unless its ``release.sig`` is a valid signature, by one of
    ``keys``, over exactly the files the folder holds; returns the signer.  Nothing of the
    release is loaded."""
    from model_signing import verifying

    vdir = Path(version_dir)
    sig = vdir / SIGNATURE_NAME
    trusted = ", ".join(f"{k.name} ({k.key_id[:16]})" for k in keys)
    if not sig.is_file():
        raise UnsignedReleaseError(
            f"{vdir}: the release is not signed (no {SIGNATURE_NAME}); this machine trusts only releases "
            f"signed by {trusted}"
        )
    kid = signed_key_id(sig)
    if kid is None:
        raise SignatureMismatchError(f"{sig}: damaged: not a signature bundle that names its key")
    signer = next((k for k in keys if k.key_id == kid), None)
    if signer is None:
        raise UnknownSignerError(f"{sig}: signed by an unknown key (key id {kid}); trusted: {trusted}")
    try:
        verifying.Config().use_elliptic_key_verifier(public_key=signer.path).set_hashing_config(_hashing()).verify(
            vdir, sig
        )
    except ValueError as exc:
        text = str(exc)
        if text.startswith("Signature mismatch"):
            raise SignatureMismatchError(
                f"{vdir}: the files are not the ones {signer.name} signed: {_mismatch(text)}"
            ) from None
        raise SignatureMismatchError(f"{sig}: damaged ({text})") from None
    except Exception as exc:  # an invalid signature (cryptography's InvalidSignature), an unreadable bundle
        raise SignatureMismatchError(
            f"{sig}: damaged: the signature does not verify with {signer.name}'s key "
            f"({type(exc).__name__}{': ' + str(exc) if str(exc) else ''})"
        ) from None
    return signer


def _mismatch(text: str) -> str:
    """model-signing's list of differences (``Signature mismatch: [...]``) as one line."""
    body = text.split(":", 1)[1].strip()
    try:
        import ast

        items = ast.literal_eval(body)
        return "; ".join(items) if isinstance(items, list) else body
    except (ValueError, SyntaxError):
        return body
