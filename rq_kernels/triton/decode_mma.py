"""Decode attention over the compressed cache on tensor cores, GQA (``@triton.jit`` only).

Split kernel: one program = (request, KV head, split of the history). It rotates the query
(``q' = q R``), builds a block-diagonal query ``Qbd [DP, R]`` (column ``g*GQV + h`` holds head
``h``'s query restricted to group ``g``), and per tile of ``BLOCK_N`` history tokens:

* K: ``X = (codes - mid) @ Qbd`` (tensor cores; centred codes are exact in bf16) gives
  per-group partial dots; the logit is ``sum_g c s_a,g X_a,g + s_r,g X_r,g + (c m'_a,g +
  m'_r,g) sum(q'_g)`` with ``m' = m + mid * s``: scales and offsets are applied to ``[N, groups]``
  numbers, never to ``[N, D]`` elements. Centring (``mid = 2^(bits-1)``) keeps the bf16 rounding
  of ``q'`` from being magnified by the group offset.
* V: ``acc[g*GQV + h, :] += (p_h c s_a,g)^T @ codes_a + (p_h s_r,g)^T @ codes_r``; only the
  diagonal blocks (columns in group g) are kept at the end, offsets are summed as ``[g, h]``.

Tensor-core operands are fp16 (the centred codes are exact; ``q'`` and the weights are rounded
8x finer than bf16, so the kernel's error stays below a bf16 SDPA's on the same inputs).

The merge kernel combines the splits by log-sum-exp, un-rotates once (``acc R^T``), adds the
in-flight token (full precision, original basis) and normalises.
"""

import triton
import triton.language as tl

from rq_kernels.triton.common import (
    codes_to_f16, gqa_rows, load_rows, load_scale_offset_raw, mma, pdl_wait, rotate_rows,
    rotate_rows_by, rotation_term,
    split_range, split_scale_offset, to_bf16,
)


@triton.jit
def _fp16(x):
    # NOTE: a V weight p*c*s above 65504 (c*s > 65504) is clamped rather than sent to inf.
    return tl.minimum(tl.maximum(x, -65504.0), 65504.0).to(tl.float16)


