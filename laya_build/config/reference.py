"""The reference of every ``pipeline.yaml`` key, generated: ``docs/reference/configuration.md``.

The document is made from the schemas (``schemas/pipeline.schema.json`` and the files it
``$ref``\\ s, ``model_sections.schema.json`` for the model sections) and the model defaults
(``laya_build/model/defaults.yaml``): one section per top-level key in schema order, one table
row per key path with its type, its default and the schema's description.  ``$ref`` (local
``#/$defs/...`` and cross-file ``other.schema.json#/$defs/...``) and ``allOf`` are resolved
here, so this module needs nothing beyond the standard library and PyYAML.  The output is
the same bytes on every run.

    python -m laya_build.config.reference           # (re)write docs/reference/configuration.md
    python -m laya_build.config.reference --check   # exit 1 when that file differs from render()
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = ROOT / "schemas"
DEFAULTS_PATH = ROOT / "laya_build" / "model" / "defaults.yaml"
OUTPUT = ROOT / "docs" / "reference" / "configuration.md"
ROOT_SCHEMA = "pipeline.schema.json"
MODEL_SCHEMA = "model_sections.schema.json"
MODULE = __spec__.name if __spec__ is not None else "laya_build.config.reference"
COMMAND = f".venv/bin/python -m {MODULE}"

# The placeholder of a map's keys, by the map's key path; other maps are named after their
# ``propertyNames`` definition (``<dtype>``), or ``<name>``.
PLACEHOLDERS = {
    "kernels.variants": "variant",
    "kernels.variants.<variant>.kwargs": "option",
    "cpu_checks.atol_overrides": "variant",
    "cpu_checks.shapes": "variant",
    "model.generate.act_costs": "action",
    "model.generate.temperature_by_options": "bucket",
}

TYPE_NAMES = {
    "object": "mapping",
    "array": "list",
    "string": "string",
    "integer": "integer",
    "number": "number",
    "boolean": "boolean",
    "null": "null",
}
COMPARISONS = (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"))
LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")


class SchemaError(ValueError):
    """A ``$ref`` that points nowhere, or a reference cycle."""


# --------------------------------------------------------------------------------- schemas


def load_schemas(directory: Path = SCHEMA_DIR) -> dict[str, dict]:
    """Every ``*.schema.json`` of ``directory`` by file name (what ``$ref`` names), with each
    local ``#/...`` reference rewritten as ``<file>#/...`` so that a node can be resolved
    without knowing which file it came from."""
    return {
        path.name: _absolute_refs(json.loads(path.read_text(encoding="utf-8")), path.name)
        for path in sorted(directory.glob("*.schema.json"))
    }


def _absolute_refs(node, name: str):
    if isinstance(node, dict):
        out = {key: _absolute_refs(value, name) for key, value in node.items()}
        ref = out.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            out["$ref"] = name + ref
        return out
    if isinstance(node, list):
        return [_absolute_refs(value, name) for value in node]
    return node


def _combine(base: dict, extra: dict) -> dict:
    """``base`` and ``extra`` as one schema, for what this document shows: properties of both
    (a property in both becomes the ``allOf`` of the two), the union of ``required``, the
    tighter bound, and both descriptions (``base``'s first)."""
    out = dict(base)
    for key, value in extra.items():
        if key not in out:
            out[key] = value
        elif key == "description":
            out[key] = out[key] if value == out[key] else f"{out[key]} {value}"
        elif key == "properties":
            merged = dict(out[key])
            for name, sub in value.items():
                merged[name] = {"allOf": [merged[name], sub]} if name in merged else sub
            out[key] = merged
        elif key == "required":
            out[key] = list(dict.fromkeys([*out[key], *value]))
        elif key in LOWER_BOUNDS:
            out[key] = max(out[key], value)
        elif key in UPPER_BOUNDS:
            out[key] = min(out[key], value)
        else:
            out[key] = value
    return out


@dataclass
class Row:
    """One key path of the document."""

    segments: tuple  # ("key", name), ("map", placeholder) or ("items",), from the top-level key down
    node: dict  # the key's schema, references resolved
    required: bool
    children: list = field(default_factory=list)  # the segments that lead to the rows below

    @property
    def path(self) -> str:
        return key_path(self.segments)


def key_path(segments) -> str:
    out = ""
    for segment in segments:
        if segment[0] == "key":
            out += f".{segment[1]}" if out else segment[1]
        elif segment[0] == "map":
            out += f".<{segment[1]}>"
        else:
            out += "[]"
    return out


class Schemas:
    """The schema files of one folder, and the rows of a key and of every key below it."""

    def __init__(self, docs: dict[str, dict]):
        self.docs = docs

    def target(self, ref: str) -> dict:
        name, _, pointer = ref.partition("#")
        if name not in self.docs:
            raise SchemaError(f"$ref {ref!r}: no schema file {name!r} in {SCHEMA_DIR.name}/")
        node = self.docs[name]
        for part in pointer.split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise SchemaError(f"$ref {ref!r}: {part!r} not found")
            node = node[part]
        return node

    def flat(self, node: dict, _refs: tuple = ()) -> dict:
        """``node`` with its ``$ref`` and ``allOf`` merged in (recursively; not its subschemas)."""
        parts = []
        if "$ref" in node:
            ref = node["$ref"]
            if ref in _refs:
                raise SchemaError(f"$ref cycle: {' -> '.join([*_refs, ref])}")
            parts.append(self.flat(self.target(ref), (*_refs, ref)))
        parts += [self.flat(sub, _refs) for sub in node.get("allOf", [])]
        out: dict = {}
        for part in [*parts, {k: v for k, v in node.items() if k not in ("$ref", "allOf")}]:
            out = _combine(out, part)
        return out

    def placeholder(self, node: dict, path: str) -> str:
        if path in PLACEHOLDERS:
            return PLACEHOLDERS[path]
        ref = node.get("propertyNames", {}).get("$ref", "")
        return ref.rsplit("/", 1)[-1] if "#/$defs/" in ref else "name"

    def children(self, node: dict, segments: tuple) -> list[tuple[tuple, dict, bool]]:
        """(segment, schema, required) of each key below ``node`` (flat), in schema order:
        its properties, those of its ``oneOf``/``anyOf`` forms, the entries of a map and the
        items of a list where these have keys of their own."""
        out, seen = [], set()

        def add(segment, sub, required):
            if segment not in seen:
                seen.add(segment)
                out.append((segment, sub, required))

        required = node.get("required", [])
        for name, sub in node.get("properties", {}).items():
            add(("key", name), sub, name in required)
        for alternative in [*node.get("oneOf", []), *node.get("anyOf", [])]:
            for segment, sub, req in self.children(self.flat(alternative), segments):
                add(segment, sub, req)
        values = [node["additionalProperties"]] if isinstance(node.get("additionalProperties"), dict) else []
        values += list(node.get("patternProperties", {}).values())
        for sub in values:
            if self.children(self.flat(sub), segments):
                add(("map", self.placeholder(node, key_path(segments))), sub, False)
        items = node.get("items")
        if isinstance(items, dict) and self.children(self.flat(items), segments):
            add(("items",), items, False)
        return out

    def rows(self, node: dict, segments: tuple, required: bool) -> list[Row]:
        """The row of ``node`` and every row below it, depth first."""
        flat = self.flat(node)
        row = Row(segments, flat, required)
        out = [row]
        for segment, sub, req in self.children(flat, segments):
            row.children.append(segment)
            out += self.rows(sub, (*segments, segment), req)
        return out

    # ------------------------------------------------------------------------- type text

    def type_text(self, node: dict, path: str, form: bool = False) -> tuple[str, list[str]]:
        """The type of ``node`` (flat) as a head ("list") and its clauses ("at least 1 item").
        ``form``: one of several alternatives, so a mapping names its keys."""
        if "const" in node:
            return f"constant {code(node['const'])}", []
        if "enum" in node:
            return "one of " + ", ".join(code(v) for v in node["enum"]), []
        alternatives = node.get("oneOf") or node.get("anyOf")
        if alternatives:
            forms = [nested(*self.type_text(self.flat(alt), path, form=True)) for alt in alternatives]
            return " or ".join(forms), []
        types = node.get("type")
        types = [types] if isinstance(types, str) else list(types or [])
        if not types:
            return "any value", []
        names = [TYPE_NAMES.get(t, t) for t in types]
        head = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
        if types == ["object"]:
            return self._mapping(node, path, form)
        if types == ["array"]:
            return self._list(node, path)
        return _scalar(head, node), []

    def _mapping(self, node: dict, path: str, form: bool) -> tuple[str, list[str]]:
        head, clauses = "mapping", []
        properties = list(node.get("properties", {}))
        if form and properties:
            head += f" with key{'s' if len(properties) > 1 else ''} " + ", ".join(code(p) for p in properties)
        values = node.get("additionalProperties")
        if isinstance(values, dict) or node.get("patternProperties"):
            keys = f"keys {code_raw('<' + self.placeholder(node, path) + '>')}"
            names = self.flat(node["propertyNames"]) if "propertyNames" in node else {}
            shown = _key_rule(names)
            clauses.append(f"{keys}: {shown}" if shown else keys)
            subs = [values] if isinstance(values, dict) else []
            for sub in subs + list(node.get("patternProperties", {}).values()):
                clauses.append("values: " + nested(*self.type_text(self.flat(sub), path)))
        elif values is None and not properties:
            head += " of any keys"
        if "minProperties" in node:
            n = node["minProperties"]
            clauses.append(f"at least {n} entr{'y' if n == 1 else 'ies'}")
        if node.get("ascending"):
            clauses.append(" ≤ ".join(code(k) for k in node["ascending"]))
        return head, clauses

    def _list(self, node: dict, path: str) -> tuple[str, list[str]]:
        clauses = []
        if isinstance(node.get("items"), dict):
            clauses.append("items: " + nested(*self.type_text(self.flat(node["items"]), path)))
        low, high = node.get("minItems"), node.get("maxItems")
        if low is not None and low == high:
            clauses.append(f"exactly {low} items")
        elif low is not None and high is not None:
            clauses.append(f"{low} to {high} items")
        elif low is not None:
            clauses.append(f"at least {low} item{'s' if low != 1 else ''}")
        elif high is not None:
            clauses.append(f"at most {high} items")
        if node.get("uniqueItems"):
            clauses.append("no duplicates")
        return "list", clauses


def nested(head: str, clauses: list[str]) -> str:
    return f"{head} ({'; '.join(clauses)})" if clauses else head


def _scalar(head: str, node: dict) -> str:
    text, first = head, True
    for key, sign in COMPARISONS:
        if key in node:
            text += f"{' ' if first else ', '}{sign} {_number(node[key])}"
            first = False
    if "multipleOf" in node:
        text += f", multiple of {_number(node['multipleOf'])}"
    if "minLength" in node:
        n = node["minLength"]
        text += ", non-empty" if n == 1 else f", at least {n} characters"
    if "maxLength" in node:
        text += f", at most {node['maxLength']} characters"
    if "pattern" in node:
        text += f", matching {code_raw(node['pattern'])}"
    return text


def _key_rule(names: dict) -> str:
    parts = []
    if "enum" in names:
        parts.append("one of " + ", ".join(code(v) for v in names["enum"]))
    if "pattern" in names:
        parts.append(f"matching {code_raw(names['pattern'])}")
    excluded = names.get("not", {}).get("enum")
    if excluded:
        parts.append("not " + ", ".join(code(v) for v in excluded))
    return ", ".join(parts)


def _number(value) -> str:
    return json.dumps(value)


# ---------------------------------------------------------------------------------- values


def value_text(value) -> str:
    """A value as YAML flow text, on one line (``yaml.safe_load`` reads it back)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30, sort_keys=False, allow_unicode=True)
    return text.removesuffix("\n...\n").removesuffix("\n")


def code_raw(text: str) -> str:
    return f"`{text}`"


def code(value) -> str:
    return code_raw(value_text(value))


def _lookup(defaults, segments: tuple) -> list[tuple[tuple[str, ...], object]]:
    """(keys chosen for the placeholders, value) of every default at ``segments``; nothing
    below a list (a given list replaces the default one whole)."""
    found = [((), defaults)]
    for segment in segments:
        step = []
        for keys, value in found:
            if not isinstance(value, dict):
                continue
            if segment[0] == "key":
                if segment[1] in value:
                    step.append((keys, value[segment[1]]))
            elif segment[0] == "map":
                step += [((*keys, str(k)), v) for k, v in value.items()]
        found = step
    return found


def default_text(row: Row, defaults: dict | None) -> str:
    if defaults is not None:
        found = _lookup(defaults, row.segments)
    else:
        found = [((), row.node["default"])] if "default" in row.node else []
    if not found:
        return "required" if row.required else "—"
    if row.children and all(isinstance(value, dict) for _, value in found):
        if any(segment[0] == "map" for segment in row.children):
            keys = dict.fromkeys(str(k) for _, value in found for k in value)
            return "entries " + ", ".join(code_raw(k) for k in keys) if keys else "no entries"
        return "see below"
    if len(found) == 1 and not found[0][0]:
        return code(found[0][1])
    return "<br>".join(f"{code_raw('.'.join(keys))}: {code(value)}" for keys, value in found)


# -------------------------------------------------------------------------------- markdown


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def prose(text: str) -> str:
    """Schema text for Markdown: outside code spans a ``<`` is shown, not read as HTML, and a
    ``*`` is shown, not read as emphasis."""
    parts = text.split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;").replace("*", "\\*") for i, part in enumerate(parts))


def _intro(sections: list[str], model_sections: list[str]) -> list[str]:
    defaults = DEFAULTS_PATH.relative_to(ROOT).as_posix()
    return [
        "# `pipeline.yaml` reference",
        "",
        "`pipeline.yaml` (or the file given as `doit config=...`) says what laya-build builds: the artifact "
        "version and where outputs go, the TileLang kernel variants and their stages, and the decision model's "
        f"stages.  It is checked against `schemas/{ROOT_SCHEMA}` when it is loaded, before any task runs; a key "
        "that is not listed here is refused.",
        "",
        f"This file is generated from `schemas/{ROOT_SCHEMA}`, the schemas it refers to "
        f"(`schemas/{MODEL_SCHEMA}` for the model sections) and `{defaults}`; do not edit it by hand.  "
        f"Regenerate it with `{COMMAND}`; `{COMMAND} --check` exits 1 when it is out of date.",
        "",
        f"The model sections ({', '.join(f'`{n}`' for n in model_sections)}) are optional: what a section gives is "
        f"merged over `{defaults}` key by key (mappings merge, a list or a scalar replaces the default whole; "
        "e.g. `export: {targets: {cpu: [float32]}}` keeps the default `export.targets.cuda`), and the merged "
        f"section is checked against `schemas/{MODEL_SCHEMA}`.  A release records the effective configuration "
        "(defaults filled in, a `doit version=...` applied) as `pipeline.effective.json` in its version folder.",
        "",
        "Key paths are dotted; `<name>` stands for a key of the user's choosing (an entry of a map), `[]` for "
        "every item of a list.  **Default** is the value of the defaults file for the model sections and the "
        "schema's default elsewhere; *required*: the key must be given; *—*: optional without a default (the "
        "description says what its absence means).  Where a default differs per map entry, it is given per entry.",
        "",
        "Sections: " + ", ".join(f"[`{name}`](#{name})" for name in sections) + ".",
        "",
    ]


def render() -> str:
    """The whole reference as Markdown."""
    schemas = Schemas(load_schemas())
    defaults = yaml.safe_load(DEFAULTS_PATH.read_text(encoding="utf-8"))
    top = schemas.flat(schemas.docs[ROOT_SCHEMA])
    sections = list(top["properties"])
    unknown = [name for name in defaults if name not in sections]
    if unknown:
        raise SchemaError(f"{DEFAULTS_PATH.name}: sections {unknown} are not keys of {ROOT_SCHEMA}")
    model_sections = [name for name in sections if name in defaults]
    out = _intro(sections, model_sections)
    for name in sections:
        required = name in top.get("required", [])
        rows = schemas.rows(top["properties"][name], (("key", name),), required)
        section_defaults = defaults if name in defaults else None
        out += [f"## `{name}`", ""]
        about = rows[0].node.get("description", "")
        status = (
            "Required."
            if required
            else "Optional; every key left out takes its default."
            if section_defaults is not None
            else "Optional."
        )
        out += [f"{prose(about)} {status}".strip(), ""]
        out += ["| Key | Type | Default | Description |", "|---|---|---|---|"]
        first_use: dict[str, str] = {}
        for i, row in enumerate(rows):
            head, clauses = schemas.type_text(row.node, row.path)
            if row.required:
                clauses = [*clauses, "required"]
            kind = "; ".join([head, *clauses])
            description = "" if i == 0 else row.node.get("description", "")
            if description in first_use:
                description = f"As `{first_use[description]}`."
            elif description:
                first_use[description] = row.path
                description = prose(description)
            cells = [code_raw(row.path), kind, default_text(row, section_defaults), description]
            out.append("| " + " | ".join(cell(c) for c in cells) + " |")
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------- output


def _shown(path: Path) -> str:
    path = path.resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def write_atomic(target: Path, data: bytes) -> None:
    """``data`` as ``target``: a temporary file beside it, fsynced, then ``os.replace``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}",
        description="Write the pipeline.yaml reference generated from the schemas and the model defaults.",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the file differs from what would be written"
    )
    parser.add_argument(
        "--output", type=Path, default=OUTPUT, help=f"the file to write or check (default: {_shown(OUTPUT)})"
    )
    args = parser.parse_args(argv)
    target = args.output.resolve()
    data = render().encode("utf-8")
    shown = _shown(target)
    command = COMMAND if target == OUTPUT.resolve() else f"{COMMAND} --output {shown}"
    if args.check:
        try:
            current = target.read_bytes()
        except FileNotFoundError:
            print(f"{shown} is missing; generate it with: {command}", file=sys.stderr)
            return 1
        except OSError as exc:
            print(f"{shown} cannot be read ({exc.strerror or exc}); regenerate it with: {command}", file=sys.stderr)
            return 1
        if current != data:
            print(f"{shown} is out of date; regenerate it with: {command}", file=sys.stderr)
            return 1
        return 0
    write_atomic(target, data)
    print(f"wrote {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
