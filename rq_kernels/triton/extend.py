"""The workspace extend's last step (``@triton.jit`` only): un-rotate each row's prefix output and
merge it with the chunk's own causal output by log-sum-exp, in one pass (host side:
`rq_kernels.extend`)."""

import triton
import triton.language as tl

from rq_kernels.triton.common import gqa_rows, rotate_rows, to_bf16


# NOTE: the chunk-dependent integers are not specialised (Triton would compile a variant per
# divisibility of the row count and of FlashAttention's LSE strides: seconds of JIT stalls at a
# serving system's first chunks of each length class).
@triton.jit(do_not_specialize=["rows", "s_lk", "s_lr", "s_mt", "s_mh"])
def rq_extend_merge_kernel(
    Op, s_pk, s_pr,  # prefix output [Hkv, T * GQ, D] rotated basis, bf16 or fp32; row t * GQ + g
    Lp, s_lk, s_lr,  # its LSE [Hkv, T * GQ] fp32, natural log (+inf or -inf: no prefix)
    Oc, s_ct, s_ch,  # chunk output [T, Hq, D] bf16, original basis
    Lc, s_mt, s_mh,  # its LSE [T, Hq] fp32, natural log (finite: a row sees at least itself)
    Rot, s_rterm, s_rhead, s_rrow, alpha,  # [TERMS, Hkv, DP, DP] bf16 (or a dummy)
    Out, s_ot, s_oh,  # [T, Hq, D] bf16
    rows,  # T * GQ
    GQ: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, HAS_ROT: tl.constexpr,
    TERMS: tl.constexpr, BLOCK_M: tl.constexpr, INTERP: tl.constexpr,
):
    """Grid ``(num_kv_heads, cdiv(T * GQ, BLOCK_M))``, rows (token t, query head hq) of one KV
    head: ``Out = (e^(Lp - m) Op R^T + e^(Lc - m) Oc) / (e^(Lp - m) + e^(Lc - m))``,
    ``m = max(Lp, Lc)``. The un-rotation runs on tensor cores, fp32-accurate (`rotate_rows`;
    an fp32 ``Op`` is split into bf16 hi + lo parts). A row without prefix keys has ``Lp``
    ``-inf`` or ``+inf`` (FlashAttention's LSE of a sequence without keys) and ``Op`` 0."""
    hk, r_mask, t, hq = gqa_rows(rows, GQ, BLOCK_M, 1)
    r = t * GQ + hq - hk * GQ  # row within KV head hk
    d = tl.arange(0, DP)
    dm = r_mask[:, None] & (d[None, :] < D)
    op = tl.load(Op + hk * s_pk + r[:, None] * s_pr + d[None, :], mask=dm, other=0.0)
    if HAS_ROT:
        op = rotate_rows(op, Rot + hk * s_rhead, s_rterm, s_rrow, TERMS, True,
                         Op.dtype.element_ty == tl.float32, DP, INTERP) * alpha
    else:
        op = op.to(tl.float32)
    lp = tl.load(Lp + hk * s_lk + r * s_lr, mask=r_mask, other=float("-inf"))
    lp = tl.where(lp == float("inf"), float("-inf"), lp)
    lc = tl.load(Lc + t * s_mt + hq * s_mh, mask=r_mask, other=0.0)
    oc = tl.load(Oc + t[:, None] * s_ct + hq[:, None] * s_ch + d[None, :], mask=dm,
                 other=0.0).to(tl.float32)
    m = tl.maximum(lp, lc)
    wp = tl.exp(lp - m)  # 0 where there is no prefix
    wc = tl.exp(lc - m)
    out = (op * wp[:, None] + oc * wc[:, None]) / (wp + wc)[:, None]
    tl.store(Out + t[:, None] * s_ot + hq[:, None] * s_oh + d[None, :], to_bf16(out, INTERP),
             mask=dm)
