"""sglang-rq metrics and the readiness canary on real CPU servers (SGLang HTTP, no mocks).

One small random Ouro checkpoint (2 layers x 4 loops, 2 KV heads, head_dim 32) with the
SmolLM tokenizer; its canary spec is recorded from the fp32 reference model. Two servers:

* ``rq``: ResidualQuant pool, ``--enable-metrics``, the recorded canary: ``/metrics`` must carry
  the hand-computed bytes per token next to SGLang's families, ``/rq/ready`` must be 200;
* ``bad``: ``--rq-disable`` with a canary whose expected answer is wrong: ``/rq/ready`` must be
  503 while ``/health`` stays 200, and the BF16 format is published from the HTTP process; it
  runs under ``--api-key`` (`API_KEY`), which the canary and that publication must carry and the
  readiness probe must not need.

``SGLANG_RQ_UPDATE_CAPTURE=1`` rewrites ``tests/data/metrics_capture.txt`` from the ``rq`` server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
import requests

from sglang_rq.canary import CanarySpec, record
from sglang_rq.models.embedded import EMBEDDED_MODEL
from sglang_rq.models.ouro_reference import tiny_config, write_random_checkpoint
from tests.server import Server

pytestmark = pytest.mark.engine

DATA = Path(__file__).resolve().parent / "data"
LAYERS, LOOPS, KV_HEADS, D, G = 2, 4, 2, 32, 32
CHUNK, RUNNING = 256, 8
FLAGS = ["--enable-metrics", "--max-total-tokens", "4096", "--chunked-prefill-size", str(CHUNK),
         "--max-running-requests", str(RUNNING), "--rq-canary-interval-s", "3600"]
API_KEY = "test-key-45"


def make_checkpoint(path: Path) -> Path:
    """Random upstream-format Ouro + tokenizer files + a recorded canary.json."""
    cfg = tiny_config(vocab_size=8192, hidden_size=128, num_attention_heads=4,
                      num_key_value_heads=KV_HEADS, head_dim=D)
    write_random_checkpoint(path, cfg, seed=3)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(EMBEDDED_MODEL / name, path / name)
    record(path).save(path / "canary.json")
    return path


def start_servers(specs: list[tuple[list[str], Path]]) -> list[Server]:
    """Start servers concurrently (each start is ~2 min of CPU); stop all if one fails."""
    out: list[Server | BaseException | None] = [None] * len(specs)

    def one(i: int) -> None:
        try:
            out[i] = Server(*specs[i])
        except BaseException as exc:  # noqa: BLE001 - re-raised below after cleanup
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(specs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [o for o in out if isinstance(o, BaseException)]
    if errors:
        for o in out:
            if isinstance(o, Server):
                o.stop()
        raise errors[0]
    return out  # type: ignore[return-value]


def scrape(url: str) -> str:
    return requests.get(url + "/metrics", timeout=30).text


def sample(text: str, name: str, labels: str | None = None) -> float:
    pat = rf"^{re.escape(name)}(\{{[^}}]*\}})? ([0-9.eE+-]+)$"
    for m in re.finditer(pat, text, re.M):
        if labels is None or labels in (m.group(1) or ""):
            return float(m.group(2))
    raise KeyError(f"{name} {labels or ''} not in /metrics")


def wait_canary(url: str, timeout_s: float = 300) -> requests.Response:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        r = requests.get(url + "/rq/ready", timeout=10)
        if r.json()["last"] is not None:
            return r
        time.sleep(2)
    raise TimeoutError("canary did not run")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    ckpt = make_checkpoint(tmp_path_factory.mktemp("ouro-canary"))
    good = CanarySpec.load(ckpt / "canary.json")
    bad_spec = tmp_path_factory.mktemp("bad") / "canary.json"
    CanarySpec(input_ids=good.input_ids, max_new_tokens=good.max_new_tokens,
               expect_ids=[(t + 1) % 8192 for t in good.expect_ids],
               match_tokens=good.match_tokens).save(bad_spec)
    logs = tmp_path_factory.mktemp("logs")
    base = ["--model-path", str(ckpt), *FLAGS]
    rq, bad = start_servers([(base, logs / "rq.log"),
                             (base + ["--rq-disable", "--rq-canary-file", str(bad_spec),
                                      "--api-key", API_KEY], logs / "bad.log")])
    yield ckpt, rq, bad
    rq.stop()
    bad.stop()


def test_kv_metrics_equal_hand_computed_bytes(servers):
    ckpt, rq, _ = servers
    cfg = json.loads((ckpt / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["total_ut_steps"], cfg["num_key_value_heads"],
            cfg["head_dim"]) == (LAYERS, LOOPS, KV_HEADS, D)
    # Per (token, layer, K/V, head): anchor INT4 D/2 codes + 2*D/G FP8 scale/offset;
    # each of the 3 residual loops INT2 D/4 codes + 2*D/G FP8 + one BF16 c.
    anchor, residual = D // 2 + 2 * D // G, D // 4 + 2 * D // G + 2
    per_token = LAYERS * 2 * KV_HEADS * (anchor + (LOOPS - 1) * residual)
    bf16 = LOOPS * LAYERS * 2 * KV_HEADS * D * 2
    staging_tokens = max(CHUNK, RUNNING)
    staging = (LOOPS - 1) * LAYERS * staging_tokens * 2 * KV_HEADS * D * 2
    assert (per_token, bf16) == (432, 2048)
    text = scrape(rq.url)
    assert sample(text, "sglang_rq_kv_bytes_per_token") == per_token
    assert sample(text, "sglang_rq_kv_bf16_bytes_per_token") == bf16
    assert sample(text, "sglang_rq_kv_compression_ratio") == pytest.approx(bf16 / per_token)
    assert sample(text, "sglang_rq_kv_effective_bits") == pytest.approx(per_token * 8 / (bf16 / 2))
    assert sample(text, "sglang_rq_kv_staging_tokens") == staging_tokens
    assert sample(text, "sglang_rq_kv_staging_bytes") == staging
    assert sample(text, "sglang_rq_kv_rotation_bytes") == LAYERS * KV_HEADS * D * D * 4
    tokens = sample(text, "sglang:max_total_num_tokens")  # SGLang's family, same endpoint
    assert sample(text, "sglang_rq_kv_pool_tokens") == tokens
    info = 'group_size="32",head_dim="32",loop_bits="2,2,2,4"'
    assert sample(text, "sglang_rq_kv_format_info", info) == 1
    assert sample(text, "sglang_rq_nonfinite_attention_outputs_total") == 0
    assert sample(text, "sglang_rq_fallbacks_total", 'path="commit"') == 0
    # a sample from the start, as the module promises (a new-user review found only HELP/TYPE)
    assert sample(text, "sglang_rq_decode_graphs_stopped") == 0
    # sglang_rq.dispatch: the C library serves every path of the default format on CPU
    for path in ("commit", "decode", "extend"):
        assert sample(text, "sglang_rq_kernel_path_info", f'impl="c",path="{path}",reason=""') == 1
    if os.environ.get("SGLANG_RQ_UPDATE_CAPTURE") == "1":
        wait_canary(rq.url)
        requests.post(rq.url + "/v1/completions", timeout=300, json={
            "model": str(ckpt), "prompt": "capture", "max_tokens": 4, "stream": True})
        (DATA / "metrics_capture.txt").write_text(scrape(rq.url))


def test_committed_tokens_count_every_forwarded_token(servers):
    _, rq, _ = servers
    wait_canary(rq.url)
    before = sample(scrape(rq.url), "sglang_rq_committed_tokens_total")
    prompt = list(range(700, 737))  # 37 tokens, no radix hit
    out = rq.generate_ids([prompt], 5)[0]
    after = sample(scrape(rq.url), "sglang_rq_committed_tokens_total")
    assert len(out) == 5
    assert after - before == len(prompt) + len(out) - 1  # the last sampled token is never forwarded
    assert sample(scrape(rq.url), "sglang_rq_nonfinite_attention_outputs_total") == 0
    # The default format is served by the C library (rq_kernels.cpu_attention), not by the
    # PyTorch twin; a format it cannot serve would count here once per forward and path.
    text = scrape(rq.url)
    for path in ("commit", "decode", "extend"):
        assert sample(text, "sglang_rq_fallbacks_total", f'path="{path}"') == 0
    assert "running the PyTorch twin" not in rq.log()
    assert "kernel paths: commit=c, decode=c, extend=c" in rq.log()


def test_canary_ready_on_correct_answer(servers):
    _, rq, _ = servers
    r = wait_canary(rq.url)
    body = r.json()
    assert r.status_code == 200, body
    assert body["mode"] == "expected-answer" and body["last"]["result"] == "pass"
    assert requests.get(rq.url + "/health", timeout=10).status_code == 200
    text = scrape(rq.url)
    assert sample(text, "sglang_rq_canary_ok") == 1
    assert sample(text, "sglang_rq_canary_runs_total", 'result="pass"') >= 1


def test_canary_not_ready_on_wrong_answer_while_live(servers):
    _, _, bad = servers
    r = wait_canary(bad.url)
    assert r.status_code == 503
    assert r.json()["last"]["result"] == "wrong_answer"
    assert "wrong answer" in r.json()["reason"]
    assert requests.get(bad.url + "/health", timeout=10).status_code == 200
    text = scrape(bad.url)
    assert sample(text, "sglang_rq_canary_ok") == 0
    assert sample(text, "sglang_rq_canary_runs_total", 'result="wrong_answer"') >= 1
    # --rq-disable: the BF16 format is published from the HTTP process once it is healthy
    assert sample(text, "sglang_rq_kv_format_info", 'enabled="false"') == 1
    assert sample(text, "sglang_rq_kv_compression_ratio") == 1
    assert sample(text, "sglang_rq_kv_bytes_per_token") == LOOPS * LAYERS * 2 * KV_HEADS * D * 2
    # under --api-key (a new-user review, 12-06): /rq/ready answered 401 without the key, and the
    # BF16 pool was published as 0 tokens (the 401 body read as server info); the pool's tokens
    # are SGLang's own figure, its route guarded by the key
    info = requests.get(bad.url + "/get_server_info", timeout=10)
    assert info.status_code == 401
    info = requests.get(bad.url + "/get_server_info", timeout=10,
                        headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert sample(text, "sglang_rq_kv_pool_tokens") == info["max_total_num_tokens"] > 0
