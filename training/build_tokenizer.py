#!/usr/bin/env python3
"""Train the mini-Ouro tokenizer: byte-level BPE, vocabulary 8192, on the training mix only.

Special tokens (fixed ids): ``<|endoftext|>`` = 0 (pad / document separator),
``<|im_start|>`` = 1 (bos), ``<|im_end|>`` = 2 (eos).  Pre-tokenization as in SmolLM2:
digits split individually, then GPT-2 byte-level splitting (no prefix space).  The corpus is
exactly the training split of ``prepare_data.training_documents`` (no Pride and Prejudice,
no WikiText, no test split, no validation tail).

Writes into ``--out`` (default ``sglang_rq/assets/mini-ouro/``): ``tokenizer.json``,
``tokenizer_config.json`` (``PreTrainedTokenizerFast``, ChatML ``chat_template``) and
``special_tokens_map.json``.

Usage::

    python training/build_tokenizer.py [--data-dir ../shared/data] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare_data import (  # noqa: E402
    DEFAULT_DATA_DIR,
    DEFAULT_TOKENIZER_DIR,
    EOT,
    IM_END,
    IM_START,
    training_documents,
)

VOCAB_SIZE = 8192
SPECIAL_TOKENS = [EOT, IM_START, IM_END]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MODEL_MAX_LENGTH = 2048
_SPECIAL_RE = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS))


def build(docs: list[str], vocab_size: int = VOCAB_SIZE):
    """Train and return a ``tokenizers.Tokenizer`` on ``docs``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The trainer does not split on special tokens: feed only the text between them, so no
    # merge ever spans a special token's characters.
    pieces = [piece for d in docs for piece in _SPECIAL_RE.split(d) if piece]
    tok.train_from_iterator(pieces, trainer=trainer, length=len(pieces))
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    return tok


def tokenizer_config() -> dict:
    """The ``tokenizer_config.json`` content (transformers ``PreTrainedTokenizerFast``)."""
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": IM_START,
        "eos_token": IM_END,
        "pad_token": EOT,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "chat_template": CHAT_TEMPLATE,
    }


def special_tokens_map() -> dict:
    """The ``special_tokens_map.json`` content."""
    return {
        "bos_token": IM_START,
        "eos_token": IM_END,
        "pad_token": EOT,
        "additional_special_tokens": [IM_START, IM_END],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    ap.add_argument("--out", type=Path, default=DEFAULT_TOKENIZER_DIR)
    ap.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = ap.parse_args()

    train_docs, _val, sources = training_documents(args.data_dir)
    print(f"training tokenizer on {len(sources)} sources, {len(train_docs)} documents, "
          f"{sum(len(d) for d in train_docs):,} characters")
    tok = build(train_docs, args.vocab_size)
    args.out.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out / "tokenizer.json"))
    (args.out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    (args.out / "special_tokens_map.json").write_text(json.dumps(special_tokens_map(), indent=2) + "\n")
    sample = "It is a truth universally acknowledged, that 48/2 = 24."
    enc = tok.encode(sample)
    print(f"vocab {tok.get_vocab_size()}; sample -> {len(enc.ids)} tokens: {enc.tokens}")
    assert tok.decode(enc.ids) == sample
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
