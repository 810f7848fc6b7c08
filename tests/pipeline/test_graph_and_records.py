"""Building the task graph stays light; records are validated before anything is written."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from laya_build import atomic, records
from tests.pipeline.project import ROOT

HEAVY = ("torch", "tilelang", "tvm", "transformers")


def test_loading_the_task_graph_imports_no_heavy_module():
    code = (
        "import sys; sys.argv = ['doit']; import dodo; "
        "from doit.loader import load_tasks; tasks = load_tasks(vars(dodo)); "
        f"print(len(tasks)); print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    count, heavy = out.splitlines()
    assert int(count) > 50
    assert heavy == "[]"


def test_invalid_record_is_not_written(tmp_path):
    target = tmp_path / "lower_c" / "rope.json"
    bad = {"stage": "lower_c", "variant": "rope"}  # most required fields missing
    with pytest.raises(
        records.RecordError, match=r"lower_c record for .*rope.json: invalid at <root>: '.*' is a required property"
    ):
        records.write_record(target, bad)
    assert not target.exists()
    assert not list(tmp_path.rglob("*.tmp"))


def test_record_naming_an_unknown_stage_is_refused(tmp_path):
    with pytest.raises(records.RecordError, match="no schema for stage 'nope'"):
        records.write_record(tmp_path / "x.json", {"stage": "nope"})
    assert not (tmp_path / "x.json").exists()


def test_interrupted_write_leaves_the_previous_file(tmp_path):
    target = tmp_path / "a.json"
    atomic.write_json(target, {"v": 1})
    with pytest.raises(KeyboardInterrupt):
        with atomic.atomic_path(target) as tmp:
            tmp.write_text('{"v": 2, "trunc')
            raise KeyboardInterrupt
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_exclusive_write_never_replaces(tmp_path):
    target = tmp_path / "manifest.json"
    atomic.write_json(target, {"first": True}, exclusive=True)
    with pytest.raises(FileExistsError):
        atomic.write_json(target, {"first": False}, exclusive=True)
    assert json.loads(target.read_text()) == {"first": True}
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_written_files_get_the_umask_mode_not_mkstemps_0600(tmp_path):
    old = os.umask(0o022)
    try:
        mode = atomic._file_mode()
    finally:
        os.umask(old)
    assert mode == 0o644
    target = atomic.write_json(tmp_path / "r.json", {"v": 1})
    assert stat.S_IMODE(target.stat().st_mode) == atomic.FILE_MODE


def test_read_record_validates(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"stage": "cuda_diff", "summary": "x"}))
    with pytest.raises(records.RecordError, match="r.json: invalid at"):
        records.read_record(path)
    path.write_text("{not json")
    with pytest.raises(records.RecordError, match="not valid JSON"):
        records.read_record(path)


def test_every_schema_is_a_valid_json_schema():
    import jsonschema

    from laya_build import SCHEMA_DIR

    schemas = sorted(SCHEMA_DIR.glob("*.schema.json"))
    assert len(schemas) >= 15
    for path in schemas:
        schema = json.loads(path.read_text())
        jsonschema.validators.validator_for(schema).check_schema(schema)
        assert schema["$id"] == path.name, path
