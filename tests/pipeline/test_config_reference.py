"""docs/reference/configuration.md: committed as generated, every schema key and every model
default in it, and ``--check`` telling a stale copy from a fresh one.

The key paths are collected here by a walk of the schemas of its own (``$ref`` followed by
hand), not by the generator's, so that a generator that drops or misnames keys fails."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import yaml

from laya_build.config import reference
from tests.pipeline.project import ROOT

SCHEMAS = ROOT / "schemas"
DOCUMENT = ROOT / "docs" / "reference" / "configuration.md"
DEFAULTS = ROOT / "laya_build" / "model" / "defaults.yaml"
REGENERATE = ".venv/bin/python -m laya_build.config.reference"
ANY = "<*>"  # a map entry, whatever the document's placeholder is called


def _rows(text: str) -> dict[str, dict[str, str]]:
    """The table rows of the document by key path: {type, default, description}."""
    rows = {}
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        assert len(cells) == 4, line
        key = cells[0].strip("`")
        assert key not in rows, f"two rows for {key}"
        rows[key] = dict(zip(("type", "default", "description"), cells[1:]))
    return rows


def _schema_paths() -> tuple[set[str], set[str]]:
    """(every key path that ends in a property name, every path including map entries and
    list items) of pipeline.schema.json and, separately, model_sections.schema.json."""
    docs = {p.name: json.loads(p.read_text()) for p in SCHEMAS.glob("*.schema.json")}
    properties, every = set(), set()

    def walk(node: dict, doc: str, path: str, depth: int = 0) -> None:
        assert depth < 50, f"$ref loop at {path}"
        if path:
            every.add(path)
        if "$ref" in node:
            name, _, pointer = node["$ref"].partition("#")
            doc = name or doc
            target = docs[doc]
            for part in filter(None, pointer.split("/")):
                target = target[part]
            walk(target, doc, path, depth + 1)
        for name, sub in node.get("properties", {}).items():
            key = f"{path}.{name}" if path else name
            properties.add(key)
            walk(sub, doc, key, depth + 1)
        for keyword in ("allOf", "oneOf", "anyOf"):
            for sub in node.get(keyword, []):
                walk(sub, doc, path, depth + 1)
        values = node.get("additionalProperties")
        for sub in ([values] if isinstance(values, dict) else []) + list(node.get("patternProperties", {}).values()):
            walk(sub, doc, f"{path}.{ANY}", depth + 1)
        if isinstance(node.get("items"), dict):
            walk(node["items"], doc, f"{path}[]", depth + 1)

    walk(docs["pipeline.schema.json"], "pipeline.schema.json", "")
    walk(docs["model_sections.schema.json"], "model_sections.schema.json", "")
    return properties, every


def _generic(key: str) -> str:
    return re.sub(r"<[a-z_]+>", ANY, key)


def _cell_value(text: str):
    assert text.startswith("`") and text.endswith("`") and text.count("`") == 2, text
    return yaml.safe_load(text[1:-1].replace("\\|", "|"))


# ------------------------------------------------------------------------------------ tests


def test_committed_document_is_the_generated_one():
    assert DOCUMENT.is_file(), f"{DOCUMENT.relative_to(ROOT)} is missing: run {REGENERATE}"
    assert DOCUMENT.read_text(encoding="utf-8") == reference.render(), (
        f"{DOCUMENT.relative_to(ROOT)} is out of date: run {REGENERATE}"
    )


def test_render_is_deterministic_and_imports_no_heavy_module():
    code = (
        "import sys, hashlib; from laya_build.config import reference as r; "
        "print(hashlib.sha256(r.render().encode()).hexdigest()); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tilelang', 'jsonschema', "
        "'referencing')))"
    )
    runs = [
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    ]
    digests = [run.splitlines()[0] for run in runs]
    assert digests[0] == digests[1]
    assert digests[0] == __import__("hashlib").sha256(reference.render().encode()).hexdigest()
    assert runs[0].splitlines()[1] == "[]"


def test_every_schema_key_path_has_a_row():
    properties, every = _schema_paths()
    rows = _rows(reference.render())
    shown = {_generic(key) for key in rows}
    missing = sorted(properties - shown)
    assert not missing, f"key paths of the schemas without a row: {missing}"
    unknown = sorted(shown - every)
    assert not unknown, f"rows for key paths the schemas do not have: {unknown}"
    # the walk went through maps, lists and cross-file references into the model sections
    assert {
        "kernels.variants.<*>.factory",
        "cpu_checks.shapes.<*>[].lens",
        "verify.thresholds.cuda.<*>.act.argmax",
        "runtime.buckets.cpu[].slots",
        "latency.variants.cuda",
        "cuda.baseline.git_ref",
    } <= properties


def test_sections_follow_the_schema_and_each_row_is_under_its_own():
    schema = json.loads((SCHEMAS / "pipeline.schema.json").read_text())
    text = reference.render()
    headings = re.findall(r"^## `([a-z_]+)`$", text, flags=re.M)
    assert headings == list(schema["properties"])
    for section, body in zip(headings, re.split(r"^## `[a-z_]+`$", text, flags=re.M)[1:]):
        keys = list(_rows(body))
        assert keys[0] == section
        assert all(re.match(rf"{section}(\.|\[|$)", key) for key in keys), section


def test_rows_show_types_and_descriptions():
    rows = _rows(reference.render())
    assert rows["cuda.expect"]["type"] == "one of `identical`, `report`"
    assert rows["cpu_checks.atol"]["type"] == "number > 0, ≤ 1; required"
    assert rows["version"]["type"].startswith(r"string, matching `^[0-9]+\.[0-9]+\.[0-9]+")
    assert rows["runtime.buckets.cpu[].tokens"]["type"] == "integer ≥ 16, multiple of 16; required"
    assert rows["export.dims.slots.min"]["type"] == "integer ≥ 2; required"  # allOf over the range
    assert rows["export.dims.rows"]["type"] == "mapping; `min` ≤ `max`; required"
    assert "`git_ref`" in rows["cuda.baseline"]["type"] and "`version`" in rows["cuda.baseline"]["type"]
    assert rows["kernels.variants"]["default"] == "required"
    assert rows["cuda.baseline"]["default"] == "—"
    # descriptions: own, of a $ref's target (cross-file), and both for a $ref with a description beside it
    model = json.loads((SCHEMAS / "model_sections.schema.json").read_text())["$defs"]
    assert rows["verify.thresholds.cpu.<dtype>.decision.logit_atol"]["description"] == model["head_thresholds"][
        "properties"
    ]["logit_atol"]["description"].replace("|", "\\|")
    assert rows["package.timeout_s"]["description"] == (
        f"{model['timeout']['description']} {model['package']['properties']['timeout_s']['description']}"
    )
    assert rows["latency.timing.cuda"]["description"] == "As `latency.timing.cpu`."


def test_every_default_is_next_to_its_key():
    defaults = yaml.safe_load(DEFAULTS.read_text())
    rows = _rows(reference.render())
    patterns = {
        key: re.compile(
            "".join(
                "([^.]+)" if re.fullmatch(r"<[a-z_]+>", part) else re.escape(part)
                for part in re.split(r"(<[a-z_]+>)", key)
            )
        )
        for key in rows
    }
    checked = []

    def check(path: str, value) -> None:
        found = [(key, m.groups()) for key, rx in patterns.items() if (m := rx.fullmatch(path))]
        assert len(found) == 1, f"{path} (defaults.yaml): rows {[k for k, _ in found]}"
        key, chosen = found[0]
        cell = rows[key]["default"]
        if isinstance(value, dict) and value and not cell.startswith("`"):
            if cell.startswith("entries "):
                assert re.findall(r"`([^`]+)`", cell) == list(value) or chosen, (key, cell)
            else:
                assert cell == "see below", (key, cell)
            for name, sub in value.items():
                check(f"{path}.{name}", sub)
            return
        if chosen:
            parts = dict(part.split(": ", 1) for part in cell.split("<br>"))
            label = f"`{'.'.join(chosen)}`"
            assert label in parts, f"{key}: no default for {label} in {cell!r}"
            cell = parts[label]
        assert _cell_value(cell) == value, f"{key}: default {cell!r}, defaults.yaml {path}: {value!r}"
        checked.append(path)

    for section, value in defaults.items():
        check(section, value)
    assert len(checked) > 60
    assert "verify.thresholds.cpu.float32.decision.prob_atol" in checked
    assert "model.generate.act_costs" in checked  # a map of scalars: shown whole


def test_check_tells_a_stale_copy_from_a_fresh_one(tmp_path, capsys):
    target = tmp_path / "configuration.md"
    assert reference.main(["--output", str(target)]) == 0
    assert target.read_text(encoding="utf-8") == reference.render()
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # the temporary file was renamed
    capsys.readouterr()
    assert reference.main(["--check", "--output", str(target)]) == 0
    assert capsys.readouterr().err == ""

    target.write_text(target.read_text().replace("| `cuda.expect` |", "| `cuda.expected` |"))
    assert reference.main(["--check", "--output", str(target)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert str(target) in err and f"{REGENERATE} --output {target}" in err

    target.unlink()
    assert reference.main(["--check", "--output", str(target)]) == 1
    assert str(target) in capsys.readouterr().err


def test_check_of_the_default_output_names_it_and_the_plain_command(tmp_path, monkeypatch, capsys):
    target = tmp_path / "docs" / "reference" / "configuration.md"
    monkeypatch.setattr(reference, "OUTPUT", target)
    assert reference.main([]) == 0  # the folders are made
    assert reference.main(["--check"]) == 0
    target.write_bytes(target.read_bytes() + b"\n")
    capsys.readouterr()
    assert reference.main(["--check"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"{target} is out of date; regenerate it with: {REGENERATE}"


def test_check_on_the_committed_document_from_the_command_line():
    proc = subprocess.run(
        [sys.executable, "-m", "laya_build.config.reference", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == proc.stderr == ""
