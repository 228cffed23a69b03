"""Readiness under saturation (issue 13 item 1): the pure decision functions and one canary
period (`Canary.tick`) with the HTTP calls replaced; no server."""

from __future__ import annotations

import threading
import time

import pytest

from sglang_rq import canary as canary_mod
from sglang_rq.canary import Canary, CanaryResult, CanarySpec
from sglang_rq.readiness import ERROR_THRESHOLD, classify, is_ready

SPEC = CanarySpec(input_ids=[5, 6, 7], max_new_tokens=4, expect_ids=[1, 2, 3, 4], match_tokens=2)


@pytest.mark.parametrize("outcome,depth,expected", [
    ("pass", 0, "pass"), ("pass", 7, "pass"),
    ("wrong_answer", 0, "wrong_answer"), ("wrong_answer", 12, "wrong_answer"),
    ("error", 0, "error"), ("error", 12, "error"),  # a refused connection is never "busy"
    ("timeout", 12, "saturated"), ("pending", 1, "saturated"), ("overloaded", 3, "saturated"),
    ("timeout", 0, "error"), ("pending", 0, "error"), ("overloaded", 0, "error"),
    ("pending", -1, "error"),  # /v1/loads did not answer: not merely busy
])
def test_classify(outcome, depth, expected):
    assert classify(outcome=outcome, queue_depth=depth) == expected


def test_classify_rejects_unknown_outcome():
    with pytest.raises(ValueError, match="'late'"):
        classify(outcome="late", queue_depth=0)


def test_is_ready_rules():
    kw = dict(wrong=False, errors_in_row=0, seconds_since_pass=1.0, stale_after_s=120.0)
    assert is_ready(last_result=None, **kw) == (False, "canary has not run yet")
    assert is_ready(last_result="pass", **kw) == (True, "ok")
    assert is_ready(last_result="saturated", **kw)[0] is True
    assert is_ready(last_result="wrong_answer", **{**kw, "wrong": True})[0] is False
    assert is_ready(last_result="error", **{**kw, "errors_in_row": ERROR_THRESHOLD})[0] is False
    assert is_ready(last_result="error", **{**kw, "errors_in_row": ERROR_THRESHOLD - 1})[0]
    assert is_ready(last_result="pass", **{**kw, "seconds_since_pass": 121.0})[0] is False


def _res(result: str, t: float, matched: int = 0) -> CanaryResult:
    return CanaryResult(result, matched, 0.1, [], "", t)


def test_saturation_never_flips_readiness_but_a_wrong_answer_does():
    c = Canary("http://127.0.0.1:1", SPEC, interval_s=30)
    t0 = time.time() - 3600  # the pass is an hour old: only saturated periods since
    c.record(_res("pass", t0, 4))
    for i in range(1, 100):  # 99 saturated periods recorded now, the pass far past 120 s stale
        c.record(_res("saturated", time.time()))
        ready, body = c.status()
        assert ready and body["saturated"], (i, body)
    assert c.status()[1]["errors_in_row"] == 0
    c.record(_res("wrong_answer", time.time(), 1))
    assert c.status()[0] is False
    c.record(_res("saturated", time.time()))  # still the last completed verdict: wrong
    assert c.status()[0] is False
    c.record(_res("pass", time.time(), 4))
    assert c.status()[0] is True


def test_saturated_before_any_pass_is_not_ready():
    c = Canary("http://127.0.0.1:1", SPEC, interval_s=30)
    c.record(_res("saturated", time.time()))
    ready, body = c.status()
    assert not ready and body["reason"] == "no recent passing canary"


