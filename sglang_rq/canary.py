"""Readiness canary: a fixed prompt whose greedy answer is known, asked on the quantized path.

A worker whose KV cache decodes garbage still answers ``/health``; this module makes such a
worker *not ready*. A background thread in the HTTP server process sends the spec's prompt
(token ids) to the worker's own ``/generate`` every ``SGLANG_RQ_CANARY_INTERVAL_S`` seconds,
greedy, and compares the leading tokens with the expected ones. The answer decodes through the
compressed pages (every step after the first reads the prompt's committed, quantized K/V), and
the repeated prompt is a radix-cache hit, so the cached-prefix path is exercised too.

Routes added to SGLang's FastAPI app (`install`):

* ``GET /rq/ready``  200 when the last canary passed (and is fresh), else 503; JSON body.
  Use it for the Kubernetes readinessProbe and the router's ``--health-check-endpoint``.
* ``GET /rq/canary`` 200 always; the same JSON (for humans and dashboards).

Liveness stays SGLang's cheap ``/health``. Readiness (`sglang_rq.readiness`): only a completed
answer is judged; a *wrong answer* makes the worker not ready at once; a canary that is still
queued while the worker serves other requests is ``saturated`` (ready, exported as
``sglang_rq_canary_saturated``), never an error; errors (and a canary stuck on an idle worker)
only after ``ERROR_THRESHOLD`` in a row. At most one canary is in flight: a queued one is waited
for across periods, not resent. With ``--enable-priority-scheduling`` it is sent at the highest
priority. The spec file is re-read when its mtime changes.

Spec (JSON, ``--rq-canary-file`` / ``SGLANG_RQ_CANARY_FILE``, default ``<model>/canary.json``)::

    {"input_ids": [...], "max_new_tokens": 8, "expect_ids": [...], "match_tokens": 6,
     "prompt": "text (documentation only)", "weights_fingerprint": "sha256..."}

``python -m sglang_rq.canary record --model-path DIR`` writes one from the plain PyTorch
reference (fp32, unquantized), keeping only the leading tokens whose top-1 logit margin is large
enough to survive BF16 and KV quantization. Without a spec the canary only checks that greedy
generation returns tokens ("generation-only" mode, reported in the JSON).
``python -m sglang_rq.canary check --url URL`` runs it once (exit 0/1), e.g. as an exec probe.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sglang_rq import env, metrics
from sglang_rq.canary_spec import (  # noqa: F401 - re-exported: the canary's public names
    DEFAULT_PROMPTS, CanarySpec, load_spec_for, record, weights_fingerprint)
from sglang_rq.readiness import (  # noqa: F401 - ERROR_THRESHOLD re-exported (tests)
    ERROR_THRESHOLD, READY_PATH, auth_headers, classify, is_ready, queue_depth)

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 60.0  # `run_once` (the `check` CLI)
PENDING_TIMEOUT_S = 900.0  # the loop's client-side bound on one queued canary
PRIORITY = 2**62  # with --enable-priority-scheduling (sign follows the scheduler's direction)


@dataclass
class CanaryResult:
    """One run: ``result`` in ``metrics.CANARY_RESULTS``."""

    result: str
    matched_tokens: int = 0
    latency_s: float = 0.0
    output_ids: list[int] = field(default_factory=list)
    detail: str = ""
    time_s: float = 0.0


def judge(spec: CanarySpec | None, got: list[int], *, latency_s: float = 0.0,
          time_s: float = 0.0) -> CanaryResult:
    """``pass`` or ``wrong_answer`` for the completed answer ``got`` (token ids)."""
    n = spec.max_new_tokens if spec else 4
    if spec is None or not spec.expect_ids:
        ok = len(got) == n
        return CanaryResult("pass" if ok else "wrong_answer", len(got), latency_s, got,
                            "generation-only" if ok else f"expected {n} tokens", time_s)
    matched = 0
    for a, b in zip(got, spec.expect_ids):
        if a != b:
            break
        matched += 1
    if matched >= spec.match_tokens:
        return CanaryResult("pass", matched, latency_s, got, "", time_s)
    return CanaryResult("wrong_answer", matched, latency_s, got,
                        f"expected leading {spec.expect_ids[:spec.match_tokens]}, got {got}",
                        time_s)


def ask(url: str, spec: CanarySpec | None, *, api_key: str | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S, rid: str = "",
        priority: int | None = None) -> tuple[str, list[int], CanaryResult]:
    """Send the canary question to ``url`` (SGLang ``/generate``), greedy.

    Returns ``(outcome, output_ids, failure)``: outcome ``answered`` (then ``output_ids`` holds
    the answer), ``timeout``, ``overloaded`` (HTTP 429/503, or aborted by the server) or
    ``error``; ``failure`` is the
    unjudged record of a failed request (its ``result`` is the outcome).
    """
    import requests

    ids = spec.input_ids if spec else [1, 2, 3, 4]
    n = spec.max_new_tokens if spec else 4
    t0 = time.time()
    body: dict[str, Any] = {
        "input_ids": ids, "rid": rid or f"rq-canary-{int(t0 * 1000)}",
        "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}}
    if priority is not None:
        body["priority"] = priority
    try:
        r = requests.post(url.rstrip("/") + "/generate", headers=auth_headers(api_key),
                          timeout=timeout_s, json=body)
        if r.status_code in (429, 503):
            return "overloaded", [], CanaryResult("overloaded", latency_s=time.time() - t0,
                                                  detail=r.text[:500], time_s=t0)
        r.raise_for_status()
        out = r.json()
        out = out[0] if isinstance(out, list) else out
        finish = (out.get("meta_info") or {}).get("finish_reason") or {}
        if isinstance(finish, dict) and finish.get("type") == "abort":
            # aborted by the server (abort_all, preemption, queue limit): not an answer
            return "overloaded", [], CanaryResult("overloaded", latency_s=time.time() - t0,
                                                  detail=f"aborted: {finish}"[:500], time_s=t0)
        got = [int(t) for t in out["output_ids"]]
    except requests.Timeout as exc:
        return "timeout", [], CanaryResult("timeout", latency_s=time.time() - t0,
                                           detail=repr(exc)[:500], time_s=t0)
    except Exception as exc:  # noqa: BLE001 - any failure is a failed canary, reported
        return "error", [], CanaryResult("error", latency_s=time.time() - t0,
                                         detail=repr(exc)[:500], time_s=t0)
    return "answered", got, CanaryResult("answered", latency_s=time.time() - t0, time_s=t0)


def run_once(url: str, spec: CanarySpec | None, *, api_key: str | None = None,
             timeout_s: float = REQUEST_TIMEOUT_S, priority: int | None = None) -> CanaryResult:
    """Ask the canary question once and judge it; a failed request is classified by the
    worker's load (``saturated`` when others are queued or running, else ``error``)."""
    outcome, got, fail = ask(url, spec, api_key=api_key, timeout_s=timeout_s, priority=priority)
    if outcome == "answered":
        return judge(spec, got, latency_s=fail.latency_s, time_s=fail.time_s)
    depth = queue_depth(url, api_key=api_key, exclude=0) if outcome != "error" else 0
    return replace(fail, result=classify(outcome=outcome, queue_depth=depth),
                   detail=f"{outcome} (queue depth {depth}): {fail.detail}")


