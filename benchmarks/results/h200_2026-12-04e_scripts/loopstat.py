# ruff: noqa  (the session script as run, 2026-12-04 session 28: SASS loop counts from cuobjdump -sass)
"""Usage: python loopstat.py CUOBJDUMP CUBIN -> instruction count and opcode histogram of the innermost
backward branch holding HMMA/IMMA instructions (the tc decode kernel's tile loop)."""
import sys, subprocess, re, collections
sass = subprocess.run([sys.argv[1], "-sass", sys.argv[2]], capture_output=True, text=True).stdout
ins = []
for line in sass.splitlines():
    m = re.search(r"/\*([0-9a-f]{4,6})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)([^;]*)", line)
    if m: ins.append((int(m.group(1), 16), m.group(2), m.group(3)))
best = None
for addr, op, rest in ins:
    if op == "BRA":
        t = re.search(r"0x([0-9a-f]+)", rest)
        if t and int(t.group(1), 16) < addr:
            lo = int(t.group(1), 16)
            if any(lo <= a <= addr and o.startswith(("HMMA", "IMMA")) for a, o, _ in ins):
                if best is None or addr - lo < best[1] - best[0]:
                    best = (lo, addr)
loop = collections.Counter(op.split(".")[0] for a, op, _ in ins if best[0] <= a <= best[1])
print(sum(loop.values()), dict(loop.most_common(22)))
