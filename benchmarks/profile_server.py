"""Where a real server's prefill and decode steps spend their time: BF16 pool vs the
ResidualQuant pool.

The serving card showed RQ's 2k-token prefill chunks well behind BF16's although the extend
attention alone is within 1.1x of FlashAttention (bench_extend), and batch-1 decode at 0.76x
although the decode kernel alone is faster than SDPA. This starts the same server as
`bench_serving` (Ouro-1.4B-shaped checkpoint, same flags) once per arm and:

1. times prefill without a profiler: prompts of ``--tokens`` fresh random ids (no cache hits),
   one output token, after a warm-up request (JIT); wall seconds and tokens/s;
2. profiles the prefill forwards of one more prompt (``--profile-batched``: of one more burst
   of step 3) with SGLang's ``/start_profile`` (PyTorch
   profiler, CPU + CUDA) and summarises the trace per forward step: CPU span, GPU busy time
   (the union of its kernels; the rest of the span the GPU idles: host-bound), kernel time by
   kind, CUDA runtime/driver calls (syncs, launches) and the top aten ops;
3. times a burst of ``--batch-prompts`` concurrent short prompts (batched prefill);
4. times batch-1 decode after a 128-token prompt (TPOT from two requests' difference) and
   profiles 8 decode steps (CUDA-graph replays: kernel count and GPU time per step).

``python benchmarks/profile_server.py --out DIR --tokenizer TOK [--arms bf16,rq] [--with-stack]``
``python benchmarks/profile_server.py --summarise TRACE.json.gz`` (a trace already written)
``python benchmarks/profile_server.py --smoke`` (CPU check: the embedded model, small sizes)

Writes ``DIR/profile_server.json``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_serving import ARMS, COMMON, make_checkpoint  # noqa: E402
from sglang_rq.server_process import Server  # noqa: E402

KINDS = [  # (kind, regex on the kernel name), first match wins
    ("rq", r"rq_"),
    ("attention", r"flash|fmha|attn|_fwd_kernel|extend_attention|decode_attention"),
    ("gemm", r"gemm|cutlass|xmma|nvjet|cublas|splitK|sm90_"),
    ("norm/rope/act", r"norm|rotary|rope|silu|act_and_mul|gelu"),
    ("copy/cat/index", r"copy|cat|index|gather|scatter|fill|memcpy|memset"),
    ("elementwise", r"elementwise|vectorized|unrolled|reduce"),
]


def kind_of(name: str) -> str:
    for kind, pat in KINDS:
        if re.search(pat, name, re.I):
            return kind
    return "other"


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of ``[start, end)`` intervals (µs)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def summarise(trace_path: Path, top: int = 25) -> dict:
    """Summary of one PyTorch-profiler chrome trace of prefill forwards (see the module doc)."""
    with gzip.open(trace_path, "rt") if trace_path.suffix == ".gz" else open(trace_path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    steps = sorted((e for e in events if e.get("cat") == "user_annotation"
                    and e["name"].startswith("step[")), key=lambda e: e["ts"])
    # a kernel belongs to the step whose CPU span launched it (correlation id of its launch)
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in events
                 if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    per_step = []
    for i, s in enumerate(steps):
        lo, hi = s["ts"], s["ts"] + s["dur"]
        ks = [k for k in kernels if lo <= launch_ts.get(k["args"].get("correlation"), -1) <= hi]
        if not ks:  # a CPU trace
            per_step.append({"name": s["name"], "cpu_span_ms": round(s["dur"] / 1e3, 2)})
            continue
        gpu_lo = min(k["ts"] for k in ks)
        gpu_hi = max(k["ts"] + k["dur"] for k in ks)
        by_kind: dict[str, float] = defaultdict(float)
        for k in ks:
            by_kind[kind_of(k["name"])] += k["dur"]
        per_step.append({
            "name": s["name"], "cpu_span_ms": round(s["dur"] / 1e3, 2),
            "gpu_span_ms": round((gpu_hi - gpu_lo) / 1e3, 2),
            "gpu_busy_ms": round(union_us([(k["ts"], k["ts"] + k["dur"]) for k in ks]) / 1e3, 2),
            "kernels": len(ks),
            "kernel_ms_by_kind": {k: round(v / 1e3, 2) for k, v in
                                  sorted(by_kind.items(), key=lambda kv: -kv[1])}})
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for k in kernels:
        by_name[k["name"]][0] += 1
        by_name[k["name"]][1] += k["dur"]
    runtime: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            runtime[e["name"]][0] += 1
            runtime[e["name"]][1] += e["dur"]
    cpu_ops: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("cat") == "cpu_op":
            cpu_ops[e["name"]][0] += 1
            cpu_ops[e["name"]][1] += e["dur"]

    py: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # only with --with-stack
    for e in events:
        if e.get("cat") == "python_function" and ("sglang_rq" in e["name"] or
                                                  "rq_kernels" in e["name"]):
            py[e["name"]][0] += 1
            py[e["name"]][1] += e["dur"]

    def table(d: dict, n: int) -> list:
        rows = sorted(d.items(), key=lambda kv: -kv[1][1])[:n]
        return [[name[:140], int(c), round(t / 1e3, 3)] for name, (c, t) in rows]

    return {"trace": trace_path.name, "steps": per_step,
            "kernels_top_ms": table(by_name, top), "cuda_runtime_ms": table(runtime, 12),
            "cpu_ops_top_ms": table(cpu_ops, top), "python_inclusive_top_ms": table(py, 2 * top)}


def _generate(server: Server, ids: list[int], max_new_tokens: int = 1) -> float:
    t = time.perf_counter()
    r = requests.post(server.url + "/generate", json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": max_new_tokens,
                                              "ignore_eos": True}}, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - t


def _profile(server: Server, args: argparse.Namespace, pdir: Path, stage: str, steps: int,
             run) -> dict | str:
    """Profile ``steps`` forward steps of ``stage`` ("prefill" or "decode") while ``run()``
    sends requests; the summary of the trace SGLang writes to ``pdir``."""
    r = requests.post(server.url + "/start_profile", json={
        "output_dir": str(pdir), "num_steps": steps,
        "activities": ["CPU"] if args.smoke else ["CPU", "GPU"],
        "profile_by_stage": True, "profile_stages": [stage], "with_stack": args.with_stack,
        "record_shapes": False, "profile_prefix": stage}, timeout=60)
    r.raise_for_status()
    run()
    # SGLang writes one trace per forward mode it saw (e.g. the short prompt's EXTEND step
    # before the DECODE steps); the stage's own is named by its mode
    pattern = f"*-{'EXTEND' if stage == 'prefill' else 'DECODE'}.trace.json*"
    deadline = time.time() + 120
    while time.time() < deadline and not list(pdir.glob(pattern)):
        time.sleep(1)
    traces = sorted(pdir.glob(pattern))
    time.sleep(2)  # the export finishes writing
    return summarise(traces[-1]) if traces else "no trace written"


def run_arm(arm: str, args: argparse.Namespace, model: Path, out: Path, rng: random.Random
            ) -> dict:
    flags = ["--model-path", str(model), *COMMON, *ARMS[arm]]
    tmp = out / "logs"
    tmp.mkdir(parents=True, exist_ok=True)
    server = Server(flags, tmp / f"server_profile_{arm}.log")

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, args.vocab - 100) for _ in range(n)]

    result: dict = {"flags": flags}
    try:
        # prefill: prompts of --tokens fresh ids, one output token
        result["warmup_s"] = round(_generate(server, ids(args.tokens)), 3)
        walls = [_generate(server, ids(args.tokens)) for _ in range(args.reps)]
        result["prefill_s"] = [round(w, 4) for w in walls]
        result["prefill_tok_s_median"] = round(args.tokens / sorted(walls)[len(walls) // 2])

        def one_prefill() -> None:
            result["profiled_request_s"] = round(_generate(server, ids(args.tokens)), 3)
            _generate(server, ids(16))  # one more prefill step stops the profiler

        if not args.profile_batched:
            result["profile"] = _profile(server, args, out / f"trace_{arm}_prefill",
                                         "prefill", args.tokens // args.chunk, one_prefill)
        # batched prefill: --batch-prompts concurrent prompts of --batch-tokens fresh ids, one
        # output token each (SGLang packs them into prefill batches of up to one chunk)
        with ThreadPoolExecutor(args.batch_prompts) as pool:
            def burst() -> float:
                t = time.perf_counter()
                list(pool.map(lambda _: _generate(server, ids(args.batch_tokens)),
                              range(args.batch_prompts)))
                return time.perf_counter() - t

            burst()  # warm-up
            walls = [burst() for _ in range(args.reps)]
            if args.profile_batched:  # the prefill steps of one more burst
                steps = max(1, args.batch_prompts * args.batch_tokens // args.chunk)
                result["profile"] = _profile(server, args, out / f"trace_{arm}_prefill",
                                             "prefill", steps, burst)
        result["batched_prefill_s"] = [round(w, 4) for w in walls]
        result["batched_prefill_tok_s_median"] = round(
            args.batch_prompts * args.batch_tokens / sorted(walls)[len(walls) // 2])
        # decode, batch 1, short prompt: TPOT from the difference of two requests
        short, n_out = 128, args.decode_tokens
        t1 = min(_generate(server, ids(short)) for _ in range(args.reps))
        tn = min(_generate(server, ids(short), n_out + 1) for _ in range(args.reps))
        result["decode_b1_tpot_ms"] = round((tn - t1) / n_out * 1e3, 3)
        # last, because stopping a trace of CUDA-graph replays can abort the server (seen on
        # the H200, 12-02: glibc "corrupted size vs. prev_size" in the profiler's stop)
        try:
            result["decode_profile"] = _profile(
                server, args, out / f"trace_{arm}_decode", "decode", 8,
                lambda: _generate(server, ids(short), 16))
        except requests.RequestException as e:
            result["decode_profile"] = f"server lost while tracing decode: {e!r}"
    finally:
        server.stop()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/rq-out/profile_server"))
    ap.add_argument("--tokenizer", type=Path)
    ap.add_argument("--model", type=Path, default=Path("/tmp/ouro-1.4b-random"))
    ap.add_argument("--arms", default="bf16,rq")
    ap.add_argument("--tokens", type=int, default=8192,
                    help="prompt length (a multiple of the 2048-token chunk)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch-prompts", type=int, default=32,
                    help="concurrent prompts of the batched-prefill measurement")
    ap.add_argument("--batch-tokens", type=int, default=256,
                    help="tokens per prompt of the batched-prefill measurement")
    ap.add_argument("--profile-batched", action="store_true",
                    help="profile the batched-prefill burst's steps instead of a long prompt's")
    ap.add_argument("--decode-tokens", type=int, default=256,
                    help="output tokens of the batch-1 TPOT measurement")
    ap.add_argument("--with-stack", action="store_true",
                    help="record Python frames too (slower host; inclusive time per function of "
                         "sglang_rq and rq_kernels)")
    ap.add_argument("--summarise", type=Path, help="only summarise this trace file")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU check of the script: the embedded model, 512 tokens, 256-token chunks")
    args = ap.parse_args()
    args.chunk = 2048
    args.vocab = 49152
    if args.smoke:
        from sglang_rq.models.embedded import EMBEDDED_MODEL

        args.model = args.tokenizer = EMBEDDED_MODEL
        args.tokens, args.chunk, args.reps, args.decode_tokens = 512, 256, 1, 8
        args.batch_prompts, args.batch_tokens = 4, 32
        args.vocab = json.loads((EMBEDDED_MODEL / "config.json").read_text())["vocab_size"]
        COMMON[COMMON.index("--context-length") + 1] = "1024"
        COMMON[COMMON.index("--chunked-prefill-size") + 1] = "256"
        ARMS["bf16"] = ["--rq-disable"]
    if args.summarise:
        print(json.dumps(summarise(args.summarise), indent=1))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    model = make_checkpoint(args.model, args.tokenizer)
    rng = random.Random(0)
    results = {}
    for arm in args.arms.split(","):
        results[arm] = run_arm(arm, args, model, args.out, rng)
        (args.out / "profile_server.json").write_text(json.dumps(results, indent=1))
    if {"bf16", "rq"} <= results.keys():
        b, r = results["bf16"], results["rq"]
        results["rq_over_bf16"] = {
            "prefill_tok_s": round(r["prefill_tok_s_median"] / b["prefill_tok_s_median"], 3),
            "batched_prefill_tok_s": round(r["batched_prefill_tok_s_median"]
                                           / b["batched_prefill_tok_s_median"], 3),
            "decode_b1_tok_s": round(b["decode_b1_tpot_ms"] / r["decode_b1_tpot_ms"], 3)}
    (args.out / "profile_server.json").write_text(json.dumps(results, indent=1))
    for arm in args.arms.split(","):
        r = results[arm]
        print(f"{arm}: prefill {r['prefill_s']} s ({r['prefill_tok_s_median']} tok/s), "
              f"batched prefill {r['batched_prefill_s']} s "
              f"({r['batched_prefill_tok_s_median']} tok/s), "
              f"decode b1 TPOT {r['decode_b1_tpot_ms']} ms")
        for key in ("profile", "decode_profile"):
            if isinstance(r[key], dict):
                for step in r[key]["steps"]:
                    print("  ", step)
    print("rq/bf16:", results.get("rq_over_bf16"))

if __name__ == "__main__":
    main()
