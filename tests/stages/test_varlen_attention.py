"""The encoder's attention without masks (laya_build.model.attention, export.attention: varlen).

On the CPU the varlen attention builds its mask from the rows' segments (real positions, then
padding) and the window and calls SDPA: the reference the CUDA path (FlashAttention's
variable-length entry) is compared with on a GPU, itself checked here against the plain padding
and window mask on every real position.  It must give the model's sdpa outputs bit for bit, with
right padding of several lengths and local layers whose window is narrower than the sequence, and
export with the dynamic rows and tokens of the pipeline.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import ModernBertConfig

from laya_build import PROJECT_ROOT
from laya_build.model import attention
from laya_build.model.decision import DecisionModel

pytestmark = pytest.mark.filterwarnings("ignore")


def small_model(attn: str = "sdpa", **sizes) -> DecisionModel:
    """Four encoder layers of 64 (4 heads), one head layer; ``sizes``: other config values."""
    torch.manual_seed(0)
    config = ModernBertConfig(
        **{
            "vocab_size": 300,
            "hidden_size": 64,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "intermediate_size": 96,
            "local_attention": 16,  # a ±8 window on the local layers, narrower than the 48 tokens
            "global_attn_every_n_layers": 3,
            "max_position_embeddings": 256,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "cls_token_id": 1,
            "sep_token_id": 2,
            "attn_implementation": attn,
            **sizes,
        }
    )
    return DecisionModel(config, head_layers=1, n_act=2).eval()


def batch(lengths=(48, 30, 17), width=48):
    rows = len(lengths)
    ids = torch.randint(3, 300, (rows, width))
    mask = torch.zeros(rows, width, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    markers = torch.tensor([[1, 2]] * rows)
    return ids, mask, markers, torch.ones(rows, 2, dtype=torch.long), torch.arange(rows) % 3


def test_varlen_gives_the_sdpa_outputs_bit_for_bit(monkeypatch):
    model = small_model()
    args = batch()
    with torch.no_grad():
        expected = model(*args)
        attention.use(model, "varlen")
        counts, made = [], []
        real, lengths = attention._reference, attention.key_lengths
        monkeypatch.setattr(attention, "_reference", lambda *a: (counts.append(a[3].tolist()), real(*a))[1])
        monkeypatch.setattr(attention, "key_lengths", lambda *a: (made.append(1), lengths(*a))[1])
        got = model(*args)
    assert model.encoder.config._attn_implementation == attention.NAME
    assert counts == [[48, 30, 17]] * 4  # every layer ran it, with the rows' key counts
    assert len(made) == 2  # once a forward for each of the encoder's two masks (global, local), not once a layer
    assert attention.key_counts(args[1]).tolist() == [0, 48, 48, 78, 96, 113, 144]
    for e, g in zip(expected, got):
        assert torch.equal(e, g)


def exported(model):
    from torch.export import Dim

    rows, tokens = Dim("rows", min=1, max=4), 16 * Dim("tokens16", min=2, max=8)
    shapes = {
        "input_ids": {0: rows, 1: tokens},
        "attention_mask": {0: rows, 1: tokens},
        "marker_pos": {0: rows},
        "marker_mask": {0: rows},
        "qtype": {0: rows},
    }
    with torch.inference_mode():
        return torch.export.export(model, batch(), dynamic_shapes=shapes)


def calls(ep) -> set[str]:
    return {str(n.target) for m in ep.graph_module.modules() for n in getattr(m, "graph", ()).nodes}


def test_varlen_exports_with_dynamic_rows_and_tokens():
    model = small_model()
    attention.use(model, "varlen")
    program = exported(model)
    other = batch((32, 9), width=32)  # another row count and width than the traced example
    with torch.inference_mode():
        for e, g in zip(small_model()(*other), program.module()(*other)):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


@pytest.mark.build(seconds=300)  # an AOTInductor compile of the small model on the CPU for each
@pytest.mark.parametrize(
    "implementation, op", [("varlen", "laya.varlen_attention.default"), ("fused", "laya.rotary_attention.default")]
)
def test_the_package_child_compiles_the_saved_op_into_a_package_that_needs_no_laya_build(tmp_path, implementation, op):
    """torch.export saves the attention as one op of laya-build's (``varlen``: FlashAttention's
    own has an output type that not every torch can save; ``fused``: a Triton kernel); the package
    child has Inductor compile it as the ops it runs, so the package loads and answers in a
    process that has never heard of laya-build."""
    model = small_model()
    attention.use(model, implementation)
    torch.export.save(exported(model), tmp_path / "exported.pt2")
    assert op in calls(torch.export.load(tmp_path / "exported.pt2"))
    compile_code = textwrap.dedent(
        f"""
        from laya_build.stages.children.package import compile_program
        program = {{"name": "decision", "exported": {str(tmp_path / "exported.pt2")!r},
                   "package_tmp": {str(tmp_path / "decision.pt2")!r}}}
        compile_program(program, {{"inductor_configs": {{"aot_inductor.check_lowerbound": False}}}})
        """
    )
    run = subprocess.run([sys.executable, "-c", compile_code], cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    other = batch((32, 9), width=32)
    torch.save(other, tmp_path / "args.pt")
    load_code = textwrap.dedent(
        f"""
        import sys, torch
        package = torch._inductor.aoti_load_package({str(tmp_path / "decision.pt2")!r})
        with torch.inference_mode():
            torch.save(package(*torch.load({str(tmp_path / "args.pt")!r})), {str(tmp_path / "out.pt")!r})
        assert not any(m.startswith("laya_build") for m in sys.modules), "laya_build was imported"
        """
    )
    run = subprocess.run([sys.executable, "-c", load_code], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    with torch.inference_mode():
        for e, g in zip(small_model()(*other), torch.load(tmp_path / "out.pt")):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 5])
def test_the_reference_is_the_padding_and_window_mask_on_every_real_position(window):
    """What the model sees: a real position attends to its row's real positions within the
    window, exactly as with the padding and band masks; padded positions only to each other."""
    torch.manual_seed(0)
    B, H, S, D = 4, 2, 24, 8
    q, k, v = (torch.randn(B, H, S, D, dtype=torch.float64) for _ in range(3))
    counts = torch.tensor([24, 13, 1, 0], dtype=torch.int32)
    lengths = attention.key_lengths(counts, S)
    assert lengths.tolist() == [0, 24, 24, 37, 48, 49, 72, 72, 96]
    assert attention.row_counts(lengths).tolist() == counts.tolist()
    got, _ = attention.varlen_attention(None, q, k, v, lengths, sliding_window=window and window + 1)
    pos = torch.arange(S)
    band = (pos[:, None] - pos[None, :]).abs() <= (window if window is not None else S)
    for row, n in enumerate(counts.tolist()):
        if n:  # the real positions, against the masks the varlen path replaces
            mask = band[:n, :n]
            want = torch.nn.functional.scaled_dot_product_attention(
                q[row, :, :n], k[row, :, :n], v[row, :, :n], attn_mask=mask
            )
            assert torch.allclose(got[row, :n], want.transpose(0, 1), atol=1e-12)
        if n < S:  # the padding: its own keys only
            p = slice(n, S)
            mask = band[p, p]
            want = torch.nn.functional.scaled_dot_product_attention(
                q[row, :, p], k[row, :, p], v[row, :, p], attn_mask=mask
            )
            assert torch.allclose(got[row, p], want.transpose(0, 1), atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_gives_the_sdpa_outputs_bit_for_bit_with_masks_made_once_a_forward(dtype):
    """``bias``: SDPA given additive masks of the model's dtype, one per mask kind (global, local)
    made once a forward and read by every layer of its kind, where ``sdpa`` hands each layer a
    boolean mask that torch converts inside the call."""
    from laya_build.model.decision import eval_copy

    model = eval_copy(small_model(), dtype)
    args = batch()
    with torch.no_grad():
        expected = model(*args)
        attention.use(model, "bias")
        got = model(*args)
    assert model.encoder.config._attn_implementation == attention.BIAS_NAME
    for e, g in zip(expected, got):
        assert torch.equal(e, g)
    program = exported(model)
    masks = [
        n.args[3]
        for n in program.graph.nodes
        if n.target is torch.ops.aten.scaled_dot_product_attention.default and len(n.args) > 3
    ]
    encoder = [m for m in masks if m.meta["val"].dim() == 4 and m.meta["val"].shape[2] != 1]
    assert len(encoder) == 4  # one a layer
    assert len({m.name for m in encoder}) == 2  # two tensors: the global layers' and the local ones'
    assert {m.meta["val"].dtype for m in encoder} == {dtype}


def test_sdpa_leaves_the_model_as_it_is_and_other_names_are_refused():
    model = small_model()
    attention.use(model, "sdpa")
    assert model.encoder.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="'flash' is not one of sdpa, bias, varlen"):
        attention.use(model, "flash")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlashAttention's entry needs a CUDA GPU")
def test_the_cuda_path_agrees_with_the_reference():
    torch.manual_seed(0)
    B, H, S, D = 4, 16, 128, 64
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    counts = torch.tensor([128, 77, 16, 0], device="cuda", dtype=torch.int32)  # full, padded, an empty row
    for window in (None, 65):  # a global layer, a local one (transformers' half-window + 1)
        lengths = attention.key_lengths(counts, S)
        got, _ = attention.varlen_attention(None, q, k, v, lengths, scaling=D**-0.5, sliding_window=window)
        ref = attention._reference(q.float(), k.float(), v.float(), counts, D**-0.5, window and window - 1)
        assert (got.float() - ref).abs().max().item() < 2e-2