class _Pending:
    """One canary request in flight on its own thread (the loop waits on ``done``)."""

    def __init__(self, url: str, spec: CanarySpec | None, *, api_key: str | None,
                 priority: int | None) -> None:
        self.t0 = time.time()
        self.rid = f"rq-canary-{int(self.t0 * 1000)}"
        self.done = threading.Event()
        self.reply: tuple[str, list[int], CanaryResult] | None = None

        def run() -> None:
            self.reply = ask(url, spec, api_key=api_key, timeout_s=PENDING_TIMEOUT_S,
                             rid=self.rid, priority=priority)
            self.done.set()

        threading.Thread(target=run, name="rq-canary-request", daemon=True).start()


class Canary:
    """The periodic canary of one worker and its readiness verdict (thread-safe)."""

    def __init__(self, url: str, spec: CanarySpec | None, *, interval_s: float,
                 api_key: str | None = None, stale_reason: str = "",
                 enabled: bool = True, priority: int | None = None,
                 spec_path: Path | None = None, model_path: str = "") -> None:
        self.url, self.spec, self.interval_s, self.api_key = url, spec, interval_s, api_key
        self.enabled, self._healthy = enabled, False
        self.stale_reason, self.priority = stale_reason, priority
        self.spec_path, self.model_path = spec_path, model_path
        self._spec_mtime = _mtime(spec_path)
        # wait per period for a queued canary before asking the worker's load
        self.wait_s = min(max(interval_s, 10.0), 60.0)
        self._lock = threading.Lock()
        self._last: CanaryResult | None = None
        self._last_pass_s = 0.0
        self._fresh_s = 0.0  # last pass, or last saturated period after a pass
        self._errors_in_row = 0
        self._wrong = False
        self._pending: _Pending | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_healthy: Any = None  # called once in the thread when /health first answers

    # ------------------------------------------------------------------ verdict
    def record(self, res: CanaryResult) -> None:
        """Fold one result (``pass``, ``wrong_answer``, ``error`` or ``saturated``) in."""
        with self._lock:
            self._last = res
            if res.result == "pass":
                self._last_pass_s = self._fresh_s = res.time_s
                self._errors_in_row, self._wrong = 0, False
            elif res.result == "wrong_answer":
                self._wrong = True
            elif res.result == "saturated":
                if self._last_pass_s:
                    self._fresh_s = max(self._fresh_s, res.time_s)
            else:
                self._errors_in_row += 1
        metrics.record_canary(result=res.result, latency_s=res.latency_s,
                              matched_tokens=res.matched_tokens, now_s=res.time_s)
        log = logger.info if res.result in ("pass", "saturated") else logger.error
        log("sglang-rq canary: %s (%d tokens matched, %.2fs) %s", res.result,
            res.matched_tokens, res.latency_s, res.detail)

    def status(self) -> tuple[bool, dict[str, Any]]:
        """``(ready, json)``: see `sglang_rq.readiness.is_ready`."""
        with self._lock:
            last, now = self._last, time.time()
            if not self.enabled:
                ready, why = self._healthy, "canary disabled (--rq-no-canary): /health only"
            elif self.stale_reason:
                ready, why = False, self.stale_reason
            else:
                since = now - self._fresh_s if self._last_pass_s else float("inf")
                ready, why = is_ready(last_result=None if last is None else last.result,
                                      wrong=self._wrong, errors_in_row=self._errors_in_row,
                                      seconds_since_pass=since,
                                      stale_after_s=max(4 * self.interval_s, 120.0))
            mode = ("disabled" if not self.enabled else "expected-answer"
                    if self.spec and self.spec.expect_ids else "generation-only")
            body = {"ready": ready, "reason": why, "mode": mode,
                    "interval_s": self.interval_s, "last_pass_time_s": self._last_pass_s,
                    "errors_in_row": self._errors_in_row,
                    "saturated": last is not None and last.result == "saturated",
                    "priority": self.priority,
                    "last": None if last is None else asdict(last)}
        return ready, body

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="rq-canary", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _wait_healthy(self) -> None:
        """Poll ``/health`` until it answers 200, logging each new reason it did not (a URL
        the canary cannot reach left ``/rq/ready`` at "has not run yet" without a word)."""
        import requests

        said = ""
        while not self._stop.is_set():
            try:
                code = requests.get(self.url + "/health", timeout=5).status_code
                if code == 200:
                    return
                why = f"HTTP {code}"
            except requests.RequestException as exc:
                why = type(exc).__name__
                if not isinstance(exc, requests.ConnectionError) or "Errno 111" not in str(exc):
                    why = f"{why}: {exc}"  # not the server still starting (connection refused)
            if why != said:
                logger.info("sglang-rq canary: %s/health not ready yet (%s)", self.url, why[:300])
                said = why
            self._stop.wait(2.0)

    def _loop(self) -> None:
        self._wait_healthy()
        self._healthy = True
        if self.on_healthy is not None:
            self.on_healthy()
        if not self.enabled:
            return
        metrics.init_canary_metrics()
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the canary thread must survive anything
                logger.exception("sglang-rq canary: tick failed")
            self._stop.wait(self.interval_s)

    def tick(self) -> CanaryResult:
        """One period: start a canary unless one is queued, wait up to ``wait_s``, record."""
        self._reload_spec()
        if self._pending is None:
            self._pending = _Pending(self.url, self.spec, api_key=self.api_key,
                                     priority=self.priority)
        p = self._pending
        depth = 0
        if not p.done.wait(self.wait_s):
            depth = queue_depth(self.url, api_key=self.api_key, exclude=1)
        if p.done.is_set():
            self._pending = None
            assert p.reply is not None
            outcome, got, fail = p.reply
            if outcome == "answered":
                res = judge(self.spec, got, latency_s=fail.latency_s, time_s=time.time())
                self.record(res)
                return res
            if outcome != "error":
                depth = queue_depth(self.url, api_key=self.api_key, exclude=0)
        else:
            outcome = "pending"
            fail = CanaryResult("pending", latency_s=time.time() - p.t0)
        result = classify(outcome=outcome, queue_depth=depth)
        if result == "error" and self._pending is not None:
            self._abort(self._pending.rid)  # stuck on an idle worker: drop it, send anew
            self._pending = None
        res = replace(fail, result=result, time_s=time.time(),
                      detail=f"{outcome} after {fail.latency_s:.1f}s, {depth} other requests "
                             f"running or queued {fail.detail}".strip())
        self.record(res)
        return res

    def _abort(self, rid: str) -> None:
        import requests

        try:
            requests.post(self.url + "/abort_request", json={"rid": rid},
                          headers=auth_headers(self.api_key), timeout=10)
        except requests.RequestException as exc:
            logger.warning("sglang-rq canary: could not abort %s: %r", rid, exc)

    def _reload_spec(self) -> None:
        mtime = _mtime(self.spec_path)
        if self.spec_path is None or mtime == self._spec_mtime:
            return
        self._spec_mtime = mtime
        spec, stale = load_spec_for(self.model_path, str(self.spec_path))
        with self._lock:
            self.spec, self.stale_reason = spec, stale
        logger.info("sglang-rq canary: reloaded %s (%s)", self.spec_path, stale or "ok")


