"""The ResidualQuant KV pool: a subclass of SGLang's `MHATokenToKVPool`.

Storage, per stack of `layout.kv_stacks` (``stacks["looped"]``, and ``stacks["unlooped"]`` for
Huginn's prelude and coda: one loop, no staging), a `StackBuffers` (``rows = size + page_size``;
row = token slot, row 0 is SGLang's padding slot; ``L`` layers of the stack, ``H`` KV heads,
``D`` head_dim, ``g`` group size; one buffer per kind and loop, each viewed per layer, so one
compressed row of a layer holds every loop):

* ``codes[i]``  ``[L, rows, 2, H, code_bytes_i]`` uint8 — packed codes of loop i (K, V),
* ``scale_offset[i]``  ``[L, rows, 2, H, D/g, 2]`` uint8 — FP8 e4m3fn (scale, offset),
  quantized loops; token-major like every buffer here: a slot's bytes are together, so a
  decode tile over scattered slots (page size 1 after churn) costs what it costs over
  consecutive ones (docs/kernels.md, "Pool layout"),
* ``coef[i]``   ``[L, rows, 2, H]`` bf16 — least-squares coefficient c_i, residual loops,
* ``staging``   ``[G-1, L, staging_tokens, 2, H, D]`` model dtype — the in-flight K/V of the
  earlier loops of the current forward (G = loops per anchor group), committed when the group's
  last loop reaches the layer; a forward of at most ``staging_tokens / 2`` tokens (a decode
  step) parks the last loop's K/V in the last staged loop's final rows instead, and the
  group's last loop at the stack's last layer commits every layer in one launch
  (`rq_kernels.commit_layers`: one launch per step instead of one per layer),
* ``rotation``  ``[L, H, D, D]`` fp32 or None.

``targets`` maps every SGLang layer id (slot, `layout.ModelKVShape.slot_places`) to its stack,
loop group view and loop position.

The byte sizes come from `layout.kv_stacks`; the allocation equals
``layout.kv_bytes_per_token * rows`` (tested). Staging and rotation are fixed overhead charged
in the pool configurator (see `plugin.py`), and a forward larger than ``staging_tokens`` is an
error, never an overflow. What serves commit, decode and extend (kernels or PyTorch twins) is
resolved once here per stack, ``StackBuffers.kernel_paths`` (`sglang_rq.dispatch`), and read by
the backends through ``targets``.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

from rq_kernels import prepare_layers, stage_kv
from rq_kernels.decode_tc import reserve_merge_counters
from rq_kernels.view import CompressedLayerView
from sglang_rq import dispatch, metrics
from sglang_rq.clipping import ClipCounter
from sglang_rq.config import RQConfig
from sglang_rq.prescale import Prescale
from sglang_rq.layout import (
    KVStack,
    ModelKVShape,
    bf16_bytes_per_token,
    kv_bytes_per_token,
    kv_stacks,
)
from sglang_rq.reference import dequantize_rows_reference
from sglang_rq.rotation import build_rotation

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class StackBuffers:
    """The buffers of one `layout.KVStack` (module docstring), its loop-group views
    ``group_views[layer][group]`` and the implementations serving it (`dispatch.resolve`)."""

    stack: KVStack
    codes: list[torch.Tensor]
    scale_offset: list[torch.Tensor | None]
    coef: list[torch.Tensor | None]
    staging: torch.Tensor
    rotation: torch.Tensor | None
    group_len: int
    group_views: list[list[CompressedLayerView]] = dataclasses.field(default_factory=list)
    kernel_paths: dispatch.KernelPaths | None = None
    blocks: torch.Tensor | None = None  # [L] int64: each stack layer's physical layer (block)

    @classmethod
    def allocate(cls, stack: KVStack, *, rows: int, staging_tokens: int, dtype: torch.dtype,
                 device: torch.device | str) -> StackBuffers:
        shape, cfg, segs = stack.shape, stack.cfg, stack.segments
        n, h, d = shape.num_layers, shape.num_kv_heads, shape.head_dim
        group_len = cfg.group_len(shape.num_loops)
        rot = build_rotation(cfg, num_layers=n, num_kv_heads=h, head_dim=d)
        bufs = cls(
            stack=stack,
            codes=[torch.zeros((n, rows, 2, h, s.code_bytes), dtype=torch.uint8, device=device)
                   for s in segs],
            scale_offset=[torch.zeros((n, rows, 2, h, d // cfg.group_size, 2), dtype=torch.uint8,
                                      device=device) if s.scale_offset_bytes else None
                          for s in segs],
            coef=[torch.zeros((n, rows, 2, h), dtype=torch.bfloat16, device=device)
                  if s.coef_bytes else None for s in segs],
            staging=torch.zeros((group_len - 1, n, staging_tokens, 2, h, d),
                                dtype=dtype, device=device),
            rotation=None if rot is None else rot.to(device), group_len=group_len)
        bufs.group_views = [[bufs._group_view(layer, grp) for grp in range(shape.num_loops // group_len)]
                            for layer in range(n)]
        return bufs

    def _group_view(self, layer: int, grp: int) -> CompressedLayerView:
        """The view of ``layer`` restricted to loop group ``grp``, loop ids re-based to 0."""
        start, n = grp * self.group_len, self.group_len
        segs = tuple(dataclasses.replace(s, loop_id=s.loop_id - start, base=s.base - start)
                     for s in self.stack.segments[start:start + n])

        def pick(bufs):
            return [None if b is None else b[layer] for b in bufs[start:start + n]]

        return CompressedLayerView(
            codes=pick(self.codes), scale_offset=pick(self.scale_offset), coef=pick(self.coef),
            rotation=None if self.rotation is None else self.rotation[layer],
            segments=segs, cfg=self.stack.cfg, head_dim=self.stack.shape.head_dim)

    def buffers(self) -> list[torch.Tensor]:
        return [b for bufs in (self.codes, self.scale_offset, self.coef) for b in bufs
                if b is not None]

    def layer_views(self, grp: int) -> list[CompressedLayerView]:
        """Loop group ``grp``'s view of every layer, layer order (`rq_kernels.commit_layers`)."""
        return [views[grp] for views in self.group_views]


