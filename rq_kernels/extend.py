"""Launcher of extend (prefill) attention: compressed prefix + causal BF16 chunk."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rq_kernels._host import (
    attention_loop_args, cdiv, check_extend_args, interpreting, require_kernel, rotation_terms,
    unsupported_reason,
)
from rq_kernels.extend_workspace import extend_attention_workspace
from rq_kernels.triton.extend import rq_extend_kernel

if TYPE_CHECKING:
    from rq_kernels.view import CompressedLayerView

LOG2E = 1.4426950408889634
IMPLS = ("fused", "workspace")


@dataclass(frozen=True)
class ExtendLaunch:
    """Which implementation serves `extend_attention` (both until the H200 A/B decides,
    docs/kernels.md).

    ``impl``: ``"fused"`` (default; one Triton kernel, the prefix dequantized tile by tile in
    registers) or ``"workspace"`` (the prefix reconstructed into a bounded bf16 workspace, stock
    FlashAttention, log-sum-exp merge with the chunk: `rq_kernels.extend_workspace`).
    """

    impl: str = "fused"

    def __post_init__(self) -> None:
        if self.impl not in IMPLS:
            raise ValueError(f"ExtendLaunch.impl must be one of {IMPLS}, got {self.impl!r}")


def extend_attention(q: torch.Tensor, k_cur: torch.Tensor, v_cur: torch.Tensor,
                     view: CompressedLayerView, loop_id: int, qo_indptr: torch.Tensor,
                     kv_indptr: torch.Tensor, kv_indices: torch.Tensor, *, sm_scale: float,
                     out: torch.Tensor | None = None, max_qo_len: int | None = None,
                     block_m: int = 128, block_n: int = 64, num_warps: int = 8,
                     num_stages: int = 2, launch: ExtendLaunch | None = None,
                     host_indptrs: tuple[list[int], list[int]] | None = None) -> torch.Tensor:
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
    block_m, block_n, num_warps, num_stages:
        Tiling of the fused kernel.
    launch:
        `ExtendLaunch`: which implementation runs (default: the fused kernel).
    host_indptrs:
        Optional ``(qo_indptr, kv_indptr)`` as host lists, equal to the tensors. The workspace
        implementation needs the lengths on the host and otherwise reads them (one sync); with
        them it never syncs (CUDA-graph capturable). The fused kernel ignores them.

    Returns
    -------
    ``[num_tokens, num_qo_heads, head_dim]``, original basis, q's dtype.

    Note
    ----
    Fused: one launch, grid ``(batch_size, num_qo_heads, cdiv(max_qo_len, block_m))``. The prefix is
    dequantized tile by tile in registers (never written to HBM) and attended in the rotated
    basis; the accumulator is un-rotated once before the chunk. Raises ValueError for a
    format outside `rq_kernels._host.unsupported_reason` or CPU tensors outside
    ``TRITON_INTERPRET=1`` (the caller runs the twin,
    `sglang_rq.reference.extend_attention_reference`). Workspace: see
    `rq_kernels.extend_workspace.extend_attention_workspace` (syncs once for the host lengths;
    not CUDA-graph capturable, as extend never is).
    """
    if launch is not None and launch.impl == "workspace":
        return extend_attention_workspace(q, k_cur, v_cur, view, loop_id, qo_indptr, kv_indptr,
                                          kv_indices, sm_scale=sm_scale, out=out,
                                          host_indptrs=host_indptrs)
    require_kernel("extend_attention", unsupported_reason(view), rq_extend_kernel, q)
    out = check_extend_args(q, k_cur, v_cur, view, loop_id, qo_indptr, kv_indptr, kv_indices,
                            out)
    T, HQ, _ = q.shape
    HKV = k_cur.shape[1]
    B = qo_indptr.shape[0] - 1
    dev = q.device
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
