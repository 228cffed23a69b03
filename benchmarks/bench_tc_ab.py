"""Revisions of the CUDA tensor-core decode kernel side by side in one process: the working
tree's `csrc/rq_decode_tc.cu` ("new") against the same file at a git revision, or a saved copy of it
(a .cu path, where the checkout has no git directory) ("base"), and any further arms.

``python benchmarks/bench_tc_ab.py --base REV --out DIR [--arm NAME=REV ...] [--points P,...]
[--reps N] [--no-step] [--chained | --l2-rows N] [--deadline S] [--dry-run]``

``python benchmarks/bench_tc_ab.py --base REV --profile FAMILY:BxCTX [--profile-arm NAME]``: no
timing; three calls of residual loop 0 at that point with one arm's source (default ``new``),
for Nsight Compute to profile the third (``ncu -k regex:rq_decode_tc -s 2 -c 1 python ...``).

First each arm is checked against the fp32 twin at a small batch of every family
(`bench_decode.check`: flash-attn rule, bf16 SDPA yardstick); an arm that fails is reported and
the timing still runs. Then per point (`POINTS`: Ouro-, Huginn- and SmolLM2-shaped batches) both
arms time `decode_attention` with the tc kernel exactly as `bench_decode` does (CUDA-graph
replay, L2 flushed, median; time per layer-loop = (3 x residual loop + anchor loop) / 4), the
arms' order rotated per rep; ``ratio`` = base time / new time (> 1: new is faster), and with
further arms (``--arm NAME=REV``, a git revision or .cu file as ``--base``) each row's ``us``
holds every arm's time. ``--points``: only these points (``FAMILY:BxCTX``, comma-separated).
Then, unless ``--no-step``, `bench_decode_step`'s Ouro-1.4B-shaped step at batch 2 and at the batch a
32 GiB KV budget holds (16k context), every arm, same rotation. Writes
``DIR/bench_tc_ab.json`` after every point; stops starting new points after ``--deadline``
seconds.

``--chained``: each point timed chained instead (`bench_decode.chained_rq`: calls back to back
in one graph over copies of the history, no L2 flush, as the figures of record), the pool
holding the copies; each row also keeps every arm's residual- and anchor-loop times
(``loop_us``, µs) and the print the anchor loop's ratios.

``--l2-rows N``: each family's pool has only N rows, so every request's history wraps onto the
same rows (`bench_decode.batch_inputs`) and, after the first touch, the reads hit the L2 (4,096
rows: 15 MB for Ouro's residual loop, 17 MB for Huginn's, of the H100's and H200's 50 MB). The
grid, split plan and instructions are the served ones; only the memory is fast, so the ratio is
the loop's issue- and latency-bound speed-up, an upper bound on what an instruction cut gives
where HBM is faster (an H200 against an H100). The step is skipped.

The kernel is loaded by file name (`rq_kernels.decode_tc.SOURCE`), so each other arm's source is
written next to it as ``_ab_NAME.cu`` and removed at exit. Every arm runs with the working
tree's host side (`decode_tc`: its compile-time defines, e.g. ``KINT``, occupancy shapes and
split plan), so a base must accept them: an A/B of kernel sources, not of launchers. ``--dry-run`` (CPU): writes that
file, records the plan and removes it; no kernel runs (the tc kernel needs a GPU).
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import bench_decode_step as step  # noqa: E402
from benchmarks.bench_decode import chain_points, chained_rq, check, inputs, time_loops  # noqa: E402
from benchmarks.common import DEV, FAMILIES, pool, write_json  # noqa: E402
from rq_kernels import cuda, decode_attention, decode_tc  # noqa: E402
from rq_kernels.decode import DecodeLaunch  # noqa: E402
from sglang_rq.config import RQConfig  # noqa: E402
from sglang_rq.layout import kv_bytes_per_token  # noqa: E402

T0 = time.time()
POINTS = {
    "ouro-1.4b": [(1, 8192), (2, 16384), (4, 8192), (4, 32768), (16, 16384), (64, 8192)],
    "huginn-d96": [(4, 8192), (16, 16384), (64, 8192)],
    "smollm2-gqa": [(4, 8192), (64, 8192)],
}
LOOPS = 4


def write_arm(name: str, rev: str) -> str:
    """Arm ``name``'s kernel source, written as csrc/``_ab_NAME.cu`` (removed at exit): ``rev`` is
    a git revision (returns its full hash) or the path of a .cu file (for a checkout without its
    git directory, as on the lent GPU host; returns ``file:<path> sha256:<hex>``). Raises
    CalledProcessError for an unknown revision, FileNotFoundError for a missing file."""
    if rev.endswith(".cu"):
        if not os.path.isfile(rev):
            raise FileNotFoundError(f"--base/--arm {rev}: no such kernel source file")
        text = open(rev).read()
        sha = f"file:{rev} sha256:{hashlib.sha256(text.encode()).hexdigest()}"
    else:
        sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT,
                             check=True, capture_output=True, text=True).stdout.strip()
        text = subprocess.run(["git", "show", f"{sha}:rq_kernels/csrc/{decode_tc.SOURCE}"],
                              cwd=ROOT, check=True, capture_output=True, text=True).stdout
    path = cuda.CSRC / f"_ab_{name}.cu"
    path.write_text(text)
    atexit.register(path.unlink, missing_ok=True)
    return sha


def parse_points(text: str) -> dict[str, list[tuple[int, int]]]:
    """``FAMILY:BxCTX,...`` -> {family: [(batch, ctx), ...]}. Raises ValueError naming a malformed
    point or an unknown family."""
    out: dict[str, list[tuple[int, int]]] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        fam, _, bc = item.partition(":")
        b, _, ctx = bc.partition("x")
        if fam not in FAMILIES or not (b.isdigit() and ctx.isdigit()):
            raise ValueError(f"--points/--profile: {item!r} is not FAMILY:BxCTX with FAMILY one "
                             f"of {sorted(FAMILIES)}")
        out.setdefault(fam, []).append((int(b), int(ctx)))
    return out


def profile_call(fam: str, b: int, ctx: int, source: str) -> None:
    """Three calls of residual loop 0 at ``b`` x ``ctx`` of family ``fam`` with kernel source
    ``source`` (a csrc file name), for a profiler to take the third."""
    hq, hkv, dim = FAMILIES[fam]
    view = pool(RQConfig(), hkv, dim, b * ctx + 2, LOOPS)
    q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, b, ctx)
    out = torch.empty_like(q)
    decode_tc.SOURCE = source
    for _ in range(3):
        decode_attention(q, kc, vc, view, 0, ind, idx, sm_scale=dim ** -0.5, out=out,
                         launch=DecodeLaunch(split_kernel="tc"))
    torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the base arm's kernel source: a git revision or a .cu file")
    ap.add_argument("--arm", action="append", default=[], metavar="NAME=REV",
                    help="a further arm: its name and kernel source (a git revision or a .cu file)")
    ap.add_argument("--points", help="only these points: FAMILY:BxCTX,...")
    ap.add_argument("--profile", metavar="FAMILY:BxCTX", help="no timing: three calls for a profiler")
    ap.add_argument("--profile-arm", default="new", help="the arm --profile runs")
    ap.add_argument("--out", default=".")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--no-step", action="store_true")
    ap.add_argument("--l2-rows", type=int, help="pool rows per family (L2-resident reads)")
    ap.add_argument("--chained", action="store_true", help="time chained, not flushed")
    ap.add_argument("--deadline", type=float, default=480.0)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    extra = dict(x.split("=", 1) for x in a.arm if "=" in x)
    if len(extra) != len(a.arm) or not all(n.isidentifier() for n in extra) or {"new", "base"} & set(extra):
        ap.error(f"--arm {a.arm}: each must be NAME=REV, NAME an identifier other than new and base")
    try:
        points = parse_points(a.points) if a.points else POINTS
        profile = parse_points(a.profile) if a.profile else None
    except ValueError as e:
        ap.error(str(e))
    arms = {"new": decode_tc.SOURCE, "base": "_ab_base.cu", **{n: f"_ab_{n}.cu" for n in extra}}
    if a.chained and a.l2_rows:
        ap.error("--chained and --l2-rows: choose one (chained calls read copies past the L2)")
    if a.profile_arm not in arms:
        ap.error(f"--profile-arm {a.profile_arm}: not one of the arms {list(arms)}")
    sources = {"base": write_arm("base", a.base), **{n: write_arm(n, r) for n, r in extra.items()}}
    if profile and DEV == "cuda":
        fam, pts = next(iter(profile.items()))
        profile_call(fam, *pts[0], arms[a.profile_arm])
        return
    os.makedirs(a.out, exist_ok=True)
    res = dict(base=sources["base"], arms=sources, date=time.strftime("%Y-%m-%d"),
               gpu=torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu (dry run)",
               plan={f: [list(p) for p in ps] for f, ps in points.items()},
               l2_rows=a.l2_rows, chained=a.chained, checks=[], rows=[], step=[], skipped=[])
    if a.dry_run or DEV != "cuda":
        write_json(res, a.out, "bench_tc_ab.json")
        return
    cfg, launch = RQConfig(), DecodeLaunch(split_kernel="tc")

    names = list(arms)

    def each_arm(rep, fn):  # the arms in an order rotated per rep; fn(arm) -> value
        k = rep % len(names)
        order = names[k:] + names[:k]
        out = {}
        for arm in order:
            decode_tc.SOURCE = arms[arm]
            try:
                out[arm] = fn(arm)
            finally:
                decode_tc.SOURCE = arms["new"]
        return out

    def family(fam, pts):
        hq, hkv, dim = FAMILIES[fam]
        copies = chain_points(cfg, hkv, dim, LOOPS, pts) if a.chained else {p: 1 for p in pts}
        view = pool(cfg, hkv, dim, a.l2_rows or max(copies[b, c] * b * c for b, c in pts) + 2,
                    LOOPS)
        for arm, rows in each_arm(0, lambda arm: check(view, hq, hkv, dim, 2, 1024, LOOPS,
                                                       ["tc"])).items():
            res["checks"] += [dict(r, arm=arm, family=fam) for r in rows]
        for rep in range(a.reps):
            for b, ctx in pts:
                if time.time() - T0 > a.deadline:
                    res["skipped"].append(f"{fam} {b}x{ctx} rep {rep}")
                    continue
                q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, b, ctx)
                loop_us = {}
                if a.chained:
                    def one(arm):  # keeps both loops' times: a change may touch only one
                        r = chained_rq(launch, view, q, kc, vc, ind, idx, dim, LOOPS,  # noqa: B023
                                       copies[b, ctx])  # noqa: B023
                        loop_us[arm] = dict(resid=r["resid_ms"] * 1e3, anchor=r["anchor_ms"] * 1e3)
                        return r["avg_ms"] * 1e3
                    us = each_arm(rep, one)
                else:
                    us = each_arm(rep, lambda arm: time_loops(  # noqa: B023
                        launch, view, q, kc, vc, ind, idx, dim, LOOPS)[1] * 1e3)
                row = dict(family=fam, batch=b, ctx=ctx, rep=rep, new_us=us["new"],
                           base_us=us["base"], ratio=us["base"] / us["new"])
                if a.chained:
                    row.update(copies=copies[b, ctx], loop_us=loop_us)
                if extra:
                    row["us"] = us
                res["rows"].append(row)
                print(f"{fam:12s} {b:3d} x {ctx:6d} rep {rep}: "
                      + ", ".join(f"{n} {us[n]:8.1f} us" for n in names) + ", "
                      + ", ".join(f"base/{n} {us['base'] / us[n]:.3f}" for n in names if n != "base")
                      + "".join(f", anchor loop base/{n} "
                                f"{loop_us['base']['anchor'] / loop_us[n]['anchor']:.3f}"
                                for n in names if n != "base" and loop_us), flush=True)
                write_json(res, a.out, "bench_tc_ab.json")

    for fam, pts in points.items():
        family(fam, pts)
        torch.cuda.empty_cache()
    if not (a.no_step or a.l2_rows):
        s = step.Shape(False)
        weights = step.make_weights(s)
        b32 = step.max_batch(kv_bytes_per_token(s.kv, cfg), 16384, 32 << 30)
        for rep in range(a.reps):
            for b in (2, b32):
                if time.time() - T0 > a.deadline:
                    res["skipped"].append(f"step b={b} rep {rep}")
                    continue

                def one(arm, b=b):
                    cache = step.RQCache(s, b, 16384, cfg)
                    try:
                        return step.time_step(s, weights, cache, b)
                    finally:
                        del cache
                        torch.cuda.empty_cache()
                ms = each_arm(rep, one)
                row = dict(batch=b, ctx=16384, rep=rep, new_ms=ms["new"], base_ms=ms["base"],
                           ratio=ms["base"] / ms["new"])
                if extra:
                    row["ms"] = ms
                res["step"].append(row)
                print(f"step b={b:3d} rep {rep}: " + ", ".join(f"{n} {ms[n]:.2f} ms" for n in names)
                      + ", " + ", ".join(f"base/{n} {ms['base'] / ms[n]:.3f}" for n in names if n != "base"),
                      flush=True)
                write_json(res, a.out, "bench_tc_ab.json")
    res["elapsed_s"] = time.time() - T0
    write_json(res, a.out, "bench_tc_ab.json")


if __name__ == "__main__":
    main()
