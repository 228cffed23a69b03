"""The SGLang Huginn model (real engine on CPU) against the plain PyTorch reference.

A random upstream-format checkpoint shaped like Huginn-3.5B at small scale (head_dim 96, 2 prelude
+ 4 core + 2 coda blocks, 4 recurrences: 20 KV slots), both sides in float32. With the BF16 pool
greedy tokens must be identical. Prompts of different lengths run in one batch (ragged extend,
batched decode). With the ResidualQuant pool (core recurrences in loop groups, prelude/coda
un-looped): a format storing every slot in 16 bits at ``--rq-recurrences 8`` (two loop groups of
4, chunked prefill so later chunks read the pool) must give the reference's greedy tokens at
R = 8; the default format must agree with the reference's teacher-forced top-1 on most positions
read from the compressed cache, with the hand-derived bytes per token.
"""

from __future__ import annotations

import pytest
import torch

from sglang_rq.models.huginn_reference import HuginnReferenceModel, write_random_checkpoint
from tests.server import Server

pytestmark = pytest.mark.engine

PROMPTS = [[5, 17, 300, 42], [9] * 13, list(range(100, 137)), [1, 2]]
NEW_TOKENS = 12
SHAPE = dict(n_embd=192, n_heads=2, n_layers_in_prelude=2, n_layers_in_recurrent_block=4,
             n_layers_in_coda=2, mean_recurrence=4)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("huginn-random")
    write_random_checkpoint(path, SHAPE, seed=1)
    return path


def _reference_greedy(checkpoint, num_recurrences: int | None = None) -> list[list[int]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls on shared cores
    try:
        model = HuginnReferenceModel.from_pretrained(checkpoint, dtype=torch.float32)
        return model.greedy_generate(PROMPTS, NEW_TOKENS, num_recurrences=num_recurrences)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reference_tokens(checkpoint):
    return _reference_greedy(checkpoint)


def _serve(checkpoint, tmp_path_factory, *extra):
    log = tmp_path_factory.mktemp("logs") / "server.log"
    return Server(["--model-path", str(checkpoint), "--dtype", "float32", "--skip-tokenizer-init",
                   "--max-total-tokens", "4096", "--rq-no-canary", *extra], log)


def test_sglang_huginn_matches_reference_greedy(checkpoint, reference_tokens, tmp_path_factory):
    server = _serve(checkpoint, tmp_path_factory, "--rq-disable", "--attention-backend",
                    "torch_native")
    try:
        got = server.generate_ids(PROMPTS, NEW_TOKENS)
    finally:
        server.stop()
    for prompt, ref, out in zip(PROMPTS, reference_tokens, got):
        assert out == ref, (prompt, ref, out)


def test_rq_pool_16_bit_format_at_8_recurrences_matches_reference(checkpoint, tmp_path_factory):
    # Every slot stored in BF16 (unrotated; the server computes in fp32): the pool, staging,
    # loop groups and slot mapping are exercised with a rounding error only (2^-9 relative).
    ref = _reference_greedy(checkpoint, num_recurrences=8)
    server = _serve(checkpoint, tmp_path_factory, "--rq-recurrences", "8", "--rq-anchor-bits", "16",
                    "--rq-residual-bits", "16", "--rq-rotation", "none", "--chunked-prefill-size",
                    "16")
    try:
        got = server.generate_ids(PROMPTS, NEW_TOKENS)
    finally:
        server.stop()
    for prompt, r, out in zip(PROMPTS, ref, got):
        assert out == r, (prompt, r, out)


def test_rq_pool_default_format_agrees_with_reference(checkpoint, tmp_path_factory):
    import re

    import requests

    from sglang_rq.quality import harness

    gen = torch.Generator().manual_seed(3)
    docs = [torch.randint(3, 512, (160,), generator=gen).tolist() for _ in range(3)]
    server = _serve(checkpoint, tmp_path_factory, "--chunked-prefill-size", "32",
                    "--enable-metrics")
    try:
        got = harness.score_documents(server.url, docs, top_k=1, score_from=40)
        text = requests.get(server.url + "/metrics", timeout=30).text
    finally:
        server.stop()
    # Per (token, core layer, K or V, head), one group of 4 recurrences: INT4 anchor 96/2 +
    # 2*96/32 = 54 B, three INT2 residuals 24 + 6 + 2 = 32 B: 150 B; x 2 x 2 heads x 4 core layers
    # = 2,400; prelude + coda in BF16: 4 x 2 x 2 x 96 x 2 = 3,072.
    assert re.search(r"^sglang_rq_kv_bytes_per_token\S* 5472(\.0)?$", text, re.M), text[:2000]
    model = HuginnReferenceModel.from_pretrained(checkpoint, dtype=torch.float32)
    with torch.no_grad():
        ref = [model(torch.tensor([d]))[0].argmax(-1).tolist() for d in docs]
    # position i (>= 40, read from the compressed cache after the first chunk) predicts token i
    # from tokens < i: the reference's argmax of logits[i - 1].
    pairs = [(max(top, key=top.get), ref_d[i - 1]) for d_top, ref_d in zip(got["top"], ref)
             for i, top in enumerate(d_top, start=40)]
    agreement = sum(a == b for a, b in pairs) / len(pairs)
    print(f"Huginn RQ default vs fp32 reference: teacher-forced top-1 {agreement:.3f} over "
          f"{len(pairs)} positions")
    assert agreement >= 0.8, agreement
