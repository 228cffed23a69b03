"""Session 27 A/B (call 4): the codes in CTA-wide copies too (COOP 2, arm coop2) against COOP 1 (coop) and
per-warp copies, tc kernel, Ouro-1.4B shape, same process, arms rotated per rep."""
import json
import os
import sys
import time
import torch
sys.path.insert(0, os.getcwd())
from benchmarks.bench_decode import inputs, placed_rows, time_loops
from benchmarks.common import pool
from rq_kernels import decode_tc
from rq_kernels.decode import DecodeLaunch
from sglang_rq.config import RQConfig

orig = decode_tc.coop_copies


def set_arm(arm):
    decode_tc.coop_copies = orig if arm != "warp" else (lambda view, loop: False)
    decode_tc.COOP_CODES = arm == "coop2"

cfg, loops, hq, hkv, dim = RQConfig(), 4, 16, 16, 128
pts = [(1, 8192), (2, 16384), (4, 8192), (4, 32768), (13, 16384), (16, 16384), (64, 8192), (55, 4096)]
view = pool(cfg, hkv, dim, 64 * 8192 + 2, loops)
assert orig(view, 0) and orig(view, 3)
launch = DecodeLaunch(split_kernel="tc")
rows = []
for rep in range(2):
    for b, ctx in pts:
        row = dict(rep=rep, batch=b, ctx=ctx)
        q, kc, vc, ind, idx = inputs(view, hq, hkv, dim, b, ctx)
        places = {"consecutive": idx}
        if (b, ctx) == (16, 16384):
            places["scattered"] = placed_rows([ctx] * b, view.codes[0].shape[0], "scattered")
        for pl, ix in places.items():
            for arm in (("coop2", "coop", "warp") if rep == 0 else ("warp", "coop", "coop2")):
                set_arm(arm)
                t, avg = time_loops(launch, view, q, kc, vc, ind, ix, dim, loops)
                row[f"{arm}_{pl}_us"] = avg * 1e3
            row[f"ratio_{pl}"] = row[f"warp_{pl}_us"] / row[f"coop_{pl}_us"]
            row[f"ratio2_{pl}"] = row[f"coop_{pl}_us"] / row[f"coop2_{pl}_us"]
        rows.append(row)
        print("AB " + json.dumps(row), flush=True)
set_arm("coop2")
os.makedirs(sys.argv[1], exist_ok=True)
json.dump(dict(gpu=torch.cuda.get_device_name(0), date=time.strftime("%Y-%m-%d"), rows=rows),
          open(os.path.join(sys.argv[1], "coop2_ab.json"), "w"), indent=1)
