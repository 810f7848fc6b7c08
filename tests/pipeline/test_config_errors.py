"""Everything decidable from the configuration is refused when it is loaded: one message that
names the key path (or the doit argument), a non-zero exit, no traceback, nothing written.

The bad configurations are generated, class by class, from what the rules are derived from:
the export ranges and batches of the effective default configuration, the kernel registry's
parameters and defaults, the schemas' targets and dtypes.  Every case is loaded with
:func:`laya_build.config.load`; the first case of each class also runs a real ``doit list``.
"""

from __future__ import annotations

import copy
import os
import re
import shutil

import pytest
import yaml

from kernels.registry import CPU_DTYPE, KERNELS
from laya_build import config
from laya_build.model.batches import BATCH_KEYS, DECISIONS, EXPORT_DIMS, planned_shapes
from laya_build.schema import load_schema
from tests.pipeline.project import ROOT, Project

GOOD = yaml.safe_load((ROOT / "pipeline.yaml").read_text())
EFFECTIVE = config.load(ROOT / "pipeline.yaml").data
# pipeline.yaml with every model section written out (the effective values): each mutation
# can then address any key, whatever pipeline.yaml leaves to the defaults.
BASE = {**copy.deepcopy(GOOD), **{k: copy.deepcopy(EFFECTIVE[k]) for k in config.MODEL_SECTIONS}}
SECTIONS = load_schema("model_sections")["$defs"]
CHECK_SHAPE = load_schema("pipeline")["$defs"]["check_shape"]["properties"]
CHECK_SHAPE_KEYS = set(CHECK_SHAPE)


def _dump(data: dict) -> str:
    return yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper))


def _mutated(fn) -> dict:
    data = copy.deepcopy(BASE)
    fn(data)
    return data


