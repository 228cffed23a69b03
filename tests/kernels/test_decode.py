"""Fused decode attention (both split kernels: CUDA-core for MHA, tensor-core for GQA and, forced
with `DecodeLaunch`, for MHA too) vs "reference dequantization + fp32 attention".

Tolerance policy (flash-attn rule)
----------------------------------
The reference is `sglang_rq.reference.decode_attention_reference` (dequantize the history with
`dequantize_rows_reference`, append the in-flight token, fp32 attention). The yardstick is the
same dequantized K/V sent through PyTorch SDPA in bf16. The kernel passes if, for the maximum
absolute error and for the Frobenius norm of the error,

    err(kernel) <= 2 * err(bf16 SDPA) + floor,

with floor = one bf16 ulp of max|ref| for the max error (the kernel's output is bf16 too) and
1e-3 * ||ref|| for the Frobenius error. NaN never passes; every output element is written
(the ``out=`` buffer is poisoned with NaN first).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attn_cases import build, history, queries, signed_hadamard

from rq_kernels import decode as rq_decode
from rq_kernels import decode_tc
from rq_kernels import decode_attention, unsupported_reason
from rq_kernels.decode import DecodeLaunch, fma_unsupported_reason
from rq_kernels.decode_tc import OCCUPANCY, query_rotation, tc_unsupported_reason
from rq_kernels.testing import attention_errors, sdpa_bf16, within_policy
from sglang_rq.config import RQConfig
from sglang_rq.reference import decode_attention_reference
from sglang_rq.rotation import hadamard_matrix

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
         launch=None, q_in_qkv=False, v_scale=1.0):
    view, ind, idx, slots = build(cfg, loops=loops, num_kv_heads=hkv, group=group, dim=dim,
                                  lens=lens, rot=rot, device=device, seed=seed,
                                  head_major=head_major, v_scale=v_scale)
    b = len(lens)
    q, kc, vc = queries(b, hkv * group, hkv, dim, device=device, seed=seed, v_scale=v_scale)
    if q_in_qkv:  # q as the model passes it: a slice of the fused QKV projection's output
        q = torch.cat([q.flatten(1), kc.flatten(1), vc.flatten(1)], 1)[:, :q[0].numel()].view(
            q.shape)
        assert not q.is_contiguous()
    scale = dim ** -0.5
    for loop in loop_ids:
        out = torch.full_like(q, float("nan"))
        decode_attention(q, kc, vc, view, loop, ind, idx, sm_scale=scale, out=out, launch=launch)
        ref = decode_attention_reference(q.float(), kc, vc, view, loop, ind, idx, sm_scale=scale)
        kh, vh = history(view, slots, loop)
        yard = sdpa_bf16(q, kh, vh, kc, vc, list(range(b + 1)), sm_scale=scale)
        assert torch.isfinite(out).all(), "NaN/inf or unwritten output"
        e = attention_errors(out, ref, yard)
        print(f"loop {loop}: " + " ".join(f"{k}={v:.3g}" for k, v in e.items()))
        assert within_policy(e), f"loop {loop}: {e}"


@pytest.mark.parametrize("name,cfg,loops,hkv,group,dim,lens,rot,loop_ids", CPU_CASES,
                         ids=[c[0] for c in CPU_CASES])
def test_decode_matches_reference(name, cfg, loops, hkv, group, dim, lens, rot, loop_ids,
                                  device):
    if device == "cuda":
        pytest.skip("small interpreter case; GPU runs test_decode_real_size")
    _run(cfg, loops, hkv, group, dim, lens, rot, loop_ids, device, seed=11)
    if group == 1:  # the tensor-core split kernel on the same MHA case
        _run(cfg, loops, hkv, group, dim, lens, rot, loop_ids, device, seed=11,
             launch=DecodeLaunch(split_kernel="mma"))


@pytest.mark.parametrize("group", [1, 2])
def test_decode_more_splits_than_tiles(group, device):
    """Empty splits (more splits than history tiles), several tiles per split with a partial
    last one, more splits than one merge iteration, and an empty history merge correctly (MHA:
    CUDA-core kernel, GQA: the Triton tensor-core one; named, since on CUDA the default is the
    tc kernel, which takes no block_n)."""
    bn = 16 if device == "cpu" or group == 1 else 32  # block_n=16 is refused on CUDA for mma
    kernel = "fma" if group == 1 else "mma"
    _run(RQConfig(), 4, 1, group, 64, [1, 0, 17], "cfg", (0,), device, seed=12,
         launch=DecodeLaunch(kernel, num_splits=5, block_n=bn))
    _run(RQConfig(), 4, 1, group, 64, [70, 1, 0], "cfg", (0, 3), device, seed=19,
         launch=DecodeLaunch(kernel, num_splits=2, block_n=bn))
    # 40 splits: more than one merge iteration (3 rows load 32 splits per iteration, 6 rows
    # 16), the last one partly masked
    _run(RQConfig(), 4, 1, group, 64, [300, 0, 5], "cfg", (0,), device, seed=23,
         launch=DecodeLaunch(kernel, num_splits=40, block_n=bn))


def test_decode_picks_the_split_kernel_by_shape(device):
    """MHA formats with whole int32 code words: the CUDA-core kernel; GQA: tensor-core."""
    view, *_ = build(RQConfig(), loops=4, num_kv_heads=1, group=1, dim=64, lens=[5],
                     rot="cfg", device=device, seed=16)
    assert fma_unsupported_reason(view, 1) is None
    assert "query heads per KV head" in fma_unsupported_reason(view, 2)
    with pytest.raises(ValueError, match="split_kernel"):
        DecodeLaunch(split_kernel="v2")


def test_decode_head_major_pool(device):
    """A pool allocated head-major ([2, H, rows, bytes], same logical views) gives the same
    answers: the kernels only use the views' strides."""
    _run(RQConfig(), 4, 2, 1, 64, [17, 1], "cfg", (0,), device, seed=14, head_major=True)


