"""Stage records: JSON documents validated against ``schemas/<stage>.schema.json``.

Every record has a top-level ``"stage"`` naming its schema.  :func:`write_record` validates
before writing (atomically), so an invalid record fails its task and leaves nothing behind.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from pathlib import Path

from . import SCHEMA_DIR
from .atomic import write_json
from .errors import ConfigError, PackageIntegrityError, RecordError  # noqa: F401  (RecordError re-exported)


@functools.cache
def load_schema(name: str) -> dict:
    path = SCHEMA_DIR / f"{name}.schema.json"
    if not path.is_file():
        raise RecordError(f"no schema for stage {name!r}: {path} does not exist")
    return json.loads(path.read_text())


@functools.cache
def _registry():
    """Schemas ``$ref`` each other by file name (their ``$id``); a referenced schema is read
    when first needed, so a stage reads only the schemas it validates against (which is
    what its task depends on: laya_build.deps.schema_closure)."""
    from referencing import Registry, Resource
    from referencing.exceptions import NoSuchResource

    def retrieve(uri: str):
        name = uri.rsplit("/", 1)[-1]
        if not name.endswith(".schema.json"):
            raise NoSuchResource(ref=uri)
        try:
            return Resource.from_contents(load_schema(name.removesuffix(".schema.json")))
        except RecordError:
            raise NoSuchResource(ref=uri) from None

    return Registry(retrieve=retrieve)


def ecma_regex(pattern: str) -> str:
    """A JSON Schema ``pattern`` (an ECMA-262 regular expression) for Python's ``re``.

    Without the multiline flag, ECMA's ``$`` matches only at the very end of the string;
    Python's also matches before a final newline, so ``^[0-9.]+$`` would accept
    ``"1.2.0\\n"`` (a YAML block scalar's value) and a version folder would end in a newline.
    Every ``$`` outside a character class becomes ``\\Z``.
    """
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "$":
            c = r"\Z"
        out.append(c)
        i += 1
    return "".join(out)


def _pattern(validator, pattern, instance, schema):
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not re.search(ecma_regex(pattern), instance):
        hint = ""
        if re.search(pattern, instance):  # matched only thanks to Python's "$ before a final newline"
            hint = " (it ends in a newline: a YAML block scalar such as `key: |` keeps one; write it on one line)"
        yield ValidationError(f"{instance!r} does not match {pattern!r}{hint}")


def _ascending(validator, keys, instance, schema):
    """``"ascending": ["min", "max"]``: the listed properties, where present, never decrease
    (a rule JSON Schema cannot state; a range with min > max is empty)."""
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    present = [(k, instance[k]) for k in keys if k in instance]
    for (a, va), (b, vb) in zip(present, present[1:]):
        if validator.is_type(va, "number") and validator.is_type(vb, "number") and va > vb:
            yield ValidationError(f"{a} {va!r} is greater than {b} {vb!r}: the range is empty")


@functools.cache
def _validator(name: str):
    import jsonschema

    schema = load_schema(name)
    base = jsonschema.validators.validator_for(schema)
    # The schemas themselves are checked against their metaschema by the tests
    # (tests/pipeline/test_graph_and_records.py), not on every start of doit.
    cls = jsonschema.validators.extend(base, {"pattern": _pattern, "ascending": _ascending})
    return cls(schema, registry=_registry(), format_checker=base.FORMAT_CHECKER)


def key_path(error) -> str:
    """``models.0.dtype`` style path of a jsonschema error (``<root>`` for the document)."""
    parts = [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "<root>"


def validate(name: str, doc, *, what: str | None = None) -> None:
    """Raise :class:`RecordError` with the best-matching error and its key path."""
    import jsonschema

    error = jsonschema.exceptions.best_match(_validator(name).iter_errors(doc))
    if error is not None:
        label = what or f"{name} record"
        raise RecordError(f"{label}: invalid at {key_path(error)}: {error.message}{_hint(error)}")


def _hint(error) -> str:
    """A number YAML read as text: YAML 1.1 needs a dot in a float's mantissa (1.0e-5, not 1e-5)."""
    expected = error.validator_value if error.validator == "type" else ()
    if isinstance(error.instance, str) and "number" in expected:
        try:
            float(error.instance)
        except ValueError:
            return ""
        return f" (YAML reads {error.instance} as text: write it with a dot, e.g. 1.0e-5)"
    return ""


def check_record(path: str | os.PathLike, record: dict) -> None:
    """Validate ``record`` against the schema its ``stage`` names (before anything is written)."""
    if not isinstance(record, dict) or "stage" not in record:
        raise RecordError(f"{path}: a record must be an object with a top-level 'stage'")
    validate(record["stage"], record, what=f"{record['stage']} record for {path}")


def write_record(path: str | os.PathLike, record: dict, *, exclusive: bool = False) -> Path:
    """Validate ``record``, then write it atomically (``exclusive``: never over an existing file)."""
    check_record(path, record)
    return write_json(path, record, exclusive=exclusive)


def read_record(path: str | os.PathLike) -> dict:
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordError(f"{path}: record is missing") from None
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(record, dict) or "stage" not in record:
        raise RecordError(f"{path}: not a stage record (no top-level 'stage')")
    validate(record["stage"], record, what=str(path))
    return record


def sha256_file(path: str | os.PathLike) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def file_entry(path: str | os.PathLike, root: str | os.PathLike | None = None) -> dict:
    """``{"path", "bytes", "sha256"}`` of a file (path relative to ``root`` when given)."""
    path = Path(path)
    rel = path.relative_to(root).as_posix() if root is not None else path.as_posix()
    return {"path": rel, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


# ------------------------------------------------------------------- the model stages' records

STAGE_FILES = {"model": "model.json", "export": "export.json", "aoti_package": "aoti_package.json",
               "verify": "verify.json", "latency": "latency.json"}


def record_path(out_dir, stage: str) -> Path:
    return Path(out_dir) / STAGE_FILES[stage]


def finish(out_dir, record: dict) -> dict:
    """Validate and atomically write ``record`` as ``out_dir/<stage>.json``; return it."""
    write_record(record_path(out_dir, record["stage"]), record)
    return record


def skip(stage: str, out_dir, reason: str, **fields) -> dict:
    """Write an explicit skip record (never a silent pass)."""
    return finish(out_dir, {"stage": stage, "status": "skipped", "reason": reason, **fields})


def skip_if_blocked(stage: str, out_dir, up: dict, target: str, *, aoti: bool = False) -> dict | None:
    """The skip record of ``stage`` when its upstream record ``up`` was skipped or ``target``
    cannot run here (:func:`laya_build.toolchain.unsupported_reason`); ``None`` when the
    stage can run."""
    from .toolchain import unsupported_reason

    if up["status"] == "skipped":
        reason = f"{up['stage']} skipped: {up['reason']}"
    elif not (reason := unsupported_reason(target, aoti=aoti)):
        return None
    return skip(stage, out_dir, reason, target=target, **({"dtype": up["dtype"]} if "dtype" in up else {}))


def check_sha256(path, expected: str, record: str, consequence: str = "") -> str:
    """``path``'s sha256, which must be ``expected`` (from ``record``) before anything uses it."""
    actual = sha256_file(path)
    if actual != expected:
        raise PackageIntegrityError(f"{path}: sha256 {actual} does not match the {record}'s "
                                    f"{expected}{consequence}")
    return actual


def upstream(path, stage: str) -> dict:
    """Read and validate an upstream record, checking it is the expected stage's."""
    record = read_record(path)
    if record["stage"] != stage:
        raise ConfigError(f"{path}: expected a {stage} record, got stage {record['stage']!r}")
    return record
