"""Readiness canary: a fixed prompt whose greedy answer is known, asked on the quantized path.

A worker whose KV cache decodes garbage still answers ``/health``; this module makes such a
worker *not ready*. A background thread in the HTTP server process sends the spec's prompt
(token ids) to the worker's own ``/generate`` every ``SGLANG_RQ_CANARY_INTERVAL_S`` seconds,
greedy, and compares the leading tokens with the expected ones. The answer decodes through the
compressed pages (every step after the first reads the prompt's committed, quantized K/V), and
the repeated prompt is a radix-cache hit, so the cached-prefix path is exercised too.

Routes added to SGLang's FastAPI app (`install`):

* ``GET /rq/ready``  200 when the last canary passed (and is fresh), else 503; JSON body.
  Use it for the Kubernetes readinessProbe and the router's ``--health-check-endpoint``.
* ``GET /rq/canary`` 200 always; the same JSON (for humans and dashboards).

Liveness stays SGLang's cheap ``/health``. Rules: a *wrong answer* makes the worker not ready at
once; request errors or timeouts (an overloaded worker) only after ``ERROR_THRESHOLD`` in a row.

Spec (JSON, ``--rq-canary-file`` / ``SGLANG_RQ_CANARY_FILE``, default ``<model>/canary.json``)::

    {"input_ids": [...], "max_new_tokens": 8, "expect_ids": [...], "match_tokens": 6,
     "prompt": "text (documentation only)", "weights_fingerprint": "sha256..."}

``python -m sglang_rq.canary record --model-path DIR`` writes one from the plain PyTorch
reference (fp32, unquantized), keeping only the leading tokens whose top-1 logit margin is large
enough to survive BF16 and KV quantization. Without a spec the canary only checks that greedy
generation returns tokens ("generation-only" mode, reported in the JSON).
``python -m sglang_rq.canary check --url URL`` runs it once (exit 0/1), e.g. as an exec probe.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sglang_rq import env, metrics

logger = logging.getLogger(__name__)

ERROR_THRESHOLD = 3
REQUEST_TIMEOUT_S = 60.0
DEFAULT_PROMPTS = (
    "The capital of France is",
    "Question: What is 2 + 3?\nAnswer:",
    "Once upon a time, there was a",
    "The quick brown fox jumps over the",
)


@dataclass(frozen=True)
class CanarySpec:
    """The question and its known greedy answer (token ids; tokenizer-independent)."""

    input_ids: list[int]
    max_new_tokens: int = 8
    expect_ids: list[int] = field(default_factory=list)
    match_tokens: int = 0
    prompt: str = ""
    weights_fingerprint: str = ""

    def __post_init__(self) -> None:
        if not self.input_ids:
            raise ValueError("canary spec: input_ids is empty")
        if self.match_tokens > len(self.expect_ids) or self.match_tokens > self.max_new_tokens:
            raise ValueError(f"canary spec: match_tokens={self.match_tokens} exceeds expect_ids "
                             f"({len(self.expect_ids)}) or max_new_tokens ({self.max_new_tokens})")

    @classmethod
    def load(cls, path: str | Path) -> CanarySpec:
        return cls(**json.loads(Path(path).read_text()))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1) + "\n")


@dataclass
class CanaryResult:
    """One run: ``result`` in ``metrics.CANARY_RESULTS``."""

    result: str
    matched_tokens: int = 0
    latency_s: float = 0.0
    output_ids: list[int] = field(default_factory=list)
    detail: str = ""
    time_s: float = 0.0


def weights_fingerprint(model_path: str | Path) -> str:
    """sha256 over name, size and a 1 MiB tail sample of every ``*.safetensors`` file.

    Cheap (reads ~1 MiB per shard) and changes when the weights are retrained.
    """
    h = hashlib.sha256()
    for f in sorted(Path(model_path).glob("*.safetensors")):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            fh.seek(max(0, size - (1 << 20)))
            h.update(fh.read())
    return h.hexdigest()


def run_once(url: str, spec: CanarySpec | None, *, api_key: str | None = None,
             timeout_s: float = REQUEST_TIMEOUT_S) -> CanaryResult:
    """Ask the canary question at ``url`` (SGLang ``/generate``) and judge the answer."""
    import requests

    ids = spec.input_ids if spec else [1, 2, 3, 4]
    n = spec.max_new_tokens if spec else 4
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    t0 = time.time()
    try:
        r = requests.post(url.rstrip("/") + "/generate", headers=headers, timeout=timeout_s, json={
            "input_ids": ids, "rid": f"rq-canary-{int(t0 * 1000)}",
            "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}})
        r.raise_for_status()
        out = r.json()
        out = out[0] if isinstance(out, list) else out
        got = [int(t) for t in out["output_ids"]]
    except Exception as exc:  # noqa: BLE001 - any failure is a failed canary, reported
        return CanaryResult("error", latency_s=time.time() - t0, detail=repr(exc)[:500], time_s=t0)
    latency = time.time() - t0
    if spec is None or not spec.expect_ids:
        ok = len(got) == n
        return CanaryResult("pass" if ok else "wrong_answer", len(got), latency, got,
                            "generation-only" if ok else f"expected {n} tokens", t0)
    matched = 0
    for a, b in zip(got, spec.expect_ids):
        if a != b:
            break
        matched += 1
    if matched >= spec.match_tokens:
        return CanaryResult("pass", matched, latency, got, "", t0)
    return CanaryResult("wrong_answer", matched, latency, got,
                        f"expected leading {spec.expect_ids[:spec.match_tokens]}, got {got}", t0)


class Canary:
    """The periodic canary of one worker and its readiness verdict (thread-safe)."""

    def __init__(self, url: str, spec: CanarySpec | None, *, interval_s: float,
                 api_key: str | None = None, stale_reason: str = "",
                 enabled: bool = True) -> None:
        self.url, self.spec, self.interval_s, self.api_key = url, spec, interval_s, api_key
        self.enabled, self._healthy = enabled, False
        self.stale_reason = stale_reason
        self._lock = threading.Lock()
        self._last: CanaryResult | None = None
        self._last_pass_s = 0.0
        self._errors_in_row = 0
        self._wrong = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_healthy: Any = None  # called once in the thread when /health first answers

    # ------------------------------------------------------------------ verdict
    def record(self, res: CanaryResult) -> None:
        with self._lock:
            self._last = res
            if res.result == "pass":
                self._last_pass_s, self._errors_in_row, self._wrong = res.time_s, 0, False
            elif res.result == "wrong_answer":
                self._wrong = True
            else:
                self._errors_in_row += 1
        metrics.record_canary(result=res.result, latency_s=res.latency_s,
                              matched_tokens=res.matched_tokens, now_s=res.time_s)
        log = logger.info if res.result == "pass" else logger.error
        log("sglang-rq canary: %s (%d tokens matched, %.2fs) %s", res.result,
            res.matched_tokens, res.latency_s, res.detail)

    def status(self) -> tuple[bool, dict[str, Any]]:
        """``(ready, json)``: ready iff a canary passed, none failed since, and it is fresh."""
        with self._lock:
            last, now = self._last, time.time()
            fresh = now - self._last_pass_s <= max(4 * self.interval_s, 120.0)
            if not self.enabled:
                ready, why = self._healthy, "canary disabled (--rq-no-canary): /health only"
            elif self.stale_reason:
                ready, why = False, self.stale_reason
            elif last is None:
                ready, why = False, "canary has not run yet"
            elif self._wrong:
                ready, why = False, "wrong answer on the quantized path"
            elif self._errors_in_row >= ERROR_THRESHOLD:
                ready, why = False, f"{self._errors_in_row} canary errors in a row"
            elif self._last_pass_s == 0.0 or not fresh:
                ready, why = False, "no recent passing canary"
            else:
                ready, why = True, "ok"
            mode = ("disabled" if not self.enabled else "expected-answer"
                    if self.spec and self.spec.expect_ids else "generation-only")
            body = {"ready": ready, "reason": why, "mode": mode,
                    "interval_s": self.interval_s, "last_pass_time_s": self._last_pass_s,
                    "errors_in_row": self._errors_in_row,
                    "last": None if last is None else asdict(last)}
        return ready, body

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="rq-canary", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _wait_healthy(self) -> None:
        import requests

        while not self._stop.is_set():
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            self._stop.wait(2.0)

    def _loop(self) -> None:
        self._wait_healthy()
        self._healthy = True
        if self.on_healthy is not None:
            self.on_healthy()
        if not self.enabled:
            return
        metrics.init_canary_metrics()
        while not self._stop.is_set():
            self.record(run_once(self.url, self.spec, api_key=self.api_key))
            self._stop.wait(self.interval_s)


# ----------------------------------------------------------------------------- server wiring
def load_spec_for(model_path: str, spec_file: str = "") -> tuple[CanarySpec | None, str]:
    """``(spec, stale_reason)`` for a model directory; the reason is non-empty on a mismatch."""
    path = Path(spec_file) if spec_file else Path(model_path) / "canary.json"
    if not path.is_file():
        if spec_file:
            return None, f"canary file {spec_file} not found"
        logger.warning("sglang-rq canary: no %s; readiness only checks that generation works", path)
        return None, ""
    spec = CanarySpec.load(path)
    if spec.weights_fingerprint and Path(model_path).is_dir():
        if weights_fingerprint(model_path) != spec.weights_fingerprint:
            return spec, (f"{path} was recorded for other weights (fingerprint mismatch); "
                          "re-run `python -m sglang_rq.canary record`")
    return spec, ""


def install(app: Any, server_args: Any) -> Canary:
    """Add ``/rq/ready`` and ``/rq/canary`` to SGLang's FastAPI ``app`` and start the canary.

    The thread always runs until the server is healthy (it publishes the BF16 format metrics
    under ``--rq-disable``); with ``SGLANG_RQ_CANARY=0`` (``--rq-no-canary``) it then stops and
    ``/rq/ready`` follows ``/health``.

    Note
    ----
    Call before ``run_server``. Only the single-tokenizer HTTP server (the default
    ``--tokenizer-worker-num 1``) serves these routes; with more tokenizer workers use
    ``python -m sglang_rq.canary check`` as an exec probe instead.
    """
    from fastapi.responses import JSONResponse

    host = server_args.host if server_args.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    url = f"http://{host}:{server_args.port}"
    enabled = env.RQ_CANARY.get()
    spec, stale = (load_spec_for(server_args.model_path, env.RQ_CANARY_FILE.get()) if enabled
                   else (None, ""))
    canary = Canary(url, spec, interval_s=env.RQ_CANARY_INTERVAL_S.get(), enabled=enabled,
                    api_key=getattr(server_args, "api_key", None), stale_reason=stale)

    async def ready() -> JSONResponse:
        ok, body = canary.status()
        return JSONResponse(body, status_code=200 if ok else 503)

    async def status() -> JSONResponse:
        return JSONResponse(canary.status()[1])

    canary.on_healthy = lambda: _publish_disabled_format(url, server_args)
    app.add_api_route("/rq/ready", ready, methods=["GET"])
    app.add_api_route("/rq/canary", status, methods=["GET"])
    canary.start()
    return canary


def _publish_disabled_format(url: str, server_args: Any) -> None:
    """With ``--rq-disable`` no RQ pool exists: publish the BF16 format from this process."""
    from sglang_rq.config import RQConfig

    cfg = RQConfig.from_json(env.RQ_CONFIG.get() or RQConfig().to_json())
    if cfg.enabled or not metrics.enabled():
        return
    try:
        import requests

        from sglang_rq.layout import ModelKVShape, bf16_bytes_per_token

        shape = ModelKVShape.from_hf_config(Path(server_args.model_path) / "config.json")
        info = requests.get(url + "/get_server_info", timeout=30).json()
        tokens = int(info.get("max_total_num_tokens") or 0)
        metrics.publish_kv_format(cfg=cfg, shape=shape, page_size=server_args.page_size or 1,
                                  staging_tokens=0, pool_tokens=tokens,
                                  pool_bytes=tokens * bf16_bytes_per_token(shape))
    except Exception:  # noqa: BLE001 - metrics must never take the server down
        logger.exception("sglang-rq: could not publish the BF16 KV-format metrics")


# ----------------------------------------------------------------------------- recording
def record(model_path: str | Path, *, prompts: tuple[str, ...] = DEFAULT_PROMPTS,
           max_new_tokens: int = 8, min_margin: float = 3.0,
           max_match_tokens: int = 4) -> CanarySpec:
    """A spec from the fp32 reference model: the prompt with the longest confident answer.

    ``match_tokens`` counts the leading greedy tokens (at most ``max_match_tokens``) whose top-1
    minus top-2 logit is at least ``min_margin``. BF16 weights and the 2-bit cache move logits,
    and the drift grows with every decoded token: on a random test checkpoint a token with a
    2.4 margin at step 8 flipped, so the defaults keep to early tokens with a margin of 3.
    """
    import torch

    from sglang_rq.models.ouro_reference import OuroReferenceModel

    model = OuroReferenceModel.from_pretrained(model_path, dtype=torch.float32)
    tok_file = Path(model_path) / "tokenizer.json"
    best: CanarySpec | None = None
    for text in prompts:
        if tok_file.is_file():
            from tokenizers import Tokenizer

            ids = Tokenizer.from_file(str(tok_file)).encode(text).ids
        else:
            ids = [int(b) % model.config.vocab_size for b in text.encode()]
        if not ids or max(ids) >= model.config.vocab_size:
            continue  # tokenizer larger than the model's vocabulary (test checkpoints)
        seq, confident, margins_ok = list(ids), 0, True
        with torch.no_grad():
            for _ in range(max_new_tokens):
                logits = model(torch.tensor([seq]))[0, -1]
                top = torch.topk(logits, 2).values
                margins_ok = margins_ok and float(top[0] - top[1]) >= min_margin
                confident += int(margins_ok and confident < max_match_tokens)
                seq.append(int(logits.argmax()))
        spec = CanarySpec(input_ids=list(ids), max_new_tokens=max_new_tokens,
                          expect_ids=seq[len(ids):], match_tokens=confident, prompt=text,
                          weights_fingerprint=weights_fingerprint(model_path))
        if best is None or spec.match_tokens > best.match_tokens:
            best = spec
    if best is None or best.match_tokens == 0:
        raise RuntimeError(f"no prompt has a greedy first token with margin >= {min_margin}; "
                           "pass other --prompt values or a lower --min-margin")
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sglang_rq.canary", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="write a canary spec from the fp32 reference model")
    rec.add_argument("--model-path", required=True)
    rec.add_argument("--out", default=None, help="default: <model-path>/canary.json")
    rec.add_argument("--prompt", action="append", default=None)
    rec.add_argument("--max-new-tokens", type=int, default=8)
    rec.add_argument("--min-margin", type=float, default=3.0)
    rec.add_argument("--max-match-tokens", type=int, default=4)
    chk = sub.add_parser("check", help="run the canary once against a server (exit 0 = pass)")
    chk.add_argument("--url", required=True)
    chk.add_argument("--spec", default=None)
    chk.add_argument("--api-key", default=None)
    args = p.parse_args(argv)
    if args.cmd == "record":
        spec = record(args.model_path, prompts=tuple(args.prompt or DEFAULT_PROMPTS),
                      max_new_tokens=args.max_new_tokens, min_margin=args.min_margin,
                      max_match_tokens=args.max_match_tokens)
        out = args.out or str(Path(args.model_path) / "canary.json")
        spec.save(out)
        print(f"wrote {out}: prompt {spec.prompt!r}, {spec.match_tokens}/{spec.max_new_tokens} "
              f"tokens must match {spec.expect_ids}")
        return 0
    spec = CanarySpec.load(args.spec) if args.spec else None
    res = run_once(args.url, spec, api_key=args.api_key)
    print(json.dumps(asdict(res)))
    return 0 if res.result == "pass" else 1


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main())
