"""Index plan of the fused kernels: which compressed pool rows each request's history reads.

One owner for the plan that `rq_kernels.decode_attention`/`extend_attention` consume
(``kv_indptr``/``kv_indices``, the CSR layout FlashInfer and SGLang's Triton backend use). It is
built from SGLang's ``req_to_token`` table with static-shape tensor ops only (no ``.item()``, no
boolean-mask indexing), so the same function serves the eager path and CUDA-graph capture, where
it is recorded once and replayed with the runner's static ``req_pool_indices``/``seq_lens``.
No SGLang import: the kernels' GPU tests use it without an engine.
"""

from __future__ import annotations

import torch


def kv_indices_capacity(max_batch_size: int, max_context_len: int) -> int:
    """Elements of a static ``kv_indices`` buffer for a CUDA graph: every request's whole
    context, plus one trailing element where padded positions are scattered (`plan_history`)."""
    return max_batch_size * max_context_len + 1


def plan_history(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                 hist_lens: torch.Tensor, kv_indptr: torch.Tensor,
                 kv_indices: torch.Tensor) -> None:
    """Write the CSR plan of the requests' compressed histories into preallocated buffers.

    Parameters
    ----------
    req_to_token: ``[num_req_slots, width]`` int32, SGLang's request-to-token-slot table.
    req_pool_indices: ``[batch_size]`` int, each request's row of ``req_to_token``.
    hist_lens: ``[batch_size]`` int, history tokens per request (prefix for extend,
        ``seq_len - 1`` for decode); 0 for CUDA-graph padding rows.
    kv_indptr: ``[>= batch_size + 1]`` int32, output; ``kv_indptr[:batch_size + 1]`` is written
        (``kv_indptr[b]..kv_indptr[b+1]`` are request b's entries in ``kv_indices``).
    kv_indices: ``[>= sum(hist_lens) + 1]`` int64, output: pool rows, request after request. The
        last element is a scratch slot that receives the padded positions.

    Cost: a ``[batch_size, width]`` scatter, independent of the actual lengths (that is what
    keeps it static-shape). Raises nothing itself; out-of-range inputs are the caller's bug.
    """
    bs = req_pool_indices.shape[0]
    width = req_to_token.shape[1]
    hist = hist_lens.to(torch.int64)
    starts = torch.cumsum(hist, 0) - hist  # exclusive prefix sum: [bs] int64
    kv_indptr[:bs].copy_(starts)
    kv_indptr[bs:bs + 1].copy_(hist.sum(0, keepdim=True))
    pos = torch.arange(width, device=req_to_token.device)
    dest = torch.where(pos.unsqueeze(0) < hist.unsqueeze(1), starts.unsqueeze(1) + pos,
                       kv_indices.shape[0] - 1)  # [bs, width]
    rows = req_to_token.index_select(0, req_pool_indices.to(torch.int64))
    kv_indices.scatter_(0, dest.reshape(-1), rows.reshape(-1).to(torch.int64))
