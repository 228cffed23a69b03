"""Extend (prefill) attention: compressed prefix + causal BF16 chunk (``@triton.jit`` only).

One program = (request, query head, block of ``BLOCK_M`` chunk tokens). Stage 1 walks the
compressed prefix in the rotated basis: each ``[BLOCK_N, D]`` K/V tile is dequantized in
registers (``c (m_a + s_a q_a) + m_r + s_r q_r``), rounded to fp16 and fed to the tensor cores
with ``q' = q R`` (fp16, power-of-two prescaled); nothing is written back to HBM. fp16 keeps
the extra roundings (of ``q'`` and ``P``) 8x below a bf16 SDPA's. The accumulator is then
un-rotated once (``acc R^T``) and stage 2 continues the same online softmax over the request's
own chunk (bf16, original basis, causal).
"""

import triton
import triton.language as tl

from rq_kernels.triton.common import (
    load_meta, load_rows, mma, rotate_rows, to_bf16, unpack_codes,
)


@triton.jit
def _fp16(x):
    # NOTE: prefix tiles and P run in fp16 (8x finer than bf16); |k|,|v| > 65504 clamp.
    return tl.minimum(tl.maximum(x, -65504.0), 65504.0).to(tl.float16)


@triton.jit
def _dequant_tile(codes, Cm, s_cm_r, Cc, s_cc_r, slot, n_mask, BITS: tl.constexpr, ncol,
                  NG: tl.constexpr, BLOCK_N: tl.constexpr, NGP: tl.constexpr, G: tl.constexpr,
                  c):
    """``c * (offset + scale * code)`` as ``[BLOCK_N, NGP*G]`` fp32 (``c`` is ``[BLOCK_N]``)."""
    q = unpack_codes(load_rows(Cc, slot, s_cc_r, codes, n_mask, ncol), BITS).to(tl.float32)
    s, o = load_meta(Cm, slot, s_cm_r, n_mask, NG, NGP)
    q3 = tl.reshape(q, [BLOCK_N, NGP, G])
    x3 = (o * c[:, None])[:, :, None] + (s * c[:, None])[:, :, None] * q3
    return tl.reshape(x3, [BLOCK_N, NGP * G])


