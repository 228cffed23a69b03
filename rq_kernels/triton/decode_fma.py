"""Decode attention over the compressed cache on CUDA cores, MHA (``@triton.jit`` only).

Plain CUDA-core kernel, no tensor cores in the main loop (decode is memory-bound). The split
kernel streams ``BLOCK_N`` history tokens per tile. One program handles one (KV head, request,
split). KV heads are the fastest grid axis, so the head programs of one (request, split) read
the same token rows together and share their scale_offset and coefficient sectors in L2.

Code words, not bytes
---------------------
The packed codes are read as int32 words. Each group's words are contiguous: 16 B per
(token, group) for INT4 with g = 32, 8 B for INT2. A *frame* is 16 consecutive elements: one
INT2 word, two INT4 words or four INT8 words. Each code becomes an exact fp32 value with one
AND and one FFMA, and no shift:

    f = float_bits((w & (mask << pos)) | 0x3F800000)    # 1 + code * 2^(pos - 23), exact
    code = f * 2^(23 - pos) - 2^(23 - pos)              # exact (fused or not)

Codes sit at bit positions ``pos <= 15``. One extra ``w >> 16`` per word covers the upper
half. The 16 values of a frame are assembled with `tl.join`, which keeps the new dims in
registers. The join order is chosen so that the final ``[.., 2, 2, 2, 2]`` reshapes to the
natural element order ``16 * frame + p``. So the decoded ``[BLOCK_N, groups, G]`` tile is
already in the rotated-basis order of ``q'``, and no interleave or shuffle is needed.

Math per tile (rotated basis, ``X = sum_e code_e * q'_e`` per (token, group, head))
------------------------------------------------------------------------------------
    logit = sum_g  c s_a X_a + s_r X_r + (c m_a + m_r) sum_e q'_e
    acc  += (p c s_a) code_a + (p s_r) code_r       (per element; offsets summed per group)

The online softmax runs *per tile row*: token ``n0 + i`` updates row ``i``'s own max, sum and
``[groups, G]`` accumulator. There is no reduction across threads in the loop, apart from the
small one over groups for the logits. The rows are merged by log-sum-exp once, at the end of
the program. The output ``MidO [B, Hq, S, DP]`` (unnormalised, rotated basis) and ``MidML``
(max in log2 units, sum) have exactly the layout that `rq_decode_merge_kernel` (decode_mma.py) consumes.
That kernel un-rotates once, adds the in-flight token and normalises.

One query head per KV head (MHA); GQA runs the tensor-core split kernel
(`rq_kernels/triton/decode_mma.py`), which amortises the decoded codes over the group's heads.
"""

import triton
import triton.language as tl

from rq_kernels.triton.common import fp8_bits_to_f32, rotate_rows, split_range


@triton.jit
def _leaf(w, MASK: tl.constexpr, POS: tl.constexpr, magic):
    """Code ``(w & MASK) >> POS`` of int32 ``w`` -> exact fp32 value. ``magic`` is the runtime
    int32 0x3F800000: as a register (not an immediate) it lets ptxas fuse the AND and the OR
    into one LOP3."""
    C: tl.constexpr = 1 << (23 - POS)
    f = ((w & MASK) | magic).to(tl.float32, bitcast=True)  # 1 + code * 2^(POS - 23)
    return f * C - C


@triton.jit
def _decode_int2(w, mg):
    """``[.., WG]`` int32 (16 crumbs per word, crumb p at bits 2p) -> ``[.., WG, 2, 2, 2, 2]``
    exact fp32 codes, index ``(d0, d1, d2, d3)`` = element ``8 d0 + 4 d1 + 2 d2 + d3``."""
    a = tl.join(w, w >> 16)  # d0: crumbs 0..7 / 8..15, each at bits 0..15
    return tl.join(
        tl.join(tl.join(_leaf(a, 0x3, 0, mg), _leaf(a, 0x300, 8, mg)),
                tl.join(_leaf(a, 0x30, 4, mg), _leaf(a, 0x3000, 12, mg))),
        tl.join(tl.join(_leaf(a, 0xC, 2, mg), _leaf(a, 0xC00, 10, mg)),
                tl.join(_leaf(a, 0xC0, 6, mg), _leaf(a, 0xC000, 14, mg))))


