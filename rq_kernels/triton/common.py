"""Device helpers shared by the ResidualQuant kernels (``@triton.jit`` only).

Naming: ``DP`` is head_dim padded to a power of two, ``G`` the group size, ``NGP = DP // G``
groups (padded groups are masked by the callers). Codes are "natural order": element ``d`` of a
loop with ``b`` bits lives in byte ``d // (8 / b)`` at bit ``(d % (8 / b)) * b`` (reference.py).
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def mma(a, b, INTERP: tl.constexpr):
    """``a @ b`` with fp32 accumulation. Under TRITON_INTERPRET the operands are upcast first
    (NOTE: Triton 3.8's interpreter returns garbage for bf16 ``tl.dot``; the upcast is exact)."""
    if INTERP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        return tl.dot(a, b)


@triton.jit
def to_bf16(x, INTERP: tl.constexpr):
    """float32 -> bf16, round to nearest even. NOTE: Triton 3.8's interpreter truncates (and
    casts integers to bf16 bit patterns), so under it the rounding is done on the bits."""
    if INTERP:
        xf = x.to(tl.float32)
        bits = xf.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True).to(tl.bfloat16)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def fp8_bits_to_f32(b):
    """uint8 FP8 e4m3fn bit patterns -> float32 values."""
    return b.to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def f32_to_fp8_bits(x):
    """float32 values that are exactly representable in e4m3fn -> uint8 bit patterns."""
    return x.to(tl.float8e4nv).to(tl.uint8, bitcast=True)


@triton.jit
def fp8_round(x, DOWN: tl.constexpr):
    """Round float32 ``x`` (clamped to +-448) onto the e4m3fn grid, toward -inf (DOWN) or +inf.

    Same values as `reference.fp8_round` (it steps the nearest value by one code; this floors or
    ceils ``x / ulp``). NOTE: the one difference, ``up`` of ``x`` in ``(-2^-9, -2^-10)`` giving
    -0 instead of +0, cannot occur here: ``up`` is only applied to scales, which are >= 0.
    """
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    e = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.maximum(e, -6)  # e4m3fn subnormal spacing is 2^-9 = 2^(-6-3)
    inv_ulp = ((130 - e) << 23).to(tl.float32, bitcast=True)  # 2^(3-e), exact
    ulp = ((124 + e) << 23).to(tl.float32, bitcast=True)  # 2^(e-3), exact
    t = x * inv_ulp
    if DOWN:
        t = tl.floor(t)
    else:
        t = tl.ceil(t)
    return t * ulp


@triton.jit
def unpack_codes(byte, BITS: tl.constexpr):
    """``[N, DP*BITS/8]`` uint8 packed codes -> ``[N, DP]`` uint8 codes in natural order."""
    if BITS == 8:
        return byte
    elif BITS == 4:
        return tl.interleave(byte & 0xF, byte >> 4)
    else:  # BITS == 2: element 4i+p is bits 2p..2p+1 of byte i
        c0 = byte & 3
        c1 = (byte >> 2) & 3
        c2 = (byte >> 4) & 3
        c3 = byte >> 6
        return tl.interleave(tl.interleave(c0, c2), tl.interleave(c1, c3))


