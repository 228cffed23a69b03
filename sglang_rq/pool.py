"""The ResidualQuant KV pool: a subclass of SGLang's `MHATokenToKVPool`.

Storage (``rows = size + page_size``; row = token slot, row 0 is SGLang's padding slot;
``L`` physical layers, ``H`` KV heads, ``D`` head_dim, ``g`` group size; one buffer per kind and
loop, each viewed per physical layer, so one compressed row of a layer holds every loop):

* ``rq_codes[i]``  ``[L, rows, 2, H, code_bytes_i]`` uint8 — packed codes of loop i (K, V),
* ``rq_meta[i]``   ``[L, rows, 2, H, D/g, 2]`` uint8 — FP8 e4m3fn (scale, offset), quantized loops,
* ``rq_coef[i]``   ``[L, rows, 2, H]`` bf16 — least-squares coefficient c_i, residual loops,
* ``rq_staging``   ``[G-1, L, staging_tokens, 2, H, D]`` model dtype — the in-flight K/V of the
  earlier loops of the current forward (G = loops per anchor group), committed when the group's
  last loop reaches the layer,
* ``rq_rotation``  ``[L, H, D, D]`` fp32 or None.

The byte sizes come from `layout.loop_segments`; the allocation equals
``layout.kv_bytes_per_token * rows`` (tested). Staging and rotation are fixed overhead charged
in the pool configurator (see `plugin.py`), and a forward larger than ``staging_tokens`` is an
error, never an overflow. What serves commit, decode and extend (kernels or PyTorch twins) is
resolved once here, ``kernel_paths`` (`sglang_rq.dispatch`), and read by the backends.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

from rq_kernels.view import CompressedLayerView
from sglang_rq import dispatch, metrics
from sglang_rq.clipping import ClipCounter
from sglang_rq.config import RQConfig
from sglang_rq.layout import (
    ModelKVShape,
    bf16_bytes_per_token,
    kv_bytes_per_token,
    loop_segments,
    staged_loops,
)
from sglang_rq.reference import dequantize_rows_reference
from sglang_rq.rotation import build_rotation

logger = logging.getLogger(__name__)


class RQTokenToKVPool(MHATokenToKVPool):
    """Compressed KV pool for looped models (DESIGN.md sections 1 and 3).

    Built by SGLang with the in-tree keyword arguments (``layer_num = num_layers * num_loops``);
    the KV format is bound as class attributes by `bind_pool_class`.

    Note
    ----
    SGLang's dense accessors (``get_key_buffer``, ``set_kv_buffer``) raise: only the RQ
    attention backends read and write this pool, through `save` and `dequantize`.
    """

    rq_cfg: RQConfig
    rq_shape: ModelKVShape
    rq_staging_tokens: int
    rq_kernels: dispatch.KernelRequest = dispatch.KernelRequest()
    kernel_paths: dispatch.KernelPaths

    # ------------------------------------------------------------------ allocation
    def _create_buffers(self) -> None:
        shape, cfg = self.rq_shape, self.rq_cfg
        if self.layer_num != shape.num_layers * shape.num_loops:
            raise RuntimeError(
                f"RQ pool got layer_num={self.layer_num}, expected {shape.num_layers} layers x "
                f"{shape.num_loops} loops (pipeline parallelism is not supported with ResidualQuant)")
        self.use_hnd, self.kv_cache_layout = False, "nhd"
        rows, n_layers = self.size + self.page_size, shape.num_layers
        h, d = shape.num_kv_heads, shape.head_dim
        self.segments = loop_segments(shape, cfg)
        dev = self.device
        self.rq_codes = [torch.zeros((n_layers, rows, 2, h, s.code_bytes), dtype=torch.uint8, device=dev)
                         for s in self.segments]
        self.rq_meta = [torch.zeros((n_layers, rows, 2, h, d // cfg.group_size, 2), dtype=torch.uint8,
                                    device=dev) if s.meta_bytes else None for s in self.segments]
        self.rq_coef = [torch.zeros((n_layers, rows, 2, h), dtype=torch.bfloat16, device=dev)
                        if s.coef_bytes else None for s in self.segments]
        self.rq_staging = torch.zeros((staged_loops(shape, cfg), n_layers, self.rq_staging_tokens, 2, h, d),
                                      dtype=self.dtype, device=dev)
        rot = build_rotation(cfg, num_layers=n_layers, num_kv_heads=h, head_dim=d)
        self.rq_rotation = None if rot is None else rot.to(dev)
        self.group_len = cfg.group_len(shape.num_loops)
        self.rq_clip = ClipCounter(num_layers=n_layers, num_loops=shape.num_loops, device=dev)
        self.group_views = [[self._group_view(layer, grp) for grp in range(shape.num_loops // self.group_len)]
                            for layer in range(n_layers)]
        self.kernel_paths = dispatch.resolve(self.group_views[0][0], device=dev,
                                             request=self.rq_kernels)
        # Tiny placeholders keep SGLang code that walks k_buffer/v_buffer pointer tables working.
        self.k_buffer = [torch.zeros((self.page_size, h, d), dtype=self.store_dtype, device=dev)
                         for _ in range(self.layer_num)]
        self.v_buffer = [torch.zeros((self.page_size, h, d), dtype=self.store_dtype, device=dev)
                         for _ in range(self.layer_num)]
        self._kv_buffer_descs = []
        self._init_data_ptrs_and_strides()

    def _group_view(self, layer: int, grp: int) -> CompressedLayerView:
        """The view of physical ``layer`` restricted to loop group ``grp``, loop ids re-based to 0."""
        start, n = grp * self.group_len, self.group_len
        segs = tuple(dataclasses.replace(s, loop_id=s.loop_id - start, base=s.base - start)
                     for s in self.segments[start:start + n])

        def pick(bufs):
            return [None if b is None else b[layer] for b in bufs[start:start + n]]

        return CompressedLayerView(
            codes=pick(self.rq_codes), meta=pick(self.rq_meta), coef=pick(self.rq_coef),
            rotation=None if self.rq_rotation is None else self.rq_rotation[layer],
            segments=segs, cfg=self.rq_cfg, head_dim=self.rq_shape.head_dim)

    def rq_buffers(self) -> list[torch.Tensor]:
        """Every compressed buffer (codes, meta, coef), for byte accounting and row moves."""
        return [b for bufs in (self.rq_codes, self.rq_meta, self.rq_coef) for b in bufs if b is not None]

    def compressed_nbytes(self) -> int:
        """Bytes of the compressed buffers (== kv_bytes_per_token * rows)."""
        return sum(b.numel() * b.element_size() for b in self.rq_buffers())

    def fixed_nbytes(self) -> int:
        """Bytes of staging and rotation (the declared fixed overhead)."""
        rot = 0 if self.rq_rotation is None else self.rq_rotation.numel() * 4
        return self.rq_staging.numel() * self.rq_staging.element_size() + rot

    def _finalize_allocation_log(self, num_tokens: int) -> None:
        per_tok = kv_bytes_per_token(self.rq_shape, self.rq_cfg)
        bf16 = bf16_bytes_per_token(self.rq_shape)
        self.mem_usage = (self.compressed_nbytes() + self.fixed_nbytes()) / (1 << 30)
        logger.info(
            "ResidualQuant KV cache allocated: #tokens %d, %d B/token (BF16 %d B, %.2fx smaller), "
            "compressed %.3f GB, staging %d tokens %.3f GB, format: %s",
            num_tokens, per_tok, bf16, bf16 / per_tok, self.compressed_nbytes() / (1 << 30),
            self.rq_staging_tokens, self.fixed_nbytes() / (1 << 30), self.rq_cfg.describe())
        metrics.publish_kv_format(
            cfg=self.rq_cfg, shape=self.rq_shape, page_size=self.page_size,
            staging_tokens=self.rq_staging_tokens, pool_tokens=num_tokens,
            pool_bytes=self.compressed_nbytes(), dtype_bytes=self.rq_staging.element_size())
        self.kernel_paths.log()
        metrics.publish_kernel_paths(self.kernel_paths.rows())

    def get_kv_size_bytes(self):
        total = self.compressed_nbytes()
        return total // 2, total - total // 2

    # ------------------------------------------------------------------ write path
    def save(self, loop: int, layer: int, k: torch.Tensor, v: torch.Tensor,
             loc: torch.Tensor) -> None:
        """Stage (earlier loops) or commit (last loop of the group) the forward's K/V.

        Parameters
        ----------
        loop, layer: loop index and physical layer index of the calling attention.
        k, v: ``[num_tokens, num_kv_heads, head_dim]`` model dtype, this forward's tokens.
        loc: ``[num_tokens]`` int64 destination slots (``forward_batch.out_cache_loc``).

        Raises
        ------
        RuntimeError
            If the forward has more tokens than the staging buffer (``--rq-staging-tokens``).
        """
        n = k.shape[0]
        if n > self.rq_staging_tokens:
            raise RuntimeError(
                f"forward of {n} tokens exceeds the ResidualQuant staging buffer of "
                f"{self.rq_staging_tokens} tokens; lower --chunked-prefill-size/--max-prefill-tokens "
                "or raise --rq-staging-tokens")
        grp, pos = divmod(loop, self.group_len)
        if pos < self.group_len - 1:
            self.rq_staging[pos, layer, :n, 0].copy_(k)
            self.rq_staging[pos, layer, :n, 1].copy_(v)
            return
        staged = self.rq_staging[:, layer, :n]  # [G-1, n, 2, H, D]
        k_loops = torch.cat([staged[:, :, 0], k.unsqueeze(0).to(staged.dtype)], dim=0)
        v_loops = torch.cat([staged[:, :, 1], v.unsqueeze(0).to(staged.dtype)], dim=0)
        view = self.group_views[layer][grp]
        self.kernel_paths.commit.fn(k_loops, v_loops, loc, view)
        for i, meta in enumerate(view.meta):  # FP8 fields at +-448: clipped groups
            if meta is not None:
                self.rq_clip.add(layer=layer, loop=grp * self.group_len + i, meta_rows=meta[loc])
        last = layer == self.rq_shape.num_layers - 1 and grp == len(self.group_views[layer]) - 1
        if last and not loc.is_cuda:
            self.rq_clip.flush(force=True)  # CPU: no sync to avoid; publish at once
        # NOTE: committed tokens and twin-served forwards are counted by the backends'
        # per-forward hooks, which also run on CUDA-graph replays (this body does not).

    # ------------------------------------------------------------------ read path
    def dequantize(self, loop: int, layer: int, slots: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Reconstructed K and V of ``loop`` at ``slots`` (``[n]`` int64): 2x ``[n, H, D]`` fp32."""
        grp, pos = divmod(loop, self.group_len)
        return dequantize_rows_reference(self.group_views[layer][grp], slots, pos)

    # ------------------------------------------------------------------ SGLang pool API
    def _dense_access(self, *_args, **_kwargs):
        raise RuntimeError(
            "the ResidualQuant KV pool has no dense K/V buffers; it is read and written only by the "
            "rq attention backends (a feature that bypasses them is not supported with ResidualQuant; "
            "run with --rq-disable)")

    set_kv_buffer = _dense_access
    get_key_buffer = _dense_access
    get_value_buffer = _dense_access
    get_kv_buffer = _dense_access

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Copy compressed rows ``src_loc`` to ``tgt_loc`` for every layer and loop."""
        for b in self.rq_buffers():
            b[:, tgt_loc] = b[:, src_loc]

    def get_cpu_copy(self, indices, mamba_indices=None, req_pool_index=None):
        """Compressed rows ``indices`` of every buffer, on the CPU (retraction offload)."""
        return [b[:, indices].to("cpu") for b in self.rq_buffers()]

    def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None, req_pool_index=None):
        """Inverse of `get_cpu_copy`."""
        for b, cpu in zip(self.rq_buffers(), kv_cache_cpu, strict=True):
            b[:, indices] = cpu.to(b.device)


def bind_pool_class(*, cfg: RQConfig, shape: ModelKVShape, staging_tokens: int,
                    kernels: dispatch.KernelRequest = dispatch.KernelRequest()
                    ) -> type[RQTokenToKVPool]:
    """A `RQTokenToKVPool` subclass with the KV format bound (SGLang builds pools by class);
    ``kernels`` is what `dispatch.resolve` is asked for when the pool is built."""
    return type("BoundRQTokenToKVPool", (RQTokenToKVPool,), {
        "rq_cfg": cfg, "rq_shape": shape, "rq_staging_tokens": staging_tokens,
        "rq_kernels": kernels})
