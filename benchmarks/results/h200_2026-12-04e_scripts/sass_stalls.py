# ruff: noqa  (the session script as run on the H200, 2026-12-04 session 28; kept with its results)
import csv, sys, re
from collections import defaultdict
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[1]; data = rows[2:]
ix = {h: i for i, h in enumerate(hdr)}
def num(r, k):
    try: return float(r[ix[k]])
    except: return 0.0
# find hot loop: instructions with highest exec counts
execs = [(num(r,"Instructions Executed"), i) for i, r in enumerate(data)]
tot_samples = sum(num(r,"Warp Stall Sampling (All Samples)") for r in data)
print("total samples", tot_samples, "instructions", len(data))
# group by opcode, restricted to instructions executed >= thr
mx = max(e for e,_ in execs)
thr = float(sys.argv[2]) if len(sys.argv) > 2 else 0.5
hot = [r for r in data if num(r,"Instructions Executed") >= thr * mx]
stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
hs = sum(num(r,"Warp Stall Sampling (All Samples)") for r in hot)
print("hot instructions", len(hot), "samples", hs, f"{hs/tot_samples:.2%}")
op = defaultdict(lambda: [0, 0.0, defaultdict(float)])
for r in hot:
    o = r[ix["Source"]].split()[0]
    if o.startswith("@"): o = r[ix["Source"]].split()[1]
    o = o.split(".")[0]
    op[o][0] += 1; op[o][1] += num(r,"Warp Stall Sampling (All Samples)")
    for s in stalls: op[o][2][s] += num(r, s)
for o, (n, smp, st) in sorted(op.items(), key=lambda kv: -kv[1][1]):
    top = sorted(st.items(), key=lambda kv: -kv[1])[:4]
    print(f"{o:8s} n={n:4d} samples={smp:7.0f} ({smp/hs:5.1%})  " + ", ".join(f"{k[6:]}={v/hs:.1%}" for k, v in top if v))
tot = defaultdict(float)
for r in hot:
    for s in stalls: tot[s] += num(r, s)
print("stall totals:", ", ".join(f"{k[6:]}={v/hs:.1%}" for k, v in sorted(tot.items(), key=lambda kv: -kv[1]) if v/hs > 0.005))
if len(sys.argv) > 3:
    for i, r in enumerate(data):
        if num(r,"Instructions Executed") >= thr * mx:
            st = sorted(((num(r, s), s) for s in stalls), reverse=True)[:2]
            print(f"{i:5d} {num(r,'Warp Stall Sampling (All Samples)'):6.0f} {r[ix['Source']][:60]:60s} " + " ".join(f"{s[6:]}={v:.0f}" for v, s in st if v))
