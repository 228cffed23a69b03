"""A NumPy emulation of `csrc/rq_decode_tc.cu` (the split kernel) with the kernel's roundings:
the K side as u8 codes against a 16-bit fixed-point query in two s8 halves (exact s32 sums;
query rows <= 4, KINT) or fp16 query fragments against fp16 codes (the folds), the V side as
fp16 codes against fp16 weights W 2^-VPRE (the factor in p), fp32 MMA accumulation, lazy
rescaling. Lane by lane (arrays over the 32 lanes of a warp), one warp per (request, KV head,
split); plus the merge (`rq_decode_merge_kernel`, without rotation) in fp32. head_dim 64 and 128
only.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from rq_kernels.cuda import CSRC

F32 = np.float32
LANES = np.arange(32)
G, T = LANES >> 2, LANES & 3


def bf16r(x):
    """fp32 -> bf16 (round to nearest even) as fp32 values."""
    u = np.asarray(x, F32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return (r & 0xFFFFFFFF).astype(np.uint32).view(F32)


def f16r(x):
    """fp32 -> fp16 (round to nearest even, subnormals kept) as fp32 values."""
    return np.asarray(x, F32).astype(np.float16).astype(F32)


def bits_bf16(x):
    return (bf16r(x).view(np.uint32) >> 16).astype(np.uint32)


def from_bf16_bits(b):
    return (np.asarray(b, np.uint32) << 16).astype(np.uint32).view(F32)


_FP8 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float().numpy()


def fp8(b):
    return _FP8[np.asarray(b, np.int64)].astype(F32)


def shift(j, bits, f16=False):
    """code_shift<bits, f16>: bf16 holds a 4-bit code at position 0 or 2-bit codes at 0, 2, 4;
    fp16 4-bit codes at 0, 4 and 2-bit codes at 0, 2, ..., 8."""
    if f16:
        return (0 if j < 2 else 8) if bits == 4 else (0 if j < 5 else 10)
    return 4 * j if bits == 4 else (0 if j < 3 else (6 if j < 6 else 12))


def pos(j, bits, f16=False):
    return bits * j - shift(j, bits, f16)


MAGIC = {False: 128.0, True: 1024.0}  # bf16 0x4300 (the kernel before 12-04f), fp16 0x6400
_SRC = (CSRC / "rq_decode_tc.cu").read_text()
# tiles between the V magic drains (the kernel's DRAIN_TOKENS / 16)
DRAIN_TILES = int(re.search(r"#define DRAIN_TOKENS (\d+)", _SRC)[1]) // 16
# the V side: fp16 codes and weights W 2^-VPRE
VPRE = int(re.search(r"#define VPRE (\d+)", _SRC)[1])
# KINT (query rows <= 4): the fixed-point scale of a query row's largest |element|
QFIX = float(re.search(r"#define QFIX ([0-9.]+)f", _SRC)[1])


def k_elem_int(r, b, bits):
    """k_elem_int<bits>: the slice element in byte b of KINT register r (`unpack_k_int`)."""
    if bits == 4:
        return (2 * (r // 4) + (r & 1)) * 8 + 2 * b + (r % 4) // 2
    return (r // 4) * 16 + 4 * b + (2 if r & 1 else 0) + (r % 4) // 2


def unpack_k_int(ws, bits):
    """unpack_k_int<bits>: a token slice's words (list of uint32 [32]) -> registers as [32, 4]
    int64 byte values (register r, byte b: the code of slice element k_elem_int(r, b), times
    2^bits where r % 4 >= 2)."""
    m = ((1 << bits) - 1) * 0x01010101
    regs = []
    ws = [np.asarray(w, np.uint64) for w in ws]
    for w in range(len(ws) // (2 if bits == 4 else 1)):
        if bits == 4:
            x0, x1 = ws[2 * w], ws[2 * w + 1]
            vals = (x0 & m, x1 & m, x0 & (m << 4), x1 & (m << 4))
        else:
            x, y = ws[w], ws[w] >> 4
            vals = (x & m, y & m, x & (m << 2), y & (m << 2))
        regs += [np.stack([(v >> (8 * b)) & 0xFF for b in range(4)], axis=1).astype(np.int64)
                 for v in vals]
    return regs


def imma(c, a, b):
    """m16n8k32 u8 x s8 -> s32 (exact): c [32, 4] int64; a: 4 registers [32, 4] (rows g, g + 8;
    k 4t + i, 16 + 4t + i); b: 2 registers [32, 4] (k 4t + i, 16 + 4t + i; column g)."""
    A = np.zeros((16, 32), np.int64)
    B = np.zeros((32, 8), np.int64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i, (r, k) in enumerate(((g, 4 * t), (g + 8, 4 * t), (g, 4 * t + 16), (g + 8, 4 * t + 16))):
            A[r, k:k + 4] = a[i][lane]
        for i, k in enumerate((4 * t, 4 * t + 16)):
            B[k:k + 4, g] = b[i][lane]
    C = A @ B
    g, t = LANES >> 2, LANES & 3
    return c + np.stack([C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]], axis=1)


def unpack_word(x, bits, f16=False):
    """x uint32 array -> list of H (lo, hi) fp32 value pairs (MAGIC + code * 2^pos), bf16 (the V
    side) or fp16 (f16: the K side)."""
    out = []
    x = np.asarray(x, np.uint64)
    for j in range(16 // bits):
        m = ((1 << bits) - 1) << pos(j, bits, f16)
        r = ((x >> shift(j, bits, f16)) & (m | (m << 16))) | (0x64006400 if f16 else 0x43004300)
        r = r.astype(np.uint32)
        if f16:
            out.append(((r & 0xFFFF).astype(np.uint16).view(np.float16).astype(F32),
                        (r >> 16).astype(np.uint16).view(np.float16).astype(F32)))
        else:
            out.append((from_bf16_bits(r & 0xFFFF), from_bf16_bits(r >> 16)))
    return out


def mma(c, a, b, trunc=False):
    """c [32, 4] fp32; a: 4 x (lo, hi) arrays [32]; b: 2 x (lo, hi). Returns new c. trunc: the
    accumulation rounds toward zero (the tensor cores' fp32 accumulation, Fasi et al. 2021,
    "Numerical behavior of NVIDIA tensor cores"), modelled as one rounding of the exact
    sum c + A B; else two round-to-nearest additions (A B, then c)."""
    A = np.zeros((16, 16), np.float64)
    B = np.zeros((16, 8), np.float64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i, (r, k) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
            A[r, k], A[r, k + 1] = a[i][0][lane], a[i][1][lane]
        for i, k in enumerate((2 * t, 2 * t + 8)):
            B[k, g], B[k + 1, g] = b[i][0][lane], b[i][1][lane]
    C = A @ B  # products exact, one rounding of the 16-term sum (to fp32 below)
    lane = np.arange(32)
    g, t = lane >> 2, lane & 3
    d = np.stack([C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]], axis=1)
    if not trunc:
        return (d.astype(F32) + c).astype(F32)
    x = d + c.astype(np.float64)
    out = x.astype(F32)
    over = np.abs(out.astype(np.float64)) > np.abs(x)
    return np.where(over, np.nextafter(out, F32(0)), out).astype(F32)


def words(buf, offs, nbytes):
    """load_words<nbytes> at byte offsets offs [32] of buf (uint8) -> list of uint32 [32]."""
    res = []
    for w in range(max(1, nbytes // 4)):
        n = min(4, nbytes - 4 * w)
        v = np.zeros(32, np.uint64)
        for k in range(n):
            v |= buf[offs + 4 * w + k].astype(np.uint64) << (8 * k)
        res.append(v.astype(np.uint32))
    return res


def perm(a, b, sel):
    a = a.astype(np.uint64)
    b = b.astype(np.uint64)
    if sel == 0x5410:
        return ((a & 0xFFFF) | ((b & 0xFFFF) << 16)).astype(np.uint32)
    return ((a >> 16) | ((b >> 16) << 16)).astype(np.uint32)


def shfl(v, src):
    return v[np.broadcast_to(src, (32,))]


def xor(v, m):
    return v[LANES ^ m]


def balanced_split(lengths, rows, fill_rows, step):
    """``balanced_split`` of the kernel, lane for lane: the split length c (the smallest of 32
    candidates between cdiv(total, fill_rows) and cdiv(total, rows - B), multiples of ``step``,
    whose splits sum_b max(1, cdiv(L_b, c)) fit ``rows``; lane 31's where none does) and each
    request's (first row, split count)."""
    B, total = len(lengths), int(sum(lengths))
    lo = -(-total // fill_rows)
    hi = -(-total // (rows - B))
    used = lambda n, c: max(-(-n // c), 1)  # noqa: E731
    cands = [max((lo + (hi - lo) * lane // 31 + step - 1) // step, 1) * step for lane in range(32)]
    fits = [sum(used(int(n), c) for n in lengths) <= rows for c in cands]
    c = cands[fits.index(True)] if any(fits) else cands[31]
    counts = [used(int(n), c) for n in lengths]
    firsts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
    return c, list(zip(firsts, counts))


def split_kernel(q_rot, kv_indptr, kv_indices, tensors, *, head_dim, gs, gq, a_bits, r_bits,
                 qk_scale, num_splits, num_qo_heads, lazy=True, round_w=True,
                 trunc=False, drain=True, fill_rows=0, step=16, v_f16=True, v_pre=VPRE,
                 drain_tiles=None):
    """trunc: the MMAs' accumulation rounds toward zero
    (`mma`). drain: the V accumulators' magic share is taken out every DRAIN_TOKENS tokens
    (``rescale_drain``); False mirrors the kernel before it. fill_rows > 0: balanced splits
    (`balanced_split`, ``num_splits`` = the rows the batch shares, ``step`` tokens per
    iteration); request b's splits then sit at [b, :, 0:count] and its unused rows hold nothing
    (m -1e30, l 0, o 0). v_f16: V codes as fp16 (magic 1024) and the V weights as fp16 times
    2^-v_pre (the kernel's VPRE), else bf16 (the kernel before 12-04f); drain_tiles: tiles
    between drains (default the kernel's). Returns mid_o [B, HQ, S, D], mid_ml [B, HQ, S, 2] (numpy fp32)."""
    vmagic = F32(MAGIC[v_f16])
    v_pre = v_pre if v_f16 else 0  # bf16 weights are W unscaled
    dtiles = drain_tiles or DRAIN_TILES
    ac, aso, rc, rso, cf = tensors  # numpy: codes [rows, 2, H, bytes], so [rows, 2, H, NG, 2], cf [rows, 2, H] fp32
    hd = head_dim
    D = 64 if hd == 64 else 128
    assert hd == D
    NG, SL, K_STEPS, NT = D // gs, D // 4, D // 16, D // 8
    ROWS = gq * NG
    HA = 16 // a_bits
    B = len(kv_indptr) - 1
    hkv = num_qo_heads // gq
    mid_o = np.full((B, num_qo_heads, num_splits, D), np.nan, F32)
    mid_ml = np.full((B, num_qo_heads, num_splits, 2), np.nan, F32)
    if fill_rows:
        lengths = np.diff(np.asarray(kv_indptr)).tolist()
        c_bal, rows_of = balanced_split(lengths, num_splits, fill_rows, step)
        mid_o[:], mid_ml[..., 0], mid_ml[..., 1] = 0, -1e30, 0
    kint = ROWS <= 4  # KINT: columns g >= 4 carry the low halves of row g - 4
    krow = (G & 3) if kint else G
    gt = (SL * T) // gs
    grp = krow % NG
    h = krow // NG
    row_ok = krow < ROWS
    a_rows = row_ok & (grp == gt)
    tq = (T & 1) if kint else T  # KINT: lanes t >= 2 hold the low halves' columns
    k_low = kint & (T >= 2)
    cg = (2 * tq) % NG
    col_ok = 2 * tq < ROWS
    # V: lane g builds B column g, row vr = (head vh, group vgrp); paired (ROWS <= 4): columns
    # g >= 4 carry the residual's weights of row g - 4 (nothing without a residual)
    paired = ROWS <= 4
    NM = NT // 2
    vr = np.where(paired, G & 3, G)
    second = paired & (G >= 4)
    vgrp, vh = vr % NG, vr // NG
    v_ok = vr < ROWS
    src_t = np.where((vh * NG) // 2 < 4, (vh * NG) // 2, 0)

    def k_elem(r, half, bits):
        H = 16 // bits
        return (r // H) * (32 // bits) + half * H + r % H

    for b in range(B):
        base = int(kv_indptr[b])
        seq = int(kv_indptr[b + 1]) - base
        per_split = ((seq + num_splits - 1) // num_splits + step - 1) // step * step
        splits = num_splits
        if fill_rows:
            per_split, splits = c_bal, rows_of[b][1]
        for hk in range(hkv):
            # query fragments per lane
            qrow = q_rot[b, hk * gq + np.where(row_ok, h, 0)]  # [32, hd]
            if kint:  # fixed point q16 = 256 hi + lo of the row's largest |element| QFIX
                qx = np.where(a_rows[:, None], bf16r(qrow[LANES[:, None], SL * T[:, None] + np.arange(SL)]),
                              F32(0))
                qmax = np.abs(qx).max(axis=1).astype(F32)
                qsum = np.where(G < 4, qx.sum(axis=1, dtype=F32), F32(0)).astype(F32)
                for m in (1, 2):
                    qmax = np.maximum(qmax, xor(qmax, m))
                    qsum = qsum + xor(qsum, m)
                with np.errstate(divide="ignore"):
                    qscale = np.where(qmax > 0, F32(QFIX) / qmax, F32(0)).astype(F32)

                def qfrag(bits):
                    regs = []
                    for r in range(SL // 4):
                        e = np.array([k_elem_int(r, bb, bits) for bb in range(4)])
                        q16 = np.rint((qx[:, e] * qscale[:, None]).astype(F32)).astype(np.int64)
                        qhi = (q16 + 128) >> 8
                        regs.append(np.where((G >= 4)[:, None], q16 - 256 * qhi, qhi))
                    return [(regs[2 * s], regs[2 * s + 1]) for s in range(SL // 8)]

                qa = qfrag(a_bits)
                qr = qfrag(r_bits) if r_bits else None
                cs = [(shfl(qmax, 4 * (2 * tq + c)) / F32(QFIX)).astype(F32) for c in range(2)]
                cq = [shfl(qsum, 4 * (2 * tq + c)) for c in range(2)]
            else:  # fp16 fragments pre-divided by 2^pos, the folds 1024 sum q
                qa = [[None, None] for _ in range(K_STEPS)]
                qr = [[None, None] for _ in range(K_STEPS)]
                qsum = np.zeros(32, F32)
                fold_a = np.zeros(32, F32)
                fold_r = np.zeros(32, F32)
                for r in range(SL // 2):
                    v = [None, None]
                    w = [None, None]
                    for half in range(2):
                        e = SL * T + k_elem(r, half, a_bits)
                        x = np.where(a_rows, bf16r(qrow[LANES, e]), F32(0))
                        v[half] = (x * F32(1.0 / (1 << pos(r % HA, a_bits, True)))).astype(F32)
                        qsum = (qsum + x).astype(F32)
                        if r_bits:
                            e2 = SL * T + k_elem(r, half, r_bits)
                            y = np.where(a_rows, bf16r(qrow[LANES, e2]), F32(0))
                            w[half] = (y * F32(1.0 / (1 << pos(r % (16 // r_bits), r_bits, True)))).astype(F32)
                    qa[r // 2][r % 2] = (f16r(v[0]), f16r(v[1]))
                    fold_a = (fold_a + F32(1024) * (qa[r // 2][r % 2][0] + qa[r // 2][r % 2][1])).astype(F32)
                    if r_bits:
                        qr[r // 2][r % 2] = (f16r(w[0]), f16r(w[1]))
                        fold_r = (fold_r + F32(1024) * (qr[r // 2][r % 2][0] + qr[r // 2][r % 2][1])).astype(F32)
                for m in (1, 2):
                    fold_a = fold_a + xor(fold_a, m)
                    fold_r = fold_r + xor(fold_r, m)
                    qsum = qsum + xor(qsum, m)
                cf_a = [shfl(fold_a, 4 * (2 * T + c)) for c in range(2)]
                cf_r = [shfl(fold_r, 4 * (2 * T + c)) for c in range(2)]
                cq = [shfl(qsum, 4 * (2 * T + c)) for c in range(2)]
            for split in range(splits):
                lo = split * per_split
                hi = min(lo + per_split, seq)
                ntiles = (hi - lo + 15) // 16 if lo < hi else 0
                cv = np.zeros((NM, 32, 4), F32)  # rows g, 8 + g: elements NT g + 2m, + 1
                cw = np.zeros((NM, 32, 4), F32)  # the residual's (not paired)
                m_run = np.full(32, -np.inf, F32)
                l_run = np.zeros(32, F32)
                sw_a = np.zeros(32, F32)
                sw_r = np.zeros(32, F32)
                m_off = np.zeros(32, F32)
                for it in range(ntiles):
                    n = lo + it * 16
                    toks = n + np.arange(16)
                    slots = np.where(toks < hi, kv_indices[base + np.minimum(toks, seq - 1)], 0)
                    # stage buffers: codes [16, pitch], so [kind][16][4 bytes]
                    ka = ac[slots, 0, hk].reshape(-1)
                    va = ac[slots, 1, hk].reshape(-1)
                    ska = aso[slots, 0, hk].reshape(16, -1)  # [16, NG*2]
                    sva = aso[slots, 1, hk].reshape(16, -1)
                    if r_bits:
                        kr = rc[slots, 0, hk].reshape(-1)
                        vr_ = rc[slots, 1, hk].reshape(-1)
                        skr = rso[slots, 0, hk].reshape(16, -1)
                        svr = rso[slots, 1, hk].reshape(16, -1)
                    if cf is not None:
                        ck = cf[slots, 0, hk]
                        cvf = cf[slots, 1, hk]

                    def k_dots(buf, bits, qf):
                        KB = SL * bits // 8
                        pitch = D * bits // 8
                        if kint:  # exact sums times 2^bits: even steps' chain, then the odd's
                            u = [unpack_k_int(words(buf, tok * pitch + T * KB, KB), bits)
                                 for tok in (G, 8 + G)]
                            x = [np.zeros((32, 4), np.int64) for _ in range(2)]
                            for s in range(SL // 8):
                                x[s % 2] = imma(x[s % 2], (u[0][2 * s], u[1][2 * s], u[0][2 * s + 1],
                                                           u[1][2 * s + 1]), qf[s])
                            return x[0] * (1 << bits) + x[1]
                        u = []
                        for tok in (G, 8 + G):
                            regs = []
                            for wd in words(buf, tok * pitch + T * KB, KB):
                                regs += unpack_word(wd, bits, f16=True)
                            u.append(regs)
                        x = np.zeros((32, 4), F32)
                        for s in range(K_STEPS):
                            x = mma(x, (u[0][2 * s], u[1][2 * s], u[0][2 * s + 1], u[1][2 * s + 1]),
                                    (qf[s][0], qf[s][1]), trunc)
                        return x

                    xa = k_dots(ka, a_bits, qa)
                    if r_bits:
                        xr = k_dots(kr, r_bits, qr)
                    if kint:  # k_whole: lane t finishes token g, lane t + 2 token 8 + g
                        def whole(x):
                            w = []
                            for c in range(2):
                                got = xor(np.where(k_low, x[:, c], x[:, 2 + c]), 2)
                                w.append(np.where(k_low, 256 * got + x[:, 2 + c], 256 * x[:, c] + got))
                            return w

                        wa = whole(xa)
                        wr = whole(xr) if r_bits else None
                        tk = np.where(k_low, 8 + G, G)
                        c_k = ck[tk] if cf is not None else np.ones(32, F32)
                        acc = np.zeros(32, F32)
                        for c in range(2):
                            sx = fp8(ska[tk, 2 * (cg + c)])
                            sy = fp8(ska[tk, 2 * (cg + c) + 1])
                            ka_ = (cs[c] * F32(1 / (1 << a_bits)) * wa[c].astype(F32)).astype(F32)
                            v = c_k * (sx * ka_ + sy * cq[c])
                            if r_bits:
                                rx = fp8(skr[tk, 2 * (cg + c)])
                                ry = fp8(skr[tk, 2 * (cg + c) + 1])
                                kr_ = (cs[c] * F32(1 / (1 << r_bits)) * wr[c].astype(F32)).astype(F32)
                                v = v + rx * kr_ + ry * cq[c]
                            acc = acc + np.where(col_ok, v, F32(0)).astype(F32)
                        if NG == 4:
                            acc = acc + xor(acc, 1)
                        lgv = np.where(col_ok & (n + tk < hi), acc * F32(qk_scale), -np.inf).astype(F32)
                        lg = [lgv, lgv]
                    else:
                        lg = []
                        for j in range(2):
                            tk = 8 * j + G
                            c_k = ck[tk] if cf is not None else np.ones(32, F32)
                            acc = np.zeros(32, F32)
                            for c in range(2):
                                sx = fp8(ska[tk, 2 * (cg + c)])
                                sy = fp8(ska[tk, 2 * (cg + c) + 1])
                                v = c_k * (sx * (xa[:, 2 * j + c] - cf_a[c]) + sy * cq[c])
                                if r_bits:
                                    rx = fp8(skr[tk, 2 * (cg + c)])
                                    ry = fp8(skr[tk, 2 * (cg + c) + 1])
                                    v = v + rx * (xr[:, 2 * j + c] - cf_r[c]) + ry * cq[c]
                                acc = acc + np.where(col_ok, v, F32(0)).astype(F32)
                            if NG == 4:
                                acc = acc + xor(acc, 1)
                            lg.append(np.where(col_ok & (n + tk < hi), acc * F32(qk_scale), -np.inf).astype(F32))
                    mt = np.maximum(lg[0], lg[1])
                    for m in ((2, 4, 8, 16) if kint else (4, 8, 16)):
                        mt = np.maximum(mt, xor(mt, m))
                    mt = shfl(mt, src_t)
                    qk = []
                    cvv = []
                    for i in range(4):
                        v = shfl(lg[i >> 1], 4 * (2 * T + (i & 1)) + src_t + (2 * (i >> 1) if kint else 0))
                        qk.append(np.where(v_ok, v, -np.inf).astype(F32))
                        tk = 2 * T + (i & 1) + 8 * (i >> 1)
                        cvv.append(cvf[tk] if cf is not None else np.ones(32, F32))
                    mt = np.where(v_ok, mt, -np.inf)
                    thr = 8.0 if lazy else 0.0
                    # the rescale, forced every DRAIN_TOKENS tokens for the drain
                    if np.any(mt > m_run + thr) or (drain and it % dtiles == dtiles - 1):
                        m_new = np.maximum(m_run, mt)
                        with np.errstate(invalid="ignore"):
                            f = np.where(m_new == -np.inf, F32(1), np.exp2(m_run - m_new)).astype(F32)
                        # accumulator columns 2t, 2t + 1: the factors of their heads (quads 2t, 2t + 1)
                        fc = np.stack([shfl(f, 4 * (2 * T + c)) for c in (0, 1, 0, 1)], axis=1)
                        if drain:  # c = fma(c, f, -128 SW f) per column, SW over the quad
                            for acc, sw in ((cv, sw_a), (cw, sw_r)):
                                tot = sw + xor(sw, 1)
                                tot = tot + xor(tot, 2)
                                sc = np.stack([shfl(tot, 4 * (2 * T + c)) for c in (0, 1, 0, 1)], axis=1)
                                d = (-vmagic * sc * fc).astype(F32)
                                acc[:] = (acc.astype(np.float64) * fc[None] + d[None]).astype(F32)
                            sw_a = np.zeros(32, F32)
                            sw_r = np.zeros(32, F32)
                        else:
                            cv *= fc[None]
                            cw *= fc[None]
                            sw_a *= f
                            sw_r *= f
                        l_run *= f
                        m_off *= f
                        m_run = m_new.astype(F32)
                    wa, wr = [], []
                    # p carries the fp16 weights' 2^-v_pre (the kernel's m_p); a masked logit
                    # (-inf) gives exp2(-inf) = 0, also while m_run is -inf
                    m_p = (np.maximum(m_run, F32(-1e30)) + F32(v_pre)).astype(F32)
                    for i in range(4):
                        p = np.exp2(qk[i] - m_p).astype(F32)
                        tk = 2 * T + (i & 1) + 8 * (i >> 1)
                        sx = fp8(sva[tk, 2 * vgrp])
                        sy = fp8(sva[tk, 2 * vgrp + 1])
                        if r_bits:
                            rx = fp8(svr[tk, 2 * vgrp])
                            ry = fp8(svr[tk, 2 * vgrp + 1])
                        if paired and r_bits:  # column g: the anchor's (g < 4) or residual's
                            pc = np.where(second, p, (p * cvv[i]).astype(F32))
                            wa.append((pc * np.where(second, rx, sx)).astype(F32))
                            m_off = (m_off + pc * np.where(second, ry, sy)).astype(F32)
                        elif paired:
                            wa.append((p * cvv[i] * sx).astype(F32))
                            m_off = (m_off + np.where(second, F32(0), p * cvv[i] * sy)).astype(F32)
                        else:
                            wa.append((p * cvv[i] * sx).astype(F32))
                            off = cvv[i] * sy
                            if r_bits:
                                wr.append((p * rx).astype(F32))
                                off = off + ry
                            m_off = (m_off + p * off).astype(F32)
                        l_run = l_run + p
                    rw = bf16r if round_w else (lambda z: z)
                    if v_f16:
                        rw = f16r if round_w else (lambda z: z)
                    wa = [rw(z) for z in wa]
                    if not r_bits and paired:  # columns 4-7 carry nothing
                        wa = [np.where(second, F32(0), w_) for w_ in wa]
                    sw_a = (sw_a + wa[0] + wa[1] + wa[2] + wa[3]).astype(F32)
                    if r_bits and not paired:
                        wr = [rw(z) for z in wr]
                        sw_r = (sw_r + wr[0] + wr[1] + wr[2] + wr[3]).astype(F32)

                    def v_regs(buf, bits):
                        VB = NT * bits // 8
                        pitch = D * bits // 8
                        NH = NT * bits // 16
                        vv = [words(buf, (2 * T + (i & 1) + 8 * (i >> 1)) * pitch + G * VB, VB)
                              for i in range(4)]
                        out = []
                        for a_, b_ in ((vv[0], vv[1]), (vv[2], vv[3])):
                            regs = []
                            for w_ in range((NH + 1) // 2):
                                regs += unpack_word(perm(a_[w_], b_[w_], 0x5410), bits, v_f16)
                                if 2 * w_ + 1 < NH:
                                    regs += unpack_word(perm(a_[w_], b_[w_], 0x7632), bits, v_f16)
                            out.append(regs)
                        return out

                    def bf(w, keep=True):  # B fragments of column g: tokens (2t, 2t+1), (2t+8, 2t+9)
                        w = [np.where(keep, z, F32(0)) for z in w]
                        return ((w[0], w[1]), (w[2], w[3]))

                    def af(u01, u89, m):  # rows g, 8 + g of m-tile m: elements NT g + 2m, + 1
                        return (u01[2 * m], u01[2 * m + 1], u89[2 * m], u89[2 * m + 1])

                    u01, u89 = v_regs(va, a_bits)
                    for m in range(NM):
                        cv[m] = mma(cv[m], af(u01, u89, m), bf(wa, ~second), trunc)
                    if r_bits:
                        u01, u89 = v_regs(vr_, r_bits)
                        for m in range(NM):
                            if paired:
                                cv[m] = mma(cv[m], af(u01, u89, m), bf(wa, second), trunc)
                            else:
                                cw[m] = mma(cw[m], af(u01, u89, m), bf(wr), trunc)
                l_run = (l_run * F32(2.0 ** v_pre)).astype(F32)  # back from the units of p
                m_off = (m_off * F32(2.0 ** v_pre)).astype(F32)
                for m in (1, 2):
                    l_run = l_run + xor(l_run, m)
                    sw_a = sw_a + xor(sw_a, m)
                    sw_r = sw_r + xor(sw_r, m)
                    m_off = m_off + xor(m_off, m)
                swa_c = [shfl(sw_a, 4 * (2 * T + c)) for c in range(2)]
                swr_c = [shfl(sw_r, 4 * (2 * T + c)) for c in range(2)]
                ge = (NT * G) // gs
                sb = r_bits or a_bits
                for hq in range(gq):
                    col = hq * NG + ge
                    moff = shfl(m_off, 4 * col)
                    if paired:
                        moff = (moff + shfl(m_off, 4 * (col + 4))).astype(F32)
                    for li in range(NT):
                        v = np.zeros(32, F32)
                        for c in range(2):
                            ncol = 2 * T + c
                            x = cv[li // 2][:, 2 * (li % 2) + c]
                            sc_ = F32(2.0 ** v_pre)
                            pa = F32(1.0 / (1 << pos(li % (16 // a_bits), a_bits, v_f16))) * sc_
                            v = v + np.where(ncol == col, (x - vmagic * swa_c[c]) * pa, F32(0))
                            if paired:
                                ps = F32(1.0 / (1 << pos(li % (16 // sb), sb, v_f16))) * sc_
                                v = v + np.where(ncol == col + 4, (x - vmagic * swa_c[c]) * ps, F32(0))
                            elif r_bits:
                                y = cw[li // 2][:, 2 * (li % 2) + c]
                                pr = F32(1.0 / (1 << pos(li % (16 // r_bits), r_bits, v_f16))) * sc_
                                v = v + np.where(ncol == col, (y - vmagic * swr_c[c]) * pr, F32(0))
                            v = v.astype(F32)
                        v = (v + xor(v, 1)).astype(F32)
                        v = (v + xor(v, 2)).astype(F32)
                        w_ = T == li % 4
                        mid_o[b, hk * gq + hq, split, NT * G[w_] + li] = (v + moff)[w_]
                for lane in range(32):
                    if v_ok[lane] and not second[lane] and vgrp[lane] == 0 and lane & 3 == 0:
                        mid_ml[b, hk * gq + vh[lane], split, 0] = m_run[lane] if lo < hi else -1e30
                        mid_ml[b, hk * gq + vh[lane], split, 1] = l_run[lane]
    return mid_o, mid_ml

def merge(q, k_cur, v_cur, mid_o, mid_ml, qk_scale, gq):
    """rq_decode_merge_kernel without rotation, fp32 (returns fp32, before the bf16 store)."""
    B, HQ, S, D = mid_o.shape
    out = np.empty((B, HQ, D), F32)
    for b in range(B):
        for hq in range(HQ):
            m = mid_ml[b, hq, :, 0]
            ls = mid_ml[b, hq, :, 1]
            mm = m.max()
            a = np.exp2(m - mm).astype(F32)
            acc = (mid_o[b, hq] * a[:, None]).sum(0)
            lr = (ls * a).sum()
            s_cur = F32(np.dot(q[b, hq].astype(F32), k_cur[b, hq // gq].astype(F32)) * qk_scale)
            mn = max(mm, s_cur)
            ao = np.exp2(mm - mn)
            pc = np.exp2(s_cur - mn)
            acc = acc * ao + v_cur[b, hq // gq] * pc
            lr = lr * ao + pc
            out[b, hq] = acc / lr
    return out
