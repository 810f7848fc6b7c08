"""A project with ``export.add_norms``: exported, packaged and verified through doit.

The generated model's layer norms of residual adds (each encoder layer's mlp_norm, every layer's
attn_norm but the first, which is none, the final norm, and the decision head's) become
``laya::add_norm`` calls in the exported program, each behind a ``torch.cond`` on its size (the
CPU export's setting is a least number of positions, between the verify batches' sizes: 32, 128
and 2,048 positions), so that verify runs both branches; the CPU package built from it passes
verify in a fresh process against the eager model's outputs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from laya_build.records import read_record
from tests.pipeline.project import ROOT, Project, small_pipeline

pytest.importorskip("laya_build.model.add_norm", reason="Triton does not import here")

ENCODER_LAYERS = 2  # the generated model's (laya_build/model/defaults.yaml)
BUILD = "cpu-float32"
LEAST = 100  # positions: the first verify batch's 32 below, the others' above

COUNTED = """
    import json, sys, torch
    import laya_build.model.add_norm as an
    ep = torch.export.load(sys.argv[1])
    nodes = list(ep.graph.nodes)
    branches = [m for name, m in ep.graph_module.named_modules() if name.startswith("laya_add_norm_")]
    inside = [n for m in branches for n in m.graph.nodes]
    print(json.dumps({
        "conds": [n.args[0].args[1] for n in nodes if n.target is torch.ops.higher_order.cond],
        "calls": sum(n.target is torch.ops.laya.add_norm.default for n in nodes),
        "calls_in_branches": sum(n.target is torch.ops.laya.add_norm.default for n in inside),
        "norms_of_adds_left": sum(an._norm_of_add(n) is not None for n in nodes),
        "norms": sum(n.target is torch.ops.aten.layer_norm.default for n in nodes),
    }))
"""


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("add-norms"))

    def edit(cfg):
        small_pipeline(cfg)
        cfg["export"]["add_norms"] = {"cpu": LEAST, "cuda": True}

    project.edit_config(edit)
    project.commit("layer norms of residual adds through laya::add_norm")
    for task in ("aoti_package", "verify"):
        run = project.doit(task, timeout=1200)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return project


def test_the_export_calls_the_op_for_every_norm_of_an_add_and_records_how_many(verified):
    folder = verified.version_dir() / f"export/{BUILD}"
    export = read_record(folder / "export.json")
    assert export["add_norms"] == LEAST
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(COUNTED), str(folder / "exported.pt2")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # every encoder layer's mlp_norm, the attn_norm of every layer after the first, the final norm:
    # each a cond on its size, the op in one branch
    assert len(got["conds"]) >= 2 * ENCODER_LAYERS and set(got["conds"]) == {LEAST}
    assert got["calls"] == 0 and got["calls_in_branches"] == len(got["conds"])
    assert got["norms_of_adds_left"] == 0
    assert [p["add_norms"] for p in export["programs"]] == [len(got["conds"])]


def test_the_package_of_that_export_passes_verify(verified):
    record = read_record(verified.version_dir() / f"verify/{BUILD}/verify.json")
    assert record["status"] == "ok", record