@triton.jit
def _decode_int4(w, mg):
    """``[.., WG, 2]`` int32 (the two INT4 words of each frame: d0) -> ``[.., WG, 2, 2, 2, 2]``."""
    b = tl.join(w, w >> 16)  # d1: nibbles 0..3 / 4..7 of each word, at bits 0..15
    return tl.join(tl.join(_leaf(b, 0xF, 0, mg), _leaf(b, 0xF00, 8, mg)),
                   tl.join(_leaf(b, 0xF0, 4, mg), _leaf(b, 0xF000, 12, mg)))


@triton.jit
def _decode_int8(w, mg):
    """``[.., WG, 2, 2]`` int32 (the four INT8 words of each frame: d0, d1) ->
    ``[.., WG, 2, 2, 2, 2]``."""
    c = tl.join(w, w >> 16)  # d2
    return tl.join(_leaf(c, 0xFF, 0, mg), _leaf(c, 0xFF00, 8, mg))


@triton.jit
def _gather_words(base, slot, s_row, n_mask, NG, BITS: tl.constexpr, G: tl.constexpr,
                  NGP: tl.constexpr):
    """Gather the int32 code words of ``BLOCK_N`` tokens: ``[BLOCK_N, NGP, G*BITS/32]``, one
    thread loads a whole group (16 B for INT4 g32)."""
    WPF: tl.constexpr = BITS // 2  # words per 16-element frame
    WG: tl.constexpr = G // 16  # frames per group
    g = tl.arange(0, NGP)
    j = tl.arange(0, WG * WPF)
    offs = slot[:, None, None] * s_row + g[None, :, None] * (WG * WPF) + j[None, None, :]
    offs = tl.max_contiguous(offs, [1, 1, WG * WPF])
    m = n_mask[:, None, None] & (g < NG)[None, :, None]
    return tl.load(base + offs, mask=m, other=0)


