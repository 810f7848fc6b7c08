"""Make a key pair that signs releases: ``python -m laya_build.release.keys new <name>``.

Writes ``<name>.key`` (the PEM private key, P-256, readable by its owner only; encrypted
with the password in the environment variable given by ``--password-env``) and ``<name>.pub``
(the public key that verifiers list in ``trust.keys``), and prints the key id.  Existing
files are never replaced.  The same pair can be made with OpenSSL::

    openssl ecparam -name prime256v1 -genkey -noout -out <name>.key
    openssl ec -in <name>.key -pubout -out <name>.pub
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def new(name: str, password: bytes | None = None) -> tuple[Path, Path, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from laya_build.errors import SigningKeyError
    from laya_build.release.signing import key_id

    private, public = Path(f"{name}.key"), Path(f"{name}.pub")
    for path in (private, public):
        if path.exists():
            raise SigningKeyError(f"{path} exists; a key is never replaced (choose another name)")
    key = ec.generate_private_key(ec.SECP256R1())
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public, key_id(key.public_key())


def main(argv: list[str] | None = None) -> int:
    from laya_build.errors import LayaBuildError, SigningKeyError

    parser = argparse.ArgumentParser(prog="python -m laya_build.release.keys", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("new", help="make <name>.key and <name>.pub")
    make.add_argument("name", help="path and name of the pair, without suffix (e.g. keys/release-team)")
    make.add_argument("--password-env", help="environment variable holding a password that encrypts the key")
    args = parser.parse_args(argv)
    try:
        password = None
        if args.password_env:
            if not os.environ.get(args.password_env):
                raise SigningKeyError(f"--password-env {args.password_env}: the variable is not set or empty")
            password = os.environ[args.password_env].encode()
        private, public, kid = new(args.name, password)
    except LayaBuildError as exc:
        print(f"laya-build: {type(exc).__name__}: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"private key: {private} (signing.key, or LAYA_BUILD_SIGNING_KEY)")
    print(f"public key:  {public} (trust.keys of every machine that verifies)")
    print(f"key id:      {kid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
