"""Tokenizers and token sequences of the Laya decision model.

* :func:`load_tokenizer`: a checkpoint's ``tokenizer/`` loaded the way upstream Laya loads it.
* :func:`build_sequence`: upstream's sequence construction (prompt rendering, ``[MASK]``
  option markers, head budget, state clamping), so saved inputs mean what upstream's runtime
  would feed the model.
* :func:`train_tokenizer`: the generated model's real byte-level BPE tokenizer, trained on
  ``corpus.txt``.

The generated tokenizer:

Byte-level BPE (the scheme of ModernBERT's own tokenizer) is used rather than WordPiece on
purpose: the ``tokenizers`` trainers assign ids to ``##``-prefixed continuation pieces in
hash-map order, so WordPiece vocabularies (and the merges they tie-break on) change from run
to run.  The byte-level trainer starts from the sorted 256-symbol byte alphabet and breaks
merge ties by pair id, so the same corpus gives the same ``tokenizer.json``, byte for byte.
The result is saved as a ``transformers.PreTrainedTokenizerFast``.  Special-token ids follow
the order of :data:`SPECIAL_TOKENS` (``[CLS]`` = 0 ... ``[UNK]`` = 4).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from laya_build.errors import CheckpointError, ConfigError

CORPUS_PATH = Path(__file__).with_name("corpus.txt")
SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]")
DEFAULT_VOCAB_SIZE = 1024


def corpus_lines(path: str | os.PathLike = CORPUS_PATH) -> list[str]:
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line]


def train_tokenizer(
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    corpus: str | os.PathLike = CORPUS_PATH,
    special_tokens: tuple[str, ...] = SPECIAL_TOKENS,
):
    """Train a byte-level BPE tokenizer and wrap it as ``PreTrainedTokenizerFast``; the
    special tokens get ids ``0..`` in the order of ``special_tokens``."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(corpus), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        pad_token="[PAD]",
        unk_token="[UNK]",
        model_max_length=8192,
        padding_side="right",
    )


def build_tokenizer(out_dir: str | os.PathLike, vocab_size: int = DEFAULT_VOCAB_SIZE):
    """Train and save the tokenizer into ``out_dir``; return it."""
    tokenizer = train_tokenizer(vocab_size)
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def special_token_ids(tokenizer) -> dict[str, int]:
    return {
        "pad_token_id": tokenizer.pad_token_id,
        "cls_token_id": tokenizer.cls_token_id,
        "sep_token_id": tokenizer.sep_token_id,
        "mask_token_id": tokenizer.mask_token_id,
        "unk_token_id": tokenizer.unk_token_id,
    }


# ----------------------------------------------------------------------------- loading

REQUIRED_SPECIAL = ("cls_token", "sep_token", "mask_token", "pad_token")


def upstream_tokenizer_config(cfg: dict) -> dict | None:
    """laya 0.4.15 ``laya/agent.py _fix_tokenizer_config``, in memory: the tokenizer config
    upstream actually loads (``None`` when it loads the file as it is).

    Upstream rewrites the checkpoint's ``tokenizer_config.json`` in place before
    ``AutoTokenizer.from_pretrained``: a missing or ``TokenizersBackend`` class becomes
    ``PreTrainedTokenizerFast`` (without ``backend``/``is_local``), and a list of
    ``extra_special_tokens`` becomes the mapping ``{"extra_<i>": token}``.  Here the files are
    never modified; the same config is handed to transformers from a private copy.
    """
    fixed, changed = dict(cfg), False
    if fixed.get("tokenizer_class") in (None, "TokenizersBackend"):
        fixed["tokenizer_class"] = "PreTrainedTokenizerFast"
        fixed.pop("backend", None)
        fixed.pop("is_local", None)
        changed = True
    extra = fixed.get("extra_special_tokens")
    if isinstance(extra, list):
        fixed["extra_special_tokens"] = {f"extra_{i}": t for i, t in enumerate(extra)}
        changed = True
    return fixed if changed else None