@triton.jit
def _decode_words(w, mg, BITS: tl.constexpr, G: tl.constexpr, NGP: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """`_gather_words` output -> ``[BLOCK_N, NGP, G]`` exact fp32 codes in natural order."""
    WG: tl.constexpr = G // 16
    if BITS == 2:
        v = _decode_int2(w, mg)
    elif BITS == 4:
        v = _decode_int4(tl.reshape(w, [BLOCK_N, NGP, WG, 2]), mg)
    else:
        v = _decode_int8(tl.reshape(w, [BLOCK_N, NGP, WG, 2, 2]), mg)
    return tl.reshape(v, [BLOCK_N, NGP, G])


@triton.jit
def _gather_scale_offset(base, slot, s_row, n_mask, NG, NGP: tl.constexpr):
    """Raw FP8 (scale, offset) bytes ``[BLOCK_N, NGP, 2]`` uint8. The 3-D shape with a
    contiguous last dim gives the same thread mapping as the code tiles (Triton 3.6 and 3.8), so
    no shared-memory layout conversion is needed per tile."""
    g = tl.arange(0, NGP)
    k = tl.arange(0, 2)
    offs = slot[:, None, None] * s_row + g[None, :, None] * 2 + k[None, None, :]
    return tl.load(base + offs, mask=n_mask[:, None, None] & (g < NG)[None, :, None], other=0)


@triton.jit
def _scale_offset_values(x):
    """``[BLOCK_N, NGP, 2]`` FP8 bytes -> (scale, offset) ``[BLOCK_N, NGP]`` fp32."""
    s, o = tl.split(x)
    return fp8_bits_to_f32(s), fp8_bits_to_f32(o)


@triton.jit
def _anchor_scale_offset(x, cw, HAS_COEF: tl.constexpr):
    """The anchor's (scale, offset) of `_scale_offset_values`, times the LSQ coefficient ``c`` of
    each token (``cw`` ``[BLOCK_N]`` bf16) when the loop has one."""
    s, o = _scale_offset_values(x)
    if HAS_COEF:
        c = cw.to(tl.float32)
        s = s * c[:, None]
        o = o * c[:, None]
    return s, o


@triton.jit
def _load_tile(n0, hi, KvIndices, start, Ac, s_ac_r, s_ac_kv, Aso, s_aso_r, s_aso_kv, Rc, s_rc_r,
               s_rc_kv, Rso, s_rso_r, s_rso_kv, Cf, s_cf_r, s_cf_kv, NG,
               G: tl.constexpr, NGP: tl.constexpr, A_BITS: tl.constexpr, R_BITS: tl.constexpr,
               HAS_COEF: tl.constexpr, BLOCK_N: tl.constexpr, IDX64: tl.constexpr):
    """Every global load of one tile (raw words, (scale, offset) pairs, coefficients). Bases
    already point at this program's KV head. Loops without a residual or coefficients get
    1-element dummies."""
    offs = n0 + tl.arange(0, BLOCK_N)
    n_mask = offs < hi
    slot = tl.load(KvIndices + start + offs, mask=n_mask, other=0)
    if not IDX64:  # every pool offset fits in int32: 32-bit address math (IMAD.WIDE)
        slot = slot.to(tl.int32)
    ka = _gather_words(Ac, slot, s_ac_r, n_mask, NG, A_BITS, G, NGP)
    va = _gather_words(Ac + s_ac_kv, slot, s_ac_r, n_mask, NG, A_BITS, G, NGP)
    kaso = _gather_scale_offset(Aso, slot, s_aso_r, n_mask, NG, NGP)
    vaso = _gather_scale_offset(Aso + s_aso_kv, slot, s_aso_r, n_mask, NG, NGP)
    if R_BITS > 0:
        kr = _gather_words(Rc, slot, s_rc_r, n_mask, NG, R_BITS, G, NGP)
        vr = _gather_words(Rc + s_rc_kv, slot, s_rc_r, n_mask, NG, R_BITS, G, NGP)
        krso = _gather_scale_offset(Rso, slot, s_rso_r, n_mask, NG, NGP)
        vrso = _gather_scale_offset(Rso + s_rso_kv, slot, s_rso_r, n_mask, NG, NGP)
    else:
        kr = tl.zeros([1], tl.int32)
        vr = tl.zeros([1], tl.int32)
        krso = tl.zeros([1], tl.uint8)
        vrso = tl.zeros([1], tl.uint8)
    if HAS_COEF:
        ck = tl.load(Cf + slot * s_cf_r, mask=n_mask, other=0.0)
        cv = tl.load(Cf + s_cf_kv + slot * s_cf_r, mask=n_mask, other=0.0)
    else:
        ck = tl.zeros([1], tl.bfloat16)
        cv = tl.zeros([1], tl.bfloat16)
    return n_mask, ka, va, kaso, vaso, kr, vr, krso, vrso, ck, cv


@triton.jit
def _dp4a(a, b, c, INTERP: tl.constexpr):
    """``c + sum_i a.u8[i] * b.s8[i]`` elementwise on int32 (PTX ``dp4a.u32.s32``: one IDP
    instruction for four multiply-adds). The interpreter path computes the same integers."""
    if INTERP:
        s = c
        for i in tl.static_range(4):
            s += ((a >> (8 * i)) & 0xFF) * ((b << (24 - 8 * i)) >> 24)
        return s
    else:
        return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                         dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _pack_query(qi, BITS: tl.constexpr, NGP: tl.constexpr, G: tl.constexpr):
    """``[NGP, G]`` int32 values in [-127, 127] -> ``[NGP, WPG, KX]`` int32 words of 4 signed
    bytes, in the order `_idp_chain` extracts codes: word ``(j, k)`` byte ``b`` holds element
    ``j * 32/BITS + b * 8/BITS + k`` (``WPG = G * BITS / 32`` code words per group,
    ``KX = 8 / BITS`` extractions per word)."""
    WPG: tl.constexpr = G * BITS // 32
    KX: tl.constexpr = 8 // BITS
    x = tl.reshape(qi, [NGP, WPG, 4, KX])
    sh = tl.arange(0, 4) * 8
    return tl.sum((x & 0xFF) << sh[None, None, :, None], axis=2)  # disjoint bytes: sum == or


@triton.jit
def _idp_chain(w, q, acc, SH: tl.constexpr, BITS: tl.constexpr, INTERP: tl.constexpr):
    """``acc + dp4a(code bytes of extraction SH/BITS of w, q)``; one shift and one AND per four
    codes (the byte lane ``b`` of extraction ``k`` holds code ``b * 8/BITS + k`` of the word)."""
    if BITS == 8:
        c = w
    else:
        MASKB: tl.constexpr = ((1 << BITS) - 1) * 0x01010101
        c = (w >> SH) & MASKB
    return _dp4a(c, q, acc, INTERP)


@triton.jit
def _kdot_half(w, q, BITS: tl.constexpr, INTERP: tl.constexpr):
    """Per-group integer dot of ``[BLOCK_N, NGP, WPG]`` code words with one packed query half
    ``[NGP, WPG, KX]`` (`_pack_query`): ``sum_e code_e * q_e`` as ``[BLOCK_N, NGP]`` int32, exact.
    The extractions are chained through dp4a's accumulator; the words of a group are summed in
    the thread."""
    zero = tl.zeros(w.shape, tl.int32)
    if BITS == 8:
        acc = _idp_chain(w, tl.reshape(q, [q.shape[0], q.shape[1]])[None], zero, 0, BITS, INTERP)
    elif BITS == 4:
        q0, q1 = tl.split(q)
        acc = _idp_chain(w, q0[None], zero, 0, BITS, INTERP)
        acc = _idp_chain(w, q1[None], acc, 4, BITS, INTERP)
    else:
        qe, qo = tl.split(tl.reshape(q, [q.shape[0], q.shape[1], 2, 2]))  # k = 2 k1 + k0
        q0, q2 = tl.split(qe)
        q1, q3 = tl.split(qo)
        acc = _idp_chain(w, q0[None], zero, 0, BITS, INTERP)
        acc = _idp_chain(w, q1[None], acc, 2, BITS, INTERP)
        acc = _idp_chain(w, q2[None], acc, 4, BITS, INTERP)
        acc = _idp_chain(w, q3[None], acc, 6, BITS, INTERP)
    return tl.sum(acc, axis=2)


@triton.jit
def _kdot_idp(w, qhi, qlo, sq, BITS: tl.constexpr, INTERP: tl.constexpr):
    """``X[n, g] = sum_e code_e * q'_e`` ``[BLOCK_N, NGP]`` fp32 for the 16-bit fixed-point
    query ``q' ~= sq * (qhi + qlo / 256)`` (``sq`` ``[NGP]``): two exact integer dots."""
    xh = _kdot_half(w, qhi, BITS, INTERP).to(tl.float32)
    xl = _kdot_half(w, qlo, BITS, INTERP).to(tl.float32)
    return xh * sq[None, :] + xl * (sq * (1.0 / 256.0))[None, :]


@triton.jit
def rq_decode_fma_split_kernel(
    Q, s_qb, s_qh,  # [B, H, D] bf16
    KvIndptr, KvIndices,  # [B+1] int32, [nnz] int64
    Ac, s_ac_r, s_ac_kv, s_ac_h: tl.constexpr,  # anchor code words [rows, 2, H, DA/4] int32
    Aso, s_aso_r, s_aso_kv, s_aso_h: tl.constexpr,  # anchor scale_offset [rows, 2, H, NG, 2] uint8
    Rc, s_rc_r, s_rc_kv, s_rc_h: tl.constexpr,  # residual code words (or dummy)
    Rso, s_rso_r, s_rso_kv, s_rso_h: tl.constexpr,  # residual scale_offset (or dummy)
    Cf, s_cf_r, s_cf_kv, s_cf_h,  # coefficients [rows, 2, H] bf16 (or dummy)
    Rot, s_rterm, s_rhead, s_rrow, alpha,  # [TERMS, H, DP, DP] bf16
    MidO, MidML,  # [B, H, S, DP] fp32, [B, H, S, 2] fp32
    qk_scale, num_splits, num_heads, magic,  # sm_scale*log2(e); magic = 0x3F800000
    D: tl.constexpr, DP: tl.constexpr, G: tl.constexpr, NG: tl.constexpr, NGP: tl.constexpr,
    A_BITS: tl.constexpr, R_BITS: tl.constexpr, HAS_COEF: tl.constexpr, HAS_ROT: tl.constexpr,
    TERMS: tl.constexpr, BLOCK_N: tl.constexpr, IDX64: tl.constexpr, K_IDP: tl.constexpr,
    INTERP: tl.constexpr,
):
    QROWS: tl.constexpr = 16
    NEG: tl.constexpr = -1.0e30  # finite "minus infinity": keeps empty rows NaN-free
    hk = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)
    start, lo, hi = split_range(KvIndptr, b, split, num_splits, BLOCK_N)

    # ---- rotated query q' [QROWS, DP] fp32 (tensor cores, exact products; row 0 is real)
    d = tl.arange(0, DP)
    hrow = tl.arange(0, QROWS)
    q = tl.load(Q + b * s_qb + (hk + hrow[:, None]) * s_qh + d[None, :],
                mask=(hrow[:, None] < 1) & (d[None, :] < D), other=0.0)
    if HAS_ROT:
        q = rotate_rows(q, Rot + hk * s_rhead, s_rterm, s_rrow, TERMS, False, False, DP,
                        INTERP) * alpha
    else:
        q = q.to(tl.float32)
    q3 = tl.reshape(tl.trans(q), [DP, QROWS, 1])  # [DP, x, 1]: keep x == 0
    xsel = tl.arange(0, QROWS)
    qt = tl.sum(tl.where(xsel[None, :, None] == 0, q3, 0.0), axis=1)  # [DP, 1]
    qg = tl.reshape(qt, [NGP, G])
    qsum = tl.sum(qg, axis=1)  # [NGP]
    if K_IDP:  # q' ~= sq * (qhi + qlo / 256) per group, |error| <= sq / 512 (16-bit q')
        sq = tl.maximum(tl.max(tl.abs(qg), axis=1), 1e-30) / 127.0  # [NGP]
        qhi = tl.floor(qg / sq[:, None] + 0.5)
        qlo = tl.floor((qg - qhi * sq[:, None]) * (256.0 / sq[:, None]) + 0.5)
        qlo = tl.minimum(tl.maximum(qlo, -127.0), 127.0)
        qa_hi = _pack_query(qhi.to(tl.int32), A_BITS, NGP, G)
        qa_lo = _pack_query(qlo.to(tl.int32), A_BITS, NGP, G)
        if R_BITS > 0:
            qr_hi = _pack_query(qhi.to(tl.int32), R_BITS, NGP, G)
            qr_lo = _pack_query(qlo.to(tl.int32), R_BITS, NGP, G)

    m_r = tl.full([BLOCK_N], NEG, tl.float32)
    l_r = tl.zeros([BLOCK_N], tl.float32)
    acc = tl.zeros([BLOCK_N, NGP, G], tl.float32)
    acc_m = tl.zeros([BLOCK_N, NGP], tl.float32)

    hk64 = hk.to(tl.int64)  # head-major views: head strides of rows x bytes
    Ach = Ac + hk64 * s_ac_h
    Asoh = Aso + hk64 * s_aso_h
    Rch = Rc + hk64 * s_rc_h
    Rsoh = Rso + hk64 * s_rso_h
    Cfh = Cf + hk64 * s_cf_h
    # register double buffer: tile i+1's loads are in flight during tile i
    t_mask, t_ka, t_va, t_kam, t_vam, t_kr, t_vr, t_krm, t_vrm, t_ck, t_cv = _load_tile(
        lo, hi, KvIndices, start, Ach, s_ac_r, s_ac_kv, Asoh, s_aso_r, s_aso_kv, Rch, s_rc_r,
        s_rc_kv, Rsoh, s_rso_r, s_rso_kv, Cfh, s_cf_r, s_cf_kv, NG, G, NGP, A_BITS, R_BITS,
        HAS_COEF, BLOCK_N, IDX64)
    for n0 in range(lo, hi, BLOCK_N):
        n_mask, kaw, vaw, kaso, vaso, krw, vrw, krso, vrso, ckw, cvw = (
            t_mask, t_ka, t_va, t_kam, t_vam, t_kr, t_vr, t_krm, t_vrm, t_ck, t_cv)
        t_mask, t_ka, t_va, t_kam, t_vam, t_kr, t_vr, t_krm, t_vrm, t_ck, t_cv = _load_tile(
            n0 + BLOCK_N, hi, KvIndices, start, Ach, s_ac_r, s_ac_kv, Asoh, s_aso_r, s_aso_kv,
            Rch, s_rc_r, s_rc_kv, Rsoh, s_rso_r, s_rso_kv, Cfh, s_cf_r, s_cf_kv, NG, G, NGP,
            A_BITS, R_BITS, HAS_COEF, BLOCK_N, IDX64)
        # ---- K: per-group dots X[n, g] = sum_e code * q'
        if not K_IDP:
            ka = _decode_words(kaw, magic, A_BITS, G, NGP, BLOCK_N)
        sk, ok = _anchor_scale_offset(kaso, ckw, HAS_COEF)
        if K_IDP:
            lg2 = _kdot_idp(kaw, qa_hi, qa_lo, sq, A_BITS, INTERP) * sk
        else:
            lg2 = tl.sum(ka * qg[None, :, :], axis=2) * sk  # [BLOCK_N, NGP]
        if R_BITS > 0:
            skr, okr = _scale_offset_values(krso)
            ok += okr
            if K_IDP:
                lg2 += _kdot_idp(krw, qr_hi, qr_lo, sq, R_BITS, INTERP) * skr
            else:
                kr = _decode_words(krw, magic, R_BITS, G, NGP, BLOCK_N)
                lg2 += tl.sum(kr * qg[None, :, :], axis=2) * skr
        logit = tl.sum(lg2 + ok * qsum[None, :], axis=1)  # one reduction over groups
        qk = tl.where(n_mask, logit * qk_scale, float("-inf"))
        # ---- per-row online softmax (no cross-thread reduction)
        m_new = tl.maximum(m_r, qk)
        resc = tl.exp2(m_r - m_new)
        p = tl.exp2(qk - m_new)
        l_r = l_r * resc + p
        m_r = m_new
        # ---- V: acc[n, g, e] += p c s_a code_a + p s_r code_r; offsets per group
        va = _decode_words(vaw, magic, A_BITS, G, NGP, BLOCK_N)
        sv, ov = _anchor_scale_offset(vaso, cvw, HAS_COEF)
        if R_BITS > 0:
            vr = _decode_words(vrw, magic, R_BITS, G, NGP, BLOCK_N)
            svr, ovr = _scale_offset_values(vrso)
            ov += ovr
        acc = acc * resc[:, None, None] + (p[:, None] * sv)[:, :, None] * va
        if R_BITS > 0:
            acc += (p[:, None] * svr)[:, :, None] * vr
        acc_m = acc_m * resc[:, None] + p[:, None] * ov

    # ---- merge the BLOCK_N row streams by log-sum-exp, store [1, DP] (rotated basis)
    row = ((b * num_heads + hk) * num_splits + split).to(tl.int64)
    m_f = tl.max(m_r, axis=0)
    w = tl.exp2(m_r - m_f)  # [BLOCK_N]
    l_f = tl.sum(l_r * w, axis=0)
    out = tl.sum((acc + acc_m[:, :, None]) * w[:, None, None], axis=0)  # [NGP, G]
    out2 = tl.reshape(out, [1, DP])
    tl.store(MidO + row * DP + d[None, :], out2)
    tl.store(MidML + row * 2 + tl.arange(0, 1), tl.full([1], 0.0, tl.float32) + m_f)
    tl.store(MidML + row * 2 + 1 + tl.arange(0, 1), tl.full([1], 0.0, tl.float32) + l_f)
