"""Checkpoints written by upstream Laya itself (``laya==0.4.15``, the test-only reference).

:func:`write_upstream_checkpoint` builds upstream's own ``laya.common.DecisionModel`` around a
tiny ModernBERT encoder (``AutoModel.from_config``, offline) and saves it with upstream's
``laya.train.save_checkpoint``: fp16 weights, ``act_costs`` as a mapping, calibrated
temperatures, keys the build only records, and a tokenizer whose special-token ids differ
from the generated model's.  :func:`upstream_agent` is ``laya.load`` on a private copy
(upstream rewrites ``tokenizer/tokenizer_config.json`` of the directory it loads).
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import torch

# [PAD] 0, [UNK] 1, [MASK] 2, [CLS] 3, [SEP] 4: not the generated tokenizer's ids.
UPSTREAM_SPECIALS = ("[PAD]", "[UNK]", "[MASK]", "[CLS]", "[SEP]")
UPSTREAM_CONFIG = {
    "encoder": "tiny-modernbert-upstream-test",
    "act_costs": {"ask": 0.1, "defer": 0.3},
    "max_len": 512,
    "head_max_len": 192,
    "option_layout": "sequential",
    # choice sharpened, 6.0 is clamped to 5.0 by upstream, "score:3-5" overrides score rows with
    # 3..5 options, "noul:2" is not a number (upstream applies 1.0).
    "temperature": [0.7, 1.8, 6.0],
    "temperature_by_options": {"score:3-5": 1.3, "noul:2": "warm"},
    "amp_dtype": "bf16",
    "fine_tuned": True,
    "training": {"laya_train": {"epochs": 1}},
}


def upstream_tokenizer():
    from laya_build.model.tokenizer import train_tokenizer

    tok = train_tokenizer(special_tokens=UPSTREAM_SPECIALS)
    assert (tok.pad_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id) == (0, 3, 4, 2)
    return tok


def write_upstream_checkpoint(path: Path, *, head_layers: int = 0, seed: int = 7, config: dict | None = None) -> Path:
    """A tiny checkpoint written by upstream's ``DecisionModel`` + ``save_checkpoint``, with
    ``rl_agent_config.json`` = ``config`` (default :data:`UPSTREAM_CONFIG`) + ``head_layers``."""
    from laya.common import DecisionModel
    from laya.train import save_checkpoint
    from transformers import AutoModel, ModernBertConfig

    tok = upstream_tokenizer()
    ecfg = ModernBertConfig(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=80,
        max_position_embeddings=512,
        local_attention=32,
        initializer_range=0.4,
        pad_token_id=tok.pad_token_id,
        cls_token_id=tok.cls_token_id,
        sep_token_id=tok.sep_token_id,
        mask_token_id=tok.mask_token_id,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
    )
    cfg = {**(UPSTREAM_CONFIG if config is None else config), "head_layers": head_layers}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        encoder = AutoModel.from_config(ecfg, attn_implementation="sdpa")
        model = DecisionModel(encoder, head_layers=head_layers, n_act=len(cfg.get("act_costs", {})) + 1)
    save_checkpoint(model, tok, cfg, str(path))
    return Path(path)


def upstream_agent(checkpoint: Path, scratch: Path, *, quiet: bool = True):
    """``laya.load`` of a copy of ``checkpoint`` (upstream may rewrite the tokenizer config).
    ``quiet`` silences its RuntimeWarning about the temperatures it clamps."""
    import laya

    copy = shutil.copytree(checkpoint, scratch)
    with warnings.catch_warnings():
        if quiet:
            warnings.filterwarnings("ignore", r"laya: this checkpoint ships invalid temperatures", RuntimeWarning)
        return laya.load(str(copy), device="cpu")


def upstream_forward(model, batch: dict):
    """Upstream's ``DecisionModel.forward`` on a saved batch (its marker mask is boolean)."""
    with torch.inference_mode():
        return model(
            batch["input_ids"],
            batch["attention_mask"],
            batch["marker_pos"],
            batch["marker_mask"].bool(),
            batch["qtype"],
        )
