"""Decode attention v2 (CUDA-core split kernel) vs "reference dequantization + fp32 attention".

Tolerance policy: the same as tests/kernels/test_decode.py (flash-attn rule). For the max-abs
error and for the Frobenius norm of the error against `decode_attention_reference`,

    err(kernel) <= 2 * err(bf16 SDPA on the same dequantized K/V) + floor,

with floor = one bf16 ulp of max|ref| (max error) and 1e-3 * ||ref|| (Frobenius). The output
is NaN-poisoned first, so an unwritten element fails.
"""

from __future__ import annotations

import pytest
import torch
from attn_cases import build, history, queries

from rq_kernels.decode_v2 import decode_attention_v2, v2_unsupported_reason
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
]
GPU_CASES = [
    ("ouro_mixed", RQConfig(), 4, 16, 1, 128, [1, 4097, 8191], "cfg", (0, 3)),
    ("ouro_b8", RQConfig(), 4, 16, 1, 128, [2048 + 13 * i for i in range(8)], "cfg", (2,)),
    ("smollm_gqa3", RQConfig(), 4, 3, 3, 64, [1, 15, 2049, 5003], "cfg", (0, 3)),
    ("huginn_d96", RQConfig(), 4, 8, 1, 96, [97, 3001], "cfg", (1, 3)),
    ("d128_random_orth_gqa2", RQConfig(), 4, 4, 2, 128, [777, 1], "rand", (0,)),
]


def _run(cfg, loops, hkv, group, dim, lens, rot, loop_ids, device, seed, head_major=False,
         **kw):
    view, ind, idx, slots = build(cfg, loops=loops, num_kv_heads=hkv, group=group, dim=dim,
                                  lens=lens, rot=rot, device=device, seed=seed,
                                  head_major=head_major)
    assert v2_unsupported_reason(view, group) is None, v2_unsupported_reason(view, group)
    b = len(lens)
    q, kc, vc = queries(b, hkv * group, hkv, dim, device=device, seed=seed)
    scale = dim ** -0.5
    for loop in loop_ids:
        out = torch.full_like(q, float("nan"))
        decode_attention_v2(q, kc, vc, view, loop, ind, idx, sm_scale=scale, out=out, **kw)
        ref = decode_attention_reference(q.float(), kc, vc, view, loop, ind, idx, sm_scale=scale)
        kh, vh = history(view, slots, loop)
        yard = sdpa_bf16(q, kh, vh, kc, vc, list(range(b + 1)), sm_scale=scale)
        assert torch.isfinite(out).all(), "NaN/inf or unwritten output"
        e = attention_errors(out, ref, yard)
        print(f"loop {loop}: " + " ".join(f"{k}={v:.3g}" for k, v in e.items()))
        assert within_policy(e), f"loop {loop}: {e}"


@pytest.mark.parametrize("name,cfg,loops,hkv,group,dim,lens,rot,loop_ids", CPU_CASES,
                         ids=[c[0] for c in CPU_CASES])
def test_decode_v2_matches_reference(name, cfg, loops, hkv, group, dim, lens, rot, loop_ids,
                                     device):
    if device == "cuda":
        pytest.skip("small interpreter case; GPU runs test_decode_v2_real_size")
    _run(cfg, loops, hkv, group, dim, lens, rot, loop_ids, device, seed=11)


def test_decode_v2_more_splits_than_tiles(device):
    """Empty splits, an empty history and a partial last tile merge correctly."""
    _run(RQConfig(), 4, 1, 2, 64, [1, 0, 17], "cfg", (0,), device, seed=12, num_splits=5,
         block_n=16)


def test_decode_v2_block_64_two_warps(device):
    _run(RQConfig(), 4, 1, 1, 128, [70, 3], "cfg", (1,), device, seed=15, block_n=64,
         num_warps=2)


@pytest.mark.parametrize("group,frame_split", [(1, True), (2, False)])
def test_decode_v2_frame_split_variants(group, frame_split, device):
    """Both thread layouts (a whole group or one 16-element frame per thread), MHA and GQA."""
    _run(RQConfig(), 4, 1, group, 64, [23], "cfg", (0, 3), device, seed=18,
         frame_split=frame_split)


@pytest.mark.parametrize("group", [1, 2])
def test_decode_v2_prefetch(group, device):
    """Register double buffer: several tiles per split, a partial last tile, empty splits."""
    _run(RQConfig(), 4, 1, group, 64, [70, 1, 0], "cfg", (0, 3), device, seed=19, block_n=16,
         num_splits=2, prefetch=True)


@pytest.mark.parametrize("cfg,dim", [(RQConfig(), 128), (RQConfig(group_size=16), 64),
                                     (RQConfig(anchor_bits=8, residual_bits=4), 96)],
                         ids=["a4r2_g32", "a4r2_g16", "a8r4_d96"])
