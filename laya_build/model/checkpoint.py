"""The Laya checkpoint layout of upstream ``laya`` (0.4.15): strict loading and generation.

A checkpoint directory, as ``laya.train.save_checkpoint`` writes it and ``laya.load`` reads
it::

    rl_agent_config.json   {"encoder": name, "head_layers": int >= 0,
                            "act_costs": {action: cost} (optional; n_act = len + 1),
                            "temperature": [choice, score, noul] (optional),
                            "temperature_by_options": {"<type>:<k bucket>": t} (optional),
                            "max_len", "head_max_len", "option_layout", ... (see KEYS)}
    model.safetensors      every DecisionModel tensor (upstream writes fp16), including the
                           ``temperature`` buffer of shape [3]
    encoder/config.json    the encoder's config (``save_pretrained``); ModernBERT only here
    tokenizer/             the tokenizer's own ``save_pretrained`` (tokenizer.json needed)

Loading is strict: every tensor name and shape must match the model the config describes,
weights of any float dtype are converted to fp32 (a stage then converts to its build dtype),
and a config value that changes the computation in a way this build does not implement
(``option_layout: parallel``, a non-ModernBERT encoder) is refused naming the key and the
supported values (:class:`UnsupportedCheckpointError`); a malformed value is a
:class:`CheckpointError` naming the key and what it must be.  Keys that do not change the
computation are recorded (``model.json`` ``agent_config.recorded_keys``).

Nothing here touches the network, and a checkpoint directory is never modified.
"""

from __future__ import annotations

import json
import numbers
import os
import shutil
import tempfile
from pathlib import Path

import torch

from laya_build.atomic import write_json
from laya_build.errors import CheckpointError, UnsupportedCheckpointError
from laya_build.model.decision import QUESTION_TYPES, DecisionModel
from laya_build.model.tokenizer import DEFAULT_VOCAB_SIZE, build_tokenizer, load_tokenizer, special_token_ids
from laya_build.runtime.parity import applied_calibration

UPSTREAM_LAYA = "0.4.15"
AGENT_CONFIG = "rl_agent_config.json"
WEIGHTS = "model.safetensors"
ENCODER_CONFIG = "encoder/config.json"
TOKENIZER_DIR = "tokenizer"
REQUIRED = (AGENT_CONFIG, WEIGHTS, ENCODER_CONFIG, f"{TOKENIZER_DIR}/tokenizer.json")
DEFAULT_ATTN = "sdpa"
SUPPORTED_ENCODERS = ("modernbert",)
OPTION_LAYOUTS = ("sequential",)  # upstream also has "parallel": refused
UPSTREAM_OPTION_LAYOUTS = ("sequential", "parallel")
DEFAULT_MAX_LEN, DEFAULT_HEAD_MAX_LEN = 512, 192  # upstream's cfg.get defaults
DEFAULT_TEMPERATURE = [1.0, 1.0, 1.0]

# The rl_agent_config.json keys upstream 0.4.15 reads (laya/agent.py Agent.__init__,
# laya/common.py build_model, uses_parallel_layout) and what the build does with them.
KEYS = {
    "encoder": "required: the base encoder's name (recorded; the encoder is built from encoder/config.json)",
    "head_layers": "required: decision-head transformer layers, an integer >= 0",
    "act_costs": "optional: a mapping of action name to cost; n_act = len(act_costs) + 1",
    "temperature": "optional: a list of 3 temperatures (choice, score, noul); default [1, 1, 1]",
    "temperature_by_options": "optional: a mapping of '<type>:<2|3-5|6-10|11+>' to a temperature",
    "max_len": "optional: sequence budget in tokens, an integer >= 1; default 512",
    "head_max_len": "optional: question-head budget in tokens, an integer >= 1; default 192",
    "option_layout": "optional: 'sequential' (supported) or 'parallel' (refused)",
}
# Keys upstream reads that do not change the forward or the tokenisation: recorded.
NEUTRAL_KEYS = {
    "amp_dtype": "upstream's CUDA autocast dtype at predict time; not applied: the build's "
    "precisions are export.targets and latency.amp_dtype",
    "lang_temperatures": "per-language temperature overrides: upstream applies them only when a "
    "request names a language (laya.load(lang_temperatures=...)); the saved "
    "decisions carry none",
}
UNKNOWN_KEY_NOTE = f"not read by laya {UPSTREAM_LAYA}'s runtime: does not change the computation"


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
        pad_token_id=ids["pad_token_id"],
        cls_token_id=ids["cls_token_id"],
        sep_token_id=ids["sep_token_id"],
        mask_token_id=ids["mask_token_id"],
        bos_token_id=ids["cls_token_id"],
        eos_token_id=ids["sep_token_id"],
        attn_implementation=attn_implementation,
    )


