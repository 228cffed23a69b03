"""Plain-PyTorch twins of `rq_kernels.ops` (same signatures, fp32 math, same operation order),
plus the top-k / top-p renormalization used by SGLang's FlashInfer-style sampler, which the
``sgl_kernel`` stand-in runs in torch.

The twins are the specification the Triton launchers are tested against. They run on any
device and mutate their arguments exactly as the launchers do.
"""

from __future__ import annotations

import torch


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    # x fp32 [rows, hidden] -> fp32 [rows, hidden]
    var = (x * x).sum(-1, keepdim=True) / x.shape[-1]
    rstd = 1.0 / torch.sqrt(var + eps)
    w = weight.float() + 1.0 if gemma else weight.float()
    return (x * rstd) * w


def rmsnorm_reference(input: torch.Tensor, weight: torch.Tensor, *, eps: float = 1e-6,
                      out: torch.Tensor | None = None, gemma: bool = False) -> torch.Tensor:
    """Twin of `rq_kernels.ops.rmsnorm`."""
    y = _rms(input.float(), weight, eps, gemma).to(input.dtype)
    if out is None:
        return y
    out.copy_(y)
    return out


def fused_add_rmsnorm_reference(input: torch.Tensor, residual: torch.Tensor,
                                weight: torch.Tensor, *, eps: float = 1e-6,
                                gemma: bool = False) -> None:
    """Twin of `rq_kernels.ops.fused_add_rmsnorm` (mutates ``input`` and ``residual``)."""
    x = input.float() + residual.float()
    residual.copy_(x.to(residual.dtype))
    input.copy_(_rms(x, weight, eps, gemma).to(input.dtype))


def _act(a: torch.Tensor, act: str) -> torch.Tensor:
    if act == "silu":
        return a / (1.0 + torch.exp(-a))
    if act == "gelu":
        return 0.5 * a * (1.0 + torch.erf(a * 0.7071067811865476))
    if act == "gelu_tanh":
        u = 0.7978845608028654 * (a + 0.044715 * a * a * a)
        return 0.5 * a * (1.0 + (2.0 / (1.0 + torch.exp(-2.0 * u)) - 1.0))
    raise ValueError(f"unknown activation {act!r}; expected one of gelu, gelu_tanh, silu")


def act_and_mul_reference(input: torch.Tensor, *, act: str = "silu",
                          out: torch.Tensor | None = None) -> torch.Tensor:
    """Twin of `rq_kernels.ops.act_and_mul`."""
    d = input.shape[-1] // 2
    y = (_act(input[..., :d].float(), act) * input[..., d:].float()).to(input.dtype)
    if out is None:
        return y
    out.copy_(y)
    return out


def _as_heads(t: torch.Tensor, head_size: int | None) -> torch.Tensor:
    return t if t.dim() == 3 else t.view(t.shape[0], -1, head_size)


def rope_inplace_reference(positions: torch.Tensor, query: torch.Tensor,
                           key: torch.Tensor | None, *, cos_sin_cache: torch.Tensor,
                           is_neox: bool, head_size: int | None = None) -> None:
    """Twin of `rq_kernels.ops.rope_inplace` (mutates ``query`` and ``key``)."""
    rot = cos_sin_cache.shape[-1]
    half = rot // 2
    cs = cos_sin_cache.index_select(0, positions.reshape(-1).long()).float()
    cos, sin = cs[:, None, :half], cs[:, None, half:]  # [T, 1, half]
    for t in (query, key):
        if t is None:
            continue
        x = _as_heads(t, head_size)
        if is_neox:
            i1, i2 = slice(0, half), slice(half, rot)
        else:
            i1, i2 = slice(0, rot, 2), slice(1, rot, 2)
        x1, x2 = x[..., i1].float(), x[..., i2].float()
        y1 = x1 * cos - x2 * sin
        y2 = x2 * cos + x1 * sin
        x[..., i1] = y1.to(x.dtype)
        x[..., i2] = y2.to(x.dtype)


def top_k_renorm_prob_reference(probs: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """Keep each row's ``top_k`` largest probabilities (ties at the k-th value kept), renormalize.

    Parameters
    ----------
    probs : torch.Tensor
        ``[batch_size, vocab]``, float.
    top_k : torch.Tensor or int
        ``[batch_size]`` or a scalar; values are clamped to ``[1, vocab]``.

    Returns
    -------
    torch.Tensor
        ``[batch_size, vocab]``, dtype of ``probs``.
    """
    v = probs.shape[-1]
    if not torch.is_tensor(top_k):
        top_k = torch.full((probs.shape[0],), int(top_k), device=probs.device)
    k = top_k.to(device=probs.device, dtype=torch.long).clamp(1, v).view(-1, 1)
    sorted_p = probs.sort(dim=-1, descending=True).values
    kth = sorted_p.gather(-1, k - 1)
    kept = probs.masked_fill(probs < kth, 0.0)
    return kept / kept.sum(-1, keepdim=True)


def top_p_renorm_prob_reference(probs: torch.Tensor, top_p: torch.Tensor | float) -> torch.Tensor:
    """Keep the smallest prefix (by descending probability) whose mass reaches ``top_p``;
    renormalize. The most likely token is always kept.

    Parameters
    ----------
    probs : torch.Tensor
        ``[batch_size, vocab]``, float.
    top_p : torch.Tensor or float
        ``[batch_size]`` or a scalar in ``(0, 1]``.

    Returns
    -------
    torch.Tensor
        ``[batch_size, vocab]``, dtype of ``probs``.
    """
    if not torch.is_tensor(top_p):
        top_p = torch.full((probs.shape[0],), float(top_p), device=probs.device)
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each token
    p = top_p.to(device=probs.device, dtype=probs.dtype).view(-1, 1)
    sorted_p = sorted_p.masked_fill(before >= p, 0.0)
    kept = torch.zeros_like(probs).scatter_(-1, idx, sorted_p)
    return kept / kept.sum(-1, keepdim=True)


__all__ = ["act_and_mul_reference", "fused_add_rmsnorm_reference", "rmsnorm_reference",
           "rope_inplace_reference", "top_k_renorm_prob_reference", "top_p_renorm_prob_reference"]
