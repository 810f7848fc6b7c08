"""A real byte-level BPE tokenizer for the tiny Laya model, trained on ``corpus.txt``.

Byte-level BPE (the scheme of ModernBERT's own tokenizer) is used rather than WordPiece on
purpose: the ``tokenizers`` trainers assign ids to ``##``-prefixed continuation pieces in
hash-map order, so WordPiece vocabularies (and the merges they tie-break on) change from run
to run.  The byte-level trainer starts from the sorted 256-symbol byte alphabet and breaks
merge ties by pair id, so the same corpus gives the same ``tokenizer.json``, byte for byte.
The result is saved as a ``transformers.PreTrainedTokenizerFast``.  Special-token ids follow
the order of :data:`SPECIAL_TOKENS` (``[CLS]`` = 0 ... ``[UNK]`` = 4).
"""
from __future__ import annotations

import os
from pathlib import Path

CORPUS_PATH = Path(__file__).with_name("corpus.txt")
SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]")
DEFAULT_VOCAB_SIZE = 1024


def corpus_lines(path: str | os.PathLike = CORPUS_PATH) -> list[str]:
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line]


def train_tokenizer(vocab_size: int = DEFAULT_VOCAB_SIZE, corpus: str | os.PathLike = CORPUS_PATH):
    """Train a byte-level BPE tokenizer and wrap it as ``PreTrainedTokenizerFast``."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus_lines(corpus), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
        pad_token="[PAD]", unk_token="[UNK]", model_max_length=8192, padding_side="right",
    )


def build_tokenizer(out_dir: str | os.PathLike, vocab_size: int = DEFAULT_VOCAB_SIZE):
    """Train and save the tokenizer into ``out_dir``; return it."""
    tokenizer = train_tokenizer(vocab_size)
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def special_token_ids(tokenizer) -> dict[str, int]:
    return {"pad_token_id": tokenizer.pad_token_id, "cls_token_id": tokenizer.cls_token_id,
            "sep_token_id": tokenizer.sep_token_id, "mask_token_id": tokenizer.mask_token_id,
            "unk_token_id": tokenizer.unk_token_id}
