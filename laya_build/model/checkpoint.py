"""The Laya checkpoint layout: generation from a fixed seed, and strict loading.

A checkpoint directory holds::

    rl_agent_config.json   {"encoder": name, "head_layers": int, "act_costs": [...]}
                           (n_act = len(act_costs) + 1)
    model.safetensors      every DecisionModel parameter and the ``temperature`` buffer
    encoder/config.json    the ModernBertConfig of the encoder
    tokenizer/             a transformers.PreTrainedTokenizerFast

Nothing here touches the network: configs are read from local JSON, the tokenizer from the
local directory with ``local_files_only=True``.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from ..atomic import atomic_path, write_json, write_text
from ..errors import CheckpointError
from .decision import DecisionModel
from .tokenizer import DEFAULT_VOCAB_SIZE, build_tokenizer, special_token_ids

AGENT_CONFIG = "rl_agent_config.json"
WEIGHTS = "model.safetensors"
ENCODER_CONFIG = "encoder/config.json"
TOKENIZER_DIR = "tokenizer"
REQUIRED = (AGENT_CONFIG, WEIGHTS, ENCODER_CONFIG, f"{TOKENIZER_DIR}/tokenizer.json")
DEFAULT_ATTN = "sdpa"


def encoder_config(spec: dict, tokenizer, attn_implementation: str = DEFAULT_ATTN):
    from transformers import ModernBertConfig

    ids = special_token_ids(tokenizer)
    return ModernBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec["hidden_size"],
        num_hidden_layers=spec["num_hidden_layers"],
        num_attention_heads=spec["num_attention_heads"],
        intermediate_size=spec["intermediate_size"],
        max_position_embeddings=spec.get("max_position_embeddings", 512),
        local_attention=spec.get("local_attention", 64),
        initializer_range=spec.get("initializer_range", 0.02),
        pad_token_id=ids["pad_token_id"], cls_token_id=ids["cls_token_id"],
        sep_token_id=ids["sep_token_id"], mask_token_id=ids["mask_token_id"],
        bos_token_id=ids["cls_token_id"], eos_token_id=ids["sep_token_id"],
        attn_implementation=attn_implementation,
    )


def generate_checkpoint(out_dir: str | os.PathLike, spec: dict) -> Path:
    """Write a randomly initialised Laya checkpoint (``model.generate`` slice) to ``out_dir``.

    Byte-reproducible: the tokenizer training is deterministic and every weight comes from
    ``torch.manual_seed(spec["seed"])`` inside a forked RNG (the caller's RNG is untouched).
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out / TOKENIZER_DIR, spec.get("vocab_size", DEFAULT_VOCAB_SIZE))
    config = encoder_config(spec, tokenizer)
    act_costs = [float(c) for c in spec["act_costs"]]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(spec["seed"]))
        model = DecisionModel(config, head_layers=int(spec["head_layers"]),
                              n_act=len(act_costs) + 1,
                              temperature=float(spec.get("temperature", 3.0)))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    # One metadata key only: safetensors writes the metadata map in hash order, so two
    # keys would make the header (and the file's sha256) differ from run to run.
    with atomic_path(out / WEIGHTS) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    write_text(out / ENCODER_CONFIG, config.to_json_string())
    write_json(out / AGENT_CONFIG, {
        "encoder": spec.get("encoder_name", "laya-tiny-modernbert"),
        "head_layers": int(spec["head_layers"]),
        "act_costs": act_costs,
    })
    return out


def read_agent_config(path: Path) -> dict:
    agent = json.loads((path / AGENT_CONFIG).read_text())
    problems = []
    if not isinstance(agent.get("head_layers"), int) or agent["head_layers"] < 1:
        problems.append("head_layers must be a positive integer")
    if not isinstance(agent.get("act_costs"), list) or not agent["act_costs"]:
        problems.append("act_costs must be a non-empty list")
    if problems:
        raise CheckpointError(f"{path / AGENT_CONFIG}: " + "; ".join(problems))
    return agent


def require_complete(path: Path) -> None:
    """Raise :class:`CheckpointError` naming every file of the layout missing under ``path``."""
    missing = [name for name in REQUIRED if not (path / name).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete: missing {', '.join(missing)}")


def load_checkpoint(path: str | os.PathLike, attn_implementation: str = DEFAULT_ATTN):
    """Build ``(model, tokenizer, agent_config)`` from a checkpoint directory, strictly.

    The model is fp32 on CPU in eval mode.  A missing file or any missing/unexpected/
    mis-shaped weight raises :class:`CheckpointError` naming the path and the keys.
    """
    from safetensors.torch import load_file
    from transformers import ModernBertConfig, PreTrainedTokenizerFast

    path = Path(path)
    require_complete(path)
    agent = read_agent_config(path)
    config = ModernBertConfig.from_dict(json.loads((path / ENCODER_CONFIG).read_text()),
                                        attn_implementation=attn_implementation)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path / TOKENIZER_DIR),
                                                        local_files_only=True)
    model = DecisionModel(config, head_layers=agent["head_layers"],
                          n_act=len(agent["act_costs"]) + 1)
    state = load_file(str(path / WEIGHTS))
    expected = set(model.state_dict())
    absent, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if absent or unexpected:
        raise CheckpointError(
            f"{path / WEIGHTS} does not match DecisionModel: missing keys {absent[:10]}"
            f"{' ...' if len(absent) > 10 else ''} ({len(absent)}), unexpected keys "
            f"{unexpected[:10]}{' ...' if len(unexpected) > 10 else ''} ({len(unexpected)})")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:  # shape mismatches
        raise CheckpointError(f"{path / WEIGHTS}: {exc}") from None
    return model.eval(), tokenizer, agent


def install_checkpoint(source: str | os.PathLike | None, spec: dict,
                       target: str | os.PathLike) -> Path:
    """Generate (``source is None``) or copy a checkpoint into ``target``, replacing it whole.

    Work happens in a sibling temp directory that is renamed into place at the end, so an
    interrupted run never leaves a half-written checkpoint under ``target``.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        if source is None:
            generate_checkpoint(tmp, spec)
        else:
            source = Path(source)
            if not source.is_dir():
                raise CheckpointError(f"model.path {source} is not a directory")
            require_complete(source)
            shutil.copytree(source, tmp, dirs_exist_ok=True)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
