"""JSON Schema validation of configurations and records (``schemas/<name>.schema.json``).

Errors name the key path (``verify.thresholds.cpu.float32.logit_atol``) of jsonschema's
best-matching error (:func:`jsonschema.exceptions.best_match`).
"""

from __future__ import annotations

import functools
import json
import re

from laya_build import SCHEMA_DIR
from laya_build.errors import RecordError


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
        # the frozen schemas of an earlier release format refer to each other within
        # schemas/formats/<n>/ (laya_build.release.formats)
        folder = re.search(r"(?:^|/)(formats/[0-9]+/)[^/]+$", uri)
        name = (folder[1] if folder else "") + name.removesuffix(".schema.json")
        try:
            return Resource.from_contents(load_schema(name))
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
            out.append(pattern[i : i + 2])
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
