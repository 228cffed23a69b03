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

# Third set (prepared for the next session, not run): a policy per lane for the codes, fixed
# before the loop, from whether the 128-byte line a lane's copy falls in lies wholly inside its
# CTA's span of the token row (the CTA's 4 warps being 4 adjacent KV heads of one split: KV
# heads % 4 == 0; the row stride a multiple of 128, so the pattern repeats in every row). Owned
# lines get OWN, the lines shared with a neighbouring CTA get SHARED:
#   lane_fn: evict_first / evict_normal;  lane_fl: evict_first / evict_last;
#   lane_nl: evict_normal / evict_last.
# Ouro (every line owned) is the control: lane_fn and lane_fl should time as main (STREAM),
# lane_nl as ac73e6a. The question is Huginn (head_dim 96: 3 of 9 anchor lines shared, every
# residual line) and its 12 % re-fetched DRAM bytes at 64 x 8k.
POL = {"first": "evict_first", "normal": "evict_normal", "last": "evict_last"}
LANE = r'''
// session-36 arm: the L2 policy of one lane's code copies (see make_arms.py, third set)
__device__ __forceinline__ uint64_t code_policy(const Args& A, const uint8_t* p, const uint8_t* lo,
                                                int64_t head_bytes, int64_t row_stride) {
  uint64_t own, shared;
  asm("createpolicy.fractional.L2::%OWN%.b64 %0, 1.0;\n" : "=l"(own));
  asm("createpolicy.fractional.L2::%SHARED%.b64 %0, 1.0;\n" : "=l"(shared));
  const uintptr_t line = (uintptr_t)p & ~(uintptr_t)127, a = (uintptr_t)lo;
  const bool ok = (A.num_qo_heads / GQ) % 4 == 0 && row_stride % 128 == 0;
  return ok && line >= a && line + 128 <= a + 4 * head_bytes ? own : shared;
}
'''
src = Path("rq_kernels/csrc/rq_decode_tc.cu").read_text()
setup_old = "  c.stream = STREAM ? l2_policy<true>() : 0;\n"
struct_old = "  uint64_t stream;                       // the codes' (STREAM: evict_first)\n"
assert src.count(setup_old) == 1 and src.count(struct_old) == 1
for name, (own, shared) in {"lane_fn": ("first", "normal"), "lane_fl": ("first", "last"),
                            "lane_nl": ("normal", "last")}.items():
    t = src.replace(struct_old, "  uint64_t pak, pav, prk, prv;           // the codes' L2 policies (arm)\n")
    t = t.replace(setup_old, "")
    # after the residual pointers are set (the end of the code part of copy_setup)
    anchor = "  const int tok = lane & 15, half = lane >> 4;\n"
    assert t.count(anchor) == 1
    t = t.replace(anchor, """  {
    const int hk0 = hk - warp;
    const uint8_t* lo = A.ac + hk0 * A.ac_h;
    c.pak = code_policy(A, c.ak, lo, A.ac_h, A.ac_r);
    c.pav = code_policy(A, c.av, lo + A.ac_kv, A.ac_h, A.ac_r);
#if R_BITS > 0
    const uint8_t* rlo = A.rc + hk0 * A.rc_h;
    c.prk = code_policy(A, c.rk, rlo, A.rc_h, A.rc_r);
    c.prv = code_policy(A, c.rv, rlo + A.rc_kv, A.rc_h, A.rc_r);
#endif
  }
""" + anchor)
    t = t.replace("    uint32_t s0, uint32_t s1, uint64_t policy) {",
                  "    uint32_t s0, uint32_t s1, uint64_t pk, uint64_t pv) {")
    for kv in ("k", "v"):
        for r in ("s0", "s1"):
            pre = f"d{kv}" if r == "s0" else f"d{kv} + 8 * PITCH"
            old = f"cp_async_n<M::CB, STREAM>({pre}, row_ptr({kv}, {r}, stride), policy);"
            assert t.count(old) == 1, old
            t = t.replace(old, f"cp_async_n<M::CB, true>({pre}, row_ptr({kv}, {r}, stride), p{kv});")
    t = t.replace("lane, MA::ROUNDS ? s0 : slot, s1, c.stream);", "lane, MA::ROUNDS ? s0 : slot, s1, c.pak, c.pav);")
    t = t.replace("lane, MR::ROUNDS ? s0 : slot, s1, c.stream);", "lane, MR::ROUNDS ? s0 : slot, s1, c.prk, c.prv);")
    assert ", c.stream)" not in t and "c.stream =" not in t
    cp = "__device__ __forceinline__ void cp_commit()"
    t = t.replace(cp, LANE.replace("%OWN%", POL[own]).replace("%SHARED%", POL[shared]) + cp, 1)
    # code_policy sits before Copies/copy_setup (cp_commit precedes them); Args is defined above
    (OUT / f"{name}.cu").write_text(t)
    print("wrote", name)
