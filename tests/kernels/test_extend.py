"""Extend (prefill) attention: compressed prefix + causal bf16 chunk vs the fp32 reference.

Tolerance policy: as in test_decode.py (flash-attn rule). The reference is
`sglang_rq.reference.extend_attention_reference` (dequantized prefix, then the request's own
chunk, causal, fp32); the yardstick is the same K/V through bf16 PyTorch SDPA. Pass if the max
and Frobenius errors are <= 2x the yardstick's plus a floor (one bf16 ulp of max|ref|;
1e-3 * ||ref||). Outputs are NaN-poisoned first, so unwritten rows fail.
"""

from __future__ import annotations

import pytest
import torch
from attn_cases import build, history, queries

from rq_kernels import extend_attention
from rq_kernels.testing import attention_errors, sdpa_bf16, within_policy
from sglang_rq.config import RQConfig
from sglang_rq.reference import extend_attention_reference

# name, cfg, loops, num_kv_heads, group, head_dim, prefix lens, chunk lens, rotation, loop ids
CPU_CASES = [
    ("ouro_mixed", RQConfig(), 4, 1, 1, 128, [0, 17, 15], [5, 1, 20], "cfg", (0, 3)),
    ("smollm_gqa3_norot", RQConfig(rotation="none"), 4, 1, 3, 64, [97], [17], "cfg", (1,)),
    ("d96_random_orth", RQConfig(), 4, 1, 1, 96, [1, 15], [3, 17], "rand", (2,)),
    ("single_loop_first", RQConfig(anchor="first", lsq=False), 1, 2, 1, 64, [17], [15], "cfg",
     (0,)),
    # a mixed batch: chunks, then one-row requests (decode rows, served by decode_attention)
    ("mixed_decode_rows", RQConfig(), 4, 2, 2, 64, [15, 33, 0, 17], [9, 1, 1, 1], "cfg", (0, 2)),
    ("all_decode_rows", RQConfig(), 4, 1, 1, 128, [17, 1], [1, 1], "cfg", (3,)),
]
GPU_CASES = [
    ("ouro_chunked", RQConfig(), 4, 16, 1, 128, [0, 4096, 1000], [4096, 511, 1], "cfg", (0, 3)),
    ("smollm_gqa3", RQConfig(), 4, 3, 3, 64, [2049, 15], [300, 1025], "cfg", (0,)),
    ("huginn_d96", RQConfig(), 4, 8, 1, 96, [97, 3001], [129, 64], "cfg", (1,)),
    # a batched prefill: radix-cache prefixes and fresh prompts, an empty chunk, one-row chunks
    # between longer ones (one variable-length FlashAttention call per slab)
    ("batch16_gqa4", RQConfig(), 4, 2, 4, 64,
     [0, 300, 0, 17, 1000, 0, 5, 2048, 64, 0, 1, 129, 0, 700, 31, 256],
     [200, 1, 37, 256, 0, 129, 64, 3, 256, 100, 17, 1, 250, 64, 99, 128], "cfg", (0, 3)),
]


def _run(cfg, loops, hkv, group, dim, prefix, chunks, rot, loop_ids, device, seed, **kw):
    view, kv_ind, idx, slots = build(cfg, loops=loops, num_kv_heads=hkv, group=group, dim=dim,
                                     lens=prefix, rot=rot, device=device, seed=seed)
    qp = [0]
    for n in chunks:
        qp.append(qp[-1] + n)
    qo = torch.tensor(qp, dtype=torch.int32, device=device)
    q, kc, vc = queries(qp[-1], hkv * group, hkv, dim, device=device, seed=seed)
    scale = dim ** -0.5
    for loop in loop_ids:
        out = torch.full_like(q, float("nan"))
        extend_attention(q, kc, vc, view, loop, qo, kv_ind, idx, sm_scale=scale, out=out)
        ref = extend_attention_reference(q.float(), kc, vc, view, loop, qo, kv_ind, idx,
                                         sm_scale=scale)
        kh, vh = history(view, slots, loop)
        yard = sdpa_bf16(q, kh, vh, kc, vc, qp, sm_scale=scale)
        assert torch.isfinite(out).all(), "NaN/inf or unwritten output"
        e = attention_errors(out, ref, yard)
        print(f"loop {loop}: " + " ".join(f"{k}={v:.3g}" for k, v in e.items()))
        assert within_policy(e), f"loop {loop}: {e}"


@pytest.mark.parametrize("name,cfg,loops,hkv,group,dim,prefix,chunks,rot,loop_ids", CPU_CASES,
                         ids=[c[0] for c in CPU_CASES])
def test_extend_matches_reference(name, cfg, loops, hkv, group, dim, prefix, chunks, rot,
                                  loop_ids, device):
    if device == "cuda":
        pytest.skip("small interpreter case; GPU runs test_extend_real_size")
    _run(cfg, loops, hkv, group, dim, prefix, chunks, rot, loop_ids, device, seed=41)


@pytest.mark.gpu
@pytest.mark.parametrize("name,cfg,loops,hkv,group,dim,prefix,chunks,rot,loop_ids", GPU_CASES,
                         ids=[c[0] for c in GPU_CASES])
def test_extend_real_size(name, cfg, loops, hkv, group, dim, prefix, chunks, rot, loop_ids,
                          device):
    _run(cfg, loops, hkv, group, dim, prefix, chunks, rot, loop_ids, device, seed=51)


def test_extend_rejects_bad_indptr_values(device):
    """A plan whose indptrs do not rise from 0 within the token count, or point past
    kv_indices, is refused before any launch (it would read out of bounds on the GPU)."""
    view, kv_ind, idx, _ = build(RQConfig(), loops=4, num_kv_heads=1, group=1, dim=64,
                                 lens=[5, 3], rot="cfg", device=device, seed=3)
    q, kc, vc = queries(6, 1, 1, 64, device=device, seed=3)

    def call(qp, kp=None):
        qo = torch.tensor(qp, dtype=torch.int32, device=device)
        kv = kv_ind if kp is None else torch.tensor(kp, dtype=torch.int32, device=device)
        extend_attention(q, kc, vc, view, 0, qo, kv, idx, sm_scale=0.125)

    for bad in ([0, 3, 7], [0, 4, 3], [1, 3, 6]):  # past the tokens, falling, not from 0
        with pytest.raises(AssertionError, match="qo_indptr must rise from 0 to at most num_"):
            call(bad)
    with pytest.raises(AssertionError, match="kv_indptr must rise within kv_indices' 8 rows"):
        call([0, 3, 6], [0, 5, 9])
    with pytest.raises(AssertionError, match=r"kv_indptr must be int32 \[3\] on .* \(batch size 2"):
        call([0, 3, 6], [0, 8])