@triton.jit
def _load_compressed(kv, hk, slot, n_mask,
                     Ac, s_ac_r, s_ac_kv, s_ac_h, Am, s_am_r, s_am_kv, s_am_h,
                     Rc, s_rc_r, s_rc_kv, s_rc_h, Rm, s_rm_r, s_rm_kv, s_rm_h,
                     Cf, s_cf_r, s_cf_kv, s_cf_h,
                     D: tl.constexpr, G: tl.constexpr, NG: tl.constexpr, NGP: tl.constexpr,
                     A_BITS: tl.constexpr, R_BITS: tl.constexpr, HAS_COEF: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    """Reconstructed K (kv=0) or V (kv=1) tile in the rotated basis, ``[BLOCK_N, DP]`` fp32."""
    if HAS_COEF:
        c = tl.load(Cf + kv * s_cf_kv + slot * s_cf_r + hk * s_cf_h, mask=n_mask,
                    other=0.0).to(tl.float32)
    else:
        c = tl.full([BLOCK_N], 1.0, tl.float32)
    x = _dequant_tile(tl.arange(0, NGP * G * A_BITS // 8), Am + kv * s_am_kv + hk * s_am_h,
                      s_am_r, Ac + kv * s_ac_kv + hk * s_ac_h, s_ac_r, slot, n_mask, A_BITS,
                      D * A_BITS // 8, NG, BLOCK_N, NGP, G, c)
    if R_BITS > 0:
        x += _dequant_tile(tl.arange(0, NGP * G * R_BITS // 8), Rm + kv * s_rm_kv + hk * s_rm_h,
                           s_rm_r, Rc + kv * s_rc_kv + hk * s_rc_h, s_rc_r, slot, n_mask,
                           R_BITS, D * R_BITS // 8, NG, BLOCK_N, NGP, G,
                           tl.full([BLOCK_N], 1.0, tl.float32))
    return x


@triton.jit
def rq_extend_kernel(
    Q, s_qt, s_qh, Kc, s_kt, s_kh, Vc, s_vt, s_vh,  # [T, Hq, D], [T, Hkv, D] x2 (bf16)
    QoIndptr, KvIndptr, KvIndices,  # [B+1] int32, [B+1] int32, [nnz] int64
    Ac, s_ac_r, s_ac_kv, s_ac_h: tl.constexpr, Am, s_am_r, s_am_kv, s_am_h: tl.constexpr,
    Rc, s_rc_r, s_rc_kv, s_rc_h: tl.constexpr, Rm, s_rm_r, s_rm_kv, s_rm_h: tl.constexpr,
    Cf, s_cf_r, s_cf_kv, s_cf_h,
    Rot, s_rterm, s_rhead, s_rrow, alpha,  # [TERMS, Hkv, DP, DP] bf16
    Out, s_ot, s_oh,  # [T, Hq, D]
    qk_scale,
    GQ: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, G: tl.constexpr, NG: tl.constexpr,
    NGP: tl.constexpr, A_BITS: tl.constexpr, R_BITS: tl.constexpr, HAS_COEF: tl.constexpr,
    HAS_ROT: tl.constexpr, TERMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    INTERP: tl.constexpr,
):
    b = tl.program_id(0)
    hq = tl.program_id(1)
    hk = hq // GQ
    q_start = tl.load(QoIndptr + b)
    q_len = tl.load(QoIndptr + b + 1) - q_start
    m0 = tl.program_id(2) * BLOCK_M
    if m0 >= q_len:
        return
    kv_start = tl.load(KvIndptr + b)
    kv_len = tl.load(KvIndptr + b + 1) - kv_start
    d = tl.arange(0, DP)
    mrow = m0 + tl.arange(0, BLOCK_M)
    m_mask = mrow < q_len
    dm = m_mask[:, None] & (d[None, :] < D)
    q = tl.load(Q + (q_start + mrow)[:, None] * s_qt + hq * s_qh + d[None, :], mask=dm,
                other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DP], tl.float32)

    # ---- stage 1: compressed prefix, rotated basis
    # fp16 operands (8x finer than bf16); a power-of-two prescale keeps |q'| < 2^15
    if HAS_ROT:
        qr = rotate_rows(q, Rot + hk * s_rhead, s_rterm, s_rrow, TERMS, False, False, DP,
                         INTERP) * alpha
    else:
        qr = q.to(tl.float32)
    e_max = ((tl.max(tl.abs(qr)).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    pre = tl.exp2(-tl.maximum(e_max - 14, 0).to(tl.float32))
    qr = (qr * pre).to(tl.float16)
    for n0 in range(0, kv_len, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs < kv_len
        slot = tl.load(KvIndices + kv_start + offs, mask=n_mask, other=0)
        k = _load_compressed(0, hk, slot, n_mask, Ac, s_ac_r, s_ac_kv, s_ac_h, Am, s_am_r,
                             s_am_kv, s_am_h, Rc, s_rc_r, s_rc_kv, s_rc_h, Rm, s_rm_r, s_rm_kv,
                             s_rm_h, Cf, s_cf_r, s_cf_kv, s_cf_h, D, G, NG, NGP, A_BITS, R_BITS,
                             HAS_COEF, BLOCK_N)
        qk = mma(qr, tl.trans(_fp16(k)), INTERP) * (qk_scale / pre)  # [BLOCK_M, BLOCK_N]
        qk = tl.where(n_mask[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        a = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * a + tl.sum(p, axis=1)
        m_i = m_new
        v = _load_compressed(1, hk, slot, n_mask, Ac, s_ac_r, s_ac_kv, s_ac_h, Am, s_am_r,
                             s_am_kv, s_am_h, Rc, s_rc_r, s_rc_kv, s_rc_h, Rm, s_rm_r, s_rm_kv,
                             s_rm_h, Cf, s_cf_r, s_cf_kv, s_cf_h, D, G, NG, NGP, A_BITS, R_BITS,
                             HAS_COEF, BLOCK_N)
        acc = acc * a[:, None] + mma(p.to(tl.float16), _fp16(v), INTERP)
    if HAS_ROT:
        acc = rotate_rows(acc, Rot + hk * s_rhead, s_rterm, s_rrow, TERMS, True, True, DP,
                          INTERP) * alpha

    # ---- stage 2: the request's own chunk, bf16, causal (key j visible to query i if j <= i)
    for n0 in range(0, tl.minimum(m0 + BLOCK_M, q_len), BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs < q_len
        km = n_mask[:, None] & (d[None, :] < D)
        k = tl.load(Kc + (q_start + offs)[:, None] * s_kt + hk * s_kh + d[None, :], mask=km,
                    other=0.0)
        qk = mma(q, tl.trans(k), INTERP) * qk_scale
        vis = n_mask[None, :] & (offs[None, :] <= mrow[:, None])
        qk = tl.where(vis, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        a = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * a + tl.sum(p, axis=1)
        m_i = m_new
        v = tl.load(Vc + (q_start + offs)[:, None] * s_vt + hk * s_vh + d[None, :], mask=km,
                    other=0.0)
        acc = acc * a[:, None] + mma(p.to(tl.float16), _fp16(v.to(tl.float32)), INTERP)
    out = acc / l_i[:, None]
    tl.store(Out + (q_start + mrow)[:, None] * s_ot + hq * s_oh + d[None, :],
             to_bf16(out, INTERP), mask=dm)