def _set(data: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def setting(path: str, value):
    return lambda d: _set(d, path, value)


CASES: dict[str, tuple] = {}  # id -> (mutation or YAML text, key path, message fragment)


def case(cid: str, mutation, key: str, fragment: str) -> None:
    assert cid not in CASES, cid
    CASES[cid] = (mutation, key, fragment)


# -- export ranges: empty, out of reach, narrower than the batches -----------------------------
SHAPES = planned_shapes(EFFECTIVE["model"]["inputs"])


def _schema_min(key: str) -> int:
    """The smallest ``min`` the schema allows for export.dims.<key>."""
    node = SECTIONS["export"]["properties"]["dims"]["properties"][key]
    extra = [n["properties"]["min"]["minimum"] for n in node.get("allOf", []) if "properties" in n]
    return max([SECTIONS["positive_int"]["minimum"], *extra])


for dim, (key, scale) in EXPORT_DIMS.items():
    lo, hi = (EFFECTIVE["export"]["dims"][key][end] for end in ("min", "max"))
    dims = f"export.dims.{key}"
    case(f"range:{key}:min>max", setting(f"{dims}.min", hi + 1), dims, f"min {hi + 1} is greater than max {hi}")
    case(f"range:{key}:min>max by far", setting(f"{dims}.min", hi + 100), dims, "the range is empty")
    case(f"range:{key}:max out of reach", setting(f"{dims}.max", hi + 1), dims, "do not reach both ends")
    if lo - 1 >= _schema_min(key):
        case(f"range:{key}:min out of reach", setting(f"{dims}.min", lo - 1), dims, "do not reach both ends")
    sizes = [s[dim] for s in SHAPES["batches"]]
    if lo + 1 <= hi:
        at_min, at_max = sizes.index(lo * scale), sizes.index(hi * scale)
        case(
            f"range:{key}:min above a batch",
            setting(f"{dims}.min", lo + 1),
            f"model.inputs.batches.{at_min}",
            f"{dim} = {lo * scale} is outside the export range {(lo + 1) * scale}..{hi * scale}",
        )
        case(
            f"range:{key}:max below a batch",
            setting(f"{dims}.max", hi - 1),
            f"model.inputs.batches.{at_max}",
            f"{dim} = {hi * scale} is outside the export range {lo * scale}..{(hi - 1) * scale}",
        )

# -- the example batch ----------------------------------------------------------------------
n_batches = len(SHAPES["batches"])
for index in (n_batches, n_batches + 7):
    case(
        f"example_batch:{index} past the last",
        setting("export.example_batch", index),
        "export.example_batch",
        f"batch {index} does not exist: model.inputs.batches has {n_batches}",
    )
for index, shape in enumerate(SHAPES["batches"]):
    if shape["rows"] == 1:
        case(
            f"example_batch:{index} has one row",
            setting("export.example_batch", index),
            "export.example_batch",
            "has one row",
        )


def _single_slot(batches):
    def mutate(d):
        d["export"]["single_slot"] = True
        d["model"]["inputs"]["single_slot_batches"] = batches

    return mutate


ONE_OPTION = sorted(n for n, dec in DECISIONS.items() if len(dec.options) == 1)
SEVERAL = sorted(n for n, dec in DECISIONS.items() if len(dec.options) > 1)
case(
    "example_batch:single_slot without batches",
    _single_slot([]),
    "model.inputs.single_slot_batches",
    "no single_slot_batches",
)
case(
    "example_batch:single_slot batch of one row",
    _single_slot([{"decisions": ONE_OPTION[:1]}]),
    "model.inputs.single_slot_batches.0",
    "has one row",
)

# -- decision names and the batch layout ----------------------------------------------------
for bkey in BATCH_KEYS:
    for i, batch in enumerate(EFFECTIVE["model"]["inputs"][bkey]):
        for j, name in enumerate(batch["decisions"]):
            where = f"model.inputs.{bkey}.{i}.decisions.{j}"
            for bad in (name[:-1] + name[-1] * 2, name + "\n"):
                if bad != name:
                    case(f"decision:{bkey}.{i}.{j}:{bad!r}", setting(where, bad), where, f"unknown decisions [{bad!r}]")
        if bkey == "single_slot_batches":
            where = f"model.inputs.{bkey}.{i}.decisions.0"
            case(f"decision:{bkey}.{i}:several options", setting(where, SEVERAL[0]), where, "exactly one option")
            case(
                f"layout:{bkey}.{i}:slots",
                setting(f"model.inputs.{bkey}.{i}.slots", 2),
                f"model.inputs.{bkey}.{i}.slots",
                "a single-slot batch has 1 slot",
            )
            continue
        most = max(len(DECISIONS[n].options) for n in batch["decisions"])
        case(
            f"layout:{bkey}.{i}:slots too few",
            setting(f"model.inputs.{bkey}.{i}.slots", most - 1),
            f"model.inputs.{bkey}.{i}.slots",
            f"has a row with {most} options; slots={most - 1} is too few",
        )
        if "tokens" in batch:
            case(
                f"layout:{bkey}.{i}:tokens not aligned",
                setting(f"model.inputs.{bkey}.{i}.tokens", batch["tokens"] + 1),
                f"model.inputs.{bkey}.{i}.tokens",
                "is not a multiple of 16",
            )

# -- kernel factory arguments (the registry's parameters, their defaults' types) -------------
ZERO_IS_MEANINGFUL = {"window": "0 = full attention", "num_stages": "0 = no software pipelining"}


def _variant_arg(variant: str, kernel, param: str, value):
    """Set ``param`` of ``variant`` where the variant gives it (args or kwargs), else as a kwarg."""

    def mutate(d):
        v = d["kernels"]["variants"][variant]
        args = v.setdefault("args", [])
        if param in kernel.positional[: len(args)]:
            args[kernel.positional.index(param)] = value
        else:
            v.setdefault("kwargs", {})[param] = value

    return mutate


def _arg_key(variant: str, kernel, param: str) -> str:
    args = GOOD["kernels"]["variants"][variant].get("args", [])
    if param in kernel.positional[: len(args)]:
        return f"kernels.variants.{variant}.args.{kernel.positional.index(param)}"
    return f"kernels.variants.{variant}.kwargs.{param}"


def _without(variant: str, kernel, param: str):
    def mutate(d):
        v = d["kernels"]["variants"][variant]
        args = v.get("args", [])
        if param in kernel.positional[: len(args)]:
            v["args"] = args[: kernel.positional.index(param)]
        v.get("kwargs", {}).pop(param, None)

    return mutate


for variant, spec in GOOD["kernels"]["variants"].items():
    kernel = KERNELS[spec["factory"]]
    bound = kernel.bind(spec.get("args", []), spec.get("kwargs", {}), dtype=CPU_DTYPE, cpu=True)
    symbolic = {p for p in kernel.check_sizes.values() if p}
    for p in kernel.config_params:
        cid, key = f"kernel:{variant}.{p.name}", _arg_key(variant, kernel, p.name)
        if p.required:
            case(
                f"{cid}:missing",
                _without(variant, kernel, p.name),
                f"kernels.variants.{variant}.args",
                f"{kernel.factory} needs {p.name}",
            )
        value = bound[p.name]
        if isinstance(value, bool):
            case(
                f"{cid}:int for a flag",
                _variant_arg(variant, kernel, p.name, 1),
                key,
                f"{p.name} must be true or false",
            )
        elif isinstance(value, str):
            case(
                f"{cid}:unknown choice",
                _variant_arg(variant, kernel, p.name, value + "x"),
                key,
                f"{p.name}={value + 'x'!r} is not supported",
            )
        elif isinstance(value, float):
            for bad in (0.0, -value):
                case(f"{cid}:{bad}", _variant_arg(variant, kernel, p.name, bad), key, f"{p.name} must be positive")
        elif isinstance(value, int) or (value is None and p.name in symbolic):
            bads = [-1, True, 2.5] + ([] if p.name in ZERO_IS_MEANINGFUL else [0])
            if p.name not in symbolic and value is not None:
                bads.append(None)
            for bad in bads:  # a wrong type in args is the schema's (integer or null), by value
                wrong_type = isinstance(bad, (bool, float))
                case(
                    f"{cid}:{bad!r}",
                    _variant_arg(variant, kernel, p.name, bad),
                    key,
                    repr(bad) if wrong_type else f"{p.name} must be",
                )
    case(
        f"kernel:{variant}:unknown keyword",
        _variant_arg(variant, kernel, "tile_size", 8),
        f"kernels.variants.{variant}.kwargs.tile_size",
        f"{kernel.factory} has no parameter 'tile_size'",
    )
    case(
        f"kernel:{variant}:too many args",
        setting(f"kernels.variants.{variant}.args", [1] * (len(kernel.positional) + 1)),
        f"kernels.variants.{variant}.args",
        f"{kernel.factory} takes at most {len(kernel.positional)} positional",
    )
    # check shapes: every runtime size is needed, a size the arguments fix cannot change, and
    # a key the kernel does not use is refused
    first = EFFECTIVE["cpu_checks"]["shapes"][variant][0]
    where = f"cpu_checks.shapes.{variant}.0"
    for size in kernel.runtime_sizes(bound):
        rest = {k: v for k, v in first.items() if k != size}
        case(
            f"check shape:{variant}:without {size}",
            setting(where, rest),
            where,
            f"{kernel.factory} checks need {size}" if rest else "should be non-empty",
        )
    for unused in sorted(
        CHECK_SHAPE_KEYS - set(kernel.runtime_sizes(bound)) - set(kernel.check_extra) - set(kernel.check_sizes)
    ):
        value = [1] if CHECK_SHAPE[unused]["type"] == "array" else 3  # valid for the schema
        case(
            f"check shape:{variant}:unused {unused}",
            setting(where, {**first, unused: value}),
            f"{where}.{unused}",
            "is not one of them",
        )
    if "lens" in kernel.check_extra and "lens" in first:
        case(
            f"check shape:{variant}:lens",
            setting(f"{where}.lens", first["lens"] + [1]),
            f"{where}.lens",
            f"{len(first['lens']) + 1} lengths for B=",
        )

# -- thresholds for every target x dtype that is built ---------------------------------------
for target in SECTIONS["target"]["enum"]:
    for dtype in SECTIONS["dtype"]["enum"]:
        if dtype in EFFECTIVE["verify"]["thresholds"].get(target, {}):
            continue

        def builds(d, target=target, dtype=dtype):
            d["export"]["targets"][target] = [*d["export"]["targets"].get(target, []), dtype]
            d["package"]["targets"] = sorted({*d["package"]["targets"], target})

        case(
            f"thresholds:{target}-{dtype}",
            builds,
            f"verify.thresholds.{target}.{dtype}",
            f"no verification thresholds for the {target} {dtype} package",
        )

# -- versions (pipeline.yaml, and the command line below) ------------------------------------
BAD_VERSIONS = [
    "0.1.0\n",
    " 0.1.0",
    "0.1.0 ",
    "0.1.0\t",
    "0.1.0\r",
    "0.1.0\x00",
    "0.1.0\x1b",
    "0.1.0\u00a0",
    "0.1.0\u200b",
    "1..2",
    "v1.2.0",
    "1.2",
    "",
    "../0.1.0",
    "0.1.0/../x",
    "0.1.0-",
    "0.1.0+a b",
]
for bad in BAD_VERSIONS:
    case(f"version:{bad!r}", setting("version", bad), "version", "does not match")
    case(
        f"version:baseline {bad!r}",
        setting("cuda.baseline", {"version": bad}),
        "cuda.baseline.version",
        "does not match",
    )
TEXT = (ROOT / "pipeline.yaml").read_text()
VERSION_LINE = re.search(r"^version: .*$", TEXT, re.M).group(0)
for style in ("|", ">", "|+"):
    case(
        f"version:block scalar {style}",
        TEXT.replace(VERSION_LINE, f"version: {style}\n  {GOOD['version']}"),
        "version",
        "ends in a newline: a YAML block scalar",
    )


@pytest.mark.parametrize("cid", sorted(CASES))
def test_bad_config_is_refused_at_load(tmp_path, cid):
    mutation, key, fragment = CASES[cid]
    text = mutation if isinstance(mutation, str) else _dump(_mutated(mutation))
    (tmp_path / "pipeline.yaml").write_text(text)
    with pytest.raises(config.ConfigError) as info:
        config.load(tmp_path / "pipeline.yaml", root=tmp_path)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'pipeline.yaml'}: invalid at {key}"), message
    assert fragment in message, message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipeline.yaml"], "a bad config must write nothing"


