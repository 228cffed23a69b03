# ruff: noqa  (session 30 diagnostic, rerun in session 42 unchanged but the output name: per-warp timestamps of the tc split kernel at small batch)
"""Where a tc split call's time goes: per warp (lane 0) globaltimer at entry/end and clock64 at
entry, after griddep_wait, first tile landed, loop end, partial written, merge end."""
import ctypes, json, os, re, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, os.getcwd())
import torch
from rq_kernels import cuda as rqc
from rq_kernels import decode_attention
from rq_kernels.decode import DecodeLaunch
from benchmarks.bench_decode import batch_inputs
from benchmarks.common import FAMILIES, pool
from sglang_rq.config import RQConfig
OUT = os.environ.get("OUT", "/tmp")
src = (rqc.CSRC / "rq_decode_tc.cu").read_text()
NS = 16
def sub(pat, rep, count=1):
    global src
    n = src.count(pat)
    assert n >= 1, pat
    src = src.replace(pat, rep, count)
helpers = r'''
__device__ unsigned long long rq_trace[16 * 65536];
__device__ __forceinline__ unsigned long long tr_g() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ unsigned long long tr_c() { return clock64(); }
#define TR(k, v) do { if ((threadIdx.x & 31) == 0) rq_trace[(int64_t)(blockIdx.x * WARPS + (threadIdx.x >> 5)) * 16 + (k)] = (v); } while (0)
'''
sub('// ---- the fused merge (q_mode 1 or 2)', helpers + '// ---- the fused merge (q_mode 1 or 2)')
sub("  reduce_rows(A, rb, c * C, 1, min(C, used - c * C), lane, m, l, acc);\n", "  reduce_rows(A, rb, c * C, 1, min(C, used - c * C), lane, m, l, acc);\n  TR(12, tr_c());\n")
sub("    if (!arrive_last(pair_counter, chunks, lane)) return;\n    reduce_rows(A, rb, 0, C, chunks, lane, m, l, acc);\n",
    "    if (!arrive_last(pair_counter, chunks, lane)) return;\n    TR(13, tr_c()); TR(15, chunks);\n    reduce_rows(A, rb, 0, C, chunks, lane, m, l, acc);\n    TR(14, tr_c());\n")
sub("  const int unit = blockIdx.x * WARPS + warp;\n", "  const int unit = blockIdx.x * WARPS + warp;\n  TR(0, tr_g()); TR(1, tr_c()); { unsigned s; asm volatile(\"mov.u32 %0, %%smid;\" : \"=r\"(s)); TR(9, s); }\n  TR(10, 0); TR(11, 0); TR(3,0); TR(4,0); TR(5,0); TR(6,0); TR(7,0); TR(8,0); TR(2,0); TR(12,0); TR(13,0); TR(14,0); TR(15,0);\n")
sub("  __syncwarp();\n  // the history copies are in flight; the query is the previous kernel's output\n  griddep_wait();\n",
    "  __syncwarp();\n  // the history copies are in flight; the query is the previous kernel's output\n  griddep_wait();\n  TR(2, tr_c()); TR(10, ntiles);\n")
sub("    cp_wait<STAGES - 2 * SUBT>();\n#if COOP\n    __syncthreads();  // every warp's copies of these stages landed; the last ones' reads are done\n#else\n    __syncwarp();\n#endif\n",
    "    cp_wait<STAGES - 2 * SUBT>();\n#if COOP\n    __syncthreads();  // every warp's copies of these stages landed; the last ones' reads are done\n#else\n    __syncwarp();\n#endif\n    if (it == 0) TR(3, tr_c());\n")
sub("#pragma unroll\n  for (int x = 1; x <= 2; x <<= 1) {\n    l_run += __shfl_xor_sync",
    "  TR(4, tr_c());\n#pragma unroll\n  for (int x = 1; x <= 2; x <<= 1) {\n    l_run += __shfl_xor_sync")
sub("    if (arrive_last(pc + c, min(C, used - c * C), lane))\n      merge_pair(A, b, hk, rb, c, chunks, used, pc + slots, lane);\n  }\n}",
    "    TR(5, tr_c());\n    if (arrive_last(pc + c, min(C, used - c * C), lane)) {\n      TR(6, tr_c()); TR(11, 1);\n      merge_pair(A, b, hk, rb, c, chunks, used, pc + slots, lane);\n      TR(7, tr_c());\n    }\n  }\n  TR(8, tr_g());\n}")
tmp = Path(tempfile.mkdtemp()); (tmp / "rq_decode_tc.cu").write_text(src)
for f in rqc.CSRC.iterdir():
    if f.name != "rq_decode_tc.cu" and f.is_file(): (tmp / f.name).write_text(f.read_text()) if f.suffix in (".cu", ".h", ".c", ".cuh") else None
rqc.CSRC = tmp
MODS = []
_orig = rqc._Driver.load
def load(self, cubin, name):
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    self.check(self.lib.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(cubin)), "load")
    self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()), "fn")
    MODS.append((mod, fn.value)); return fn.value
