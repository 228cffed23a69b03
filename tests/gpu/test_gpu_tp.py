"""Tensor parallelism with the ResidualQuant pool on two GPUs (the embedded mini-Ouro: 4 KV heads,
2 per rank).

- Each rank's pool holds its own KV heads: the capacity at a fixed per-rank budget is the budget
  over the per-rank cell (hand-derived here: half of TP = 1's bytes per token), so TP = 2 holds
  about twice the tokens of TP = 1 (the staging buffer, also halved, is subtracted first).
- Greedy tokens at TP = 2 equal TP = 1 up to TP = 1's first near-tie (same kernels; only the
  all-reduce's summation order differs).

Skipped with fewer than two CUDA devices.
"""

from __future__ import annotations

import pytest
import torch

from tests.embedded_greedy import NEW_TOKENS, greedy_mismatches, prompt_ids
from tests.server import Server

pytestmark = [pytest.mark.gpu, pytest.mark.engine,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]

BUDGET_GB = 0.25
COMMON = ["--rq-no-canary", "--enable-metrics", "--rq-kv-budget-gb", str(BUDGET_GB),
          "--mem-fraction-static", "0.3", "--max-running-requests", "32",
          "--chunked-prefill-size", "1024", "--cuda-graph-max-bs-decode", "32"]
# mini-Ouro, default format: per (token, layer, K/V, head) 72 + 3 * 42 bytes over 4 loops
LAYERS, HEADS, LOOPS, D = 4, 4, 4, 128
CELL_TP1 = LAYERS * 2 * HEADS * (72 + 3 * 42)
STAGING_TOKENS = 1024  # max(chunk 1024, running 32)


def _staging_bytes(heads: int) -> int:
    return (LOOPS - 1) * LAYERS * STAGING_TOKENS * 2 * heads * D * 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    logs = tmp_path_factory.mktemp("gpu-tp")
    out = {}
    for tp in (1, 2):
        server = Server(COMMON + ["--tp-size", str(tp)], logs / f"tp{tp}.log")
        try:
            out[tp] = {"greedy": server.generate_greedy(prompt_ids(), NEW_TOKENS),
                       "capacity": int(server.metric("sglang:max_total_num_tokens"))}
        finally:
            server.stop()
    return out


def test_capacity_is_per_rank(runs):
    budget = int(BUDGET_GB * (1 << 30))
    for tp in (1, 2):
        heads = HEADS // tp
        cell = CELL_TP1 // tp
        expected = (budget - _staging_bytes(heads) - LAYERS * heads * D * D * 4) // cell
        got = runs[tp]["capacity"]
        # SGLang rounds the pool down to whole pages and keeps a few reserved slots
        assert expected - 64 <= got <= expected, (tp, got, expected)


def test_tp2_greedy_matches_tp1(runs):
    """Equal tokens up to TP = 1's first near-tie (tests/embedded_greedy.py)."""
    (ref, ref_margins), (got, _) = runs[1]["greedy"], runs[2]["greedy"]
    assert not greedy_mismatches(got, ref, ref_margins)
