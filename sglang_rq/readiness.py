"""Readiness decisions of the canary, as pure functions, and the worker-load query they use.

A canary that waits behind other requests says nothing about the quantized path, so queueing
alone must never make a worker unready (issue 13: a saturated fleet whose busiest workers turn
unready sheds load onto the rest, which then fail in turn). The rules:

* only a *completed* answer is judged: right => ``pass``, wrong => ``wrong_answer`` (unready at
  once);
* a canary still pending (or timed out, or refused with 429/503) while the worker has other
  requests running or queued => ``saturated``: readiness keeps the last completed verdict;
* the same on an idle worker (nothing but the canary in flight), or any other failure (refused
  connection, 4xx/5xx) => ``error``; ``ERROR_THRESHOLD`` in a row => unready;
* an unknown load (``/v1/loads`` did not answer, or its snapshot is older than `LOADS_STALE_S`)
  counts as idle: a scheduler that has published no load for that long is stuck, not merely
  busy.

The load is SGLang 0.5.23's ``GET /v1/loads?include=core`` (``num_running_reqs`` and
``num_waiting_reqs`` per DP rank, available without ``--enable-metrics``): the snapshot the
scheduler last published (``timestamp``, seconds since the epoch), after each prefill batch, every
few decode batches and while requests wait, not when the scheduler loop is stuck. A stuck
scheduler (a new-user review, 12-06: a stop_regex backtracking in its per-token search) kept
answering a 425-second-old snapshot of a busy worker, so the canary read "saturated" and the
worker stayed ready for over ten minutes.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

READY_PATH = "/rq/ready"  # the readiness route (canary.install), probed without --api-key
OUTCOMES = ("pass", "wrong_answer", "error", "timeout", "pending", "overloaded")
RESULTS = ("pass", "wrong_answer", "error", "saturated")
ERROR_THRESHOLD = 3
LOADS_TIMEOUT_S = 10.0
LOADS_STALE_S = 60.0  # a load snapshot older than this is unknown (a stuck scheduler)


def classify(*, outcome: str, queue_depth: int) -> str:
    """The canary result (one of `RESULTS`) for one observation.

    Parameters
    ----------
    outcome
        What the canary request did: ``pass`` / ``wrong_answer`` (completed and judged),
        ``error`` (refused connection, HTTP error other than 429/503, malformed reply),
        ``timeout`` (client-side timeout), ``pending`` (still in flight when the wait ended),
        ``overloaded`` (HTTP 429 or 503).
    queue_depth
        Requests running or waiting on the worker *other than the canary*; -1 when unknown.

    Returns
    -------
    str
        ``saturated`` for a canary that could not finish because the worker is busy, else
        ``pass``, ``wrong_answer`` or ``error``.
    """
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown canary outcome {outcome!r}; expected one of {OUTCOMES}")
    if outcome in ("pass", "wrong_answer", "error"):
        return outcome
    return "saturated" if queue_depth > 0 else "error"


def is_ready(*, last_result: str | None, wrong: bool, errors_in_row: int,
             seconds_since_pass: float, stale_after_s: float) -> tuple[bool, str]:
    """``(ready, reason)`` from the canary's state (all inputs already reduced by the caller).

    ``saturated`` results neither count as errors nor age the last pass: a worker that passed,
    then stayed busy, stays ready for as long as it is busy.
    """
    if last_result is None:
        return False, "canary has not run yet"
    if wrong:
        return False, "wrong answer on the quantized path"
    if errors_in_row >= ERROR_THRESHOLD:
        return False, f"{errors_in_row} canary errors in a row"
    if seconds_since_pass > stale_after_s:
        return False, "no recent passing canary"
    if last_result == "saturated":
        return True, "ok (saturated: canary queued behind load, last completed answer passed)"
    return True, "ok"


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The request headers a server under ``--api-key`` wants (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def queue_depth(url: str, *, api_key: str | None = None, exclude: int = 1) -> int:
    """Requests running or waiting on the worker at ``url``, less ``exclude`` (the canary).

    Returns -1 when ``/v1/loads`` does not answer within `LOADS_TIMEOUT_S`, or when a DP rank's
    snapshot is older than `LOADS_STALE_S` (or was never published: timestamp 0).
    """
    import time

    import requests

    try:
        r = requests.get(url.rstrip("/") + "/v1/loads", params={"include": "core"},
                         headers=auth_headers(api_key), timeout=LOADS_TIMEOUT_S)
        r.raise_for_status()
        loads = r.json()["loads"]
        total = sum(int(x["num_running_reqs"]) + int(x["num_waiting_reqs"]) for x in loads)
        age = max(time.time() - float(x["timestamp"]) for x in loads) if loads else 0.0
    except Exception as exc:  # noqa: BLE001 - an unknown load is reported, not raised
        logger.warning("sglang-rq canary: /v1/loads failed: %r", exc)
        return -1
    if age > LOADS_STALE_S:
        logger.warning("sglang-rq canary: the scheduler's load snapshot is %.0f s old (more than "
                       "%.0f s): the load is unknown", age, LOADS_STALE_S)
        return -1
    return max(0, total - exclude)
