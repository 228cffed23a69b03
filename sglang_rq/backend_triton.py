"""Attention backend ``rq_triton``: the fused Triton kernels over the ResidualQuant pool.

Plan once per forward: ``qo_indptr``, ``kv_indptr`` and ``kv_indices`` (every request's
compressed history/prefix rows, the in-flight tokens excluded) are built from SGLang's
``req_to_token`` table by `sglang_rq.kv_plan.plan_history` and reused by every (loop, layer)
call, as FlashInfer's plan/run split does. Each call then stages or commits the forward's K/V
(`RQTokenToKVPool.save`, the commit kernel on the last loop) and runs the pool's decode or
extend path (`sglang_rq.dispatch`, decided once: `rq_kernels.decode_attention`, whose CUDA-core
split kernel serves MHA and tensor-core split kernel GQA, `rq_kernels.extend_attention`, or the
PyTorch twin for a format the kernels do not serve).

CUDA graphs (decode), SGLang 0.5.23's contract (`AttentionBackend` docstring):
``init_cuda_graph_state`` allocates static ``kv_indptr``/``kv_indices`` for the largest batch and
context; ``init_forward_metadata_in_graph`` records the plan into them (static shapes, no host
sync); ``init_forward_metadata_out_graph`` points the per-layer calls at them. Padded rows have
``seq_len`` 1 (`get_cuda_graph_seq_len_fill_value`), so they read no history, and SGLang gives
them ``out_cache_loc`` 0, the reserved padding slot, so their commit never touches a real
request's rows. The split count is a function of the static buffer sizes, so it is fixed per
captured batch size. Decode capture is on by default on CUDA (SGLang's default); the launcher
disables prefill graphs (``--cuda-graph-backend-prefill disabled``), which this backend does not
support. Graph replay vs eager tokens: tests/gpu/test_gpu_server.py.
On CPU the kernels run only under ``TRITON_INTERPRET=1`` (used by the wiring test).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import logging
import time

import torch

from sglang_rq import metrics
from sglang_rq.backend_base import RQAttnBackend, RQForwardMetadata, host_indptr
from sglang_rq.kv_plan import kv_indices_capacity, plan_history

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

logger = logging.getLogger(__name__)


@dataclass
class RQGraphBuffers:
    """Static plan buffers shared by every captured decode batch size: ``qo_indptr``
    ``[max_bs + 1]`` int32 (0..max_bs, one query per request), ``kv_indptr`` ``[max_bs + 1]``
    int32, ``kv_indices`` ``[kv_indices_capacity(max_bs, width)]`` int64."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor


