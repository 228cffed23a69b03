# ruff: noqa  (session 35 scratch generator: kernel-source arms for the device A/B)
"""Write arms/*.cu from scratch/main.cu and scratch/both.cu (issue_cut.diff applied):
main, both, both_keep (the (scale, offset) rows and coefficients copied with an L2 evict_last
policy), both_nohint (no .L2::128B prefetch on any copy), main_keep, both_first (the codes copied with an
L2 evict_first policy)."""
import re, sys
from pathlib import Path
OUT = Path(__file__).parent / "arms"
KEEP = r'''
// L2 evict_last policy for the small copies (shared by the CTAs of one split)
template <int BYTES> __device__ __forceinline__ void cp_async_keep(uint32_t dst, const void* src) {
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
  if constexpr (BYTES == 16)
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "l"(pol));
  else
    asm volatile("cp.async.ca.shared.global.L2::cache_hint.L2::128B [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src),
                 "n"(BYTES), "l"(pol));
}
'''
def add_keep(s):
    i = s.index("__device__ __forceinline__ void cp_commit()")
    return s[:i] + KEEP + s[i:]
def sub_region(s, start, end, a, b):
    i = s.index(start); j = s.index(end, i)
    return s[:i] + s[i:j].replace(a, b) + s[j:]
main = Path("scratch/main.cu").read_text(); both = Path("scratch/both.cu").read_text()
(OUT / "main.cu").write_text(main); (OUT / "both.cu").write_text(both)
bk = add_keep(both)
bk = sub_region(bk, "  if (c.so_on) {", "// Where a stage's (scale, offset)", "cp_async_n<", "cp_async_keep<")
assert bk.count("cp_async_keep<") == 9, bk.count("cp_async_keep<")
(OUT / "both_keep.cu").write_text(bk)
nh = both.replace(".L2::128B", "")
assert nh.count("L2::128B") == 0 and both.count(".L2::128B") == 3
(OUT / "both_nohint.cu").write_text(nh)
mk = add_keep(main)
mk = sub_region(mk, "__device__ __forceinline__ void issue_so(", "// Copy the codes of one kind", "cp_async_n<", "cp_async_keep<")
mk = sub_region(mk, "#if HAS_COEF\n  {  // the aligned word holding", "  if (half == 0) {", "cp_async_n<", "cp_async_keep<")
mk = sub_region(mk, "__device__ __forceinline__ void issue_small(", "// Where a stage's (scale, offset)", "cp_async_n<", "cp_async_keep<")
print("main_keep keep calls", mk.count("cp_async_keep<"))
(OUT / "main_keep.cu").write_text(mk)
FIRST = KEEP.replace("cp_async_keep", "cp_async_first").replace("evict_last", "evict_first").replace(
    "for the small copies (shared by the CTAs of one split)", "for the codes (streamed)").replace("L2 evict_last", "L2 evict_first")
bf = both.replace("__device__ __forceinline__ void cp_commit()", FIRST + "__device__ __forceinline__ void cp_commit()", 1)
bf = sub_region(bf, "template <int BITS, int PITCH> __device__ __forceinline__ void issue_codes(", "// Gather the tile", "cp_async_n<", "cp_async_first<")
assert bf.count("cp_async_first<") == 4, bf.count("cp_async_first<")
(OUT / "both_first.cu").write_text(bf)
