"""The encoder's rotary as tables (laya_build.model.rotary, export.rotary: table).

The tables must give the computed rotary's outputs bit for bit (fp32 and bf16, on the dtype the
model is exported with), leave no cos or sin in the exported program (so no compiler can
recompute them per element), export with dynamic tokens, and refuse rotary types whose values
depend on the sequence length with what to set instead.
"""

from __future__ import annotations

import pytest
import torch

from laya_build.model import rotary
from laya_build.model.decision import eval_copy
from tests.stages.test_varlen_attention import batch, exported, small_model

pytestmark = pytest.mark.filterwarnings("ignore")


def ops(program) -> set[str]:
    return {str(n.target) for m in program.graph_module.modules() for n in getattr(m, "graph", ()).nodes}


def same_outputs(dtype: torch.dtype, device: str) -> None:
    """The model's outputs with the tables equal the computed rotary's, on ``dtype`` and ``device``."""
    model = eval_copy(small_model(), dtype, device)
    for lengths, width in (((48, 30, 17), 48), ((32, 9), 32)):
        args = [a.to(device) for a in batch(lengths, width)]
        with torch.no_grad():
            computed = model(*args)
            rotary.use(model, "table")
            tabulated = model(*args)
            rotary.use(model, "table")  # a second call leaves the tables as they are
        assert isinstance(model.encoder.rotary_emb, rotary.RotaryTable)
        for c, t in zip(computed, tabulated):
            assert torch.equal(c, t)
        model = eval_copy(small_model(), dtype, device)
    tables = dict(rotary.RotaryTable(model.encoder.rotary_emb, 256, dtype, torch.device(device)).named_buffers())
    assert sorted(tables) == [
        "full_attention_cos",
        "full_attention_sin",
        "sliding_attention_cos",
        "sliding_attention_sin",
    ]
    assert {tuple(t.shape) for t in tables.values()} == {(256, 16)}  # positions x head dim
    assert {t.dtype for t in tables.values()} == {dtype}
    # the local and the global layers rotate with their own frequencies
    assert not torch.equal(tables["full_attention_cos"], tables["sliding_attention_cos"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_tables_give_the_computed_outputs_bit_for_bit(dtype):
    same_outputs(dtype, "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_tables_give_the_computed_outputs_bit_for_bit():
    for dtype in (torch.float32, torch.bfloat16):
        same_outputs(dtype, "cuda")


def test_the_exported_program_reads_the_tables_instead_of_computing_them():
    computed, tabulated = small_model(), small_model()
    rotary.use(tabulated, "table")
    trig = {"aten.cos.default", "aten.sin.default"}
    assert trig <= ops(exported(computed))
    program = exported(tabulated)
    assert not trig & ops(program)
    other = batch((32, 9), width=32)  # another row count and width than the traced example
    with torch.inference_mode():
        for e, g in zip(small_model()(*other), program.module()(*other)):
            torch.testing.assert_close(g, e, atol=1e-6, rtol=1e-6)


def test_a_rope_type_that_depends_on_the_length_is_refused_with_what_to_set():
    model = small_model()
    model.encoder.rotary_emb.rope_type = {"full_attention": "default", "sliding_attention": "dynamic"}
    with pytest.raises(
        ValueError, match=r"rope type dynamic depends on the sequence length.*set export.rotary: computed"
    ):
        rotary.use(model, "table")
    rotary.use(model, "computed")  # the computed rotary takes any type
    assert not isinstance(model.encoder.rotary_emb, rotary.RotaryTable)
    with pytest.raises(ValueError, match="'cached' is not one of table, computed"):
        rotary.use(model, "cached")