def generated_agent_config(spec: dict) -> dict:
    """The ``rl_agent_config.json`` of a generated checkpoint (upstream's keys and types)."""
    return {
        "encoder": spec.get("encoder_name", "laya-tiny-modernbert"),
        "head_layers": int(spec["head_layers"]),
        "act_costs": {str(k): float(v) for k, v in spec["act_costs"].items()},
        "max_len": int(spec.get("max_len", DEFAULT_MAX_LEN)),
        "head_max_len": int(spec.get("head_max_len", DEFAULT_HEAD_MAX_LEN)),
        "option_layout": "sequential",
        "temperature": [float(t) for t in spec.get("temperature", DEFAULT_TEMPERATURE)],
        "temperature_by_options": {str(k): float(v) for k, v in spec.get("temperature_by_options", {}).items()},
    }


def generate_checkpoint(out_dir: str | os.PathLike, spec: dict) -> Path:
    """Write a randomly initialised Laya checkpoint (``model.generate``) to ``out_dir`` the
    way ``laya.train.save_checkpoint`` writes one: fp16 weights, the encoder config's
    ``save_pretrained``, the tokenizer's ``save_pretrained`` and ``rl_agent_config.json``.

    Byte-reproducible: the tokenizer training is deterministic and every weight comes from
    ``torch.manual_seed(spec["seed"])`` inside a forked RNG (the caller's RNG is untouched).
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out / TOKENIZER_DIR, spec.get("vocab_size", DEFAULT_VOCAB_SIZE))
    config = encoder_config(spec, tokenizer)
    agent = generated_agent_config(spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(spec["seed"]))
        model = DecisionModel(config, head_layers=agent["head_layers"], n_act=len(agent["act_costs"]) + 1)
    # As upstream: every tensor in fp16, no metadata (the header is then byte-stable).
    save_file({k: v.detach().half().cpu().contiguous() for k, v in model.state_dict().items()}, str(out / WEIGHTS))
    config.save_pretrained(str(out / Path(ENCODER_CONFIG).parent))
    write_json(out / AGENT_CONFIG, agent)
    return out


# ------------------------------------------------------------------------------ loading


def _fail(path: Path, key: str, value, expected: str) -> CheckpointError:
    return CheckpointError(f"{path}: {key} = {value!r} is invalid; {key} must be {expected}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def read_agent_config(path: str | os.PathLike) -> dict:
    """``rl_agent_config.json`` of the checkpoint ``path``, checked key by key (:data:`KEYS`).

    Returns the values the build uses (defaults filled in as upstream fills them), the
    calibration (raw and as applied, see ``aoti.applied_calibration``) and
    ``recorded_keys``: every other key with why it does not change the computation.
    """
    path = Path(path)
    file = path / AGENT_CONFIG
    try:
        raw = json.loads(file.read_text())
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise CheckpointError(f"{file}: not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file}: must be a JSON object, got {type(raw).__name__}")

    for key in ("encoder", "head_layers"):
        if key not in raw:
            raise CheckpointError(f"{file}: missing required key {key!r} ({KEYS[key]})")
    encoder = raw["encoder"]
    if not isinstance(encoder, str) or not encoder:
        raise _fail(file, "encoder", encoder, "a non-empty string (the base encoder's name)")
    head_layers = raw["head_layers"]
    if not _is_int(head_layers) or head_layers < 0:
        raise _fail(file, "head_layers", head_layers, "an integer >= 0")

    act_costs = raw.get("act_costs")
    if "act_costs" in raw and not (
        isinstance(act_costs, dict) and all(isinstance(k, str) and _is_number(v) for k, v in act_costs.items())
    ):
        raise _fail(file, "act_costs", act_costs, "a mapping of action name to a number (cost)")

    sizes = {}
    for key, default in (("max_len", DEFAULT_MAX_LEN), ("head_max_len", DEFAULT_HEAD_MAX_LEN)):
        value = raw.get(key, default)
        if not _is_int(value) or value < 1:
            raise _fail(file, key, value, "an integer >= 1")
        sizes[key] = value

    layout = raw.get("option_layout", "sequential")
    if layout not in OPTION_LAYOUTS:
        cls = UnsupportedCheckpointError if layout in UPSTREAM_OPTION_LAYOUTS else CheckpointError
        raise cls(
            f"{file}: option_layout = {layout!r} is not supported; supported: "
            f"{', '.join(repr(v) for v in OPTION_LAYOUTS)} (the parallel layout changes the "
            "encoder's positions and attention masks, which this build does not export)"
        )

    temperature = raw.get("temperature", DEFAULT_TEMPERATURE)
    if not isinstance(temperature, list) or len(temperature) != len(QUESTION_TYPES):
        raise _fail(
            file,
            "temperature",
            temperature,
            f"a list of {len(QUESTION_TYPES)} temperatures ({', '.join(QUESTION_TYPES)})",
        )
    by_options = raw.get("temperature_by_options", {})
    if not isinstance(by_options, dict):
        raise _fail(
            file, "temperature_by_options", by_options, "a mapping of '<type>:<2|3-5|6-10|11+>' to a temperature"
        )

    recorded = {k: NEUTRAL_KEYS.get(k, UNKNOWN_KEY_NOTE) for k in sorted(raw) if k not in KEYS}
    applied = applied_calibration(temperature, by_options)
    return {
        "encoder": encoder,
        "head_layers": head_layers,
        "act_costs": act_costs,
        "n_act": len(act_costs or {}) + 1,
        **sizes,
        "option_layout": layout,
        "calibration": {
            "source": AGENT_CONFIG if ("temperature" in raw or "temperature_by_options" in raw) else "default",
            "temperature": temperature,
            "temperature_by_options": by_options,
            "applied": {
                "temperature": applied["temperature"],
                "temperature_by_options": applied["temperature_by_options"],
            },
            "replaced": applied["replaced"],
        },
        "recorded_keys": recorded,
    }


def read_encoder_config(path: Path, attn_implementation: str = DEFAULT_ATTN):
    """The encoder config of ``encoder/config.json``; only ModernBERT is supported."""
    from transformers import AutoConfig

    file = path / ENCODER_CONFIG
    try:
        raw = json.loads(file.read_text())
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise CheckpointError(f"{file}: not valid JSON: {exc}") from None
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if model_type not in SUPPORTED_ENCODERS:
        raise UnsupportedCheckpointError(
            f"{file}: model_type = {model_type!r} is not supported; supported: "
            f"{', '.join(repr(v) for v in SUPPORTED_ENCODERS)} (the build exports ModernBERT encoders only)"
        )
    try:
        return AutoConfig.from_pretrained(
            str(file.parent), local_files_only=True, attn_implementation=attn_implementation
        )
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise CheckpointError(f"{file}: does not load as a ModernBERT config: {type(exc).__name__}: {exc}") from None


def require_complete(path: Path) -> None:
    """Raise :class:`CheckpointError` naming every file of the layout missing under ``path``."""
    missing = [name for name in REQUIRED if not (path / name).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete: missing {', '.join(missing)}")


def _listed(names: list[str]) -> str:
    return f"{names[:10]}{' ...' if len(names) > 10 else ''} ({len(names)})"


def check_state(file: Path, state: dict, expected: dict) -> None:
    """Every tensor of ``expected`` present in ``state`` with its shape and a float dtype,
    and nothing else; one :class:`CheckpointError` listing every difference."""
    absent = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [
        f"{k}: file {list(state[k].shape)} vs model {list(expected[k].shape)}"
        for k in sorted(set(state) & set(expected))
        if state[k].shape != expected[k].shape
    ]
    dtypes = [
        f"{k}: {str(state[k].dtype).removeprefix('torch.')}"
        for k in sorted(set(state) & set(expected))
        if not state[k].dtype.is_floating_point
    ]
    problems = []
    if absent or unexpected:
        problems.append(f"missing keys {_listed(absent)}, unexpected keys {_listed(unexpected)}")
    if shapes:
        problems.append(f"shape mismatches: {'; '.join(shapes[:10])}{' ...' if len(shapes) > 10 else ''}")
    if dtypes:
        problems.append(f"not floating point: {'; '.join(dtypes[:10])}")
    if problems:
        raise CheckpointError(f"{file} does not match DecisionModel: " + "; ".join(problems))


def load_checkpoint(path: str | os.PathLike, attn_implementation: str = DEFAULT_ATTN):
    """Build ``(model, tokenizer, agent_config)`` from a checkpoint directory, strictly.

    The model is fp32 on CPU in eval mode (fp16/bf16 weights are converted); the tokenizer is
    the one upstream loads (:func:`load_tokenizer`); ``agent_config`` is
    :func:`read_agent_config`'s, plus ``weights_dtypes`` and ``model_type``.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    require_complete(path)
    agent = read_agent_config(path)
    config = read_encoder_config(path, attn_implementation)
    tokenizer = load_tokenizer(path / TOKENIZER_DIR)
    model = DecisionModel(config, head_layers=agent["head_layers"], n_act=agent["n_act"])
    try:
        state = load_file(str(path / WEIGHTS))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{path / WEIGHTS}: not a readable safetensors file: {exc}") from None
    check_state(path / WEIGHTS, state, model.state_dict())
    model.load_state_dict(state, strict=True)  # copies into the fp32 parameters
    agent = {
        **agent,
        "model_type": config.model_type,
        "weights_dtypes": sorted({str(t.dtype).removeprefix("torch.") for t in state.values()}),
    }
    return model.eval(), tokenizer, agent


def install_checkpoint(source: str | os.PathLike | None, spec: dict, target: str | os.PathLike):
    """Generate (``source is None``) or copy a checkpoint into ``target``, replacing it whole,
    and return ``(target, load_checkpoint(target))``.

    The checkpoint is written and strictly loaded in a sibling temp directory that is renamed
    into place only then, so neither an interrupted run nor a refused checkpoint leaves
    anything under ``target``.  ``source`` itself is only read.
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
        loaded = load_checkpoint(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target, loaded