def test_the_cases_cover_every_class():
    classes = {cid.split(":")[0] for cid in CASES}
    assert classes == {"range", "example_batch", "decision", "layout", "kernel", "check shape", "thresholds", "version"}
    # every registered kernel, every export dim, both ends, zero and negative sizes
    assert {c.split(":")[1].split(".")[0] for c in CASES if c.startswith("kernel:")} == set(GOOD["kernels"]["variants"])
    assert {c.split(":")[1] for c in CASES if c.startswith("range:")} == {k for k, _ in EXPORT_DIMS.values()}
    assert any(c.endswith(":0") for c in CASES) and any(c.endswith(":-1") for c in CASES)


def test_a_block_scalar_without_newline_is_fine(tmp_path):
    (tmp_path / "pipeline.yaml").write_text(TEXT.replace(VERSION_LINE, f"version: |-\n  {GOOD['version']}"))
    assert config.load(tmp_path / "pipeline.yaml", root=tmp_path).version == GOOD["version"]


def test_parameters_given_by_keyword_bind_like_positional_ones(tmp_path):
    """A variant may name any factory parameter (upper-case ones too); the registry binds it."""
    data = copy.deepcopy(BASE)
    rope = data["kernels"]["variants"]["rope"]
    names = KERNELS[rope["factory"]].positional
    rope["kwargs"] = {**dict(zip(names, rope.pop("args"))), "block_M": 8}
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(data))
    assert config.load(tmp_path / "pipeline.yaml", root=tmp_path).data["kernels"]["variants"]["rope"] == rope