def test_decode_v2_integer_k_dots_vs_float_path(cfg, dim, device):
    """K logits by dp4a against the 16-bit fixed-point query vs the exact-fp32 FFMA path: both
    within the policy, and within one bf16 ulp of max|out| (both outputs are rounded to bf16)
    plus 1e-3 of it of each other (the query's rounding error is at most 1/(127*512) of a
    group's largest |q'| element, far below bf16's 2^-9)."""
    view, ind, idx, _ = build(cfg, loops=4, num_kv_heads=2, group=1, dim=dim, lens=[45, 3],
                              rot="cfg", device=device, seed=23)
    q, kc, vc = queries(2, 2, 2, dim, device=device, seed=23, scale=3.0)
    for loop in (0, 3):
        a = decode_attention_v2(q, kc, vc, view, loop, ind, idx, sm_scale=dim ** -0.5, k_idp=True)
        b = decode_attention_v2(q, kc, vc, view, loop, ind, idx, sm_scale=dim ** -0.5, k_idp=False)
        top = b.float().abs().max().item()
        assert (a.float() - b.float()).abs().max().item() <= (2 ** -7 + 1e-3) * top
    _run(cfg, 4, 2, 1, dim, [45, 3], "cfg", (0, 3), device, seed=23, k_idp=True)


def test_decode_v2_head_major_pool(device):
    _run(RQConfig(), 4, 2, 1, 64, [17, 1], "cfg", (0,), device, seed=14, head_major=True)


def test_decode_v2_kernel_really_runs(device):
    """The kernel serves the default format (the launcher has no twin to fall back to)."""
    view, ind, idx, _ = build(RQConfig(), loops=4, num_kv_heads=1, group=1, dim=64, lens=[5],
                              rot="cfg", device=device, seed=16)
    assert v2_unsupported_reason(view) is None
    q, kc, vc = queries(1, 1, 1, 64, device=device, seed=16)
    out = decode_attention_v2(q, kc, vc, view, 0, ind, idx, sm_scale=0.125)
    assert torch.isfinite(out).all()


def test_decode_v2_unsupported_format_is_refused(device):
    cfg = RQConfig(anchor="chained", rotation="none")
    view, ind, idx, _ = build(cfg, loops=3, num_kv_heads=1, group=1, dim=64, lens=[5, 3],
                              rot="cfg", device=device, seed=13)
    assert v2_unsupported_reason(view) == "anchor='chained'"
    q, kc, vc = queries(2, 1, 1, 64, device=device, seed=13)
    with pytest.raises(ValueError, match="decode_attention_v2 cannot serve this call: anchor="):
        decode_attention_v2(q, kc, vc, view, 1, ind, idx, sm_scale=0.125)


def test_decode_v2_bad_inputs(device):
    view, ind, idx, _ = build(RQConfig(), loops=4, num_kv_heads=1, group=1, dim=64, lens=[5],
                              rot="cfg", device=device, seed=17)
    q, kc, vc = queries(1, 1, 1, 64, device=device, seed=17)
    with pytest.raises(AssertionError):
        decode_attention_v2(q.float(), kc, vc, view, 0, ind, idx, sm_scale=0.125)
    with pytest.raises(AssertionError):
        decode_attention_v2(q, kc, vc, view, 0, ind.long(), idx, sm_scale=0.125)
    with pytest.raises(AssertionError):
        decode_attention_v2(q, kc[:, :, :32], vc, view, 0, ind, idx, sm_scale=0.125)


@pytest.mark.gpu
@pytest.mark.parametrize("name,cfg,loops,hkv,group,dim,lens,rot,loop_ids", GPU_CASES,
                         ids=[c[0] for c in GPU_CASES])
def test_decode_v2_real_size(name, cfg, loops, hkv, group, dim, lens, rot, loop_ids, device):
    _run(cfg, loops, hkv, group, dim, lens, rot, loop_ids, device, seed=21)


@pytest.mark.gpu
def test_decode_v2_cuda_graph(device):
    """Capture once (after a warm-up call), replay after changing the inputs in place."""
    cfg = RQConfig()
    view, ind, idx, _ = build(cfg, loops=4, num_kv_heads=4, group=1, dim=128,
                              lens=[300, 1000], rot="cfg", device=device, seed=31)
    q, kc, vc = queries(2, 4, 4, 128, device=device, seed=31)
    out = torch.empty_like(q)
    kw = dict(sm_scale=128 ** -0.5, out=out, num_splits=4)
    decode_attention_v2(q, kc, vc, view, 0, ind, idx, **kw)  # warm-up (compile, rotation cache)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention_v2(q, kc, vc, view, 0, ind, idx, **kw)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    ref = decode_attention_reference(q.float(), kc, vc, view, 0, ind, idx, sm_scale=kw["sm_scale"])
    assert (out.float() - ref).abs().max().item() < 0.05 * ref.abs().max().item()