_ASM_INT4 = tl.constexpr("""{
.reg .b32 l, h, m;
mov.b32 m, 0x64086408;
and.b32 l, $4, 0x0F0F0F0F;
shr.u32 h, $4, 4;
and.b32 h, h, 0x0F0F0F0F;
prmt.b32 $0, l, 0x64646464, 0x5140;
prmt.b32 $1, l, 0x64646464, 0x5342;
prmt.b32 $2, h, 0x64646464, 0x5140;
prmt.b32 $3, h, 0x64646464, 0x5342;
sub.f16x2 $0, $0, m;
sub.f16x2 $1, $1, m;
sub.f16x2 $2, $2, m;
sub.f16x2 $3, $3, m;
}""")
_ASM_INT2 = tl.constexpr("""{
.reg .b32 t, m;
mov.b32 m, 0x64026402;
and.b32 t, $8, 0x03030303;
prmt.b32 $0, t, 0x64646464, 0x5140;
prmt.b32 $1, t, 0x64646464, 0x5342;
shr.u32 t, $8, 2;
and.b32 t, t, 0x03030303;
prmt.b32 $2, t, 0x64646464, 0x5140;
prmt.b32 $3, t, 0x64646464, 0x5342;
shr.u32 t, $8, 4;
and.b32 t, t, 0x03030303;
prmt.b32 $4, t, 0x64646464, 0x5140;
prmt.b32 $5, t, 0x64646464, 0x5342;
shr.u32 t, $8, 6;
and.b32 t, t, 0x03030303;
prmt.b32 $6, t, 0x64646464, 0x5140;
prmt.b32 $7, t, 0x64646464, 0x5342;
sub.f16x2 $0, $0, m;
sub.f16x2 $1, $1, m;
sub.f16x2 $2, $2, m;
sub.f16x2 $3, $3, m;
sub.f16x2 $4, $4, m;
sub.f16x2 $5, $5, m;
sub.f16x2 $6, $6, m;
sub.f16x2 $7, $7, m;
}""")
_ASM_INT8 = tl.constexpr("""{
.reg .b32 m;
mov.b32 m, 0x64806480;
prmt.b32 $0, $2, 0x64646464, 0x5140;
prmt.b32 $1, $2, 0x64646464, 0x5342;
sub.f16x2 $0, $0, m;
sub.f16x2 $1, $1, m;
}""")


@triton.jit
def codes_to_f16(byte, BITS: tl.constexpr, FAST: tl.constexpr):
    """``[N, DP*BITS/8]`` packed codes -> ``[N, DP]`` fp16 centred codes ``code - 2^(BITS-1)``
    in natural order (exact). FAST: PTX magic-number conversion (``prmt`` the code under the
    fp16 exponent of 1024, then one ``sub.f16x2`` per pair, ~1.4 instructions per code);
    otherwise plain integer unpacking (the interpreter path)."""
    if FAST:
        if BITS == 4:
            lo, hi = tl.inline_asm_elementwise(_ASM_INT4, "=r,=r,=r,=r,r", [byte],
                                               dtype=(tl.float16, tl.float16), is_pure=True,
                                               pack=4)
            return tl.interleave(lo, hi)
        elif BITS == 2:
            c0, c1, c2, c3 = tl.inline_asm_elementwise(
                _ASM_INT2, "=r,=r,=r,=r,=r,=r,=r,=r,r", [byte],
                dtype=(tl.float16, tl.float16, tl.float16, tl.float16), is_pure=True, pack=4)
            return tl.interleave(tl.interleave(c0, c2), tl.interleave(c1, c3))
        else:
            return tl.inline_asm_elementwise(_ASM_INT8, "=r,=r,r", [byte], dtype=tl.float16,
                                             is_pure=True, pack=4)
    else:
        return (unpack_codes(byte, BITS).to(tl.int16) - (1 << (BITS - 1))).to(tl.float16)


@triton.jit
def load_rows(base, slot, s_row, col, n_mask, NCOL):
    """Gather ``[N, len(col)]`` from ``base + slot*s_row + col`` (columns ``< NCOL`` valid)."""
    m = n_mask[:, None] & (col[None, :] < NCOL)
    return tl.load(base + slot[:, None] * s_row + col[None, :], mask=m, other=0)


@triton.jit
def load_scale_offset_raw(base, slot, s_row, n_mask, NG, NGP: tl.constexpr):
    """Raw FP8 (scale, offset) bytes of ``NGP`` groups per row, ``[N, 2*NGP]`` uint8 (rows are
    contiguous ``2*NG`` bytes, so the load is one vector per row and can be pipelined)."""
    col = tl.arange(0, 2 * NGP)
    m = n_mask[:, None] & (col[None, :] < 2 * NG)
    return tl.load(base + slot[:, None] * s_row + col[None, :], mask=m, other=0)


@triton.jit
def split_scale_offset(raw, NGP: tl.constexpr):
    """``[N, 2*NGP]`` raw bytes -> scale, offset ``[N, NGP]`` float32."""
    s, o = tl.split(tl.reshape(fp8_bits_to_f32(raw), [raw.shape[0], NGP, 2]))
    return s, o


