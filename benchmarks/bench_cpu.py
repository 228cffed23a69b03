"""CPU benchmark of issue 14 ("The CPU path at BF16 speed"): ResidualQuant vs BF16, one run.

Two real CPU servers (`sglang_rq.server_process.Server`, i.e. ``python -m
sglang_rq.launch_server``) serve the embedded mini-Ouro (the default without ``--model-path``:
4 layers x 4 loops, 4 KV heads x 128, vocab 8192, 2048 positions), one after the other, with the
same flags except ``--rq-disable`` on the BF16 arm (SGLang's own pool and attention). Both run
with ``--disable-radix-cache`` (a repeated prompt is recomputed), ``--skip-tokenizer-init``
(token ids in and out: no detokenizer process competing for the cores), ``--rq-no-canary`` (no
background canary requests), ``--decode-log-interval 1`` (see ``step`` below),
``--chunked-prefill-size 2048`` (a 2k prompt is one forward), ``--max-running-requests`` the
largest batch and a pool (``--max-total-tokens``) of ``max batch x (max context + n_out + 1)``
tokens rounded up to 1024 plus 1024 of slack, so the largest batch is admitted at once.

Requests are ``POST /generate`` with ``input_ids`` (uniform random ids in [3, 8192), from a fixed
seed, fresh for every request; the same sequence on both arms) and ``sampling_params``
``{temperature 0, ignore_eos true, max_new_tokens N}``; the requests of a batch are sent at once
from threads and a batch's time is from the first send to the last response. One warm-up request
precedes the timed cases. Cases:

- ``decode-b{B}-c{C}`` (B in 1, 8, 32; C in 512, 1984, so that C + outputs fit in 2048
  positions): a batch of B prompts of C tokens with ``max_new_tokens = 1 + n_out`` (``t_long``)
  and a fresh batch with ``max_new_tokens = 1`` (``t_short``, the prefill and first token);
  decode output tokens/s = ``B * n_out / (t_long - t_short)``, the median over ``--repeats``.
  Higher is better; the ratio printed is RQ/BF16 tokens/s. A second row, ``... step``, is the
  median of the scheduler's own per-step ``gen throughput`` log (``--decode-log-interval 1``) over
  the long batches' decode steps that ran all B requests (the first and last such log lines
  dropped: the first one's gap holds the prefill, the last one is a near-empty tail). It does not subtract two batch times that are mostly prefill, so it is the
  steadier figure where prefill dominates (the mini-Ouro on a few cores prefills ~100 tokens/s)
  or the machine is shared.
- ``prefill-{L}``: one prompt of L = 1984 tokens, ``max_new_tokens 1``; the median time of
  ``--prefill-repeats`` (3). Lower is better; the ratio printed is RQ/BF16 time.

Issue 14's targets, printed as met or not: decode ratio >= 0.8 at ``decode-b8-c512``, >= 1.0 at
``decode-b8-c1984``, prefill time ratio <= 1.3 (on the 2k prompt).

The JSON (``--out``, default ``benchmarks/results/cpu_<date>.json``; ``--quick`` appends
``_quick``) holds the machine (``os.cpu_count()``, torch/SGLang versions; the server's torch
thread count is not read back: the launcher sets ``OMP_NUM_THREADS=1`` unless it is set, and the
value this script saw is recorded), both arms' flags, every raw time, the medians, the ratios and
the targets. It is rewritten after each arm, so a cut-off run keeps the finished arm.

Usage (from the repository root)::

    python benchmarks/bench_cpu.py                 # the full matrix (long on a small machine)
    python benchmarks/bench_cpu.py --quick         # batch 1, 8; context 512; n_out 8; 1 repeat
    python benchmarks/bench_cpu.py --cases 'decode-b8-*,prefill-*' --arms rq \\
        --rq-arg=--attention-backend=rq_native --server-arg='--max-running-requests 64'

``--server-arg``/``--rq-arg`` take one string each (repeatable), split like a shell would; write
them with ``=`` (``--rq-arg=--foo``) since argparse refuses a separate value that starts with
``--``. They come after the script's flags, so they override them.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import importlib.metadata
import json
import os
import platform
import random
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_rq.server_process import Server  # noqa: E402

VOCAB_LO, VOCAB_HI = 3, 8192  # the embedded mini-Ouro's vocabulary, above its special ids
MAX_POSITIONS = 2048
ARMS = {"bf16": ["--rq-disable"], "rq": []}
TARGETS = [  # (case, "decode" ratio >= bound | "prefill" time ratio <= bound, bound)
    ("decode-b8-c512", "decode", 0.8),
    ("decode-b8-c1984", "decode", 1.0),
    ("prefill-1984", "prefill", 1.3),
]


class Prompts:
    """Fresh random prompts from a fixed seed: request i of a run is the same on both arms."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def take(self, n: int, length: int) -> list[list[int]]:
        return [[self.rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(length)] for _ in range(n)]


