"""Locust load test of an OpenAI-compatible streaming endpoint (an sglang-rq worker or the router).

    locust -f loadtest/locustfile.py --host http://127.0.0.1:30000 --headless \
        -u 8 -r 2 -t 60s --only-summary

Each user sends ``/v1/completions`` with ``stream: true`` (or ``/v1/chat/completions`` with
``RQ_LOAD_CHAT=1``) and measures, per request:

* TTFT: request start to the first chunk carrying text (not to the response headers, which
  SGLang sends before the first token),
* ITL: per output token, the gap between consecutive text chunks divided by the tokens the later
  chunk carried (cumulative ``usage.completion_tokens`` per chunk, requested with
  ``stream_options.continuous_usage_stats``; a server that sends no per-chunk usage counts one
  token per chunk), as ``bench_serving --backend sglang`` does. At ``--stream-interval 1`` a
  chunk is one token and ITL is the chunk gap,
* TPOT: ``(last text chunk - first text chunk) / (output_tokens - 1)``, output tokens from the
  final usage chunk,
* e2e latency, output tokens, errors (HTTP status, stream without a ``[DONE]``, no tokens).

Locust's own table shows the streamed request with its response time set to the e2e latency
(locust would otherwise time it to the response headers); TTFT/TPOT/ITL are fired as extra
request types ``TTFT``/``TPOT``/``ITL`` (response time = the metric in ms) so ``--csv`` and the
web UI show their percentiles too. On exit a summary (p50/p90/p99, output tokens/s,
requests/s, error rate) is printed and written as JSON to ``RQ_LOAD_REPORT`` (default
``loadtest-report.json``). ``tests/test_loadtest_client.py`` checks these numbers against
``loadtest/stub_server.py`` (a server with known timings) and against ``bench_serving``.

Environment: ``RQ_LOAD_MODEL`` (default: first of ``/v1/models``), ``RQ_LOAD_PROMPT_TOKENS``
(approximate prompt length in words, default 64), ``RQ_LOAD_MAX_TOKENS`` (default 32),
``RQ_LOAD_SHARED_PREFIX`` (words of a prefix shared by all prompts, default 32: exercises the
radix cache and the router's cache-aware policy), ``RQ_LOAD_CHAT`` (0/1).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time

from locust import HttpUser, between, events, task

MAX_TOKENS = int(os.environ.get("RQ_LOAD_MAX_TOKENS", "32"))
PROMPT_WORDS = int(os.environ.get("RQ_LOAD_PROMPT_TOKENS", "64"))
SHARED_WORDS = int(os.environ.get("RQ_LOAD_SHARED_PREFIX", "32"))
CHAT = os.environ.get("RQ_LOAD_CHAT", "0") == "1"
REPORT = os.environ.get("RQ_LOAD_REPORT", "loadtest-report.json")
WORDS = ("the of and to in is was for on as with by at from his her that it an be are this "
         "which or had not but were they have one all their there been has when who will more "
         "no if out so said what up its about into than them can only other new some could "
         "time these two may then do first any my now such like our over man me even most").split()

_lock = threading.Lock()
_samples: dict[str, list[float]] = {"ttft_s": [], "tpot_s": [], "itl_s": [], "e2e_s": []}
_totals = {"requests": 0, "errors": 0, "output_tokens": 0, "start": 0.0, "end": 0.0}
_model: dict[str, str] = {}


def _prompt(rng: random.Random) -> str:
    shared = " ".join(WORDS[i % len(WORDS)] for i in range(SHARED_WORDS))
    own = " ".join(rng.choice(WORDS) for _ in range(max(0, PROMPT_WORDS - SHARED_WORDS)))
    return f"{shared} {own}".strip()


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


class StreamingUser(HttpUser):
    wait_time = between(0.0, 0.5)

    def on_start(self) -> None:
        self.rng = random.Random(id(self))
        if "name" not in _model:
            name = os.environ.get("RQ_LOAD_MODEL")
            if not name:
                with self.client.get("/v1/models", name="/v1/models", catch_response=True) as r:
                    data = r.json().get("data", []) if r.status_code == 200 else []
                    name = data[0]["id"] if data else "default"
            _model["name"] = name

    def _fire(self, kind: str, seconds: float) -> None:
        events.request.fire(request_type=kind, name=kind, response_time=seconds * 1000,
                            response_length=0, exception=None, context={})

    @task
    def stream(self) -> None:
        prompt = _prompt(self.rng)
        body = {"model": _model["name"], "max_tokens": MAX_TOKENS, "temperature": 0.0,
                "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        if CHAT:
            path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
        else:
            path, body["prompt"] = "/v1/completions", prompt
        t0 = time.perf_counter()
        first = last = None
        itl: list[float] = []
        tokens = seen = 0  # tokens: final usage count; seen: tokens counted so far in the stream
        done, error = False, None
        with self.client.post(path, json=body, stream=True, name=path + " (stream)",
                              catch_response=True) as resp:
            try:
                if resp.status_code != 200:
                    raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
                for line in resp.iter_lines():
                    if not line or not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    now = time.perf_counter()
                    msg = json.loads(payload)
                    usage = msg.get("usage") or {}
                    total = int(usage.get("completion_tokens") or 0)
                    texts = [(ch.get("delta") or {}).get("content") if CHAT else ch.get("text")
                             for ch in msg.get("choices") or []]
                    if not any(texts):
                        tokens = total or tokens  # the final usage chunk has no choices
                        continue
                    new = max(1, total - seen) if total else 1
                    if first is None:
                        first = now
                    else:
                        itl.extend([(now - last) / new] * new)
                    last, seen = now, seen + new
                if not done:
                    raise RuntimeError("stream ended without [DONE]")
                if first is None:
                    raise RuntimeError("no tokens streamed")
                resp.success()
            except Exception as exc:  # noqa: BLE001 - every failure is counted as an error
                error = exc
                resp.failure(exc)
            end = time.perf_counter()
            # NOTE: locust stops its clock at the response headers; report the whole stream.
            resp.request_meta["response_time"] = (end - t0) * 1000
        with _lock:
            _totals["requests"] += 1
            if error is not None:
                _totals["errors"] += 1
                return
            tokens = tokens or seen
            _totals["output_tokens"] += tokens
            _samples["ttft_s"].append(first - t0)
            _samples["e2e_s"].append(end - t0)
            _samples["itl_s"].extend(itl)
            if tokens > 1:
                _samples["tpot_s"].append((last - first) / (tokens - 1))
        self._fire("TTFT", first - t0)
        if tokens > 1:
            self._fire("TPOT", (last - first) / (tokens - 1))
        for gap in itl:
            self._fire("ITL", gap)


@events.test_start.add_listener
def _start(**_kw) -> None:
    _totals["start"] = time.time()


@events.test_stop.add_listener
def _stop(**_kw) -> None:
    _totals["end"] = time.time()
    wall = max(1e-9, _totals["end"] - _totals["start"])
    report: dict = {"wall_s": wall, "requests": _totals["requests"], "errors": _totals["errors"],
                    "error_rate": _totals["errors"] / max(1, _totals["requests"]),
                    "requests_per_s": (_totals["requests"] - _totals["errors"]) / wall,
                    "output_tokens": _totals["output_tokens"],
                    "output_tokens_per_s": _totals["output_tokens"] / wall,
                    "max_tokens": MAX_TOKENS, "prompt_words": PROMPT_WORDS}
    for key, vals in _samples.items():
        for q in (50, 90, 99):
            report[f"{key[:-2]}_p{q}_ms"] = None if not vals else 1000 * _pct(vals, q)
    with open(REPORT, "w") as f:
        json.dump(report, f, indent=1)
    print("sglang-rq load summary: " + json.dumps(report))
