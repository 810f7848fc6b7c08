"""Against upstream Laya itself (``laya==0.4.15``, a test-only requirement).

Upstream's own checkpoints load through ``model.path``; the saved token ids are exactly
``laya.common.build_sequence``'s; the published (calibrated) probabilities are exactly what
``laya.load(...).system_one`` answers; ``laya.load`` reads the checkpoint this build
generates; and every config value this build cannot honour is refused by name.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from laya import common as up
from laya.agent import Agent, _fix_tokenizer_config

from laya_build.errors import CheckpointError, ConfigError, UnsupportedCheckpointError
from laya_build.model.checkpoint import KEYS, UNKNOWN_KEY_NOTE, load_checkpoint, read_agent_config
from laya_build.model.inputs import DECISIONS, load_inputs
from laya_build.model.tokenizer import build_sequence, to_internal, upstream_tokenizer_config
from laya_build.records import read_record, sha256_file
from laya_build.runtime.parity import (
    clamp_temperature,
    decision_probabilities,
    temperature_bucket,
    temperature_rejected,
)
from tests.stage_calls import run_model
from tests.upstream_checkpoint import UPSTREAM_CONFIG, upstream_agent, upstream_forward, write_upstream_checkpoint

BUILDS = ("model_dir", "upstream_model_dir")  # the generated checkpoint, an upstream-written one


def files(root):
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in sorted(root.rglob("*")) if p.is_file()}


def saved_rows(inputs):
    for batch in inputs["batches"] + inputs["single_slot_batches"]:
        for row, name in enumerate(batch["decisions"]):
            yield batch, row, name


def test_upstream_checkpoint_loads_through_model_path(upstream_dir, upstream_model_dir, tmp_path):
    record = read_record(upstream_model_dir / "model.json")
    assert record["source"] == "local" and record["checkpoint"]["weights_dtypes"] == ["float16"]
    # Copied as it is: the source is never rewritten (upstream's own loader rewrites the
    # tokenizer config of the directory it loads).
    assert files(upstream_model_dir / "checkpoint") == files(upstream_dir)
    assert (
        json.loads((upstream_dir / "tokenizer" / "tokenizer_config.json").read_text())["tokenizer_class"]
        == "TokenizersBackend"
    )
    assert record["architecture"]["head_layers"] == 0 and record["architecture"]["n_act"] == 3
    assert record["agent_config"]["act_costs"] == UPSTREAM_CONFIG["act_costs"]
    assert record["agent_config"]["recorded_keys"] == {
        "amp_dtype": read_agent_config(upstream_dir)["recorded_keys"]["amp_dtype"],
        "fine_tuned": UNKNOWN_KEY_NOTE,
        "training": UNKNOWN_KEY_NOTE,
    }
    assert record["tokenizer"]["special_ids"] == {
        "pad_token_id": 0,
        "unk_token_id": 1,
        "mask_token_id": 2,
        "cls_token_id": 3,
        "sep_token_id": 4,
    }
    cal = record["calibration"]
    assert cal["temperature"] == [0.7, 1.8, 6.0] and cal["source"] == "rl_agent_config.json"
    assert cal["applied"] == {
        "temperature": [0.7, 1.8, 5.0],
        "temperature_by_options": {"score:3-5": 1.3, "noul:2": 1.0},
    }
    assert cal["replaced"] == ["temperature[2]=6.0 -> 5", "temperature_by_options.noul:2='warm' -> 1"]
    assert cal["upstream"].startswith("laya 0.4.15: laya/agent.py")
    # The temperatures upstream itself applies for this checkpoint, and the entries it names.
    with pytest.warns(RuntimeWarning, match=r"using noul:2='warm' -> 1, temperature\[2\]=6\.0 -> 5\. "):
        agent = upstream_agent(upstream_dir, tmp_path / "copy", quiet=False)
    assert agent.temperature == cal["applied"]["temperature"]
    assert agent.temperature_by_options == cal["applied"]["temperature_by_options"]
    saved = load_inputs(upstream_model_dir / "inputs.pt")["calibration"]
    assert saved == cal["applied"]


def test_weights_equal_upstreams_loaded_model(upstream_dir, upstream_model_dir, tmp_path):
    """fp16 on disk, converted to fp32: the same tensors upstream's loader holds."""
    ours = load_checkpoint(upstream_model_dir / "checkpoint")[0].state_dict()
    theirs = upstream_agent(upstream_dir, tmp_path / "copy").model.state_dict()
    assert ours.keys() == theirs.keys()
    for name, value in ours.items():
        assert value.dtype == torch.float32 and torch.equal(value, theirs[name].float()), name


