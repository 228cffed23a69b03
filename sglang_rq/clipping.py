"""Saturated FP8 fields at commit: counted per layer, first occurrence logged (issue 13 item 2).

The FP8 e4m3fn offset and scale of a quantized group cannot leave ``[-448, 448]``, so a group
whose values reach below -448, or whose range exceeds ``448 * (2^bits - 1)``, is clipped with no
error. With the Hadamard rotation one K/V outlier ``a`` in a ``head_dim``-dim head becomes
``±a / sqrt(head_dim)`` in every coordinate, so the limit is about ``448 * sqrt(head_dim)``
(5,068 for head_dim 128).

A group is counted when a stored field *is at* the limit: offset byte = -448 (``0xFE``) or
scale byte = 448 (``0x7E``). The count is read from the scale_offset rows the commit has just
written, so the CPU reference codec and the Triton commit kernel are counted by the same torch
ops, without touching the kernels. Rounding the offset down and the scale up onto the FP8 grid
puts ranges in the last FP8 step (offset in ``(-448, -416)``, scale in ``(416, 448]``) at the
limit too: those groups are counted one step early, not yet clipped.

`ClipCounter` keeps a device ``int64 [num_layers, num_loops]`` tensor, added to by tensor ops
only (no host sync, CUDA-graph safe: shapes are fixed by ``loc``); `ClipCounter.flush` reads it
at most once per `FLUSH_INTERVAL_S`, outside graph capture, from the backends' per-forward host
hooks, and feeds ``sglang_rq_clipped_groups_total{layer}``.

SGLang runs every decode batch size eagerly a few times before capturing its CUDA graph, on dummy
inputs written to the padding slot; those warm-up commits can saturate (a layer with K outliers
does) although no request's data is involved. `ClipCounter.capture_warmup` marks them and the
first real forward's `ClipCounter.serving` discards their counts.
"""

from __future__ import annotations

import logging
import time

import torch

from sglang_rq import metrics

logger = logging.getLogger(__name__)

FP8_POS_MAX_BYTE = 0x7E  # +448 in e4m3fn
FP8_NEG_MAX_BYTE = 0xFE  # -448 in e4m3fn
FLUSH_INTERVAL_S = 1.0


def saturated(scale_offset: torch.Tensor) -> torch.Tensor:
    """``[..., D/g]`` bool: the groups of ``scale_offset`` (``[..., D/g, 2]`` uint8, FP8 e4m3fn
    (scale, offset) bytes as the pool stores them) whose scale is +448 or offset is -448."""
    return (scale_offset[..., 0] == FP8_POS_MAX_BYTE) | (scale_offset[..., 1] == FP8_NEG_MAX_BYTE)


def saturated_groups(scale_offset: torch.Tensor) -> torch.Tensor:
    """``[...]`` int64: the `saturated` groups per row of ``scale_offset`` ``[..., D/g, 2]``
    (summed over the ``D/g`` groups)."""
    return saturated(scale_offset).sum(-1, dtype=torch.int64)


class ClipCounter:
    """Saturated-group counts of one pool, per (physical layer, loop), on the pool's device."""

    def __init__(self, *, num_layers: int, num_loops: int, device: torch.device | str) -> None:
        self.counts = torch.zeros((num_layers, num_loops), dtype=torch.int64, device=device)
        self._published = [0] * num_layers
        self._logged: set[int] = set()
        self._last_flush_s = 0.0
        self._warmup = False
        metrics.init_clipped_groups(num_layers)

    def add(self, *, layers: torch.Tensor, loop: int, scale_offset_rows: torch.Tensor) -> None:
        """Count the saturated groups of freshly committed ``scale_offset_rows``
        (``[len(layers), n, 2, H, D/g, 2]``: loop ``loop`` of several layers at once, the
        physical layer of row i is ``layers[i]``, int64 on the counter's device).

        Tensor ops only (a handful per call, whatever the layer count): safe inside CUDA-graph
        capture, no host sync.
        """
        # a bool mask summed once: no int64 copy of the rows (an 8k-token forward gathers
        # ~50 MB of rows per loop for Ouro-1.4B)
        per_layer = saturated(scale_offset_rows).flatten(1).sum(1)
        self.counts[:, loop].index_add_(0, layers, per_layer)

    def capture_warmup(self) -> None:
        """The forwards until the next `serving` are CUDA-graph capture warm-ups on dummy inputs;
        their counts are discarded."""
        self._warmup = True

    def serving(self) -> None:
        """A real forward (eager or graph replay) starts: drop the capture warm-ups' counts.

        In place, so graphs that recorded ``counts`` keep counting into the same tensor.
        """
        if self._warmup:
            self.counts.zero_()
            self._warmup = False

    def flush(self, *, force: bool = False) -> list[int]:
        """Publish new counts to Prometheus and log each layer's first saturation.

        Reads the device tensor (one sync) at most once per `FLUSH_INTERVAL_S` unless
        ``force``; never during CUDA-graph capture. Returns the per-layer totals read (empty when
        skipped).
        """
        now = time.monotonic()
        if not force and now - self._last_flush_s < FLUSH_INTERVAL_S:
            return []
        if self.counts.is_cuda and torch.cuda.is_current_stream_capturing():
            return []
        self._last_flush_s = now
        per_loop = self.counts.tolist()
        totals = [sum(row) for row in per_loop]
        for layer, total in enumerate(totals):
            if total > self._published[layer]:
                metrics.count_clipped_groups(layer=layer, num=total - self._published[layer])
                self._published[layer] = total
                if layer not in self._logged:
                    self._logged.add(layer)
                    loops = [i for i, c in enumerate(per_loop[layer]) if c]
                    logger.warning(
                        "sglang-rq: K/V beyond the FP8 scale/offset range (±448) at layer %d, "
                        "loop(s) %s: %d groups saturated so far; values there are clipped "
                        "(sglang_rq_clipped_groups_total, docs/robustness.md)",
                        layer, loops, total)
        return totals


def flush_for(pool: object) -> None:
    """`ClipCounter.serving` then `ClipCounter.flush` of ``pool`` if it is a ResidualQuant pool
    (a backend's host hook before each real forward)."""
    clip = getattr(pool, "rq_clip", None)
    if clip is not None:
        clip.serving()
        clip.flush()
