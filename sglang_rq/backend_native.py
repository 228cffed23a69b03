"""CPU reference attention over the ResidualQuant pool (subclass of SGLang's TorchNativeAttnBackend).

Per (loop, layer) call: the forward's own K/V (in flight, full precision) are staged or committed
through `RQTokenToKVPool.save`; attention reads the history (prefix) of every request from the
compressed pages, dequantized by the reference codec, and the in-flight tokens from the call's
``k``/``v`` (the second segment). A token is therefore exact while it is in flight and compressed
afterwards (DESIGN.md section 1, step 8).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.nn.functional import scaled_dot_product_attention

from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

from sglang_rq import clipping, metrics
from sglang_rq.layout import loop_and_layer

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    from sglang_rq.pool import RQTokenToKVPool


class RQNativeAttnBackend(TorchNativeAttnBackend):
    """Attention backend ``rq_native``: correct everywhere, fast nowhere (the CPU path)."""

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """SGLang's plan, plus the committed-tokens counter: every token of this forward is
        committed to the pool by the end of its last loop (a host shape, no device sync)."""
        super().init_forward_metadata(forward_batch)
        metrics.count_committed(int(forward_batch.out_cache_loc.shape[0]))
        clipping.flush_for(self.token_to_kv_pool)

    def forward_extend(self, q, k, v, layer: RadixAttention, forward_batch: ForwardBatch,
                       save_kv_cache: bool = True, **kwargs):
        return self._forward(q, k, v, layer, forward_batch, save_kv_cache,
                             prefix_lens=forward_batch.extend_prefix_lens_cpu,
                             extend_lens=forward_batch.extend_seq_lens_cpu)

    def forward_decode(self, q, k, v, layer: RadixAttention, forward_batch: ForwardBatch,
                       save_kv_cache: bool = True, **kwargs):
        seq_lens = forward_batch.seq_lens_cpu.tolist()
        return self._forward(q, k, v, layer, forward_batch, save_kv_cache,
                             prefix_lens=[s - 1 for s in seq_lens], extend_lens=[1] * len(seq_lens))

    def _forward(self, q, k, v, layer, forward_batch, save_kv_cache, *, prefix_lens, extend_lens):
        pool: RQTokenToKVPool = self.token_to_kv_pool
        loop, phys = loop_and_layer(layer.layer_id, pool.rq_shape.num_layers)
        hq, hkv, d = layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim
        q3 = q.view(-1, hq, d)
        k3, v3 = k.view(-1, hkv, d), v.view(-1, hkv, d)
        if save_kv_cache:
            pool.save(loop, phys, k3, v3, forward_batch.out_cache_loc)
        out = torch.empty_like(q3)
        req_to_token = self.req_to_token_pool.req_to_token
        slots = [req_to_token[int(rp), :int(p)] for rp, p in
                 zip(forward_batch.req_pool_indices.tolist(), prefix_lens)]
        all_slots = torch.cat(slots) if slots else torch.empty(0, dtype=torch.int64)
        k_hist, v_hist = pool.dequantize(loop, phys, all_slots.to(torch.int64))
        start_q = start_h = 0
        for p, e in zip(prefix_lens, extend_lens):
            p, e = int(p), int(e)
            kk = torch.cat([k_hist[start_h:start_h + p].to(q.dtype), k3[start_q:start_q + e]])
            vv = torch.cat([v_hist[start_h:start_h + p].to(q.dtype), v3[start_q:start_q + e]])
            qi = torch.arange(e).unsqueeze(1)
            kj = torch.arange(p + e).unsqueeze(0)
            mask = (kj <= qi + p).to(q.device)  # [e, p+e] causal over prefix + chunk
            o = scaled_dot_product_attention(
                q3[start_q:start_q + e].transpose(0, 1).unsqueeze(0),
                kk.transpose(0, 1).unsqueeze(0), vv.transpose(0, 1).unsqueeze(0),
                attn_mask=mask, scale=layer.scaling, enable_gqa=hq != hkv)
            out[start_q:start_q + e] = o.squeeze(0).transpose(0, 1)
            start_q, start_h = start_q + e, start_h + p
        self._count_nonfinite_once(out, loop, phys)
        return out.view(q.shape[0], hq * d)

    def _count_nonfinite_once(self, out: torch.Tensor, loop: int, phys: int) -> None:
        """Count non-finite rows of ``out`` at the last layer of the last loop, once per forward
        (NaN/Inf upstream has reached there). One reduction and host sync, so never inside a
        CUDA-graph capture (a replayed step is not checked)."""
        shape = self.token_to_kv_pool.rq_shape
        if phys != shape.num_layers - 1 or loop != shape.num_loops - 1:
            return
        if out.is_cuda and torch.cuda.is_current_stream_capturing():
            return
        metrics.count_nonfinite(out)