def test_decode_unsupported_format_is_refused(device):
    cfg = RQConfig(anchor="chained", rotation="none")
    view, ind, idx, _ = build(cfg, loops=3, num_kv_heads=1, group=1, dim=64, lens=[5, 3],
                              rot="cfg", device=device, seed=13)
    assert unsupported_reason(view) == "anchor='chained'"
    q, kc, vc = queries(2, 1, 1, 64, device=device, seed=13)
    with pytest.raises(ValueError, match="decode_attention cannot serve this call: anchor="):
        decode_attention(q, kc, vc, view, 1, ind, idx, sm_scale=0.125)


@pytest.mark.gpu
@pytest.mark.parametrize("name,cfg,loops,hkv,group,dim,lens,rot,loop_ids", GPU_CASES,
                         ids=[c[0] for c in GPU_CASES])
def test_decode_real_size(name, cfg, loops, hkv, group, dim, lens, rot, loop_ids, device):
    _run(cfg, loops, hkv, group, dim, lens, rot, loop_ids, device, seed=21)


TC_CASES = [  # the tensor-core CUDA split kernel, forced, on awkward sizes and formats
    ("ouro_tails", RQConfig(), 4, 4, 1, 128, [1, 15, 17, 1000, 4097, 0], "cfg", (0, 1, 3)),
    ("gqa2_rand", RQConfig(), 4, 2, 2, 128, [777, 1, 33], "rand", (0, 3)),
    ("group64_shared_loop", RQConfig(group_size=64, loop_bits=(0, 2, 4)), 3, 2, 1, 128,
     [21, 300], "cfg", (0, 1, 2)),
    ("first_nolsq_r4", RQConfig(anchor="first", lsq=False, residual_bits=4), 3, 2, 1, 128,
     [50, 301], "cfg", (0, 2)),
    ("a2_norot_gqa4_g64", RQConfig(rotation="none", group_size=64, anchor_bits=2), 4, 2, 4, 128,
     [129, 5], "cfg", (0, 3)),
    # head_dim 64 (SmolLM2: 3 KV heads, GQA 3, group 32; GQA 2 with a random rotation)
    ("smollm_d64_gqa3", RQConfig(), 4, 3, 3, 64, [1, 15, 17, 1000, 2049, 0], "cfg", (0, 1, 3)),
    ("d64_gqa2_rand_r4", RQConfig(residual_bits=4), 4, 2, 2, 64, [777, 1, 33], "rand", (0, 2)),
    ("d64_a2_norot_gqa4", RQConfig(rotation="none", anchor_bits=2), 3, 1, 4, 64, [129, 5],
     "cfg", (0, 2)),
    # head_dim 96 (Huginn: MHA, group 32; runs as 128 with a padding group): odd KV head counts
    # (6-byte (scale, offset) rows at both offsets in their words), lengths off the 16-token tile
    ("huginn_d96", RQConfig(), 4, 5, 1, 96, [1, 15, 17, 97, 1000, 4097, 0], "cfg", (0, 1, 3)),
    ("d96_gqa2_rand_a2", RQConfig(anchor_bits=2), 4, 3, 2, 96, [301, 5, 33], "rand", (0, 3)),
    ("d96_first_nolsq_r4", RQConfig(anchor="first", lsq=False, residual_bits=4), 3, 3, 1, 96,
     [50, 301], "cfg", (0, 2)),
    # KV heads in whole CTAs of 4 (`decode_tc.coop_copies`): (scale, offset) rows and coefficients
    # copied once per CTA; with ouro_tails: head_dim 64 (16-byte spans), 0-bit residual loops and
    # group 64 at head_dim 128 (16-byte spans), no coefficients
    ("coop_d64_gqa2_hkv8", RQConfig(), 4, 8, 2, 64, [1, 31, 1000, 0, 2049], "cfg", (0, 1, 3)),
    ("coop_g64_r0_hkv4", RQConfig(group_size=64, loop_bits=(0, 2, 4)), 3, 4, 1, 128,
     [21, 300, 17], "cfg", (0, 1, 2)),
    ("coop_first_nolsq", RQConfig(anchor="first", lsq=False), 3, 4, 1, 128, [50, 301], "cfg",
     (0, 2)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", (0, 1), ids=("wide", "narrow"))
@pytest.mark.parametrize("name,cfg,loops,hkv,group,dim,lens,rot,loop_ids", TC_CASES,
                         ids=[c[0] for c in TC_CASES])
def test_decode_tc_kernel(name, cfg, loops, hkv, group, dim, lens, rot, loop_ids, shape, device,
                          monkeypatch):
    """Each compiled shape of the case's K side (`decode_tc.OCCUPANCY`: 16- and 32-token
    iterations), forced: the batches here are far below the units that pick the narrow shape."""
    monkeypatch.setattr(decode_tc, "tc_occupancy",
                        lambda units, num_sms, int_k: OCCUPANCY[int_k][shape])
    _run(cfg, loops, hkv, group, dim, lens, rot, loop_ids, device, seed=23,
         launch=DecodeLaunch(split_kernel="tc"))
    _run(cfg, loops, hkv, group, dim, lens, rot, loop_ids, device, seed=24,
         launch=DecodeLaunch(split_kernel="tc", num_splits=3))


def test_coop_copies_where_heads_fill_ctas_of_token_major_rows():
    """The CTA-shared copies of (scale, offset) rows and coefficients (`decode_tc.coop_copies`)
    are taken where the KV heads fill CTAs of 4 and a token's rows of adjacent heads are one span
    (token-major), and nowhere else: 2 or 3 KV heads, head-major rows, head_dim 96."""
    def coop(hkv, dim, head_major=False, loop=0):
        view, *_ = build(RQConfig(), loops=4, num_kv_heads=hkv, group=1, dim=dim, lens=[3],
                         rot="cfg", device="cpu", seed=1, head_major=head_major)
        return decode_tc.coop_copies(view, loop)
    assert coop(4, 128) and coop(16, 128) and coop(8, 64) and coop(4, 128, loop=3)
    assert not coop(2, 128) and not coop(3, 64) and not coop(4, 96) and not coop(6, 128)
    assert not coop(4, 128, head_major=True)


def _line_aligned(t: torch.Tensor, shift: int = 0) -> torch.Tensor:
    """A copy of ``t`` (contiguous) whose data starts ``shift`` bytes past a 128-byte boundary."""
    flat = torch.zeros(t.numel() * t.element_size() + 256, dtype=torch.uint8)
    at = (-flat.data_ptr()) % 128 + shift
    out = flat[at:at + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
    return out.copy_(t)


def test_stream_codes_where_no_two_ctas_share_a_code_line():
    """The codes' evict_first copies (`decode_tc.stream_codes`) are taken where a CTA's 4 adjacent
    KV heads' codes of a token row are whole 128-byte lines (4 x 128 x 4 / 8 = 256 bytes of
    anchor, 4 x 128 x 2 / 8 = 128 of residual), in 128-byte-aligned tensors; not for 2-bit codes
    at head_dim 64 (4 x 16 = 64 bytes), at head_dim 96 (no COOP), nor off a line boundary."""
    def stream(hkv, dim, loop=0, shift=0, head_major=False):
        view, *_ = build(RQConfig(), loops=4, num_kv_heads=hkv, group=1, dim=dim, lens=[3],
                         rot="cfg", device="cpu", seed=1, head_major=head_major)
        if not head_major:
            view = dataclasses.replace(view, codes=[_line_aligned(c, shift) for c in view.codes])
        return decode_tc.stream_codes(view, loop)
    assert stream(16, 128) and stream(4, 128) and stream(4, 128, loop=3)
    assert stream(8, 64, loop=3)  # anchor only: 4 x 64 x 4 / 8 = 128 bytes
    assert not stream(8, 64, loop=0)  # its 2-bit residual: 64 bytes
    assert not stream(4, 128, shift=64) and not stream(24, 96) and not stream(3, 64)
    assert not stream(4, 128, head_major=True)


@pytest.mark.gpu
@pytest.mark.parametrize("hkv,dim", [(4, 128), (8, 64)], ids=["d128", "d64"])
def test_decode_tc_coop_head_major_pool(hkv, dim, device):
    """The same heads on head-major rows take the per-warp copies and agree with the reference."""
    _run(RQConfig(), 4, hkv, 1, dim, [33, 1000], "cfg", (0, 3), device, seed=27, head_major=True,
         launch=DecodeLaunch(split_kernel="tc"))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", (0, 1), ids=("wide", "narrow"))
@pytest.mark.parametrize("dim,hkv,group", [(128, 2, 1), (64, 3, 3), (96, 2, 1)],
                         ids=["ouro_d128", "smollm_d64_gqa3", "huginn_d96"])
def test_decode_tc_one_long_split(dim, hkv, group, shape, device, monkeypatch):
    """16k tokens in one split per (request, KV head), as the plan runs 64 x 8k: before the V
    magic drain (`rescale_drain`) the last loop's error was 2-10x bf16 SDPA's (truncating
    tensor-core accumulation; test_decode_tc_numerics.py)."""
    monkeypatch.setattr(decode_tc, "tc_occupancy",
                        lambda units, num_sms, int_k: OCCUPANCY[int_k][shape])
    _run(RQConfig(), 4, hkv, group, dim, [16384 + 5], "cfg", (0, 3), device, seed=25,
         launch=DecodeLaunch(split_kernel="tc", num_splits=1))


@pytest.mark.gpu
@pytest.mark.parametrize("dim,hkv,group", [(128, 4, 1), (64, 2, 3), (96, 2, 1)],
                         ids=["ouro_d128", "smollm_d64_gqa3", "huginn_d96"])
def test_decode_tc_small_v_values(dim, hkv, group, device):
    """V values around 1e-3 (a head with small V): the V weights' fp16 form must keep them out of
    fp16's subnormals (`VPRE`; test_decode_tc_numerics.py has the emulated failure of 2^-8)."""
    _run(RQConfig(), 4, hkv, group, dim, [33, 1000, 4097], "cfg", (0, 3), device, seed=29,
         launch=DecodeLaunch(split_kernel="tc"), v_scale=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("dim,hkv,group", [(128, 3, 2), (64, 2, 3)], ids=["d128_gqa2", "d64_gqa3"])
def test_decode_tc_rotates_a_signed_hadamard_query_itself(dim, hkv, group, device):
    """A signed Sylvester Hadamard rotation per KV head (`--rq-rotation signed-hadamard`): the
    split kernel rotates the query itself (no rotation kernel), reading it with the strides of
    a slice of the QKV output."""
    view, *_ = build(RQConfig(), loops=4, num_kv_heads=hkv, group=group, dim=dim, lens=[5],
                     rot="signed", device=device, seed=26)
    assert query_rotation(view, torch.device(device))[0] == 2
    _run(RQConfig(), 4, hkv, group, dim, [1000, 1, 33, 0], "signed", (0, 3), device, seed=26,
         launch=DecodeLaunch(split_kernel="tc"), q_in_qkv=True)


def test_tc_query_rotation_mode_follows_the_rotation(device):
    """`decode_tc.query_rotation`: no rotation -> the model's query (1); a (signed) Sylvester
    Hadamard at head_dim 64/128 -> rotated in the split kernel, with the signs of each KV head
    (2); Huginn's Paley Hadamard (96) or any other matrix -> the rotation kernel first (0)."""
    dev = torch.device(device)
    for rot, dim, mode in (("cfg", 128, 2), ("cfg", 64, 2), ("signed", 128, 2), ("cfg", 96, 0),
                           ("rand", 128, 0)):
        view, *_ = build(RQConfig(), loops=2, num_kv_heads=3, group=1, dim=dim, lens=[2],
                         rot=rot, device=device, seed=27)
        got, signs, alpha = query_rotation(view, dev)
        assert got == mode, (rot, dim)
        if mode == 2:
            assert alpha == pytest.approx(dim ** -0.5)
            want = (signed_hadamard(3, dim, seed=27) if rot == "signed"
                    else hadamard_matrix(dim).expand(3, dim, dim))
            assert torch.equal(signs.cpu(), torch.sign(want[:, :, 0]))  # H's column 0 is ones
    view, *_ = build(RQConfig(rotation="none"), loops=2, num_kv_heads=3, group=1, dim=128,
                     lens=[2], rot="cfg", device=device, seed=27)
    assert query_rotation(view, dev) == (1, None, 1.0)


D80 = RQConfig(rotation="none", group_size=16)  # head_dim 80: no Hadamard, 16 | 80


def test_decode_tc_refuses_what_it_cannot_serve(device):
    """The CUDA split kernel names why it cannot serve a call (here: head_dim 80, group size 16
    or 64 at head_dim 64, GQA 3 at head_dim 96 (12 MMA rows), or CPU)."""
    cpu = "cpu tensors (the CUDA kernel runs on CUDA only)"
    for cfg, dim, group, want in (
            (D80, 80, 1, "head_dim=80 (the CUDA kernel serves head_dim 64/96/128)"),
            (RQConfig(group_size=16), 64, 1,
             "group_size=16 at head_dim 64 (CUDA kernel: 32, or 64 at head_dim 128)"),
            (RQConfig(group_size=64), 64, 1,
             "group_size=64 at head_dim 64 (CUDA kernel: 32, or 64 at head_dim 128)"),
            (RQConfig(), 96, 3, "3 query heads x 4 groups > 8 MMA rows")):
        view, *_ = build(cfg, loops=2, num_kv_heads=1, group=group, dim=dim, lens=[5],
                         rot="cfg", device=device, seed=25)
        assert tc_unsupported_reason(view, 0, group, torch.device(device)) == (
            want if device == "cuda" else cpu)
    view, ind, idx, _ = build(D80, loops=2, num_kv_heads=1, group=1, dim=80, lens=[5],
                              rot="cfg", device=device, seed=25)
    q, kc, vc = queries(1, 1, 1, 80, device=device, seed=25)
    with pytest.raises(ValueError, match=r"decode_attention \(tc\) cannot serve this call"):
        decode_attention(q, kc, vc, view, 0, ind, idx, sm_scale=0.125,
                         launch=DecodeLaunch(split_kernel="tc"))


def _graph_replay_matches_reference(device, *, hkv, group, loop, seed, kernel):
    """Capture once (after a warm-up call that compiles and fills the rotation cache), replay
    after changing the queries in place, compare with the twin on the new queries."""
    view, ind, idx, _ = build(RQConfig(), loops=4, num_kv_heads=hkv, group=group, dim=128,
                              lens=[300, 1000], rot="cfg", device=device, seed=seed)
    q, kc, vc = queries(2, hkv * group, hkv, 128, device=device, seed=seed)
    out = torch.empty_like(q)
    kw = dict(sm_scale=128 ** -0.5, out=out,
              launch=DecodeLaunch(num_splits=4, split_kernel=kernel))
    decode_attention(q, kc, vc, view, loop, ind, idx, **kw)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention(q, kc, vc, view, loop, ind, idx, **kw)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    ref = decode_attention_reference(q.float(), kc, vc, view, loop, ind, idx,
                                     sm_scale=kw["sm_scale"])
    assert (out.float() - ref).abs().max().item() < 0.05 * ref.abs().max().item()


@pytest.mark.gpu
def test_decode_cuda_graph_mma(device):
    """The tensor-core split kernel (GQA 2) under capture and replay."""
    _graph_replay_matches_reference(device, hkv=2, group=2, loop=3, seed=32, kernel="mma")


@pytest.mark.gpu
def test_decode_cuda_graph(device):
    """The CUDA-core split kernel (MHA) under capture and replay."""
    _graph_replay_matches_reference(device, hkv=4, group=1, loop=0, seed=31, kernel="fma")


@pytest.mark.gpu
def test_decode_cuda_graph_tc(device):
    """The tensor-core CUDA split kernel (MHA and GQA 2) under capture and replay."""
    _graph_replay_matches_reference(device, hkv=4, group=1, loop=0, seed=33, kernel="tc")
    _graph_replay_matches_reference(device, hkv=2, group=2, loop=3, seed=34, kernel="tc")


@pytest.mark.gpu
@pytest.mark.parametrize("hkv,group,dim,rot,q_mode,fused", [
    (4, 1, 128, "cfg", 2, True), (3, 3, 64, "cfg", 2, True), (4, 1, 128, "cfg", 2, False),
    (4, 1, 96, "cfg", 0, False), (2, 2, 128, "rand", 0, False)],
    ids=["mha_d128", "gqa3_d64", "mha_d128_no_counters", "mha_d96_merge_kernel",
         "gqa2_rand_merge_kernel"])
def test_decode_tc_balanced_splits_follow_the_lengths(hkv, group, dim, rot, q_mode, fused, device,
                                                      monkeypatch):
    """Token-balanced splits (the default for batch > 1) find their split length and each
    request's splits on the device: a graph captured at four equal lengths, replayed after
    kv_indptr changes in place to skewed ones (one long request, one empty, one of one token),
    meets the tolerance policy on the new lengths. ``fused``: the split kernel merges its rows
    itself; else the merge kernel reads each request's rows from the split kernel's (first row,
    count) table: always under q_mode 0 (head_dim 96's Paley rotation, a random one), and under
    q_mode 2 where the fused merge's counters do not fit (here: none are left)."""
    if not fused:
        monkeypatch.setattr(decode_tc, "MERGE_COUNTERS", 0)
    view, ind, idx, _ = build(RQConfig(), loops=4, num_kv_heads=hkv, group=group, dim=dim,
                              lens=[4000, 4000, 4000, 4101], rot=rot, device=device, seed=35)
    assert query_rotation(view, torch.device(device))[0] == q_mode
    q, kc, vc = queries(4, hkv * group, hkv, dim, device=device, seed=35)
    out = torch.full_like(q, float("nan"))
    kw = dict(sm_scale=dim ** -0.5, out=out, launch=DecodeLaunch(split_kernel="tc"))
    decode_attention(q, kc, vc, view, 3, ind, idx, **kw)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention(q, kc, vc, view, 3, ind, idx, **kw)
    bounds = [0, 15000, 15001, 15001, 16101]
    ind.copy_(torch.tensor(bounds, dtype=ind.dtype, device=device))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref = decode_attention_reference(q.float(), kc, vc, view, 3, ind, idx, sm_scale=dim ** -0.5)
    kh, vh = history(view, [idx[bounds[i]:bounds[i + 1]] for i in range(4)], 3)
    yard = sdpa_bf16(q, kh, vh, kc, vc, list(range(5)), sm_scale=dim ** -0.5)
    e = attention_errors(out, ref, yard)
    assert torch.isfinite(out).all() and within_policy(e), e


@pytest.mark.gpu
def test_decode_tc_pdl_matches_plain_launch(device):
    """Programmatic dependent launch (sm_90+) changes when kernels start, not what they compute:
    a CUDA graph of three consecutive calls (each call's rotation a dependent of the previous
    call's merge) gives the same bits with and without it, on lengths off the tile (0, 1, 17,
    4097), while the queries change between replays."""
    if not torch.cuda.get_device_capability() >= (9, 0):
        pytest.skip("programmatic dependent launch needs compute capability 9.0")
    view, ind, idx, _ = build(RQConfig(), loops=4, num_kv_heads=4, group=2, dim=128,
                              lens=[1, 17, 4097, 0], rot="cfg", device=device, seed=35)
    q, kc, vc = queries(4, 8, 4, 128, device=device, seed=35)
    outs = {}
    for pdl in (False, True):
        out = [torch.empty_like(q) for _ in range(3)]
        kw = dict(sm_scale=128 ** -0.5, launch=DecodeLaunch(split_kernel="tc", pdl=pdl))

        def calls(out=out, kw=kw):
            for i, loop in enumerate((0, 3, 1)):
                decode_attention(q, kc, vc, view, loop, ind, idx, out=out[i], **kw)

        calls()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            calls()
        got = []
        for seed in (1, 2):
            q.copy_(torch.randn(q.shape, generator=torch.Generator(device).manual_seed(seed),
                                device=device))
            for o in out:
                o.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            got.append(torch.stack(out).clone())
        outs[pdl] = torch.stack(got)
    assert torch.isfinite(outs[True]).all()
    assert torch.equal(outs[True], outs[False])


@pytest.mark.gpu
@pytest.mark.parametrize("rot,dim,hkv,group", [("cfg", 128, 4, 1), ("cfg", 64, 2, 3),
                                                ("none", 128, 2, 2), ("none", 96, 3, 1)],
                         ids=["d128_had_mha", "d64_had_gqa3", "d128_norot_gqa2", "d96_norot"])
def test_decode_tc_fused_merge(rot, dim, hkv, group, device, monkeypatch):
    """The split kernel merging its own splits (the last warp of each chunk of splits,
    `merge_chunk`, then the last chunk of each (request, KV head); counters that wrap to 0) and
    the merge kernel on the same splits, both within the tolerance policy against the fp32 twin
    at 1, 7 (one chunk), 65 (chunks of 16, the last of one split) and 150 splits (empty splits
    among them: lengths 300, 0, 17, 1), and the same bits on three repeated calls (the counters
    back at 0 each time)."""
    cfg = RQConfig() if rot == "cfg" else RQConfig(rotation="none")
    view, ind, idx, slots = build(cfg, loops=4, num_kv_heads=hkv, group=group, dim=dim,
                                  lens=[300, 0, 17, 1], rot="cfg", device=device, seed=36)
    q, kc, vc = queries(4, hkv * group, hkv, dim, device=device, seed=36)
    assert query_rotation(view, q.device)[0] != 0, "a case the fused merge serves"
    scale = dim ** -0.5
    ref = decode_attention_reference(q.float(), kc, vc, view, 0, ind, idx, sm_scale=scale)
    kh, vh = history(view, slots, 0)
    yard = sdpa_bf16(q, kh, vh, kc, vc, list(range(5)), sm_scale=scale)
    for splits in (1, 7, 65, 150):
        launch = DecodeLaunch(split_kernel="tc", num_splits=splits)
        outs = []
        for _ in range(3):
            out = torch.full_like(q, float("nan"))
            decode_attention(q, kc, vc, view, 0, ind, idx, sm_scale=scale, out=out, launch=launch)
            outs.append(out)
        assert all(torch.equal(outs[0], o) for o in outs[1:]), f"{splits} splits: repeats differ"
        with monkeypatch.context() as m:
            m.setattr(rq_decode, "merge_counters", lambda *a: None)
            sep = torch.full_like(q, float("nan"))
            decode_attention(q, kc, vc, view, 0, ind, idx, sm_scale=scale, out=sep, launch=launch)
        for name, o in (("fused", outs[0]), ("merge kernel", sep)):
            e = attention_errors(o, ref, yard)
            assert torch.isfinite(o).all() and within_policy(e), (name, splits, e)
