"""A tiny generated checkpoint and its saved inputs, built once per session."""
from __future__ import annotations

import pytest

from laya_build.stages._model_common import section
from laya_build.stages.model import run_model


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("model")
    run_model({}, out)
    return out


@pytest.fixture(scope="session")
def checkpoint(model_dir):
    from laya_build.model.checkpoint import load_checkpoint

    return load_checkpoint(model_dir / "checkpoint")


@pytest.fixture(scope="session")
def inputs(model_dir):
    from laya_build.model.inputs import load_inputs

    return load_inputs(model_dir / "inputs.pt")


@pytest.fixture(scope="session")
def generate_spec():
    return section("model", {})["generate"]
