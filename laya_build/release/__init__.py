"""Releases: the manifest of a version, its immutability, and checking files against it.

A version is *released* once ``artifacts/<version>/manifest.json`` exists.  From then on no
task writes into it (:func:`refuse_if_released`), and :func:`check_files` can tell, by
name, which files are missing, extra or altered, on any machine that has only the folder.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

from laya_build.errors import (  # noqa: F401  (ReleasedVersionError re-exported)
    LayaBuildError,
    ManifestMismatch,  # noqa: F401  (re-exported)
    ReleasedVersionError,
)
from laya_build.layout import (
    AOTI_PACKAGE_DIR,
    EFFECTIVE_CONFIG_NAME,
    MANIFEST_NAME,
    PUBLISHED_FILES,
    RELEASE_FILES,
    REPORT_NAME,
    SIGNATURE_NAME,
    SUMS_NAME,
    record_name,
)
from laya_build.log import get_logger
from laya_build.records import read_json, sha256_file
from laya_build.release import formats

MANIFEST, REPORT, EFFECTIVE_CONFIG = MANIFEST_NAME, REPORT_NAME, EFFECTIVE_CONFIG_NAME
# Present while `doit release` publishes (from REPORT.md to the signature): a folder with
# release files and this marker is an interrupted release, which the next release does again;
# release files without the marker and without a manifest are a damaged release (its manifest
# was removed).
PENDING = ".release-pending"
FORMAT = formats.CURRENT  # the release format this code writes (manifest "format"; none: format 1)
# Configuration sections that belong to the machine, not to what is built: never recorded in
# a release's pipeline.effective.json (nor in its digest).
MACHINE_SECTIONS = ("signing", "trust")

log = get_logger(__name__)


def manifest_path(version_dir: Path) -> Path:
    return Path(version_dir) / MANIFEST


def is_released(version_dir: Path) -> bool:
    """A manifest, and no publication in progress."""
    return manifest_path(version_dir).is_file() and not (Path(version_dir) / PENDING).is_file()


def release_files_present(version_dir: Path) -> list[str]:
    return [name for name in RELEASE_FILES if (Path(version_dir) / name).exists()]


def state(version_dir: Path) -> str:
    """``released`` (has its manifest), ``damaged`` (a release's files without a manifest,
    and no interrupted publication), ``interrupted`` (a release publication was killed) or
    ``build`` (a version being built)."""
    vdir = Path(version_dir)
    if is_released(vdir):
        return "released"
    if manifest_path(vdir).is_file():  # the manifest written, the publication not finished
        return "interrupted"
    if release_files_present(vdir):
        return "interrupted" if (vdir / PENDING).is_file() else "damaged"
    return "build"


def damaged_message(version_dir: Path) -> str:
    vdir = Path(version_dir)
    return (
        f"{vdir} is a damaged release: it has {', '.join(release_files_present(vdir))} but no {MANIFEST}, so "
        f"none of its files can be checked; restore {MANIFEST} from the release, or build a new version"
    )


def refuse_if_released(version_dir: Path, what: str) -> None:
    """Nothing writes into a released version, nor into a damaged one (a release whose
    manifest is missing must not turn into a rebuilt, passing one)."""
    kind = state(version_dir)
    if kind == "released":
        raise ReleasedVersionError(
            f"{what}: version {Path(version_dir).name} is released ({manifest_path(version_dir)} exists) and is never "
            f"modified; build a new version instead, e.g. `doit version=<new> ...`"
        )
    if kind == "damaged":
        raise ReleasedVersionError(f"{what}: {damaged_message(version_dir)}")


def config_digest(data: dict) -> str:
    """sha256 of the effective (validated, overridden) configuration as canonical JSON."""
    import hashlib

    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def git_state(root: Path) -> dict:
    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)

    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=normal")
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def release_files(version_dir: Path, fmt: int = FORMAT) -> list[Path]:
    """Every file of the version folder that its manifest lists: all but the manifest and the
    publication marker, and, from format 2 on, ``SHA256SUMS`` and the signature."""
    vdir = Path(version_dir)
    unlisted = {vdir / MANIFEST, vdir / PENDING} | ({vdir / SUMS_NAME, vdir / SIGNATURE_NAME} if fmt >= 2 else set())
    return sorted(p for p in vdir.rglob("*") if p.is_file() and p not in unlisted)


def effective_config(data: dict) -> dict:
    """What a release records of its configuration: all but the machine's own sections."""
    return {k: v for k, v in data.items() if k not in MACHINE_SECTIONS}


def check_release(version_dir, trust: dict | None = None, root: str | None = None) -> None:
    """The ``verify:manifest`` stage: every file of the release against its manifest, then its
    signature against this machine's trusted keys (``trust``: the verifying pipeline's
    ``trust`` section, never the release's own), before anything of it is loaded."""
    from laya_build.release import signing

    vdir = Path(version_dir)
    keys = signing.trusted_keys(trust, Path(root or "."))
    manifest = check_files(vdir)
    fmt = formats.format_of(manifest, manifest_path(vdir))
    if keys:
        signer = signing.check(vdir, keys)
        said = f"signed by {signer.name} (key {signer.key_id[:16]}), "
    elif (vdir / SIGNATURE_NAME).is_file():
        said = "signature not checked (no trusted keys: trust.keys or LAYA_BUILD_TRUSTED_KEYS), "
    else:
        said = "unsigned (no trusted keys configured, so none is required), "
    log.info(f"verify {manifest['version']}: {said}{manifest['totals']['files']} files match {MANIFEST} ({fmt})")


