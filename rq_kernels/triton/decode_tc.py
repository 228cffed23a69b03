"""Decode attention over the compressed cache on tensor cores (``@triton.jit`` only).

One program handles one (KV head, request, split) and streams ``BLOCK_N`` history tokens per
tile. The dot products run on tensor cores with the tokens on the MMA's M dimension (swap-AB);
the CUDA cores do a few bit operations per code and work on ``[BLOCK_N, groups]`` numbers only.

Bit planes instead of interleaving
----------------------------------
A loop with ``b`` bits stores element ``d`` in byte ``d // E`` at bit ``(d % E) * b``
(``E = 8 / b``, `reference.pack_codes`). Plane ``P`` of a tile is code ``P`` of every byte:
elements ``d = j * E + P``. A plane is unpacked from four bytes at a time by one AND (and one
shift), already packed four codes per register, and is fed to the MMA as it is: the query
rows (K side) and the accumulator rows (V side) are permuted to the plane's elements instead
of the codes being interleaved into natural order. Planes of one loop accumulate into the same
MMA result (K) or into their own accumulators (V, un-permuted once at the end).

K: integer dots (exact)
-----------------------
The rotated query is split per (query head, quantization group) into a 16-bit fixed-point
number ``q' ~= sq * (hi + lo / 256)`` with int8 ``hi``, ``lo`` (``|error| <= sq / 512``,
``sq = max|q'_g| / 127``). The MMA ``[BLOCK_N, E*DPB] u8 codes x [DPB, cols] s8`` has one
column per (group, head, hi/lo) holding the query masked to that group, so one int32 result
gives every per-group partial dot ``X[n, g, h] = sum_e code_e q'_e`` exactly, and the group
scales apply per accumulator column, not per element:

    logit[n, h] = sum_g  c s_a X_a + s_r X_r + (c m_a + m_r) sum_e q'_e      (fp32)

8-bit codes are centred (``code - 128`` fits int8) and the offset takes ``128 s`` back.

V: fp16 dots
------------
Codes become centred fp16 by the magic-number trick (``prmt`` each code under the fp16
exponent of 1024, one ``sub.f16x2`` per pair). The weights ``W[n, (g, h)] = p c s_g`` are the
MMA's B operand, so ``acc[d, (g, h)] += sum_n code[n, d] W[n, (g, h)]``; only the blocks with
``group(d) == g`` are kept, once, at the end. Offsets accumulate as ``[g, h]``.

The split's output (unnormalised, rotated basis) and its (max in log2 units, sum) go to the
workspace that `rq_decode_merge_kernel` (rq_kernels/triton/decode.py) reduces, un-rotates and
completes with the in-flight token.
"""

import triton
import triton.language as tl

from rq_kernels.triton.common import load_meta, rotate_rows


def _plane_asm_f16(bits: int, plane: int) -> str:
    """PTX: four packed codes (plane ``plane`` of four bytes) -> four centred fp16 values."""
    half = 1 << (bits - 1)
    magic = 0x6400 + half  # fp16 1024 + 2^(b-1): 1024 + code - magic = code - 2^(b-1)
    lines = ["{", ".reg .b32 t, m;", f"mov.b32 m, {magic | (magic << 16):#010x};"]
    src = "$2"
    if plane:
        lines.append(f"shr.u32 t, $2, {plane * bits};")
        src = "t"
    if bits < 8:
        mask = ((1 << bits) - 1) * 0x01010101
        lines.append(f"and.b32 t, {src}, {mask:#010x};")
        src = "t"
    lines += [f"prmt.b32 $0, {src}, 0x64646464, 0x5140;",
              f"prmt.b32 $1, {src}, 0x64646464, 0x5342;",
              "sub.f16x2 $0, $0, m;", "sub.f16x2 $1, $1, m;", "}"]
    return "\n".join(lines)