@triton.jit
def load_scale_offset(base, slot, s_row, n_mask, NG, NGP: tl.constexpr):
    """FP8 (scale, offset) pairs of ``NGP`` groups per row -> 2x ``[N, NGP]`` float32."""
    return split_scale_offset(load_scale_offset_raw(base, slot, s_row, n_mask, NG, NGP), NGP)


@triton.jit
def gqa_rows(batch_rows, GQ: tl.constexpr, BLOCK_M: tl.constexpr, REPS: tl.constexpr):
    """This program's ``BLOCK_M`` rows ``(request b, query head hq)`` of KV head
    ``program_id(0)`` for the grid ``(num_kv_heads, cdiv(batch_rows, BLOCK_M))``, ``batch_rows =
    B * GQ``: returns (hk, rows mask, b, hq), each ``[REPS * BLOCK_M]``: row ``i`` is row
    ``i % BLOCK_M``, and only the first copy is in the mask."""
    hk = tl.program_id(0)
    if REPS == 1:
        rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        mask = rows < batch_rows
    else:
        er = tl.arange(0, REPS * BLOCK_M)
        rows = tl.program_id(1) * BLOCK_M + er % BLOCK_M
        mask = (er < BLOCK_M) & (rows < batch_rows)
    return hk, mask, rows // GQ, hk * GQ + rows % GQ


@triton.jit
def split_range(KvIndptr, b, split, num_splits, BLOCK_N: tl.constexpr):
    """Request ``b``'s history start in ``kv_indices`` and this split's token range ``[lo, hi)``
    (splits are whole tiles of ``BLOCK_N``; trailing splits may be empty)."""
    start = tl.load(KvIndptr + b)
    seq_len = tl.load(KvIndptr + b + 1) - start
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * per_split
    return start, lo, tl.minimum(lo + per_split, seq_len)


@triton.jit
def rotate_rows(x, rot_base, s_term, s_row, TERMS: tl.constexpr, TRANSPOSE: tl.constexpr,
                SPLIT_X: tl.constexpr, DP: tl.constexpr, INTERP: tl.constexpr):
    """``x [M, DP] @ R`` (or ``R^T``) with ``R = sum_t terms[t]``, terms bf16 ``[DP, DP]`` rows
    ``s_row`` apart, ``s_term`` between terms. ``x`` is bf16-exact unless SPLIT_X (then it is
    split into bf16 hi + lo parts, ~2^-17 relative). Returns fp32 ``[M, DP]``."""
    acc = tl.zeros([x.shape[0], DP], dtype=tl.float32)
    for t in tl.static_range(TERMS):
        acc += rotate_rows_by(x, rotation_term(rot_base + t * s_term, s_row, TRANSPOSE, DP),
                              SPLIT_X, INTERP)
    return acc


@triton.jit
def rotation_term(term_base, s_row, TRANSPOSE: tl.constexpr, DP: tl.constexpr):
    """One bf16 rotation term ``[DP, DP]`` (rows ``s_row`` apart), transposed if TRANSPOSE."""
    i = tl.arange(0, DP)
    if TRANSPOSE:
        return tl.load(term_base + i[None, :] * s_row + i[:, None])
    else:
        return tl.load(term_base + i[:, None] * s_row + i[None, :])


@triton.jit
def rotate_rows_by(x, r, SPLIT_X: tl.constexpr, INTERP: tl.constexpr):
    """``x [M, DP] @ r`` for one loaded term ``r`` (`rotation_term`), fp32; SPLIT_X as in
    `rotate_rows`."""
    xh = to_bf16(x, INTERP)
    acc = mma(xh, r, INTERP)
    if SPLIT_X:
        acc += mma(to_bf16(x - xh.to(tl.float32), INTERP), r, INTERP)
    return acc


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """With PDL (a programmatic dependent launch, sm_90+): wait until the previous kernel on the
    stream has completed and its writes are visible; call before reading its output."""
    if PDL:
        gdc_wait()


@triton.jit
def pdl_launch_dependents(PDL: tl.constexpr):
    """With PDL: let the next kernel (if launched as a programmatic dependent) start now."""
    if PDL:
        gdc_launch_dependents()
