"""Decode attention on tensor cores vs "reference dequantization + fp32 attention".

Tolerance policy: the same as tests/kernels/test_decode.py (flash-attn rule). For the max-abs
error and for the Frobenius norm of the error against `decode_attention_reference`,

    err(kernel) <= 2 * err(bf16 SDPA on the same dequantized K/V) + floor,

with floor = one bf16 ulp of max|ref| (max error) and 1e-3 * ||ref|| (Frobenius). The output
is NaN-poisoned first, so an unwritten element fails. On CPU the kernel runs under
TRITON_INTERPRET=1 (plain integer unpacking instead of the PTX, the same MMA arithmetic).
"""

from __future__ import annotations

import pytest
import torch
from attn_cases import build, history, queries

from rq_kernels.decode_tc import TCLaunch, decode_attention_tc, tc_unsupported_reason
from rq_kernels.testing import attention_errors, sdpa_bf16, within_policy
from sglang_rq.config import RQConfig
from sglang_rq.reference import decode_attention_reference

H12 = RQConfig(anchor="first", lsq=False, anchor_bits=8, residual_bits=4)
CPU_CASES = [  # name, cfg, loops, num_kv_heads, group, head_dim, history lens, rotation, loop ids
    ("ouro_mha_mixed", RQConfig(), 4, 2, 1, 128, [1, 15, 17], "cfg", (0, 3)),
    ("ouro_mha_97", RQConfig(), 4, 1, 1, 128, [97], "cfg", (1,)),
    ("smollm_gqa3_norot", RQConfig(rotation="none"), 4, 2, 3, 64, [17, 0, 97], "cfg", (0, 3)),
    ("d96_random_orth_gqa3", RQConfig(), 4, 1, 3, 96, [15, 1, 17], "rand", (2,)),
    ("d96_h12_first_nolsq_a8r4", H12, 3, 2, 1, 96, [17], "cfg", (0, 2)),
    ("single_loop", RQConfig(), 1, 2, 1, 64, [1, 15, 17], "cfg", (0,)),
    ("gqa8_d64", RQConfig(), 2, 1, 8, 64, [33, 2], "cfg", (0, 1)),
    ("group16_gqa2", RQConfig(group_size=16), 3, 1, 2, 64, [19], "cfg", (0, 2)),
    ("group64_shared_loop", RQConfig(group_size=64, loop_bits=(0, 2, 4)), 3, 1, 1, 128, [21],
     "cfg", (0, 1, 2)),
    ("a2_anchor_r8", RQConfig(anchor_bits=2, residual_bits=8), 2, 1, 1, 64, [18], "cfg", (0, 1)),
]
GPU_CASES = [
    ("ouro_mixed", RQConfig(), 4, 16, 1, 128, [1, 4097, 8191], "cfg", (0, 3)),
    ("ouro_b8", RQConfig(), 4, 16, 1, 128, [2048 + 13 * i for i in range(8)], "cfg", (2,)),
    ("smollm_gqa3", RQConfig(), 4, 3, 3, 64, [1, 15, 2049, 5003], "cfg", (0, 3)),
    ("huginn_d96", RQConfig(), 4, 8, 1, 96, [97, 3001], "cfg", (1, 3)),
    ("d128_random_orth_gqa2", RQConfig(), 4, 4, 2, 128, [777, 1], "rand", (0,)),
    ("d64_a8r4_first", H12, 3, 4, 1, 64, [1000, 33], "cfg", (0, 2)),
]


def _run(cfg, loops, hkv, group, dim, lens, rot, loop_ids, device, seed, launch=None):
    view, ind, idx, slots = build(cfg, loops=loops, num_kv_heads=hkv, group=group, dim=dim,
                                  lens=lens, rot=rot, device=device, seed=seed)
    assert tc_unsupported_reason(view, group) is None, tc_unsupported_reason(view, group)
    b = len(lens)
    q, kc, vc = queries(b, hkv * group, hkv, dim, device=device, seed=seed)
    scale = dim ** -0.5
    for loop in loop_ids:
        out = torch.full_like(q, float("nan"))
        decode_attention_tc(q, kc, vc, view, loop, ind, idx, sm_scale=scale, out=out,
                            launch=launch)
        ref = decode_attention_reference(q.float(), kc, vc, view, loop, ind, idx, sm_scale=scale)
        kh, vh = history(view, slots, loop)
        yard = sdpa_bf16(q, kh, vh, kc, vc, list(range(b + 1)), sm_scale=scale)
        assert torch.isfinite(out).all(), "NaN/inf or unwritten output"
        e = attention_errors(out, ref, yard)
        print(f"loop {loop}: " + " ".join(f"{k}={v:.3g}" for k, v in e.items()))
        assert within_policy(e), f"loop {loop}: {e}"


@pytest.mark.parametrize("name,cfg,loops,hkv,group,dim,lens,rot,loop_ids", CPU_CASES,
                         ids=[c[0] for c in CPU_CASES])
