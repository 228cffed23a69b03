"""Commits beside the attention (`RQTokenToKVPool.save` on CUDA, `rq_kernels.commit.ConcurrentCommits`).

A forward's saves are run on two pools, one with its commits on the side stream (the default
on CUDA) and one with ``rq_commits = None`` (every commit in line, as on CPU), eagerly and then
replayed from a CUDA graph many times with new K/V and new destination rows each replay. After
every save the forward frees its K/V and writes other values into fresh tensors of the same
size on the main stream (as the next layer's projections would): a commit that read its inputs
after the main stream reused their memory, or after the next forward overwrote the staging
buffer, would write different bytes. Every buffer of both pools must be equal bit for bit (the
commit kernel is deterministic), and equal to `commit_reference` of the same K/V within its
rounding (codes may differ by fp32 rounding ties only, so that check is on reconstructions).

Skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch

from sglang_rq.config import RQConfig
from sglang_rq.layout import ModelKVShape, kv_slot

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

LAYERS, LOOPS, HEADS, DIM, TOKENS, ROWS = 3, 4, 4, 128, 5, 256


def _pool():
    from sglang_rq.pool import bind_pool_class

    shape = ModelKVShape(num_layers=LAYERS, num_loops=LOOPS, num_kv_heads=HEADS, head_dim=DIM)
    cls = bind_pool_class(cfg=RQConfig(), shape=shape, staging_tokens=TOKENS)
    return cls(size=ROWS, page_size=1, dtype=torch.bfloat16, head_num=HEADS, head_dim=DIM,
               layer_num=LAYERS * LOOPS, device="cuda", enable_memory_saver=False)


def _forward(pool, src: torch.Tensor, loc: torch.Tensor) -> None:
    """Every slot's save in SGLang's order; ``src`` ``[LOOPS, LAYERS, 2, TOKENS, HEADS, DIM]``."""
    for loop in range(LOOPS):
        for layer in range(LAYERS):
            k = src[loop, layer, 0] * 1.0  # fresh tensors, freed after the save
            v = src[loop, layer, 1] * 1.0
            pool.save(kv_slot(loop, layer, LAYERS), k, v, loc)
            del k, v
            for _ in range(4):  # the allocator may hand K/V's memory to these
                torch.full((TOKENS, HEADS, DIM), float("nan"), dtype=torch.bfloat16, device="cuda")
            torch.cuda._sleep(20_000)  # main-stream work the commit may run beside


def test_concurrent_commits_equal_in_line_commits_eager_and_replayed():
    from sglang_rq.reference import commit_reference, dequantize_rows_reference

    side, inline = _pool(), _pool()
    assert side.rq_commits is not None
    inline.rq_commits = None
    gen = torch.Generator(device="cuda").manual_seed(0)

    def batch(i):
        src = torch.randn(LOOPS, LAYERS, 2, TOKENS, HEADS, DIM, device="cuda", generator=gen)
        src[..., 7] *= 30.0  # an outlier channel
        loc = 1 + torch.randperm(ROWS - 1, device="cuda", generator=gen)[:TOKENS]
        return src.to(torch.bfloat16), loc

    src0, loc0 = batch(0)
    for pool in (side, inline):  # eager (also compiles the kernels)
        _forward(pool, src0, loc0)
    torch.cuda.synchronize()
    static_src, static_loc = src0.clone(), loc0.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _forward(side, static_src, static_loc)
    assert not side.rq_commits.pending, "the capture ended with a commit not joined"
    used = {int(r) for r in loc0}
    for i in range(1, 25):
        src, loc = batch(i)
        while used & {int(r) for r in loc}:  # fresh rows each replay, so every replay is kept
            src, loc = batch(i)
        used |= {int(r) for r in loc}
        static_src.copy_(src)
        static_loc.copy_(loc)
        graph.replay()
        _forward(inline, src, loc)
        if i == 24:
            last_src, last_loc = src, loc
    torch.cuda.synchronize()
    for a, b in zip(side.rq_buffers(), inline.rq_buffers(), strict=True):
        assert torch.equal(a, b), "a concurrent commit wrote different bytes than the in-line one"
    # the last replay's rows reconstruct as the reference codec's do (independent of the pool)
    ref = _pool()
    ref.rq_commits = None
    for layer in range(LAYERS):
        t = ref.targets[kv_slot(LOOPS - 1, layer, LAYERS)]
        commit_reference(last_src[:, layer, 0], last_src[:, layer, 1], last_loc, t.view)
        for loop in range(LOOPS):
            slot = kv_slot(loop, layer, LAYERS)
            got = dequantize_rows_reference(side.targets[slot].view, last_loc, side.targets[slot].pos)
            want = dequantize_rows_reference(ref.targets[slot].view, last_loc, ref.targets[slot].pos)
            for g, w in zip(got, want):
                assert (g - w).norm() <= 0.02 * w.norm(), f"layer {layer} loop {loop}"
