"""The workspace extend path: `reconstruct_rows` vs its twin, and
`extend_attention` (the workspace path) on more shapes and slab boundaries vs the fp32 reference.

Tolerance policy
----------------
* Reconstruct: bit-identical (`torch.equal`) to `sglang_rq.reference.reconstruct_rows_reference`.
  Both dequantize in fp32 in the same order and round once to bf16 (nearest even); the launcher
  turns FMA contraction off, so this holds on the GPU too. The twin itself is checked against
  `dequantize_rows_reference` (un-rotated, it is the dequantized K/V up to one bf16 rounding).
* Attention: the flash-attn rule of test_extend.py (max and Frobenius error <= 2x those of
  the same dequantized K/V through bf16 SDPA, plus one bf16 ulp of max|ref| / 1e-3 ||ref||).
  On CPU the FlashAttention step is its fp32 maths twin (P rounded to bf16 as the flash kernel
  does), so the interpreter tests exercise the reconstruct kernel, the slabs and the LSE merges.
"""

from __future__ import annotations

import pytest
import torch
from attn_cases import build
from test_extend import GPU_CASES, _run

import rq_kernels.extend as ew
from rq_kernels.extend import extend_attention
from rq_kernels.reconstruct import reconstruct_rows
from sglang_rq.config import RQConfig
from sglang_rq.reference import dequantize_rows_reference, reconstruct_rows_reference

H12 = RQConfig(anchor="first", lsq=False, anchor_bits=8, residual_bits=4)
SHARED = RQConfig(group_size=64, loop_bits=(0, 2, 4))  # a 0-bit (shared) loop

# name, cfg, loops, num_kv_heads, head_dim, rotation, head_major
RECON_CASES = [
    ("d128_hadamard", RQConfig(), 4, 2, 128, "cfg", False),
    ("d64_norot", RQConfig(rotation="none"), 4, 3, 64, "cfg", False),
    ("d96_random_orth", RQConfig(), 4, 1, 96, "rand", False),
    ("d96_first_nolsq_a8r4", H12, 3, 2, 96, "cfg", False),
    ("d128_shared_loop_g64", SHARED, 3, 1, 128, "cfg", False),
    ("d64_group16_head_major", RQConfig(group_size=16), 3, 2, 64, "cfg", True),
]


def _check_reconstruct(cfg, loops, hkv, dim, rot, head_major, lens, device, seed):
    view, _, idx, _ = build(cfg, loops=loops, num_kv_heads=hkv, group=1, dim=dim, lens=lens,
                            rot=rot, device=device, seed=seed, head_major=head_major)
    n = idx.shape[0]
    for loop in range(loops):
        # strided outputs: [n, H, D] views of a wider buffer, NaN-poisoned
        buf = torch.full((2, n, hkv, dim + 8), float("nan"), dtype=torch.bfloat16, device=device)
        ok, ov = buf[0, :, :, :dim], buf[1, :, :, :dim]
        reconstruct_rows(view, loop, idx, ok, ov)
        rk = torch.empty(n, hkv, dim, dtype=torch.bfloat16, device=device)
        rv = torch.empty_like(rk)
        reconstruct_rows_reference(view, loop, idx, rk, rv)
        assert torch.equal(ok, rk) and torch.equal(ov, rv), f"loop {loop}: not bit-identical"
        assert torch.isnan(buf[..., dim:]).all(), f"loop {loop}: wrote past head_dim"
        # the twin is the dequantized K/V, rotated, up to one bf16 rounding
        dk, dv = dequantize_rows_reference(view, idx, loop)
        for got, want in ((rk, dk), (rv, dv)):
            x = got.float()
            if view.rotation is not None:
                x = torch.einsum("nhd,hed->nhe", x, view.rotation.float())  # x' R^T
            tol = 2.0 ** -7 * want.abs().amax(-1, keepdim=True) + 1e-6
            assert ((x - want).abs() <= tol).all(), f"loop {loop}: twin vs dequantize_rows"


