"""Builders for tests and benchmarks: a standalone `CompressedLayerView` and seeded K/V data.

The real pool (``sglang_rq.pool``) hands the kernels views into its big buffers; this module
allocates one layer with the same per-loop shapes so that the kernels can be exercised alone.
"""

from __future__ import annotations

import torch

from sglang_rq.config import RQConfig
from sglang_rq.layout import ModelKVShape, loop_segments
from sglang_rq.reference import CompressedLayerView
from sglang_rq.rotation import hadamard_matrix


def random_orthogonal(num_kv_heads: int, head_dim: int, *, seed: int) -> torch.Tensor:
    """Seeded random orthogonal matrices ``[num_kv_heads, head_dim, head_dim]`` fp32 (QR)."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(num_kv_heads, head_dim, head_dim, generator=gen, dtype=torch.float64)
    qm, rm = torch.linalg.qr(a)
    qm = qm * torch.sign(torch.diagonal(rm, dim1=-2, dim2=-1)).unsqueeze(-2)
    return qm.to(torch.float32).contiguous()


def make_view(cfg: RQConfig, *, num_loops: int, num_kv_heads: int, head_dim: int, rows: int,
              rotation: str | torch.Tensor | None = "cfg", device: str | torch.device = "cpu",
              fill: bool = True, seed: int = 0, head_major: bool = False
              ) -> CompressedLayerView:
    """One layer's compressed buffers (``rows`` slots), optionally filled with random bytes.

    ``rotation``: ``"cfg"`` builds the normalised Hadamard when ``cfg.rotation != "none"``; a
    tensor ``[num_kv_heads, head_dim, head_dim]`` is used as is; None means no rotation.
    ``head_major``: allocate codes/meta as ``[2, H, rows, ...]`` and return the same logical
    ``[rows, 2, H, ...]`` views (each head's rows contiguous; an alternative pool layout).
    """
    shape = ModelKVShape(num_layers=1, num_loops=num_loops, num_kv_heads=num_kv_heads,
                         head_dim=head_dim)
    segs = loop_segments(shape, cfg)
    ng = head_dim // cfg.group_size
    gen = torch.Generator().manual_seed(seed)
    codes, meta, coef = [], [], []
    for s in segs:
        shp = (rows, 2, num_kv_heads, s.code_bytes)
        c = (torch.randint(0, 256, shp, generator=gen, dtype=torch.uint8) if fill
             else torch.zeros(shp, dtype=torch.uint8, device=device))
        if head_major:
            c = c.permute(1, 2, 0, 3).contiguous().permute(2, 0, 1, 3)
        codes.append(c.to(device))
        m = None
        if s.meta_bytes:
            m = torch.zeros(2, num_kv_heads, rows, ng, 2, dtype=torch.uint8, device=device)
            m = m.permute(2, 0, 1, 3, 4) if head_major else m.permute(2, 0, 1, 3, 4).contiguous()
        meta.append(m)
        coef.append(torch.zeros(rows, 2, num_kv_heads, dtype=torch.bfloat16, device=device)
                    if s.coef_bytes else None)
    if isinstance(rotation, str):
        rot = (None if cfg.rotation == "none"
               else hadamard_matrix(head_dim).expand(num_kv_heads, head_dim, head_dim).contiguous())
    else:
        rot = rotation
    if rot is not None:
        rot = rot.to(device=device, dtype=torch.float32).contiguous()
    return CompressedLayerView(codes=codes, meta=meta, coef=coef, rotation=rot, segments=segs,
                               cfg=cfg, head_dim=head_dim)


def loop_kv(num_loops: int, num_tokens: int, num_kv_heads: int, head_dim: int, *, seed: int,
            device: str | torch.device = "cpu", outliers: bool = True,
            special_groups: bool = True, group_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Looped K/V ``[num_loops, num_tokens, num_kv_heads, head_dim]`` bf16 that look like a
    looped model's: a shared per-token component plus a smaller per-loop drift, a few large
    outlier channels, and (``special_groups``) some all-zero and constant groups."""
    gen = torch.Generator().manual_seed(seed)
    shp = (num_tokens, num_kv_heads, head_dim)
    out = []
    for _ in range(2):
        base = torch.randn(shp, generator=gen)
        x = base.unsqueeze(0) * (1 + 0.1 * torch.randn(num_loops, 1, num_kv_heads, 1,
                                                       generator=gen))
        x = x + 0.3 * torch.randn((num_loops,) + shp, generator=gen)
        if outliers:
            ch = torch.randint(0, head_dim, (2,), generator=gen)
            x[..., ch] *= 20.0
        if special_groups and num_tokens > 2:
            x[:, 0, :, :group_size] = 0.0  # an all-zero group
            x[:, 1, :, :group_size] = 0.75  # a constant (FP8-representable) group
            x[:, 2, :, group_size:2 * group_size] = 0.3  # a constant, not FP8-representable
        out.append(x.to(torch.bfloat16).to(device))
    return out[0], out[1]


def sdpa_bf16(q: torch.Tensor, k_hist: list[torch.Tensor], v_hist: list[torch.Tensor],
              k_cur: torch.Tensor, v_cur: torch.Tensor, qo_indptr: list[int], *,
              sm_scale: float) -> torch.Tensor:
    """The flash-attn yardstick: the same (dequantized) K/V through PyTorch SDPA in bf16.

    Per request b: keys ``cat(k_hist[b], k_cur[rows of b])`` (rows ``qo_indptr[b]:[b+1]``),
    causal for the chunk (decode is a chunk of 1). Returns fp32 ``[T, Hq, D]``.
    """
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b in range(len(qo_indptr) - 1):
        s, e = qo_indptr[b], qo_indptr[b + 1]
        k = torch.cat([k_hist[b].float(), k_cur[s:e].float()]).to(torch.bfloat16)
        v = torch.cat([v_hist[b].float(), v_cur[s:e].float()]).to(torch.bfloat16)
        g = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(g, 1).transpose(0, 1)  # [Hq, n, D]
        v = v.repeat_interleave(g, 1).transpose(0, 1)
        n, m = k.shape[1], e - s
        mask = (torch.arange(n, device=q.device)[None, :]
                <= torch.arange(m, device=q.device)[:, None] + (n - m))
        o = torch.nn.functional.scaled_dot_product_attention(
            q[s:e].transpose(0, 1).to(torch.bfloat16), k, v, attn_mask=mask, scale=sm_scale)
        out[s:e] = o.transpose(0, 1).float()
    return out


def attention_errors(out: torch.Tensor, ref: torch.Tensor, yardstick: torch.Tensor) -> dict:
    """Max-abs and Frobenius errors of ``out`` and of the bf16-SDPA ``yardstick`` against the
    fp32 ``ref``, plus the floors of the tolerance policy (tests/kernels/test_decode.py)."""
    o, r, y = out.float(), ref.float(), yardstick.float()
    top = r.abs().max().item()
    ulp = 2.0 ** (torch.tensor(max(top, 1e-30)).log2().floor().item() - 7)  # bf16 ulp at max
    return dict(max=(o - r).abs().max().item(), max_sdpa=(y - r).abs().max().item(),
                fro=(o - r).norm().item(), fro_sdpa=(y - r).norm().item(),
                floor_max=ulp, floor_fro=1e-3 * r.norm().item())


def within_policy(e: dict) -> bool:
    """flash-attn rule: error <= 2x bf16 SDPA's error (max and Frobenius) plus a small floor."""
    return (e["max"] <= 2 * e["max_sdpa"] + e["floor_max"]
            and e["fro"] <= 2 * e["fro_sdpa"] + e["floor_fro"])
