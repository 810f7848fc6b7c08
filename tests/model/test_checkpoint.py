"""The Laya checkpoint layout: strict loading, clear errors, byte-reproducible generation."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from laya_build.errors import CheckpointError
from laya_build.model.checkpoint import generate_checkpoint, load_checkpoint
from laya_build.records import read_record, sha256_file
from tests.stage_calls import run_model

PREFIXES = {"encoder", "head", "type_emb", "scorer", "act_head", "temperature"}


def test_generated_checkpoint_loads_strictly(model_dir, checkpoint):
    model, tokenizer, agent = checkpoint
    state = load_file(str(model_dir / "checkpoint" / "model.safetensors"))
    assert {k.split(".")[0] for k in state} == PREFIXES
    assert set(state) == set(model.state_dict())
    assert {t.dtype for t in state.values()} == {torch.float16}  # as upstream's save_checkpoint writes
    # fp16 on disk, fp32 in the model, equal values.
    assert all(torch.equal(state[k].float(), v) for k, v in model.state_dict().items())
    assert next(model.parameters()).dtype == torch.float32
    assert model.temperature.tolist() == [1.0, 1.0, 1.0] and state["temperature"].shape == (3,)
    assert (
        agent["head_layers"] == 2 and agent["n_act"] == len(agent["act_costs"]) + 1 == model.act_head[-1].out_features
    )
    assert agent["calibration"]["applied"] == {
        "temperature": [1.5, 2.0, 1.25],
        "temperature_by_options": {"choice:3-5": 0.8},
    }
    assert model.encoder.config.vocab_size == len(tokenizer)
    assert model.encoder.config.pad_token_id == tokenizer.pad_token_id
    assert model.encoder.config.mask_token_id == tokenizer.mask_token_id
    assert tokenizer.convert_ids_to_tokens(list(range(5))) == ["[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]"]
    head_layer = model.head.layers[0]
    assert head_layer.norm_first and head_layer.self_attn.batch_first
    assert head_layer.self_attn.num_heads == max(1, model.encoder.config.hidden_size // 64)


def test_generation_is_byte_reproducible(tmp_path, generate_spec):
    a, b = generate_checkpoint(tmp_path / "a", generate_spec), generate_checkpoint(tmp_path / "b", generate_spec)
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert {"model.safetensors", "rl_agent_config.json", "encoder/config.json", "tokenizer/tokenizer.json"} <= {
        f.as_posix() for f in files
    }
    assert sha256_file(a / "model.safetensors") == sha256_file(b / "model.safetensors")
    for f in files:
        assert sha256_file(a / f) == sha256_file(b / f), f


def test_other_seed_gives_other_weights(tmp_path, generate_spec):
    a = generate_checkpoint(tmp_path / "a", generate_spec)
    b = generate_checkpoint(tmp_path / "b", {**generate_spec, "seed": generate_spec["seed"] + 1})
    assert sha256_file(a / "model.safetensors") != sha256_file(b / "model.safetensors")


def test_missing_file_is_named(tmp_path, model_dir):
    ckpt = shutil.copytree(model_dir / "checkpoint", tmp_path / "ckpt")
    (ckpt / "encoder" / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"ckpt is incomplete: missing encoder/config.json"):
        load_checkpoint(ckpt)


def test_key_mismatch_names_path_and_keys(tmp_path, model_dir):
    ckpt = shutil.copytree(model_dir / "checkpoint", tmp_path / "ckpt")
    state = load_file(str(ckpt / "model.safetensors"))
    state["scorer.9.weight"] = state.pop("scorer.1.weight")
    save_file(state, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(ckpt)
    message = str(err.value)
    assert str(ckpt / "model.safetensors") in message
    assert "missing keys ['scorer.1.weight']" in message and "unexpected keys ['scorer.9.weight']" in message


def test_shape_mismatch_is_a_checkpoint_error(tmp_path, model_dir):
    ckpt = shutil.copytree(model_dir / "checkpoint", tmp_path / "ckpt")
    agent = json.loads((ckpt / "rl_agent_config.json").read_text())
    agent["act_costs"]["refund"] = 1.0  # n_act + 1: act_head's last layer no longer fits
    (ckpt / "rl_agent_config.json").write_text(json.dumps(agent))
    with pytest.raises(
        CheckpointError,
        match=r"shape mismatches: act_head\.2\.bias: file \[4\] vs model \[5\]; "
        r"act_head\.2\.weight: file \[4, 256\] vs model \[5, 256\]",
    ):
        load_checkpoint(ckpt)


def test_scalar_temperature_buffer_is_refused(tmp_path, model_dir):
    """The project's earlier checkpoints carried a scalar buffer; upstream's has shape [3]."""
    ckpt = shutil.copytree(model_dir / "checkpoint", tmp_path / "ckpt")
    state = load_file(str(ckpt / "model.safetensors"))
    state["temperature"] = torch.tensor(3.0, dtype=torch.float16)
    save_file(state, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"temperature: file \[\] vs model \[3\]"):
        load_checkpoint(ckpt)


def test_integer_weights_are_refused(tmp_path, model_dir):
    ckpt = shutil.copytree(model_dir / "checkpoint", tmp_path / "ckpt")
    state = load_file(str(ckpt / "model.safetensors"))
    state["type_emb.weight"] = state["type_emb.weight"].to(torch.int16)
    save_file(state, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"not floating point: type_emb\.weight: int16"):
        load_checkpoint(ckpt)


def test_local_path_is_copied_and_recorded(tmp_path, model_dir):
    record = run_model({"path": str(model_dir / "checkpoint")}, tmp_path / "out")
    assert record["source"] == "local"
    assert record == read_record(tmp_path / "out" / "model.json")
    assert record["checkpoint"]["weights_sha256"] == sha256_file(model_dir / "checkpoint" / "model.safetensors")
    assert sha256_file(tmp_path / "out" / "inputs.pt") == sha256_file(model_dir / "inputs.pt")


def test_local_path_must_exist(tmp_path):
    with pytest.raises(CheckpointError, match="is not a directory"):
        run_model({"path": str(tmp_path / "nowhere")}, tmp_path / "out")


def test_generated_model_runs(checkpoint, inputs):
    model = checkpoint[0]
    batch = inputs["batches"][2]
    with torch.inference_mode():
        decision, act = model(*(batch[k] for k in inputs["arg_names"]))
    assert decision.shape == batch["marker_pos"].shape and decision.dtype == torch.float32
    assert torch.all(decision[batch["marker_mask"] == 0] == -1e4)
    assert torch.all(decision[batch["marker_mask"] == 1] > -1e3)
    assert act.shape == (4, 4)


@pytest.mark.parametrize(
    "name, data, message",
    [
        ("model.safetensors", b"not safetensors", r"model\.safetensors: not a readable safetensors file"),
        ("rl_agent_config.json", b"{not json", r"rl_agent_config\.json: not valid JSON"),
        ("rl_agent_config.json", b"[1, 2]", r"rl_agent_config\.json: must be a JSON object, got list"),
        ("encoder/config.json", b"\xff\xfe", r"encoder/config\.json: not valid JSON"),
    ],
)
def test_unreadable_files_are_named(tmp_path, model_dir, name, data, message):
    ckpt = shutil.copytree(model_dir / "checkpoint", tmp_path / "ckpt")
    (ckpt / name).write_bytes(data)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(ckpt)
