"""Greedy regression case of the embedded mini-Ouro, shared by the CPU and the GPU engine tests.

`tests/data/embedded_greedy_cpu.json` holds what CPU servers gave for `PROMPTS` (all prompts in
one batch, ``NEW_TOKENS`` greedy tokens each): ``rq_native`` (the reference codec + SDPA) and
``bf16`` (``--rq-disable``, SGLang's own pool), each as ``tokens`` and ``margins`` (top-1 minus
top-2 log-probability at every generated position, nats). Regenerate it on CPU with
``SGLANG_RQ_RECORD_GOLDEN=1 pytest tests/test_engine_capacity.py -k greedy`` only when the
model, the codec or the KV format deliberately change.

The comparison rule (`greedy_mismatches`): two runs that read the same KV bytes but sum in a
different order (GPU kernels vs CPU SDPA, CUDA-graph replay vs eager, TP = 2 vs 1) must give the
same greedy tokens up to the first position where the reference's choice was a near-tie
(margin below `NEAR_TIE_NATS`); from a near-tie on, either choice is right and the sequences
may part. The embedded model's next-token distributions are flat (docs/quality.md), so such
ties do occur within 32 tokens; a wiring or codec error instead diverges at a confident position.
"""

from __future__ import annotations

import json
from pathlib import Path

GOLDEN_PATH = Path(__file__).resolve().parent / "data" / "embedded_greedy_cpu.json"
NEW_TOKENS = 32
# The logits are bf16 (a 0.0625-0.125 step at this model's magnitudes, visible in the recorded
# margins); runs summing in another order differ by a few steps: measured on the H200, GPU
# rq_triton parted from CPU rq_native at a position the CPU chose by 0.31 nats.
NEAR_TIE_NATS = 0.5
PROMPTS = [
    "Janet has 3 apples and buys 5 more. How many apples does she have?",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune,",
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
]


def prompt_ids() -> list[list[int]]:
    """`PROMPTS` as token ids of the embedded tokenizer, BOS (id 1) first, lengths 6-24."""
    from tokenizers import Tokenizer

    from sglang_rq.models.embedded import EMBEDDED_MODEL

    tok = Tokenizer.from_file(str(EMBEDDED_MODEL / "tokenizer.json"))
    return [[1] + tok.encode(p).ids for p in PROMPTS]


def load_golden() -> dict[str, dict[str, list]]:
    return json.loads(GOLDEN_PATH.read_text())


def record_golden(key: str, tokens: list[list[int]], margins: list[list[float]]) -> None:
    data = json.loads(GOLDEN_PATH.read_text()) if GOLDEN_PATH.is_file() else {}
    data[key] = {"tokens": tokens, "margins": [[round(m, 4) for m in ms] for ms in margins]}
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


def greedy_mismatches(got: list[list[int]], ref: list[list[int]],
                      ref_margins: list[list[float]]) -> list[str]:
    """Prompts whose tokens differ from ``ref`` at a position where the reference was confident
    (margin >= `NEAR_TIE_NATS`) before any near-tie; empty when the runs agree by that rule."""
    bad = []
    for i, (a, b, m) in enumerate(zip(got, ref, ref_margins)):
        for n in range(len(b)):
            if m[n] < NEAR_TIE_NATS:
                break  # a near-tie: either token is a correct greedy choice from here on
            if n >= len(a) or a[n] != b[n]:
                bad.append(f"prompt {i}: token {n} is {a[n] if n < len(a) else None}, reference "
                           f"{b[n]} chosen by a margin of {m[n]:.3f} nats")
                break
    return bad


def teacher_forced_mismatches(url: str, key: str) -> tuple[list[str], int]:
    """Feed each prompt plus the recorded continuation of ``key`` as one input and compare the
    server's top-1 prediction at every continuation position with the recorded token, where the
    reference chose it by at least `NEAR_TIE_NATS`. Exercises the extend path over the whole
    continuation (greedy comparisons stop at the first near-tie). Returns (mismatches, checked)."""
    import requests

    ref = load_golden()[key]
    prompts = prompt_ids()
    docs = [p + t[:-1] for p, t in zip(prompts, ref["tokens"])]
    r = requests.post(url + "/generate", json={
        "input_ids": docs, "return_logprob": True, "logprob_start_len": 0,
        "top_logprobs_num": 1, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}},
        timeout=600)
    r.raise_for_status()
    bad, checked = [], 0
    for i, (o, p) in enumerate(zip(r.json(), prompts)):
        # input_top_logprobs[j] predicts input token j from tokens < j, so continuation token n
        # (input position len(p) + n) is predicted at entry len(p) + n; the last one, which is
        # not in the input, is the generated token.
        tops = o["meta_info"]["input_top_logprobs"]
        want = ref["tokens"][i]
        preds = [tops[len(p) + n][0][1] for n in range(len(want) - 1)] + [o["output_ids"][0]]
        for n, (got, tok) in enumerate(zip(preds, want)):
            if ref["margins"][i][n] < NEAR_TIE_NATS:
                continue
            checked += 1
            if got != tok:
                bad.append(f"prompt {i} position {n}: {got} vs {tok} "
                           f"(margin {ref['margins'][i][n]:.3f})")
    return bad, checked
