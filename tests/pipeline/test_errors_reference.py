"""docs/reference/errors.md is generated from laya_build/errors.py and kept current; every
error says what to do; configuration and command-line errors exit 3, failed tasks 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from laya_build import errors

ROOT = Path(__file__).resolve().parents[2]
DOCUMENT = ROOT / errors.DOCS


def test_the_committed_reference_is_the_generated_one():
    assert DOCUMENT.read_text() == errors.render_reference(), (
        f"{errors.DOCS} is out of date: run .venv/bin/python -m laya_build.errors"
    )
    check = subprocess.run(
        [sys.executable, "-m", "laya_build.errors", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr


def test_check_fails_on_a_stale_reference(tmp_path, monkeypatch):
    stale = errors.render_reference().replace("## ConfigError", "## ConfigErr")
    monkeypatch.setattr(errors, "render_reference", lambda: stale)
    assert errors.main(["--check"]) == 1


def test_every_error_has_a_meaning_a_hint_and_a_section():
    text = DOCUMENT.read_text()
    for cls in errors.all_errors():
        assert (cls.__doc__ or "").strip(), f"{cls.__name__} says nothing of what it means"
        assert cls.hint or cls is errors.LayaBuildError or cls is errors.UserError, f"{cls.__name__} has no hint"
        assert f"## {cls.__name__}\n" in text and f"(#{cls.reference()})" in text


def test_configuration_and_command_line_errors_exit_3_and_failures_1():
    for cls in errors.all_errors():
        expected = 3 if issubclass(cls, errors.UserError) else 1
        assert cls.exit_code == expected, cls
    assert errors.ConfigError.exit_code == errors.UsageError.exit_code == errors.ReleasedVersionError.exit_code == 3
    assert errors.ManifestMismatch.exit_code == errors.ParityError.exit_code == 1


def test_an_error_prints_its_message_hint_and_reference():
    exc = errors.ConfigError("pipeline.yaml: invalid at cuda.dtypes.0: 'bf16' is not one of ['bfloat16']")
    lines = str(exc).splitlines()
    assert lines[0].startswith("pipeline.yaml: invalid at cuda.dtypes.0")
    assert lines[1].startswith("  hint: fix the key named above")
    assert lines[2] == "  see: docs/reference/errors.md#config-error"
    own = errors.UsageError("x", hint="`doit help release_diff`")
    assert "hint: `doit help release_diff`" in str(own) and errors.message_of(own) == "x"