@pytest.mark.parametrize("build", BUILDS)
def test_saved_token_ids_equal_upstream_build_sequence(build, request, tmp_path):
    out = request.getfixturevalue(build)
    inputs = load_inputs(out / "inputs.pt")
    agent = upstream_agent(out / "checkpoint", tmp_path / "copy")
    tok = agent.tok  # the tokenizer as upstream loads it
    sizes = inputs["sequence"]
    assert sizes == {"max_len": agent.cfg.get("max_len", 512), "head_max_len": agent.cfg.get("head_max_len", 192)}
    assert inputs["special_ids"]["pad_token_id"] == tok.pad_token_id
    for batch, row, name in saved_rows(inputs):
        decision = DECISIONS[name]
        Agent._check_question(name, decision.question)  # a question upstream accepts
        ids, markers = up.build_sequence(
            tok,
            decision.state,
            Agent._to_internal(decision.question),
            sizes["max_len"],
            sizes["head_max_len"],
            truncate_left=isinstance(decision.state, list),
        )
        n, k = len(ids), len(markers)
        assert batch["valid_tokens"][row] == n and batch["options"][row] == k
        assert batch["input_ids"][row, :n].tolist() == ids, name
        assert torch.all(batch["input_ids"][row, n:] == tok.pad_token_id)
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (batch["input_ids"].shape[1] - n)
        assert batch["marker_pos"][row, :k].tolist() == markers
        assert batch["marker_mask"][row].tolist() == [1] * k + [0] * (batch["marker_mask"].shape[1] - k)
        assert int(batch["qtype"][row]) == up.QTYPES[decision.qtype]


LONG = (
    "The customer wrote a long message about the refund of the annual plan, the second charge "
    "on the card, the invoice with the wrong VAT number and the late fee. "
) * 3
QUESTIONS = [
    {
        "type": "choice",
        "instructions": "Which refund option fits best? " + LONG,
        "criteria": {
            "full refund": LONG,
            "partial refund": "pro rata [MASK] within thirty days",
            "account credit": {"amount": 10, "currency": "EUR"},
            "no refund": None,
            "7": "",
        },
    },
    {
        "type": "score",
        "instructions": {"task": "rate the urgency", "scale": [1, 5]},
        "criteria": ["not urgent", "low", "medium [MASK]", {"level": "high"}, LONG],
    },
    {
        "type": "noul",
        "instructions": "The payment arrived on time.",
        "criteria": {"True": "the fee is waived"},
        "labels": {"false": "keep", "true": "waive"},
    },
    {"type": "noul", "instructions": "Refund allowed.", "criteria": None},
    {"type": "choice", "instructions": "Pick one.", "criteria": [f"option {i} " + LONG[:60] for i in range(9)]},
]
STATES = [LONG, {"ticket": LONG, "priority": "high"}, [LONG, "Second turn [MASK] of the conversation.", LONG]]


@pytest.mark.parametrize("max_len, head_max_len", [(512, 192), (160, 48), (64, 40), (40, 24), (24, 12)])
def test_sequence_port_equals_upstream_under_every_budget(checkpoint, max_len, head_max_len):
    """Long options (48-token cap), the per-option cap, the instruction cut, the state clamp
    (a list keeps its end), [MASK] in texts, JSON instructions/criteria/states, noul labels."""
    tok = checkpoint[1]
    for question in QUESTIONS:
        q = Agent._to_internal(question)
        assert to_internal(question) == q
        for state in STATES:
            expected = up.build_sequence(tok, state, q, max_len, head_max_len, truncate_left=isinstance(state, list))
            assert build_sequence(tok, state, to_internal(question), max_len, head_max_len) == tuple(expected)