def listed_builds(version_dir) -> list[str]:
    """The builds (``cpu-float32``) whose package the release's manifest lists."""
    manifest = read_json(manifest_path(version_dir), "manifest")
    record = record_name("aoti_package")
    return sorted(
        f["path"].split("/")[1]
        for f in manifest["files"]
        if f["path"].startswith(f"{AOTI_PACKAGE_DIR}/") and f["path"].endswith(f"/{record}")
    )


def released_versions(artifacts_root) -> list[str]:
    """The released versions of an artifacts folder."""
    root = Path(artifacts_root)
    return sorted(d.name for d in root.iterdir() if d.is_dir() and is_released(d)) if root.is_dir() else []


def sums_text(version_dir: Path, files: list[dict]) -> str:
    """``SHA256SUMS``: ``<sha256>  <path>`` for every listed file and the manifest, sorted by
    path, as ``sha256sum`` writes and ``sha256sum -c`` reads it."""
    rows = [(f["path"], f["sha256"]) for f in files]
    rows.append((MANIFEST, sha256_file(manifest_path(version_dir))))
    return "".join(f"{digest}  {path}\n" for path, digest in sorted(rows))


def clear_interrupted(version_dir: Path) -> None:
    """Undo a killed publication (release files written, no manifest): the next release
    writes them again."""
    vdir = Path(version_dir)
    if state(vdir) == "interrupted":
        for name in (*PUBLISHED_FILES, f".{SIGNATURE_NAME}.tmp", MANIFEST):
            (vdir / name).unlink(missing_ok=True)
        (vdir / PENDING).unlink(missing_ok=True)


def unsafe_entries(version_dir: Path) -> list[str]:
    """What a release folder may not hold, found without following anything: a symbolic link
    (to a file or a folder, the manifest included: the bytes verified would not be the bytes
    served), or a special file (a FIFO, a socket, a device).  The folder itself may be reached
    through a link."""
    vdir = Path(version_dir)
    problems = []
    for dirpath, dirnames, filenames in os.walk(vdir, followlinks=False):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(vdir).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                problems.append(
                    f"link: {rel} (a symbolic link to {os.readlink(path)}; a release holds only "
                    f"regular files and folders)"
                )
            elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                problems.append(f"special file: {rel} (not a regular file)")
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]
    return problems


def outside_paths(manifest: dict) -> list[str]:
    """Manifest paths that do not name a file inside the release folder (absolute, ``..``,
    empty or ``.`` parts, backslashes)."""
    bad = []
    for entry in manifest["files"]:
        rel = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(rel, str):
            continue  # the schema names it
        parts = rel.split("/")
        if rel.startswith("/") or "\\" in rel or any(part in ("", ".", "..") for part in parts):
            bad.append(f"outside: {rel!r} (a manifest path must name a file inside the release folder)")
    return bad


def check_files(version_dir: Path) -> dict:
    """Compare the version folder with its manifest; raise :class:`ManifestMismatch` naming
    every link, special file, path outside the folder, missing, extra or altered file, before
    anything of the folder is used.  Returns the (validated) manifest."""
    vdir = Path(version_dir).resolve()
    if (kind := state(vdir)) == "interrupted" and manifest_path(vdir).is_file():
        raise ManifestMismatch(
            vdir,
            [f"unfinished: {PENDING} (an interrupted publication: `doit release` of the version publishes it again)"],
        )
    if kind != "released":
        raise ManifestMismatch(
            vdir, [f"missing: {MANIFEST} ({damaged_message(vdir) if kind == 'damaged' else 'not a release'})"]
        )
    if problems := unsafe_entries(vdir):  # before the manifest is even read: it may be a link itself
        raise ManifestMismatch(
            vdir,
            problems,
            hint="a release holds regular files only: copy it with the bytes "
            "(`cp -r`, not links), or restore it from the original",
        )
    raw = read_json(manifest_path(vdir), "manifest")  # its paths are checked before its schema
    if isinstance(raw, dict) and isinstance(raw.get("files"), list) and (problems := outside_paths(raw)):
        raise ManifestMismatch(vdir, problems)
    fmt = formats.check_manifest(manifest_path(vdir), raw).number  # its format's schema, on the document read
    manifest = raw
    problems = []
    listed = {f["path"]: f for f in manifest["files"]}
    for rel, entry in listed.items():
        path = vdir / rel
        if not path.is_file():
            problems.append(f"missing: {rel}")
        elif (actual := sha256_file(path)) != entry["sha256"] or path.stat().st_size != entry["bytes"]:
            problems.append(f"altered: {rel} (sha256 {actual} != manifest {entry['sha256']})")
    for path in release_files(vdir, fmt):
        rel = path.relative_to(vdir).as_posix()
        if rel not in listed:
            problems.append(f"extra: {rel}")
    if fmt >= 2:
        problems += published_problems(vdir, manifest)
    if problems:
        raise ManifestMismatch(vdir, problems)
    return manifest


def published_problems(vdir: Path, manifest: dict) -> list[str]:
    """What a format-2 release publishes beside its manifest: ``SHA256SUMS`` as the manifest
    implies it, and the signature the manifest announces (and none it does not)."""
    problems = []
    sums = vdir / SUMS_NAME
    if not sums.is_file():
        problems.append(f"missing: {SUMS_NAME}")
    elif sums.read_bytes() != sums_text(vdir, manifest["files"]).encode():
        problems.append(f"altered: {SUMS_NAME} (not the sha256 of the manifest's files and of {MANIFEST})")
    signed, sig = manifest.get("signature"), vdir / SIGNATURE_NAME
    if signed and not sig.is_file():
        problems.append(f"missing: {SIGNATURE_NAME} (the manifest says the release is signed)")
    elif not signed and sig.is_file():
        problems.append(f"extra: {SIGNATURE_NAME} (the manifest says the release is unsigned)")
    return problems
