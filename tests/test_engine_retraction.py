"""Retraction with the compressed pool (issue 13 item 4), on one real CPU server.

SGLang 0.5.23 retracts running decode requests when the pool cannot hold the next step
(`ScheduleBatch.retract_decode`): their slots are freed and they are re-queued, to be prefilled
again over whatever prefix the radix cache still holds (here: compressed pages). Natural
pressure is hard to produce reliably on a tiny pool (admission reserves room for the expected
output), so the server runs SGLang's own test switch ``SGLANG_TEST_RETRACT=1``: every
``SGLANG_TEST_RETRACT_INTERVAL``-th decode step retracts one running request (never the last),
through the same `retract_decode` code path as a full pool.

The embedded mini-Ouro with the default RQ format decodes `tests/embedded_greedy.PROMPTS`
together, 32 greedy tokens each:

* retraction happened (the scheduler logged ``Testing retraction. #retracted_reqs: N`` with
  N >= 1, and ``sglang:num_retracted_requests_total`` counted it);
* every request finished with 32 tokens, and its tokens equal the recorded CPU ``rq_native``
  run without retraction up to the first near-tie of that run (the rule of
  `tests/embedded_greedy.greedy_mismatches`: re-prefilling the generated tokens attends them
  in flight instead of compressed, a different summation, never a different answer at a
  confident position);
* no slot leaks: after ``/flush_cache`` the pool is empty again (``num_used_tokens`` 0 in
  ``/v1/loads``, computed live)
  and the server still answers (SGLang's idle memory check would have killed the scheduler).
"""

from __future__ import annotations

import re
import time

import pytest
import requests

from tests.embedded_greedy import NEW_TOKENS, greedy_mismatches, load_golden, prompt_ids
from tests.server import Server

pytestmark = pytest.mark.engine

FLAGS = ["--enable-metrics", "--max-total-tokens", "2048", "--chunked-prefill-size", "256",
         "--max-running-requests", "8", "--rq-no-canary"]
RETRACT_ENV = {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "5"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(FLAGS, tmp_path_factory.mktemp("logs") / "retraction.log", env=RETRACT_ENV)
    yield srv
    srv.stop()


def test_retracted_requests_resume_with_the_same_greedy_tokens(server):
    tokens, _ = server.generate_greedy(prompt_ids(), NEW_TOKENS)
    retracted = sum(int(n) for n in re.findall(r"Testing retraction\. #retracted_reqs: (\d+)",
                                               server.log()))
    assert retracted >= 1, "SGLang did not retract any request; the test exercised nothing"
    assert server.metric("sglang:num_retracted_requests_total") >= 1
    assert [len(t) for t in tokens] == [NEW_TOKENS] * len(tokens)
    ref = load_golden()["rq_native"]
    assert not greedy_mismatches(tokens, ref["tokens"], ref["margins"])


def used_tokens(url: str) -> int:
    """Pool slots in use, computed live by the scheduler (``/v1/loads``)."""
    r = requests.get(url + "/v1/loads", params={"include": "core"}, timeout=30)
    r.raise_for_status()
    return sum(int(x["num_used_tokens"]) for x in r.json()["loads"])


def test_pool_returns_to_empty_after_retractions(server):
    server.generate_ids(prompt_ids(), 12)  # retracts again (interval 5)
    deadline = time.time() + 60
    while True:
        requests.post(server.url + "/flush_cache", timeout=30).raise_for_status()
        if used_tokens(server.url) == 0 or time.time() > deadline:
            break
        time.sleep(1)
    assert used_tokens(server.url) == 0
    assert len(server.generate_ids([[1, 500, 600]], 3)[0]) == 3
