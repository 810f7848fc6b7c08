"""A content-addressed cache of stage results, shared by checkouts, machines and CI jobs.

A stage task's key (:mod:`.keys`) digests everything that shapes its outputs' bytes.  When the
task is out of date here and its key is in the cache, its outputs are fetched instead of built
(:func:`fetch`): every blob's sha256 is checked before anything is moved into place, all of
them or none are, and the digest of the outputs is recorded as a run of the stage would.  A
builder allowed to write stores what a stage it ran left, once the stage succeeded
(:func:`store`): blobs hashed after the run, the entry last.

A cache can never break a build: a blob whose bytes do not match its name is reported and
never served (the task is built here instead), and a cache that cannot be reached, or answers
too slowly, is reported once and the build goes on without it.  What ``verify`` and
``release`` do is never answered from the cache: they check and hash the bytes on disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from laya_build import filedigests
from laya_build.cache.settings import CacheSettings, cache_settings
from laya_build.cache.store import BlobMismatch, CacheUnavailable, MissingBlob, Store
from laya_build.stage import Stage

__all__ = [
    "CacheSettings",
    "CacheUnavailable",
    "cache_settings",
    "Store",
    "fetch",
    "store",
    "cacheable",
    "warn",
    "disable",
]

ENTRY_FORMAT = 1
_STATE: dict = {"disabled": None, "stores": {}}


def cacheable(stage: Stage) -> bool:
    """Whether a stage's results may come from the cache: a stage that writes outputs of its
    own into a version, and is not one that must run every time (``verify``, ``release``)."""
    return not stage.always and stage.writes_into is not None and bool(stage.targets or stage.dirs)


def store_for(settings: CacheSettings) -> Store:
    """One :class:`Store` per cache in a process."""
    name = settings.url + json.dumps(settings.options, sort_keys=True, default=str)
    found = _STATE["stores"].get(name)
    if found is None:
        found = _STATE["stores"][name] = Store(settings)
    return found


def disabled() -> str | None:
    return _STATE["disabled"]


def disable(reason: str) -> None:
    """Stop using the cache in this process (and in the processes it forks), saying so once."""
    if _STATE["disabled"] is None:
        _STATE["disabled"] = reason
        warn(f"cache unavailable, building locally: {reason}")


def warn(message: str) -> None:
    print(f"laya-build: warning: {message}", file=sys.stderr, flush=True)


def note(message: str) -> None:
    print(f"laya-build: cache: {message}", file=sys.stderr, flush=True)


def report(path: Path | None, task: str, result: str, **fields) -> None:
    """One line of the run's cache report (``artifacts/.doit/cache/<version>.jsonl``)."""
    if path is None:
        return
    line = json.dumps({"task": task, "result": result, **fields}, sort_keys=True) + "\n"
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write of a short line: whole, between other workers'
        finally:
            os.close(fd)


def _outputs_of(stage: Stage, root: Path) -> tuple[set[str], tuple[str, ...]]:
    files = {Path(f).relative_to(root).as_posix() for f in stage.targets}
    dirs = tuple(Path(d).relative_to(root).as_posix() for d in stage.dirs)
    return files, dirs


def _owned(rel: str, files: set[str], dirs: tuple[str, ...]) -> bool:
    parts = Path(rel).parts
    if not rel or Path(rel).is_absolute() or ".." in parts or any(p.startswith(".") for p in parts):
        return False
    return rel in files or any(rel.startswith(d + "/") for d in dirs)


def _check_entry(entry: dict, stage: Stage, key: str, root: Path) -> str | None:
    """Why an entry cannot be used for ``stage`` (None: it can)."""
    if not isinstance(entry, dict) or entry.get("format") != ENTRY_FORMAT or entry.get("key") != key:
        return "the entry is malformed or of another format"
    if entry.get("task") != stage.task:
        return f"the entry is of task {entry.get('task')!r}"
    files = entry.get("files")
    if not isinstance(files, dict):
        return "the entry lists no files"
    owned_files, owned_dirs = _outputs_of(stage, root)
    for rel, sha in files.items():
        if not _owned(rel, owned_files, owned_dirs):
            return f"the entry names {rel!r}, which is not an output of {stage.task}"
        if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
            return f"the entry's sha256 of {rel!r} is malformed"
    missing = owned_files - set(files)
    if stage.record is not None and Path(stage.record).relative_to(root).as_posix() in missing:
        return "the entry has no record"
    return None


