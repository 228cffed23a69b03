"""The readiness verdict of the canary (no server: results are fed in as a run would produce)."""

from __future__ import annotations

import time

import pytest

from sglang_rq.canary import ERROR_THRESHOLD, Canary, CanaryResult, CanarySpec

SPEC = CanarySpec(input_ids=[5, 6, 7], max_new_tokens=4, expect_ids=[1, 2, 3, 4], match_tokens=2)


def _canary(**kw) -> Canary:
    return Canary("http://127.0.0.1:1", SPEC, interval_s=30, **kw)


def test_not_ready_before_first_run_then_ready_after_pass():
    c = _canary()
    ready, body = c.status()
    assert not ready and body["reason"] == "canary has not run yet"
    c.record(CanaryResult("pass", 4, 0.1, [1, 2, 3, 4], "", time.time()))
    ready, body = c.status()
    assert ready and body["mode"] == "expected-answer"


def test_wrong_answer_is_immediately_not_ready_errors_only_after_threshold():
    c = _canary()
    c.record(CanaryResult("pass", 4, 0.1, [1, 2, 3, 4], "", time.time()))
    for i in range(ERROR_THRESHOLD - 1):
        c.record(CanaryResult("error", time_s=time.time(), detail="timeout"))
        assert c.status()[0], i  # a busy worker stays ready
    c.record(CanaryResult("error", time_s=time.time(), detail="timeout"))
    assert not c.status()[0]
    c.record(CanaryResult("pass", 4, 0.1, [1, 2, 3, 4], "", time.time()))
    assert c.status()[0]
    c.record(CanaryResult("wrong_answer", 1, 0.1, [1, 9, 9, 9], "", time.time()))
    ready, body = c.status()
    assert not ready and "wrong answer" in body["reason"]


def test_stale_pass_and_stale_spec_are_not_ready():
    c = _canary()
    c.record(CanaryResult("pass", 4, 0.1, [1, 2, 3, 4], "", time.time() - 3600))
    assert c.status()[1]["reason"] == "no recent passing canary"
    s = _canary(stale_reason="recorded for other weights")
    s.record(CanaryResult("pass", 4, 0.1, [1, 2, 3, 4], "", time.time()))
    assert not s.status()[0]


def test_disabled_canary_follows_health_only():
    c = _canary(enabled=False)
    assert not c.status()[0]
    c._healthy = True  # set by the thread once /health answers
    ready, body = c.status()
    assert ready and body["mode"] == "disabled"


def test_spec_validation():
    with pytest.raises(ValueError, match="input_ids"):
        CanarySpec(input_ids=[])
    with pytest.raises(ValueError, match="match_tokens"):
        CanarySpec(input_ids=[1], expect_ids=[1], match_tokens=2)
