"""Attention backend ``rq_triton``: the fused Triton kernels over the ResidualQuant pool.

Plan once per forward (`init_forward_metadata`): ``qo_indptr``, ``kv_indptr`` and
``kv_indices`` (every request's compressed history/prefix rows, the in-flight tokens excluded)
are built from SGLang's ``req_to_token`` table and reused by every (loop, layer) call, as
FlashInfer's plan/run split does. Each call then stages or commits the forward's K/V
(`RQTokenToKVPool.save`, the commit kernel on the last loop) and runs
`rq_kernels.decode_attention` or `rq_kernels.extend_attention`.

Note
----
No CUDA-graph capture path yet: the launcher serves ``rq_triton`` with ``--disable-cuda-graph``.
On CPU the kernels run only under ``TRITON_INTERPRET=1`` (used by the wiring test).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from sglang_rq.backend_native import RQNativeAttnBackend

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


@dataclass
class RQForwardMetadata:
    """Per-forward index arrays: ``qo_indptr``/``kv_indptr`` ``[batch_size + 1]`` int32,
    ``kv_indices`` ``[nnz]`` int64 (history rows), ``max_qo_len`` host int."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    max_qo_len: int

    def __post_init__(self) -> None:
        dev = self.kv_indices.device
        assert self.qo_indptr.device == dev and self.kv_indptr.device == dev, "metadata on two devices"


class RQTritonAttnBackend(RQNativeAttnBackend):
    """Fused-kernel attention over the compressed pool (decode and extend)."""

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        super().init_forward_metadata(forward_batch)
        if forward_batch.forward_mode.is_decode_or_idle():
            hist = forward_batch.seq_lens.to(torch.int64) - 1
            qo = torch.ones_like(hist)
            max_qo = 1
        else:
            hist = forward_batch.extend_prefix_lens.to(torch.int64)
            qo = forward_batch.extend_seq_lens.to(torch.int64)
            max_qo = max(forward_batch.extend_seq_lens_cpu, default=1)
        dev = hist.device
        zero = torch.zeros(1, dtype=torch.int64, device=dev)
        kv_indptr = torch.cat([zero, torch.cumsum(hist, 0)])
        rows = self.req_to_token_pool.req_to_token[forward_batch.req_pool_indices.to(torch.int64)]
        width = rows.shape[1]
        mask = torch.arange(width, device=dev).unsqueeze(0) < hist.unsqueeze(1)  # [bs, width]
        self.rq_metadata = RQForwardMetadata(
            qo_indptr=torch.cat([zero, torch.cumsum(qo, 0)]).to(torch.int32),
            kv_indptr=kv_indptr.to(torch.int32),
            kv_indices=rows[mask].to(torch.int64),
            max_qo_len=int(max_qo))

    def _forward(self, q, k, v, layer, forward_batch, save_kv_cache, *, prefix_lens, extend_lens):
        from rq_kernels.decode import decode_attention
        from rq_kernels.decode_v2 import decode_attention_v2
        from rq_kernels.extend import extend_attention

        pool = self.token_to_kv_pool
        loop, phys = divmod(layer.layer_id, pool.rq_shape.num_layers)
        hq, hkv, d = layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim
        q3, k3, v3 = q.view(-1, hq, d), k.view(-1, hkv, d), v.view(-1, hkv, d)
        if save_kv_cache:
            pool.save(loop, phys, k3, v3, forward_batch.out_cache_loc)
        grp, pos = divmod(loop, pool.group_len)
        view = pool.group_views[phys][grp]
        md = self.rq_metadata
        if forward_batch.forward_mode.is_decode_or_idle():
            # v2 (plain FFMA, no PTX) is 1.3-1.9x faster than v1 for MHA on the H200; v1's
            # tensor-core path stays faster for GQA (docs/kernels.md, "Decode v2").
            decode = decode_attention_v2 if hq == hkv else decode_attention
            out = decode(q3, k3, v3, view, pos, md.kv_indptr, md.kv_indices, sm_scale=layer.scaling)
        else:
            out = extend_attention(q3, k3, v3, view, pos, md.qo_indptr, md.kv_indptr, md.kv_indices,
                                   sm_scale=layer.scaling, max_qo_len=md.max_qo_len)
        return out.reshape(q.shape[0], hq * d)
