"""Quality metrics of a quantized KV cache against the BF16 cache, from served log-probabilities.

Every function takes plain Python lists/dicts as returned by SGLang's ``/generate`` with
``return_logprob`` (``input_token_logprobs``: one ``logprob`` per position, natural log;
``input_top_logprobs``: per position the ``k`` most likely ``(token_id, logprob)``), so the
numbers measure exactly what is served.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

TopK = dict[int, float]  # token id -> natural-log probability, the k most likely tokens


def perplexity(token_logprobs: Sequence[float]) -> float:
    """``exp(-mean log p(x_t | x_<t))`` over the scored positions (natural log).

    Raises
    ------
    ValueError
        If no position is scored.
    """
    if not token_logprobs:
        raise ValueError("perplexity of zero tokens")
    return math.exp(-sum(token_logprobs) / len(token_logprobs))


def topk_kl(p: TopK, q: TopK) -> float:
    """KL(P || Q) in nats between two next-token distributions known only on their top-k.

    The vocabulary is coarse-grained into the tokens present in *both* top-k lists (kept
    individually) and one bucket holding everything else, whose mass is ``1 - sum`` of the kept
    probabilities on each side. KL of coarse-grained distributions never exceeds the true KL
    (data-processing inequality, Cover & Thomas, *Elements of Information Theory*, 2.8), so this
    is a lower bound that becomes exact when ``k`` covers the vocabulary.

    Args:
        p: reference (BF16 KV) top-k, ``{token_id: logprob}``.
        q: candidate (quantized KV) top-k, ``{token_id: logprob}``.
    """
    common = p.keys() & q.keys()
    kl = 0.0
    p_rest = q_rest = 1.0
    for t in common:
        pt, qt = math.exp(p[t]), math.exp(q[t])
        kl += pt * (p[t] - q[t])
        p_rest -= pt
        q_rest -= qt
    p_rest, q_rest = max(p_rest, 0.0), max(q_rest, 0.0)
    if p_rest > 1e-12:
        kl += p_rest * math.log(p_rest / max(q_rest, 1e-12))
    return max(kl, 0.0)


def top1(p: TopK) -> int:
    """The most likely token of a top-k dict (lowest id on exact ties)."""
    return min(p, key=lambda t: (-p[t], t))


def top1_agreement(ps: Sequence[TopK], qs: Sequence[TopK]) -> float:
    """Fraction of positions whose most likely next token is the same under P and Q."""
    if len(ps) != len(qs) or not ps:
        raise ValueError(f"need equal, non-empty position lists, got {len(ps)} and {len(qs)}")
    return sum(top1(p) == top1(q) for p, q in zip(ps, qs)) / len(ps)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens two greedy generations share (``min(len)`` if one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def repetition_rate(tokens: Sequence[int], n: int = 4) -> float:
    """Fraction of the ``n``-grams of ``tokens`` that already occurred earlier in ``tokens``.

    0 for text without a repeated n-gram, close to 1 for a degenerate loop
    (``1 - distinct / total`` n-grams). 0 when there are fewer than ``n`` tokens.
    """
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)
