"""The K/V prescale with decode CUDA graphs on a CUDA GPU (issue 13 item 2; real servers).

The outlier checkpoint of `tests.test_engine_robustness` (mini-Ouro, layer 1's K rows scaled by
1e4) served with the RQ pool and decode CUDA graphs on (the default). The graphs are captured
unscaled at start-up; the first prefill calibrates layer 1 to a factor, so the backend turns
decode graph replay off (`RQTritonAttnBackend.stop_decode_graphs`) and stores K/V prescaled:

* the log says so and ``sglang_rq_decode_graphs_stopped`` is 1; no group clips;
* greedy tokens equal those of the same server started with ``--disable-cuda-graph`` (the same
  eager path over the same bytes);
* teacher-forced top-1 against the BF16 pool is at least 0.75 (CPU: 0.825 prescaled, 0.654
  unscaled).

Skipped without CUDA. Run on a GPU host: ``pytest tests/gpu/test_gpu_prescale.py``.
"""

from __future__ import annotations

import pytest
import torch

from tests.server import Server
from tests.test_engine_robustness import OUTLIER_LAYER, _english_docs, clipped, outlier_checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.engine,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

FLAGS = ["--enable-metrics", "--rq-no-canary", "--max-total-tokens", "16384",
         "--mem-fraction-static", "0.3", "--chunked-prefill-size", "256",
         "--cuda-graph-max-bs-decode", "8", "--max-running-requests", "8"]


def test_prescale_after_capture_turns_decode_graphs_off(tmp_path):
    from sglang_rq.quality import harness, metrics

    ckpt = outlier_checkpoint(tmp_path / "ouro-outlier")
    docs = _english_docs()
    prompts = [d[:48] for d in docs]
    got = {}
    for name, extra in (("graphs", []), ("eager", ["--disable-cuda-graph"]),
                        ("bf16", ["--rq-disable"])):
        srv = Server(["--model-path", str(ckpt), *FLAGS, *extra], tmp_path / f"{name}.log")
        try:
            got[name] = dict(scored=harness.score_documents(srv.url, docs, top_k=5, score_from=257),
                             greedy=srv.generate_greedy(prompts, 32)[0])
            if name == "graphs":
                counts, log = clipped(srv.url), srv.log()
                stopped = srv.metric("sglang_rq_decode_graphs_stopped")
        finally:
            srv.stop()
    assert "decode CUDA graphs turned off" in log and f"layer {OUTLIER_LAYER}" in log, log[-3000:]
    assert stopped == 1.0
    assert all(v == 0 for v in counts.values()), counts
    assert got["graphs"]["greedy"] == got["eager"]["greedy"]
    top = {k: [p for d in v["scored"]["top"] for p in d] for k, v in got.items()}
    agree = metrics.top1_agreement(top["bf16"], top["graphs"])
    print(f"GPU outlier checkpoint, graphs stopped: top-1 vs BF16 {agree:.3f}; clipped {counts}")
    assert agree >= 0.75, agree
