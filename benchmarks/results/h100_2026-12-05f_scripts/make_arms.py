# ruff: noqa  (session 36 scratch generator: kernel-source arms for the device A/B)
"""Write arms/first.cu from the working tree's kernel: the codes copied with an L2 evict_first
policy (the small copies keep evict_last), the open question of session 35 (1.03-1.09x flushed
at batch 1-4, 0.74-0.89x at Huginn batch >= 16; to be timed chained). arms/main_e.cu (eafb0d5's
kernel, before lever 5) is written by `git show eafb0d5:rq_kernels/csrc/rq_decode_tc.cu`."""
from pathlib import Path
OUT = Path(__file__).parent / "arms"
src = Path("rq_kernels/csrc/rq_decode_tc.cu").read_text()
if "STREAM" not in src:  # first set: from ac73e6a's kernel (before STREAM)
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

# Second set (after STREAM merged, c267694): does evict_first on the codes help because it
# spares other lines? The pool slots (kv_indices, read by every CTA of a split) loaded with an L2
# evict_last policy: idxkeep (STREAM as the launcher says), idxkeep_ns (STREAM forced off).
src = Path("rq_kernels/csrc/rq_decode_tc.cu").read_text()
old = "  return tok < hi ? reinterpret_cast<const uint32_t*>(A.kv_indices + base + tok)[0] : 0u;\n"
assert src.count(old) == 1
new = '''  if (tok >= hi) return 0u;
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\\n" : "=l"(pol));
  uint32_t s;
  asm volatile("ld.global.L2::cache_hint.u32 %0, [%1], %2;\\n" : "=r"(s) : "l"(A.kv_indices + base + tok), "l"(pol));
  return s;
'''
ik = src.replace(old, new)
(OUT / "idxkeep.cu").write_text(ik)
anchor = "static_assert(!STREAM || COOP,"
assert ik.count(anchor) == 1
(OUT / "idxkeep_ns.cu").write_text(ik.replace(anchor, "#undef STREAM\n#define STREAM 0\n" + anchor))
print("wrote idxkeep.cu, idxkeep_ns.cu")
