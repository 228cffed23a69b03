"""Decode-like scoring: log-probabilities of a token sequence computed the way decode computes
them (issue 13 item 3; docs/robustness.md, "Logprob semantics").

With the ResidualQuant pool a token is exact while it is in flight (in the forward that
computes it) and read back compressed afterwards. Decode runs one token per forward: the
log-probability of token ``j`` comes from the forward of token ``j - 1`` alone, over a history
``[0, j - 1)`` read from the compressed cache. A one-forward re-score (``max_new_tokens: 0``,
``return_logprob``) processes the whole sequence in one extend, where every token attends every
earlier token of its chunk exactly, so its numbers differ from decode's by more than the BF16
pool's summation noise. A looped model cannot compress a token before its last loop has produced
the anchor, so one forward cannot reproduce decode.

`score_like_decode` reproduces decode through SGLang's radix cache, from the client, on an
unmodified server: step 0 sends the prompt ``input_ids[:start]`` as one request (prefilled as a
generation prefills its prompt); step ``k >= 1`` sends ``input_ids[:start + k]``, whose first
``start + k - 1`` tokens the previous step left in the radix tree (compressed), so the server
extends exactly one token, as decode would. Each step is a ``max_new_tokens: 1`` greedy request
with ``token_ids_logprob = [input_ids[start + k]]``: the score is the first *output* position's
log-probability of the next token, the same quantity decode returns. Every step of one call
carries the same fresh ``cache_salt`` (SGLang's radix namespace), so the chain neither reads KV
that another path computed for the same tokens (e.g. an earlier one-forward re-score) nor
leaves its own where other requests would hit it; the chain's nodes stay in the tree (evictable)
until SGLang's LRU reclaims them. Each step's ``meta_info.cached_tokens`` is checked: 0 for the
prompt, ``start + k - 1`` for step ``k``; anything else (the prefix was evicted between steps
under memory pressure) raises `ScoringError`, because a step that extends more than one token no
longer computes decode's numbers.

Cost: ``len(input_ids) - start`` sequential HTTP requests, each a one-token forward over the
compressed prefix: the work of decoding the sequence (O(n) forwards, O(n^2) attention reads),
not of one prefill. The chain needs ``len(input_ids)`` tokens of cache at once (one request at
a time). Requirements: SGLang 0.5.23 ``/generate`` (``cache_salt``, ``token_ids_logprob``,
``meta_info.cached_tokens``), radix cache on (not ``--disable-radix-cache``) and page size 1 (a
page-aligned hit would extend up to a page of tokens per step; `ScoringError` says so).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import requests

from sglang_rq.cli_values import wait_error


class ScoringError(RuntimeError):
    """A step did not run as decode would (prefix not cached as expected) or the server's reply
    lacked the fields the scoring reads."""


@dataclass
class Step:
    """One scored position.

    ``position``: index ``j`` into ``input_ids`` of the scored token; ``token``:
    ``input_ids[j]``; ``logprob``: natural-log probability (nats, <= 0) of ``token`` given
    ``input_ids[:j]``; ``top``: the ``top_k`` most likely next tokens as ``{token id: logprob}``
    (empty when ``top_k`` is 0); ``cached_tokens``: prefix length the server read from the cache
    (``j - 1`` for every step after the prompt's).
    """

    position: int
    token: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)
    cached_tokens: int = 0


def _check_ids(input_ids: list[int], start: int) -> list[int]:
    ids = [int(t) for t in input_ids]
    if not 1 <= start < len(ids):
        raise ValueError(f"start must satisfy 1 <= start < len(input_ids) = {len(ids)} (the "
                         f"prompt input_ids[:start] is not scored and at least one token is); "
                         f"got start={start}")
    return ids


def score_steps(url: str, input_ids: list[int], start: int, *, top_k: int = 0,
                temperature: float = 0.0, timeout: float = 600.0,
                session: requests.Session | None = None,
                cache_salt: str | None = None) -> list[Step]:
    """Decode-like scores of ``input_ids[start:]`` with per-step detail (see the module doc).

    ``url``: the server's base URL (``http://host:port``); ``input_ids``: token ids, length
    ``n >= 2``; ``start``: number of leading tokens treated as the prompt (prefilled together in
    one request, as a generation's prompt is), ``1 <= start < n``. Returns ``n - start`` `Step`
    records, positions ``start .. n - 1``, after ``n - start`` sequential requests.
    ``top_k`` > 0 also returns the ``top_k`` most likely tokens at each position.
    ``temperature``: 0 scores log_softmax(logits), what SGLang 0.5.23 returns for greedy
    requests; T > 0 scores log_softmax(logits / T), what it returns for requests sampled at T
    (unless the server sets ``SGLANG_RETURN_ORIGINAL_LOGPROB``). ``timeout``:
    seconds per request. ``cache_salt``: radix namespace of the chain (default a fresh random
    one; with a caller's salt the prompt step may hit that namespace's cache, the later steps
    are still checked).

    Raises `ValueError` for a bad ``start``, `requests.HTTPError` for a non-2xx reply (e.g. 400
    for an id outside the vocabulary) and `ScoringError` when a step's ``cached_tokens`` is not
    the expected prefix (radix cache off, page size > 1, or the prefix evicted between steps).
    """
    ids = _check_ids(input_ids, start)
    salt = cache_salt or f"sglang-rq-score-{uuid.uuid4().hex}"
    http = session or requests.Session()
    out: list[Step] = []
    try:
        for pos in range(start, len(ids)):
            body = {"input_ids": ids[:pos], "return_logprob": True,
                    "token_ids_logprob": [ids[pos]], "top_logprobs_num": top_k,
                    "cache_salt": salt,
                    "sampling_params": {"max_new_tokens": 1, "temperature": temperature}}
            r = http.post(url.rstrip("/") + "/generate", json=body, timeout=timeout)
            if r.status_code >= 400:
                raise requests.HTTPError(f"{r.status_code} from /generate at position {pos}: "
                                         f"{r.text[:500]}", response=r)
            meta = r.json()["meta_info"]
            try:
                (lp, tok, _), = meta["output_token_ids_logprobs"][0]
                cached = int(meta["cached_tokens"])
                top = {int(t): float(v) for v, t, _ in meta["output_top_logprobs"][0]} \
                    if top_k else {}
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise ScoringError(f"position {pos}: reply lacks the logprob fields "
                                   f"({exc!r}); meta_info keys {sorted(meta)}") from exc
            want = 0 if pos == start else pos - 1
            if cached != want and (pos > start or cache_salt is None):
                raise ScoringError(
                    f"position {pos}: the server read {cached} cached tokens, expected {want} "
                    f"(one in-flight token per step). Radix cache off, page size > 1, or the "
                    f"chain's prefix was evicted between steps (cache too small for "
                    f"{len(ids)} tokens under the current load)")
            if int(tok) != ids[pos]:
                raise ScoringError(f"position {pos}: logprob returned for token {tok}, asked "
                                   f"for {ids[pos]}")
            out.append(Step(position=pos, token=ids[pos], logprob=float(lp), top=top,
                            cached_tokens=cached))
    finally:
        if session is None:
            http.close()
    return out


def score_like_decode(url: str, input_ids: list[int], start: int, **kwargs) -> list[float]:
    """Log-probabilities (nats) of ``input_ids[start:]``, each computed as decode computes it:
    a ``list`` of ``len(input_ids) - start`` floats, entry ``i`` = log p(input_ids[start + i] |
    input_ids[:start + i]). O(n) sequential requests; arguments and errors as `score_steps`."""
    return [s.logprob for s in score_steps(url, input_ids, start, **kwargs)]


def main(argv: list[str] | None = None) -> int:
    """``sglang-rq score``: decode-like log-probabilities of a token-id sequence, as JSON."""
    import argparse
    import json
    import sys

    p = argparse.ArgumentParser(
        prog="sglang-rq score",
        description="Score token ids with decode's numerics (one in-flight token per step, "
                    "history from the compressed cache): one request per scored token.")
    p.add_argument("--url", default="http://127.0.0.1:30000",
                   help="Server base URL (or its OpenAI base, .../v1).")
    p.add_argument("--input-ids-file", required=True,
                   help="JSON file: a list of token ids, or an object with 'input_ids' (and "
                        "optionally 'start'); '-' reads stdin.")
    p.add_argument("--start", type=int, default=None,
                   help="Prompt length: tokens [0, start) are prefilled together and not scored "
                        "(default: the file's 'start', else 1).")
    p.add_argument("--top-k", type=int, default=0, help="Also report the top-k tokens per position.")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0: log-probabilities as returned for greedy requests; T > 0: of "
                        "logits / T, as returned for requests sampled at T.")
    p.add_argument("--timeout", type=float, default=600.0, help="Seconds per request.")
    args = p.parse_args(argv)
    try:
        if args.input_ids_file == "-":
            raw = json.load(sys.stdin)
        else:
            with open(args.input_ids_file) as f:
                raw = json.load(f)
    except (OSError, ValueError) as exc:  # a missing file, or not JSON
        p.error(f"--input-ids-file={args.input_ids_file}: {exc}")
    if isinstance(raw, dict) and "input_ids" not in raw:
        p.error(f"--input-ids-file={args.input_ids_file}: an object needs 'input_ids'")
    if (err := wait_error("--timeout", args.timeout)) is not None:
        p.error(err)
    if not 0 <= args.temperature < float("inf"):
        p.error(f"--temperature={args.temperature} must be >= 0 and finite")
    ids = raw["input_ids"] if isinstance(raw, dict) else raw
    start = args.start if args.start is not None else (
        raw.get("start", 1) if isinstance(raw, dict) else 1)

    def is_int(x) -> bool:  # JSON integers only: not 1.5, true, or the characters of "123"
        return isinstance(x, int) and not isinstance(x, bool)

    if not isinstance(ids, list) or not all(is_int(t) for t in ids):
        p.error(f"--input-ids-file={args.input_ids_file}: 'input_ids' (or the file's list) must be "
                "a JSON list of integer token ids")
    if not is_int(start):
        p.error(f"start={start!r} (--start or the file's 'start') must be an integer")
    if not 1 <= start < len(ids):  # before any request (a review: rc 1, no flag named)
        p.error(f"start={start} (--start or the file's 'start') must satisfy 1 <= start < "
                f"{len(ids)} (the number of input_ids: the prompt input_ids[:start] is not "
                "scored and at least one token is)")
    if args.top_k < 0:
        p.error(f"--top-k={args.top_k} must be >= 0")
    # the server's base URL; its OpenAI base (.../v1) too, as `sglang-rq tasks` takes it
    args.url = args.url.rstrip("/").removesuffix("/v1")
    try:
        steps = score_steps(args.url, ids, start, top_k=args.top_k,
                            temperature=args.temperature, timeout=args.timeout)
    except (ValueError, ScoringError, requests.RequestException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({
        "start": start, "logprobs": [s.logprob for s in steps],
        "sum_logprob": sum(s.logprob for s in steps),
        "steps": [{"position": s.position, "token": s.token, "logprob": s.logprob,
                   "cached_tokens": s.cached_tokens,
                   **({"top": {str(k): v for k, v in s.top.items()}} if s.top else {})}
                  for s in steps]}))
    return 0