def load_tokenizer(tok_dir: str | os.PathLike):
    """The checkpoint tokenizer of ``tok_dir`` as upstream's ``laya.load`` builds it
    (``AutoTokenizer`` after :func:`upstream_tokenizer_config`), offline, files untouched.

    Raises :class:`CheckpointError` naming the directory when it is not a fast tokenizer or
    lacks one of the special tokens a sequence is built from (``[CLS]``, ``[SEP]``,
    ``[MASK]``, padding).
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import AutoTokenizer

    tok_dir = Path(tok_dir)
    cfg_path = tok_dir / "tokenizer_config.json"
    fixed = upstream_tokenizer_config(json.loads(cfg_path.read_text())) if cfg_path.is_file() else None
    try:
        if fixed is None:
            tokenizer = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
        else:
            with tempfile.TemporaryDirectory(prefix="laya-tokenizer-") as tmp:
                for item in tok_dir.iterdir():
                    if item.is_file():
                        shutil.copyfile(item, Path(tmp) / item.name)
                (Path(tmp) / "tokenizer_config.json").write_text(json.dumps(fixed, indent=2))
                tokenizer = AutoTokenizer.from_pretrained(tmp, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{tok_dir}: the tokenizer does not load: {type(exc).__name__}: {exc}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise CheckpointError(
            f"{tok_dir}: {type(tokenizer).__name__} is not a fast tokenizer; "
            "supported: a tokenizers-backed tokenizer (tokenizer.json)"
        )
    missing = [name for name in REQUIRED_SPECIAL if getattr(tokenizer, f"{name}_id", None) is None]
    if missing:
        raise CheckpointError(
            f"{tok_dir}: the tokenizer has no {', '.join(missing)}; a Laya sequence needs {', '.join(REQUIRED_SPECIAL)}"
        )
    return tokenizer


# ------------------------------------------------------------------- sequence building
#
# A port of laya 0.4.15 laya/common.py (render_criterion, render_options, build_head,
# build_sequence, serialize_state) and laya/agent.py (Agent._to_internal, and the state
# handling of Agent._encode_state), for the sequential option layout.  Tests compare every
# saved row with upstream's own ``build_sequence`` token for token.

QUESTION_TYPES = ("choice", "score", "noul")
NOUL_DEFAULT_LABELS = {"false": "false", "true": "true"}
NOUL_DEFAULT_TEXT = {"false": "no, the statement does not hold", "true": "yes, the statement holds"}
OPTION_MAX_TOKENS = 48  # each option's tokens are capped by the tokenizer (truncation=True)
MIN_STATE_FREE_HEAD = 16  # below this many spare head tokens, options are cut to a per-option cap
MIN_INSTRUCTION_TOKENS = 8


def serialize_state(state) -> str:
    return state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)


def render_criterion(value) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


def noul_labels(labels=None) -> tuple[str, str]:
    labels = NOUL_DEFAULT_LABELS if labels is None else labels
    bad = ConfigError("noul labels must map exactly 'false' and 'true' to distinct non-empty strings")
    if not isinstance(labels, dict) or set(labels) != {"false", "true"}:
        raise bad
    false_label, true_label = labels["false"], labels["true"]
    if not isinstance(false_label, str) or not isinstance(true_label, str):
        raise bad
    false_label, true_label = false_label.strip(), true_label.strip()
    if not false_label or not true_label or false_label == true_label:
        raise bad
    return false_label, true_label


def to_internal(question: dict) -> dict:
    """A public question ``{"type", "instructions", "criteria"[, "labels"]}`` as upstream's
    ``Agent._to_internal`` turns it into ``{"t", "ins", "crit"[, "labels"]}``."""
    t, crit = question["type"], question.get("criteria")
    if t == "choice" and isinstance(crit, list):
        crit = {c: None for c in crit}
    elif t == "noul" and isinstance(crit, dict):
        crit = {str(k).lower(): v for k, v in crit.items()}
    ins = question["instructions"]
    if not isinstance(ins, str):
        ins = json.dumps(ins, ensure_ascii=False)
    q = {"t": t, "ins": ins, "crit": crit}
    if "labels" in question:
        q["labels"] = question["labels"]
    return q


def render_options(q: dict) -> list[str]:
    """Option texts in label order; a noul question is always ``[false, true]``."""
    t, crit = q["t"], q.get("crit")
    if t != "noul" and "labels" in q:
        raise ConfigError("labels is only supported for noul questions")
    if t == "choice":
        return [str(k) if v is None or v == "" else f"{k}: {render_criterion(v)}" for k, v in crit.items()]
    if t == "score":
        return [f"level {i:d}: {render_criterion(c)}" for i, c in enumerate(crit)]
    crit = crit or {}
    labels = dict(zip(("false", "true"), noul_labels(q.get("labels"))))
    return [
        labels[side]
        + ": "
        + (render_criterion(crit.get(side)) if crit.get(side) not in (None, "") else NOUL_DEFAULT_TEXT[side])
        for side in ("false", "true")
    ]


def _ids(tokenizer, text: str, **kwargs) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False, **kwargs)["input_ids"])


def build_head(tokenizer, q: dict, head_max_len: int) -> tuple[list[int], list[int]]:
    """``[CLS] <type> question: instructions [SEP] [MASK] opt0 [MASK] opt1 ... [SEP]`` and the
    ``[MASK]`` positions, with upstream's head budget."""
    mask = tokenizer.mask_token
    opts = render_options(q)
    head_ids = _ids(tokenizer, f"{q['t']} question: {str(q['ins']).replace(mask, ' ')}")
    opt_ids = [
        [tokenizer.mask_token_id]
        + _ids(tokenizer, " " + o.replace(mask, " "), truncation=True, max_length=OPTION_MAX_TOKENS)
        for o in opts
    ]
    budget = head_max_len - sum(len(o) for o in opt_ids)
    if budget < MIN_STATE_FREE_HEAD:
        per = max(4, (head_max_len - MIN_STATE_FREE_HEAD) // max(1, len(opt_ids)))
        opt_ids = [o[:per] for o in opt_ids]
        budget = head_max_len - sum(len(o) for o in opt_ids)
    ids = [tokenizer.cls_token_id] + head_ids[: max(MIN_INSTRUCTION_TOKENS, budget)] + [tokenizer.sep_token_id]
    markers = []
    for o in opt_ids:
        markers.append(len(ids))
        ids.extend(o)
    ids.append(tokenizer.sep_token_id)
    return ids, markers


def build_sequence(tokenizer, state, q: dict, max_len: int, head_max_len: int) -> tuple[list[int], list[int]]:
    """Token ids and ``[MASK]`` positions of one (state, question), as upstream's runtime
    builds them: the state (JSON if not a string; a list, a conversation, keeps its end)
    fills the room the head leaves, and the whole is clamped to ``max_len``."""
    ids, markers = build_head(tokenizer, q, head_max_len)
    room = max(0, max_len - len(ids) - 1)
    state_ids = _ids(tokenizer, serialize_state(state).replace(tokenizer.mask_token, " "))
    kept = state_ids[max(0, len(state_ids) - room) :] if isinstance(state, list) else state_ids[:room]
    ids = ids + kept + [tokenizer.sep_token_id]
    return ids[:max_len], [m for m in markers if m < max_len]