@pytest.mark.parametrize("name,cfg,loops,hkv,dim,rot,head_major", RECON_CASES,
                         ids=[c[0] for c in RECON_CASES])
def test_reconstruct_matches_twin(name, cfg, loops, hkv, dim, rot, head_major, device):
    if device == "cuda":
        pytest.skip("small interpreter case; GPU runs test_reconstruct_real_size")
    _check_reconstruct(cfg, loops, hkv, dim, rot, head_major, [1, 17, 97], device, seed=61)


def test_reconstruct_output_alignment(device):
    """Outputs 16-byte aligned, then 2 bytes off, then aligned again: Triton compiles a variant per
    alignment, and `rq_kernels._host.launch_kernel` (which skips the JIT's binding on later
    launches) must pick the matching one each time (bit-identical to the twin)."""
    view, _, idx, _ = build(RQConfig(), loops=2, num_kv_heads=2, group=1, dim=64, lens=[5, 40],
                            rot="cfg", device=device, seed=7)
    n, size = idx.shape[0], idx.shape[0] * 2 * 64
    rk = torch.empty(n, 2, 64, dtype=torch.bfloat16, device=device)
    rv = torch.empty_like(rk)
    reconstruct_rows_reference(view, 1, idx, rk, rv)
    for off in (0, 1, 0, 1):
        flat = torch.full((2 * size + 16,), float("nan"), dtype=torch.bfloat16, device=device)
        ok = flat[off:off + size].view(n, 2, 64)
        ov = flat[size + 8 + off:size + 8 + off + size].view(n, 2, 64)
        assert (ok.data_ptr() % 16 == 0) == (off == 0)
        reconstruct_rows(view, 1, idx, ok, ov)
        assert torch.equal(ok, rk) and torch.equal(ov, rv), f"offset {off}: not bit-identical"
    # row counts of each class Triton specialises an int on (1, a multiple of 16, other), twice
    for m in (1, 16, 17, 1, 32, 45):
        ok, ov = torch.full((2, m, 2, 64), float("nan"), dtype=torch.bfloat16,
                            device=device).unbind(0)
        reconstruct_rows(view, 1, idx[:m], ok, ov)
        assert torch.equal(ok, rk[:m]) and torch.equal(ov, rv[:m]), f"{m} rows: not bit-identical"


def test_reconstruct_no_rows(device):
    view, _, idx, _ = build(RQConfig(), loops=2, num_kv_heads=1, group=1, dim=64, lens=[0],
                            rot="cfg", device=device, seed=1)
    e = torch.empty(0, 1, 64, dtype=torch.bfloat16, device=device)
    assert reconstruct_rows(view, 0, idx, e, e.clone())[0] is e


# name, cfg, loops, num_kv_heads, group, head_dim, prefix lens, chunk lens, rotation, loop ids
WS_CASES = [
    ("mixed_d128_hadamard", RQConfig(), 4, 2, 1, 128, [0, 1, 17, 97], [15, 1, 15, 1], "cfg",
     (0, 3)),
    ("gqa3_d64_norot", RQConfig(rotation="none"), 4, 1, 3, 64, [97, 0], [15, 1], "cfg", (1,)),
    ("gqa8_d64", RQConfig(), 2, 1, 8, 64, [17, 1], [1, 15], "cfg", (0, 1)),
    ("d96_random_orth", RQConfig(), 4, 1, 1, 96, [1, 17], [15, 3], "rand", (2,)),
    ("d96_first_nolsq_a8r4", H12, 3, 2, 1, 96, [17], [15], "cfg", (0, 2)),
    ("d128_shared_loop", SHARED, 3, 1, 1, 128, [21, 5], [1, 15], "cfg", (0, 1, 2)),
    ("no_prefix_gqa2", RQConfig(), 4, 1, 2, 64, [0, 0], [15, 1], "cfg", (0,)),
    ("empty_chunk", RQConfig(), 4, 1, 1, 64, [17, 5, 3], [0, 15, 1], "cfg", (0,)),
    # the only prefix belongs to a request with an empty chunk: nothing to attend over
    ("prefix_only_on_empty_chunk", RQConfig(), 4, 1, 2, 64, [17, 0], [0, 15], "cfg", (0,)),
]