@dataclasses.dataclass(frozen=True)
class SlotTarget:
    """What one SGLang layer id (slot) reads and writes: its stack's buffers, the ``layer``
    in that stack, the loop group ``view``, the loop position ``pos`` in the group, the
    physical ``block`` (metrics label) and the loop index ``loop`` in the stack."""

    bufs: StackBuffers
    layer: int
    loop: int
    pos: int
    block: int
    view: CompressedLayerView

    @property
    def paths(self) -> dispatch.KernelPaths:
        """What serves commit, decode and extend for this slot."""
        return self.bufs.kernel_paths


class RQTokenToKVPool(MHATokenToKVPool):
    """Compressed KV pool for looped models (DESIGN.md sections 1 and 3).

    Built by SGLang with the in-tree keyword arguments (``layer_num`` = the model's KV slots,
    `layout.ModelKVShape.num_slots`); the KV format is bound as class attributes by
    `bind_pool_class`.

    Note
    ----
    SGLang's dense accessors (``get_key_buffer``, ``set_kv_buffer``) raise: only the RQ
    attention backends read and write this pool, through `save`, ``targets`` and `dequantize`.
    """

    rq_cfg: RQConfig
    rq_shape: ModelKVShape
    rq_staging_tokens: int
    rq_kernels: dispatch.KernelRequest = dispatch.KernelRequest()

    # ------------------------------------------------------------------ allocation
    def _create_buffers(self) -> None:
        shape, cfg = self.rq_shape, self.rq_cfg
        if self.layer_num != shape.num_slots:
            raise RuntimeError(
                f"RQ pool got layer_num={self.layer_num}, expected {shape.num_slots} KV slots "
                f"({shape.num_layers} layers x {shape.num_loops} loops + {shape.unlooped_layers} "
                "un-looped; pipeline parallelism is not supported with ResidualQuant)")
        self.use_hnd, self.kv_cache_layout = False, "nhd"
        rows, dev = self.size + self.page_size, self.device
        h, d = shape.num_kv_heads, shape.head_dim
        self.stacks = {st.name: StackBuffers.allocate(st, rows=rows, staging_tokens=self.rq_staging_tokens,
                                                      dtype=self.dtype, device=dev)
                       for st in kv_stacks(shape, cfg)}
        for bufs in self.stacks.values():
            bufs.kernel_paths = dispatch.resolve(bufs.group_views[0][0], device=dev,
                                                 request=self.rq_kernels)
            if any(p.impl.startswith("triton") for p in bufs.kernel_paths):
                for grp in range(len(bufs.group_views[0])):  # the kernels' rotation form, once,
                    prepare_layers(bufs.layer_views(grp))    # before capture
        if torch.device(dev).type == "cuda":
            reserve_merge_counters(dev)  # the tc decode's fused merge, before capture
        self.targets = []
        blocks: dict[str, dict[int, int]] = {name: {} for name in self.stacks}
        for place in shape.slot_places():
            bufs = self.stacks[place.stack]
            grp, pos = divmod(place.loop, bufs.group_len)
            self.targets.append(SlotTarget(bufs=bufs, layer=place.layer, loop=place.loop, pos=pos,
                                           block=place.block, view=bufs.group_views[place.layer][grp]))
            blocks[place.stack][place.layer] = place.block
        for name, bufs in self.stacks.items():
            assert sorted(blocks[name]) == list(range(bufs.stack.shape.num_layers)), name
            bufs.blocks = torch.tensor([blocks[name][i] for i in sorted(blocks[name])],
                                       dtype=torch.int64, device=dev)
        self.rq_clip = ClipCounter(num_layers=shape.num_layers + shape.unlooped_layers,
                                   num_loops=shape.num_loops, device=dev)
        self.prescale = (Prescale(num_blocks=shape.num_layers + shape.unlooped_layers,
                                  num_kv_heads=h, device=dev) if cfg.prescale else None)
        # Tiny placeholders keep SGLang code that walks k_buffer/v_buffer pointer tables working.
        self.k_buffer = [torch.zeros((self.page_size, h, d), dtype=self.store_dtype, device=dev)
                         for _ in range(self.layer_num)]
        self.v_buffer = [torch.zeros((self.page_size, h, d), dtype=self.store_dtype, device=dev)
                         for _ in range(self.layer_num)]
        self._kv_buffer_descs = []
        self._init_data_ptrs_and_strides()

    def rq_buffers(self) -> list[torch.Tensor]:
        """Every compressed buffer (codes, scale_offset, coef) of every stack, for byte accounting
        and row moves."""
        return [b for bufs in self.stacks.values() for b in bufs.buffers()]

    def compressed_nbytes(self) -> int:
        """Bytes of the compressed buffers (== kv_bytes_per_token * rows)."""
        return sum(b.numel() * b.element_size() for b in self.rq_buffers())

    def fixed_nbytes(self) -> int:
        """Bytes of staging and rotation (the declared fixed overhead)."""
        return sum(b.staging.numel() * b.staging.element_size()
                   + (0 if b.rotation is None else b.rotation.numel() * 4)
                   for b in self.stacks.values())

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
            pool_bytes=self.compressed_nbytes(), dtype_bytes=self.dtype.itemsize)
        rows = []
        for bufs in self.stacks.values():
            bufs.kernel_paths.log(bufs.stack.label_prefix)
            rows += bufs.kernel_paths.rows(bufs.stack.label_prefix)
        metrics.publish_kernel_paths(rows)

    def count_forward(self, *, decode: bool) -> None:
        """`dispatch.KernelPaths.count_forward` of every stack (a backend's per-forward hook)."""
        for bufs in self.stacks.values():
            bufs.kernel_paths.count_forward(decode=decode, prefix=bufs.stack.label_prefix)

    def get_kv_size_bytes(self):
        total = self.compressed_nbytes()
        return total // 2, total - total // 2

    # ------------------------------------------------------------------ write path
    def save(self, slot: int, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor) -> None:
        """Stage (earlier loops of a group) or commit (the group's last loop; an un-looped
        layer at once) the forward's K/V of SGLang layer id ``slot``. A forward of at most
        ``staging_tokens / 2`` tokens stages the group's last loop too and commits all layers
        at the stack's last layer (module docstring): the attention never reads the forward's
        own rows from the pool (its history excludes the in-flight tokens), so a commit may
        come any time before the next forward.

        Parameters
        ----------
        slot: the calling attention's ``layer_id`` (`layout.ModelKVShape.slot_places`).
        k, v: ``[num_tokens, num_kv_heads, head_dim]`` model dtype, this forward's tokens, as
            stored: divided by the slot's prescale (`prescale_attention`).
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
        t = self.targets[slot]
        bufs, layer = t.bufs, t.layer
        s_tok = self.rq_staging_tokens
        if t.pos < bufs.group_len - 1:  # [n, 2, H, D], contiguous: one launch writes K and V
            stage_kv(k, v, bufs.staging[t.pos, layer, :n])
            return
        if bufs.group_len > 1 and 2 * n <= s_tok:
            # the group's last loop waits at the end of the last staged loop's rows, and the
            # stack's last layer commits every layer in one launch (slots run layer-fastest)
            stage_kv(k, v, bufs.staging[-1, layer, s_tok - n:])
            if layer == bufs.stack.shape.num_layers - 1:
                staged = bufs.staging[:, :, :n]  # [G-1, L, n, 2, H, D]
                last = bufs.staging[-1, :, s_tok - n:]  # [L, n, 2, H, D]
                t.paths.commit.fn_layers([*staged[:, :, :, 0], last[:, :, 0]],
                                         [*staged[:, :, :, 1], last[:, :, 1]], loc,
                                         bufs.layer_views(t.loop // bufs.group_len))
        else:
            staged = bufs.staging[:, layer, :n]  # [G-1, n, 2, H, D]; the commit reads it in place
            dt = staged.dtype
            t.paths.commit.fn([*staged[:, :, 0], k.to(dt)], [*staged[:, :, 1], v.to(dt)], loc,
                              t.view)
        if slot == self.layer_num - 1:  # the forward's last call: every layer has committed
            self._count_clipped(loc)
        # NOTE: committed tokens and twin-served forwards are counted by the backends'
        # per-forward hooks, which also run on CUDA-graph replays (this body does not).

    def _count_clipped(self, loc: torch.Tensor) -> None:
        """Count the FP8 fields at +-448 (clipped groups) of the forward's tokens ``loc``, every
        layer and loop at once: a few tensor ops per stack and loop, not per layer (on the
        H200 the per-layer count was ~670 small launches per prefill chunk of Ouro-1.4B)."""
        for bufs in self.stacks.values():
            for loop, scale_offset in enumerate(bufs.scale_offset):
                if scale_offset is not None:
                    self.rq_clip.add(layers=bufs.blocks, loop=loop,
                                     scale_offset_rows=scale_offset[:, loc])
        if not loc.is_cuda:
            self.rq_clip.flush(force=True)  # CPU: no sync to avoid; publish at once

    def prescale_attention(self, slot: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           *, calibrate: bool
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """`Prescale.apply` of ``slot``'s layer (calibrated first when ``calibrate``: an extend
        forward): ``(q, k, v, out_factor)`` for the save and the attention call; the output is
        multiplied by ``out_factor`` unless it is None (no prescale)."""
        if self.prescale is None:
            return q, k, v, None
        block = self.targets[slot].block
        if calibrate:
            self.prescale.calibrate(block, k, v)
        return self.prescale.apply(block, q, k, v)

    # ------------------------------------------------------------------ read path
    def dequantize(self, slot: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reconstructed K and V of SGLang layer id ``slot`` at pool rows ``rows`` (``[n]``
        int64): 2x ``[n, H, D]`` fp32."""
        t = self.targets[slot]
        k, v = dequantize_rows_reference(t.view, rows, t.pos)
        return (k, v) if self.prescale is None else self.prescale.restore(t.block, k, v)

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
