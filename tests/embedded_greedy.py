"""Greedy regression case of the embedded mini-Ouro, shared by the CPU and the GPU engine tests.

`tests/data/embedded_greedy_cpu.json` holds the greedy tokens that CPU servers gave for
`PROMPTS` (all prompts in one batch, ``NEW_TOKENS`` each): ``rq_native`` (the reference codec +
SDPA) and ``bf16`` (``--rq-disable``, SGLang's own pool). Regenerate it on CPU with
``SGLANG_RQ_RECORD_GOLDEN=1 pytest tests/test_engine_capacity.py -k greedy`` only when the
model, the codec or the KV format deliberately change.
"""

from __future__ import annotations

import json
from pathlib import Path

GOLDEN_PATH = Path(__file__).resolve().parent / "data" / "embedded_greedy_cpu.json"
NEW_TOKENS = 32
PROMPTS = [
    "Janet has 3 apples and buys 5 more. How many apples does she have?",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune,",
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
]


def prompt_ids() -> list[list[int]]:
    """`PROMPTS` as token ids of the embedded tokenizer, BOS (id 1) first, lengths 6-20ish."""
    from tokenizers import Tokenizer

    from sglang_rq.launch_server import EMBEDDED_MODEL

    tok = Tokenizer.from_file(str(EMBEDDED_MODEL / "tokenizer.json"))
    return [[1] + tok.encode(p).ids for p in PROMPTS]


def load_golden() -> dict[str, list[list[int]]]:
    return json.loads(GOLDEN_PATH.read_text())


def record_golden(key: str, tokens: list[list[int]]) -> None:
    data = json.loads(GOLDEN_PATH.read_text()) if GOLDEN_PATH.is_file() else {}
    data[key] = tokens
    GOLDEN_PATH.write_text(json.dumps(data) + "\n")


def first_differences(got: list[list[int]], want: list[list[int]]) -> list[int]:
    """Per prompt, the number of tokens before the first difference."""
    out = []
    for a, b in zip(got, want):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        out.append(n)
    return out
