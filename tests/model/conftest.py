"""A tiny generated checkpoint and its saved inputs, built once per session."""

from __future__ import annotations

import pytest

from laya_build.config.sections import section
from tests.stage_calls import run_model


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


@pytest.fixture(scope="session")
def upstream_dir(tmp_path_factory):
    """A checkpoint written by upstream laya's DecisionModel + save_checkpoint (head_layers 0)."""
    from tests.upstream_checkpoint import write_upstream_checkpoint

    return write_upstream_checkpoint(tmp_path_factory.mktemp("upstream") / "checkpoint")


@pytest.fixture(scope="session")
def upstream_model_dir(tmp_path_factory, upstream_dir):
    """The model stage run on the upstream checkpoint through ``model.path``."""
    out = tmp_path_factory.mktemp("upstream_model")
    run_model({"path": str(upstream_dir)}, out)
    return out
