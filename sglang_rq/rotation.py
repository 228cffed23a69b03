"""Orthogonal rotations applied before quantization (DESIGN.md section 1, step 4).

Every rotation is a ``[num_layers, num_kv_heads, head_dim, head_dim]`` float32 tensor ``R``
with ``R @ R.T == I``; vectors are rotated as row vectors, ``x' = x @ R``.

* ``hadamard``: normalised Hadamard ``H / sqrt(D)`` (Sylvester for powers of two, Paley-I
  order 12 times Sylvester for ``D = 12 * 2^k`` such as Huginn's 96), the same for every head.
* ``signed-hadamard``: ``diag(s) @ H / sqrt(D)`` with a seeded random ±1 diagonal per (layer, head)
  (QuaRot, Ashkboos et al. 2024, section 3).
* a ``.safetensors`` file whose ``rotation`` tensor has the shape above (e.g. from calibration).
"""

from __future__ import annotations

import torch

from sglang_rq.config import ROTATION_CHOICES, RQConfig, RQConfigError


def _sylvester(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def _paley12() -> torch.Tensor:
    """Hadamard matrix of order 12 by Paley's construction I with q = 11."""
    q = 11
    residues = {(i * i) % q for i in range(1, q)}
    chi = [0] + [1 if i in residues else -1 for i in range(1, q)]
    jac = torch.tensor([[chi[(j - i) % q] for j in range(q)] for i in range(q)], dtype=torch.float64)
    s = torch.zeros(q + 1, q + 1, dtype=torch.float64)
    s[0, 1:] = 1
    s[1:, 0] = -1
    s[1:, 1:] = jac
    return s + torch.eye(q + 1, dtype=torch.float64)


def hadamard_matrix(head_dim: int) -> torch.Tensor:
    """Normalised Hadamard matrix ``[head_dim, head_dim]`` float32 (orthogonal).

    Raises
    ------
    RQConfigError
        If ``head_dim`` is neither a power of two nor 12 times a power of two.
    """
    if head_dim & (head_dim - 1) == 0:
        h = _sylvester(head_dim)
    elif head_dim % 12 == 0 and ((head_dim // 12) & (head_dim // 12 - 1)) == 0:
        h = torch.kron(_paley12(), _sylvester(head_dim // 12))
    else:
        raise RQConfigError(
            f"--rq-rotation=hadamard needs head_dim = 2^k or 12*2^k, got {head_dim}; "
            "use a rotation file instead"
        )
    return (h / head_dim**0.5).to(torch.float32)


def build_rotation(cfg: RQConfig, *, num_layers: int, num_kv_heads: int,
                   head_dim: int) -> torch.Tensor | None:
    """The rotation tensor ``[num_layers, num_kv_heads, head_dim, head_dim]`` fp32 CPU, or None.

    Raises
    ------
    RQConfigError
        If a rotation file is missing, is not safetensors, has the wrong shape, holds
        non-finite values, or is not orthogonal.
    """
    if not cfg.enabled or cfg.rotation == "none":
        return None
    shape = (num_layers, num_kv_heads, head_dim, head_dim)
    if cfg.rotation == "hadamard":
        return hadamard_matrix(head_dim).expand(shape).contiguous()
    if cfg.rotation == "signed-hadamard":
        gen = torch.Generator().manual_seed(cfg.rotation_seed)
        signs = torch.randint(0, 2, (num_layers, num_kv_heads, head_dim), generator=gen) * 2 - 1
        return signs.to(torch.float32).unsqueeze(-1) * hadamard_matrix(head_dim)
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        rot = load_file(cfg.rotation)["rotation"].to(torch.float32)
    except (FileNotFoundError, KeyError, OSError, SafetensorError) as exc:
        raise RQConfigError(
            f"--rq-rotation={cfg.rotation}: cannot read a 'rotation' tensor from a safetensors "
            f"file ({exc})"
        ) from exc
    if tuple(rot.shape) != shape:
        raise RQConfigError(
            f"--rq-rotation={cfg.rotation}: rotation has shape {tuple(rot.shape)}, "
            f"the model needs {shape}"
        )
    if not bool(torch.isfinite(rot).all()):
        raise RQConfigError(f"--rq-rotation={cfg.rotation}: rotation holds NaN or infinite values")
    err = (rot @ rot.transpose(-1, -2) - torch.eye(head_dim)).abs().max().item()
    if not err <= 1e-3:  # NaN fails too
        raise RQConfigError(f"--rq-rotation={cfg.rotation}: matrices are not orthogonal "
                            f"(max |R R^T - I| = {err:.2e})")
    return rot.contiguous()


def check_rotation_file(cfg: RQConfig, *, num_layers: int, num_kv_heads: int, head_dim: int,
                        tp_size: int = 1) -> None:
    """Refuse a rotation file (``cfg.rotation`` a path) that serving would refuse, before any
    work: with ``tp_size`` > 1 (a file holds every KV head; it is not sharded across ranks yet),
    or one `build_rotation` refuses for this shape. The built-in rotations pass.

    Raises
    ------
    RQConfigError
        Naming ``--rq-rotation`` and what is wrong with the file.
    """
    if not cfg.enabled or cfg.rotation in ROTATION_CHOICES:
        return
    if tp_size > 1:
        raise RQConfigError(f"--rq-rotation={cfg.rotation} with --tp-size {tp_size}: rotation "
                            "files are not sharded across ranks yet; use --rq-rotation hadamard")
    build_rotation(cfg, num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim)
