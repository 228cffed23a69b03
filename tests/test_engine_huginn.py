"""The SGLang Huginn model (real engine on CPU, BF16 pool) against the plain PyTorch reference.

A random upstream-format checkpoint shaped like Huginn-3.5B at small scale (head_dim 96, 2 prelude
+ 4 core + 2 coda blocks, 4 recurrences: 20 KV slots), both sides in float32, so greedy tokens
must be identical. Prompts of different lengths run in one batch (ragged extend, batched decode).
The ResidualQuant pool cannot hold Huginn's layout yet and must be refused before serving.
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


@pytest.fixture(scope="module")
def reference_tokens(checkpoint):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls on shared cores
    try:
        model = HuginnReferenceModel.from_pretrained(checkpoint, dtype=torch.float32)
        return model.greedy_generate(PROMPTS, NEW_TOKENS)
    finally:
        torch.set_num_threads(threads)


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


def test_rq_pool_refused_before_serving(checkpoint, tmp_path_factory):
    with pytest.raises(RuntimeError) as exc:
        _serve(checkpoint, tmp_path_factory).stop()  # default KV format: ResidualQuant
    message = str(exc.value)
    assert "server exited with 2" in message and "fired up" not in message
    assert "cannot use the ResidualQuant KV pool yet" in message and "--rq-disable" in message