def _plane_asm_i8(bits: int, plane: int) -> str:
    """PTX: four packed codes -> four int8 codes in one register (8-bit: centred)."""
    if bits == 8:
        return "xor.b32 $0, $1, 0x80808080;"
    mask = ((1 << bits) - 1) * 0x01010101
    if plane == 0:
        return f"and.b32 $0, $1, {mask:#010x};"
    return f"{{\n.reg .b32 t;\nshr.u32 t, $1, {plane * bits};\nand.b32 $0, t, {mask:#010x};\n}}"


_F16_2_0 = tl.constexpr(_plane_asm_f16(2, 0))
_F16_2_1 = tl.constexpr(_plane_asm_f16(2, 1))
_F16_2_2 = tl.constexpr(_plane_asm_f16(2, 2))
_F16_2_3 = tl.constexpr(_plane_asm_f16(2, 3))
_F16_4_0 = tl.constexpr(_plane_asm_f16(4, 0))
_F16_4_1 = tl.constexpr(_plane_asm_f16(4, 1))
_F16_8_0 = tl.constexpr(_plane_asm_f16(8, 0))
_I8_2_0 = tl.constexpr(_plane_asm_i8(2, 0))
_I8_2_1 = tl.constexpr(_plane_asm_i8(2, 1))
_I8_2_2 = tl.constexpr(_plane_asm_i8(2, 2))
_I8_2_3 = tl.constexpr(_plane_asm_i8(2, 3))
_I8_4_0 = tl.constexpr(_plane_asm_i8(4, 0))
_I8_4_1 = tl.constexpr(_plane_asm_i8(4, 1))
_I8_8_0 = tl.constexpr(_plane_asm_i8(8, 0))


@triton.jit
def _f16(x, asm):
    return tl.inline_asm_elementwise(asm, "=r,=r,r", [x], dtype=tl.float16, is_pure=True,
                                     pack=4)


@triton.jit
def _i8(x, asm):
    return tl.inline_asm_elementwise(asm, "=r,r", [x], dtype=tl.int8, is_pure=True, pack=4)


@triton.jit
def plane_f16(byte, BITS: tl.constexpr, P: tl.constexpr, FAST: tl.constexpr):
    """``[N, C]`` uint8 packed codes -> plane ``P`` ``[N, C]`` fp16 ``code - 2^(BITS-1)``."""
    if FAST:
        if BITS == 2:
            if P == 0:
                return _f16(byte, _F16_2_0)
            elif P == 1:
                return _f16(byte, _F16_2_1)
            elif P == 2:
                return _f16(byte, _F16_2_2)
            else:
                return _f16(byte, _F16_2_3)
        elif BITS == 4:
            if P == 0:
                return _f16(byte, _F16_4_0)
            else:
                return _f16(byte, _F16_4_1)
        else:
            return _f16(byte, _F16_8_0)
    else:
        code = (byte >> (P * BITS)) & ((1 << BITS) - 1)
        return (code.to(tl.int16) - (1 << (BITS - 1))).to(tl.float16)


@triton.jit
def plane_i8(byte, BITS: tl.constexpr, P: tl.constexpr, FAST: tl.constexpr):
    """``[N, C]`` uint8 packed codes -> plane ``P`` ``[N, C]`` int8 (8-bit codes centred)."""
    if FAST:
        if BITS == 2:
            if P == 0:
                return _i8(byte, _I8_2_0)
            elif P == 1:
                return _i8(byte, _I8_2_1)
            elif P == 2:
                return _i8(byte, _I8_2_2)
            else:
                return _i8(byte, _I8_2_3)
        elif BITS == 4:
            if P == 0:
                return _i8(byte, _I8_4_0)
            else:
                return _i8(byte, _I8_4_1)
        else:
            return _i8(byte, _I8_8_0)
    else:
        if BITS == 8:
            return (byte ^ 0x80).to(tl.int8, bitcast=True)
        else:
            return ((byte >> (P * BITS)) & ((1 << BITS) - 1)).to(tl.int8, bitcast=True)


