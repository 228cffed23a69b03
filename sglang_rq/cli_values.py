"""Checks of numeric command-line values that every ``sglang-rq`` command shares."""

from __future__ import annotations

import math


def positive_error(flag: str, value: float | int | None) -> str | None:
    """The error for ``flag``'s ``value`` where it must be a finite number above zero, or None
    if it is one (or was not given). A plain ``value <= 0`` lets NaN through, since NaN compares
    false with everything: ``--rq-canary-interval-s nan`` made the canary loop without sleeping."""
    if value is None or 0 < value < math.inf:
        return None
    return f"{flag}={value} must be > 0 and finite (leave the flag out for its default)"