def run_batch(url: str, prompts: list[list[int]], max_new_tokens: int, timeout: float) -> float:
    """Send every prompt at once (one thread each); seconds from the first send to the last
    response. Raises if a request fails or returns other than ``max_new_tokens`` tokens."""
    errors: list[str] = []

    def one(ids: list[int]) -> None:
        try:
            r = requests.post(url + "/generate", json={
                "input_ids": ids, "sampling_params": {
                    "temperature": 0.0, "ignore_eos": True, "max_new_tokens": max_new_tokens}},
                timeout=timeout)
            r.raise_for_status()
            got = len(r.json()["output_ids"])
            if got != max_new_tokens:
                errors.append(f"{got} output tokens, expected {max_new_tokens}")
        except Exception as exc:  # noqa: BLE001 - reported below with the others
            errors.append(repr(exc))

    threads = [threading.Thread(target=one, args=(p,)) for p in prompts]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    dt = time.perf_counter() - t
    if errors:
        raise RuntimeError(f"{len(errors)}/{len(prompts)} requests failed: {errors[:3]}")
    return dt


DECODE_LOG = re.compile(r"Decode batch.*?#running-req: (\d+),.*?"
                        r"gen throughput \(token/s\): ([0-9.]+)")


def step_rates(log: str, batch: int) -> list[float]:
    """The scheduler's per-step ``gen throughput`` (``--decode-log-interval 1``) of the decode
    steps that ran ``batch`` requests, in ``log`` order."""
    return [float(m.group(2)) for m in DECODE_LOG.finditer(log) if int(m.group(1)) == batch]


def measure_decode(server: Server, prompts: Prompts, *, batch: int, ctx: int, n_out: int,
                   repeats: int, timeout: float) -> dict:
    runs = []
    for _ in range(repeats):
        start = len(server.log())
        t_long = run_batch(server.url, prompts.take(batch, ctx), 1 + n_out, timeout)
        # the first gap holds the prefill, the last one is a near-empty tail: both dropped
        steps = step_rates(server.log()[start:], batch)[1:-1]
        t_short = run_batch(server.url, prompts.take(batch, ctx), 1, timeout)
        dt = t_long - t_short
        runs.append({"t_long_s": t_long, "t_short_s": t_short,
                     "tok_s": batch * n_out / dt if dt > 0 else None, "step_tok_s": steps})
    valid = [r["tok_s"] for r in runs if r["tok_s"] is not None]
    steps = [x for r in runs for x in r["step_tok_s"]]
    return {"kind": "decode", "batch": batch, "ctx": ctx, "n_out": n_out, "runs": runs,
            "value": statistics.median(valid) if valid else None, "unit": "tok/s",
            "step_value": statistics.median(steps) if steps else None}


def measure_prefill(url: str, prompts: Prompts, *, length: int, repeats: int,
                    timeout: float) -> dict:
    times = [run_batch(url, prompts.take(1, length), 1, timeout) for _ in range(repeats)]
    return {"kind": "prefill", "length": length, "times_s": times,
            "value": statistics.median(times), "unit": "s"}


