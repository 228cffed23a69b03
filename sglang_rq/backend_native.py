"""CPU attention over the ResidualQuant pool (subclass of SGLang's TorchNativeAttnBackend).

Per (loop, layer) call: the forward's own K/V (in flight, full precision) are staged or committed
through `RQTokenToKVPool.save`; attention reads the history (prefix) of every request from the
compressed pages with `rq_kernels.cpu_attention` (one call for the whole batch: the codes are
unpacked and folded into the dot products in the rotated basis, never rebuilt into K/V), and the
in-flight tokens from the call's ``k``/``v``, merged by log-sum-exp. A token is therefore exact
while it is in flight and compressed afterwards (DESIGN.md section 1, step 8). Which
implementation serves decode and extend (the C library or the PyTorch twin) is the pool's
``kernel_paths`` (`sglang_rq.dispatch`), decided once when the pool was built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import itertools

import torch

from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

from sglang_rq import clipping, metrics

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    from sglang_rq.pool import RQTokenToKVPool


class RQNativeAttnBackend(TorchNativeAttnBackend):
    """Attention backend ``rq_native`` (the CPU path): `rq_kernels.cpu_attention` over the
    compressed history, batched over requests, plus the in-flight chunk; a format the C path
    does not serve runs the PyTorch twin (`sglang_rq.dispatch`: logged once at start-up, every
    such forward counted in ``sglang_rq_fallbacks_total{path}``)."""

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """SGLang's plan, plus the per-forward counters: every token of this forward is
        committed to the pool by the end of its last loop (a host shape, no device sync), and a
        forward whose paths a twin serves counts as a fallback."""
        super().init_forward_metadata(forward_batch)
        num_tokens = int(forward_batch.out_cache_loc.shape[0])
        metrics.count_committed(num_tokens)
        clipping.flush_for(self.token_to_kv_pool)
        if num_tokens:
            self.token_to_kv_pool.count_forward(
                decode=forward_batch.forward_mode.is_decode_or_idle())

    def forward_extend(self, q, k, v, layer: RadixAttention, forward_batch: ForwardBatch,
                       save_kv_cache: bool = True, **kwargs):
        """Attention of one (loop, layer) for a prefill or chunked-prefill forward.

        Parameters
        ----------
        q:
            ``[num_tokens, num_qo_heads * head_dim]``, model dtype, the pool's device: this
            forward's queries, requests concatenated (``forward_batch.extend_seq_lens_cpu``).
        k, v:
            ``[num_tokens, num_kv_heads * head_dim]`` (or ``[num_tokens, num_kv_heads,
            head_dim]``), model dtype: this forward's own K/V, original basis.
        layer:
            The calling `RadixAttention`; its ``layer_id`` is the KV slot
            (`layout.ModelKVShape.slot_places`, the pool's ``targets``), its ``scaling`` the
            softmax scale.
        forward_batch:
            SGLang's batch: ``out_cache_loc`` ``[num_tokens]`` (destination slots),
            ``req_pool_indices``, ``extend_prefix_lens_cpu`` (history tokens per request).
        save_kv_cache:
            Stage or commit ``k``/``v`` first (`RQTokenToKVPool.save`).

        Returns
        -------
        ``[num_tokens, num_qo_heads * head_dim]`` in q's dtype: each request's compressed
        history, then its own chunk, causal.

        Note
        ----
        The pool's extend path serves it (`sglang_rq.dispatch`: the C library, or the twin).
        """
        return self._forward(q, k, v, layer, forward_batch, save_kv_cache,
                             prefix_lens=forward_batch.extend_prefix_lens_cpu,
                             extend_lens=forward_batch.extend_seq_lens_cpu)

    def forward_decode(self, q, k, v, layer: RadixAttention, forward_batch: ForwardBatch,
                       save_kv_cache: bool = True, **kwargs):
        """Attention of one (loop, layer) for a decode forward: one token per request.

        Parameters
        ----------
        q:
            ``[batch_size, num_qo_heads * head_dim]``, model dtype.
        k, v:
            ``[batch_size, num_kv_heads * head_dim]``, model dtype: the in-flight token.
        layer, forward_batch, save_kv_cache:
            As in `forward_extend`; the history of request b is ``seq_lens_cpu[b] - 1`` tokens.

        Returns
        -------
        ``[batch_size, num_qo_heads * head_dim]`` in q's dtype.

        Note
        ----
        The pool's decode path serves it (`sglang_rq.dispatch`).
        """
        seq_lens = forward_batch.seq_lens_cpu.tolist()
        return self._forward(q, k, v, layer, forward_batch, save_kv_cache,
                             prefix_lens=[s - 1 for s in seq_lens], extend_lens=[1] * len(seq_lens))

    def _forward(self, q, k, v, layer, forward_batch, save_kv_cache, *, prefix_lens, extend_lens):
        """Shared body: save, then the pool's decode or extend path over this layer's view
        (history rows from ``req_to_token``, ``prefix_lens``/``extend_lens`` host lists)."""
        pool: RQTokenToKVPool = self.token_to_kv_pool
        target = pool.targets[layer.layer_id]
        hq, hkv, d = layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim
        q3 = q.view(-1, hq, d)
        k3, v3 = k.view(-1, hkv, d), v.view(-1, hkv, d)
        decode = forward_batch.forward_mode.is_decode_or_idle()
        q3, k3, v3, out_factor = pool.prescale_attention(layer.layer_id, q3, k3, v3,
                                                         calibrate=not decode)
        if save_kv_cache:
            pool.save(layer.layer_id, k3, v3, forward_batch.out_cache_loc)
        req_to_token = self.req_to_token_pool.req_to_token
        slots = [req_to_token[int(rp), :int(p)] for rp, p in
                 zip(forward_batch.req_pool_indices.tolist(), prefix_lens)]
        kv_indices = torch.cat(slots).to(torch.int64) if slots else torch.empty(0, dtype=torch.int64)
        kv_indptr = torch.tensor([0, *itertools.accumulate(int(p) for p in prefix_lens)],
                                 dtype=torch.int64)
        view, pos = target.view, target.pos
        if decode:  # one query row per request
            out = target.paths.decode.fn(q3, k3, v3, view, pos, kv_indptr, kv_indices,
                                              sm_scale=layer.scaling)
        else:
            qo_indptr = torch.tensor([0, *itertools.accumulate(int(e) for e in extend_lens)],
                                     dtype=torch.int64)
            out = target.paths.extend.fn(q3, k3, v3, view, pos, qo_indptr, kv_indptr,
                                              kv_indices, sm_scale=layer.scaling)
        if out_factor is not None:
            out = out.view(-1, hq, d) * out_factor
        self._count_nonfinite_once(out, layer.layer_id)
        return out.reshape(q.shape[0], hq * d)

    def _count_nonfinite_once(self, out: torch.Tensor, slot: int) -> None:
        """Count non-finite rows of ``out`` at the last KV slot (last layer, last loop), once per forward
        (NaN/Inf upstream has reached there). One reduction and host sync, so never inside a
        CUDA-graph capture (a replayed step is not checked)."""
        if slot != self.token_to_kv_pool.layer_num - 1:
            return
        if out.is_cuda and torch.cuda.is_current_stream_capturing():
            return
        metrics.count_nonfinite(out)
