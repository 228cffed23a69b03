"""Shared builders of the attention tests (decode and extend)."""

from __future__ import annotations

import torch
from views import make_view

from rq_kernels.testing import loop_kv, random_orthogonal
from sglang_rq.rotation import hadamard_matrix
from sglang_rq.reference import commit_reference, dequantize_rows_reference


def build(cfg, *, loops, num_kv_heads, group, dim, lens, rot, device, seed,
          head_major=False, v_scale=1.0):
    """A committed pool holding ``sum(lens)`` history tokens, split into requests of ``lens``;
    V values times ``v_scale`` (a head whose V values are small).

    Returns (view, kv_indptr int32, kv_indices int64, per-request slots list).
    """
    total = sum(lens)
    rows = total + 9
    rotation = (random_orthogonal(num_kv_heads, dim, seed=seed) if rot == "rand"
                else signed_hadamard(num_kv_heads, dim, seed=seed) if rot == "signed" else rot)
    view = make_view(cfg, num_loops=loops, num_kv_heads=num_kv_heads, head_dim=dim, rows=rows,
                     rotation=rotation, device=device, fill=True, seed=seed,
                     head_major=head_major)
    gen = torch.Generator().manual_seed(seed)
    loc = (torch.randperm(rows - 1, generator=gen)[:total] + 1).to(device)
    if total:
        k, v = loop_kv(loops, total, num_kv_heads, dim, seed=seed, device=device,
                       group_size=cfg.group_size)
        commit_reference(k, v * v_scale, loc, view)
    ptr = [0]
    for n in lens:
        ptr.append(ptr[-1] + n)
    kv_indptr = torch.tensor(ptr, dtype=torch.int32, device=device)
    return view, kv_indptr, loc.contiguous(), [loc[ptr[b]:ptr[b + 1]] for b in range(len(lens))]


def signed_hadamard(num_kv_heads, dim, *, seed):
    """``diag(s_h) H / sqrt(dim)`` per KV head, seeded +-1 signs (`--rq-rotation
    signed-hadamard`'s form): ``[num_kv_heads, dim, dim]`` fp32."""
    gen = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (num_kv_heads, dim), generator=gen).float() * 2 - 1
    return signs[:, :, None] * hadamard_matrix(dim)


def queries(num_tokens, num_qo_heads, num_kv_heads, dim, *, device, seed, scale=1.0,
            v_scale=1.0):
    """q ``[T, Hq, D]``, k_cur/v_cur ``[T, Hkv, D]`` bf16 with an outlier channel in k; v_cur
    times ``v_scale`` (as `build`'s history)."""
    gen = torch.Generator().manual_seed(seed + 100)
    q = torch.randn(num_tokens, num_qo_heads, dim, generator=gen) * scale
    k = torch.randn(num_tokens, num_kv_heads, dim, generator=gen)
    v = torch.randn(num_tokens, num_kv_heads, dim, generator=gen) * v_scale
    k[..., 3] *= 20.0
    return tuple(t.to(torch.bfloat16).to(device) for t in (q, k, v))


def history(view, slots, loop_id):
    """Dequantized (fp32) K and V history of every request: two lists of ``[n_b, Hkv, D]``."""
    ks, vs = [], []
    for s in slots:
        k, v = dequantize_rows_reference(view, s, loop_id)
        ks.append(k)
        vs.append(v)
    return ks, vs
