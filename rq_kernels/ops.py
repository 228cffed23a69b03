"""Launchers of the portable elementwise ops: RMSNorm (plain, fused residual add, Gemma),
activation-and-multiply (SiLU, GELU, GELU-tanh) and rotary embedding with a cos/sin cache.

These are what the ``sgl_kernel`` stand-in (``sglang_rq/_cuda_standin``) runs on a CUDA host that
lacks the compiled sglang-kernel wheel. Each launcher checks shape, dtype, device and strides on
the host, then launches one Triton kernel (`rq_kernels.triton.ops`); each has a plain-PyTorch
twin with the same signature in `rq_kernels.ops_reference` (fp32 math, same operation order).
Tensors must be on CUDA, or on CPU when Triton runs in the interpreter (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch

from rq_kernels._host import cdiv, interpreting, next_pow2
from rq_kernels.triton.ops import (ACT_GELU, ACT_GELU_TANH, ACT_SILU, act_and_mul_kernel,
                                   rmsnorm_kernel, rope_kernel)

ACTIVATIONS = {"silu": ACT_SILU, "gelu": ACT_GELU, "gelu_tanh": ACT_GELU_TANH}
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_HIDDEN = 32768  # one row lives in registers of one program


def _check_device(kernel, *tensors: torch.Tensor) -> None:
    dev = tensors[0].device
    assert all(t.device == dev for t in tensors), (
        f"all tensors must be on one device, got {[str(t.device) for t in tensors]}")
    assert dev.type == "cuda" or (dev.type == "cpu" and interpreting(kernel)), (
        f"tensors are on {dev}: the Triton ops need CUDA (or TRITON_INTERPRET=1 on CPU)")


def _rows(t: torch.Tensor, name: str) -> torch.Tensor:
    """``t`` as a 2-D ``[num_rows, last]`` view with a unit last stride (any row stride)."""
    assert t.dtype in FLOAT_DTYPES, f"{name} must be bf16/fp16/fp32, got {t.dtype}"
    assert t.dim() >= 1 and t.stride(-1) == 1, (
        f"{name} must have a contiguous last dim, strides {t.stride()}")
    if t.dim() == 2:
        return t
    assert t.is_contiguous(), f"{name} with {t.dim()} dims must be contiguous"
    return t.view(-1, t.shape[-1])


def _norm_warps(block: int) -> int:
    return min(max(block // 256, 1), 16)


def rmsnorm(input: torch.Tensor, weight: torch.Tensor, *, eps: float = 1e-6,
            out: torch.Tensor | None = None, gemma: bool = False) -> torch.Tensor:
    """RMS normalization: ``out = input * rsqrt(mean(input^2) + eps) * weight`` (fp32 math).

    Parameters
    ----------
    input : torch.Tensor
        ``[num_tokens, hidden]`` (or any shape ending in ``hidden``, contiguous), bf16/fp16/fp32,
        last dim contiguous.
    weight : torch.Tensor
        ``[hidden]``, contiguous, any float dtype.
    eps : float
        Added to the mean square.
    out : torch.Tensor, optional
        Same shape and dtype as ``input``; allocated if None.
    gemma : bool
        Scale by ``1 + weight`` (Gemma's convention).

    Returns
    -------
    torch.Tensor
        ``out``.
    """
    x = _rows(input, "input")
    n = x.shape[-1]
    assert weight.shape == (n,) and weight.is_contiguous(), (
        f"weight must be contiguous [{n}], got {tuple(weight.shape)}")
    assert 0 < n <= MAX_HIDDEN, f"hidden={n} not in (0, {MAX_HIDDEN}]"
    if out is None:
        out = torch.empty_like(input)
    assert out.shape == input.shape and out.dtype == input.dtype, (
        f"out must be {tuple(input.shape)} {input.dtype}, got {tuple(out.shape)} {out.dtype}")
    y = _rows(out, "out")
    _check_device(rmsnorm_kernel, x, weight, y)
    if x.shape[0] == 0:
        return out
    block = next_pow2(n)
    rmsnorm_kernel[(x.shape[0],)](x, x, weight, y, x.stride(0), 0, y.stride(0), n, float(eps),
                                  BLOCK_N=block, HAS_RESIDUAL=False, GEMMA=gemma,
                                  num_warps=_norm_warps(block))
    return out


def fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, *,
                      eps: float = 1e-6, gemma: bool = False) -> None:
    """In place: ``residual += input``; ``input = rmsnorm(residual) * weight``.

    The sum is formed in fp32; ``residual`` receives it rounded to its dtype, while the
    normalization uses the unrounded fp32 sum (as sgl_kernel / FlashInfer do).

    Parameters
    ----------
    input : torch.Tensor
        ``[num_tokens, hidden]``, bf16/fp16/fp32, last dim contiguous; overwritten.
    residual : torch.Tensor
        Same shape as ``input``, any float dtype, last dim contiguous; overwritten.
    weight : torch.Tensor
        ``[hidden]``, contiguous.
    eps, gemma
        As in `rmsnorm`.
    """
    assert residual.shape == input.shape, (
        f"residual {tuple(residual.shape)} vs input {tuple(input.shape)}")
    x, r = _rows(input, "input"), _rows(residual, "residual")
    n = x.shape[-1]
    assert weight.shape == (n,) and weight.is_contiguous(), (
        f"weight must be contiguous [{n}], got {tuple(weight.shape)}")
    assert 0 < n <= MAX_HIDDEN, f"hidden={n} not in (0, {MAX_HIDDEN}]"
    _check_device(rmsnorm_kernel, x, r, weight)
    if x.shape[0] == 0:
        return
    block = next_pow2(n)
    rmsnorm_kernel[(x.shape[0],)](x, r, weight, x, x.stride(0), r.stride(0), x.stride(0), n,
                                  float(eps), BLOCK_N=block, HAS_RESIDUAL=True, GEMMA=gemma,
                                  num_warps=_norm_warps(block))


def act_and_mul(input: torch.Tensor, *, act: str = "silu",
                out: torch.Tensor | None = None) -> torch.Tensor:
    """Gated activation: ``out = act(input[..., :d]) * input[..., d:]`` (fp32 math, one rounding).

    Parameters
    ----------
    input : torch.Tensor
        ``[num_tokens, 2 * d]`` (or any shape ending in ``2 * d``, contiguous), bf16/fp16/fp32,
        last dim contiguous.
    act : str
        ``"silu"``, ``"gelu"`` (erf) or ``"gelu_tanh"``.
    out : torch.Tensor, optional
        ``[..., d]``, dtype of ``input``, last dim contiguous; allocated if None.

    Returns
    -------
    torch.Tensor
        ``out``.
    """
    if act not in ACTIVATIONS:
        raise ValueError(f"unknown activation {act!r}; expected one of {sorted(ACTIVATIONS)}")
    x = _rows(input, "input")
    assert x.shape[-1] % 2 == 0, f"last dim must be even, got {x.shape[-1]}"
    d = x.shape[-1] // 2
    shape = input.shape[:-1] + (d,)
    if out is None:
        out = input.new_empty(shape)
    assert out.shape == shape and out.dtype == input.dtype, (
        f"out must be {tuple(shape)} {input.dtype}, got {tuple(out.shape)} {out.dtype}")
    y = _rows(out, "out")
    _check_device(act_and_mul_kernel, x, y)
    if x.shape[0] == 0 or d == 0:
        return out
    block = min(next_pow2(d), 1024)
    act_and_mul_kernel[(x.shape[0], cdiv(d, block))](
        x, y, x.stride(0), y.stride(0), d, BLOCK=block, ACT=ACTIVATIONS[act],
        num_warps=4 if block >= 512 else 1)
    return out


def _heads(t: torch.Tensor, name: str, head_size: int | None, num_tokens: int
           ) -> tuple[int, int, int]:
    """(token stride, head stride, num_heads) of ``[T, H, D]`` or ``[T, H * D]``."""
    assert t.dtype in FLOAT_DTYPES, f"{name} must be bf16/fp16/fp32, got {t.dtype}"
    assert t.shape[0] == num_tokens and t.stride(-1) == 1, (
        f"{name} must be [{num_tokens}, ...] with a contiguous last dim, got "
        f"{tuple(t.shape)} strides {t.stride()}")
    if t.dim() == 3:
        return t.stride(0), t.stride(1), t.shape[1]
    assert t.dim() == 2 and head_size and t.shape[1] % head_size == 0, (
        f"{name} must be [T, H, D], or [T, H * head_size] with head_size given")
    return t.stride(0), head_size, t.shape[1] // head_size


def rope_inplace(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None, *,
                 cos_sin_cache: torch.Tensor, is_neox: bool,
                 head_size: int | None = None) -> None:
    """Rotary embedding applied in place to the first ``rot_dim`` dims of every head.

    Parameters
    ----------
    positions : torch.Tensor
        ``[num_tokens]``, int32/int64.
    query : torch.Tensor
        ``[num_tokens, num_qo_heads, head_dim]`` (any token/head strides) or
        ``[num_tokens, num_qo_heads * head_size]``; bf16/fp16/fp32, last dim contiguous.
    key : torch.Tensor or None
        ``[num_tokens, num_kv_heads, head_dim]`` or 2-D like ``query``, same dtype.
    cos_sin_cache : torch.Tensor
        ``[max_position, rot_dim]``: ``rot_dim / 2`` cosines then ``rot_dim / 2`` sines, fp32 or
        the query dtype, last dim contiguous. ``rot_dim <= head_dim``, even.
    is_neox : bool
        Pairs ``(i, i + rot_dim / 2)`` (GPT-NeoX) if True, else ``(2i, 2i + 1)`` (GPT-J).
    head_size : int, optional
        Required for 2-D ``query``/``key``.
    """
    pos = positions.reshape(-1)
    t = pos.shape[0]
    assert pos.dtype in (torch.int32, torch.int64), f"positions must be int32/64, got {pos.dtype}"
    assert pos.is_contiguous()
    sqt, sqh, hq = _heads(query, "query", head_size, t)
    skt, skh, hk = (0, 0, 0) if key is None else _heads(key, "key", head_size, t)
    assert key is None or key.dtype == query.dtype, "key and query must share a dtype"
    rot = cos_sin_cache.shape[-1]
    width = query.shape[-1] if query.dim() == 3 else head_size
    assert cos_sin_cache.dim() == 2 and cos_sin_cache.stride(-1) == 1 and rot % 2 == 0, (
        f"cos_sin_cache must be [max_position, rot_dim] (even, contiguous rows), got "
        f"{tuple(cos_sin_cache.shape)}")
    assert rot <= width, f"rot_dim={rot} > head dim {width}"
    assert cos_sin_cache.dtype in FLOAT_DTYPES
    tensors = [pos, query, cos_sin_cache] + ([] if key is None else [key])
    _check_device(rope_kernel, *tensors)
    if t == 0:
        return
    half = rot // 2
    block_r = next_pow2(half)
    block_h = max(1, min(next_pow2(max(hq, hk)), 2048 // block_r))
    grid = (t, cdiv(hq, block_h) + cdiv(hk, block_h))
    rope_kernel[grid](pos, query, query if key is None else key, cos_sin_cache, sqt, sqh, skt,
                      skh, cos_sin_cache.stride(0), hq, hk, HALF=half, BLOCK_H=block_h,
                      BLOCK_R=block_r, IS_NEOX=bool(is_neox), HAS_K=key is not None,
                      num_warps=4 if block_h * block_r >= 1024 else 1)
