"""Wiring of the ``rq_triton`` backend (plan once per forward, kernels per layer x loop) on CPU.

The Triton kernels run under ``TRITON_INTERPRET=1`` inside a real SGLang server; greedy tokens
are compared with the ``rq_native`` backend (reference codec + bf16 SDPA) on the same random
checkpoint and KV format. Both read the same compressed bytes; they differ in summation order
and precision (fp32 accumulation in the kernels, bf16 SDPA), so one greedy flip followed by a
diverged continuation is possible (measured: 0.833 = 15 of 18 tokens). A wiring error (wrong
slot, loop, layer or index plan) instead gives chance-level agreement after the first token on
random weights (1/512 per token), so the bar is a majority of tokens, as for the RQ-vs-BF16
check of the embedded model.
"""

from __future__ import annotations

import pytest

from sglang_rq.models.ouro_reference import tiny_config, write_random_checkpoint
from tests.server import Server

pytestmark = pytest.mark.engine

PROMPTS = [[5, 17, 300, 42, 8, 9, 10], [9] * 19, [1, 2, 3]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ouro-random-triton")
    write_random_checkpoint(path, tiny_config(vocab_size=512, hidden_size=128, num_attention_heads=4,
                                              num_key_value_heads=2, head_dim=32), seed=2)
    return path


def _tokens(checkpoint, tmp_path_factory, backend, env=None):
    log = tmp_path_factory.mktemp("logs") / f"{backend}.log"
    server = Server(["--model-path", str(checkpoint), "--skip-tokenizer-init", "--max-total-tokens",
                     "2048", "--attention-backend", backend, "--rq-no-canary"], log, env=env)
    try:
        return server.generate_ids(PROMPTS, 6), server.log()
    finally:
        server.stop()


def test_rq_triton_matches_rq_native(checkpoint, tmp_path_factory):
    native, _ = _tokens(checkpoint, tmp_path_factory, "rq_native")
    triton, log = _tokens(checkpoint, tmp_path_factory, "rq_triton", env={"TRITON_INTERPRET": "1"})
    same = sum(a == b for x, y in zip(native, triton) for a, b in zip(x, y))
    rate = same / sum(len(x) for x in native)
    print(f"rq_triton (interpreted) vs rq_native greedy agreement: {rate:.3f}")
    assert all(len(t) == 6 for t in triton)
    assert rate > 0.5