def test_decode_tc_matches_reference(name, cfg, loops, hkv, group, dim, lens, rot, loop_ids,
                                     device):
    if device == "cuda":
        pytest.skip("small interpreter case; GPU runs test_decode_tc_real_size")
    _run(cfg, loops, hkv, group, dim, lens, rot, loop_ids, device, seed=11)


@pytest.mark.parametrize("prefetch", [True, False])
def test_decode_tc_splits_tiles_and_empty_requests(prefetch, device):
    """Several tiles per split, a partial last tile, more splits than tiles, empty history."""
    _run(RQConfig(), 4, 1, 2, 64, [70, 1, 0], "cfg", (0, 3), device, seed=19,
         launch=TCLaunch(block_n=16, num_splits=2, prefetch=prefetch))
    _run(RQConfig(), 4, 1, 1, 64, [1, 0, 17], "cfg", (0,), device, seed=12,
         launch=TCLaunch(block_n=16, num_splits=5, prefetch=prefetch))


def test_decode_tc_large_query_and_outlier_groups(device):
    """A query 30x larger than unit scale (the fixed-point split is per group and head) and
    x20 outlier K channels (queries() puts one in channel 3)."""
    view, ind, idx, slots = build(RQConfig(), loops=4, num_kv_heads=2, group=1, dim=128,
                                  lens=[45, 3], rot="cfg", device=device, seed=23)
    q, kc, vc = queries(2, 2, 2, 128, device=device, seed=23, scale=30.0)
    for loop in (0, 3):
        out = decode_attention_tc(q, kc, vc, view, loop, ind, idx, sm_scale=128 ** -0.5)
        ref = decode_attention_reference(q.float(), kc, vc, view, loop, ind, idx,
                                         sm_scale=128 ** -0.5)
        kh, vh = history(view, slots, loop)
        yard = sdpa_bf16(q, kh, vh, kc, vc, [0, 1, 2], sm_scale=128 ** -0.5)
        assert within_policy(attention_errors(out, ref, yard))


def test_decode_tc_refuses_unsupported_format(device):
    cfg = RQConfig(anchor="chained", rotation="none")
    view, ind, idx, _ = build(cfg, loops=3, num_kv_heads=1, group=1, dim=64, lens=[5, 3],
                              rot="cfg", device=device, seed=13)
    assert tc_unsupported_reason(view) == "anchor='chained'"
    q, kc, vc = queries(2, 1, 1, 64, device=device, seed=13)
    with pytest.raises(ValueError, match="anchor='chained'"):
        decode_attention_tc(q, kc, vc, view, 1, ind, idx, sm_scale=0.125)


def test_decode_tc_bad_inputs(device):
    view, ind, idx, _ = build(RQConfig(), loops=4, num_kv_heads=1, group=1, dim=64, lens=[5],
                              rot="cfg", device=device, seed=17)
    q, kc, vc = queries(1, 1, 1, 64, device=device, seed=17)
    with pytest.raises(AssertionError):
        decode_attention_tc(q.float(), kc, vc, view, 0, ind, idx, sm_scale=0.125)
    with pytest.raises(AssertionError):
        decode_attention_tc(q, kc, vc, view, 0, ind.long(), idx, sm_scale=0.125)
    with pytest.raises(AssertionError):
        decode_attention_tc(q, kc[:, :, :32], vc, view, 0, ind, idx, sm_scale=0.125)


@pytest.mark.gpu
@pytest.mark.parametrize("name,cfg,loops,hkv,group,dim,lens,rot,loop_ids", GPU_CASES,
                         ids=[c[0] for c in GPU_CASES])
def test_decode_tc_real_size(name, cfg, loops, hkv, group, dim, lens, rot, loop_ids, device):
    _run(cfg, loops, hkv, group, dim, lens, rot, loop_ids, device, seed=21)


@pytest.mark.gpu
def test_decode_tc_cuda_graph(device):
    """Capture once (after a warm-up call), replay after changing the inputs in place."""
    view, ind, idx, _ = build(RQConfig(), loops=4, num_kv_heads=4, group=1, dim=128,
                              lens=[300, 1000], rot="cfg", device=device, seed=31)
    q, kc, vc = queries(2, 4, 4, 128, device=device, seed=31)
    out = torch.empty_like(q)
    kw = dict(sm_scale=128 ** -0.5, out=out, launch=TCLaunch(num_splits=4))
    decode_attention_tc(q, kc, vc, view, 0, ind, idx, **kw)  # warm-up (compile, rotation cache)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention_tc(q, kc, vc, view, 0, ind, idx, **kw)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    ref = decode_attention_reference(q.float(), kc, vc, view, 0, ind, idx, sm_scale=kw["sm_scale"])
    assert (out.float() - ref).abs().max().item() < 0.05 * ref.abs().max().item()
