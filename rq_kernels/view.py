"""The kernels' argument types: one layer's compressed KV buffers and the format they hold.

A leaf module (torch and the standard library only). The serving package builds these views
into its pool (`sglang_rq.pool`), the codec (`sglang_rq.reference`) and every launcher of
`rq_kernels` read them; nothing here imports the serving package. The format is described by
what the kernels read of it, as two protocols: `LoopFormat` (how one loop is stored;
`sglang_rq.layout.LoopSegment` is one) and `KVFormat` (the format-wide choices;
`sglang_rq.config.RQConfig` is one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


class LoopFormat(Protocol):
    """How one loop is stored, per (token, K-or-V, KV head): ``role`` is ``anchor`` (stored on
    its own), ``residual`` (``c * base + R^T deq(r')`` against loop ``base``) or ``shared`` (0
    bits: ``c * base``); ``bits`` of its codes (16: BF16 values), ``code_bytes`` of packed codes.
    """

    @property
    def loop_id(self) -> int: ...

    @property
    def role(self) -> str: ...

    @property
    def bits(self) -> int: ...

    @property
    def base(self) -> int: ...

    @property
    def code_bytes(self) -> int: ...


class KVFormat(Protocol):
    """The format-wide choices the kernels read: ``group_size`` (elements per FP8 scale/offset
    group along head_dim), ``anchor`` (``last``/``first``/chained), ``lsq`` (a BF16 coefficient
    per residual loop), ``rotate_anchor`` (the anchor quantized in the rotated basis too) and
    ``group_len(num_loops)`` (loops per anchor group)."""

    @property
    def group_size(self) -> int: ...

    @property
    def anchor(self) -> str: ...

    @property
    def lsq(self) -> bool: ...

    @property
    def rotate_anchor(self) -> bool: ...

    def group_len(self, num_loops: int) -> int: ...


@dataclass
class CompressedLayerView:
    """One physical layer's compressed KV buffers (views into the pool's per-kind buffers).

    Per loop ``i``: ``codes[i]`` ``[rows, 2, num_kv_heads, code_bytes_i]`` uint8 (index 1: 0 = K,
    1 = V), ``scale_offset[i]`` ``[rows, 2, num_kv_heads, D/g, 2]`` uint8 FP8 (scale, offset) or
    None, ``coef[i]`` ``[rows, 2, num_kv_heads]`` bf16 or None. ``rotation``
    ``[num_kv_heads, D, D]`` float32 (on the pool's device) or None. ``rows = pool size +
    page_size``; row 0 is SGLang's padding slot. ``segments[i]`` says how loop ``i`` is stored,
    ``cfg`` the format-wide choices.

    A view's tensors are fixed for its life (their contents change, never which tensors they
    are): the launchers check them and build their arguments once per view (``launch_cache``).
    A view over other tensors is a new view.
    """

    codes: list[torch.Tensor]
    scale_offset: list[torch.Tensor | None]
    coef: list[torch.Tensor | None]
    rotation: torch.Tensor | None
    segments: tuple[LoopFormat, ...]
    cfg: KVFormat
    head_dim: int
    kernel_rotation: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    """The rotation in the kernels' form, built once (`rq_kernels.prepare_view`), keyed by
    padded head_dim and device."""
    launch_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    """Host-side launch decisions that depend only on the view (whether the CUDA split kernel
    serves a loop, that its tensors passed `rq_kernels._host.check_view` on a device), made
    once per key by the launchers. Neither cache is passed on by ``dataclasses.replace``: a
    view with other tensors starts empty."""

    def rotation_cpu(self, like: torch.Tensor) -> torch.Tensor | None:
        """The rotation on ``like``'s device."""
        return None if self.rotation is None else self.rotation.to(like.device)