def plan_cases(args: argparse.Namespace) -> list[tuple[str, dict]]:
    cases = [(f"decode-b{b}-c{c}", {"kind": "decode", "batch": b, "ctx": c})
             for c in args.contexts for b in args.batches]
    cases.append((f"prefill-{args.prefill_len}", {"kind": "prefill", "length": args.prefill_len}))
    if args.cases:
        pats = [p.strip() for p in args.cases.split(",") if p.strip()]
        cases = [c for c in cases if any(fnmatch.fnmatch(c[0], p) for p in pats)]
        if not cases:
            raise SystemExit(f"--cases {args.cases!r} matches none of the planned cases")
    return cases


def common_flags(args: argparse.Namespace, cases: list[tuple[str, dict]]) -> list[str]:
    decode = [c for _, c in cases if c["kind"] == "decode"]
    max_batch = max([c["batch"] for c in decode], default=1)
    need = max([c["batch"] * (c["ctx"] + 1 + args.n_out) for c in decode] +
               [c["length"] + 1 for _, c in cases if c["kind"] == "prefill"])
    pool = (need // 1024 + 2) * 1024  # rounded up to 1024 tokens, plus 1024 tokens of slack
    return ["--disable-radix-cache", "--skip-tokenizer-init", "--rq-no-canary",
            "--decode-log-interval", "1",
            "--chunked-prefill-size", "2048", "--max-running-requests", str(max_batch),
            "--max-total-tokens", str(pool)]


def split_args(values: list[str] | None) -> list[str]:
    return [a for v in values or [] for a in shlex.split(v)]


def run_arm(arm: str, flags: list[str], cases: list[tuple[str, dict]], args: argparse.Namespace,
            logs: Path) -> dict:
    t = time.time()
    server = Server(flags, logs / f"server_{arm}.log")
    result: dict = {"flags": flags, "startup_s": round(time.time() - t, 1),
                    "log": str(server.log_path), "cases": {}}
    try:
        try:
            info = server.server_info()
            result["max_total_num_tokens"] = info.get("max_total_num_tokens")
            result["attention_backend"] = info.get("attention_backend")
        except (requests.RequestException, ValueError):
            pass
        print(f"[{arm}] up in {result['startup_s']} s (pool {result.get('max_total_num_tokens')} "
              f"tokens, attention {result.get('attention_backend')}); log {server.log_path}",
              flush=True)
        prompts = Prompts(args.seed)
        warm_len = min([c.get("ctx", c.get("length", 512)) for _, c in cases])
        t = time.time()
        run_batch(server.url, prompts.take(1, warm_len), 1 + args.n_out, args.timeout)
        result["warmup_s"] = round(time.time() - t, 2)
        for name, c in cases:
            t = time.time()
            try:
                if c["kind"] == "decode":
                    r = measure_decode(server, prompts, batch=c["batch"], ctx=c["ctx"],
                                       n_out=args.n_out, repeats=args.repeats,
                                       timeout=args.timeout)
                else:
                    r = measure_prefill(server.url, prompts, length=c["length"],
                                        repeats=args.prefill_repeats, timeout=args.timeout)
            except RuntimeError as exc:
                r = {"kind": c["kind"], "error": str(exc), "value": None}
                print(f"[{arm}] {name}: FAILED {exc}\n{server.log()[-2000:]}", flush=True)
            result["cases"][name] = r
            if "error" not in r:
                got = "no value (t_long <= t_short in every repeat)" if r["value"] is None \
                    else f"{r['value']:.3f} {r['unit']}"
                if r.get("step_value") is not None:
                    got += f", step {r['step_value']:.3f} tok/s"
                print(f"[{arm}] {name}: {got} ({time.time() - t:.0f} s)", flush=True)
    finally:
        server.stop()
    return result


def ratios(results: dict) -> dict:
    """RQ/BF16 per case both arms measured: tokens/s for decode (also ``<case> step``, the
    scheduler's per-step rate), time for prefill."""
    b, r = results["arms"].get("bf16"), results["arms"].get("rq")
    out: dict = {}
    if not b or not r:
        return out
    for name, rc in r["cases"].items():
        bc = b["cases"].get(name, {})
        if rc.get("value") and bc.get("value"):
            out[name] = rc["value"] / bc["value"]
        if rc.get("step_value") and bc.get("step_value"):
            out[f"{name} step"] = rc["step_value"] / bc["step_value"]
    return out


def targets(results: dict) -> list[dict]:
    rat = results["ratios"]
    out = []
    for case, kind, bound in TARGETS:
        row: dict = {"case": case, "kind": kind,
                     "target": f"{'>=' if kind == 'decode' else '<='} {bound}"}
        measured = case
        if kind == "prefill" and case not in rat:  # a shorter prompt (--quick): say so
            measured = next((n for n in rat if n.startswith("prefill-")), case)
        ok = (lambda x: x >= bound) if kind == "decode" else (lambda x: x <= bound)
        x = rat.get(measured)
        row.update(measured_case=measured if x is not None else None, ratio=x,
                   met=None if x is None else ok(x))
        if kind == "decode":
            y = rat.get(f"{case} step")
            row.update(step_ratio=y, step_met=None if y is None else ok(y))
        out.append(row)
    return out


def print_table(results: dict) -> None:
    arms = results["arms"]
    names = list(dict.fromkeys(n for a in arms.values() for n in a["cases"]))

    def val(arm: str, name: str, key: str) -> str:
        c = arms.get(arm, {}).get("cases", {}).get(name)
        if c is None:
            return "-"
        if c.get(key) is None:
            return "error" if "error" in c else "n/a"
        return f"{c[key]:.2f}" if c["unit"] == "tok/s" else f"{c[key]:.3f}"

    def ratio(name: str) -> str:
        x = results["ratios"].get(name)
        return "-" if x is None else f"{x:.3f}"

    print(f"\n{'case':<22} {'unit':<6} {'BF16':>10} {'RQ':>10} {'RQ/BF16':>8}")
    for n in names:
        if n.startswith("decode"):
            print(f"{n:<22} {'tok/s':<6} {val('bf16', n, 'value'):>10} "
                  f"{val('rq', n, 'value'):>10} {ratio(n):>8}")
            print(f"{n + ' step':<22} {'tok/s':<6} {val('bf16', n, 'step_value'):>10} "
                  f"{val('rq', n, 'step_value'):>10} {ratio(n + ' step'):>8}")
        else:
            print(f"{n:<22} {'s':<6} {val('bf16', n, 'value'):>10} "
                  f"{val('rq', n, 'value'):>10} {ratio(n):>8}")
    print("(decode: B*n_out/(t_long - t_short), median of repeats; 'step': median of the "
          "scheduler's per-step gen throughput at #running-req B; prefill: seconds)")
    print("\nissue-14 targets:")
    for t in results["targets"]:
        what = "decode tok/s RQ/BF16" if t["kind"] == "decode" else "prefill time RQ/BF16"
        if t["met"] is None:
            ran = all(t["case"] in a["cases"] for a in results["arms"].values())
            verdict = "no ratio (an arm has no valid value)" if ran and \
                len(results["arms"]) == 2 else "not measured"
        else:
            verdict = f"{t['ratio']:.3f} -> {'MET' if t['met'] else 'NOT MET'}"
            if t["measured_case"] != t["case"]:
                verdict += f" (measured on {t['measured_case']})"
        if t.get("step_ratio") is not None:
            verdict += (f"; step {t['step_ratio']:.3f} -> "
                        f"{'MET' if t['step_met'] else 'NOT MET'}")
        print(f"  {t['case']:<16} {what} {t['target']}: {verdict}")


def machine() -> dict:
    def version(pkg: str) -> str | None:
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return None

    def git(*cmd: str) -> str | None:
        try:
            return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True,
                                  timeout=10).stdout
        except OSError:
            return None

    commit = (git("rev-parse", "HEAD") or "").strip() or None
    modified = (git("status", "--porcelain", "--untracked-files=no") or "").splitlines()
    return {"nproc": os.cpu_count(), "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(), "torch": version("torch"),
            "sglang": version("sglang"), "git_commit": commit,
            "git_modified": [m[3:] for m in modified],
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "note": "the servers' torch thread count is not read back; they inherit "
                    "OMP_NUM_THREADS above, and the launcher sets it to 1 when it is unset (null)"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None,
                    help="JSON path (default benchmarks/results/cpu_<date>[_quick].json)")
    ap.add_argument("--quick", action="store_true",
                    help="batch 1, 8; context 512; n_out 8; 1 repeat; prefill prompt 512")
    ap.add_argument("--cases", default=None,
                    help="comma-separated case names or fnmatch patterns, e.g. "
                         "'decode-b8-*,prefill-*' (default: all planned)")
    ap.add_argument("--arms", default="bf16,rq", help="bf16,rq (default), or one of them")
    ap.add_argument("--server-arg", action="append", default=None,
                    help="extra flags for both servers (repeatable; split like a shell)")
    ap.add_argument("--rq-arg", action="append", default=None,
                    help="extra flags for the RQ server only (repeatable; split like a shell)")
    ap.add_argument("--batches", default=None, help="decode batch sizes (default 1,8,32)")
    ap.add_argument("--contexts", default=None, help="decode contexts (default 512,1984)")
    ap.add_argument("--n-out", type=int, default=None, help="decode tokens timed (default 32)")
    ap.add_argument("--repeats", type=int, default=None, help="decode repeats (default 3)")
    ap.add_argument("--prefill-len", type=int, default=None, help="prefill prompt (default 1984)")
    ap.add_argument("--prefill-repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per request")
    args = ap.parse_args()
    quick = dict(batches="1,8", contexts="512", n_out=8, repeats=1, prefill_len=512)
    full = dict(batches="1,8,32", contexts="512,1984", n_out=32, repeats=3, prefill_len=1984)
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.batches = [int(x) for x in str(args.batches).split(",")]
    args.contexts = [int(x) for x in str(args.contexts).split(",")]
    for c in args.contexts + [args.prefill_len - 1]:
        if c + 1 + args.n_out > MAX_POSITIONS:
            raise SystemExit(f"context {c} + {1 + args.n_out} outputs > {MAX_POSITIONS} positions")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not arms or set(arms) - ARMS.keys():
        raise SystemExit(f"--arms {args.arms!r}: choose from {', '.join(ARMS)}")
    date = datetime.date.today().isoformat()
    out = Path(args.out or ROOT / "benchmarks" / "results" /
               f"cpu_{date}{'_quick' if args.quick else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="rq-bench-cpu-"))

    cases = plan_cases(args)
    common = common_flags(args, cases) + split_args(args.server_arg)
    results: dict = {
        "issue": 14, "date": date, "quick": args.quick, "machine": machine(),
        "params": {"batches": args.batches, "contexts": args.contexts, "n_out": args.n_out,
                   "repeats": args.repeats, "prefill_len": args.prefill_len,
                   "prefill_repeats": args.prefill_repeats, "seed": args.seed,
                   "cases": [n for n, _ in cases]},
        "common_flags": common, "arms": {}, "ratios": {}, "targets": []}
    print(f"cases: {', '.join(n for n, _ in cases)}\ncommon flags: {' '.join(common)}\n"
          f"server logs under {logs}", flush=True)
    for arm in arms:
        flags = common + ARMS[arm] + (split_args(args.rq_arg) if arm == "rq" else [])
        results["arms"][arm] = run_arm(arm, flags, cases, args, logs)
        results["ratios"] = ratios(results)
        results["targets"] = targets(results)
        out.write_text(json.dumps(results, indent=1))
    print_table(results)
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()