@pytest.mark.parametrize("name,cfg,loops,hkv,group,dim,prefix,chunks,rot,loop_ids", WS_CASES,
                         ids=[c[0] for c in WS_CASES])
def test_extend_workspace_matches_reference(name, cfg, loops, hkv, group, dim, prefix, chunks,
                                            rot, loop_ids, device):
    if device == "cuda":
        pytest.skip("small interpreter case; GPU runs test_extend_workspace_real_size")
    _run(cfg, loops, hkv, group, dim, prefix, chunks, rot, loop_ids, device, seed=71)


@pytest.mark.parametrize("slab", [5, 16, 17])
@pytest.mark.parametrize("case", ["mixed_d128_hadamard", "gqa3_d64_norot", "d96_random_orth"])
def test_extend_workspace_slab_boundaries(case, slab, device, monkeypatch):
    """Slabs smaller than one request's prefix, ending inside and at request boundaries."""
    if device == "cuda":
        pytest.skip("small interpreter case")
    _, cfg, loops, hkv, group, dim, prefix, chunks, rot, loop_ids = next(
        c for c in WS_CASES if c[0] == case)
    monkeypatch.setattr(ew, "WORKSPACE_TOKENS", slab)
    _run(cfg, loops, hkv, group, dim, prefix, chunks, rot, loop_ids[:1], device, seed=73)


@pytest.mark.gpu
@pytest.mark.parametrize("name,cfg,loops,hkv,dim,rot,head_major", RECON_CASES,
                         ids=[c[0] for c in RECON_CASES])
def test_reconstruct_real_size(name, cfg, loops, hkv, dim, rot, head_major, device):
    _check_reconstruct(cfg, loops, hkv, dim, rot, head_major, [4097, 1000], device, seed=81)


@pytest.mark.gpu
@pytest.mark.parametrize("slab", [1000])  # the default slab: test_extend_real_size
@pytest.mark.parametrize("name,cfg,loops,hkv,group,dim,prefix,chunks,rot,loop_ids", GPU_CASES,
                         ids=[c[0] for c in GPU_CASES])
def test_extend_workspace_real_size(name, cfg, loops, hkv, group, dim, prefix, chunks, rot,
                                    loop_ids, slab, device, monkeypatch):
    monkeypatch.setattr(ew, "WORKSPACE_TOKENS", slab)
    _run(cfg, loops, hkv, group, dim, prefix, chunks, rot, loop_ids, device, seed=51)


def test_extend_workspace_host_indptrs(device):
    """Host lengths given (no sync) or read from the tensors: the same output, bit for bit."""
    view, kv_ind, idx, _ = build(RQConfig(), loops=2, num_kv_heads=1, group=2, dim=64,
                                 lens=[17, 0, 5], rot="cfg", device=device, seed=5)
    qp = [0, 3, 4, 19]
    qo = torch.tensor(qp, dtype=torch.int32, device=device)
    gen = torch.Generator().manual_seed(5)
    q, kc, vc = (torch.randn(19, h, 64, generator=gen).to(torch.bfloat16).to(device)
                 for h in (2, 1, 1))
    a = extend_attention(q, kc, vc, view, 0, qo, kv_ind, idx, sm_scale=0.125)
    b = extend_attention(q, kc, vc, view, 0, qo, kv_ind, idx, sm_scale=0.125,
                         host_indptrs=(qp, kv_ind.tolist()))
    assert torch.equal(a, b)


