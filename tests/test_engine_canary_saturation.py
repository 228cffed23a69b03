"""Readiness under saturation on a real CPU server (issue 13 item 1; SGLang HTTP, no mocks).

The small random Ouro of `tests.test_deploy_metrics` with its recorded canary, a 1024-token pool
and a 2 s canary interval (one period = up to 10 s waiting for a queued canary + 2 s):

1. 32 clients send 300-token prompts with 180 greedy tokens for 45 s (the pool holds two at a
   time, so a canary queues behind about 30 of them: longer than its 10 s wait even on a fast
   CPU; with 16 clients it waited 9.0-9.7 s on 2026-12-02 and never counted as saturated);
   ``/rq/ready`` polled every second answers 200 every time, and the canary reports
   ``saturated`` at least once (`sglang_rq_canary_saturated`, ``runs_total{result="saturated"}``);
2. load stopped, the canary file is rewritten with a wrong expected answer: ``/rq/ready`` turns
   503 within one period while ``/health`` stays 200.
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest
import requests

from sglang_rq.canary import CanarySpec
from tests.server import Server
from tests.test_deploy_metrics import make_checkpoint, sample, scrape

pytestmark = pytest.mark.engine

INTERVAL_S, WAIT_S = 2.0, 10.0  # Canary.wait_s = min(max(interval, 10), 60)
CLIENTS, PROMPT_TOKENS, NEW_TOKENS, LOAD_S = 32, 300, 180, 45.0  # context 512


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    ckpt = make_checkpoint(tmp_path_factory.mktemp("ouro-sat"))
    spec_file = tmp_path_factory.mktemp("spec") / "canary.json"
    CanarySpec.load(ckpt / "canary.json").save(spec_file)
    srv = Server(["--model-path", str(ckpt), "--enable-metrics", "--max-total-tokens", "1024",
                  "--chunked-prefill-size", "256", "--rq-canary-file", str(spec_file),
                  "--rq-canary-interval-s", str(INTERVAL_S)],
                 tmp_path_factory.mktemp("logs") / "sat.log")
    yield srv, spec_file
    srv.stop()


def _wait_first_pass(url: str, timeout_s: float = 180) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if requests.get(url + "/rq/ready", timeout=10).status_code == 200:
            return
        time.sleep(1)
    raise TimeoutError(requests.get(url + "/rq/canary", timeout=10).text)


def _load(url: str, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        ids = [rng.randrange(10, 8000) for _ in range(PROMPT_TOKENS)]  # no radix hits
        try:
            requests.post(url + "/generate", timeout=600, json={
                "input_ids": ids, "sampling_params": {"max_new_tokens": NEW_TOKENS,
                                                      "temperature": 0.0, "ignore_eos": True}})
        except requests.RequestException:
            pass


def test_saturated_worker_stays_ready_then_wrong_answer_is_unready(worker):
    srv, spec_file = worker
    _wait_first_pass(srv.url)
    stop = threading.Event()
    threads = [threading.Thread(target=_load, args=(srv.url, stop, i), daemon=True)
               for i in range(CLIENTS)]
    for t in threads:
        t.start()
    polls, saturated_seen, depth_seen = [], 0, 0
    t_end = time.time() + LOAD_S
    while time.time() < t_end:
        r = requests.get(srv.url + "/rq/ready", timeout=10)
        polls.append(r.status_code)
        saturated_seen += int(r.json()["saturated"])
        loads = requests.get(srv.url + "/v1/loads", params={"include": "core"}, timeout=30)
        depth_seen = max(depth_seen, loads.json()["loads"][0]["num_waiting_reqs"])
        time.sleep(1)
    text = scrape(srv.url)
    stop.set()
    requests.post(srv.url + "/abort_request", json={"abort_all": True}, timeout=30)
    for t in threads:
        t.join(timeout=60)
    assert depth_seen >= CLIENTS - 4, depth_seen  # the load really queued
    assert polls and all(s == 200 for s in polls), polls
    assert sample(text, "sglang_rq_canary_runs_total", 'result="saturated"') >= 1
    assert saturated_seen >= 1
    assert sample(text, "sglang_rq_canary_runs_total", 'result="error"') == 0

    # abort_all also aborted the queued canary: that is not a wrong answer (regression: it was
    # judged as one, 0 tokens matched); the next canary passes on the idle worker.
    runs = scrape(srv.url)
    assert sample(runs, "sglang_rq_canary_runs_total", 'result="wrong_answer"') == 0
    _wait_first_pass(srv.url, timeout_s=INTERVAL_S + WAIT_S + 10)
    good = CanarySpec.load(spec_file)
    CanarySpec(input_ids=good.input_ids, max_new_tokens=good.max_new_tokens,
               expect_ids=[(t + 1) % 8192 for t in good.expect_ids],
               match_tokens=good.match_tokens).save(spec_file)
    os.utime(spec_file, (time.time() + 5, time.time() + 5))  # a new mtime even on coarse clocks
    t0 = time.time()
    while requests.get(srv.url + "/rq/ready", timeout=10).status_code == 200:
        assert time.time() - t0 < INTERVAL_S + WAIT_S + 5, "still ready after one period"
        time.sleep(0.2)
    body = requests.get(srv.url + "/rq/canary", timeout=10).json()
    print(f"unready {time.time() - t0:.1f}s after the wrong spec; {len(polls)} polls all 200, "
          f"saturated in {saturated_seen}, max waiting {depth_seen}")
    assert body["last"]["result"] == "wrong_answer" and "wrong answer" in body["reason"]
    assert requests.get(srv.url + "/health", timeout=10).status_code == 200
