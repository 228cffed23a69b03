"""Saturated FP8 scale/offset fields through the reference codec (issue 13 item 2), counts
hand-derived; no server.

One K head of ``D = 128`` with a single outlier ``a`` at coordinate ``j`` (V = 0), one loop
(the 4-bit anchor, 15 levels), groups of 32, Hadamard rotation ``R = H / sqrt(128)`` with the
Sylvester entries ``H[j, k] = (-1)^popcount(j & k)``. ``x @ R = a / sqrt(128) * H[j, :]``:

* ``j = 5``: every group of 32 holds both signs, min = -a/sqrt(128). The offset is
  ``fp8_down(min)``; the FP8 values next to -448 are -416 and -448, so the offset field is -448
  (counted) iff a/sqrt(128) > 416, i.e. a > 4,705.6: 0 groups for 1e3 and 4.6e3 (406.6), all
  4 for 5e3 (441.9, at the limit but not yet clipped), 1e4 and 1e5;
* ``j = 0``: row 0 is all +1, so each group is constant a/sqrt(128) > 0: offset =
  fp8_down(min(v, 448)) never reaches -448, and the scale (v - 448)/15 reaches the FP8 value
  before 448 (416) only for v > 448 + 15*416 = 6,688, i.e. a > 75,659: 0 groups for 1e4, all 4
  for 1e5 (v = 8,838.8).
"""

from __future__ import annotations

import logging

import pytest
import torch

from sglang_rq.clipping import ClipCounter, saturated_groups
from sglang_rq.config import RQConfig
from sglang_rq.layout import ModelKVShape, loop_segments
from sglang_rq.reference import encode

D, G = 128, 32


def _hadamard() -> torch.Tensor:
    idx = torch.arange(D)
    bits = torch.tensor([[bin(int(j) & int(k)).count("1") for k in idx] for j in idx])
    return ((-1.0) ** bits / D**0.5).float()


