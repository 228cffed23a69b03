"""Launcher of extend (prefill) attention: compressed prefix + causal BF16 chunk."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rq_kernels._host import (
    attention_loop_args, cdiv, check_view, interpreting, require_kernel, rotation_terms,
    unsupported_reason,
)
from rq_kernels.triton.extend import rq_extend_kernel

if TYPE_CHECKING:
    from rq_kernels.view import CompressedLayerView

LOG2E = 1.4426950408889634


def extend_attention(q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor,
                     view: CompressedLayerView, loop_id: int, qo_indptr: torch.Tensor,
                     kv_indptr: torch.Tensor, kv_indices: torch.Tensor, *, sm_scale: float,
                     out: torch.Tensor | None = None, max_qo_len: int | None = None,
                     block_m: int = 128, block_n: int = 64, num_warps: int = 8,
                     num_stages: int = 2) -> torch.Tensor:
    """Extend attention of loop ``loop_id``: each request's compressed prefix, then its chunk.

    Parameters
    ----------
    q:
        ``[num_tokens, num_qo_heads, head_dim]``, ``torch.bfloat16``, ``cuda``: the chunk's
        queries, requests concatenated (``qo_indptr``).
    k_cur, v_cur:
        ``[num_tokens, num_kv_heads, head_dim]``, ``torch.bfloat16``, ``cuda``: the chunk's own
        K/V (full precision, original basis), attended causally.
    view:
        The layer's `CompressedLayerView` (read only).
    loop_id:
        Loop whose K/V are attended (its anchor plus its residual).
    qo_indptr:
        ``[batch_size + 1]``, ``torch.int32``, ``cuda``: request b's chunk rows.
    kv_indptr:
        ``[batch_size + 1]``, ``torch.int32``, ``cuda``: request b's prefix is
        ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` (may be empty); the chunk follows it.
    kv_indices:
        ``[nnz]``, ``torch.int64``, ``cuda``: pool rows of the compressed prefixes.
    sm_scale:
        Softmax scale.
    out:
        Optional ``[num_tokens, num_qo_heads, head_dim]`` output (q's dtype).
    max_qo_len:
        Longest chunk (host int); defaults to ``num_tokens`` (extra programs exit at once).

    Returns
    -------
    ``[num_tokens, num_qo_heads, head_dim]``, original basis, q's dtype.

    Note
    ----
    One launch, grid ``(batch_size, num_qo_heads, cdiv(max_qo_len, block_m))``. The prefix is
    dequantized tile by tile in registers (never written to HBM) and attended in the rotated
    basis; the accumulator is un-rotated once before the chunk. Raises ValueError for a
    format outside `rq_kernels._host.unsupported_reason` or CPU tensors outside
    ``TRITON_INTERPRET=1`` (the caller runs the twin,
    `sglang_rq.reference.extend_attention_reference`).
    """
    require_kernel("extend_attention", unsupported_reason(view), rq_extend_kernel, q)
    T, HQ, D = q.shape
    HKV = k_cur.shape[1]
    B = qo_indptr.shape[0] - 1
    dev = q.device
    assert q.dtype == k_cur.dtype == v_cur.dtype == torch.bfloat16, "q/k_cur/v_cur must be bf16"
    assert k_cur.shape == v_cur.shape == (T, HKV, D) and HQ % HKV == 0, (
        f"q {tuple(q.shape)}, k_cur {tuple(k_cur.shape)}, v_cur {tuple(v_cur.shape)} mismatch")
    assert D == view.head_dim and 0 <= loop_id < len(view.segments), "head_dim/loop_id vs view"
    for name, t in (("q", q), ("k_cur", k_cur), ("v_cur", v_cur)):
        assert t.device == dev and t.stride(-1) == 1, (
            f"{name} must be on {dev}, last dim contiguous")
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr)):
        assert t.shape == (B + 1,) and t.dtype == torch.int32 and t.device == dev, (
            f"{name} must be int32 [{B + 1}] on {dev}")
        assert t.is_contiguous()
    assert kv_indices.dim() == 1 and kv_indices.dtype == torch.int64, "kv_indices int64 [nnz]"
    assert kv_indices.device == dev and kv_indices.is_contiguous()
    check_view(view, dev)
    if out is None:
        out = torch.empty_like(q)
    assert out.shape == q.shape and out.dtype == q.dtype and out.stride(-1) == 1
    if T == 0 or B == 0:
        return out
    args, c = attention_loop_args(view, loop_id)
    dp = c["DP"]
    terms, alpha, nterms = rotation_terms(view, dp, dev)
    rot = (terms, terms.stride(0) if terms.dim() == 4 else 0,
           terms.stride(1) if terms.dim() == 4 else 0, dp, alpha)
    grid = (B, HQ, cdiv(max_qo_len or T, block_m))
    rq_extend_kernel[grid](
        q, q.stride(0), q.stride(1), k_cur, k_cur.stride(0), k_cur.stride(1),
        v_cur, v_cur.stride(0), v_cur.stride(1), qo_indptr, kv_indptr, kv_indices, *args, *rot,
        out, out.stride(0), out.stride(1), sm_scale * LOG2E, GQ=HQ // HKV,
        HAS_ROT=view.rotation is not None, TERMS=nterms, BLOCK_M=block_m, BLOCK_N=block_n,
        INTERP=interpreting(rq_extend_kernel), num_warps=num_warps, num_stages=num_stages, **c)
    return out