@pytest.mark.parametrize("build", BUILDS)
def test_probabilities_equal_upstream_answers(build, request, tmp_path):
    """The calibrated probabilities of verify/latency (``aoti.decision_probabilities``
    with the saved calibration) are the ones ``laya.load(...).system_one`` publishes."""
    out = request.getfixturevalue(build)
    inputs = load_inputs(out / "inputs.pt")
    model = load_checkpoint(out / "checkpoint")[0]
    agent = upstream_agent(out / "checkpoint", tmp_path / "copy")
    for batch in inputs["batches"] + inputs["single_slot_batches"]:
        with torch.inference_mode():
            decision, act = model(*(batch[k] for k in inputs["arg_names"]))
        probs = decision_probabilities(decision, batch["qtype"], batch["marker_mask"], inputs["calibration"])
        for row, name in enumerate(batch["decisions"]):
            d = DECISIONS[name]
            answer = agent.system_one(d.state, {"q": d.question})["answers"]["q"]
            k = batch["options"][row]
            published = [answer["noul"]] if d.qtype == "noul" else list(answer["probabilities"].values())
            ours = probs[row, 1:2] if d.qtype == "noul" else probs[row, :k]
            torch.testing.assert_close(ours, torch.tensor(published), atol=6e-5, rtol=0, msg=name)
            assert probs[row, k:].sum() == 0 and math.isclose(float(probs[row].sum()), 1.0, abs_tol=1e-6)
            assert abs(torch.softmax(act[row], -1)[0].item() - answer["action"]["act_probability"]) <= 6e-5


def test_upstream_load_reads_the_generated_checkpoint(model_dir, checkpoint, inputs, tmp_path):
    agent = upstream_agent(model_dir / "checkpoint", tmp_path / "copy")
    assert agent.cfg["act_costs"] == {"clarify": 0.05, "defer": 0.2, "escalate": 0.5}
    assert agent.model.head is not None and len(agent.model.head.layers) == 2
    for batch in inputs["batches"] + inputs["single_slot_batches"]:
        with torch.inference_mode():
            ours = checkpoint[0](*(batch[k] for k in inputs["arg_names"]))
        for mine, theirs in zip(ours, upstream_forward(agent.model, batch)):
            torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)


def test_minimal_upstream_config_takes_upstream_defaults(tmp_path):
    """Only the required keys: act_costs absent (n_act 1), no calibration, default budgets;
    head_layers 1.  Loads here and upstream, with the same forward."""
    ckpt = write_upstream_checkpoint(tmp_path / "ckpt", head_layers=1, config={"encoder": "tiny"})
    model, _, agent = load_checkpoint(ckpt)
    assert (agent["n_act"], agent["act_costs"], agent["max_len"], agent["head_max_len"]) == (1, None, 512, 192)
    assert agent["calibration"]["source"] == "default"
    assert agent["calibration"]["applied"] == {"temperature": [1.0, 1.0, 1.0], "temperature_by_options": {}}
    record = run_model({"path": str(ckpt)}, tmp_path / "out")
    assert record["architecture"]["n_act"] == 1 and record["agent_config"]["act_costs"] is None
    inputs = load_inputs(tmp_path / "out" / "inputs.pt")
    upstream_model = upstream_agent(ckpt, tmp_path / "copy").model
    batch = inputs["batches"][2]
    with torch.inference_mode():
        ours = model(*(batch[k] for k in inputs["arg_names"]))
    for mine, theirs in zip(ours, upstream_forward(upstream_model, batch)):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------- refusals


def edit_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def setter(key, value):
    return lambda d: d.__setitem__(key, value)


def dropper(key):
    return lambda d: d.pop(key)


