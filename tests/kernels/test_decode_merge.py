"""The merge kernel (`rq_decode_merge_kernel`) against a float64 log-sum-exp merge written here.

Two row layouts of the split kernels' output: equal splits (MidO ``[B, Hq, S, DP]``, every
request S rows) and the tc split kernel's token-balanced splits (MidO ``[Hq, G, DP]``, request b
owning ``count_b`` rows from ``first_b``, `rq_kernels.decode_tc.tc_split`). Rows no request owns
hold NaN, so reading one poisons the output. No rotation (the un-rotation is tested with the
split kernels in test_decode.py). Runs under ``TRITON_INTERPRET=1`` on the CPU, compiled on CUDA.
"""

from __future__ import annotations

import math

import pytest
import torch

from rq_kernels.decode import merge_shape
from rq_kernels.triton.decode_mma import rq_decode_merge_kernel


def _merge_f64(q, k_cur, v_cur, rows, mid_o, mid_ml, qk_scale, gq):
    """out[b, h] = (sum_s 2^(m_s - M) o_s + 2^(s_cur - M) v_cur) / (sum_s 2^(m_s - M) l_s +
    2^(s_cur - M)), M the largest of the m_s and s_cur = q . k_cur * qk_scale (log2 units; the
    split-KV merge of FlashDecoding); ``rows(b, h)`` lists the (o, m, l) rows of (b, h)."""
    B, HQ, D = q.shape
    out = torch.empty(B, HQ, D, dtype=torch.float64)
    for b in range(B):
        for h in range(HQ):
            o, ml = rows(b, h)
            s_cur = float(q[b, h].double() @ k_cur[b, h // gq].double()) * qk_scale
            top = max(float(ml[:, 0].max()) if len(ml) else -math.inf, s_cur)
            w = torch.exp2(ml[:, 0].double() - top)
            w_cur = 2.0 ** (s_cur - top)
            num = (o[:, :D].double() * w[:, None]).sum(0) + w_cur * v_cur[b, h // gq].double()
            out[b, h] = num / ((ml[:, 1].double() * w).sum() + w_cur)
    return out


@pytest.mark.parametrize("counts,spare", [([4, 1, 3, 2, 3], 2), ([1, 7], 0), ([2, 2, 2], 3)],
                         ids=["b5_skewed", "b2_long", "b3_uniform"])
@pytest.mark.parametrize("gq", [1, 2])
@pytest.mark.parametrize("balanced", [False, True], ids=["equal", "balanced"])
def test_merge_kernel_against_float64(counts, spare, gq, balanced, device):
    torch.manual_seed(7)
    B, HKV, D = len(counts), 3, 64
    HQ, DP = HKV * gq, D
    q, k_cur, v_cur = (torch.randn(B, h, D).to(torch.bfloat16) for h in (HQ, HKV, HKV))
    qk_scale = D ** -0.5 * math.log2(math.e)
    if balanced:  # request b owns counts[b] rows from first[b]; the spare rows are NaN
        G = sum(counts) + spare
        first = [sum(counts[:b]) for b in range(B)]
        mid_o = torch.full((HQ, G, DP), float("nan"))
        mid_ml = torch.full((HQ, G, 2), float("nan"))
        split_rows = torch.tensor([[f, c] for f, c in zip(first, counts)], dtype=torch.int32)
        for b in range(B):
            sl = slice(first[b], first[b] + counts[b])
            mid_o[:, sl] = torch.randn(HQ, counts[b], DP) * 4
            mid_ml[:, sl, 0] = torch.randn(HQ, counts[b]) * 3
            mid_ml[:, sl, 1] = torch.rand(HQ, counts[b]) * 50 + 1

        def rows(b, h):
            sl = slice(first[b], first[b] + counts[b])
            return mid_o[h, sl], mid_ml[h, sl]
        S = G
    else:  # every request S = max(counts) rows
        S = max(counts)
        mid_o = torch.randn(B, HQ, S, DP) * 4
        mid_ml = torch.stack([torch.randn(B, HQ, S) * 3, torch.rand(B, HQ, S) * 50 + 1], -1)
        split_rows = None

        def rows(b, h):
            return mid_o[b, h], mid_ml[b, h]
    # an empty split (the kernels write m = -1e30, l = 0): request 0's first row of head 0
    r0 = (0, first[0]) if balanced else (0, 0, 0)
    mid_ml[r0] = torch.tensor([-1.0e30, 0.0])
    mid_o[r0] = 0.0
    want = _merge_f64(q, k_cur, v_cur, rows, mid_o, mid_ml, qk_scale, gq)

    q, k_cur, v_cur, mid_o, mid_ml = (t.to(device) for t in (q, k_cur, v_cur, mid_o, mid_ml))
    if split_rows is not None:
        split_rows = split_rows.to(device)
    out = torch.full((B, HQ, D), float("nan"), dtype=torch.bfloat16, device=device)
    block_m, per_iter, reps = merge_shape(B * gq, DP, False)  # as decode_attention launches it
    rq_decode_merge_kernel[(HKV, -(-B * gq // block_m))](
        q, q.stride(0), q.stride(1), k_cur, k_cur.stride(0), k_cur.stride(1),
        v_cur, v_cur.stride(0), v_cur.stride(1), mid_o, mid_ml,
        mid_ml if split_rows is None else split_rows, mid_o, 0, 0, 0, 1.0,
        out, out.stride(0), out.stride(1), B * gq, qk_scale, S,
        GQ=gq, D=D, DP=DP, HAS_ROT=False, TERMS=1, BLOCK_M=block_m, SPLITS_PER_ITER=per_iter,
        ROW_REPS=reps, INTERP=device == "cpu", BALANCED=balanced, num_warps=8)
    assert torch.isfinite(out).all()
    # bf16 output: half an ulp of relative error, plus fp32 sums
    torch.testing.assert_close(out.cpu().double(), want, rtol=2 ** -8, atol=1e-3)
