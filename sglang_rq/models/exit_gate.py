"""Ouro's early-exit gate arithmetic, shared by the SGLang model and the reference forward.

Per token and loop t, ``lambda_t = sigmoid(gate(h_t))``; the probability of exiting at loop t is
``p_t = lambda_t * prod_{j<t} (1 - lambda_j)``, and the last loop takes the remaining mass so that
the row sums to 1 (Ouro, arXiv 2510.25741, section 3 "adaptive computation").
"""

from __future__ import annotations

import torch


def exit_probabilities(gate_logits: torch.Tensor) -> torch.Tensor:
    """``[num_tokens, num_loops]`` gate logits -> exit probabilities of the same shape, fp32."""
    lam = torch.sigmoid(gate_logits.float())
    survive = torch.cumprod(1.0 - lam, dim=-1)
    before = torch.cat([torch.ones_like(survive[:, :1]), survive[:, :-1]], dim=-1)
    p = lam * before
    p[:, -1] = before[:, -1]  # the last loop absorbs what is left
    return p


def select_exit_state(states: list[torch.Tensor], gate_logits: torch.Tensor | None, *,
                      mode: str, step: int | None, threshold: float) -> torch.Tensor:
    """The state fed to ``lm_head``, ``[num_tokens, hidden]``.

    ``mode`` ``step``: loop ``step`` for every token; ``threshold``: per token the first loop whose
    cumulative exit probability is ``>= threshold`` (the last loop if none).

    Raises
    ------
    ValueError
        If ``step`` is missing or out of range for ``mode == "step"``.
    """
    if mode == "step":
        if step is None or not 0 <= step < len(states):
            raise ValueError(f"exit_step={step} must be in [0, {len(states) - 1}] for exit_mode='step'")
        return states[step]
    cdf = torch.cumsum(exit_probabilities(gate_logits), dim=-1)  # [T, L]
    reached = cdf >= threshold
    reached[:, -1] = True
    first = reached.float().argmax(dim=-1)  # [T]
    stacked = torch.stack(states, dim=0)  # [L, T, hidden]
    return stacked[first, torch.arange(stacked.shape[1], device=stacked.device)]