# -- files and command-line arguments --------------------------------------------------------
FILES = {
    # id: (file bytes or None, doit config= argument or None, fragment)
    "latin-1 byte": (TEXT.encode() + b"# caf\xe9\n", None, "not UTF-8 text (byte 0xe9"),
    "UTF-16": (TEXT.encode("utf-16"), None, "not UTF-8 text (byte 0xff at offset 0, line 1)"),
    "not YAML": (b"version: [1, 2\n", None, "not valid YAML"),
    "empty": (b"", None, "the top level must be a mapping, got NoneType"),
    "a list": (b"- 1\n- 2\n", None, "the top level must be a mapping, got list"),
    "duplicate key": ((TEXT + f'\nversion: "{GOOD["version"]}"\n').encode(), None, "duplicate key 'version'"),
    "boolean key": ((TEXT + "\nyes: 1\n").encode(), None, "key True at line"),
    "number key": (
        TEXT.replace("  variants:\n", "  variants:\n    7: {factory: rope_kernel}\n").encode(),
        None,
        "key 7 at line",
    ),
    "timestamp": (
        (TEXT + "\nmodel:\n  generate:\n    encoder_name: 2024-01-01\n").encode(),
        None,
        "invalid at model.generate.encoder_name",
    ),
    "NaN": (re.sub(r"\batol: [0-9.e-]+", "atol: .nan", TEXT, count=1).encode(), None, "is not a finite number"),
    "infinity": (re.sub(r"\bseed: [0-9]+", "seed: .inf", TEXT, count=1).encode(), None, "is not a finite number"),
    "recursive alias": ((TEXT + "\nextra: &x [1, *x]\n").encode(), None, "invalid at extra.1: a recursive alias"),
    "config= empty": (None, "", "doit argument config=: empty"),
    "config= a directory": (None, "kernels", "doit argument config=kernels: "),
    "config= missing": (None, "nope.yaml", "nope.yaml: configuration file not found"),
    "config= under a file": (None, "pipeline.yaml/x.yaml", "cannot be read (Not a directory)"),
    "config= a symlink loop": (None, "loop.yaml", "cannot be read (Too many levels of symbolic links)"),
    "config= a dangling symlink": (None, "dangling.yaml", "configuration file not found"),
}


