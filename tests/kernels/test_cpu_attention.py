"""CPU attention over the compressed cache (rq_kernels/cpu_attention.py, the C library) vs its
twin `sglang_rq.reference.extend_attention_reference` (dequantized history, then the request's
own chunk, causal, fp32).

Both sides compute in fp32 from the same stored bytes, so the tolerance is fp32 rounding of a
different summation order (blocked online softmax, rotated basis, LSE merge): 2e-4 relative to
max|ref| elementwise. Sizes are awkward on purpose: GQA 3, head_dim 96 with a random orthogonal
rotation, empty histories, histories that are not a multiple of the 32-token block, chunks that
are not a multiple of the 64-row query tile, loop groups, a 0-bit loop and the anchor first.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from attn_cases import build, queries

from rq_kernels import cpu_attention
from sglang_rq.config import RQConfig
from sglang_rq.reference import extend_attention_reference

# Skip only where there is no C compiler at all; a library that fails to build with one (a
# compile error in the source) must fail these tests, not skip them.
pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC") or "cc") is None,
                                reason="no C compiler (cc) on PATH")

# name, cfg, loops, num_kv_heads, q heads per kv head, head_dim, history lens, chunk lens, rotation
CASES = [
    ("decode_ouro", RQConfig(), 4, 2, 1, 128, [0, 33, 64, 1], [1, 1, 1, 1], "cfg"),
    ("decode_gqa3_d64_norot", RQConfig(rotation="none"), 4, 1, 3, 64, [97, 5], [1, 1], "cfg"),
    ("extend_mixed", RQConfig(), 4, 2, 1, 128, [0, 17, 40], [5, 1, 70], "cfg"),
    ("extend_d96_random_orth", RQConfig(), 4, 1, 2, 96, [31, 15], [3, 130], "rand"),
    ("anchor_first_no_lsq", RQConfig(anchor="first", lsq=False), 4, 2, 1, 64, [45], [1], "cfg"),
    ("loop_groups_8bit", RQConfig(loop_group_size=2, residual_bits=8), 4, 1, 2, 64, [50, 3],
     [2, 1], "cfg"),
    ("zero_bit_residual", RQConfig(residual_bits=0), 4, 1, 1, 64, [29], [4], "cfg"),
    ("single_loop", RQConfig(), 1, 2, 1, 64, [70], [1], "cfg"),
    # as many query rows as requests, but not one each: an extend batch, not decode
    ("extend_empty_chunk", RQConfig(), 4, 1, 2, 64, [5, 10], [0, 2], "cfg"),
    ("extend_empty_chunks_3", RQConfig(), 4, 1, 1, 64, [7, 4, 9], [0, 3, 0], "cfg"),
]


@pytest.mark.parametrize("name,cfg,loops,hkv,group,dim,hist,chunks,rot", CASES,
                         ids=[c[0] for c in CASES])
def test_cpu_attention_matches_twin(name, cfg, loops, hkv, group, dim, hist, chunks, rot):
    view, kv_ind, idx, _ = build(cfg, loops=loops, num_kv_heads=hkv, group=group, dim=dim,
                                 lens=hist, rot=rot, device="cpu", seed=7)
    assert cpu_attention.fallback_reason(view) is None, (
        f"the C path must serve this format: {cpu_attention.library_error()}")
    qp = [0]
    for n in chunks:
        qp.append(qp[-1] + n)
    qo = torch.tensor(qp, dtype=torch.int32)
    q, kc, vc = queries(qp[-1], hkv * group, hkv, dim, device="cpu", seed=7)
    q, kc, vc = q.float(), kc.float(), vc.float()
    scale = dim ** -0.5
    for loop in range(loops):
        out = torch.full_like(q, float("nan"))
        cpu_attention.extend_attention_cpu(q, kc, vc, view, loop, qo, kv_ind, idx,
                                           sm_scale=scale, out=out)
        ref = extend_attention_reference(q, kc, vc, view, loop, qo, kv_ind, idx, sm_scale=scale)
        assert torch.isfinite(out).all(), f"loop {loop}: NaN/inf or unwritten output"
        err = (out - ref).abs().max().item()
        assert err <= 2e-4 * ref.abs().max().item(), f"loop {loop}: max error {err}"


def test_bf16_inputs_return_bf16_and_match():
    view, kv_ind, idx, _ = build(RQConfig(), loops=4, num_kv_heads=2, group=2, dim=128,
                                 lens=[40, 9], rot="cfg", device="cpu", seed=3)
    q, kc, vc = queries(2, 4, 2, 128, device="cpu", seed=3)  # bf16, decode shape
    qo = torch.tensor([0, 1, 2], dtype=torch.int32)
    out = cpu_attention.extend_attention_cpu(q, kc, vc, view, 2, qo, kv_ind, idx,
                                             sm_scale=0.1)
    ref = extend_attention_reference(q.float(), kc, vc, view, 2, qo, kv_ind, idx, sm_scale=0.1)
    assert out.dtype == torch.bfloat16
    # bf16 output rounding: half an ulp of bf16 at the largest value
    assert (out.float() - ref).abs().max().item() <= 2 ** -8 * ref.abs().max().item()


def test_unsupported_format_is_refused_saying_why():
    cfg = RQConfig(anchor_bits=16)  # a 16-bit anchor is not a fused format
    view, kv_ind, idx, _ = build(cfg, loops=2, num_kv_heads=1, group=1, dim=64, lens=[6],
                                 rot="cfg", device="cpu", seed=1)
    assert "16 bits" in cpu_attention.fallback_reason(view)
    assert "16 bits" in cpu_attention.commit_fallback_reason(view)
    q, kc, vc = (t.float() for t in queries(1, 1, 1, 64, device="cpu", seed=1))
    qo = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="extend_attention_cpu cannot serve .*16 bits"):
        cpu_attention.extend_attention_cpu(q, kc, vc, view, 0, qo, kv_ind, idx, sm_scale=0.125)
    k = torch.zeros(2, 1, 1, 64)
    with pytest.raises(ValueError, match="commit_cpu cannot serve .*16 bits"):
        cpu_attention.commit_cpu(k, k, torch.tensor([1]), view)


def test_bad_shapes_raise_naming_the_tensors():
    view, kv_ind, idx, _ = build(RQConfig(), loops=4, num_kv_heads=2, group=1, dim=64, lens=[3],
                                 rot="cfg", device="cpu", seed=1)
    q = torch.zeros(1, 3, 64)  # 3 query heads over 2 KV heads
    kc = vc = torch.zeros(1, 2, 64)
    with pytest.raises(ValueError, match="k_cur"):
        cpu_attention.extend_attention_cpu(q, kc, vc, view, 0, torch.tensor([0, 1]), kv_ind, idx,
                                           sm_scale=1.0)


def test_bad_indices_raise_naming_the_tensor_before_any_write():
    # the C library reads and writes pool rows by these indices: each bad one is a ValueError
    # naming the tensor (it was a segmentation fault or heap corruption), and nothing is written
    from views import make_view

    view, kv_ind, idx, _ = build(RQConfig(), loops=4, num_kv_heads=1, group=1, dim=64,
                                 lens=[3, 2], rot="cfg", device="cpu", seed=1)
    rows = view.codes[0].shape[0]
    q, kc, vc = (t.float() for t in queries(2, 1, 1, 64, device="cpu", seed=1))
    qo = torch.tensor([0, 1, 2])
    bad = {
        "kv_indices": (qo, kv_ind, torch.cat([idx[:-1], torch.tensor([rows])])),
        "kv_indices ": (qo, kv_ind, torch.cat([idx[:-1], torch.tensor([-1])])),
        "kv_indptr": (qo, torch.tensor([0, 3, len(idx) + 1]), idx),
        "kv_indptr ": (qo, torch.tensor([0, 4, 3]), idx),
        "qo_indptr": (torch.tensor([0, 1, 3]), kv_ind, idx),
        "qo_indptr ": (torch.tensor([0, 2, 1]), kv_ind, idx),
    }
    for name, (qo_b, kv_b, idx_b) in bad.items():
        with pytest.raises(ValueError, match=name.strip()):
            cpu_attention.extend_attention_cpu(q, kc, vc, view, 0, qo_b, kv_b, idx_b,
                                               sm_scale=0.125)
    fresh = make_view(RQConfig(), num_loops=4, num_kv_heads=1, head_dim=64, rows=8,
                      rotation="cfg", fill=False)
    k = torch.randn(4, 3, 1, 64)
    for loc, match in ((torch.tensor([1, 2, 8]), r"loc holds a pool row outside \[0, 8\)"),
                       (torch.tensor([1, 2, -1]), "loc holds a pool row outside"),
                       (torch.tensor([1, 2]), r"loc must be \[3\] integer"),
                       (torch.tensor([1.0, 2.0, 3.0]), "loc must be integer .* torch.float32"),
                       (torch.tensor([True, False, True]), "loc must be integer .* torch.bool")):
        with pytest.raises(ValueError, match=match):
            cpu_attention.commit_cpu(k, k, loc, fresh)
    with pytest.raises(ValueError, match="got 2 loops of K/V for a view of 4"):
        cpu_attention.commit_cpu(k[:2], k[:2], torch.tensor([1, 2, 3]), fresh)
    # the review of the fix: a K/V of other heads or head_dim wrote rows beyond loc
    for shape in ((4, 3, 2, 64), (4, 3, 1, 128)):
        with pytest.raises(ValueError, match="for a view of 1 KV heads x head_dim 64"):
            cpu_attention.commit_cpu(torch.randn(shape), torch.randn(shape),
                                     torch.tensor([5, 6, 7]), fresh)
    q4, kc4, vc4 = (t.float() for t in queries(2, 4, 4, 64, device="cpu", seed=1))
    with pytest.raises(ValueError, match="the view's 1 KV heads of head_dim 64 do not match"):
        cpu_attention.extend_attention_cpu(q4, kc4, vc4, view, 0, qo, kv_ind, idx, sm_scale=0.1)
    with pytest.raises(ValueError, match="kv_indptr must be integer .* torch.float32"):
        cpu_attention.extend_attention_cpu(q, kc, vc, view, 0, qo, kv_ind.float(), idx,
                                           sm_scale=0.125)
    assert not any(t.any() for t in fresh.codes), "a refused commit wrote rows"


# name, cfg, loops, num_kv_heads, head_dim, tokens, rotation
COMMIT_CASES = [
    ("ouro", RQConfig(), 4, 2, 128, 37, "cfg"),
    ("d96_random_orth", RQConfig(), 4, 1, 96, 13, "rand"),
    ("no_rotation_no_lsq", RQConfig(rotation="none", lsq=False), 4, 2, 64, 9, "cfg"),
    ("anchor_first_groups", RQConfig(anchor="first", loop_group_size=2), 4, 1, 64, 11, "cfg"),
    ("chained_8_and_0_bit", RQConfig(anchor="chained", loop_bits=(8, 0, 2, 4)), 4, 1, 64, 7, "cfg"),
    ("group16_4bit", RQConfig(group_size=16, residual_bits=4), 2, 3, 32, 5, "cfg"),
]


@pytest.mark.parametrize("name,cfg,loops,hkv,dim,tokens,rot", COMMIT_CASES,
                         ids=[c[0] for c in COMMIT_CASES])
def test_cpu_commit_matches_twin(name, cfg, loops, hkv, dim, tokens, rot):
    from rq_kernels.testing import loop_kv, random_orthogonal
    from views import make_view
    from sglang_rq.reference import commit_reference, dequantize_rows_reference

    rotation = random_orthogonal(hkv, dim, seed=5) if rot == "rand" else rot
    mine, twin = (make_view(cfg, num_loops=loops, num_kv_heads=hkv, head_dim=dim,
                            rows=tokens + 5, rotation=rotation, fill=False) for _ in range(2))
    assert cpu_attention.commit_fallback_reason(mine) is None
    k, v = loop_kv(loops, tokens, hkv, dim, seed=9, group_size=cfg.group_size)
    loc = torch.randperm(tokens + 4, generator=torch.Generator().manual_seed(2))[:tokens] + 1
    cpu_attention.commit_cpu([*k], [*v], loc, mine)  # per-loop tensors, as the pool passes
    commit_reference(k, v, loc, twin)
    # Every byte equal, except tie flips of c (the LSQ dot products are summed in another
    # order; measured: 0 bytes in every case here, 16 of 3.1M at 2,000 tokens x 4 heads x 128):
    # at most 1% of rows may differ, the others reconstruct identically.
    differ = torch.zeros(tokens + 5, dtype=torch.bool)
    for bufs in ("codes", "scale_offset", "coef"):
        for a, b in zip(getattr(mine, bufs), getattr(twin, bufs)):
            if a is not None:
                differ |= (a != b).reshape(a.shape[0], -1).any(-1)
    assert differ.float().mean().item() <= 0.01, f"{int(differ.sum())} rows differ"
    same = ~differ[loc]
    for loop in range(loops):
        km, vm = dequantize_rows_reference(mine, loc, loop)
        kt, vt = dequantize_rows_reference(twin, loc, loop)
        for a, b in ((km, kt), (vm, vt)):
            assert torch.equal(a[same], b[same]), f"{name} loop {loop}"
            # a flipped c moves a row by about one bf16 step of c times the base
            assert (a - b).abs().max().item() <= 0.02 * b.abs().max().item(), f"{name} loop {loop}"
    untouched = torch.ones(tokens + 5, dtype=torch.bool)
    untouched[loc] = False
    for a in mine.codes:
        assert not a[untouched].any(), "rows outside loc were written"
