"""The SGLang Ouro model (real engine on CPU, BF16 pool) against the plain PyTorch reference.

Both run in float32 on the same random upstream-format checkpoint, so greedy tokens must be
identical (the checkpoint's logits have clear margins; see `random_state_dict`). Prompts of
different lengths are decoded together in one batch, so ragged extend and batched decode are
covered; the RQ pool runs the same batch and must stay finite and close.
"""

from __future__ import annotations

import pytest
import torch

from sglang_rq.models.ouro_reference import OuroReferenceModel, tiny_config, write_random_checkpoint
from tests.server import Server

pytestmark = pytest.mark.engine

PROMPTS = [[5, 17, 300, 42], [9] * 13, list(range(100, 137)), [1, 2]]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ouro-random")
    write_random_checkpoint(path, tiny_config(vocab_size=512, hidden_size=128, num_attention_heads=4,
                                              num_key_value_heads=2, head_dim=32), seed=1)
    return path


@pytest.fixture(scope="module")
def reference_tokens(checkpoint):
    model = OuroReferenceModel.from_pretrained(checkpoint, dtype=torch.float32)
    return model.greedy_generate(PROMPTS, NEW_TOKENS)


def _serve(checkpoint, tmp_path_factory, *extra):
    log = tmp_path_factory.mktemp("logs") / "server.log"
    return Server(["--model-path", str(checkpoint), "--dtype", "float32", "--skip-tokenizer-init",
                   "--max-total-tokens", "4096", "--rq-no-canary", *extra], log)


def test_sglang_ouro_matches_reference_greedy(checkpoint, reference_tokens, tmp_path_factory):
    server = _serve(checkpoint, tmp_path_factory, "--rq-disable")
    try:
        got = server.generate_ids(PROMPTS, NEW_TOKENS)
    finally:
        server.stop()
    for prompt, ref, out in zip(PROMPTS, reference_tokens, got):
        assert out == ref, (prompt, ref, out)


def test_rq_pool_on_random_checkpoint_agrees_mostly(checkpoint, reference_tokens, tmp_path_factory):
    server = _serve(checkpoint, tmp_path_factory, "--rq-anchor-bits", "8", "--rq-residual-bits", "8")
    try:
        got = server.generate_ids(PROMPTS, NEW_TOKENS)
        assert "sglang-rq: cell size" in server.log()
    finally:
        server.stop()
    same = sum(a == b for r, o in zip(reference_tokens, got) for a, b in zip(r, o))
    rate = same / (len(PROMPTS) * NEW_TOKENS)
    print(f"INT8 RQ pool vs fp32 reference, greedy token agreement: {rate:.3f}")
    assert rate >= 0.75