def _prepare(root, cid):
    content, argument, fragment = FILES[cid]
    if content is not None:
        (root / "bad.yaml").write_bytes(content)
        argument = "bad.yaml"
    if argument == "loop.yaml":
        os.symlink("loop.yaml", root / "loop.yaml")
    if argument == "dangling.yaml":
        os.symlink("nowhere.yaml", root / "dangling.yaml")
    return argument, fragment


@pytest.mark.parametrize("cid", sorted(FILES))
def test_bad_file_is_refused_at_load(tmp_path, cid):
    (tmp_path / "pipeline.yaml").write_text(TEXT)
    (tmp_path / "kernels").mkdir()
    argument, fragment = _prepare(tmp_path, cid)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(config.ConfigError) as info:
        config.from_command_line({"config": argument}, root=tmp_path)
    message = str(info.value)
    assert fragment in message, message
    # the path is the argument's fault; the contents are the file's
    blamed = f"doit argument config={argument}: " if FILES[cid][0] is None else f"{tmp_path / argument}: "
    assert message.startswith(blamed), message
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_command_line_version_is_reported_as_an_argument(tmp_path):
    (tmp_path / "pipeline.yaml").write_text(TEXT)
    for bad in BAD_VERSIONS:
        with pytest.raises(config.ConfigError) as info:
            config.from_command_line({"version": bad}, root=tmp_path)
        message = str(info.value)
        assert message.startswith("doit argument version=") and ": is not a version" in message, message
        assert "pipeline.yaml" not in message
    assert config.from_command_line({"version": "1.2.0-rc.1"}, root=tmp_path).version == "1.2.0-rc.1"


