"""Launcher of fused decode attention over the compressed cache (split-K + merge)."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING

import torch

from rq_kernels._host import (
    attention_loop_args, cdiv, check_decode_args, interpreting, next_pow2, require_kernel,
    rotation_terms, unsupported_reason,
)
from rq_kernels.triton.decode import rq_decode_merge_kernel, rq_decode_split_kernel

if TYPE_CHECKING:
    from rq_kernels.view import CompressedLayerView

LOG2E = 1.4426950408889634


@lru_cache(maxsize=8)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def choose_num_splits(batch_size: int, num_kv_heads: int, nnz: int, device: torch.device, *,
                      block_n: int) -> int:
    """Splits of each request's history so that the grid fills the GPU (host-only: uses
    ``nnz`` = total history tokens, never a device read, so it is CUDA-graph friendly)."""
    avg = max(1, nnz // max(1, batch_size))
    most = max(1, cdiv(avg, 4 * block_n))  # at least ~4 tiles per split
    if device.type != "cuda":
        return min(most, 3)
    want = cdiv(4 * _num_sms(device.index or 0), batch_size * num_kv_heads)
    return max(1, min(want, most))


def decode_attention(q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor,
                     view: CompressedLayerView, loop_id: int, kv_indptr: torch.Tensor,
                     kv_indices: torch.Tensor, *, sm_scale: float, out: torch.Tensor | None = None,
                     num_splits: int | None = None, block_n: int = 32, num_warps: int = 1,
                     num_stages: int = 3, fast_convert: bool = True) -> torch.Tensor:
    """Decode attention of loop ``loop_id`` over the compressed history plus the in-flight token.

    Parameters
    ----------
    q:
        ``[batch_size, num_qo_heads, head_dim]``, ``torch.bfloat16``, ``cuda``.
    k_cur, v_cur:
        ``[batch_size, num_kv_heads, head_dim]``, ``torch.bfloat16``, ``cuda``: this step's
        token (full precision, original basis); ``num_qo_heads % num_kv_heads == 0``.
    view:
        The layer's `CompressedLayerView` (read only).
    loop_id:
        Loop whose K/V are attended: its anchor plus its own residual (anchor loop: anchor only).
    kv_indptr:
        ``[batch_size + 1]``, ``torch.int32``, ``cuda``: request b's history is
        ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` (may be empty).
    kv_indices:
        ``[nnz]``, ``torch.int64``, ``cuda``: pool rows of the history (in-flight token excluded).
    sm_scale:
        Softmax scale (``1/sqrt(head_dim)`` usually).
    out:
        Optional ``[batch_size, num_qo_heads, head_dim]`` output (q's dtype).
    num_splits:
        Splits of each history (split-K); default from the batch shape (`choose_num_splits`).
    block_n, num_warps, num_stages, fast_convert:
        Tile / launch config; defaults are the best of the H200 sweep (docs/kernels_history.md).
        ``fast_convert`` selects the PTX int->fp16 conversion (ignored under the interpreter).

    Returns
    -------
    ``[batch_size, num_qo_heads, head_dim]`` in the original basis, q's dtype.

    Note
    ----
    Two launches: split kernel ``(num_kv_heads, batch_size, num_splits)`` and merge kernel
    ``(num_kv_heads, cdiv(batch_size * group, 16))``; a ``[batch_size, num_qo_heads, num_splits,
    head_dim]`` fp32 workspace is allocated per call. Formats the kernels do not cover
    (`rq_kernels._host.unsupported_reason`) and CPU tensors outside ``TRITON_INTERPRET=1`` run the
    twin `sglang_rq.reference.decode_attention_reference`. CUDA-graph safe after one warm-up
    call with the same rotation tensor.
    """
    require_kernel("decode_attention", unsupported_reason(view), rq_decode_split_kernel, q)
    B, HQ, D = q.shape
    HKV = k_cur.shape[1]
    out = check_decode_args(q, k_cur, v_cur, view, loop_id, kv_indptr, kv_indices, out)
    dev = q.device
    if block_n < 32 and q.is_cuda:
        # NOTE: measured wrong on the H200 (its 16-row tensor-core path); correct under the
        # interpreter. Refused rather than risked; see docs/kernels_history.md "Decode v2".
        raise ValueError(f"decode_attention: block_n={block_n} < 32 is not supported on CUDA")
    gq = HQ // HKV
    args, c = attention_loop_args(view, loop_id)
    gqv = max(next_pow2(gq), 16 // c["NGP"])
    dp = c["DP"]
    splits = num_splits or choose_num_splits(B, HKV, kv_indices.numel(), dev, block_n=block_n)
    terms, alpha, nterms = rotation_terms(view.rotation, dp, dev)
    rot = (terms, terms.stride(0) if terms.dim() == 4 else 0,
           terms.stride(1) if terms.dim() == 4 else 0, dp, alpha)
    has_rot = view.rotation is not None
    interp = interpreting(rq_decode_split_kernel)
    mid_o = torch.empty(B, HQ, splits, dp, dtype=torch.float32, device=dev)
    mid_ml = torch.empty(B, HQ, splits, 2, dtype=torch.float32, device=dev)
    qk_scale = sm_scale * LOG2E
    rq_decode_split_kernel[(HKV, B, splits)](
        q, q.stride(0), q.stride(1), kv_indptr, kv_indices, *args, *rot, mid_o, mid_ml,
        qk_scale, splits, GQ=gq, GQV=gqv, HAS_ROT=has_rot, TERMS=nterms, BLOCK_N=block_n,
        INTERP=interp, FAST=fast_convert and not interp, num_warps=num_warps,
        num_stages=num_stages, **c)
    block_m = 16
    rq_decode_merge_kernel[(HKV, cdiv(B * gq, block_m))](
        q, q.stride(0), q.stride(1), k_cur, k_cur.stride(0), k_cur.stride(1),
        v_cur, v_cur.stride(0), v_cur.stride(1), mid_o, mid_ml, *rot,
        out, out.stride(0), out.stride(1), B * gq, qk_scale, splits,
        GQ=gq, D=D, DP=dp, HAS_ROT=has_rot, TERMS=nterms, BLOCK_M=block_m, INTERP=interp,
        num_warps=4)
    return out


def default_sm_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