@triton.jit
def rq_decode_mma_split_kernel(
    Q, s_qb, s_qh,  # [B, Hq, D] bf16
    KvIndptr, KvIndices,  # [B+1] int32, [nnz] int64
    Ac, s_ac_r, s_ac_kv, s_ac_h: tl.constexpr,  # anchor codes [rows, 2, Hkv, DA] uint8
    Aso, s_aso_r, s_aso_kv, s_aso_h: tl.constexpr,  # anchor scale_offset [rows, 2, Hkv, NG, 2]
    Rc, s_rc_r, s_rc_kv, s_rc_h: tl.constexpr,  # residual codes (or dummy)
    Rso, s_rso_r, s_rso_kv, s_rso_h: tl.constexpr,  # residual scale_offset (or dummy)
    Cf, s_cf_r, s_cf_kv, s_cf_h,  # coefficients [rows, 2, Hkv] bf16 (or dummy)
    Rot, s_rterm, s_rhead, s_rrow, alpha,  # [TERMS, Hkv, DP, DP] bf16
    MidO, MidML,  # [B, Hq, S, DP] fp32, [B, Hq, S, 2] fp32 (running max in log2 units, sum)
    qk_scale, num_splits,  # sm_scale * log2(e)
    GQ: tl.constexpr, GQV: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, G: tl.constexpr,
    NG: tl.constexpr, NGP: tl.constexpr, A_BITS: tl.constexpr, R_BITS: tl.constexpr,
    HAS_COEF: tl.constexpr, HAS_ROT: tl.constexpr, TERMS: tl.constexpr,
    BLOCK_N: tl.constexpr, INTERP: tl.constexpr, FAST: tl.constexpr,
):
    R: tl.constexpr = NGP * GQV
    MID_A: tl.constexpr = 1 << (A_BITS - 1)
    MID_R: tl.constexpr = 1 << (R_BITS - 1) if R_BITS > 0 else 0
    QROWS: tl.constexpr = 16 if GQV < 16 else GQV
    hk = tl.program_id(0)  # heads fastest: the Hkv programs of a (request, split) run together
    b = tl.program_id(1)  # and share the sectors / DRAM rows of their token rows
    split = tl.program_id(2)
    hk64 = hk.to(tl.int64)  # head-major views: head strides of rows x bytes
    start, lo, hi = split_range(KvIndptr, b, split, num_splits, BLOCK_N)

    # ---- rotated query, as [DP, R] block-diagonal bf16 and per-group sums [NGP, GQV]
    d = tl.arange(0, DP)
    hrow = tl.arange(0, QROWS)
    q = tl.load(Q + b * s_qb + (hk * GQ + hrow[:, None]) * s_qh + d[None, :],
                mask=(hrow[:, None] < GQ) & (d[None, :] < D), other=0.0)  # [QROWS, DP]
    if HAS_ROT:
        q = rotate_rows(q, Rot + hk * s_rhead, s_rterm, s_rrow, TERMS, False, False, DP,
                        INTERP) * alpha
    else:
        q = q.to(tl.float32)
    q3 = tl.reshape(tl.trans(q), [DP, QROWS // GQV, GQV])  # [DP, x, h]: keep x == 0
    xsel = tl.arange(0, QROWS // GQV)
    qt = tl.sum(tl.where(xsel[None, :, None] == 0, q3, 0.0), axis=1)  # [DP, GQV]
    gsel = tl.arange(0, NGP)
    in_g = (d // G)[:, None, None] == gsel[None, :, None]  # [DP, NGP, 1]
    qbd3 = tl.where(in_g, qt[:, None, :], 0.0)  # [DP, NGP, GQV]
    # fp16 operands (8x finer than bf16); a power-of-two prescale keeps |q'| < 2^15
    e_max = ((tl.max(tl.abs(qt)).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    pre = tl.exp2(-tl.maximum(e_max - 14, 0).to(tl.float32))
    qsum = tl.sum(qbd3, axis=0) * pre  # [NGP, GQV]
    qbd = tl.reshape(qbd3 * pre, [DP, R]).to(tl.float16)
    qk_scale = qk_scale / pre

    m_i = tl.full([GQV], float("-inf"), tl.float32)
    l_i = tl.zeros([GQV], tl.float32)
    acc = tl.zeros([R, DP], tl.float32)
    acc_m = tl.zeros([NGP, GQV], tl.float32)
    ca = tl.arange(0, DP * A_BITS // 8)
    cr = tl.arange(0, DP * R_BITS // 8 if R_BITS > 0 else 1)
    for n0 in range(lo, hi, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs < hi
        slot = tl.load(KvIndices + start + offs, mask=n_mask, other=0)
        # small loads first (their latency overlaps the K unpacking), then the code tiles
        mk_a = load_scale_offset_raw(Aso + hk64 * s_aso_h, slot, s_aso_r, n_mask, NG, NGP)
        mv_a = load_scale_offset_raw(Aso + s_aso_kv + hk64 * s_aso_h, slot, s_aso_r, n_mask, NG, NGP)
        if R_BITS > 0:
            mk_r = load_scale_offset_raw(Rso + hk64 * s_rso_h, slot, s_rso_r, n_mask, NG, NGP)
            mv_r = load_scale_offset_raw(Rso + s_rso_kv + hk64 * s_rso_h, slot, s_rso_r, n_mask, NG,
                                         NGP)
        if HAS_COEF:
            ck = tl.load(Cf + slot * s_cf_r + hk64 * s_cf_h, mask=n_mask, other=0.0)
            cv = tl.load(Cf + s_cf_kv + slot * s_cf_r + hk64 * s_cf_h, mask=n_mask, other=0.0)
        kc = load_rows(Ac + hk64 * s_ac_h, slot, s_ac_r, ca, n_mask, D * A_BITS // 8)
        vc = load_rows(Ac + s_ac_kv + hk64 * s_ac_h, slot, s_ac_r, ca, n_mask, D * A_BITS // 8)
        if R_BITS > 0:
            kr = load_rows(Rc + hk64 * s_rc_h, slot, s_rc_r, cr, n_mask, D * R_BITS // 8)
            vr = load_rows(Rc + s_rc_kv + hk64 * s_rc_h, slot, s_rc_r, cr, n_mask, D * R_BITS // 8)
        # ---------------- K: per-group dots on tensor cores, scales on [N, groups]
        kc = codes_to_f16(kc, A_BITS, FAST)
        xa = tl.reshape(mma(kc, qbd, INTERP), [BLOCK_N, NGP, GQV])
        s_a, o_a = split_scale_offset(mk_a, NGP)
        o_a += MID_A * s_a
        if HAS_COEF:
            s_a = s_a * ck.to(tl.float32)[:, None]
            o_a = o_a * ck.to(tl.float32)[:, None]
        logit3 = xa * s_a[:, :, None]
        if R_BITS > 0:
            kr = codes_to_f16(kr, R_BITS, FAST)
            xr = tl.reshape(mma(kr, qbd, INTERP), [BLOCK_N, NGP, GQV])
            s_r, o_r = split_scale_offset(mk_r, NGP)
            logit3 += xr * s_r[:, :, None]
            o_a += o_r + MID_R * s_r
        logit3 += o_a[:, :, None] * qsum[None, :, :]
        qk = tl.sum(logit3, axis=1) * qk_scale  # [BLOCK_N, GQV]
        qk = tl.where(n_mask[:, None], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=0))
        alpha_h = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[None, :])  # [BLOCK_N, GQV]
        l_i = l_i * alpha_h + tl.sum(p, axis=0)
        m_i = m_new
        # ---------------- V: weights p*c*s per (group, head) row, codes on tensor cores
        sv_a, ov_a = split_scale_offset(mv_a, NGP)
        ov_a += MID_A * sv_a
        if HAS_COEF:
            sv_a = sv_a * cv.to(tl.float32)[:, None]
            ov_a = ov_a * cv.to(tl.float32)[:, None]
        w_a = _fp16(tl.reshape(p[:, None, :] * sv_a[:, :, None], [BLOCK_N, R]))
        alpha_r = tl.reshape(tl.broadcast_to(alpha_h[None, :], [NGP, GQV]), [R])
        vc = codes_to_f16(vc, A_BITS, FAST)
        acc = acc * alpha_r[:, None] + mma(tl.trans(w_a), vc, INTERP)
        if R_BITS > 0:
            sv_r, ov_r = split_scale_offset(mv_r, NGP)
            w_r = _fp16(tl.reshape(p[:, None, :] * sv_r[:, :, None], [BLOCK_N, R]))
            vr = codes_to_f16(vr, R_BITS, FAST)
            acc += mma(tl.trans(w_r), vr, INTERP)
            ov_a += ov_r + MID_R * sv_r
        acc_m = acc_m * alpha_h[None, :] + tl.sum(p[:, None, :] * ov_a[:, :, None], axis=0)

    # ---- keep the diagonal blocks: out[h, d] = acc[group(d)*GQV + h, d] + acc_m[group(d), h]
    acc3 = tl.reshape(acc, [NGP, GQV, DP])
    sel = gsel[:, None, None] == (d // G)[None, None, :]  # [NGP, 1, DP]
    out = tl.sum(tl.where(sel, acc3 + acc_m[:, :, None], 0.0), axis=0)  # [GQV, DP]
    h = tl.arange(0, GQV)
    row = (b * GQ * tl.num_programs(0) + hk * GQ + h) * num_splits + split  # [GQV]
    h_mask = h < GQ
    tl.store(MidO + row[:, None] * DP + d[None, :], out, mask=h_mask[:, None])
    tl.store(MidML + row * 2, m_i, mask=h_mask)
    tl.store(MidML + row * 2 + 1, l_i, mask=h_mask)


@triton.jit
def _in_flight(Q, s_qb, s_qh, Kc, s_kb, s_kh, Vc, s_vb, s_vh, b, hq, hk, dm, d, qk_scale):
    """The in-flight token of rows ``(b, hq)``: its logit ``q.k_cur * qk_scale`` (log2 units)
    ``[rows]`` and ``v_cur`` ``[rows, DP]``, fp32."""
    q = tl.load(Q + b[:, None] * s_qb + hq[:, None] * s_qh + d[None, :], mask=dm,
                other=0.0).to(tl.float32)
    kc = tl.load(Kc + b[:, None] * s_kb + hk * s_kh + d[None, :], mask=dm,
                 other=0.0).to(tl.float32)
    vc = tl.load(Vc + b[:, None] * s_vb + hk * s_vh + d[None, :], mask=dm,
                 other=0.0).to(tl.float32)
    return tl.sum(q * kc, axis=1) * qk_scale, vc


@triton.jit
def rq_decode_merge_kernel(
    Q, s_qb, s_qh, Kc, s_kb, s_kh, Vc, s_vb, s_vh,  # [B, Hq, D], [B, Hkv, D] x2
    MidO, MidML,  # [B, Hq, S, DP] fp32, [B, Hq, S, 2] fp32 (BALANCED: [Hq, S, ...])
    SplitRows,  # BALANCED: [B, 2] int32 (first row, split count)
    Rot, s_rterm, s_rhead, s_rrow, alpha,  # [TERMS, Hkv, DP, DP] bf16
    Out, s_ob, s_oh,  # [B, Hq, D]
    batch_rows, qk_scale, num_splits,  # batch_rows = B * GQ
    GQ: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, HAS_ROT: tl.constexpr,
    TERMS: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS_PER_ITER: tl.constexpr,
    ROW_REPS: tl.constexpr, INTERP: tl.constexpr, PDL: tl.constexpr = False,
    BALANCED: tl.constexpr = False,
):
    """Grid ``(num_kv_heads, cdiv(batch_rows, BLOCK_M))``. Each iteration loads SPLITS_PER_ITER
    splits of the program's BLOCK_M rows at once (a loop of one split per iteration paid one
    dependent L2 round trip per split: ~30 us at 64 splits on the H200); small batches take few
    rows and many splits per iteration. The un-rotation runs on tensor cores over at least 16
    rows: BLOCK_M < 16 rows are repeated ROW_REPS times (the copies are not stored). PDL
    (launched as a programmatic dependent, sm_90+): the program starts while the split kernel
    runs and, for a few rows, loads what the split kernel does not write (the in-flight token, a
    one-term rotation) before it waits for the split kernel's output. BALANCED (the tc split
    kernel's token-balanced splits, `rq_kernels.decode_tc.tc_split`): the S rows are shared by
    the batch and request b owns ``SplitRows[b, 1]`` of them from ``SplitRows[b, 0]``."""
    hk, r_mask, b, hq = gqa_rows(batch_rows, GQ, BLOCK_M, 1)
    d = tl.arange(0, DP)
    _, r_mask2, b2, hq2 = gqa_rows(batch_rows, GQ, BLOCK_M, ROW_REPS)
    dm = r_mask2[:, None] & (d[None, :] < D)
    if ROW_REPS > 1:
        # few rows (a short split loop): what the split kernel does not write (the in-flight
        # token, a one-term rotation) is loaded before the wait, while the split kernel runs
        # (at 12 rows of 64 it made the program 1.1x slower: then it is loaded after the loop)
        s_cur, vc = _in_flight(Q, s_qb, s_qh, Kc, s_kb, s_kh, Vc, s_vb, s_vh, b2, hq2, hk, dm, d,
                               qk_scale)
        if HAS_ROT and TERMS == 1:
            r_term = rotation_term(Rot + hk * s_rhead, s_rrow, True, DP)
    pdl_wait(PDL)
    if BALANCED:
        first = tl.load(SplitRows + b * 2, mask=r_mask, other=0)
        count = tl.load(SplitRows + b * 2 + 1, mask=r_mask, other=0)
        mid = hq.to(tl.int64) * num_splits + first  # [BLOCK_M], 64-bit
        n_rows = tl.max(count, axis=0)
    else:
        count = tl.zeros([BLOCK_M], tl.int32) + num_splits
        mid = (b * GQ * tl.num_programs(0) + hq).to(tl.int64) * num_splits
        n_rows = num_splits
    m_run = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_run = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DP], tl.float32)
    sb = tl.arange(0, SPLITS_PER_ITER)
    for s0 in range(0, n_rows, SPLITS_PER_ITER):
        s_mask = r_mask[:, None] & (s0 + sb[None, :] < count[:, None])  # [BLOCK_M, SB]
        row = mid[:, None] + s0 + sb[None, :]
        m_s = tl.load(MidML + row * 2, mask=s_mask, other=float("-inf"))
        l_s = tl.load(MidML + row * 2 + 1, mask=s_mask, other=0.0)
        o_s = tl.load(MidO + row[:, :, None] * DP + d[None, None, :], mask=s_mask[:, :, None],
                      other=0.0)  # [BLOCK_M, SB, DP]
        m_new = tl.maximum(m_run, tl.max(m_s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        a_old = tl.exp2(m_run - m_safe)
        a_new = tl.exp2(m_s - m_safe[:, None])  # [BLOCK_M, SB]; 0 for empty splits
        acc = acc * a_old[:, None] + tl.sum(o_s * a_new[:, :, None], axis=1)
        l_run = l_run * a_old + tl.sum(l_s * a_new, axis=1)
        m_run = m_new
    if ROW_REPS > 1:  # rows r and r + k * BLOCK_M are the same row
        acc = tl.reshape(tl.broadcast_to(acc[None, :, :], [ROW_REPS, BLOCK_M, DP]),
                         [ROW_REPS * BLOCK_M, DP])
        m_run = tl.reshape(tl.broadcast_to(m_run[None, :], [ROW_REPS, BLOCK_M]),
                           [ROW_REPS * BLOCK_M])
        l_run = tl.reshape(tl.broadcast_to(l_run[None, :], [ROW_REPS, BLOCK_M]),
                           [ROW_REPS * BLOCK_M])
    if HAS_ROT:  # back to the original basis: acc R^T
        if ROW_REPS > 1 and TERMS == 1:
            acc = rotate_rows_by(acc, r_term, True, INTERP) * alpha
        else:
            acc = rotate_rows(acc, Rot + hk * s_rhead, s_rterm, s_rrow, TERMS, True, True, DP,
                              INTERP) * alpha
    if ROW_REPS == 1:
        s_cur, vc = _in_flight(Q, s_qb, s_qh, Kc, s_kb, s_kh, Vc, s_vb, s_vh, b2, hq2, hk, dm, d,
                               qk_scale)
    m_new = tl.maximum(m_run, s_cur)
    a_old = tl.exp2(m_run - m_new)
    p_cur = tl.exp2(s_cur - m_new)
    acc = acc * a_old[:, None] + vc * p_cur[:, None]
    l_run = l_run * a_old + p_cur
    out = acc / l_run[:, None]
    tl.store(Out + b2[:, None] * s_ob + hq2[:, None] * s_oh + d[None, :],
             to_bf16(out, INTERP), mask=dm)