def _mtime(path: Path | None) -> float:
    try:
        return path.stat().st_mtime if path is not None else 0.0
    except OSError:
        return 0.0


def canary_priority(server_args: Any) -> int | None:
    """The canary's ``priority`` with ``--enable-priority-scheduling``, else None.

    SGLang 0.5.23 ignores ``priority`` without that flag (and with
    ``--abort-on-priority-when-disabled`` aborts the request), so it is sent only when the
    scheduler honours it; the sign follows ``--schedule-low-priority-values-first``.
    """
    if not getattr(server_args, "enable_priority_scheduling", False):
        return None
    return -PRIORITY if getattr(server_args, "schedule_low_priority_values_first", False) \
        else PRIORITY


# ----------------------------------------------------------------------------- server wiring
def install(app: Any, server_args: Any) -> Canary:
    """Add ``/rq/ready`` and ``/rq/canary`` to SGLang's FastAPI ``app`` and start the canary.

    The thread always runs until the server is healthy (it publishes the BF16 format metrics
    under ``--rq-disable``); with ``SGLANG_RQ_CANARY=0`` (``--rq-no-canary``) it then stops and
    ``/rq/ready`` follows ``/health``.

    Note
    ----
    Call before ``run_server``. Only the single-tokenizer HTTP server (the default
    ``--tokenizer-worker-num 1``) serves these routes; with more tokenizer workers use
    ``python -m sglang_rq.canary check`` as an exec probe instead.
    """
    from fastapi.responses import JSONResponse

    url = server_args.url()  # SGLang's own: loopback for a wildcard host, [v6] brackets, https
    enabled = env.RQ_CANARY.get()
    spec, stale = (load_spec_for(server_args.model_path, env.RQ_CANARY_FILE.get()) if enabled
                   else (None, ""))
    spec_file = env.RQ_CANARY_FILE.get()
    spec_path = Path(spec_file) if spec_file else Path(server_args.model_path) / "canary.json"
    canary = Canary(url, spec, interval_s=env.RQ_CANARY_INTERVAL_S.get(), enabled=enabled,
                    api_key=getattr(server_args, "api_key", None), stale_reason=stale,
                    priority=canary_priority(server_args),
                    spec_path=spec_path if enabled else None, model_path=server_args.model_path)

    async def ready() -> JSONResponse:
        ok, body = canary.status()
        return JSONResponse(body, status_code=200 if ok else 503)

    async def status() -> JSONResponse:
        return JSONResponse(canary.status()[1])

    canary.on_healthy = lambda: _publish_disabled_format(url, server_args)
    app.add_api_route(READY_PATH, ready, methods=["GET"])
    app.add_api_route("/rq/canary", status, methods=["GET"])
    canary.start()
    return canary


