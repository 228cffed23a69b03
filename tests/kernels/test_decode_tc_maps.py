"""The CUDA tensor-core split kernel's index maps, emulated lane by lane in Python (no GPU).

`_tile` mirrors `csrc/rq_decode_tc.cu` for one warp and one 16-token tile: the shared-memory
stage (codes at the kernel's width with junk in head_dim 96's padding bytes, (scale, offset)
rows at their offset in the two copied words, junk around them, FP8 NaN bytes included), the
per-lane code unpacking (LOP3 with the fp16 0x6400 magic, u8 masks on the integer K side, PRMT
interleave), the query fragments and
folds, the m16n8k16 fragment layouts of both MMA phases, the shuffles between them and the
epilogue. It checks, for head_dim 64, 96 and 128, that the logits and the unnormalised output
equal a direct computation over the dequantized codes, that every output element of every row
is written exactly once (head_dim 96: the padding columns 96-127 as 0), and that no query
element past head_dim is read. The arithmetic is float64 without the kernel's fp16 roundings:
this checks which element meets which, not rounding. The code layout (shifts, positions,
unpacking, byte permutes) comes from `tc_emulation`, the numerics emulation. Keep both in step
with the .cu.
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
import tc_emulation as emu

NAN = float("nan")
INF = float("inf")


def _fp8(byte: int) -> float:
    return float(emu.fp8(byte))


def _pos(j: int, bits: int, f16: bool = False) -> int:
    return emu.pos(j, bits, f16)


def _unpack_word(x: int, bits: int, f16: bool = False) -> list[tuple[float, float]]:
    """unpack_word (`tc_emulation.unpack_word` on one lane): register j = (lo half, hi half) as
    values MAGIC + code * 2^pos (fp16 with f16, as the kernel unpacks; bf16 without)."""
    return [(float(lo[0]), float(hi[0])) for lo, hi in emu.unpack_word(np.array([x]), bits, f16)]


def _words(buf: bytes, off: int, n: int) -> list[int]:
    """load_words<n>: little-endian 32-bit words (n = 2: one zero-extended 16-bit half)."""
    return [int.from_bytes(buf[off + 4 * w: off + min(4 * w + 4, n)], "little")
            for w in range(max(1, n // 4))]


def _perm(a: int, b: int, sel: int) -> int:
    """__byte_perm for the two selectors the kernel uses (`tc_emulation.perm` on one lane)."""
    return int(emu.perm(np.array([a]), np.array([b]), sel)[0])


def _mma(a_frag, b_frag):
    """m16n8k16: a_frag[lane] = 4 (lo, hi) pairs, b_frag[lane] = 2 pairs -> C fragments."""
    A = [[0.0] * 16 for _ in range(16)]
    B = [[0.0] * 8 for _ in range(16)]
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i, (r, k) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
            A[r][k], A[r][k + 1] = a_frag[lane][i]
        for i, k in enumerate((2 * t, 2 * t + 8)):
            B[k][g], B[k + 1][g] = b_frag[lane][i]
    C = [[sum(A[m][k] * B[k][n] for k in range(16)) for n in range(8)] for m in range(16)]
    return [(C[g][2 * t], C[g][2 * t + 1], C[g + 8][2 * t], C[g + 8][2 * t + 1])
            for g, t in ((lane >> 2, lane & 3) for lane in range(32))]


def _mma32(a_frag, b_frag):
    """m16n8k32 (KINT): a_frag[lane] = 4 registers of 4 values (rows g, g + 8; k 4t + i,
    16 + 4t + i), b_frag[lane] = 2 registers of 4 (k 4t + i, 16 + 4t + i; column g)."""
    A = [[0.0] * 32 for _ in range(16)]
    B = [[0.0] * 8 for _ in range(32)]
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for reg, (r, k) in zip(a_frag[lane], ((g, 4 * t), (g + 8, 4 * t), (g, 4 * t + 16),
                                               (g + 8, 4 * t + 16))):
            A[r][k:k + 4] = [float(v) for v in reg]
        for reg, k in zip(b_frag[lane], (4 * t, 4 * t + 16)):
            for i in range(4):
                B[k + i][g] = reg[i]
    C = [[sum(A[m][k] * B[k][n] for k in range(32)) for n in range(8)] for m in range(16)]
    return [(C[g][2 * t], C[g][2 * t + 1], C[g + 8][2 * t], C[g + 8][2 * t + 1])
            for g, t in ((lane >> 2, lane & 3) for lane in range(32))]


def _query_row(lane, sl, gs, ng, ngr, rows, hd, kint):
    """(head h, whether slice t feeds it) of the query row lane g builds: row g, or under KINT row
    g & 3 (columns g >= 4 hold the low halves of row g - 4)."""
    g, t = lane >> 2, lane & 3
    row = g & 3 if kint else g
    gt, grp = sl * t // gs, row % ng
    return row // ng, row < rows and grp == gt and (hd != 96 or gt < ngr)


def _k_side_int(q, stage_codes, hd, gs, a_bits, r_bits, rows, sl, d):
    """KINT (query rows <= 4): u8 codes (`tc_emulation.unpack_k_int`) against the query as 16-bit
    fixed point in two halves (hi, columns 0-3; lo, columns 4-7 of row g - 4) per row, its largest
    |element| at QFIX; unrounded here (hi = floor((q16 + 128) / 256), lo = q16 - 256 hi exactly),
    so the check is exact. Returns the K accumulators per loop and kf(lane, c, loop, x) ->
    (x times column c's factor, the offset's sum q)."""
    ng, ngr = d // gs, hd // gs
    lanes = range(32)
    qmax, qsum, qf = [0.0] * 32, [0.0] * 32, [[None] * 32 for _ in range(2)]
    for lane in lanes:
        g, t = lane >> 2, lane & 3
        h, a_rows = _query_row(lane, sl, gs, ng, ngr, rows, hd, True)
        for e in range(sl):
            if a_rows:
                assert sl * t + e < hd, "query read past head_dim"
        qmax[lane] = max((abs(q[h][sl * t + e]) for e in range(sl)), default=0.0) if a_rows else 0.0
        qsum[lane] = sum(q[h][sl * t + e] for e in range(sl)) if a_rows and g < 4 else 0.0
    quadmax = [max(qmax[4 * (lane >> 2) + i] for i in range(4)) for lane in lanes]
    qsum = [sum(qsum[4 * (lane >> 2) + i] for i in range(4)) for lane in lanes]
    for lane in lanes:
        g, t = lane >> 2, lane & 3
        h, a_rows = _query_row(lane, sl, gs, ng, ngr, rows, hd, True)
        for lp, b in enumerate((a_bits, r_bits)):
            if not b:
                continue
            regs = []
            for r in range(sl // 4):
                reg = []
                for bb in range(4):
                    x = q[h][sl * t + emu.k_elem_int(r, bb, b)] if a_rows else 0.0
                    q16 = x * emu.QFIX / quadmax[lane] if quadmax[lane] else 0.0
                    qhi = math.floor((q16 + 128) / 256)
                    reg.append(q16 - 256 * qhi if g >= 4 else qhi)
                regs.append(reg)
            qf[lp][lane] = [(regs[2 * s], regs[2 * s + 1]) for s in range(sl // 8)]
    x = []
    for lp, b in enumerate((a_bits, r_bits)):
        if not b:
            x.append(None)
            continue
        kb, buf, pitch = sl * b // 8, stage_codes[2 * lp], d * b // 8
        u = {}
        for lane in lanes:
            g, t = lane >> 2, lane & 3
            u[lane] = [[[int(v) for v in reg[0]] for reg in emu.unpack_k_int(
                [np.array([w]) for w in _words(buf, tok * pitch + t * kb, kb)], b)]
                for tok in (g, 8 + g)]
        chains = [[[0.0] * 4 for _ in lanes] for _ in range(2)]
        for s in range(sl // 8):
            c = _mma32({lane: (u[lane][0][2 * s], u[lane][1][2 * s], u[lane][0][2 * s + 1],
                               u[lane][1][2 * s + 1]) for lane in lanes},
                       {lane: qf[lp][lane][s] for lane in lanes})
            for lane in lanes:
                chains[s % 2][lane] = [a + v for a, v in zip(chains[s % 2][lane], c[lane])]
        x.append([[e * (1 << b) + o for e, o in zip(chains[0][lane], chains[1][lane])]
                  for lane in lanes])

    def kf(lane, c, lp, v):
        t = lane & 3
        src = 4 * (2 * (t & 1) + c)
        bits = (a_bits, r_bits)[lp]
        scale = quadmax[src] / emu.QFIX / (1 << bits)  # v: a whole sum 256 hi + lo
        return v * scale, qsum[src]
    return x, kf


def _k_side_f16(q, stage_codes, hd, gs, a_bits, r_bits, rows, sl, d):
    """fp16 codes (magic 1024) against fp16 query fragments pre-divided by 2^pos, the folds.
    Returns what `_k_side_int` does."""
    ng, ngr = d // gs, hd // gs
    lanes = range(32)

    def k_elem(r, half, bits):
        h = 16 // bits
        return (r // h) * (32 // bits) + half * h + r % h

    # ---- query fragments and folds per lane (loop 0: anchor, 1: residual)
    qf = [[None] * 32 for _ in range(2)]
    fold = [[0.0] * 32 for _ in range(2)]
    qsum = [0.0] * 32
    for lane in lanes:
        g, t = lane >> 2, lane & 3
        h, a_rows = _query_row(lane, sl, gs, ng, ngr, rows, hd, False)
        for lp, b in enumerate((a_bits, r_bits)):
            if not b:
                continue
            regs = []
            for r in range(sl // 2):
                pair = []
                for half in range(2):
                    e = sl * t + k_elem(r, half, b)
                    if a_rows:
                        assert e < hd, "query read past head_dim"
                    x = q[h][e] if a_rows else 0.0
                    pair.append(x / 2 ** _pos(r % (16 // b), b, True))
                    if lp == 0:
                        qsum[lane] += x
                regs.append(tuple(pair))
                fold[lp][lane] += emu.MAGIC[True] * sum(pair)
            qf[lp][lane] = [(regs[2 * s], regs[2 * s + 1]) for s in range(sl // 4)]
    quad = lambda v: [sum(v[4 * (lane >> 2) + i] for i in range(4)) for lane in lanes]  # noqa: E731
    fold = [quad(f) for f in fold]
    qsum = quad(qsum)
    # ---- K dots (tokens on M) per loop
    x = []
    for lp, b in enumerate((a_bits, r_bits)):
        if not b:
            x.append(None)
            continue
        kb, buf, pitch = sl * b // 8, stage_codes[2 * lp], d * b // 8
        acc = [[0.0] * 4 for _ in lanes]
        u = {}
        for lane in lanes:
            g, t = lane >> 2, lane & 3
            u[lane] = [sum((_unpack_word(w, b, True) for w in _words(buf, tok * pitch + t * kb, kb)), [])
                       for tok in (g, 8 + g)]
        for s in range(sl // 4):
            c = _mma({lane: (u[lane][0][2 * s], u[lane][1][2 * s], u[lane][0][2 * s + 1],
                             u[lane][1][2 * s + 1]) for lane in lanes},
                     {lane: qf[lp][lane][s] for lane in lanes})
            for lane in lanes:
                acc[lane] = [a + v for a, v in zip(acc[lane], c[lane])]
        x.append(acc)

    def kf(lane, c, lp, v):
        src = 4 * (2 * (lane & 3) + c)
        return v - fold[lp][src], qsum[src]
    return x, kf


def _tile(hd, gs, gq, a_bits, r_bits, hi, seed):
    rng = random.Random(seed)
    d = 64 if hd == 64 else 128
    ng, ngr, rows = d // gs, hd // gs, gq * (d // gs)
    sl, nt = d // 4, d // 8
    assert ng >= 2 and rows <= 8
    kinds = [(a_bits, 0), (a_bits, 1)] + ([(r_bits, 0), (r_bits, 1)] if r_bits else [])
    # pool values: codes [kind][tok][e], (scale, offset) bytes [kind][tok][group]
    code = [[[rng.randrange(1 << b) for _ in range(hd)] for _ in range(16)] for b, _ in kinds]
    so_b = [[[(rng.choice((0x30, 0x38, 0x41, 0xB8)), rng.choice((0x28, 0xA9, 0x00)))
              for _ in range(ngr)] for _ in range(16)] for _ in kinds]
    coef = [[rng.choice((1.0, 0.75, 1.25)) for _ in range(16)] for _ in range(2)]
    q = [[rng.uniform(-1, 1) for _ in range(hd)] for _ in range(gq)]
    # the stage: codes at pitch d * bits / 8 (only hd's bytes copied; junk past them), the
    # (scale, offset) rows at offset off in 8 bytes (head_dim 96: 0 or 2), NaN/junk around
    stage_codes, so_rows, offs = [], [], []
    for k, (b, _) in enumerate(kinds):
        pitch, nbytes = d * b // 8, hd * b // 8
        buf = bytearray(rng.randrange(256) for _ in range(16 * pitch))
        for tok in range(16):
            v = sum(c << (b * e) for e, c in enumerate(code[k][tok]))
            buf[tok * pitch: tok * pitch + nbytes] = v.to_bytes(nbytes, "little")
        stage_codes.append(bytes(buf))
        off = rng.choice((0, 2)) if hd == 96 else 0
        offs.append(off)
        rws = []
        for tok in range(16):
            row = bytearray(rng.choice((0x7F, 0xFF, 0x5A)) for _ in range(16))
            for grp in range(ngr):
                row[off + 2 * grp: off + 2 * grp + 2] = bytes(so_b[k][tok][grp])
            rws.append(bytes(row))  # 8 bytes of the stage row and what follows it
        so_rows.append(rws)

    def so_pair(k, tok, grp):
        byts = so_rows[k][tok][offs[k] + 2 * grp: offs[k] + 2 * grp + 2]
        return _fp8(byts[0]), _fp8(byts[1])

    def so_word(k, tok, cg):  # groups cg, cg + 1 (head_dim 96: two 16-bit reads)
        return so_pair(k, tok, cg), so_pair(k, tok, cg + 1)

    def k_elem(r, half, bits):
        h = 16 // bits
        return (r // h) * (32 // bits) + half * h + r % h

    qk_scale = 0.37
    lanes = range(32)
    if rows <= 4:  # KINT: the K side on integer tensor cores
        x, kf = _k_side_int(q, stage_codes, hd, gs, a_bits, r_bits, rows, sl, d)
    else:
        x, kf = _k_side_f16(q, stage_codes, hd, gs, a_bits, r_bits, rows, sl, d)
    # ---- logits of head ht for tokens g, 8 + g; KINT: lane t (< 2) finishes token g, lane t + 2
    # token 8 + g from the whole sums 256 hi + lo of the pair's halves (k_whole), lg[lane] = [v, v]
    kint = rows <= 4
    lg = [[0.0, 0.0] for _ in lanes]
    for lane in lanes:
        g, t = lane >> 2, lane & 3
        tq = t & 1 if kint else t
        cg, col_ok = (2 * tq) % ng, 2 * tq < rows
        for j in range(2):
            if kint and j != (t >= 2):
                continue
            tk, acc = 8 * j + g, 0.0
            for c in range(2):
                def xs_of(lp):
                    if not kint:
                        return x[lp][lane][2 * j + c]
                    hi_, lo_ = (lane ^ 2, lane) if t >= 2 else (lane, lane ^ 2)
                    return 256 * x[lp][hi_][2 * j + c] + x[lp][lo_][2 * j + c]
                sa = so_word(0, tk, cg)[c]
                xs, off = kf(lane, c, 0, xs_of(0))
                v = coef[0][tk] * (sa[0] * xs + sa[1] * off)
                if r_bits:
                    sr = so_word(2, tk, cg)[c]
                    xs, off = kf(lane, c, 1, xs_of(1))
                    v += sr[0] * xs + sr[1] * off
                acc += v if col_ok and (hd != 96 or cg + c < ngr) else 0.0
            lg[lane][j] = acc
            if kint:
                lg[lane][1 - j] = acc
    if ng == 4:
        lg = [[a + b for a, b in zip(lg[lane], lg[lane ^ 1])] for lane in lanes]
    for lane in lanes:
        g, t = lane >> 2, lane & 3
        tq = t & 1 if kint else t
        for j in range(2):
            tk = 8 * (t >= 2) + g if kint else 8 * j + g
            lg[lane][j] = lg[lane][j] * qk_scale if 2 * tq < rows and tk < hi else -INF
    quad = lambda v: [sum(v[4 * (lane >> 2) + i] for i in range(4)) for lane in lanes]  # noqa: E731
    # tile max per head, the logits moved to the V fragments, weights
    mt = [max(lg[lane]) for lane in lanes]
    for m in ((2, 4, 8, 16) if kint else (4, 8, 16)):
        mt = [max(mt[lane], mt[lane ^ m]) for lane in lanes]
    # ---- V weights: lane g builds B column g: row vr = (head vh, group vgrp); PAIRED (rows <= 4)
    # columns 4-7 carry the second term of row g - 4 (the residual's, or without one the anchor
    # weights' fp16 remainder: 0 in this exact arithmetic); else column g in two accumulators
    paired = rows <= 4
    w1, w2, l_run, m_off = {}, {}, [0.0] * 32, [0.0] * 32
    second_of, vrow = {}, {}
    for lane in lanes:
        g, t = lane >> 2, lane & 3
        vr = (g & 3) if paired else g
        second = paired and g >= 4
        vgrp, vh = vr % ng, vr // ng
        v_ok, pad = vr < rows, hd == 96 and vgrp >= ngr
        second_of[lane], vrow[lane] = second, (vh, vgrp, v_ok)
        src_t = vh * ng // 2 if vh * ng // 2 < 4 else 0
        m_run = mt[src_t] if v_ok else -INF
        w1[lane], w2[lane] = [], []
        for i in range(4):
            qk = lg[4 * (2 * t + (i & 1)) + src_t + (2 * (i >> 1) if kint else 0)][i >> 1]
            if not v_ok or pad:
                qk = -INF
            p = 0.0 if qk == -INF else 2 ** (qk - m_run)
            tk = 2 * t + (i & 1) + 8 * (i >> 1)
            sa = so_pair(1, tk, 0 if pad else vgrp)
            if paired and r_bits and second:
                sr = so_pair(3, tk, 0 if pad else vgrp)
                w1[lane].append(p * sr[0])
                m_off[lane] += p * sr[1]
            elif paired and second:  # the remainder of exact weights
                w1[lane].append(0.0)
            else:
                w1[lane].append(p * coef[1][tk] * sa[0])
                off = coef[1][tk] * sa[1]
                if r_bits and not paired:
                    sr = so_pair(3, tk, 0 if pad else vgrp)
                    w2[lane].append(p * sr[0])
                    off += sr[1]
                m_off[lane] += p * off
            l_run[lane] += p
    # the V MMA's weights: W 2^-VPRE (fp16), back in the epilogue
    wsc = 2.0 ** -emu.VPRE
    w1 = {lane: [w * wsc for w in w1[lane]] for lane in lanes}
    w2 = {lane: [w * wsc for w in w2[lane]] for lane in lanes}
    sw = [[sum(w1[lane]) for lane in lanes], [sum(w2[lane]) for lane in lanes]]
    # ---- V MMAs: rows g, 8 + g of m-tile m are elements nt g + 2m, nt g + 2m + 1
    nm = nt // 2
    cv = [[[0.0] * 4 for _ in range(nm)] for _ in lanes]
    cw = [[[0.0] * 4 for _ in range(nm)] for _ in lanes]
    for lp, b in enumerate((a_bits, r_bits)):
        if not b:
            continue
        vb, buf, pitch, nh = nt * b // 8, stage_codes[2 * lp + 1], d * b // 8, nt * b // 16
        u = {}
        for lane in lanes:
            g, t = lane >> 2, lane & 3
            va = [_words(buf, (2 * t + (i & 1) + 8 * (i >> 1)) * pitch + g * vb, vb)
                  for i in range(4)]
            pair = []
            for a_, b_ in ((va[0], va[1]), (va[2], va[3])):
                regs = []
                for w in range((nh + 1) // 2):
                    regs += _unpack_word(_perm(a_[w], b_[w], 0x5410), b, True)
                    if 2 * w + 1 < nh:
                        regs += _unpack_word(_perm(a_[w], b_[w], 0x7632), b, True)
                pair.append(regs)
            u[lane] = pair

        def bfrag(lane):
            if paired:
                keep = second_of[lane] == (lp == 1) or not r_bits
                w = w1[lane] if keep else [0.0] * 4
            else:
                w = w1[lane] if lp == 0 else w2[lane]
            return (tuple(w[0:2]), tuple(w[2:4]))

        acc = cw if lp == 1 and not paired else cv
        for m in range(nm):
            c = _mma({lane: (u[lane][0][2 * m], u[lane][0][2 * m + 1], u[lane][1][2 * m],
                             u[lane][1][2 * m + 1]) for lane in lanes},
                     {lane: bfrag(lane) for lane in lanes})
            for lane in lanes:
                acc[lane][m] = [a + v for a, v in zip(acc[lane][m], c[lane])]
    l_run, m_off, sw = quad(l_run), quad(m_off), [quad(s) for s in sw]
    # ---- epilogue: element nt g + l's columns (head, group ge) picked over the quad
    vm = emu.MAGIC[True]  # the V codes' magic
    out = [[None] * d for _ in range(gq)]
    writes = [[0] * d for _ in range(gq)]
    ml = {}
    sb = r_bits or a_bits  # the second term's codes
    for hq, g in itertools.product(range(gq), range(8)):
        ge = nt * g // gs
        col = hq * ng + ge
        moff = m_off[4 * col] + (m_off[4 * (col + 4)] if paired else 0.0)
        for l_ in range(nt):
            v = 0.0
            for t, c in itertools.product(range(4), range(2)):
                n, lane = 2 * t + c, 4 * g + t
                x = cv[lane][l_ // 2][2 * (l_ % 2) + c]
                if n == col:
                    v += (x - vm * sw[0][4 * n]) / wsc / 2 ** _pos(l_ % (16 // a_bits), a_bits, True)
                    if r_bits and not paired:
                        y = cw[lane][l_ // 2][2 * (l_ % 2) + c]
                        v += (y - vm * sw[1][4 * n]) / wsc / 2 ** _pos(l_ % (16 // r_bits), r_bits, True)
                if paired and n == col + 4:
                    v += (x - vm * sw[0][4 * n]) / wsc / 2 ** _pos(l_ % (16 // sb), sb, True)
            e = nt * g + l_
            out[hq][e] = 0.0 if hd == 96 and ge >= ngr else v + moff
            writes[hq][e] += 1
    for lane in lanes:
        vh, vgrp, v_ok = vrow[lane]
        if v_ok and not second_of[lane] and vgrp == 0 and lane & 3 == 0:
            ml[vh] = l_run[lane]
    # ---- the direct computation over the dequantized codes
    def deq(k, tok, e):  # kind k's value of element e (anchor: times the LSQ coefficient)
        s, m = (_fp8(v) for v in so_b[k][tok][e // gs])
        return s * code[k][tok][e] + m

    for h in range(gq):
        logit = []
        for tok in range(hi):
            kv = [coef[0][tok] * deq(0, tok, e) + (deq(2, tok, e) if r_bits else 0.0)
                  for e in range(hd)]
            logit.append(qk_scale * sum(a * b for a, b in zip(q[h], kv)))
        m = max(logit)
        p = [2 ** (lv - m) for lv in logit]
        assert math.isclose(ml[h], sum(p), rel_tol=1e-9)
        assert all(n == 1 for n in writes[h]), f"head {h}: writes {writes[h]}"
        for e in range(d):
            if e >= hd:
                assert out[h][e] == 0.0
                continue
            want = sum(p[tok] * (coef[1][tok] * deq(1, tok, e) + (deq(3, tok, e) if r_bits
                                                                  else 0.0))
                       for tok in range(hi))
            assert math.isclose(out[h][e], want, rel_tol=1e-9, abs_tol=1e-9), (h, e, out[h][e],
                                                                                 want)

CASES = [  # head_dim, group_size, query heads per KV head, anchor bits, residual bits, tokens
    (64, 32, 3, 4, 2, 16), (64, 32, 2, 2, 4, 11), (64, 32, 4, 2, 0, 16), (64, 32, 1, 4, 4, 3),
    (96, 32, 1, 4, 2, 16), (96, 32, 2, 2, 2, 9), (96, 32, 1, 2, 0, 16), (96, 32, 2, 4, 4, 1),
    (128, 32, 1, 4, 2, 16), (128, 64, 4, 2, 4, 7), (128, 32, 2, 4, 0, 16),
    # the integer K side with two groups per row (group 64): rows 2 and 4
    (128, 64, 1, 4, 2, 16), (128, 64, 2, 2, 4, 7),
]


@pytest.mark.parametrize("hd,gs,gq,a_bits,r_bits,hi", CASES,
                         ids=["d{}g{}q{}a{}r{}n{}".format(*c) for c in CASES])
def test_tc_index_maps_cover_every_element_once(hd, gs, gq, a_bits, r_bits, hi):
    _tile(hd, gs, gq, a_bits, r_bits, hi, seed=hd * 7 + gq * 3 + a_bits + r_bits + hi)