rqc._Driver.load = load
LAST = {}
_orig_launch = rqc._Driver.launch
def launch(self, fn, *a, **k):
    LAST["fn"] = fn
    return _orig_launch(self, fn, *a, **k)
rqc._Driver.launch = launch
def read_trace(n_units):
    mod = [m for m, f in MODS if f == LAST['fn']][0]
    lib = rqc._DRIVER.lib
    dptr, size = ctypes.c_uint64(), ctypes.c_size_t()
    rqc._DRIVER.check(lib.cuModuleGetGlobal_v2(ctypes.byref(dptr), ctypes.byref(size), mod, b"rq_trace"), "global")
    buf = (ctypes.c_uint64 * (n_units * NS))()
    rqc._DRIVER.check(lib.cuMemcpyDtoH_v2(buf, dptr, ctypes.c_size_t(n_units * NS * 8)), "dtoh")
    return torch.tensor(list(buf), dtype=torch.float64).view(n_units, NS)
cfg, LOOPS = RQConfig(), 4
hq, hkv, dim = FAMILIES["ouro-1.4b"]
K = 1024
view = pool(cfg, hkv, dim, 16 * 16 * K + 2, LOOPS)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
res = {}
def pct(x, p): return float(torch.quantile(x, p)) if x.numel() else float("nan")
for lens in ([16 * K] * 2, [8 * K], [8 * K] * 4, [16 * K] * 16):
    q, kc, vc, ind, idx = batch_inputs(view, hq, hkv, dim, lens)
    for loop in (0, 3):
        out = torch.empty_like(q)
        call = lambda: decode_attention(q, kc, vc, view, loop, ind, idx, sm_scale=dim ** -0.5, out=out)
        for _ in range(3): call()
        torch.cuda.synchronize()
        tr = None; evs = []
        for rep in range(3):
            flush.zero_(); torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(); call(); e1.record(); torch.cuda.synchronize(); evs.append(e0.elapsed_time(e1) * 1e3)
        t = read_trace(65536)
        live = t[:, 0] > 0
        t = t[live]
        act = t[:, 2] > 0
        a = t[act]
        g0 = t[:, 0].min()
        ghz = None
        # cycles -> ns from the longest warp: (g_end - g_entry) / (c-span) is not available for c_end; use 1.98
        cyc = 1.0 / 1.98  # ns per cycle at the H200's boost clock (sanity: compare to globaltimer spans)
        d = lambda i, j: (a[:, j] - a[:, i]) * cyc / 1e3  # us
        rec = dict(units=int(t.shape[0]), active=int(a.shape[0]), ntiles_med=pct(a[:, 10], .5), ntiles_max=float(a[:, 10].max()),
                   event_us=evs, span_us=float((t[:, 8].max() - g0) / 1e3),
                   entry_spread_us=[pct((t[:, 0] - g0) / 1e3, p) for p in (.1, .5, .9, 1.)],
                   entry_to_wait_us=[pct(d(1, 2), p) for p in (.1, .5, .9)],
                   wait_to_first_tile_us=[pct(d(2, 3), p) for p in (.1, .5, .9)],
                   loop_us=[pct(d(3, 4), p) for p in (.1, .5, .9, 1.)],
                   per_tile_us=pct(d(3, 4) / a[:, 10].clamp(min=1), .5),
                   epilogue_us=[pct(d(4, 5), p) for p in (.5, .9)],
                   loop_end_abs_us=[pct((a[:, 0] - g0) / 1e3 + d(1, 4), p) for p in (.1, .5, .9, 1.)],
                   merge_us=[pct(d(6, 7)[a[:, 11] > 0], p) for p in (.5, .9, 1.)],
                   end_abs_us=[pct((t[:, 8] - g0) / 1e3, p) for p in (.5, .9, 1.)],
                   arrive_us=[pct(d(5, 6)[a[:, 11] > 0], p) for p in (.5, .9)],
                   level1_us=[pct(d(6, 12)[a[:, 11] > 0], p) for p in (.5, .9)],
                   write_arrive2_us=[pct(d(12, 13)[a[:, 13] > 0], p) for p in (.5, .9)],
                   level2_us=[pct(d(13, 14)[a[:, 13] > 0], p) for p in (.5, .9)],
                   out_us=[pct(d(14, 7)[a[:, 13] > 0], p) for p in (.5, .9)],
                   chunks=pct(a[:, 15][a[:, 13] > 0], .5) if bool((a[:, 13] > 0).any()) else 1,
                   gspan_vs_cspan=pct(((a[:, 8] - a[:, 0]) / ((a[:, 4] - a[:, 1]) * cyc)), .5))
        key = f"{len(lens)}x{lens[0]//K}k_loop{loop}"
        res[key] = rec
        print(key, json.dumps({k: (round(v, 2) if isinstance(v, float) else [round(x, 2) for x in v] if isinstance(v, list) else v) for k, v in rec.items()}), flush=True)
        json.dump(res, open(f"{OUT}/trace42b.json", "w"), indent=1)