def _publish_disabled_format(url: str, server_args: Any) -> None:
    """With ``--rq-disable`` no RQ pool exists: publish the BF16 format from this process."""
    from sglang_rq.config import RQConfig

    cfg = RQConfig.from_json(env.RQ_CONFIG.get() or RQConfig().to_json())
    if cfg.enabled or not metrics.enabled():
        return
    try:
        import requests

        from sglang_rq.layout import ModelKVShape, bf16_bytes_per_token

        shape = ModelKVShape.from_hf_config(Path(server_args.model_path) / "config.json")
        info = requests.get(url + "/get_server_info", timeout=30,  # guarded by --api-key
                            headers=auth_headers(getattr(server_args, "api_key", None)))
        info.raise_for_status()  # not a 401 body read as a pool of 0 tokens
        info = info.json()
        tokens = int(info.get("max_total_num_tokens") or 0)
        metrics.publish_kv_format(cfg=cfg, shape=shape, page_size=server_args.page_size or 1,
                                  staging_tokens=0, pool_tokens=tokens,
                                  pool_bytes=tokens * bf16_bytes_per_token(shape))
    except Exception:  # noqa: BLE001 - metrics must never take the server down
        logger.exception("sglang-rq: could not publish the BF16 KV-format metrics")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sglang_rq.canary", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="write a canary spec from the fp32 reference model")
    rec.add_argument("--model-path", required=True)
    rec.add_argument("--out", default=None, help="default: <model-path>/canary.json")
    rec.add_argument("--prompt", action="append", default=None)
    rec.add_argument("--max-new-tokens", type=int, default=8)
    rec.add_argument("--min-margin", type=float, default=3.0)
    rec.add_argument("--max-match-tokens", type=int, default=4)
    chk = sub.add_parser("check", help="run the canary once against a server (exit 0 = pass)")
    chk.add_argument("--url", required=True)
    chk.add_argument("--spec", default=None)
    chk.add_argument("--api-key", default=None)
    args = p.parse_args(argv)
    if args.cmd == "record":
        spec = record(args.model_path, prompts=tuple(args.prompt or DEFAULT_PROMPTS),
                      max_new_tokens=args.max_new_tokens, min_margin=args.min_margin,
                      max_match_tokens=args.max_match_tokens)
        out = args.out or str(Path(args.model_path) / "canary.json")
        spec.save(out)
        print(f"wrote {out}: prompt {spec.prompt!r}, {spec.match_tokens}/{spec.max_new_tokens} "
              f"tokens must match {spec.expect_ids}")
        return 0
    spec = CanarySpec.load(args.spec) if args.spec else None
    res = run_once(args.url, spec, api_key=args.api_key)
    print(json.dumps(asdict(res)))
    return 0 if res.result in ("pass", "saturated") else 1


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main())
