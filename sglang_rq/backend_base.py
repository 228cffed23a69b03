"""What the two RQ attention backends share: one (loop, layer) call over the ResidualQuant pool.

`RQAttnBackend` is the small base of ``rq_native`` (`sglang_rq.backend_native`, CPU) and
``rq_triton`` (`sglang_rq.backend_triton`, CUDA). One call of a forward: the forward's own K/V (in
flight, full precision) are staged or committed through `RQTokenToKVPool.save`; attention reads
every request's history (prefix) from the compressed pages and the in-flight tokens from the call's
``k``/``v`` (DESIGN.md section 1, step 8: a token is exact while it is in flight, compressed
afterwards). Which implementation serves commit, decode and extend is the pool's ``kernel_paths``
(`sglang_rq.dispatch`), decided once when the pool was built. The siblings differ only in how they
plan a forward's index arrays (`RQAttnBackend.plan`): from host lists on CPU, on the device (and
into CUDA-graph buffers) on CUDA.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

from sglang_rq import clipping, metrics

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    from sglang_rq.pool import RQTokenToKVPool


def host_indptr(lens: Iterable[int]) -> list[int]:
    """``[0, l0, l0 + l1, ...]``: the indptr of host lengths (SGLang's ``*_lens_cpu``)."""
    return [0, *itertools.accumulate(int(n) for n in lens)]


@dataclass
class RQForwardMetadata:
    """A forward's index arrays, shared by all its (loop, layer) calls.

    ``qo_indptr``/``kv_indptr`` ``[batch_size + 1]`` (int32 on CUDA, int64 on CPU): request b's
    query rows and its history rows ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` (int64 pool rows,
    the in-flight tokens excluded); ``host_indptrs``: the same two indptrs as host lists
    (extend forwards; None for decode, whose calls are CUDA-graph recorded)."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    host_indptrs: tuple[list[int], list[int]] | None

    def __post_init__(self) -> None:
        dev = self.kv_indices.device
        assert self.qo_indptr.device == dev and self.kv_indptr.device == dev, "metadata on two devices"


class RQAttnBackend(TorchNativeAttnBackend):
    """Base of the RQ attention backends: the per-forward counters and the per-call body
    (prescale, save, the pool's decode or extend path). Subclasses implement `plan`."""

    token_to_kv_pool: RQTokenToKVPool

    def __init__(self, model_runner) -> None:
        super().__init__(model_runner)
        self.model_runner = model_runner

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """Per-forward counters, then the subclass's plan (``self.rq_metadata``).

        Every token of this forward is committed to the pool by the end of its last loop (a host
        shape, no device sync); a forward whose paths a twin serves counts as a fallback."""
        super().init_forward_metadata(forward_batch)
        self.count_forward(int(forward_batch.out_cache_loc.shape[0]),
                           decode=forward_batch.forward_mode.is_decode_or_idle())
        self.rq_metadata = self.plan(forward_batch)

    def count_forward(self, num_tokens: int, *, decode: bool) -> None:
        """Host counters of one forward of ``num_tokens`` tokens (eager or graph replay):
        committed tokens, clipped groups (flushed at most once a second), twin-served paths."""
        metrics.count_committed(num_tokens)
        clipping.flush_for(self.token_to_kv_pool)
        if num_tokens:
            self.token_to_kv_pool.count_forward(decode=decode)

    def plan(self, forward_batch: ForwardBatch) -> RQForwardMetadata:
        """This forward's index arrays (`RQForwardMetadata`), built once per forward."""
        raise NotImplementedError

    def forward_extend(self, q, k, v, layer: RadixAttention, forward_batch: ForwardBatch,
                       save_kv_cache: bool = True, **kwargs):
        """Attention of one (loop, layer) for a prefill or chunked-prefill forward.

        Parameters
        ----------
        q:
            ``[num_tokens, num_qo_heads * head_dim]``, model dtype, the pool's device: this
            forward's queries, requests concatenated (``rq_metadata.qo_indptr``).
        k, v:
            ``[num_tokens, num_kv_heads * head_dim]`` (or ``[num_tokens, num_kv_heads,
            head_dim]``), model dtype: this forward's own K/V, original basis.
        layer:
            The calling `RadixAttention`; its ``layer_id`` is the KV slot
            (`layout.ModelKVShape.slot_places`, the pool's ``targets``), its ``scaling`` the
            softmax scale.
        forward_batch:
            SGLang's batch: ``out_cache_loc`` ``[num_tokens]`` (destination slots).
        save_kv_cache:
            Stage or commit ``k``/``v`` first (`RQTokenToKVPool.save`).

        Returns
        -------
        ``[num_tokens, num_qo_heads * head_dim]`` in q's dtype: each request's compressed
        history, then its own chunk, causal. The pool's extend path serves it.
        """
        return self._forward(q, k, v, layer, forward_batch, save_kv_cache, decode=False)

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
            As in `forward_extend`; request b's history is ``seq_lens[b] - 1`` tokens.

        Returns
        -------
        ``[batch_size, num_qo_heads * head_dim]`` in q's dtype. The pool's decode path serves
        it; on CUDA this call is recorded into decode CUDA graphs, so nothing here reads a
        device value on the host.
        """
        return self._forward(q, k, v, layer, forward_batch, save_kv_cache, decode=True)

    def _forward(self, q, k, v, layer, forward_batch, save_kv_cache, *, decode: bool):
        pool = self.token_to_kv_pool
        target = pool.targets[layer.layer_id]
        hq, hkv, d = layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim
        q3, k3, v3 = q.view(-1, hq, d), k.view(-1, hkv, d), v.view(-1, hkv, d)
        q3, k3, v3, out_factor = pool.prescale_attention(layer.layer_id, q3, k3, v3,
                                                         calibrate=not decode)
        if save_kv_cache:
            pool.save(layer.layer_id, k3, v3, forward_batch.out_cache_loc)
        md = self.rq_metadata
        if decode:
            out = target.paths.decode.fn(q3, k3, v3, target.view, target.pos, md.kv_indptr,
                                         md.kv_indices, sm_scale=layer.scaling)
        else:
            out = target.paths.extend.fn(q3, k3, v3, target.view, target.pos, md.qo_indptr,
                                         md.kv_indptr, md.kv_indices, sm_scale=layer.scaling,
                                         host_indptrs=md.host_indptrs)
        if out_factor is not None:
            out = out.view(-1, hq, d) * out_factor
        self._count_nonfinite_once(out, layer.layer_id)
        return out.reshape(q.shape[0], hq * d)

    def _count_nonfinite_once(self, out: torch.Tensor, slot: int) -> None:
        """Count non-finite rows of ``out`` at the last KV slot (last layer, last loop), once per
        forward (NaN/Inf upstream has reached there). One reduction and host sync, so never
        inside a CUDA-graph capture (a replayed step is not checked)."""
        if slot != self.token_to_kv_pool.layer_num - 1:
            return
        if out.is_cuda and torch.cuda.is_current_stream_capturing():
            return
        metrics.count_nonfinite(out)
