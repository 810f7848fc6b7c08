"""Stage ``model``: the checkpoint (generated from a seed, or a local one) and the saved inputs.

``out_dir/checkpoint/`` receives the Laya checkpoint layout (upstream ``laya`` 0.4.15's,
:mod:`laya_build.model.checkpoint`), ``out_dir/inputs.pt`` the decision batches tokenised as
upstream does, ``out_dir/model.json`` the record: the architecture, the checkpoint's config
(values used, keys recorded as not changing the computation) and its calibration (raw, as
applied, and the probability rule verify and latency use).  The checkpoint is loaded
strictly before it is installed, so a checkpoint that does not fit the model fails here and
leaves nothing behind.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from laya_build.environment import versions
from laya_build.records import file_entry

CHECKPOINT_DIRNAME = "checkpoint"
INPUTS_NAME = "inputs.pt"


def run_model(model_cfg: dict, out_dir) -> dict:
    from laya_build.model.checkpoint import DEFAULT_ATTN, UPSTREAM_LAYA, WEIGHTS, install_checkpoint
    from laya_build.model.inputs import batch_shape, build_inputs, save_inputs
    from laya_build.runtime.parity import PROBABILITY_RULE, PROBABILITY_RULE_SOURCE

    start = time.perf_counter()
    cfg = model_cfg
    out = Path(out_dir)
    ckpt, (model, tokenizer, agent) = install_checkpoint(cfg["path"], cfg["generate"], out / CHECKPOINT_DIRNAME)
    inputs = build_inputs(tokenizer, cfg["inputs"], agent)
    save_inputs(inputs, out / INPUTS_NAME)
    enc = model.encoder.config

    def shapes(key):
        return [
            {**batch_shape(b), "decisions": b["decisions"], "valid_tokens": b["valid_tokens"], "options": b["options"]}
            for b in inputs[key]
        ]

    files = [file_entry(p, out) for p in sorted(ckpt.rglob("*")) if p.is_file()]
    weights_sha256 = next(f["sha256"] for f in files if f["path"] == f"{CHECKPOINT_DIRNAME}/{WEIGHTS}")
    return {
        "stage": "model",
        "status": "ok",
        "source": "local" if cfg["path"] else "generated",
        "config": cfg,
        "checkpoint": {
            "dir": CHECKPOINT_DIRNAME,
            "files": files,
            "weights_sha256": weights_sha256,
            "format": f"laya {UPSTREAM_LAYA}",
            "weights_dtypes": agent["weights_dtypes"],
        },
        "architecture": {
            "encoder": agent["encoder"],
            "model_type": agent["model_type"],
            "hidden_size": enc.hidden_size,
            "num_hidden_layers": enc.num_hidden_layers,
            "num_attention_heads": enc.num_attention_heads,
            "vocab_size": enc.vocab_size,
            "head_layers": agent["head_layers"],
            "n_act": agent["n_act"],
            "attn_implementation": DEFAULT_ATTN,
            "parameters": sum(p.numel() for p in model.parameters()),
        },
        "agent_config": {
            "act_costs": agent["act_costs"],
            "max_len": agent["max_len"],
            "head_max_len": agent["head_max_len"],
            "option_layout": agent["option_layout"],
            "recorded_keys": agent["recorded_keys"],
        },
        "calibration": {
            **agent["calibration"],
            "weights_temperature": [v if math.isfinite(v := float(t)) else None for t in model.temperature],
            "rule": PROBABILITY_RULE,
            "upstream": PROBABILITY_RULE_SOURCE,
        },
        "tokenizer": {"class": type(tokenizer).__name__, "size": len(tokenizer), "special_ids": inputs["special_ids"]},
        "inputs": {
            **file_entry(out / INPUTS_NAME, out),
            "rows": sum(len(b["decisions"]) for b in inputs["batches"]),
            "sequence": inputs["sequence"],
            "batches": shapes("batches"),
            "single_slot_batches": shapes("single_slot_batches"),
        },
        "versions": versions(),
        "elapsed_s": round(time.perf_counter() - start, 4),
    }
