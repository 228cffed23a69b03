"""Device code of the portable elementwise ops (RMSNorm, act-and-mul, rotary): ``@triton.jit`` only.

The host launchers, with their shape/dtype checks, are in `rq_kernels.ops`; the fp32 twins that
follow the same operation order are in `rq_kernels.ops_reference`.
"""

import triton
import triton.language as tl

ACT_SILU = 0
ACT_GELU = 1
ACT_GELU_TANH = 2


@triton.jit
def rmsnorm_kernel(X, R, W, Y, stride_x, stride_r, stride_y, N, eps,
                   BLOCK_N: tl.constexpr, HAS_RESIDUAL: tl.constexpr, GEMMA: tl.constexpr):
    """One program per row: ``y = x * rsqrt(mean(x^2) + eps) * w`` in fp32.

    With ``HAS_RESIDUAL`` the row first becomes ``x + r`` (fp32), which is written back to ``R``
    in R's dtype; the statistics use the unrounded fp32 sum (sgl_kernel's semantics).
    ``GEMMA`` multiplies by ``1 + w``.
    """
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x = x + tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(R + row * stride_r + cols, x.to(R.dtype.element_ty), mask=mask)
    var = tl.sum(x * x, axis=0) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if GEMMA:
        w = w + 1.0
    y = (x * rstd) * w
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def act_and_mul_kernel(X, Y, stride_x, stride_y, D, BLOCK: tl.constexpr, ACT: tl.constexpr):
    """Grid ``(rows, cdiv(D, BLOCK))``: ``y = act(x[:D]) * x[D:2D]`` in fp32, one rounding."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    a = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(X + row * stride_x + D + cols, mask=mask, other=0.0).to(tl.float32)
    if ACT == 0:
        g = a / (1.0 + tl.exp(-a))
    elif ACT == 1:
        g = 0.5 * a * (1.0 + tl.math.erf(a * 0.7071067811865476))
    else:
        u = 0.7978845608028654 * (a + 0.044715 * a * a * a)
        g = 0.5 * a * (1.0 + (2.0 / (1.0 + tl.exp(-2.0 * u)) - 1.0))
    tl.store(Y + row * stride_y + cols, (g * b).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rope_heads(X, t, stride_t, stride_h, h0, H, cos, sin, HALF: tl.constexpr,
                BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, IS_NEOX: tl.constexpr):
    # [BLOCK_H, BLOCK_R] pairs (x1, x2) of heads h0.. of token t, rotated in place
    h = h0 + tl.arange(0, BLOCK_H)
    r = tl.arange(0, BLOCK_R)
    m = (h[:, None] < H) & (r[None, :] < HALF)
    base = X + t * stride_t + h[:, None].to(tl.int64) * stride_h
    if IS_NEOX:
        o1 = r
        o2 = r + HALF
    else:
        o1 = 2 * r
        o2 = 2 * r + 1
    x1 = tl.load(base + o1[None, :], mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(base + o2[None, :], mask=m, other=0.0).to(tl.float32)
    c = cos[None, :]
    s = sin[None, :]
    y1 = x1 * c - x2 * s
    y2 = x2 * c + x1 * s
    tl.store(base + o1[None, :], y1.to(X.dtype.element_ty), mask=m)
    tl.store(base + o2[None, :], y2.to(X.dtype.element_ty), mask=m)


@triton.jit
def rope_kernel(POS, Q, K, CS, stride_qt, stride_qh, stride_kt, stride_kh, stride_cs,
                num_q_heads, num_k_heads, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                BLOCK_R: tl.constexpr, IS_NEOX: tl.constexpr, HAS_K: tl.constexpr):
    """Grid ``(num_tokens, cdiv(Hq, BLOCK_H) + cdiv(Hk, BLOCK_H))``: rotary embedding in place.

    ``CS[pos] = [cos (HALF), sin (HALF)]``; neox pairs ``(i, i + HALF)``, GPT-J pairs
    ``(2i, 2i + 1)``; dims past ``2 * HALF`` are untouched.
    """
    t = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    pos = tl.load(POS + t).to(tl.int64)
    r = tl.arange(0, BLOCK_R)
    cos = tl.load(CS + pos * stride_cs + r, mask=r < HALF, other=0.0).to(tl.float32)
    sin = tl.load(CS + pos * stride_cs + HALF + r, mask=r < HALF, other=0.0).to(tl.float32)
    n_qb = tl.cdiv(num_q_heads, BLOCK_H)
    if hb < n_qb:
        _rope_heads(Q, t, stride_qt, stride_qh, hb * BLOCK_H, num_q_heads, cos, sin, HALF,
                    BLOCK_H, BLOCK_R, IS_NEOX)
    elif HAS_K:
        _rope_heads(K, t, stride_kt, stride_kh, (hb - n_qb) * BLOCK_H, num_k_heads, cos, sin,
                    HALF, BLOCK_H, BLOCK_R, IS_NEOX)
