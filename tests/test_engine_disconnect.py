"""A client that disconnects during a long chunked prefill (issue 13 item 5), on one real CPU
server (the embedded mini-Ouro, RQ pool, ``--chunked-prefill-size 128``).

SGLang 0.5.23 already drops a disconnected request at the next chunk boundary: the tokenizer
manager notices the vanished client when its per-request wait times out
(``SGLANG_REQUEST_STATE_WAIT_TIMEOUT``, SGLang's default 4 s, the launcher's 1 s) and sends an
abort; the scheduler's ``process_pending_chunked_abort`` frees the chunked request before the
next chunk is scheduled. What cannot be cut short is the forward already running (one chunk).

A 2000-token prompt (context limit 2048) is sent with a 1 s client timeout; the test waits
until SGLang's cumulative prefill counter (``total_prefill_uncached_tokens`` in ``/v1/loads``)
has stopped moving and asserts that fewer than half of the prompt's tokens were prefilled
(measured: 128 of 2000 with the launcher's 1 s, 256-384 with SGLang's 4 s; a prefill that ran to
the end would count 2000), that the abort was logged as a disconnect, that the pool is empty
after ``/flush_cache`` and that the server answers again.
"""

from __future__ import annotations

import random
import time

import pytest
import requests

from tests.server import Server

pytestmark = pytest.mark.engine

PROMPT_TOKENS, CHUNK = 2000, 128
FLAGS = ["--max-total-tokens", "4096", "--chunked-prefill-size", str(CHUNK),
         "--max-running-requests", "4", "--rq-no-canary"]
QUIET_S = 6.0  # the prefill counter must stand still this long (> 2 chunks on this machine)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(FLAGS, tmp_path_factory.mktemp("logs") / "disconnect.log")
    yield srv
    srv.stop()


def loads(url: str) -> dict:
    """SGLang's load snapshot (republished after every prefill step and when idle)."""
    r = requests.get(url + "/v1/loads", params={"include": "core"}, timeout=60)
    r.raise_for_status()
    return r.json()["loads"][0]


def test_disconnected_prefill_stops_at_a_chunk_boundary(server):
    rng = random.Random(13)
    prompt = [rng.randrange(3, 8000) for _ in range(PROMPT_TOKENS)]
    base = loads(server.url)["total_prefill_uncached_tokens"]
    with pytest.raises(requests.Timeout):
        requests.post(server.url + "/generate", timeout=1.0, json={
            "input_ids": prompt, "sampling_params": {"max_new_tokens": 1}})
    t_disconnect = time.monotonic()
    last, t_last = 0, t_disconnect
    while time.monotonic() - t_last < QUIET_S and time.monotonic() - t_disconnect < 120:
        snap = loads(server.url)
        done = snap["total_prefill_uncached_tokens"] - base
        if done != last or snap["num_running_reqs"] or snap["num_waiting_reqs"]:
            last, t_last = done, time.monotonic()
        time.sleep(0.1)
    print(f"prefilled {last} of {PROMPT_TOKENS} tokens; last progress "
          f"{t_last - t_disconnect:.2f} s after the disconnect", flush=True)
    assert 0 < last < PROMPT_TOKENS // 2, last
    assert "Request is disconnected from the client side" in server.log()
    requests.post(server.url + "/flush_cache", timeout=60).raise_for_status()
    assert loads(server.url)["num_used_tokens"] == 0
    assert len(server.generate_ids([[1, 500, 600]], 3)[0]) == 3
