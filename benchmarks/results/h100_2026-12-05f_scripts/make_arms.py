# ruff: noqa  (session 36 scratch generator: kernel-source arms for the device A/B)
"""Write arms/first.cu from the working tree's kernel: the codes copied with an L2 evict_first
policy (the small copies keep evict_last), the open question of session 35 (1.03-1.09x flushed
at batch 1-4, 0.74-0.89x at Huginn batch >= 16; to be timed chained). arms/main_e.cu (eafb0d5's
kernel, before lever 5) is written by `git show eafb0d5:rq_kernels/csrc/rq_decode_tc.cu`."""
from pathlib import Path
OUT = Path(__file__).parent / "arms"
src = Path("rq_kernels/csrc/rq_decode_tc.cu").read_text()
FIRST = '''// L2 evict_first policy for the codes (session 36 arm; not volatile: hoisted out of the loop)
__device__ __forceinline__ uint64_t l2_first() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\\n" : "=l"(policy));
  return policy;
}
'''
anchor = "__device__ __forceinline__ void cp_commit()"
assert src.count(anchor) == 1
src = src.replace(anchor, FIRST + anchor)
i = src.index("template <int BITS, int PITCH> __device__ __forceinline__ void issue_codes(")
j = src.index("// Gather the tile", i)
body = src[i:j]
n = body.count("cp_async_n<M::CB>(")
assert n == 4, n
body = body.replace("cp_async_n<M::CB>(", "cp_async_n<M::CB, true>(").replace("stride));", "stride), l2_first());")
assert body.count("l2_first()") == 4
(OUT / "first.cu").write_text(src[:i] + body + src[j:])
print("wrote", OUT / "first.cu")
