"""Requests through the smg router (cache-aware, health = /rq/ready) to 2 real CPU workers.

``SGLANG_RQ_UPDATE_CAPTURE=1`` rewrites ``tests/data/router_metrics_capture.txt``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.server import free_port
from tests.test_deploy_metrics import (FLAGS, make_checkpoint, sample, scrape, start_servers,
                                      wait_canary)

pytestmark = pytest.mark.engine
pytest.importorskip("smg", reason="the router: pip install -e '.[serve]'")

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ckpt = make_checkpoint(tmp_path_factory.mktemp("ouro-router"))
    logs = tmp_path_factory.mktemp("router-logs")
    workers = start_servers([(["--model-path", str(ckpt), *FLAGS], logs / f"worker-{i}.log")
                             for i in range(2)])
    router = log = None
    try:
        for w in workers:
            assert wait_canary(w.url).status_code == 200
        port, metrics_port = free_port(), free_port()
        log = open(logs / "router.log", "wb")
        router = subprocess.Popen(
            [sys.executable, "-m", "smg.launch_router", "--host", "127.0.0.1", "--port", str(port),
             "--worker-urls", *[w.url for w in workers], "--policy", "cache_aware",
             "--health-check-endpoint", "/rq/ready", "--health-check-interval-secs", "5",
             "--health-success-threshold", "1", "--worker-startup-timeout-secs", "600",
             "--worker-startup-check-interval", "2",
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 600
        while time.time() < deadline:
            assert router.poll() is None, (logs / "router.log").read_text()[-3000:]
            try:
                if requests.get(url + "/v1/models", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(2)
        else:
            raise TimeoutError((logs / "router.log").read_text()[-3000:])
        yield ckpt, workers, url, f"http://127.0.0.1:{metrics_port}"
    finally:
        if router is not None:
            os.killpg(router.pid, signal.SIGTERM)
            try:
                router.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(router.pid, signal.SIGKILL)
        if log is not None:
            log.close()
        for w in workers:
            w.stop()


def _requests_served(workers) -> float:
    return sum(sample(scrape(w.url), "sglang:num_requests_total", 'is_streaming="false"')
               if 'is_streaming="false"' in scrape(w.url) else 0.0 for w in workers)


def test_requests_through_router_reach_workers(cluster):
    ckpt, workers, url, _ = cluster
    before = _requests_served(workers)
    prompts = ["Once upon a time, there was a", "The quick brown fox jumps over the",
               "Once upon a time, there was a king"]
    for p in prompts:
        r = requests.post(url + "/v1/completions", timeout=300, json={
            "model": str(ckpt), "prompt": p, "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["text"] is not None and body["usage"]["completion_tokens"] == 4
    r = requests.post(url + "/generate", timeout=300, json={
        "text": prompts[0], "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 3, r.text
    assert _requests_served(workers) - before == len(prompts) + 1


def test_router_metrics(cluster):
    _, _, _, metrics_url = cluster
    text = requests.get(metrics_url + "/metrics", timeout=10).text
    assert "smg_http_requests_total" in text and "smg_http_responses_total" in text
    if os.environ.get("SGLANG_RQ_UPDATE_CAPTURE") == "1":
        (DATA / "router_metrics_capture.txt").write_text(text)
