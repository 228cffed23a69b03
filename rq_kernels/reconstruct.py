"""Launchers of the reconstruct kernel: one loop's K/V of pool rows as bf16, rotated basis."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rq_kernels._host import (
    attention_loop_args, cdiv, check_view, interpreting, next_pow2, require_kernel,
    rotation_args, unsupported_reason,
)
from rq_kernels.triton.reconstruct import rq_reconstruct_kernel

if TYPE_CHECKING:
    from rq_kernels.view import CompressedLayerView

BLOCK_N = 64  # rows per program
NUM_WARPS = 4


def reconstruct_rows(view: CompressedLayerView, loop_id: int, rows: torch.Tensor,
                     out_k: torch.Tensor, out_v: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Reconstructed K and V of loop ``loop_id`` at pool rows ``rows``, in the rotated basis.

    Parameters
    ----------
    view:
        The layer's `CompressedLayerView` (read only).
    loop_id:
        Loop to reconstruct: its anchor times ``c`` plus its own residual (anchor loop: the
        anchor alone).
    rows:
        ``[n]``, ``torch.int64``, ``cuda``: pool rows (slots).
    out_k, out_v:
        ``[n, num_kv_heads, head_dim]``, ``torch.bfloat16``, ``cuda``, last dim contiguous,
        the same strides: written with ``x̂ R`` (``R`` the view's rotation; the original basis
        when it has none), rounded to nearest even.

    Returns
    -------
    ``(out_k, out_v)``.

    Note
    ----
    Memory-bound: reads the compressed rows once and writes ``2 n num_kv_heads head_dim``
    bf16. One launch, grid ``(cdiv(n, 64), num_kv_heads, 2)``. Bit-identical to the twin
    `sglang_rq.reference.reconstruct_rows_reference` (fp32 in the twin's order, FMA contraction
    off). Raises ValueError for a format outside `rq_kernels._host.unsupported_reason` or
    CPU tensors outside ``TRITON_INTERPRET=1``.
    """
    require_kernel("reconstruct_rows", unsupported_reason(view), rq_reconstruct_kernel, rows)
    n = rows.shape[0]
    hkv = view.codes[0].shape[2]
    d = view.head_dim
    assert rows.dim() == 1 and rows.dtype == torch.int64 and rows.is_contiguous(), (
        f"rows must be contiguous int64 [n], got {rows.dtype} {tuple(rows.shape)}")
    _check_out(view, loop_id, rows.device, out_k, out_v, n, hkv, d)
    if n == 0:
        return out_k, out_v
    _launch(view, loop_id, rows, n, out_k, out_v, None, cdiv(n, BLOCK_N))
    return out_k, out_v


def fill_extend_workspace(view: CompressedLayerView, loop_id: int, kv_indices: torch.Tensor,
                          kv_indptr: torch.Tensor, qo_indptr: torch.Tensor, k_cur: torch.Tensor,
                          v_cur: torch.Tensor, ws_k: torch.Tensor, ws_v: torch.Tensor,
                          cu_k: torch.Tensor) -> None:
    """An extend batch's keys and values in FlashAttention's variable-length layout, in the
    rotated basis, in one launch: request ``b``'s reconstructed prefix (as `reconstruct_rows`)
    then its chunk's own K/V times ``R`` (exact to fp32, then bf16), requests one after
    another.

    Parameters
    ----------
    view, loop_id:
        As `reconstruct_rows`.
    kv_indices:
        ``[nnz]``, ``torch.int64``: pool rows of the prefixes, request b's at
        ``kv_indptr[b] - kv_indptr[0]`` onwards (the slice of the batch's indices they span).
    kv_indptr, qo_indptr:
        ``[B + 1]``, ``torch.int32``: the requests' prefix and chunk offsets
        (``kv_indptr[-1] - kv_indptr[0] == nnz``, ``qo_indptr[0] == 0``).
    k_cur, v_cur:
        ``[T, num_kv_heads, head_dim]`` bf16, ``T == qo_indptr[-1]``: the chunks' K/V,
        original basis.
    ws_k, ws_v:
        ``[nnz + T, num_kv_heads, head_dim]`` bf16, the same strides: written in full.
    cu_k:
        ``[B + 1]`` int32: written with ``qo_indptr + kv_indptr - kv_indptr[0]``, the key
        offsets of the workspace's sequences.
    """
    n, T = kv_indices.shape[0], k_cur.shape[0]
    hkv, d = view.codes[0].shape[2], view.head_dim
    _check_out(view, loop_id, kv_indices.device, ws_k, ws_v, n + T, hkv, d)
    assert k_cur.shape == v_cur.shape == (T, hkv, d) and k_cur.stride() == v_cur.stride()
    assert k_cur.stride(-1) == 1 and cu_k.shape == qo_indptr.shape == kv_indptr.shape
    if n + T == 0:
        return
    place = (qo_indptr, kv_indptr, qo_indptr.shape[0] - 1, k_cur, v_cur, k_cur.stride(0),
             k_cur.stride(1), T, cu_k)
    _launch(view, loop_id, kv_indices, n, ws_k, ws_v, place, cdiv(max(n, T), BLOCK_N))


def _check_out(view, loop_id, dev, out_k, out_v, n, hkv, d) -> None:
    assert 0 <= loop_id < len(view.segments), f"loop_id {loop_id} of {len(view.segments)}"
    for name, t in (("out_k", out_k), ("out_v", out_v)):
        assert t.shape == (n, hkv, d) and t.dtype == torch.bfloat16 and t.device == dev, (
            f"{name} must be bf16 [{n}, {hkv}, {d}] on {dev}, got {t.dtype} "
            f"{tuple(t.shape)} on {t.device}")
        assert t.stride(-1) == 1, f"{name} last dim must be contiguous"
    assert out_k.stride() == out_v.stride(), "out_k and out_v must have the same strides"
    check_view(view, dev)


def _launch(view, loop_id, rows, n, out_k, out_v, place, blocks) -> None:
    args, c = attention_loop_args(view, loop_id)
    rot, nterms = rotation_args(view, next_pow2(view.head_dim), rows.device)
    has_rot = view.rotation is not None
    placing = place is not None
    if not placing:  # dummies: PLACE=False reads none of them
        place = (rows, rows, 0, out_k, out_k, 0, 0, 0, rows)
    rq_reconstruct_kernel[(blocks, view.codes[0].shape[2], 2)](
        rows, n, *args, *rot, out_k, out_v, out_k.stride(0), out_k.stride(1), *place,
        HAS_ROT=has_rot, TERMS=nterms, PLACE=placing,
        BLOCK_N=BLOCK_N, INTERP=interpreting(rq_reconstruct_kernel),
        num_warps=NUM_WARPS, enable_fp_fusion=False, **c)
