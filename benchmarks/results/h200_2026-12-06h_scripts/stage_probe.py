"""Session 46 probe: what the decode step pays for `stage_kv`, the one launch per attention call
that RQ's arm makes besides `decode_attention` (96 per Ouro step). Arms, alternating, 3 rounds:
rq (as bench_decode_step), rq_nostage (the same without stage_kv: its staging rows stale; a timing
bound for fusing the staging write into the split kernel), stage_only (stage_kv and the commit,
no attention), none. Run from the repository root: python3 THIS --out DIR (--dry: CPU, tiny)."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))
import torch  # noqa: E402

from benchmarks import bench_decode_step as B  # noqa: E402
from rq_kernels import commit_layers, decode_attention, stage_kv  # noqa: E402
from sglang_rq.config import RQConfig  # noqa: E402

ARMS = ("rq", "rq_nostage", "stage_only", "none")


class NoStage(B.RQCache):
    def __call__(self, u, li, q, k, v):
        if u == self.s.loops - 1 and li == self.s.layers - 1:
            commit_layers(self.staging[:, :, :, 0], self.staging[:, :, :, 1], self.loc, self.views)
        return decode_attention(q, k, v, self.views[li], u, self.ind, self.idx,
                                sm_scale=self.s.dim ** -0.5, out=torch.empty_like(self.out))


class StageOnly(B.RQCache):
    def __call__(self, u, li, q, k, v):
        stage_kv(k, v, self.staging[u, li])
        if u == self.s.loops - 1 and li == self.s.layers - 1:
            commit_layers(self.staging[:, :, :, 0], self.staging[:, :, :, 1], self.loc, self.views)
        return q


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--dry", action="store_true")
    a = ap.parse_args()
    s = B.Shape(a.dry)
    ctx = 40 if a.dry else 16384
    W = B.make_weights(s)
    cfg = RQConfig()
    calls = s.loops * s.layers
    cuda = torch.cuda.is_available()
    res = dict(gpu=torch.cuda.get_device_name(0) if cuda else "cpu", runs=[])
    for b in (2, 13):
        caches = dict(rq=B.RQCache(s, b, ctx, cfg), rq_nostage=NoStage(s, b, ctx, cfg),
                      stage_only=StageOnly(s, b, ctx, cfg), none=B.NoAttention())
        for r in range(3):
            for name, c in caches.items():
                ms = B.time_step(s, W, c, b)
                res["runs"].append(dict(batch=b, arm=name, round=r, step_ms=ms))
                print(f"b={b:3d} round {r} {name:11s} {ms:8.3f} ms", flush=True)
        del caches
        if cuda:
            torch.cuda.empty_cache()
        med = {n: sorted(x["step_ms"] for x in res["runs"] if x["batch"] == b and x["arm"] == n)[1]
               for n in ARMS}
        res[f"median_b{b}"] = med
        print(f"b={b}: medians {med}; stage_kv per call: (rq - rq_nostage) / calls "
              f"{(med['rq'] - med['rq_nostage']) / calls * 1e3:.2f} us, (stage_only - none) / "
              f"calls {(med['stage_only'] - med['none']) / calls * 1e3:.2f} us")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "stage_probe.json"), "w") as f:
        json.dump(res, f, indent=1)


main()
