"""The ``release`` stage: publish a built version as a release (format :data:`FORMAT`).

In this order: ``pipeline.effective.json``, ``REPORT.md``, ``sbom.cdx.json``,
``provenance.json``, ``manifest.json`` (exclusively), ``SHA256SUMS`` and, with a signing key,
``release.sig``; ``.release-pending`` marks the publication until the end.  Kept apart from
:mod:`laya_build.release` (what reads releases: the runtime and verify) because it asks
TileLang's TVM for its version.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from laya_build.atomic import write_json, write_text
from laya_build.environment import snapshot
from laya_build.layout import PROVENANCE_NAME, SBOM_NAME, SIGNATURE_NAME, SUMS_NAME
from laya_build.log import get_logger
from laya_build.records import file_entry
from laya_build.release import (
    EFFECTIVE_CONFIG,
    FORMAT,
    PENDING,
    REPORT,
    ReleasedVersionError,
    config_digest,
    effective_config,
    git_state,
    manifest_path,
    refuse_if_released,
    release_files,
    sums_text,
)

log = get_logger(__name__)


def publish(**spec) -> None:
    """The ``release`` stage: REPORT.md, the effective configuration, the provenance, the
    manifest, ``SHA256SUMS`` and the signature (:func:`build_manifest`)."""
    build_manifest(spec)


def build_manifest(spec: dict) -> dict:
    """spec: version, version_dir, root, config (effective), owners {relpath: task}, created.

    Writes the effective config and REPORT.md first, so that both are covered by the
    manifest; the manifest itself is written last, exclusively (it can never replace one),
    which is what marks the version released.
    """
    from laya_build.records import write_record
    from laya_build.release import provenance, sbom, signing
    from laya_build.release.report import render_report

    vdir = Path(spec["version_dir"])
    refuse_if_released(vdir, "release")
    leftovers = [p.relative_to(vdir).as_posix() for p in vdir.rglob("*.tmp")]
    if leftovers:
        raise ReleasedVersionError(
            f"{vdir} holds unfinished writes that no task owns ({', '.join(leftovers)}): "
            f"remove them or rebuild before releasing"
        )
    key = signing.signing_key(spec.get("signing"), Path(spec["root"]))  # checked before anything is written
    config = effective_config(spec["config"])
    write_text(vdir / PENDING, "release publication in progress\n")
    write_json(vdir / EFFECTIVE_CONFIG, config)
    env = snapshot(tvm_version())
    git = git_state(Path(spec["root"]))
    write_text(vdir / REPORT, render_report(vdir, config, env, git))
    owners = spec["owners"]
    files = []
    for path in release_files(vdir):
        entry = file_entry(path, vdir)
        top = entry["path"].split("/", 1)[0]
        entry["task"] = owners.get(entry["path"]) or ("release" if entry["path"] in (REPORT, EFFECTIVE_CONFIG) else top)
        files.append(entry)
    digest = config_digest(config)
    created = spec.get("created") or datetime.now(UTC).isoformat(timespec="seconds")
    bom = sbom.document(provenance.distributions(), provenance.toolchain(env), version=spec["version"], created=created)
    write_text(vdir / SBOM_NAME, bom)
    files.append({**file_entry(vdir / SBOM_NAME, vdir), "task": "release"})
    statement = provenance.statement(  # its subjects: every other listed file, the SBOM included
        files, version=spec["version"], config_sha256=digest, effective=EFFECTIVE_CONFIG, git=git, env=env
    )
    write_json(vdir / PROVENANCE_NAME, statement)
    files.append({**file_entry(vdir / PROVENANCE_NAME, vdir), "task": "release"})
    files.sort(key=lambda f: f["path"])
    manifest = {
        "stage": "manifest",
        "format": FORMAT,
        "version": spec["version"],
        "created": created,
        "pipeline": {"sha256": digest, "effective": EFFECTIVE_CONFIG},
        "git": git,
        "environment": env,
        "provenance": PROVENANCE_NAME,
        "sbom": SBOM_NAME,
        "sums": SUMS_NAME,
        "signature": {"file": SIGNATURE_NAME, "key_id": key.key_id} if key else None,
        "files": files,
        "totals": {"files": len(files), "bytes": sum(f["bytes"] for f in files)},
    }
    try:
        write_record(manifest_path(vdir), manifest, exclusive=True)
    except FileExistsError:
        raise ReleasedVersionError(f"release: version {spec['version']} was released concurrently") from None
    write_text(vdir / SUMS_NAME, sums_text(vdir, files))
    if key is not None:
        signing.sign(vdir, key)
        log.info(f"release {spec['version']}: signed with {key.path.name} (key {key.key_id[:16]})")
    else:
        log.info(
            f"release {spec['version']}: not signed (no signing key: signing.key or {signing.SIGNING_KEY_ENV}); "
            f"verify where keys are trusted will refuse it"
        )
    (vdir / PENDING).unlink(missing_ok=True)
    return manifest


def tvm_version() -> str | None:
    """The version of TileLang's bundled TVM (recorded by a release's manifest): the
    ``__version__`` its ``tvm/libinfo.py`` states, read without importing TileLang (which takes
    about 1.4 s); imported only when that file is not where TileLang's wheel puts it."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("tilelang")
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or ():
        libinfo = Path(folder) / "3rdparty" / "tvm" / "python" / "tvm" / "libinfo.py"
        if libinfo.is_file():
            found = re.search(r'^__version__ = "([^"]+)"', libinfo.read_text(), re.MULTILINE)
            if found:
                return found.group(1)
    try:
        import tilelang  # noqa: F401  (puts its bundled tvm on sys.path)
        import tvm

        return getattr(tvm, "__version__", None)
    except ImportError:
        return None
