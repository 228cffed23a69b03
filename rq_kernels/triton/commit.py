"""Commit kernel: quantize all loops of a block of tokens x one KV head into pool rows.

One program = ``BLOCK_T`` tokens x one (layer, KV head) x K-or-V. Per loop group (``GROUP_LEN`` loops with
the anchor at ``ANCHOR_POS``): rotate, anchor quantize, then every other loop of the group gets its
LSQ coefficient, residual, quantization and packing. Operation order follows
`sglang_rq.reference.encode` (fp32, IEEE division, no FMA contraction: launch with
``enable_fp_fusion=False``).
"""

import triton
import triton.language as tl

from rq_kernels.triton.common import (
    f32_to_fp8_bits, fp8_round, mma, pdl_launch_dependents, rotate_rows, to_bf16,
)


@triton.jit
def _fma(x, y, z, INTERP: tl.constexpr):
    """Fused ``x*y + z`` in fp32. NOTE: the interpreter's ``tl.fma`` rounds the product first;
    there it is emulated in fp64 (the product of two fp32 values is exact in fp64)."""
    if INTERP:
        return (x.to(tl.float64) * y.to(tl.float64) + z.to(tl.float64)).to(tl.float32)
    else:
        return tl.fma(x, y, z)


@triton.jit
def _div_rn_by(a, b, rcp, INTERP: tl.constexpr = False):
    """``a / b`` correctly rounded (= ``tl.div_rn(a, b)``) from ``rcp = tl.div_rn(1, b)``, for
    normal ``b`` and finite ``a / b``: ``q = a*rcp`` is within 1 ulp, ``e = a - b*q`` is exact by
    FMA, and ``q + e*rcp`` rounds to the correctly rounded quotient (Markstein, IBM J. Res. Dev.
    34(1), 1990, Theorem 1; Muller et al., Handbook of Floating-Point Arithmetic, 2nd ed., sec.
    4.7). Three FP instructions per element instead of IEEE division's ~10 plus a slow-path
    check."""
    q = a * rcp
    return _fma(_fma(-q, b, a, INTERP), rcp, q, INTERP)


@triton.jit
def _quantize(x, LEVELS: tl.constexpr, BLOCK_T: tl.constexpr, NGP: tl.constexpr,
              G: tl.constexpr, INTERP: tl.constexpr):
    """``x [BLOCK_T, NGP*G]`` fp32 -> codes (fp32, integer valued) ``[BLOCK_T, NGP*G]``, scale
    and offset ``[BLOCK_T, NGP]`` (FP8-exact), as `reference.quantize_groups`. Divides by
    the scale through its reciprocal (`_div_rn_by`: IEEE division's results, fewer instructions;
    H200: commit 572 -> 515 us, docs/kernels_history.md)."""
    x3 = tl.reshape(x, [BLOCK_T, NGP, G])
    off = fp8_round(tl.min(x3, axis=2), DOWN=True)
    scale = fp8_round(tl.div_rn(tl.max(x3, axis=2) - off, LEVELS * 1.0), DOWN=False)
    safe = tl.where(scale > 0, scale, 1.0)
    rcp = tl.div_rn(tl.full(safe.shape, 1.0, tl.float32), safe)
    q = tl.floor(_div_rn_by(x3 - off[:, :, None], safe[:, :, None], rcp[:, :, None], INTERP) + 0.5)
    q = tl.minimum(tl.maximum(q, 0.0), LEVELS * 1.0)
    q = tl.where(scale[:, :, None] > 0, q, 0.0)
    return tl.reshape(q, [BLOCK_T, NGP * G]), scale, off


@triton.jit
def _dequantize(q, scale, off, BLOCK_T: tl.constexpr, NGP: tl.constexpr, G: tl.constexpr):
    q3 = tl.reshape(q, [BLOCK_T, NGP, G])
    return tl.reshape(off[:, :, None] + scale[:, :, None] * q3, [BLOCK_T, NGP * G])


