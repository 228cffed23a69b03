"""The CUDA tensor-core split kernel's tile copies, run on the host (no GPU).

The copy code of `csrc/rq_decode_tc.cu` (everything before the kernel itself) is compiled with
the host's C++ compiler behind a small shim: ``cp.async`` records (shared destination, global
source, bytes) instead of copying, and a warp shuffle reads the tile slot of the lane it names
(the only value the copy code shuffles; the shim checks that). Every lane of a CTA's warps then
issues one tile, as the kernel's loop does, over a pool with fake base addresses, padded row
strides and slots past 2^32 bytes of offset. The recorded copies must deliver, byte for byte,
what the stage layout says each stage holds (`decode_tc.stage_bytes` and `coop_small_bytes`,
the mirrors of the source's macros): the codes of every token of the tile at its pitch, the
(scale, offset) rows at the offset the kernel reads them from (head_dim 96: the pool row's
address mod 4), the LSQ coefficients where `coef_of` reads them; no shared byte twice from
different sources, and no global read outside the tile's own pool rows; the L2 policy each copy carries (the small
data evict_last, the codes evict_first where `decode_tc.stream_shape` holds). This covers the
address arithmetic a restructuring of the copies is most likely to break, which the GPU tests
catch only where a GPU is lent. Skipped where no C++ compiler is installed.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess

import pytest

from rq_kernels import cuda
from rq_kernels.decode_tc import (
    OCCUPANCY, SOURCE, TILE, WARPS, coop_small_bytes, integer_k, stage_bytes, stream_shape, width,
)

CXX = shutil.which("c++") or shutil.which("g++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no host C++ compiler")

SHIM = r"""
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <vector>
using std::max; using std::min;
#define __device__
#define __host__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(a, b)
#define __align__(x)
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint2 { uint32_t x, y; };
struct uint4 { uint32_t x, y, z, w; };
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
inline float __uint_as_float(uint32_t x) { float f; memcpy(&f, &x, 4); return f; }
inline uint32_t __float_as_uint(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
inline int __float2int_rn(float x) { return (int)lrintf(x); }
inline float __int2float_rn(int x) { return (float)x; }
inline void __syncwarp() {}
inline void __syncthreads() {}
inline int __any_sync(unsigned, int p) { return p; }
inline unsigned __ballot_sync(unsigned, int p) { return p; }
inline int __ffs(unsigned x) { return __builtin_ffs(x); }
inline uint32_t __cvta_generic_to_shared(const void* p) { return (uint32_t)(uintptr_t)p; }
// the tile: token i's pool row, and the lane whose copies run
static uint64_t g_slot[16];
static int g_lane;
struct Rec { uint32_t dst; uint64_t src; int bytes; int policy; };
static std::vector<Rec> g_rec;
// the copy code shuffles only the lanes' slots (lane l holds token l & 15's)
template <class T> T __shfl_sync(unsigned, T v, int src) {
  assert((uint64_t)v == g_slot[g_lane & 15]);
  return (T)g_slot[src & 15];
}
template <class T> T __shfl_xor_sync(unsigned, T v, int) { return v; }
template <class T> T __shfl_up_sync(unsigned, T v, int) { return v; }
"""

# One tile of every warp of a CTA, every lane, into stage `stage` (args: the pool, then the
# 16 slots): as the kernel's loop issues it (keep in step with the kernel).
DRIVER = r"""
int main(int argc, char** argv) {
  Args A; memset(&A, 0, sizeof A);
  uint64_t v[20];
  for (int i = 0; i < 20; ++i) v[i] = strtoull(argv[1 + i], nullptr, 0);
  A.ac = (const uint8_t*)v[0]; A.ac_r = v[1]; A.ac_kv = v[2]; A.ac_h = v[3];
  A.aso = (const uint8_t*)v[4]; A.aso_r = v[5]; A.aso_kv = v[6]; A.aso_h = v[7];
  A.rc = (const uint8_t*)v[8]; A.rc_r = v[9]; A.rc_kv = v[10]; A.rc_h = v[11];
  A.rso = (const uint8_t*)v[12]; A.rso_r = v[13]; A.rso_kv = v[14]; A.rso_h = v[15];
  A.cf = (const uint16_t*)v[16]; A.cf_r = v[17]; A.cf_kv = v[18]; A.cf_h = v[19];
  const int hk0 = atoi(argv[21]), stage = atoi(argv[22]);
  const uint32_t smem = atoi(argv[23]);  // the CTA's dynamic shared memory (shared address)
  for (int i = 0; i < 16; ++i) g_slot[i] = strtoull(argv[24 + i], nullptr, 0);
  const uint32_t small0a = smem + WARPS * STAGES * STAGE_BYTES;
  for (int warp = 0; warp < WARPS; ++warp) {
    const int hk = hk0 + warp;
    const uint32_t wsa = smem + warp * (STAGES * STAGE_BYTES);
    for (int lane = 0; lane < 32; ++lane) {
      g_lane = lane;
      const uint32_t slot = (uint32_t)g_slot[lane & 15];
      const Copies c = copy_setup(A, hk, warp, lane);
#if COOP
      const uint32_t sm = small0a + stage * SMALL_BYTES;
#else
      const uint32_t sm = wsa + stage * STAGE_BYTES + OFF_SO;
#endif
      issue_tile(A, c, wsa + stage * STAGE_BYTES, sm, lane, slot, true);
    }
  }
  for (const Rec& r : g_rec)
    printf("%u %llu %d %d\n", r.dst, (unsigned long long)r.src, r.bytes, r.policy);
}
"""


def _copy_code(text: str) -> str:
    """The source before the kernel, with cp.async recording its copies."""
    text = text[text.index("// Programmatic dependent launch"):text.index('extern "C" __global__')]
    text, n = re.subn(
        r"template <int BYTES, bool HINT = false>\n__device__ __forceinline__ void cp_async_n\("
        r"uint32_t dst, const void\* src, uint64_t policy = 0\) \{.*?\n\}",
        "template <int BYTES, bool HINT = false> inline void cp_async_n(uint32_t dst, const void* src, "
        "uint64_t policy = 0) { g_rec.push_back({dst, (uint64_t)(uintptr_t)src, BYTES, "
        "HINT ? (int)policy : 0}); }",
        text, flags=re.S)
    assert n == 1, "cp_async_n not found in the source: keep the shim in step"
    return text


def _build(defines: dict, tmp_dir: str) -> str:
    src = (SHIM + "".join(f"#define {k} {v}\n" for k, v in defines.items())
           + _copy_code((cuda.CSRC / SOURCE).read_text()) + DRIVER)
    exe = os.path.join(tmp_dir, "copies_" + hashlib.sha1(src.encode()).hexdigest()[:12])
    if not os.path.exists(exe):
        with open(exe + ".cpp", "w") as f:
            f.write(src)
        res = subprocess.run([CXX, "-std=c++17", "-O0", "-w", "-o", exe, exe + ".cpp"],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-4000:]
    return exe


class Pool:
    """Token-major pool tensors ``[rows, 2 (K, V), H, bytes]`` at fake addresses, rows padded
    (the layers' views of the pool are slices of wider rows), as byte strides (the launcher's
    ``parts``). Coefficients: bf16 ``[rows, 2, H]``, strides in elements."""

    def __init__(self, hd: int, gs: int, a_bits: int, r_bits: int, heads: int,
                 coop: bool) -> None:
        sb = 2 * (hd // gs)  # (scale, offset) bytes of a (token, head) in the pool
        self.code = {"a": hd * a_bits // 8, "r": hd * r_bits // 8}
        self.sb = sb
        self.t = {}
        base = 1 << 40
        # K to V and row strides padded apart (16-byte multiples), so no two tensors share one
        for i, (name, per_head, pad) in enumerate((("ac", self.code["a"], 64),
                                                   ("aso", sb, 32), ("rc", self.code["r"], 96),
                                                   ("rso", sb, 128))):
            kv = heads * per_head + pad // 2
            self.t[name] = (base * (i + 1), 2 * kv + pad, kv, per_head)
        # coefficients: COOP copies a CTA's 4 heads' as 8 aligned bytes; else at an address
        # = 2 mod 4 (the kernel reads the aligned word holding each)
        self.t["cf"] = (base * 5, 2 * heads + 16, heads + 4, 1) if coop else (
            base * 5 + 2, 2 * heads + 10, heads + 2, 1)

    def argv(self) -> list[str]:
        return [str(x) for name in ("ac", "aso", "rc", "rso", "cf") for x in self.t[name]]

    def addr(self, name: str, slot: int, kv: int, head: int) -> int:
        ptr, r, k, h = self.t[name]
        elem = 2 if name == "cf" else 1
        return ptr + (slot * r + kv * k + head * h) * elem

    def row(self, name: str, slot: int) -> tuple[int, int]:
        ptr, r, _, _ = self.t[name]
        elem = 2 if name == "cf" else 1
        return ptr + slot * r * elem, ptr + (slot + 1) * r * elem


def _expected(d: dict, pool: Pool, slots: list[int], hk0: int, stage: int,
              smem: int) -> dict[int, int]:
    """shared byte -> global byte, from the stage layout."""
    D, hd = width(d["HEAD_DIM"]), d["HEAD_DIM"]
    ba, br = D * d["A_BITS"] // 8, D * d["R_BITS"] // 8
    coop = d["COOP"]
    sbytes = stage_bytes(d["A_BITS"], d["R_BITS"], hd, coop=bool(coop))
    small = smem + WARPS * d["STAGES"] * sbytes + stage * coop_small_bytes(hd, d["GS"])
    off_so = 2 * TILE * (ba + br)
    sb = 2 * (D // d["GS"])
    want = {}
    kinds = [("aso", 0), ("aso", 1)] + ([("rso", 0), ("rso", 1)] if d["R_BITS"] else [])
    for w in range(WARPS):
        hk = hk0 + w
        st = smem + w * d["STAGES"] * sbytes + stage * sbytes
        for i, s in enumerate(slots):
            for name, off, pitch, n in (("ac", 0, ba, pool.code["a"]),
                                        ("rc", 2 * TILE * ba, br, pool.code["r"])):
                for kv in (0, 1):
                    src = pool.addr(name, s, kv, hk)
                    dst = st + off + kv * TILE * pitch + i * pitch
                    want.update({dst + j: src + j for j in range(n)})
            for kind, (name, kv) in enumerate(kinds):
                src = pool.addr(name, s, kv, hk)
                if coop:
                    dst = small + (kind * TILE + i) * WARPS * sb + w * sb
                else:  # 8 bytes per row, read from the pool row's address mod 4 (head_dim 96)
                    dst = st + off_so + (kind * TILE + i) * 8 + (src & 3 if hd == 96 else 0)
                want.update({dst + j: src + j for j in range(pool.sb)})
            if d["HAS_COEF"]:
                for kv in (0, 1):
                    src = pool.addr("cf", s, kv, hk)
                    if coop:
                        dst = small + 4 * TILE * WARPS * sb + (kv * TILE + i) * WARPS * 2 + w * 2
                    else:  # the aligned word holding it; the value at its address mod 4
                        dst = st + off_so + 4 * TILE * 8 + (kv * TILE + i) * 4 + (src & 2)
                    want.update({dst + j: src + j for j in range(2)})
    return want


FORMATS = [  # (head_dim, group size, query heads per KV head, anchor bits, residual bits, coef, COOP)
    (128, 32, 1, 4, 2, 1, 1), (128, 32, 1, 4, 0, 0, 1), (128, 32, 1, 4, 2, 1, 0),
    (128, 32, 1, 4, 4, 1, 1), (128, 32, 1, 2, 2, 1, 0), (128, 64, 2, 4, 2, 1, 1),
    (128, 32, 1, 4, 2, 0, 1), (96, 32, 1, 4, 2, 1, 0), (96, 32, 1, 4, 0, 0, 0),
    (96, 32, 1, 2, 4, 1, 0), (64, 32, 3, 4, 2, 1, 0), (64, 32, 2, 4, 2, 1, 1),
    (64, 32, 1, 4, 4, 0, 0),
]


@pytest.mark.parametrize("shape", [0, 1], ids=["one_tile", "two_tiles"])  # OCCUPANCY's order
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: "d{}g{}q{}a{}r{}c{}o{}".format(*f))
def test_tile_copies_deliver_the_stage_layout(fmt, shape, tmp_path_factory):
    hd, gs, gq, a, r, coef, coop = fmt
    kint = integer_k(gq, hd, gs)
    occ = OCCUPANCY[kint][shape]  # the launcher's shapes (CTAs per SM, stages, tiles per step)
    d = dict(HEAD_DIM=hd, A_BITS=a, R_BITS=r, GS=gs, GQ=gq, HAS_COEF=coef, WARPS=WARPS,
             KINT=int(kint), MINB=occ.ctas_per_sm, STAGES=occ.stages, SUBT=occ.subtiles,
             COOP=coop, STREAM=int(stream_shape(hd, (a, r), bool(coop))))
    exe = _build(d, str(tmp_path_factory.getbasetemp()))
    heads = 4 * WARPS if coop else 4 * WARPS + 1
    pool = Pool(hd, gs, a, r, heads, bool(coop))
    # scattered rows, row 0 (past a split's end) and offsets past 2^32
    slots = [0, 7, 3_999_999, 12, 13, 2_500_000, 1, 8, 9, 700_001, 42, 43, 44, 3_000_017, 5, 6]
    hk0, stage, smem = WARPS, occ.stages - 1, 1024
    out = subprocess.run([exe, *pool.argv(), str(hk0), str(stage), str(smem),
                          *map(str, slots)], capture_output=True, text=True, check=True).stdout
    got: dict[int, int] = {}
    rows = {name: [pool.row(name, s) for s in slots] for name in ("ac", "aso", "rc", "rso", "cf")}
    # the L2 policy each tensor's copies carry, as the host stand-in of l2_policy gives them:
    # the small data (scale, offset rows, coefficients) evict_last (1); the codes evict_first
    # (2) under STREAM, else none (0)
    policy = ({name: 2 * d["STREAM"] for name in ("ac", "rc")}
              | {name: 1 for name in ("aso", "rso", "cf")})
    for line in out.splitlines():
        dst, src, n, pol = map(int, line.split())
        assert [policy[name] for name, rr in rows.items()
                if any(lo <= src < hi for lo, hi in rr)] == [pol], (
            f"copy from {src:#x}: L2 policy {pol}")
        assert src % n == 0 and dst % n == 0, f"cp.async of {n} bytes {src:#x} -> {dst:#x}: unaligned"
        assert any(lo <= src and src + n <= hi for rr in rows.values() for lo, hi in rr), (
            f"copy of {n} bytes from {src:#x}: outside the tile's pool rows")
        for j in range(n):
            assert got.setdefault(dst + j, src + j) == src + j, (
                f"shared byte {dst + j:#x} copied from {got[dst + j]:#x} and {src + j:#x}")
    want = _expected(d, pool, slots, hk0, stage, smem)
    missing = [(hex(k), hex(v)) for k, v in want.items() if got.get(k) != v]
    assert not missing, f"{len(missing)} of {len(want)} stage bytes not delivered: {missing[:5]}"
