"""Stage ``model``: the checkpoint (generated from a seed, or a local one) and the saved inputs.

``out_dir/checkpoint/`` receives the Laya checkpoint layout, ``out_dir/inputs.pt`` the
tokenised decision batches, ``out_dir/model.json`` the record.  The checkpoint is loaded back
strictly before anything is recorded, so a checkpoint that does not fit the model fails here.
"""
from __future__ import annotations

import time
from pathlib import Path

from ..records import file_entry
from ._model_common import finish, section, versions

CHECKPOINT_DIRNAME = "checkpoint"
INPUTS_NAME = "inputs.pt"


def run_model(model_cfg: dict, out_dir) -> dict:
    from ..model.checkpoint import DEFAULT_ATTN, WEIGHTS, install_checkpoint, load_checkpoint
    from ..model.inputs import batch_shape, build_inputs, save_inputs

    start = time.perf_counter()
    cfg = section("model", model_cfg)
    out = Path(out_dir)
    ckpt = install_checkpoint(cfg["path"], cfg["generate"], out / CHECKPOINT_DIRNAME)
    model, tokenizer, agent = load_checkpoint(ckpt)
    inputs = build_inputs(tokenizer, cfg["inputs"])
    save_inputs(inputs, out / INPUTS_NAME)
    enc = model.encoder.config

    def shapes(key):
        return [{**batch_shape(b), "decisions": b["decisions"], "valid_tokens": b["valid_tokens"],
                 "options": b["options"]} for b in inputs[key]]

    files = [file_entry(p, out) for p in sorted(ckpt.rglob("*")) if p.is_file()]
    weights_sha256 = next(f["sha256"] for f in files if f["path"] == f"{CHECKPOINT_DIRNAME}/{WEIGHTS}")
    return finish(out, {
        "stage": "model",
        "status": "ok",
        "source": "local" if cfg["path"] else "generated",
        "config": cfg,
        "checkpoint": {"dir": CHECKPOINT_DIRNAME, "files": files, "weights_sha256": weights_sha256},
        "architecture": {
            "encoder": agent["encoder"], "hidden_size": enc.hidden_size,
            "num_hidden_layers": enc.num_hidden_layers,
            "num_attention_heads": enc.num_attention_heads, "vocab_size": enc.vocab_size,
            "head_layers": agent["head_layers"], "n_act": len(agent["act_costs"]) + 1,
            "attn_implementation": DEFAULT_ATTN,
            "parameters": sum(p.numel() for p in model.parameters()),
        },
        "inputs": {**file_entry(out / INPUTS_NAME, out), "rows": sum(len(b["decisions"])
                   for b in inputs["batches"]), "batches": shapes("batches"),
                   "single_slot_batches": shapes("single_slot_batches")},
        "versions": versions(),
        "elapsed_s": round(time.perf_counter() - start, 4),
    })
