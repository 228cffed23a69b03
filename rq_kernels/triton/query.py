"""The rotated query ``q R`` (``@triton.jit`` only): fp32 ``[B, Hq, D]`` for the tensor-core CUDA
decode split kernel, bf16 with each KV head's query heads on the row axis for the workspace
extend's FlashAttention call over the prefix."""

import triton
import triton.language as tl

from rq_kernels.triton.common import (
    gqa_rows, pdl_launch_dependents, pdl_wait, rotate_rows, to_bf16,
)


@triton.jit(do_not_specialize=["batch_rows"])  # the row count varies per call (extend chunks)
def rq_rotate_query_kernel(
    Q, s_qb, s_qh,  # [B, Hq, D] bf16
    Rot, s_rterm, s_rhead, s_rrow, alpha,  # [TERMS, Hkv, DP, DP] bf16 (or a dummy)
    Out, s_ob, s_ok, s_og,  # row (b, KV head hk, g) at b * s_ob + hk * s_ok + g * s_og; fp32/bf16
    batch_rows,  # B * GQ
    GQ: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, HAS_ROT: tl.constexpr,
    TERMS: tl.constexpr, BLOCK_M: tl.constexpr, INTERP: tl.constexpr, PDL: tl.constexpr = False,
):
    """Grid ``(num_kv_heads, cdiv(B * GQ, BLOCK_M))``: rows ``(b, query head of this KV
    head)``; ``Out = q R`` exactly to fp32 (the rotation's bf16 terms on tensor cores), rounded
    to nearest even when ``Out`` is bf16. PDL (launched as a programmatic dependent, sm_90+):
    the next kernel may start at once; ``Q`` is read after the previous kernel completes."""
    pdl_launch_dependents(PDL)
    hk, r_mask, b, hq = gqa_rows(batch_rows, GQ, BLOCK_M, 1)
    d = tl.arange(0, DP)
    dm = r_mask[:, None] & (d[None, :] < D)
    pdl_wait(PDL)
    q = tl.load(Q + b[:, None] * s_qb + hq[:, None] * s_qh + d[None, :], mask=dm, other=0.0)
    if HAS_ROT:
        q = rotate_rows(q, Rot + hk * s_rhead, s_rterm, s_rrow, TERMS, False, False, DP,
                        INTERP) * alpha
    else:
        q = q.to(tl.float32)
    if Out.dtype.element_ty == tl.bfloat16:
        q = to_bf16(q, INTERP)
    o = b * s_ob + hk * s_ok + (hq - hk * GQ) * s_og
    tl.store(Out + o[:, None] + d[None, :], q, mask=dm)