@triton.jit
def _plane_rows(x, BITS: tl.constexpr, P: tl.constexpr, DP: tl.constexpr):
    """``[DP, C]`` -> the rows of plane ``P``: ``[DP*BITS/8, C]`` (elements ``j*E + P``)."""
    E: tl.constexpr = 8 // BITS
    if E == 1:
        return x
    else:
        x3 = tl.reshape(x, [DP // E, E, x.shape[1]])
        e = tl.arange(0, E)
        return tl.sum(tl.where(e[None, :, None] == P, x3, 0.0), axis=1)


@triton.jit
def _query_plane(qhi, qlo, gsel, BITS: tl.constexpr, P: tl.constexpr, DP: tl.constexpr,
                 NGP: tl.constexpr, GQP: tl.constexpr, PK: tl.constexpr):
    """The K MMA's B operand for plane ``P``: ``[DP*BITS/8, NGP*GQP*2*PK]`` int8, column
    ``((g*GQP + h)*2 + part)*PK + z`` = ``hi`` (part 0) or ``lo`` of head ``h`` masked to group
    ``g`` for ``z == 0``, zero padding (the MMA's N of at least 16) otherwise.
    ``qhi``/``qlo``: ``[DP, GQP]`` fp32 integers; ``gsel``: ``[DP, NGP]`` group membership."""
    hi = _plane_rows(qhi, BITS, P, DP)  # [DPB, GQP]
    lo = _plane_rows(qlo, BITS, P, DP)
    sel = _plane_rows(gsel.to(tl.float32), BITS, P, DP)  # [DPB, NGP] 0/1
    hi3 = sel[:, :, None] * hi[:, None, :]  # [DPB, NGP, GQP]
    lo3 = sel[:, :, None] * lo[:, None, :]
    q4 = tl.join(hi3, lo3)  # [DPB, NGP, GQP, 2]
    z = tl.arange(0, PK)
    q5 = tl.where(z[None, None, None, None, :] == 0, q4[:, :, :, :, None], 0.0)
    return tl.reshape(q5, [hi.shape[0], NGP * GQP * 2 * PK]).to(tl.int8)


@triton.jit
def _mma_i8(a, b, acc, INTERP: tl.constexpr):
    """``acc + a @ b`` exact in int32 (int8 tensor cores; planes shorter than the int8 MMA's
    K of 32 go through fp16, exact for these magnitudes: |sum| < 2^24)."""
    if INTERP:
        return acc + tl.dot(a.to(tl.float32), b.to(tl.float32)).to(tl.int32)
    elif a.shape[1] < 32:
        return acc + tl.dot(a.to(tl.float16), b.to(tl.float16)).to(tl.int32)
    else:
        return tl.dot(a, b, acc, out_dtype=tl.int32)


@triton.jit
def _mma_f16(a, b, INTERP: tl.constexpr):
    if INTERP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        return tl.dot(a, b)


@triton.jit
def _k_dots(byte, q0, q1, q2, q3, BITS: tl.constexpr, BLOCK_N: tl.constexpr,
            NCK: tl.constexpr, FAST: tl.constexpr, INTERP: tl.constexpr):
    """Integer per-group dots of one loop's K codes ``[BLOCK_N, DP*BITS/8]`` with the query
    planes: ``[BLOCK_N, NCK]`` int32."""
    x = tl.zeros([BLOCK_N, NCK], tl.int32)
    x = _mma_i8(plane_i8(byte, BITS, 0, FAST), q0, x, INTERP)
    if BITS <= 4:
        x = _mma_i8(plane_i8(byte, BITS, 1, FAST), q1, x, INTERP)
    if BITS == 2:
        x = _mma_i8(plane_i8(byte, BITS, 2, FAST), q2, x, INTERP)
        x = _mma_i8(plane_i8(byte, BITS, 3, FAST), q3, x, INTERP)
    return x


@triton.jit
def _v_dots(byte, w, a0, a1, a2, a3, alpha_col, BITS: tl.constexpr, FAST: tl.constexpr,
            INTERP: tl.constexpr):
    """``acc_P = acc_P * alpha + w^T @ plane_P`` (``[NCV, DP*BITS/8]``) for every plane of one
    loop's V codes (``w`` ``[BLOCK_N, NCV]``): the codes are the MMA's B operand in the order
    they are stored (tokens = K, elements = N), so no transposition of codes is needed."""
    wt = tl.trans(w)
    a0 = a0 * alpha_col[:, None] + _mma_f16(wt, plane_f16(byte, BITS, 0, FAST), INTERP)
    if BITS <= 4:
        a1 = a1 * alpha_col[:, None] + _mma_f16(wt, plane_f16(byte, BITS, 1, FAST), INTERP)
    if BITS == 2:
        a2 = a2 * alpha_col[:, None] + _mma_f16(wt, plane_f16(byte, BITS, 2, FAST), INTERP)
        a3 = a3 * alpha_col[:, None] + _mma_f16(wt, plane_f16(byte, BITS, 3, FAST), INTERP)
    return a0, a1, a2, a3


@triton.jit
def _own_group(a, d0, E: tl.constexpr, G: tl.constexpr, NGP: tl.constexpr,
               GQP: tl.constexpr, PV: tl.constexpr):
    """``[NGP*GQP*PV, DPB]`` plane accumulator -> ``[DPB, GQP]``: for element ``j*E + d0`` the
    column block of its own group (padding columns ``z > 0`` are zero)."""
    DPB: tl.constexpr = a.shape[1]
    j = tl.arange(0, DPB)
    g = tl.arange(0, NGP)
    a4 = tl.reshape(tl.trans(a), [DPB, NGP, GQP, PV])
    a3 = tl.sum(a4, axis=3)
    return tl.sum(tl.where(((j * E + d0) // G)[:, None, None] == g[None, :, None], a3, 0.0),
                  axis=1)


@triton.jit
def _planes_out(a0, a1, a2, a3, BITS: tl.constexpr, DP: tl.constexpr, G: tl.constexpr,
                NGP: tl.constexpr, GQP: tl.constexpr, PV: tl.constexpr):
    """V plane accumulators ``[NGP*GQP*PV, DP*BITS/8]`` -> ``[DP, GQP]`` in natural element
    order, keeping for each element only the column block of its own group."""
    E: tl.constexpr = 8 // BITS
    o0 = _own_group(a0, 0, E, G, NGP, GQP, PV)
    # NOTE: no early return in a constexpr branch (Triton 3.6 still compiles what follows)
    if E == 1:
        out = o0
    else:
        o1 = _own_group(a1, 1, E, G, NGP, GQP, PV)
        if E == 2:
            o = tl.join(o0, o1)  # [DPB, GQP, 2]: element 2j + p
            out = tl.reshape(tl.permute(o, [0, 2, 1]), [DP, GQP])
        else:
            o2 = _own_group(a2, 2, E, G, NGP, GQP, PV)
            o3 = _own_group(a3, 3, E, G, NGP, GQP, PV)
            o = tl.join(tl.join(o0, o2), tl.join(o1, o3))  # [DPB, GQP, 2, 2]: 4j + 2a + b
            out = tl.reshape(tl.permute(o, [0, 2, 3, 1]), [DP, GQP])
    return out


@triton.jit
def _load_tile(n0, hi, KvIndices, start, Ac, s_ac_r, s_ac_kv, Am, s_am_r, s_am_kv, Rc, s_rc_r,
               s_rc_kv, Rm, s_rm_r, s_rm_kv, Cf, s_cf_r, s_cf_kv, D: tl.constexpr,
               DP: tl.constexpr, NG: tl.constexpr, NGP: tl.constexpr,
               A_BITS: tl.constexpr, R_BITS: tl.constexpr, HAS_COEF: tl.constexpr,
               BLOCK_N: tl.constexpr, IDX64: tl.constexpr):
    """Every global load of one tile. Bases already point at this program's KV head; loops
    without a residual or coefficients get 1-element dummies."""
    offs = n0 + tl.arange(0, BLOCK_N)
    n_mask = offs < hi
    slot = tl.load(KvIndices + start + offs, mask=n_mask, other=0)
    if not IDX64:
        slot = slot.to(tl.int32)
    ca = tl.arange(0, DP * A_BITS // 8)
    am = n_mask[:, None] & (ca[None, :] < D * A_BITS // 8)
    ka = tl.load(Ac + slot[:, None] * s_ac_r + ca[None, :], mask=am, other=0)
    va = tl.load(Ac + s_ac_kv + slot[:, None] * s_ac_r + ca[None, :], mask=am, other=0)
    kas, kao = load_meta(Am, slot, s_am_r, n_mask, NG, NGP)
    vas, vao = load_meta(Am + s_am_kv, slot, s_am_r, n_mask, NG, NGP)
    if R_BITS > 0:
        cr = tl.arange(0, DP * R_BITS // 8)
        rm = n_mask[:, None] & (cr[None, :] < D * R_BITS // 8)
        kr = tl.load(Rc + slot[:, None] * s_rc_r + cr[None, :], mask=rm, other=0)
        vr = tl.load(Rc + s_rc_kv + slot[:, None] * s_rc_r + cr[None, :], mask=rm, other=0)
        krs, kro = load_meta(Rm, slot, s_rm_r, n_mask, NG, NGP)
        vrs, vro = load_meta(Rm + s_rm_kv, slot, s_rm_r, n_mask, NG, NGP)
    else:
        kr = tl.zeros([1, 1], tl.uint8)
        vr = tl.zeros([1, 1], tl.uint8)
        krs = tl.zeros([1, 1], tl.float32)
        kro = tl.zeros([1, 1], tl.float32)
        vrs = tl.zeros([1, 1], tl.float32)
        vro = tl.zeros([1, 1], tl.float32)
    if HAS_COEF:
        ck = tl.load(Cf + slot * s_cf_r, mask=n_mask, other=0.0).to(tl.float32)
        cv = tl.load(Cf + s_cf_kv + slot * s_cf_r, mask=n_mask, other=0.0).to(tl.float32)
    else:
        ck = tl.full([BLOCK_N], 1.0, tl.float32)
        cv = tl.full([BLOCK_N], 1.0, tl.float32)
    return n_mask, ka, va, kas, kao, vas, vao, kr, vr, krs, kro, vrs, vro, ck, cv


@triton.jit
def rq_decode_tc_split_kernel(
    Q, s_qb, s_qh,  # [B, Hq, D] bf16
    KvIndptr, KvIndices,  # [B+1] int32, [nnz] int64
    Ac, s_ac_r, s_ac_kv, s_ac_h: tl.constexpr,  # anchor codes [rows, 2, Hkv, D*bits/8] uint8
    Am, s_am_r, s_am_kv, s_am_h: tl.constexpr,  # anchor scale/offset [rows, 2, Hkv, NG, 2] u8
    Rc, s_rc_r, s_rc_kv, s_rc_h: tl.constexpr,  # residual codes (or the anchor's: unused)
    Rm, s_rm_r, s_rm_kv, s_rm_h: tl.constexpr,  # residual scale/offset (or unused)
    Cf, s_cf_r, s_cf_kv, s_cf_h,  # LSQ coefficients c [rows, 2, Hkv] bf16 (or unused)
    Rot, s_rterm, s_rhead, s_rrow, alpha,  # rotation terms [TERMS, Hkv, DP, DP] bf16
    MidO, MidML,  # [B, Hq, S, DP] fp32, [B, Hq, S, 2] fp32
    qk_scale, num_splits, num_qo_heads,  # sm_scale * log2(e)
    GQ: tl.constexpr, GQP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, G: tl.constexpr,
    NG: tl.constexpr, NGP: tl.constexpr, PK: tl.constexpr, PV: tl.constexpr, A_BITS: tl.constexpr,
    R_BITS: tl.constexpr, HAS_COEF: tl.constexpr, HAS_ROT: tl.constexpr, TERMS: tl.constexpr,
    BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, IDX64: tl.constexpr, FAST: tl.constexpr,
    INTERP: tl.constexpr,
):
    QROWS: tl.constexpr = 16 if GQP < 16 else GQP
    NCK: tl.constexpr = NGP * GQP * 2 * PK  # K MMA columns: (group, head, hi/lo, pad)
    NCV: tl.constexpr = NGP * GQP * PV  # V MMA rows: (group, head, pad)
    NEG: tl.constexpr = -1.0e30  # finite "minus infinity": keeps empty splits NaN-free
    hk = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)
    start = tl.load(KvIndptr + b)
    seq_len = tl.load(KvIndptr + b + 1) - start
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(lo + per_split, seq_len)

    # ---- rotated query q' [DP, GQP] fp32, its per-(group, head) 16-bit fixed-point split
    d = tl.arange(0, DP)
    hrow = tl.arange(0, QROWS)
    q = tl.load(Q + b * s_qb + (hk * GQ + hrow[:, None]) * s_qh + d[None, :],
                mask=(hrow[:, None] < GQ) & (d[None, :] < D), other=0.0)
    if HAS_ROT:
        q = rotate_rows(q, Rot + hk * s_rhead, s_rterm, s_rrow, TERMS, False, False, DP,
                        INTERP) * alpha
    else:
        q = q.to(tl.float32)
    q3 = tl.reshape(tl.trans(q), [DP, QROWS // GQP, GQP])
    xsel = tl.arange(0, QROWS // GQP)
    qt = tl.sum(tl.where(xsel[None, :, None] == 0, q3, 0.0), axis=1)  # [DP, GQP]
    gk = tl.arange(0, NGP)
    gsel = (d // G)[:, None] == gk[None, :]  # [DP, NGP]
    amax = tl.max(tl.where(gsel[:, :, None], tl.abs(qt)[:, None, :], 0.0), axis=0)  # [NGP, GQP]
    qsum_k = tl.sum(tl.where(gsel[:, :, None], qt[:, None, :], 0.0), axis=0)  # [NGP, GQP]
    sq = tl.maximum(amax, 1e-30) / 127.0
    sq_d = tl.sum(tl.where(gsel[:, :, None], sq[None, :, :], 0.0), axis=1)  # [DP, GQP]
    qhi = tl.floor(qt / sq_d + 0.5)
    qlo = tl.minimum(tl.maximum(tl.floor((qt - qhi * sq_d) * (256.0 / sq_d) + 0.5), -127.0),
                     127.0)
    sq_lo = sq * (1.0 / 256.0)
    qa0 = _query_plane(qhi, qlo, gsel, A_BITS, 0, DP, NGP, GQP, PK)
    qa1 = qa0
    qa2 = qa0
    qa3 = qa0
    if A_BITS <= 4:
        qa1 = _query_plane(qhi, qlo, gsel, A_BITS, 1, DP, NGP, GQP, PK)
    if A_BITS == 2:
        qa2 = _query_plane(qhi, qlo, gsel, A_BITS, 2, DP, NGP, GQP, PK)
        qa3 = _query_plane(qhi, qlo, gsel, A_BITS, 3, DP, NGP, GQP, PK)
    if R_BITS > 0:
        qr0 = _query_plane(qhi, qlo, gsel, R_BITS, 0, DP, NGP, GQP, PK)
        qr1 = qr0
        qr2 = qr0
        qr3 = qr0
        if R_BITS <= 4:
            qr1 = _query_plane(qhi, qlo, gsel, R_BITS, 1, DP, NGP, GQP, PK)
        if R_BITS == 2:
            qr2 = _query_plane(qhi, qlo, gsel, R_BITS, 2, DP, NGP, GQP, PK)
            qr3 = _query_plane(qhi, qlo, gsel, R_BITS, 3, DP, NGP, GQP, PK)

    # ---- running softmax state and accumulators (rotated basis, plane order)
    m_i = tl.full([GQP], NEG, tl.float32)
    l_i = tl.zeros([GQP], tl.float32)
    EA: tl.constexpr = 8 // A_BITS
    aa0 = tl.zeros([NCV, DP // EA], tl.float32)
    aa1 = aa0
    aa2 = aa0
    aa3 = aa0
    if R_BITS > 0:
        ER: tl.constexpr = 8 // R_BITS
        ar0 = tl.zeros([NCV, DP // ER], tl.float32)
    else:
        ar0 = tl.zeros([NCV, 16], tl.float32)
    ar1 = ar0
    ar2 = ar0
    ar3 = ar0
    acc_m = tl.zeros([NGP, GQP], tl.float32)
    zv = tl.arange(0, PV)

    Ach = Ac + hk * s_ac_h
    Amh = Am + hk * s_am_h
    Rch = Rc + hk * s_rc_h
    Rmh = Rm + hk * s_rm_h
    Cfh = Cf + hk * s_cf_h
    if PREFETCH:  # register double buffer: tile i+1's loads are in flight during tile i
        (t_mask, t_ka, t_va, t_kas, t_kao, t_vas, t_vao, t_kr, t_vr, t_krs, t_kro, t_vrs, t_vro,
         t_ck, t_cv) = _load_tile(lo, hi, KvIndices, start, Ach, s_ac_r, s_ac_kv, Amh, s_am_r,
                                  s_am_kv, Rch, s_rc_r, s_rc_kv, Rmh, s_rm_r, s_rm_kv, Cfh,
                                  s_cf_r, s_cf_kv, D, DP, NG, NGP, A_BITS, R_BITS,
                                  HAS_COEF, BLOCK_N, IDX64)
    for n0 in range(lo, hi, BLOCK_N):
        if PREFETCH:
            n_mask, ka, va, kas, kao, vas, vao, kr, vr, krs, kro, vrs, vro, ck, cv = (
                t_mask, t_ka, t_va, t_kas, t_kao, t_vas, t_vao, t_kr, t_vr, t_krs, t_kro,
                t_vrs, t_vro, t_ck, t_cv)
            (t_mask, t_ka, t_va, t_kas, t_kao, t_vas, t_vao, t_kr, t_vr, t_krs, t_kro, t_vrs,
             t_vro, t_ck, t_cv) = _load_tile(
                n0 + BLOCK_N, hi, KvIndices, start, Ach, s_ac_r, s_ac_kv, Amh, s_am_r, s_am_kv,
                Rch, s_rc_r, s_rc_kv, Rmh, s_rm_r, s_rm_kv, Cfh, s_cf_r, s_cf_kv, D, DP, NG,
                NGP, A_BITS, R_BITS, HAS_COEF, BLOCK_N, IDX64)
        else:
            n_mask, ka, va, kas, kao, vas, vao, kr, vr, krs, kro, vrs, vro, ck, cv = _load_tile(
                n0, hi, KvIndices, start, Ach, s_ac_r, s_ac_kv, Amh, s_am_r, s_am_kv, Rch,
                s_rc_r, s_rc_kv, Rmh, s_rm_r, s_rm_kv, Cfh, s_cf_r, s_cf_kv, D, DP, NG, NGP,
                A_BITS, R_BITS, HAS_COEF, BLOCK_N, IDX64)
        # ---- K: X[n, (g, h, part)] exact int32, then per-group scales, offsets, c
        xa = tl.reshape(_k_dots(ka, qa0, qa1, qa2, qa3, A_BITS, BLOCK_N, NCK, FAST, INTERP)
                        .to(tl.float32), [BLOCK_N, NGP, GQP, 2, PK])
        xa_hi, xa_lo = tl.split(tl.sum(xa, axis=4))
        ya = xa_hi * sq[None, :, :] + xa_lo * sq_lo[None, :, :]  # [BLOCK_N, NGP, GQP]
        if A_BITS == 8:
            kao = kao + 128.0 * kas
        lg = ya * (kas * ck[:, None])[:, :, None]
        off = kao * ck[:, None]
        if R_BITS > 0:
            xr = tl.reshape(_k_dots(kr, qr0, qr1, qr2, qr3, R_BITS, BLOCK_N, NCK, FAST, INTERP)
                            .to(tl.float32), [BLOCK_N, NGP, GQP, 2, PK])
            xr_hi, xr_lo = tl.split(tl.sum(xr, axis=4))
            lg += (xr_hi * sq[None, :, :] + xr_lo * sq_lo[None, :, :]) * krs[:, :, None]
            if R_BITS == 8:
                kro = kro + 128.0 * krs
            off += kro
        logit = tl.sum(lg + off[:, :, None] * qsum_k[None, :, :], axis=1)  # [BLOCK_N, GQP]
        qk = tl.where(n_mask[:, None], logit * qk_scale, float("-inf"))
        # ---- online softmax over the tile
        m_new = tl.maximum(m_i, tl.max(qk, axis=0))
        al = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[None, :])  # [BLOCK_N, GQP]
        l_i = l_i * al + tl.sum(p, axis=0)
        m_i = m_new
        al_col = tl.reshape(tl.broadcast_to(al[None, :, None], [NGP, GQP, PV]), [NCV])
        # ---- V: centred fp16 codes; weights p c s per (token, group, head)
        vao = vao + (1 << (A_BITS - 1)) * vas
        wa = p[:, None, :] * (vas * cv[:, None])[:, :, None]  # [BLOCK_N, NGP, GQP]
        wa = tl.reshape(tl.where(zv[None, None, None, :] == 0, wa[:, :, :, None], 0.0),
                        [BLOCK_N, NCV])
        aa0, aa1, aa2, aa3 = _v_dots(va, wa.to(tl.float16), aa0, aa1, aa2, aa3, al_col, A_BITS,
                                     FAST, INTERP)
        voff = vao * cv[:, None]
        if R_BITS > 0:
            vro = vro + (1 << (R_BITS - 1)) * vrs
            wr = p[:, None, :] * vrs[:, :, None]
            wr = tl.reshape(tl.where(zv[None, None, None, :] == 0, wr[:, :, :, None], 0.0),
                            [BLOCK_N, NCV])
            ar0, ar1, ar2, ar3 = _v_dots(vr, wr.to(tl.float16), ar0, ar1, ar2, ar3, al_col,
                                         R_BITS, FAST, INTERP)
            voff += vro
        acc_m = acc_m * al[None, :] + tl.sum(p[:, None, :] * voff[:, :, None], axis=0)

    # ---- epilogue: natural order [DP, GQP] + offsets of each element's group; store [GQP, DP]
    out = _planes_out(aa0, aa1, aa2, aa3, A_BITS, DP, G, NGP, GQP, PV)
    if R_BITS > 0:
        out += _planes_out(ar0, ar1, ar2, ar3, R_BITS, DP, G, NGP, GQP, PV)
    gv = tl.arange(0, NGP)
    out += tl.sum(tl.where((d // G)[:, None, None] == gv[None, :, None], acc_m[None, :, :], 0.0),
                  axis=1)
    h = tl.arange(0, GQP)
    row = ((b * num_qo_heads + hk * GQ + h) * num_splits + split).to(tl.int64)  # [GQP]
    h_mask = h < GQ
    tl.store(MidO + row[:, None] * DP + d[None, :], tl.trans(out), mask=h_mask[:, None])
    tl.store(MidML + row * 2, m_i, mask=h_mask)
    tl.store(MidML + row * 2 + 1, l_i, mask=h_mask)
