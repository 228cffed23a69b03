"""Attention backend ``rq_native`` (the CPU path) over the ResidualQuant pool.

A sibling of ``rq_triton`` over `sglang_rq.backend_base.RQAttnBackend`, which holds the per-call
body. Here the forward's plan is built from SGLang's host lists (``extend_prefix_lens_cpu``,
``seq_lens_cpu``), and the pool's paths are normally the C library (`rq_kernels.cpu_attention`: one
call for the whole batch, codes unpacked and folded into the dot products in the rotated basis,
never rebuilt into K/V), or the PyTorch twin for a format it does not serve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sglang_rq.backend_base import RQAttnBackend, RQForwardMetadata, host_indptr

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


class RQNativeAttnBackend(RQAttnBackend):
    """Attention backend ``rq_native``: host-planned index arrays (int64, CPU)."""

    def plan(self, forward_batch: ForwardBatch) -> RQForwardMetadata:
        """History rows of every request from ``req_to_token`` and the host lengths: decode
        requests have ``seq_lens_cpu[b] - 1`` history tokens and one query row, extend requests
        ``extend_prefix_lens_cpu[b]`` and ``extend_seq_lens_cpu[b]``."""
        if forward_batch.forward_mode.is_decode_or_idle():
            prefix_lens = [s - 1 for s in forward_batch.seq_lens_cpu.tolist()]
            extend_lens = [1] * len(prefix_lens)
        else:
            prefix_lens = list(forward_batch.extend_prefix_lens_cpu)
            extend_lens = list(forward_batch.extend_seq_lens_cpu)
        req_to_token = self.req_to_token_pool.req_to_token
        slots = [req_to_token[int(rp), :int(p)] for rp, p in
                 zip(forward_batch.req_pool_indices.tolist(), prefix_lens)]
        kv_indices = (torch.cat(slots).to(torch.int64) if slots
                      else torch.empty(0, dtype=torch.int64))

        qp, kp = host_indptr(extend_lens), host_indptr(prefix_lens)
        return RQForwardMetadata(qo_indptr=torch.tensor(qp, dtype=torch.int64),
                                 kv_indptr=torch.tensor(kp, dtype=torch.int64),
                                 kv_indices=kv_indices, host_indptrs=(qp, kp))