@triton.jit
def _pack(q, BITS: tl.constexpr, BLOCK_T: tl.constexpr, DP: tl.constexpr):
    """``[BLOCK_T, DP]`` integer-valued fp32 codes -> ``[BLOCK_T, DP*BITS/8]`` uint8."""
    qi = q.to(tl.int32)
    if BITS == 8:
        return qi.to(tl.uint8)
    elif BITS == 4:
        a, b = tl.split(tl.reshape(qi, [BLOCK_T, DP // 2, 2]))
        return (a | (b << 4)).to(tl.uint8)
    else:  # 2 bits: element 4i + 2k + j
        e, o = tl.split(tl.reshape(qi, [BLOCK_T, DP // 4, 2, 2]))
        e0, e1 = tl.split(e)
        o0, o1 = tl.split(o)
        return (e0 | (o0 << 2) | (e1 << 4) | (o1 << 6)).to(tl.uint8)


@triton.jit
def _store_loop(q, scale, off, loc, t_mask, codes, s_code, scale_offset, s_scale_offset,
                BITS: tl.constexpr, D: tl.constexpr, NG: tl.constexpr, BLOCK_T: tl.constexpr,
                DP: tl.constexpr, NGP: tl.constexpr):
    """Store packed codes at ``codes + loc*s_code`` and the FP8 (scale, offset) bytes at
    ``scale_offset + loc*s_scale_offset`` (both already offset to this program's K-or-V and
    head)."""
    CB: tl.constexpr = DP * BITS // 8
    col = tl.arange(0, CB)
    m = t_mask[:, None] & (col[None, :] < D * BITS // 8)
    tl.store(codes + loc[:, None] * s_code + col[None, :], _pack(q, BITS, BLOCK_T, DP), mask=m)
    grp = tl.arange(0, NGP)
    two = tl.arange(0, 2)
    mb = tl.join(f32_to_fp8_bits(scale), f32_to_fp8_bits(off))  # [BLOCK_T, NGP, 2]
    ptr = (scale_offset + loc[:, None, None] * s_scale_offset + grp[None, :, None] * 2
           + two[None, None, :])
    tl.store(ptr, mb, mask=t_mask[:, None, None] & (grp[None, :, None] < NG))


@triton.jit
def _load_loop(K, V, SKV, kv, loop: tl.constexpr, layer, head, tok, t_mask, rot, s_rterm, s_rrow,
               alpha, rmat, D: tl.constexpr, DP: tl.constexpr, HAS_ROT: tl.constexpr,
               TERMS: tl.constexpr, HOIST_R: tl.constexpr, INTERP: tl.constexpr):
    """Loop ``loop``'s ``[BLOCK_T, DP]`` K (``kv`` 0) or V rows of ``layer``, rotated (fp32).
    With HOIST_R the single bf16 rotation term ``rmat`` was loaded once per program; otherwise
    the terms are read here."""
    d = tl.arange(0, DP)
    mask = t_mask[:, None] & (d[None, :] < D)
    if kv == 0:
        x = tl.load(K[loop] + layer * SKV[6 * loop] + tok[:, None] * SKV[6 * loop + 1]
                    + head * SKV[6 * loop + 2] + d[None, :], mask=mask, other=0.0)
    else:
        x = tl.load(V[loop] + layer * SKV[6 * loop + 3] + tok[:, None] * SKV[6 * loop + 4]
                    + head * SKV[6 * loop + 5] + d[None, :], mask=mask, other=0.0)
    if HAS_ROT and HOIST_R:
        return mma(to_bf16(x, INTERP), rmat, INTERP) * alpha
    elif HAS_ROT:
        return rotate_rows(x, rot, s_rterm, s_rrow, TERMS, False, False, DP, INTERP) * alpha
    else:
        return x.to(tl.float32)


@triton.jit
def _commit_anchor(K, V, SKV, Codes, SCodes, ScaleOffset, SScaleOffset, kv, layer, head, loc, tok,
                   t_mask, store_mask, rot, s_rterm, s_rrow, alpha, rmat, A: tl.constexpr,
                   BITS: tl.constexpr,
                   HAS_ROT: tl.constexpr, TERMS: tl.constexpr, D: tl.constexpr,
                   DP: tl.constexpr, G: tl.constexpr, NG: tl.constexpr, NGP: tl.constexpr,
                   BLOCK_T: tl.constexpr, HOIST_R: tl.constexpr,
                   INTERP: tl.constexpr):
    """Quantize anchor loop ``A`` and store the rows of ``store_mask``; returns the dequantized
    anchor ``[BLOCK_T, DP]``."""
    xa = _load_loop(K, V, SKV, kv, A, layer, head, tok, t_mask, rot, s_rterm, s_rrow, alpha,
                    rmat, D, DP, HAS_ROT, TERMS, HOIST_R, INTERP)
    qa, sa, oa = _quantize(xa, (1 << BITS[A]) - 1, BLOCK_T, NGP, G, INTERP)
    _store_loop(qa, sa, oa, loc, store_mask,
                Codes[A] + layer * SCodes[4 * A] + kv * SCodes[4 * A + 2]
                + head * SCodes[4 * A + 3], SCodes[4 * A + 1],
                ScaleOffset[A] + layer * SScaleOffset[4 * A] + kv * SScaleOffset[4 * A + 2]
                + head * SScaleOffset[4 * A + 3], SScaleOffset[4 * A + 1],
                BITS[A], D, NG, BLOCK_T, DP, NGP)
    return _dequantize(qa, sa, oa, BLOCK_T, NGP, G)


@triton.jit
def _commit_residual(K, V, SKV, Codes, SCodes, ScaleOffset, SScaleOffset, Coef, SCoef, kv, layer,
                     head, loc, tok, t_mask, rot, s_rterm, s_rrow, alpha, rmat, ahat, den,
                     I: tl.constexpr, BITS: tl.constexpr, LSQ: tl.constexpr,
                     HAS_ROT: tl.constexpr, TERMS: tl.constexpr, D: tl.constexpr,
                     DP: tl.constexpr, G: tl.constexpr, NG: tl.constexpr, NGP: tl.constexpr,
                     BLOCK_T: tl.constexpr, HOIST_R: tl.constexpr,
                     INTERP: tl.constexpr):
    """LSQ coefficient, residual against ``ahat``, quantize and store loop ``I``."""
    xi = _load_loop(K, V, SKV, kv, I, layer, head, tok, t_mask, rot, s_rterm, s_rrow, alpha,
                    rmat, D, DP, HAS_ROT, TERMS, HOIST_R, INTERP)
    if LSQ:
        c = to_bf16(tl.div_rn(tl.sum(xi * ahat, axis=1), den), INTERP)
        cptr = Coef[I] + layer * SCoef[4 * I] + kv * SCoef[4 * I + 2] + head * SCoef[4 * I + 3]
        tl.store(cptr + loc * SCoef[4 * I + 1], c, mask=t_mask)
        r = xi - c.to(tl.float32)[:, None] * ahat
    else:
        r = xi - ahat
    if BITS[I] > 0:
        qr, sr, orr = _quantize(r, (1 << BITS[I]) - 1, BLOCK_T, NGP, G, INTERP)
        _store_loop(qr, sr, orr, loc, t_mask,
                    Codes[I] + layer * SCodes[4 * I] + kv * SCodes[4 * I + 2]
                    + head * SCodes[4 * I + 3], SCodes[4 * I + 1],
                    ScaleOffset[I] + layer * SScaleOffset[4 * I] + kv * SScaleOffset[4 * I + 2]
                    + head * SScaleOffset[4 * I + 3], SScaleOffset[4 * I + 1],
                    BITS[I], D, NG, BLOCK_T, DP, NGP)


@triton.jit
def rq_commit_kernel(
    K, V, SKV,  # loop tuples of [layers, T, H, D] bf16, last dim contiguous; (layer, token,
    #            head) strides of K[0], V[0], K[1], ... flattened
    Loc, num_tokens, num_heads,  # [T] int64
    # per-loop tuples of layer 0's tensors; strides flattened (layer, row, kv, head)
    Codes, SCodes, ScaleOffset, SScaleOffset, Coef, SCoef,
    Rot, s_rlayer, s_rterm, s_rhead, s_rrow, alpha,  # [layers, TERMS, H, DP, DP] bf16,
    #                                                  R = alpha * sum(terms)
    NUM_LOOPS: tl.constexpr, GROUP_LEN: tl.constexpr, ANCHOR_POS: tl.constexpr,
    BITS: tl.constexpr, LSQ: tl.constexpr, HAS_ROT: tl.constexpr, TERMS: tl.constexpr,
    D: tl.constexpr, DP: tl.constexpr, G: tl.constexpr, NG: tl.constexpr, NGP: tl.constexpr,
    BLOCK_T: tl.constexpr, HOIST_R: tl.constexpr, PER_LOOP: tl.constexpr,
    INTERP: tl.constexpr,
):
    """Grid ``(cdiv(num_tokens, BLOCK_T), layers * H, 2)``: a program quantizes every loop of its
    tokens' K (axis 2 = 0) or V of one (layer, KV head), KV head fastest. With PER_LOOP, grid
    ``(..., layers * H, 2 * NUM_LOOPS)``: program ``(.., kv + 2 * i)`` stores loop ``i`` only,
    re-quantizing its group's anchor (not stored unless ``i`` is the anchor) so that a few
    tokens (decode) take one anchor and one residual of latency instead of a whole loop
    group's."""
    pid_t = tl.program_id(0)
    layer = (tl.program_id(1) // num_heads).to(tl.int64)  # layer strides may pass 2^31 in sum
    # int64: a head-major view's head and K/V strides are rows x bytes
    head = (tl.program_id(1) % num_heads).to(tl.int64)
    kv = (tl.program_id(2) % 2).to(tl.int64)
    sel = tl.program_id(2) // 2  # PER_LOOP: the one loop this program stores
    tok = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    t_mask = tok < num_tokens
    loc = tl.load(Loc + tok, mask=t_mask, other=0)
    rot = Rot + layer * s_rlayer + head * s_rhead
    if HAS_ROT and HOIST_R:  # one bf16 term (Hadamard): load it once for all loops
        i = tl.arange(0, DP)
        rmat = tl.load(rot + i[:, None] * s_rrow + i[None, :])
    else:
        rmat = tl.zeros([1], tl.bfloat16)
    for g0 in tl.static_range(0, NUM_LOOPS, GROUP_LEN):
        if PER_LOOP:
            if (sel >= g0) & (sel < g0 + GROUP_LEN):
                ahat = _commit_anchor(K, V, SKV, Codes, SCodes, ScaleOffset, SScaleOffset, kv,
                                      layer, head, loc, tok, t_mask,
                                      t_mask & (sel == g0 + ANCHOR_POS),
                                      rot, s_rterm, s_rrow, alpha, rmat, g0 + ANCHOR_POS, BITS,
                                      HAS_ROT, TERMS, D, DP, G, NG, NGP, BLOCK_T, HOIST_R, INTERP)
                den = tl.maximum(tl.sum(ahat * ahat, axis=1), 1e-12)
                for j in tl.static_range(GROUP_LEN):
                    if j != ANCHOR_POS:
                        if sel == g0 + j:
                            _commit_residual(K, V, SKV, Codes, SCodes, ScaleOffset, SScaleOffset,
                                             Coef, SCoef, kv, layer, head, loc, tok, t_mask, rot,
                                             s_rterm, s_rrow, alpha, rmat, ahat, den, g0 + j,
                                             BITS, LSQ, HAS_ROT, TERMS, D, DP, G, NG, NGP,
                                             BLOCK_T, HOIST_R, INTERP)
        else:
            ahat = _commit_anchor(K, V, SKV, Codes, SCodes, ScaleOffset, SScaleOffset, kv, layer,
                                  head, loc, tok, t_mask, t_mask, rot, s_rterm, s_rrow, alpha, rmat,
                                  g0 + ANCHOR_POS, BITS, HAS_ROT, TERMS, D, DP, G, NG, NGP,
                                  BLOCK_T, HOIST_R, INTERP)
            den = tl.maximum(tl.sum(ahat * ahat, axis=1), 1e-12)
            for j in tl.static_range(GROUP_LEN):
                if j != ANCHOR_POS:
                    _commit_residual(K, V, SKV, Codes, SCodes, ScaleOffset, SScaleOffset, Coef,
                                     SCoef, kv, layer, head, loc, tok, t_mask, rot, s_rterm, s_rrow,
                                     alpha, rmat, ahat, den, g0 + j, BITS, LSQ, HAS_ROT, TERMS,
                                     D, DP, G, NG, NGP, BLOCK_T, HOIST_R, INTERP)


@triton.jit
def rq_stage_kernel(K, s_kt, s_kh, V, s_vt, s_vh, Out, s_ot, s_okv, s_oh, H, D: tl.constexpr,
                    HP: tl.constexpr, DP: tl.constexpr, PDL: tl.constexpr):
    """Grid ``(num_tokens,)``: ``Out[t, 0] = K[t]``, ``Out[t, 1] = V[t]`` (``[H, D]`` each).
    PDL: the next kernel on the stream, if launched as a programmatic dependent (the decode
    split kernel), starts at once and fills its pipeline while this copy runs."""
    pdl_launch_dependents(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, HP)
    d = tl.arange(0, DP)
    m = (h[:, None] < H) & (d[None, :] < D)
    k = tl.load(K + t * s_kt + h[:, None] * s_kh + d[None, :], mask=m)
    v = tl.load(V + t * s_vt + h[:, None] * s_vh + d[None, :], mask=m)
    o = Out + t * s_ot + h[:, None] * s_oh + d[None, :]
    tl.store(o, k.to(Out.dtype.element_ty), mask=m)
    tl.store(o + s_okv, v.to(Out.dtype.element_ty), mask=m)