class RQTritonAttnBackend(RQAttnBackend):
    """Attention backend ``rq_triton``: device-planned index arrays (int32 indptrs), static
    buffers for decode CUDA graphs."""

    rq_graph: RQGraphBuffers | None = None

    def __init__(self, model_runner) -> None:
        super().__init__(model_runner)
        try:
            self.warm_up_prefix_path()
        except Exception as exc:  # an optimisation only: the first request compiles instead
            logger.warning("sglang-rq: prefix-path warm-up skipped (%s: %s)",
                           type(exc).__name__, exc)

    def warm_up_prefix_path(self) -> None:
        """Compile the kernels of the extend path over a compressed prefix before the first
        request needs them.

        SGLang's start-up warm-up request has no prefix and decode kernels compile during CUDA
        graph capture, so the prefix path (query rotation, reconstruct, merge: one variant per
        loop format and per class of row count) used to compile inside the first request with a
        prefix: 2.86 s against BF16's 0.69 s for a first 8k prompt on a fresh H200 (2026-12-02,
        docs/results/serving/h200_2026-12-02b_profile_server_batched.json); with this warm-up
        0.45 s against 0.63 s (`…/h200_2026-12-02d_profile_server_cold_cache.json`). Every loop
        of each stack's first view attends a 17- and a 32-row chunk to as many rows of the
        padding slot (the two classes of row count Triton specialises on; outputs discarded,
        nothing written to the pool): 4.5 s of start-up with Triton's disk cache cold,
        milliseconds with it warm."""
        pool = self.token_to_kv_pool
        if not str(pool.device).startswith("cuda"):
            return
        gq = pool.rq_kernels.qo_heads_per_kv  # the model's, as the dispatcher got it
        t0 = time.perf_counter()
        for bufs in pool.stacks.values():
            path = bufs.kernel_paths.extend
            if path.impl != "triton":
                continue
            view = bufs.group_views[0][0]
            hkv, d = view.codes[0].shape[2], view.head_dim
            dev = view.codes[0].device
            for n in (17, 32):
                q = torch.zeros(n, hkv * gq, d, dtype=torch.bfloat16, device=dev)
                k = torch.zeros(n, hkv, d, dtype=torch.bfloat16, device=dev)
                indptr = torch.tensor([0, n], dtype=torch.int32, device=dev)
                rows = torch.zeros(n, dtype=torch.int64, device=dev)  # the padding slot
                for loop in range(len(view.segments)):
                    path.fn(q, k, k, view, loop, indptr, indptr, rows, sm_scale=d ** -0.5,
                            host_indptrs=([0, n], [0, n]))
        torch.cuda.synchronize()
        logger.info("sglang-rq: prefix-path kernels warmed up in %.2f s",
                    time.perf_counter() - t0)

    def plan(self, forward_batch: ForwardBatch) -> RQForwardMetadata:
        """Eager plan: buffers sized by this forward's host-known history length
        (`plan_history` fills them on the device)."""
        if forward_batch.forward_mode.is_decode_or_idle():
            hist = forward_batch.seq_lens.to(torch.int64) - 1
            qo = torch.ones_like(hist)
            host = None
            nnz = int(forward_batch.seq_lens_sum) - forward_batch.batch_size
        else:  # the extend path needs the lengths on the host: SGLang's, no sync
            hist = forward_batch.extend_prefix_lens.to(torch.int64)
            qo = forward_batch.extend_seq_lens.to(torch.int64)
            host = (host_indptr(forward_batch.extend_seq_lens_cpu),
                    host_indptr(forward_batch.extend_prefix_lens_cpu))
            nnz = host[1][-1]
        dev = hist.device
        bs = hist.shape[0]
        kv_indptr = torch.empty(bs + 1, dtype=torch.int32, device=dev)
        kv_indices = torch.empty(nnz + 1, dtype=torch.int64, device=dev)
        plan_history(self.req_to_token_pool.req_to_token, forward_batch.req_pool_indices, hist,
                     kv_indptr, kv_indices)
        qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=dev)
        qo_indptr[1:] = torch.cumsum(qo, 0)
        return RQForwardMetadata(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                                 host_indptrs=host)

    # ------------------------------------------------------------------ CUDA graphs (decode)
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Allocate the static plan buffers (`RQGraphBuffers`) for decode graphs up to
        ``max_bs`` requests of up to ``req_to_token.shape[1]`` tokens.

        Raises
        ------
        RuntimeError
            When some layers decode through the PyTorch twin (host syncs cannot be captured).
        """
        twins = [b.kernel_paths.decode for b in self.token_to_kv_pool.stacks.values()
                 if b.kernel_paths.decode.is_twin]
        if twins:
            raise RuntimeError(
                f"rq_triton cannot capture decode CUDA graphs: decode runs the PyTorch twin "
                f"({twins[0].reason}); pass --disable-cuda-graph, or a format the kernels serve "
                "(Huginn: --rq-unlooped-bits 8)")
        if self.token_to_kv_pool.prescale is not None:  # graphs are captured unscaled
            self.token_to_kv_pool.prescale.graphs_captured(self.stop_decode_graphs)
        table = self.req_to_token_pool.req_to_token
        dev = table.device
        self.rq_graph = RQGraphBuffers(
            qo_indptr=torch.arange(max_bs + 1, dtype=torch.int32, device=dev),
            kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=dev),
            kv_indices=torch.zeros(kv_indices_capacity(max_bs, table.shape[1]), dtype=torch.int64,
                                   device=dev))

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        """Padded decode rows get ``seq_len`` 1: no history, only their (discarded) own token."""
        return 1

    def init_forward_metadata_out_graph(self, forward_batch: ForwardBatch,
                                        in_capture: bool = False) -> None:
        """Host side of a captured decode: point the layer calls at the static buffers; on a
        replay, count the committed tokens (the pool's host counter does not run in replay).

        Raises
        ------
        RuntimeError
            For a forward mode other than decode (only decode graphs are supported).
        """
        if not forward_batch.forward_mode.is_decode_or_idle():
            raise RuntimeError(f"rq_triton captures decode CUDA graphs only, got "
                               f"{forward_batch.forward_mode}; run with --cuda-graph-backend-prefill disabled")
        g = self.rq_graph
        assert g is not None, "init_cuda_graph_state was not called"
        bs = forward_batch.batch_size
        self.rq_metadata = RQForwardMetadata(qo_indptr=g.qo_indptr[:bs + 1],
                                             kv_indptr=g.kv_indptr[:bs + 1],
                                             kv_indices=g.kv_indices, host_indptrs=None)
        if in_capture:  # SGLang's warm-up runs before capture commit dummy K/V
            self.token_to_kv_pool.rq_clip.capture_warmup()
        else:
            self.count_forward(bs, decode=True)

    def init_forward_metadata_in_graph(self, forward_batch: ForwardBatch) -> None:
        """Graph-recorded part: the decode plan into the static buffers (`plan_history`)."""
        g = self.rq_graph
        plan_history(self.req_to_token_pool.req_to_token, forward_batch.req_pool_indices,
                     forward_batch.seq_lens.to(torch.int64) - 1, g.kv_indptr, g.kv_indices)

    def stop_decode_graphs(self, reason: str) -> bool:
        """Turn decode CUDA-graph replay off for the rest of this server's life (every later
        decode runs eagerly through this backend), logging ``reason``. Returns False, changing
        nothing, when SGLang 0.5.23's seam (``ModelRunner.decode_cuda_graph_runner`` with a
        ``can_run_graph(forward_batch)`` method, asked before every decode) is missing."""
        runner = getattr(self.model_runner, "decode_cuda_graph_runner", None)
        if runner is None or not callable(getattr(runner, "can_run_graph", None)):
            logger.error("sglang-rq: cannot turn decode CUDA graphs off (no "
                         "ModelRunner.decode_cuda_graph_runner.can_run_graph): %s", reason)
            return False
        runner.can_run_graph = lambda forward_batch: False
        metrics.mark_decode_graphs_stopped()
        logger.warning("sglang-rq: decode CUDA graphs turned off for this server, decode runs "
                       "eagerly from now on: %s", reason)
        return True
