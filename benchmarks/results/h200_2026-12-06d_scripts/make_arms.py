"""Session 42: the fused merge's arms, written from main's rq_decode_tc.cu into arms/ (run from the
checkout root): acqrel (the arrival's atomic acquires itself, no separate fence in the last
arrival), chunk (a pair whose splits fit two merge rounds reduces them in one level), both.
Second call (after acqrel was merged into main): pf (the merging warp prefetches every row it
reduces into its L1, then loads the rounds through L1) and pf1 (pf, and one level wherever a
pair's rows are at most 128)."""
from pathlib import Path

SRC = Path("rq_kernels/csrc/rq_decode_tc.cu").read_text()
OUT = Path(__file__).resolve().parent / "arms"


def sub(s, old, new):
    assert s.count(old) == 1, old
    return s.replace(old, new)


def acqrel(s):
    s = sub(s, 'asm volatile("atom.release.gpu.global.inc.u32 %0, [%1], %2;\\n"',
            'asm volatile("atom.acq_rel.gpu.global.inc.u32 %0, [%1], %2;\\n"')
    return sub(s, '  if (old != (unsigned)(members - 1)) return false;\n  asm volatile("fence.acq_rel.gpu;\\n" ::: "memory");\n',
               '  if (old != (unsigned)(members - 1)) return false;\n')


def chunk(s):
    s = sub(s, "  const int C = A.merge_chunk;\n  reduce_rows(",
            "  const int C = used <= 2 * MERGE_U ? used : A.merge_chunk;\n  reduce_rows(")
    return sub(s, "    const int C = A.merge_chunk, c = split / C, chunks = (used + C - 1) / C;\n    const int slots = (A.num_splits + C - 1) / C;",
               "    const int C = used <= 2 * MERGE_U ? used : A.merge_chunk, c = split / C, chunks = (used + C - 1) / C;\n    const int slots = (A.num_splits + A.merge_chunk - 1) / A.merge_chunk;")


def pf(s):
    s = sub(s, "__device__ __forceinline__ float4 ldcg4(const float* p) {",
            """__device__ __forceinline__ float2 ldca2(const float* p) {
  float2 v;
  asm volatile("ld.global.ca.v2.f32 {%0, %1}, [%2];\\n" : "=f"(v.x), "=f"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ float4 ldca4(const float* p) {
  float4 v;
  asm volatile("ld.global.ca.v4.f32 {%0, %1, %2, %3}, [%4];\\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ float4 ldcg4(const float* p) {""")
    s = sub(s, "  for (int i0 = 0; i0 < count; i0 += MERGE_U) {\n    float2 ml[MERGE_U][GQ];",
            """  {  // every row's 128-byte lines into this SM's L1 (after the acquire: fresh from the L2)
    constexpr int LPR = D * 4 / 128;
    const int lines = GQ * count * LPR;
    for (int x = lane; x < lines; x += 32) {
      const int hq = x / (count * LPR), rest = x % (count * LPR), i = rest / LPR, part = rest % LPR;
      const float* p = A.mid_o + (rb + (int64_t)hq * S + first + (int64_t)i * stride) * D + part * 32;
      asm volatile("prefetch.global.L1 [%0];\\n" ::"l"(p));
    }
    for (int x = lane; x < GQ * count; x += 32) {
      const int hq = x / count, i = x % count;
      asm volatile("prefetch.global.L1 [%0];\\n" ::"l"(A.mid_ml + (rb + (int64_t)hq * S + first + (int64_t)i * stride) * 2));
    }
  }
  for (int i0 = 0; i0 < count; i0 += MERGE_U) {
    float2 ml[MERGE_U][GQ];""")
    s = sub(s, "          ml[u][hq] = ldcg2(A.mid_ml + row * 2);", "          ml[u][hq] = ldca2(A.mid_ml + row * 2);")
    s = sub(s, "            const float4 v = ldcg4(op);\n", "            const float4 v = ldca4(op);\n")
    return sub(s, "            const float2 v = ldcg2(op);\n", "            const float2 v = ldca2(op);\n")


def one_level(s):
    s = sub(s, "  const int C = A.merge_chunk;\n  reduce_rows(",
            "  const int C = used * GQ <= 128 ? used : A.merge_chunk;\n  reduce_rows(")
    return sub(s, "    const int C = A.merge_chunk, c = split / C, chunks = (used + C - 1) / C;\n    const int slots = (A.num_splits + C - 1) / C;",
               "    const int C = used * GQ <= 128 ? used : A.merge_chunk, c = split / C, chunks = (used + C - 1) / C;\n    const int slots = (A.num_splits + A.merge_chunk - 1) / A.merge_chunk;")


OUT.mkdir(exist_ok=True)
if "atom.release.gpu" in SRC:  # the first call's arms (main before acqrel)
    (OUT / "acqrel.cu").write_text(acqrel(SRC))
    (OUT / "chunk.cu").write_text(chunk(SRC))
    (OUT / "both.cu").write_text(chunk(acqrel(SRC)))
else:
    (OUT / "pf.cu").write_text(pf(SRC))
    (OUT / "pf1.cu").write_text(one_level(pf(SRC)))
    (OUT / "one.cu").write_text(one_level(SRC))
