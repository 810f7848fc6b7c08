"""Session fixtures of the stage tests (see ``stage_build``)."""

from __future__ import annotations

import pytest
from stage_build import FAST_TIMING, Build, make_build


@pytest.fixture(scope="session")
def build(tmp_path_factory) -> Build:
    return make_build(tmp_path_factory.mktemp("build"))


@pytest.fixture
def verify_cfg():
    return {"timing": dict(FAST_TIMING)}
