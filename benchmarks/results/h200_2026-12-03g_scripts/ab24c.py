# ruff: noqa  (the session script as run on the H200, 2026-12-03g; kept with its results)
"""Session 24 (ab24c): (scale, offset) rows head-major. Arms, one process: tm (today: the pool's
scale_offset [rows, 2, H, groups, 2] token-major, so a 32-byte sector holds 4 KV heads' rows of
one token, shared by a CTA's 4 warps through L1) and hm (the same logical tensor stored
[2, H, rows, groups, 2]: a warp's 16 tokens' rows are 128 contiguous bytes). Codes and
coefficients unchanged. Per call µs (bench_decode.time_loops); hm's output of every loop is
compared with tm's (max |diff| / max |out|; the same bytes, so 0)."""
import dataclasses, json, os, sys
import rq_kernels
TREE, REP = sys.argv[1], sys.argv[2]
import torch
import benchmarks.bench_decode as bd
from benchmarks.common import FAMILIES, pool
from rq_kernels import decode_attention, decode_tc
from rq_kernels.decode import DecodeLaunch
from rq_kernels.decode_tc import tc_plan
from sglang_rq.config import RQConfig
OUT = os.environ.get("OUT", "/tmp")
K = 1024
POINTS = {"ouro-1.4b": {"1x8k": [8*K], "4x8k": [8*K]*4, "2x16k": [16*K]*2, "16x16k": [16*K]*16,
                        "64x8k": [8*K]*64, "13x16k": [16*K]*13, "55x16k": [16*K]*55},
          "smollm2-gqa": {"4x8k": [8*K]*4, "16x16k": [16*K]*16, "320x4k": [4*K]*320}}
def head_major_so(view):
    sos = []
    for so in view.scale_offset:
        if so is None:
            sos.append(so); continue
        hm = torch.empty(so.permute(1, 2, 0, 3, 4).shape, dtype=so.dtype, device=so.device).permute(2, 0, 1, 3, 4)
        hm.copy_(so); sos.append(hm)
    return dataclasses.replace(view, scale_offset=sos)
res = dict(tree=TREE, file=rq_kernels.__file__, points=[])
cfg, loops = RQConfig(), 4
sms = torch.cuda.get_device_properties(0).multi_processor_count
for fam, pts in POINTS.items():
    hq, hkv, dim = FAMILIES[fam]
    tm = pool(cfg, hkv, dim, max(sum(v) for v in pts.values()) + 2, loops)
    hm = head_major_so(tm)
    why = [decode_tc.tc_unsupported_reason(hm, l, hq // hkv, torch.device("cuda", 0)) for l in range(loops)]
    print("hm tc reasons", why, flush=True)
    for name, lens in pts.items():
        q, kc, vc, ind, idx = bd.batch_inputs(tm, hq, hkv, dim, lens)
        ref = []
        for arm, view in (("tm", tm), ("hm", hm)):
            errs = []
            for loop in range(loops):
                out = torch.full_like(q, float("nan"))
                decode_attention(q, kc, vc, view, loop, ind, idx, sm_scale=dim ** -0.5, out=out,
                                 launch=DecodeLaunch(split_kernel="tc"))
                torch.cuda.synchronize()
                if arm == "tm":
                    ref.append(out.float().clone())
                else:
                    errs.append(((out.float() - ref[loop]).abs().max() / ref[loop].abs().max()).item())
            err = max(errs) if errs else 0.0
            _, avg = bd.time_loops(DecodeLaunch(split_kernel="tc"), view, q, kc, vc, ind, idx, dim, loops)
            s = tc_plan(len(lens), hkv, sum(lens), sms)
            res["points"].append(dict(family=fam, name=name, arm=arm, occ=list(s[0]), S=s[1],
                                      us=avg * 1e3, rel_err_vs_tm=err))
            print(f"AB {arm} {REP} {fam} {name} occ={tuple(s[0])} S={s[1]}: {avg*1e3:.1f} us err={err:.2e}", flush=True)
    json.dump(res, open(f"{OUT}/ab24c_{REP}.json", "w"), separators=(",", ":"))
    del tm, hm
    torch.cuda.empty_cache()
