"""What a ``doit`` command is given is bounded and unambiguous: a configuration whose YAML
aliases expand without bound, or one larger than any real one, is refused naming the key path;
a JSON document from a folder laya-build did not write is read within bounds; a variable given
twice or unknown is refused; ``verify`` of a version that is neither released nor built builds
nothing.  Each refusal exits 3 with one message and a hint."""

from __future__ import annotations

import json

import pytest

from laya_build import config
from laya_build.errors import ConfigError, RecordError
from laya_build.records import MAX_JSON_BYTES, read_json
from tests.pipeline.project import ROOT, Project


def alias_bomb(levels: int = 8, width: int = 10) -> str:
    """Nested anchors whose last one stands for width**levels strings."""
    lines = ["  bomb:", f"    l0: &l0 [{', '.join(['bfloat16'] * width)}]"]
    for i in range(1, levels + 1):
        lines.append(f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + f"\n  dtypes: *l{levels}\n"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return Project(tmp_path_factory.mktemp("bounds"))


def _refused(project, *args, cls="ConfigError"):
    run = project.doit(*args, timeout=60)  # a hang is a failure, not a slow pass
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 3, run.stdout + run.stderr
    assert lines[0].startswith(f"laya-build: {cls}: ") and lines[-2].startswith("  hint: "), run.stderr
    return run


def test_aliases_expanding_beyond_the_budget_are_refused_with_the_key_path(project):
    text = (
        (project.path / "pipeline.yaml")
        .read_text()
        .replace("cuda:\n  dtypes: [bfloat16, float16]\n", "cuda:\n" + alias_bomb())
    )
    (project.path / "bomb.yaml").write_text(text)
    try:
        run = _refused(project, "config=bomb.yaml", "list")
    finally:
        (project.path / "bomb.yaml").unlink()
    assert "invalid at cuda.bomb.l8: its YAML aliases expand to 1,111,111,111 values" in run.stderr
    assert len(text) < 4000


@pytest.mark.parametrize("levels, refused", [(3, False), (4, True)])  # 11,111 and 111,111 values in the anchor
def test_the_budget_counts_expanded_values(tmp_path, levels, refused):
    text = (
        (ROOT / "pipeline.yaml")
        .read_text()
        .replace("cuda:\n  dtypes: [bfloat16, float16]\n", "cuda:\n" + alias_bomb(levels))
    )
    (tmp_path / "pipeline.yaml").write_text(text)
    (tmp_path / "artifacts").mkdir()
    if refused:
        with pytest.raises(ConfigError, match=rf"invalid at cuda\.bomb\.l{levels}: its YAML aliases expand"):
            config.load(tmp_path / "pipeline.yaml", root=tmp_path)
    else:  # within the budget, loaded (and then refused by the schema for what it says, not its size)
        with pytest.raises(ConfigError, match=r"invalid at cuda") as err:
            config.load(tmp_path / "pipeline.yaml", root=tmp_path)
        assert "aliases expand" not in str(err.value)


def test_a_recursive_alias_and_an_oversized_file_are_refused(project):
    (project.path / "loop.yaml").write_text("version: &v [*v]\n")
    (project.path / "huge.yaml").write_text("version: 0.1.0\n" + "# padding\n" * 200_000)
    try:
        assert "invalid at version.0: a recursive alias" in _refused(project, "config=loop.yaml", "list").stderr
        assert "larger than 1,048,576 bytes" in _refused(project, "config=huge.yaml", "list").stderr
    finally:
        (project.path / "loop.yaml").unlink()
        (project.path / "huge.yaml").unlink()


def test_json_documents_are_read_within_bounds(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b"[" + b"0," * (MAX_JSON_BYTES // 2) + b"0]")
    with pytest.raises(RecordError, match=r"big.json: larger than 16,777,216 bytes"):
        read_json(big, "manifest")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(RecordError, match=r"deep.json: nested too deeply to be a manifest"):
        read_json(deep, "manifest")
    fine = tmp_path / "fine.json"
    fine.write_text(json.dumps({"stage": "x"}))
    assert read_json(fine) == {"stage": "x"}


def test_a_repeated_or_unknown_variable_is_refused(project):
    run = _refused(project, "version=0.1.0", "version=0.2.0", "list", cls="UsageError")
    assert "doit argument version= is given twice (version=0.1.0 and version=0.2.0)" in run.stderr
    run = _refused(project, "versoin=0.2.0", "list", cls="UsageError")
    assert (
        "doit argument versoin=0.2.0: not a variable of laya-build (known: version=, config=, release=, wait=)"
        in run.stderr
    )
    assert project.doit("version=0.1.0", "version=0.1.0", "list").returncode == 0  # the same value twice


def test_verify_of_a_version_that_does_not_exist_builds_nothing(project):
    run = _refused(project, "verify", "version=9.9.9", cls="UsageError")
    assert "verify version=9.9.9: version 9.9.9 is neither a release nor a complete build" in run.stderr
    assert "versions that can be verified here: released none; built none" in run.stderr
    assert run.executed == [] and not (project.artifacts / "9.9.9").exists()
    run = _refused(project, "verify:cpu-float32", "version=9.9.9", cls="UsageError")
    assert not (project.artifacts / "9.9.9").exists()


def test_a_command_line_error_in_a_task_exits_3(project):
    """release_diff of versions that were never released: the task fails with a UsageError, and
    doit exits 3 (a command-line error), not 1 (a failed build)."""
    run = project.doit("release_diff", "--old", "0.1.0", "--new", "9.9.9", timeout=120)
    assert run.returncode == 3, run.stdout + run.stderr
    assert "laya-build: UsageError: release_diff --old 0.1.0:" in run.stdout


def test_verify_of_one_build_needs_only_that_builds_package(tmp_path):
    """``doit verify:<build>`` after ``doit aoti_package:<build>``: the other builds of the version
    need not exist; ``doit verify`` still asks for every one, and a missing asked-for package is
    named with the command that builds it."""
    from laya_build import config
    from laya_build.errors import UsageError
    from laya_build.layout import VersionLayout
    from laya_build.tasks.model import check_verifiable, model_builds

    (tmp_path / "pipeline.yaml").write_text((ROOT / "pipeline.yaml").read_text())
    p = config.load(tmp_path / "pipeline.yaml", root=tmp_path)
    builds = [f"{t}-{d}" for t, d in model_builds(p)]
    assert "cpu-float32" in builds and len(builds) > 1
    record = VersionLayout(p.version_dir).build_record("aoti_package", "cpu", "float32")
    record.parent.mkdir(parents=True)
    record.write_text("{}")
    check_verifiable(p, ["verify:cpu-float32"])  # that build's package is there: nothing refused
    with pytest.raises(UsageError, match="is neither a release nor a complete build") as whole:
        check_verifiable(p, ["verify"])
    assert "cpu-float32/" not in str(whole.value) and "cpu-bfloat16/aoti_package.json" in str(whole.value)
    with pytest.raises(UsageError) as one:
        check_verifiable(p, ["verify:cpu-float32", "verify:cpu-bfloat16"])
    assert str(one.value).startswith(
        f"verify:cpu-bfloat16 verify:cpu-float32 version={p.version}: the package it verifies is not built "
        "(it lacks aoti_package/cpu-bfloat16/aoti_package.json)"
    )
    assert f"`doit version={p.version} aoti_package:cpu-bfloat16`" in one.value.hint
