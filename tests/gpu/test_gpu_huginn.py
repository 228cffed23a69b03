"""The embedded mini-Huginn on a CUDA GPU through `sglang-rq serve` with the ResidualQuant pool.

Two arms, each against the fp32 plain-PyTorch reference (`HuginnReferenceModel`, teacher-forced
argmax on the same GPU) on English text (this repository's README, tokenized with the model's
tokenizer), positions after the first prefill chunk (read from the compressed cache):

- ``rq_default``: BF16 prelude/coda, which the PyTorch twin decodes, so the launcher turns decode
  CUDA graphs off (`dispatch.graph_blocker`; its line must be in the log);
- ``rq_unlooped8``: ``--rq-unlooped-bits 8``, every layer on the fused kernels, decode CUDA
  graphs on.

Skipped without CUDA. Run on a GPU host: ``pytest tests/gpu/test_gpu_huginn.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sglang_rq.models.embedded import EMBEDDED_HUGINN
from tests.server import Server

pytestmark = [pytest.mark.gpu, pytest.mark.engine,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CHUNK = 64
COMMON = ["--model-path", str(EMBEDDED_HUGINN), "--rq-no-canary", "--max-total-tokens", "16384",
          "--mem-fraction-static", "0.3", "--chunked-prefill-size", str(CHUNK),
          "--cuda-graph-max-bs-decode", "8", "--max-running-requests", "8"]
ARMS = {"rq_default": [], "rq_unlooped8": ["--rq-unlooped-bits", "8"]}


@pytest.fixture(scope="module")
def docs():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(EMBEDDED_HUGINN / "tokenizer.json"))
    ids = tok.encode((Path(__file__).resolve().parents[2] / "README.md").read_text()).ids
    return [ids[i * 400:(i + 1) * 400] for i in range(2)]


@pytest.fixture(scope="module")
def reference_top1(docs):
    from sglang_rq.models.huginn_reference import HuginnReferenceModel

    model = HuginnReferenceModel.from_pretrained(EMBEDDED_HUGINN, dtype=torch.float32).cuda()
    with torch.no_grad():
        return [model(torch.tensor([d], device="cuda"))[0].argmax(-1).tolist() for d in docs]


@pytest.mark.parametrize("arm", list(ARMS))
def test_rq_arm_agrees_with_the_reference(arm, docs, reference_top1, tmp_path):
    from sglang_rq.quality import harness

    server = Server(COMMON + ARMS[arm], tmp_path / f"{arm}.log")
    try:
        got = harness.score_documents(server.url, docs, top_k=1, score_from=CHUNK + 1)
        text = server.generate_greedy([docs[0][:32]], 32)[0][0]
        log = server.log()
    finally:
        server.stop()
    pairs = [(max(top, key=top.get), ref[i - 1]) for d_top, ref in zip(got["top"], reference_top1)
             for i, top in enumerate(d_top, start=CHUNK + 1)]
    agreement = sum(a == b for a, b in pairs) / len(pairs)
    print(f"{arm}: teacher-forced top-1 vs fp32 reference {agreement:.3f} over {len(pairs)} "
          f"positions; greedy {text}")
    assert len(text) == 32
    assert ("CUDA graphs off" in log) == (arm == "rq_default"), log[-3000:]
    # The CPU head-to-head (docs/results/huginn) measures the BF16 pool against this reference
    # at ~0.98 and the default format at ~0.9: a wiring error gives near-chance agreement.
    assert agreement >= 0.8, agreement
