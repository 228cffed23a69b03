"""Reconstruct one loop's K/V of pool rows into a BF16 workspace (``@triton.jit`` only).

One program = (``BLOCK_N`` rows, KV head, K-or-V). Each row's anchor and own residual are
dequantized in fp32 in the operation order of `sglang_rq.reference.decode` (``a = m_a + s_a
q_a``, ``r = m_r + s_r q_r``, ``x = c a + r``) and stored as bf16 in the rotated basis: the
fused formats quantize anchor and residual in the same basis, so no matmul is needed. The
launcher disables FMA contraction, so the result is bit-identical to the twin on the GPU too.
"""

import triton
import triton.language as tl

from rq_kernels.triton.common import load_scale_offset, load_rows, to_bf16, unpack_codes


@triton.jit
def _dequant(Cc, s_cc_r, Cso, s_cso_r, slot, n_mask, BITS: tl.constexpr, D: tl.constexpr,
             NG: tl.constexpr, NGP: tl.constexpr, G: tl.constexpr, BLOCK_N: tl.constexpr):
    """``offset + scale * code`` per group, ``[BLOCK_N, NGP*G]`` fp32 (padded groups are 0)."""
    col = tl.arange(0, NGP * G * BITS // 8)
    q = unpack_codes(load_rows(Cc, slot, s_cc_r, col, n_mask, D * BITS // 8), BITS)
    s, o = load_scale_offset(Cso, slot, s_cso_r, n_mask, NG, NGP)
    x3 = o[:, :, None] + s[:, :, None] * tl.reshape(q.to(tl.float32), [BLOCK_N, NGP, G])
    return tl.reshape(x3, [BLOCK_N, NGP * G])


@triton.jit
def rq_reconstruct_kernel(
    Rows, n,  # [n] int64 pool rows
    Ac, s_ac_r, s_ac_kv, s_ac_h: tl.constexpr, Aso, s_aso_r, s_aso_kv, s_aso_h: tl.constexpr,
    Rc, s_rc_r, s_rc_kv, s_rc_h: tl.constexpr, Rso, s_rso_r, s_rso_kv, s_rso_h: tl.constexpr,
    Cf, s_cf_r, s_cf_kv, s_cf_h,
    Ok, Ov, s_ot, s_oh,  # [n, Hkv, D] bf16 x2 (same strides)
    D: tl.constexpr, DP: tl.constexpr, G: tl.constexpr, NG: tl.constexpr, NGP: tl.constexpr,
    A_BITS: tl.constexpr, R_BITS: tl.constexpr, HAS_COEF: tl.constexpr,
    BLOCK_N: tl.constexpr, INTERP: tl.constexpr,
):
    hk = tl.program_id(1).to(tl.int64)  # head-major views: head and K/V strides of rows x bytes
    kv = tl.program_id(2).to(tl.int64)
    offs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs < n
    slot = tl.load(Rows + offs, mask=n_mask, other=0)
    x = _dequant(Ac + kv * s_ac_kv + hk * s_ac_h, s_ac_r, Aso + kv * s_aso_kv + hk * s_aso_h,
                 s_aso_r, slot, n_mask, A_BITS, D, NG, NGP, G, BLOCK_N)
    if HAS_COEF:
        c = tl.load(Cf + kv * s_cf_kv + slot * s_cf_r + hk * s_cf_h, mask=n_mask,
                    other=0.0).to(tl.float32)
        x = c[:, None] * x
    if R_BITS > 0:
        x += _dequant(Rc + kv * s_rc_kv + hk * s_rc_h, s_rc_r, Rso + kv * s_rso_kv + hk * s_rso_h,
                      s_rso_r, slot, n_mask, R_BITS, D, NG, NGP, G, BLOCK_N)
    d = tl.arange(0, DP)
    offs_o = offs[:, None] * s_ot + hk * s_oh + d[None, :]
    m = n_mask[:, None] & (d[None, :] < D)
    y = to_bf16(x, INTERP)
    if kv == 0:
        tl.store(Ok + offs_o, y, mask=m)
    else:
        tl.store(Ov + offs_o, y, mask=m)