AGENT = "rl_agent_config.json"
ENCODER = "encoder/config.json"
# (file, key, edit, exception class, message): every key of the rule, and the encoder type.
REFUSALS = [
    (
        AGENT,
        "option_layout",
        setter("option_layout", "parallel"),
        UnsupportedCheckpointError,
        r"option_layout = 'parallel' is not supported; supported: 'sequential'",
    ),
    (
        AGENT,
        "option_layout",
        setter("option_layout", "diagonal"),
        CheckpointError,
        r"option_layout = 'diagonal' is not supported; supported: 'sequential'",
    ),
    (
        ENCODER,
        "model_type",
        setter("model_type", "bert"),
        UnsupportedCheckpointError,
        r"model_type = 'bert' is not supported; supported: 'modernbert'",
    ),
    (
        ENCODER,
        "model_type",
        dropper("model_type"),
        UnsupportedCheckpointError,
        r"model_type = None is not supported; supported: 'modernbert'",
    ),
    (AGENT, "encoder", dropper("encoder"), CheckpointError, r"missing required key 'encoder'"),
    (
        AGENT,
        "encoder",
        setter("encoder", 5),
        CheckpointError,
        r"encoder = 5 is invalid; encoder must be a non-empty string",
    ),
    (AGENT, "head_layers", dropper("head_layers"), CheckpointError, r"missing required key 'head_layers'"),
    (
        AGENT,
        "head_layers",
        setter("head_layers", -1),
        CheckpointError,
        r"head_layers = -1 is invalid; head_layers must be an integer >= 0",
    ),
    (
        AGENT,
        "head_layers",
        setter("head_layers", True),
        CheckpointError,
        r"head_layers = True is invalid; head_layers must be an integer >= 0",
    ),
    (
        AGENT,
        "act_costs",
        setter("act_costs", [0.05, 0.2]),
        CheckpointError,
        r"act_costs = \[0\.05, 0\.2\] is invalid; act_costs must be a mapping of action name to a number",
    ),
    (
        AGENT,
        "act_costs",
        setter("act_costs", {"ask": "cheap"}),
        CheckpointError,
        r"act_costs = \{'ask': 'cheap'\} is invalid; act_costs must be a mapping of action name to a number",
    ),
    (
        AGENT,
        "temperature",
        setter("temperature", [1.0, 2.0]),
        CheckpointError,
        r"temperature = \[1\.0, 2\.0\] is invalid; temperature must be a list of 3 temperatures "
        r"\(choice, score, noul\)",
    ),
    (
        AGENT,
        "temperature",
        setter("temperature", 3.0),
        CheckpointError,
        r"temperature = 3\.0 is invalid; temperature must be a list of 3",
    ),
    (
        AGENT,
        "temperature_by_options",
        setter("temperature_by_options", None),
        CheckpointError,
        r"temperature_by_options = None is invalid; temperature_by_options must be a mapping",
    ),
    (
        AGENT,
        "max_len",
        setter("max_len", 0),
        CheckpointError,
        r"max_len = 0 is invalid; max_len must be an integer >= 1",
    ),
    (
        AGENT,
        "head_max_len",
        setter("head_max_len", "192"),
        CheckpointError,
        r"head_max_len = '192' is invalid; head_max_len must be an integer >= 1",
    ),
]


def test_the_refusals_cover_every_key_of_the_rule():
    assert {key for _, key, *_ in REFUSALS} == set(KEYS) | {"model_type"}


@pytest.mark.parametrize(
    "file, key, edit, cls, message", REFUSALS, ids=[f"{key}-{i}" for i, (_, key, *_) in enumerate(REFUSALS)]
)
def test_refused_config_values_name_key_and_supported_values(upstream_dir, tmp_path, file, key, edit, cls, message):
    ckpt = shutil.copytree(upstream_dir, tmp_path / "ckpt")
    edit_json(ckpt / file, edit)
    with pytest.raises(cls, match=message) as err:
        load_checkpoint(ckpt)
    assert str(ckpt / file) in str(err.value)
    # Through the stage: refused before anything is installed or recorded.
    out = tmp_path / "out"
    with pytest.raises(cls, match=message):
        run_model({"path": str(ckpt)}, out)
    assert not out.exists() or sorted(p.name for p in out.iterdir()) == []


def test_unknown_keys_are_recorded_not_refused(upstream_dir, tmp_path):
    ckpt = shutil.copytree(upstream_dir, tmp_path / "ckpt")
    edit_json(ckpt / AGENT, setter("released_by", "someone"))
    edit_json(ckpt / AGENT, setter("lang_temperatures", {"de": {"temperature": [1.0, 1.4, 2.0]}}))
    recorded = load_checkpoint(ckpt)[2]["recorded_keys"]
    assert recorded["released_by"] == UNKNOWN_KEY_NOTE
    assert recorded["lang_temperatures"].startswith("per-language temperature overrides: upstream applies them only")


