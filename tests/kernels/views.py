"""A standalone `CompressedLayerView` for kernel tests and benchmarks (`make_view`).

The real pool (``sglang_rq.pool``) hands the kernels views into its big buffers; this module
allocates one layer with the same per-loop shapes from an `RQConfig`, so that the kernels can be
exercised alone. It lives with the tests because it needs the serving package's config, layout
and rotation, which the kernel package does not import.
"""

from __future__ import annotations

import torch

from rq_kernels.view import CompressedLayerView
from sglang_rq.config import RQConfig
from sglang_rq.layout import ModelKVShape, loop_segments
from sglang_rq.rotation import hadamard_matrix


def make_view(cfg: RQConfig, *, num_loops: int, num_kv_heads: int, head_dim: int, rows: int,
              rotation: str | torch.Tensor | None = "cfg", device: str | torch.device = "cpu",
              fill: bool = True, seed: int = 0, head_major: bool = False
              ) -> CompressedLayerView:
    """One layer's compressed buffers (``rows`` slots), optionally filled with random bytes.

    ``rotation``: ``"cfg"`` builds the normalised Hadamard when ``cfg.rotation != "none"``; a
    tensor ``[num_kv_heads, head_dim, head_dim]`` is used as is; None means no rotation.
    ``head_major``: allocate codes/scale_offset as ``[2, H, rows, ...]`` and return the same logical
    ``[rows, 2, H, ...]`` views (each head's rows contiguous; an alternative pool layout).
    """
    shape = ModelKVShape(num_layers=1, num_loops=num_loops, num_kv_heads=num_kv_heads,
                         head_dim=head_dim)
    segs = loop_segments(shape, cfg)
    ng = head_dim // cfg.group_size
    gen = torch.Generator().manual_seed(seed)
    codes, scale_offset, coef = [], [], []
    for s in segs:
        shp = (rows, 2, num_kv_heads, s.code_bytes)
        c = (torch.randint(0, 256, shp, generator=gen, dtype=torch.uint8) if fill
             else torch.zeros(shp, dtype=torch.uint8, device=device))
        if head_major:
            c = c.permute(1, 2, 0, 3).contiguous().permute(2, 0, 1, 3)
        codes.append(c.to(device))
        m = None
        if s.scale_offset_bytes:
            m = torch.zeros(2, num_kv_heads, rows, ng, 2, dtype=torch.uint8, device=device)
            m = m.permute(2, 0, 1, 3, 4) if head_major else m.permute(2, 0, 1, 3, 4).contiguous()
        scale_offset.append(m)
        coef.append(torch.zeros(rows, 2, num_kv_heads, dtype=torch.bfloat16, device=device)
                    if s.coef_bytes else None)
    if isinstance(rotation, str):
        rot = (None if cfg.rotation == "none"
               else hadamard_matrix(head_dim).expand(num_kv_heads, head_dim, head_dim).contiguous())
    else:
        rot = rotation
    if rot is not None:
        rot = rot.to(device=device, dtype=torch.float32).contiguous()
    return CompressedLayerView(codes=codes, scale_offset=scale_offset, coef=coef, rotation=rot,
                               segments=segs, cfg=cfg, head_dim=head_dim)
