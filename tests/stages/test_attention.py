"""The encoder's attention without masks (laya_build.model.attention, export.attention: varlen).

On the CPU the varlen attention builds its mask from the key counts and the window and calls
SDPA: the reference the CUDA path (FlashAttention's variable-length entry) is compared with on a
GPU.  It must give the model's sdpa outputs bit for bit, with right padding of several lengths
and local layers whose window is narrower than the sequence, and export with the dynamic rows and
tokens of the pipeline.
"""

from __future__ import annotations

import pytest
import torch
from transformers import ModernBertConfig

from laya_build.model import attention
from laya_build.model.decision import DecisionModel

pytestmark = pytest.mark.filterwarnings("ignore")


def small_model(attn: str = "sdpa") -> DecisionModel:
    torch.manual_seed(0)
    config = ModernBertConfig(
        vocab_size=300,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=96,
        local_attention=16,  # a ±8 window on the local layers, narrower than the 48 tokens
        global_attn_every_n_layers=3,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        attn_implementation=attn,
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
        counts = []
        real = attention._reference
        monkeypatch.setattr(attention, "_reference", lambda *a: (counts.append(a[3].tolist()), real(*a))[1])
        got = model(*args)
    assert model.encoder.config._attn_implementation == attention.NAME
    assert counts == [[48, 30, 17]] * 4  # every layer ran it, with the rows' key counts
    for e, g in zip(expected, got):
        assert torch.equal(e, g)


def test_varlen_exports_with_dynamic_rows_and_tokens():
    from torch.export import Dim

    model = small_model()
    attention.use(model, "varlen")
    args = batch()
    rows, tokens = Dim("rows", min=1, max=4), 16 * Dim("tokens16", min=2, max=8)
    shapes = {
        "input_ids": {0: rows, 1: tokens},
        "attention_mask": {0: rows, 1: tokens},
        "marker_pos": {0: rows},
        "marker_mask": {0: rows},
        "qtype": {0: rows},
    }
    with torch.inference_mode():
        program = torch.export.export(model, args, dynamic_shapes=shapes)
        other = batch((32, 9), width=32)  # another row count and width than the traced example
        reference = small_model()  # sdpa, eager
        for e, g in zip(reference(*other), program.module()(*other)):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def test_sdpa_leaves_the_model_as_it_is_and_other_names_are_refused():
    model = small_model()
    attention.use(model, "sdpa")
    assert model.encoder.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="'flash' is not one of sdpa, varlen"):
        attention.use(model, "flash")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlashAttention's entry needs a CUDA GPU")
def test_the_cuda_path_agrees_with_the_reference():
    torch.manual_seed(0)
    B, H, S, D = 3, 16, 128, 64
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    counts = torch.tensor([128, 77, 16], device="cuda", dtype=torch.int32)
    for window in (None, 65):  # a global layer, a local one (transformers' half-window + 1)
        got, _ = attention.varlen_attention(None, q, k, v, counts, scaling=D**-0.5, sliding_window=window)
        ref = attention._reference(q.float(), k.float(), v.float(), counts, D**-0.5, window and window - 1)
        assert (got.float() - ref).abs().max().item() < 2e-2
