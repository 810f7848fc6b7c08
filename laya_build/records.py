"""Stage records: JSON documents validated against ``schemas/<stage>.schema.json``.

Every record has a top-level ``"stage"`` naming its schema.  :func:`write_record` validates
before writing (atomically), so an invalid record fails its task and leaves nothing behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from laya_build.atomic import write_json
from laya_build.errors import RecordError
from laya_build.runtime.digest import sha256_file  # the one file sha256 (re-exported)
from laya_build.schema import validate


def check_record(path: str | os.PathLike, record: dict) -> None:
    """Validate ``record`` against the schema its ``stage`` names (before anything is written)."""
    if not isinstance(record, dict) or "stage" not in record:
        raise RecordError(f"{path}: a record must be an object with a top-level 'stage'")
    validate(record["stage"], record, what=f"{record['stage']} record for {path}")


def write_record(path: str | os.PathLike, record: dict, *, exclusive: bool = False) -> Path:
    """Validate ``record``, then write it atomically (``exclusive``: never over an existing file)."""
    check_record(path, record)
    return write_json(path, record, exclusive=exclusive)


# The largest JSON document laya-build reads (a record, a manifest, an effective configuration):
# far above any it writes (a manifest of the default release: ~60 kB), far below what makes a
# read slow or large; a folder it did not write (a copied release) may hold anything.
MAX_JSON_BYTES = 16 << 20


def read_json(path: str | os.PathLike, what: str = "JSON document"):
    """A JSON document of at most :data:`MAX_JSON_BYTES`, read in bounded time and memory;
    every way it cannot be read is a :class:`RecordError` naming the file."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        raise RecordError(f"{path}: {what} is missing") from None
    except OSError as exc:
        raise RecordError(f"{path}: {what} cannot be read ({exc.strerror or exc})") from None
    if len(raw) > MAX_JSON_BYTES:
        raise RecordError(f"{path}: larger than {MAX_JSON_BYTES:,} bytes, more than any {what} laya-build writes")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RecordError(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:
        raise RecordError(f"{path}: nested too deeply to be a {what}") from None


def read_record(path: str | os.PathLike) -> dict:
    path = Path(path)
    record = read_json(path, "record")
    if not isinstance(record, dict) or "stage" not in record:
        raise RecordError(f"{path}: not a stage record (no top-level 'stage')")
    validate(record["stage"], record, what=str(path))
    return record


def file_entry(path: str | os.PathLike, root: str | os.PathLike | None = None) -> dict:
    """``{"path", "bytes", "sha256"}`` of a file (path relative to ``root`` when given)."""
    path = Path(path)
    rel = path.relative_to(root).as_posix() if root is not None else path.as_posix()
    return {"path": rel, "bytes": path.stat().st_size, "sha256": sha256_file(path)}