@pytest.mark.parametrize("lens", [[0, 0, 0], [17, 0, 5]], ids=["no_prefix", "prefix"])
def test_extend_workspace_out_given_or_not(lens, device):
    """``out`` given or left to the launcher (which may return the chunk attention's own buffer
    when no prefix is read): the same output, bit for bit, every row written."""
    view, kv_ind, idx, _ = build(RQConfig(), loops=2, num_kv_heads=1, group=2, dim=64,
                                 lens=lens, rot="cfg", device=device, seed=7)
    qo = torch.tensor([0, 3, 4, 19], dtype=torch.int32, device=device)
    gen = torch.Generator().manual_seed(7)
    q, kc, vc = (torch.randn(19, h, 64, generator=gen).to(torch.bfloat16).to(device)
                 for h in (2, 1, 1))
    out = torch.full_like(q, float("nan"))
    a = extend_attention(q, kc, vc, view, 1, qo, kv_ind, idx, sm_scale=0.125, out=out)
    b = extend_attention(q, kc, vc, view, 1, qo, kv_ind, idx, sm_scale=0.125)
    assert a is out and torch.isfinite(a).all() and torch.equal(a, b)


def test_extend_merge_reads_either_infinite_lse_as_no_prefix(device):
    """The merge of prefix and chunk attention (`rq_extend_merge_kernel`, no rotation, GQA 2)
    against the LSE-weighted average written out in PyTorch: a row whose prefix LSE is -inf,
    or +inf (FlashAttention's LSE of a sequence without keys, left as it is by the one-slab
    path), gets the chunk output alone."""
    from rq_kernels._host import interpreting, launch_kernel
    from rq_kernels.triton.extend import rq_extend_merge_kernel

    gen = torch.Generator().manual_seed(41)
    T, HKV, GQ, D = 5, 2, 2, 64
    op = torch.randn(HKV, T * GQ, D, generator=gen).to(torch.bfloat16)
    lp = torch.randn(HKV, T * GQ, generator=gen) * 3
    lp[0, 1], lp[1, 4], lp[1, 9] = float("inf"), float("-inf"), float("inf")
    op[0, 1] = op[1, 4] = op[1, 9] = 0.0
    oc = torch.randn(T, HKV * GQ, D, generator=gen).to(torch.bfloat16)
    lc = torch.randn(T, HKV * GQ, generator=gen) * 3
    out = torch.full_like(oc, float("nan"))
    op, lp, oc, lc, out = (x.to(device) for x in (op, lp, oc, lc, out))
    dummy = torch.zeros(1, dtype=torch.bfloat16, device=device)
    launch_kernel(rq_extend_merge_kernel, (HKV, 1), (
        op, op.stride(0), op.stride(1), lp, lp.stride(0), lp.stride(1),
        oc, oc.stride(0), oc.stride(1), lc, lc.stride(0), lc.stride(1),
        dummy, 0, 0, 0, 1.0, out, out.stride(0), out.stride(1), T * GQ), dict(
        GQ=GQ, D=D, DP=D, HAS_ROT=False, TERMS=1, BLOCK_M=16,
        INTERP=interpreting(rq_extend_merge_kernel)), num_warps=4)
    # prefix row (hk, t * GQ + g) belongs to query head hk * GQ + g of token t
    lp_t = lp.view(HKV, T, GQ).permute(1, 0, 2).reshape(T, HKV * GQ).cpu()
    op_t = op.view(HKV, T, GQ, D).permute(1, 0, 2, 3).reshape(T, HKV * GQ, D).float().cpu()
    lp_t = torch.where(torch.isinf(lp_t), float("-inf"), lp_t)
    m = torch.maximum(lp_t, lc.cpu())
    wp, wc = torch.exp(lp_t - m), torch.exp(lc.cpu() - m)
    want = (op_t * wp[..., None] + oc.float().cpu() * wc[..., None]) / (wp + wc)[..., None]
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float().cpu(), want, atol=2e-2, rtol=1e-2)
    for t, h in ((0, 1), (4, 3), (2, 2)):  # prefix rows (0, 1) +inf, (1, 9) +inf, (1, 4) -inf
        assert torch.equal(out[t, h], oc[t, h]), f"token {t} head {h}: not the chunk output alone"
