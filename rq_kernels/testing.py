"""Helpers for kernel tests and benchmarks: seeded K/V data and rotations, the bf16 SDPA
yardstick and the flash-attn error policy (torch only).

Views of a standalone layer are built from a KV format in tests/kernels/views.py (`make_view`),
which needs the serving package's config and layout.
"""

from __future__ import annotations

import torch


def random_orthogonal(num_kv_heads: int, head_dim: int, *, seed: int) -> torch.Tensor:
    """Seeded random orthogonal matrices ``[num_kv_heads, head_dim, head_dim]`` fp32 (QR)."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(num_kv_heads, head_dim, head_dim, generator=gen, dtype=torch.float64)
    qm, rm = torch.linalg.qr(a)
    qm = qm * torch.sign(torch.diagonal(rm, dim1=-2, dim2=-1)).unsqueeze(-2)
    return qm.to(torch.float32).contiguous()


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