def fetch(stage: Stage, key: str, *, root: Path, settings: CacheSettings, scratch: Path, report_to=None) -> bool:
    """Put ``stage``'s outputs in place from the cache entry ``key``; False on a miss (nothing
    of the outputs changed then, except what a bad blob's cleanup removed)."""
    from laya_build.runner.stage import prepare_outputs

    if disabled() or not settings.read:
        return False
    cache = store_for(settings)
    root = Path(root).resolve()
    start = time.perf_counter()
    try:
        entry = cache.get_entry(key)
    except CacheUnavailable as exc:
        disable(str(exc))
        return False
    if entry is None:
        report(report_to, stage.task, "miss", key=key)
        return False
    if (why := _check_entry(entry, stage, key, root)) is not None:
        warn(f"cache entry {key[:16]} of {stage.task} not used: {why}; building it here")
        report(report_to, stage.task, "bad-entry", key=key, reason=why)
        return False
    files: dict[str, str] = entry["files"]
    given = entry.get("sizes") if isinstance(entry.get("sizes"), dict) else {}
    sizes = {rel: v if isinstance(v, int) and v >= 0 else 0 for rel, v in given.items()}
    scratch.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{stage.task.replace(':', '_')}.", dir=scratch))
    try:
        for i, (rel, sha) in enumerate(sorted(files.items())):
            try:
                cache.fetch_blob(sha, tmp / str(i), sizes.get(rel, 0))
            except BlobMismatch as exc:
                removed = ""
                if settings.write:
                    with contextlib.suppress(CacheUnavailable):
                        cache.remove_blob(sha)
                        removed = "; removed from the cache"
                warn(
                    f"cache blob {sha} ({rel}) of {stage.task} is corrupt: {exc}; not used{removed}, "
                    f"{stage.task} is built here"
                )
                report(report_to, stage.task, "corrupt", key=key, blob=sha, file=rel)
                return False
            except MissingBlob:
                warn(f"cache entry of {stage.task} names blob {sha} ({rel}), which is missing; building it here")
                report(report_to, stage.task, "missing-blob", key=key, blob=sha, file=rel)
                return False
            except CacheUnavailable as exc:
                disable(str(exc))
                return False
        # every blob is here and checked: now (and only now) the outputs are replaced
        outputs = prepare_outputs(stage)
        for d in stage.dirs:
            Path(d).mkdir(parents=True, exist_ok=True)
        for i, (rel, sha) in enumerate(sorted(files.items())):
            dest = root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(tmp / str(i), _file_mode())
            os.replace(tmp / str(i), dest)
            filedigests.remember(dest, sha)  # its bytes were hashed as they came
        outputs.save()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = sum(sizes.get(rel, 0) for rel in files)
    note(f"{stage.task}: fetched ({len(files)} files, {size / 1e6:.1f} MB) in {time.perf_counter() - start:.2f} s")
    report(report_to, stage.task, "fetched", key=key, files=len(files), bytes=size)
    return True


def _file_mode() -> int:
    from laya_build.atomic import FILE_MODE

    return FILE_MODE


def store(stage: Stage, key: str, *, root: Path, settings: CacheSettings, report_to=None, built_by: dict | None = None):
    """Store what ``stage`` left (after it succeeded): its outputs as recorded once complete."""
    if disabled() or not settings.write:
        return False
    root = Path(root).resolve()
    saved = stage.outputs.saved()
    if not saved or any(v == "unfinished write" for v in saved.values()):
        return False
    files: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for path, sha in saved.items():
        if sha is None:
            continue
        try:
            rel = Path(path).relative_to(root).as_posix()
        except ValueError:
            return False  # an output outside the checkout: not shareable
        files[rel] = sha
        sizes[rel] = Path(path).stat().st_size
    cache = store_for(settings)
    start = time.perf_counter()
    uploaded = 0
    try:
        for rel, sha in sorted(files.items()):
            if not cache.has_blob(sha):
                cache.put_blob(sha, root / rel)
                uploaded += sizes[rel]
        cache.put_entry(
            key,
            {
                "format": ENTRY_FORMAT,
                "key": key,
                "task": stage.task,
                "files": files,
                "sizes": sizes,
                "built_by": built_by or {},
            },
        )
    except CacheUnavailable as exc:
        disable(str(exc))
        return False
    report(
        report_to,
        stage.task,
        "stored",
        key=key,
        files=len(files),
        uploaded=uploaded,
        seconds=round(time.perf_counter() - start, 3),
    )
    return True