class _FakeWorker:
    """Stands in for ``ask``, ``queue_depth`` and ``/abort_request``."""

    def __init__(self, monkeypatch) -> None:
        self.release = threading.Event()
        self.answer: list[int] = [1, 2, 3, 4]
        self.depth = 0
        self.asked = 0
        self.aborted: list[str] = []
        monkeypatch.setattr(canary_mod, "ask", self.ask)
        monkeypatch.setattr(canary_mod, "queue_depth", lambda url, **kw: self.depth)
        monkeypatch.setattr(Canary, "_abort", lambda c, rid: self.aborted.append(rid))

    def ask(self, url, spec, **kw):
        self.asked += 1
        self.release.wait(30)
        return "answered", list(self.answer), CanaryResult("answered", latency_s=0.5)


def test_tick_waits_for_a_queued_canary_without_resending(monkeypatch):
    w = _FakeWorker(monkeypatch)
    c = Canary("http://127.0.0.1:1", SPEC, interval_s=30)
    c.wait_s = 0.05
    w.release.set()
    assert c.tick().result == "pass"
    w.release.clear()
    w.depth = 12  # 12 other requests running or queued
    for _ in range(3):
        assert c.tick().result == "saturated"
        assert c.status()[0]
    assert w.asked == 2 and not w.aborted  # the queued canary is waited for, not resent
    w.answer = [1, 9, 9, 9]  # it finally completes, with a wrong answer
    w.release.set()
    res = c.tick()
    assert (res.result, res.matched_tokens) == ("wrong_answer", 1)
    assert c.status()[0] is False


def test_tick_on_idle_worker_is_an_error_and_aborts_the_stuck_canary(monkeypatch):
    w = _FakeWorker(monkeypatch)
    c = Canary("http://127.0.0.1:1", SPEC, interval_s=30)
    c.wait_s = 0.05
    w.release.set()
    c.tick()
    w.release.clear()
    w.depth = 0  # nothing else runs, yet the canary does not finish
    assert c.tick().result == "error"
    assert len(w.aborted) == 1
    for _ in range(ERROR_THRESHOLD - 1):
        c.tick()
    assert w.asked == 1 + ERROR_THRESHOLD  # each error drops the canary and sends a new one
    assert c.status()[0] is False
    w.release.set()


def test_priority_only_with_priority_scheduling():
    class Args:
        enable_priority_scheduling = False
        schedule_low_priority_values_first = False

    assert canary_mod.canary_priority(Args()) is None
    Args.enable_priority_scheduling = True
    assert canary_mod.canary_priority(Args()) == 2**62
    Args.schedule_low_priority_values_first = True
    assert canary_mod.canary_priority(Args()) == -(2**62)


def test_queue_depth_reads_the_load_snapshot_and_distrusts_a_stale_one():
    """`readiness.queue_depth` against a local HTTP server answering ``/v1/loads`` as SGLang
    0.5.23 does (per DP rank: ``timestamp``, ``num_running_reqs``, ``num_waiting_reqs``). A
    snapshot older than ``LOADS_STALE_S`` (a stuck scheduler, which kept answering a 425-second
    old one in a new-user review, 12-06) or never published (timestamp 0) is unknown: -1, which
    `classify` turns into an error for a pending canary instead of "saturated"."""
    import http.server
    import json as _json

    from sglang_rq.readiness import LOADS_STALE_S, classify, queue_depth

    loads: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            body = _json.dumps({"timestamp": "2026-12-06T00:00:00+00:00", "loads": loads}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        now = time.time()
        loads[:] = [dict(dp_rank=0, timestamp=now - 1, num_running_reqs=5, num_waiting_reqs=7),
                    dict(dp_rank=1, timestamp=now - 2, num_running_reqs=1, num_waiting_reqs=0)]
        assert queue_depth(url, exclude=1) == 12  # 5 + 7 + 1 + 0, less the canary
        loads[1]["timestamp"] = now - LOADS_STALE_S - 5  # one rank stuck
        assert queue_depth(url, exclude=1) == -1
        assert classify(outcome="pending", queue_depth=-1) == "error"
        loads[1]["timestamp"] = 0.0  # never published
        assert queue_depth(url, exclude=1) == -1
    finally:
        srv.shutdown()
