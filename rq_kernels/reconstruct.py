"""Launcher of the reconstruct kernel: one loop's K/V of pool rows, as bf16, rotated basis."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rq_kernels._host import (
    attention_loop_args, cdiv, check_view, interpreting, launch_kernel, require_kernel,
    unsupported_reason,
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
    off). Raises ValueError for a format outside `rq_kernels._host.unsupported_reason` or CPU
    tensors outside ``TRITON_INTERPRET=1``.
    """
    require_kernel("reconstruct_rows", unsupported_reason(view), rq_reconstruct_kernel, rows)
    dev = rows.device
    n = rows.shape[0]
    hkv = view.codes[0].shape[2]
    d = view.head_dim
    assert rows.dim() == 1 and rows.dtype == torch.int64 and rows.is_contiguous(), (
        f"rows must be contiguous int64 [n], got {rows.dtype} {tuple(rows.shape)}")
    assert 0 <= loop_id < len(view.segments), f"loop_id {loop_id} of {len(view.segments)}"
    for name, t in (("out_k", out_k), ("out_v", out_v)):
        assert t.shape == (n, hkv, d) and t.dtype == torch.bfloat16 and t.device == dev, (
            f"{name} must be bf16 [{n}, {hkv}, {d}] on {dev}, got {t.dtype} "
            f"{tuple(t.shape)} on {t.device}")
        assert t.stride(-1) == 1, f"{name} last dim must be contiguous"
    assert out_k.stride() == out_v.stride(), "out_k and out_v must have the same strides"
    check_view(view, dev)
    launch_reconstruct(view, loop_id, rows, out_k, out_v)
    return out_k, out_v


def launch_reconstruct(view: CompressedLayerView, loop_id: int, rows: torch.Tensor,
                       out_k: torch.Tensor, out_v: torch.Tensor) -> None:
    """`reconstruct_rows` without its argument checks, for launchers that made them (the extend
    path: once per (layer, loop) of every prefill forward)."""
    n = rows.shape[0]
    if n == 0:
        return
    args, c = attention_loop_args(view, loop_id)
    launch_kernel(rq_reconstruct_kernel, (cdiv(n, BLOCK_N), out_k.shape[1], 2),
                  (rows, n, *args, out_k, out_v, out_k.stride(0), out_k.stride(1)),
                  dict(c, BLOCK_N=BLOCK_N, INTERP=interpreting(rq_reconstruct_kernel)),
                  num_warps=NUM_WARPS, enable_fp_fusion=False)