def test_version_from_the_command_line_is_named_when_it_clashes(tmp_path):
    data = copy.deepcopy(BASE)
    data["cuda"]["baseline"] = {"version": "2.0.0"}
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(
        config.ConfigError, match=r"invalid at cuda.baseline.version: .*\(2\.0\.0, from doit argument version=2\.0\.0\)"
    ):
        config.from_command_line({"version": "2.0.0"}, root=tmp_path)


# -- real doit runs: exit code, one message, no traceback, nothing written ---------------------
@pytest.fixture(scope="module")
def project(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("cfgerr"))
    os.symlink("loop.yaml", project.path / "loop.yaml")
    os.symlink("nowhere.yaml", project.path / "dangling.yaml")
    return project


def _untracked(project: Project) -> set[str]:
    out = project.git("status", "--porcelain", "--ignored", "--untracked-files=all")
    return {line[3:] for line in out.splitlines() if "__pycache__" not in line}


def _doit_fails(project: Project, *args: str) -> str:
    shutil.rmtree(project.artifacts, ignore_errors=True)
    before = _untracked(project)
    run = project.doit(*args, "list")
    assert run.returncode == 3, run.stdout  # a configuration or command-line error: doit's user-error status
    assert "Traceback" not in run.stderr + run.stdout, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 3 and lines[0].startswith("laya-build: ConfigError: "), run.stderr
    assert lines[1].startswith("  hint: ") and lines[2] == "  see: docs/reference/errors.md#config-error", run.stderr
    assert not project.artifacts.exists(), "a bad config must write nothing"
    assert _untracked(project) == before
    return lines[0]


FIRST_OF_EACH_CLASS = sorted({cid.split(":")[0]: cid for cid in sorted(CASES, reverse=True)}.values())


@pytest.mark.parametrize(
    "cid",
    FIRST_OF_EACH_CLASS + ["kernel:rope.Dh:0", "kernel:rope.Dh:-1", "kernel:rope.Dh:missing", "version:block scalar |"],
)
def test_doit_list_refuses_a_bad_config(project, cid):
    mutation, key, fragment = CASES[cid]
    text = mutation if isinstance(mutation, str) else _dump(_mutated(mutation))
    (project.path / "pipeline.yaml").write_text(text)
    try:
        message = _doit_fails(project)
    finally:
        project.git("checkout", "--", "pipeline.yaml")
    assert f"pipeline.yaml: invalid at {key}" in message and fragment in message


@pytest.mark.parametrize(
    "cid", ["latin-1 byte", "config= empty", "config= a directory", "config= missing", "config= a symlink loop"]
)
def test_doit_list_refuses_a_bad_file(project, cid):
    content, argument, fragment = FILES[cid]
    if content is not None:
        (project.path / "bad.yaml").write_bytes(content)
        argument = "bad.yaml"
    try:
        message = _doit_fails(project, f"config={argument}")
    finally:
        (project.path / "bad.yaml").unlink(missing_ok=True)
    blamed = f"doit argument config={argument}: " if content is None else f"{project.path / argument}: "
    assert message.startswith(f"laya-build: ConfigError: {blamed}") and fragment in message, message


@pytest.mark.parametrize("bad", ["1.0.0\n", "1.0.0 ", "1..2", "1.0.0\t"])
def test_doit_list_reports_a_bad_version_argument_as_an_argument(project, bad):
    message = _doit_fails(project, f"version={bad}")
    assert message.startswith(
        f"laya-build: ConfigError: doit argument version={bad!r}: is not a version"
    ) or message.startswith(f"laya-build: ConfigError: doit argument version={bad}: is not a version"), message
    assert "pipeline.yaml" not in message
