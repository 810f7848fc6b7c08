"""The kernel registry: one entry per factory, parameters read from the factories' own source,
and the argument rules the factories themselves enforce (so laya_build.config runs them at
load without TileLang)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import kernels
from kernels.probe import PROBE_CASES
from kernels.registry import KERNELS, REQUIRED, STAGE_PARAMS, RegistryError, _signature, check_args, jit_factories
from laya_build.stages.lower_c import HARNESS
from tests.conftest import ROOT


def test_every_jit_factory_is_registered_with_its_module():
    assert {name: k.module for name, k in KERNELS.items()} == jit_factories()


def test_the_places_keyed_by_factory_agree_with_the_registry():
    assert set(HARNESS) == set(KERNELS)
    assert {case.factory_name for case in PROBE_CASES.values()} == set(KERNELS)
    assert set(KERNELS) <= set(kernels.__all__)  # kernels/__init__'s lazy exports come from the registry


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_parameters_and_defaults_are_the_factorys_own(name):
    """What the registry reads from the source is the signature Python (and TileLang) see."""
    signature = getattr(kernels, name).signature
    read = [(p.name, None if p.default is REQUIRED else p.default, p.keyword_only) for p in KERNELS[name].params]
    real = [
        (p.name, None if p.default is inspect.Parameter.empty else p.default, p.kind == p.KEYWORD_ONLY)
        for p in signature.parameters.values()
    ]
    assert read == real
    assert [p.name for p in KERNELS[name].params if p.required] == [
        p.name for p in signature.parameters.values() if p.default is inspect.Parameter.empty
    ]


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_bind_fills_the_defaults_as_python_does(name):
    kernel, signature = KERNELS[name], getattr(kernels, name).signature
    case = next(c for c in PROBE_CASES.values() if c.factory_name == name)
    args = list(case.args)
    kwargs = dict(case.kwargs)
    for stage in ({"cpu": False}, {"cpu": True, "dtype": "float32"}):
        expected = signature.bind(*args, **kwargs, **stage)
        expected.apply_defaults()
        assert kernel.bind(args, kwargs, **stage) == dict(expected.arguments)


def _canonical(name):
    case = next(c for c in PROBE_CASES.values() if c.factory_name == name)
    return KERNELS[name].bind(case.args, case.kwargs, dtype="bfloat16", cpu=False)


BAD_SIZES = [
    (name, p.name, bad)
    for name, k in sorted(KERNELS.items())
    for p in k.config_params
    if type(_canonical(name)[p.name]) is int
    for bad in ((-1,) if p.name in ("window", "num_stages") else (0, -1))
]


@pytest.mark.parametrize("name, param, bad", BAD_SIZES)
def test_the_factory_enforces_the_registry_rule(name, param, bad):
    """A size the registry refuses, the factory refuses with the same message (one rule)."""
    arguments = {**_canonical(name), param: bad}
    with pytest.raises(ValueError) as by_registry:
        KERNELS[name].check(arguments)
    assert by_registry.value.param == param
    with pytest.raises(ValueError) as by_factory:
        getattr(kernels, name).get_tir(**arguments)
    assert str(by_factory.value) == str(by_registry.value)


def test_check_args_wants_every_parameter():
    arguments = _canonical("rope_kernel")
    arguments.pop("threads")
    with pytest.raises(TypeError, match="rope_kernel must pass all of its parameters"):
        check_args("rope_kernel", **arguments)


def test_bind_refuses_what_python_refuses():
    rope = KERNELS["rope_kernel"]
    with pytest.raises(ValueError, match=r"rope_kernel needs Dh \(required: H, Dh\)") as info:
        rope.bind([4])
    assert info.value.param == "Dh"
    with pytest.raises(ValueError, match=r"'H' is already given in args"):
        rope.bind([4, 32], {"H": 4})
    with pytest.raises(
        ValueError, match=r"rope_kernel takes at most 4 positional arguments \(H, Dh, block_M, threads\)"
    ):
        rope.bind([4, 32, 4, 128, 1])
    with pytest.raises(ValueError, match=r"rope_kernel has no parameter 'heads'"):
        rope.bind([4, 32], {"heads": 4})
    assert set(STAGE_PARAMS) <= {p.name for p in rope.params} - set(rope.positional)


def test_a_default_the_registry_cannot_read_is_a_programming_error(tmp_path):
    (tmp_path / "k.py").write_text("import os\n\ndef k_kernel(N, block=os.cpu_count()):\n    pass\n")
    with pytest.raises(RegistryError, match=r"k.py:k_kernel: default 'os.cpu_count\(\)' is not a static value"):
        _signature(tmp_path / "k.py", "k_kernel")


def test_the_registry_does_not_import_tilelang():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, kernels.registry as r; [k.params for k in r.KERNELS.values()];"
            "from laya_build import config; config.load(); print(' '.join(sys.modules))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert not {"tilelang", "torch", "transformers", "tvm"} & set(out)