def test_question_that_does_not_fit_max_len_is_refused(upstream_dir, tmp_path):
    """As upstream's runtime refuses it: the options' markers must fit in max_len."""
    ckpt = shutil.copytree(upstream_dir, tmp_path / "ckpt")
    edit_json(ckpt / AGENT, setter("max_len", 20))
    with pytest.raises(
        ConfigError,
        match=r"decision 'duplicate-likelihood': only 2 of its 3 option markers fit "
        r"in the checkpoint's max_len=20 with head_max_len=192",
    ):
        run_model({"path": str(ckpt)}, tmp_path / "out")
    decision = DECISIONS["duplicate-likelihood"]
    with pytest.raises(ValueError, match=r"only 2 of its 3 option markers fit in max_len=20"):
        upstream_agent(ckpt, tmp_path / "copy").system_one(decision.state, {"q": decision.question})


# ------------------------------------------------------------------ the rule's pieces


@pytest.mark.parametrize(
    "cfg",
    [
        {"tokenizer_class": "TokenizersBackend", "backend": "tokenizers", "is_local": True, "mask_token": "[MASK]"},
        {"mask_token": "[MASK]"},
        {"tokenizer_class": "PreTrainedTokenizerFast", "extra_special_tokens": ["<a>", "<b>"]},
        {"tokenizer_class": "PreTrainedTokenizerFast", "extra_special_tokens": {"x": "<a>"}},
    ],
)
def test_tokenizer_config_is_read_as_upstream_fixes_it(tmp_path, cfg):
    (tmp_path / "tokenizer").mkdir()
    path = tmp_path / "tokenizer" / "tokenizer_config.json"
    path.write_text(json.dumps(cfg))
    _fix_tokenizer_config(str(tmp_path))  # upstream rewrites the file in place
    fixed = upstream_tokenizer_config(cfg)
    assert (cfg if fixed is None else fixed) == json.loads(path.read_text())


VALUES = [True, False, None, "x", "2.5", 0.1, 0.5, 1.0, 4.99, 5.0, 7, -1, float("nan"), float("inf"), [1]]


def test_temperature_clamping_is_upstreams():
    for value in VALUES:
        applied = clamp_temperature(value)
        assert applied == up.clamp_temperature(value), value
        assert temperature_rejected(value, applied) == up.temperature_rejected(value, applied), value


def test_temperature_buckets_are_upstreams():
    for qtype in range(3):
        for k in range(1, 16):
            assert temperature_bucket(qtype, k) == up.temp_bucket(qtype, k)


def test_the_build_does_not_depend_on_upstream():
    """``laya`` is a test-only requirement: no module of the build imports it."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r"^\s*(import\s+laya\b|from\s+laya(\.\w+)*\s+import)", re.M)
    sources = sorted((root / "laya_build").rglob("*.py")) + [root / "dodo.py"]
    assert len(sources) > 20
    assert [p.name for p in sources if pattern.search(p.read_text())] == []
    assert pattern.search("from laya.common import build_sequence") and not pattern.search("import laya_build")


BAD_QUESTIONS = [
    {"type": "multi", "instructions": "x", "criteria": ["a"]},
    {"type": "choice", "instructions": "", "criteria": ["a"]},
    {"type": "choice", "instructions": None, "criteria": ["a"]},
    {"type": "choice", "instructions": "x", "criteria": None},
    {"type": "choice", "instructions": "x", "criteria": []},
    {"type": "choice", "instructions": "x", "criteria": ["a", "a"]},
    {"type": "choice", "instructions": "x", "criteria": [["a"]]},
    {"type": "score", "instructions": "x", "criteria": []},
    {"type": "score", "instructions": "x", "criteria": ["low", None]},
    {"type": "score", "instructions": "x", "criteria": {"low": 0}},
    {"type": "noul", "instructions": "x", "criteria": {"maybe": "y"}},
    {"type": "noul", "instructions": "x", "criteria": "yes"},
    {"type": "choice", "instructions": "x", "criteria": ["a"], "labels": {"false": "n", "true": "y"}},
    {"type": "noul", "instructions": "x", "labels": {"false": "same", "true": "same"}},
]


@pytest.mark.parametrize("question", BAD_QUESTIONS)
def test_decisions_upstream_refuses_are_refused(question):
    from laya_build.model import inputs as inputs_mod

    with pytest.raises(ValueError):
        Agent._check_question("q", question)
    with pytest.raises(ConfigError, match=r"decision 'bad': "):
        inputs_mod.check_question("bad", question)