@pytest.mark.parametrize("j,a,expected", [
    (5, 1e3, 0), (5, 4.6e3, 0), (5, 5e3, 4), (5, 1e4, 4), (5, 1e5, 4), (5, -1e4, 4),
    (0, 1e4, 0), (0, 1e5, 4),
])
def test_single_outlier_saturated_groups(j, a, expected):
    cfg = RQConfig()
    assert (cfg.rotation, cfg.rotate_anchor, cfg.group_size, cfg.anchor_bits) == \
        ("hadamard", True, G, 4)
    segs = loop_segments(ModelKVShape(num_layers=1, num_loops=1, num_kv_heads=1, head_dim=D),
                         cfg)
    x = torch.zeros(1, 1, 1, D)  # [num_loops, num_tokens, num_kv_heads, head_dim]
    x[0, 0, 0, j] = a
    (stored,) = encode(x, segments=segs, cfg=cfg, rotation=_hadamard().unsqueeze(0))
    assert stored.scale_offset.shape == (1, 1, D // G, 2)
    assert int(saturated_groups(stored.scale_offset).sum()) == expected


def test_counter_per_layer_and_first_log(caplog):
    c = ClipCounter(num_layers=3, num_loops=4, device="cpu")
    # [n, K/V, H, D/g, (scale, offset)]
    scale_offset = torch.zeros(2, 2, 1, 4, 2, dtype=torch.uint8)
    scale_offset[0, 0, 0, 1, 1] = 0xFE  # offset -448
    scale_offset[1, 1, 0, 3, 0] = 0x7E  # scale 448
    scale_offset[1, 1, 0, 2, 0] = 0x7D  # scale 416: not at the limit
    with caplog.at_level(logging.WARNING, logger="sglang_rq.clipping"):
        c.add(layers=torch.tensor([1]), loop=2, scale_offset_rows=scale_offset[None])
        assert c.flush(force=True) == [0, 2, 0]
        c.add(layers=torch.tensor([1]), loop=3, scale_offset_rows=scale_offset[None])
        assert c.flush(force=True) == [0, 4, 0]
        # several layers at once: row i counts for layers[i] (here layer 2 gets row 0's 2)
        c.add(layers=torch.tensor([2, 0]), loop=0,
              scale_offset_rows=torch.stack([scale_offset, torch.zeros_like(scale_offset)]))
        assert c.flush(force=True) == [0, 4, 2]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2  # first occurrence per layer only
    assert "layer 1" in warnings[0] and "loop(s) [2]" in warnings[0]
    assert "layer 2" in warnings[1] and "loop(s) [0]" in warnings[1]


def test_capture_warmup_counts_are_discarded():
    """GPU finding (2026-12-01): SGLang's eager warm-ups before decode-graph capture committed
    dummy K/V of an outlier layer, 480 saturated groups that no request had."""
    c = ClipCounter(num_layers=2, num_loops=1, device="cpu")
    # 3 rows x 2 x 4 groups at the limit
    scale_offset = torch.full((3, 2, 1, 4, 2), 0x7E, dtype=torch.uint8)
    counts = c.counts
    c.capture_warmup()
    c.add(layers=torch.tensor([0]), loop=0, scale_offset_rows=scale_offset[None])
    c.serving()  # first real forward
    assert c.flush(force=True) == [0, 0]
    c.add(layers=torch.tensor([1]), loop=0, scale_offset_rows=scale_offset[None, :1])
    c.serving()  # later forwards keep their counts
    assert c.flush(force=True) == [0, 8]
    assert c.counts is counts  # graphs that recorded the tensor keep counting into it


@pytest.mark.parametrize("prelude,core,coda,outliers", [
    (0, 3, 0, [(1, 3)]),                   # Ouro-like: layer 1's anchor (loop 3, the last)
    (1, 2, 1, [(0, 0), (2, 3), (3, 0)]),   # Huginn-like: prelude, core layer 1's anchor, coda
], ids=["looped", "prelude_core_coda"])
def test_pool_counts_one_forward_per_layer_and_loop(prelude, core, coda, outliers):
    """Through the pool: one forward saves every slot and the count runs once, after the last
    slot. At each (physical layer, loop) in ``outliers`` K holds the ``j = 5``, ``a = 1e4``
    outlier of the module docstring in KV head 0 of each of 5 tokens: 4 saturated groups per
    token there (20), nothing anywhere else (other slots have ordinary K, V = 0; a layer's
    residual loops stay ordinary: their LSQ coefficient against the outlier anchor is ~0). The
    prelude and coda are their own stack (one loop), numbered around the core's layers."""
    from sglang_rq.pool import bind_pool_class

    loops, heads, n = 4, 2, 5
    shape = ModelKVShape(num_layers=core, num_loops=loops, num_kv_heads=heads, head_dim=D,
                         prelude_layers=prelude, coda_layers=coda)
    cls = bind_pool_class(cfg=RQConfig(unlooped_bits=4), shape=shape, staging_tokens=8)
    pool = cls(size=16, page_size=1, dtype=torch.bfloat16, head_num=heads, head_dim=D,
               layer_num=shape.num_slots, device="cpu", enable_memory_saver=False)
    loc = torch.arange(1, n + 1)
    ordinary = torch.randn(n, heads, D, generator=torch.Generator().manual_seed(0))
    v = torch.zeros(n, heads, D)
    for slot, place in enumerate(shape.slot_places()):  # SGLang's call order: slot ids ascending
        k = ordinary.clone()
        if (place.block, place.loop) in outliers:
            k[:, 0, 5] = 1e4
        pool.save(slot, k.to(torch.bfloat16), v.to(torch.bfloat16), loc)
    expected = torch.zeros(prelude + core + coda, loops, dtype=torch.int64)
    for block, loop in outliers:
        expected[block, loop] = n * (D // G)
    assert torch.equal(pool.rq_clip.counts, expected), pool.rq_clip.counts
