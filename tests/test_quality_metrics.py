"""Quality metrics and the named KV formats, on hand-computable cases."""

from __future__ import annotations

import math

import pytest
import torch

from sglang_rq import layout
from sglang_rq.layout import ModelKVShape
from sglang_rq.quality import data, ladder, metrics

MINI_OURO = ModelKVShape(num_layers=4, num_loops=4, num_kv_heads=4, head_dim=128)


def _topk(probs: list[float]) -> dict[int, float]:
    return {i: math.log(p) for i, p in enumerate(probs) if p > 0}


def test_perplexity_of_uniform_guess_is_vocab_size():
    assert metrics.perplexity([math.log(1 / 4)] * 7) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        metrics.perplexity([])


def test_kl_hand_values():
    p = _topk([0.5, 0.25, 0.25])
    assert metrics.topk_kl(p, p) == pytest.approx(0.0, abs=1e-12)
    # KL = 0.5 ln(0.5/0.25) + 0.25 ln(1) + 0.25 ln(0.25/0.5) = 0.25 ln 2
    assert metrics.topk_kl(p, _topk([0.25, 0.25, 0.5])) == pytest.approx(0.25 * math.log(2))


def test_kl_exact_at_full_vocab_and_lower_bound_when_truncated():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        lp = torch.log_softmax(3 * torch.randn(37, generator=g, dtype=torch.float64), 0)
        lq = torch.log_softmax(lp + 0.7 * torch.randn(37, generator=g, dtype=torch.float64), 0)
        exact = float((lp.exp() * (lp - lq)).sum())
        full_p = {i: float(v) for i, v in enumerate(lp)}
        full_q = {i: float(v) for i, v in enumerate(lq)}
        assert metrics.topk_kl(full_p, full_q) == pytest.approx(exact, rel=1e-9)
        for k in (1, 5, 20):
            tp = dict(sorted(full_p.items(), key=lambda kv: -kv[1])[:k])
            tq = dict(sorted(full_q.items(), key=lambda kv: -kv[1])[:k])
            assert 0.0 <= metrics.topk_kl(tp, tq) <= exact + 1e-12


def test_top1_agreement_and_greedy_metrics():
    a = [_topk([0.6, 0.4]), _topk([0.1, 0.9]), _topk([0.5, 0.3, 0.2])]
    b = [_topk([0.7, 0.3]), _topk([0.8, 0.2]), _topk([0.4, 0.35, 0.25])]
    assert metrics.top1_agreement(a, a) == 1.0
    assert metrics.top1_agreement(a, b) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        metrics.top1_agreement(a, b[:2])
    assert metrics.first_difference([5, 6, 7, 8], [5, 6, 9, 8]) == 2
    assert metrics.first_difference([5, 6], [5, 6, 7]) == 2
    # 4-grams of 1,2,3,4,1,2,3,4: 5 grams, 4 distinct -> 1 - 4/5
    assert metrics.repetition_rate([1, 2, 3, 4, 1, 2, 3, 4]) == pytest.approx(0.2)
    assert metrics.repetition_rate(list(range(100))) == 0.0
    assert metrics.repetition_rate([7] * 3) == 0.0


@pytest.mark.parametrize("name,bits", [
    # bits per element = (codes + FP8 scale/offset per 32 + BF16 c) / 128, averaged over 4 loops
    ("direct-int2", 2 + 16 / 32),
    ("direct-int4", 4 + 16 / 32),
    ("residual-int2", 2 + 16 / 32),
    ("residual-int2-lsq", (40 + 3 * 42) * 8 / (4 * 128)),  # INT2 anchor 32+8 B, residual +2 B c
    ("default", (72 + 3 * 42) * 8 / (4 * 128)),
    ("share-lsq", (72 + 3 * 2) * 8 / (4 * 128)),
    ("share", 72 * 8 / (4 * 128)),
])
def test_named_formats_effective_bits(name, bits):
    cfg = ladder.rq_config(ladder.flags_for(name))
    assert layout.effective_bits(MINI_OURO, cfg) == pytest.approx(bits)


def test_huginn_head_to_head_formats_bytes_per_token():
    # mini-Huginn: D = 96, 2 KV heads, 2 core layers x 32 recurrences, 1 prelude + 1 coda layer.
    # Per (token, layer, K or V, head): BF16 vector 192 B, INT4 anchor 48 + 6 = 54 B, INT8 anchor
    # 96 + 6 = 102 B, INT2 residual 24 + 6 + 2 = 32 B, 0-bit residual (c only) 2 B.
    shape = layout.ModelKVShape(num_layers=2, num_loops=32, num_kv_heads=2, head_dim=96,
                                prelude_layers=1, coda_layers=1, default_loop_group=4)
    per = 2 * 2  # K and V, 2 heads
    unlooped_bf16 = 2 * per * 192
    expected = {
        "bf16": 66 * per * 192,
        "huginn-sharing": 2 * per * 192 + unlooped_bf16,  # one slot per core layer
        "share-int4-g32": 2 * per * (54 + 31 * 2) + unlooped_bf16,
        "share-int8-g32": 2 * per * (102 + 31 * 2) + unlooped_bf16,
        "share-int4-g8-u4": 2 * per * 4 * (54 + 7 * 2) + 2 * per * 54,
        "g2": 2 * per * 16 * (54 + 32) + unlooped_bf16,
        "g4": 2 * per * 8 * (54 + 3 * 32) + unlooped_bf16,
        "g8": 2 * per * 4 * (54 + 7 * 32) + unlooped_bf16,
        "g32": 2 * per * (54 + 31 * 32) + unlooped_bf16,
    }
    for name, nbytes in expected.items():
        cfg = ladder.rq_config(ladder.flags_for(name))
        assert layout.kv_bytes_per_token(shape, cfg) == nbytes, name


def test_format_names_resolve():
    assert ladder.resolve("ladder") == ["bf16", *ladder.LADDER]
    assert ladder.resolve("default,direct-int2")[0] == "bf16"
    assert set(ladder.resolve("all")) == set(ladder.FORMATS) - set(ladder.HUGINN)
    assert ladder.resolve("huginn") == ["bf16", *ladder.HUGINN]
    for name in ladder.FORMATS:  # every named format is a valid configuration
        ladder.rq_config(ladder.flags_for(name))
    with pytest.raises(ValueError, match="--formats"):
        ladder.resolve("default,int3")


def test_documents_are_consecutive_windows():
    class Tok:
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

    data_dir = data.data_dir_with("wikitext2")
    if data_dir is None:
        pytest.skip("no data directory with wikitext2 (SGLANG_RQ_DATA_DIR or ../shared/data)")
    docs = data.documents("wikitext2", data_dir, Tok(), num_docs=3, doc_tokens=50, bos_id=0)
    text = data.load_text("wikitext2", data_dir)
    assert [len(d) for d in docs] == [51] * 3
    assert "".join(chr(c) for d in docs for c in d[1:]) == text[:150]
    with pytest.raises(ValueError, match="--docs"):
        data.documents("wikitext2", data_dir, Tok(), num_docs=10**6, doc_tokens=50, bos_id=0)
    with pytest.raises(ValueError, match="--datasets"):
        data.load_text("c4", data_dir)
