// Decode attention over the ResidualQuant cache on tensor cores: the split kernel.
//
// One warp handles one (KV head, request, split); the four warps of a CTA are adjacent
// (split, KV head) units, KV head fastest (they share small reads in L1). Splits are equal
// parts of each request's history, or (balanced) one length for the whole batch found on the
// device (balanced_split), so long requests get more of them. Each
// 16-token tile of the history runs two MMA phases (mma.sync, fp16 or u8 x s8 in, fp32 or s32 out):
//
//   K:  C_k[tok, col] = sum_k code[tok, k] * Qmask[k, col]      tokens on M (rows g, 8 + g),
//       one N column per (head, group) of the query masked to that group (K_STEPS steps of 16).
//   V:  C_v[e, col] += sum_tok code[e, tok] * W[tok, col]         elements on M (D / 16 m-tiles),
//       one N column per (head, group) of the weights W = p c s_a (anchor) or p s_r (residual).
//       PAIRED (ROWS <= 4, e.g. MHA at head_dim 128): columns 0-3 hold the anchor's weights and
//       4-7 the residual's (zero without a residual, R_BITS 0) in one accumulator, one MMA per
//       m-tile and code kind; else the anchor and the residual weights use columns 0-7 of two
//       accumulators.
//
// A thread's K accumulators are tokens g, 8 + g of columns 2t, 2t + 1 (one head's groups); the
// V B-operand fragment is column g at tokens 2t, 2t+1, 2t+8, 2t+9: four shuffles move the
// head's logits there, and the weights are built in registers. A thread's V accumulators are
// elements NT g + l of its slice g (l = 2 mt, 2 mt + 1) at columns 2t, 2t + 1; the epilogue
// picks each element's (head, group) columns from the quad.
//
// Codes become fp16 with one LOP3 per two (magic number 0x6400 = 1024.0: a code c at bit
// position pos of a 16-bit half reads as M + c * 2^pos; the integer K side (KINT) takes u8 codes
// instead). M is never subtracted per element: sum_e q_e (M + c_e 2^pos_e) = M sum_e q_e +
// sum_e q_e 2^pos_e c_e, so the fp16 K side pre-divides the query by 2^pos_e and folds M * sum q
// (of the fp16 fragments as rounded) into the per-group epilogue; on the V side M * sum W is
// drained from the accumulators in the softmax rescale, forced every DRAIN_TOKENS tokens
// (rescale_drain), and at the end, where the 2^pos factor is taken out. fp16's 10 mantissa bits
// hold two 4-bit or five 2-bit codes of a half unshifted (bf16's 7: one or three), so a word
// needs one shift; the V weights are fp16 of W 2^-VPRE (p c s would overflow fp16 unscaled).
//
// Logit of (head h, token):  sum_g  c s_a (X_a - F_a) + s_r (X_r - F_r) + (c m_a + m_r) S_q
// Output (rotated basis):    sum_g  2^VPRE ((C_a - M SW_a) + (C_r - M SW_r)) / 2^pos + sum p (c m_a + m_r)
// (s, m: FP8 scale and offset of the group; c: LSQ coefficient; DESIGN.md section 2.)
//
// Compile-time parameters (nvcc -D...): HEAD_DIM (64, 96, 128), A_BITS (2, 4), R_BITS (0, 2,
// 4), GS (32, 64; 32 at head_dim 64 and 96), GQ (query heads per KV head, GQ * D / GS <= 8),
// HAS_COEF (0, 1), KINT (the K side on integer tensor cores: decode_tc.integer_k), WARPS (per
// CTA), MINB (CTAs per SM), STAGES (16-token tiles of shared memory per warp), SUBT (tiles per
// loop iteration, i.e. per softmax step; STAGES >= 2 SUBT).
// The kernel's width D is HEAD_DIM rounded up to a power of two (64 or 128). head_dim 96 runs as
// 128: a fourth, padding group whose query is zero (K) and whose outputs are written as 0 (V);
// only the 96 elements' bytes are copied (the padding's shared memory is never written: any
// bits unpack to a finite fp16 or u8, and they only meet a zero query or padding outputs), and the
// padding columns of the K epilogue and rows of the V weights are masked by selects.
// Each thread's K slice is D / 4 elements (K_STEPS = D / 16 MMAs), its V slice D / 8 elements
// (D / 8 n-tiles); at D = 64 the same maps hold with half the steps and n-tiles.
// Writes the unnormalised split output MidO [B, HQ, S, D] fp32 (head_dim 96: columns 96-127 are
// 0) and MidML [B, HQ, S, 2] (running max in log2 units, sum), the layout
// rq_decode_merge_kernel reduces (its DP = D); where the host asks (A.fused: q_mode 1 or 2) the
// kernel reduces them itself and writes the bf16 output (merge_pair, below).

#ifdef __CUDACC_RTC__  // NVRTC (no system headers)
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t;
#define INFINITY __int_as_float(0x7f800000)
#else
#include <stdint.h>
#include <math.h>
#endif

// Programmatic dependent launch (sm_90+; no-ops when the launch did not ask for it): the
// launcher sets the attribute, so this kernel's CTAs start while the query rotation before it
// runs, and the merge kernel after it (if any) starts while this one runs. Everything written by the
// kernel just before (the rotated query) is read only after griddep_wait(); what is read
// before it (kv_indptr, kv_indices, the history rows) was written by earlier forwards.
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#if !defined(HEAD_DIM) || !defined(WARPS) || !defined(MINB) || !defined(STAGES) || !defined(SUBT) || !defined(KINT)
#error "HEAD_DIM, WARPS, MINB, STAGES, SUBT and KINT come from the launcher (rq_kernels/decode_tc.py: _variant)"
#endif
#define D (HEAD_DIM == 64 ? 64 : 128)  // the kernel's width (MMA K of the K side, MidO's row)
#define TILE 16
#define NG (D / GS)         // groups per row of width D (head_dim 96: the 4th is padding)
#define NGR (HEAD_DIM / GS)  // real groups
#define ROWS (GQ * NG)
#define SL (D / 4)           // K: elements of one token's slice t (one thread's)
#define K_STEPS (D / 16)     // K: m16n8k16 steps per tile and loop
#define NT (D / 8)           // V: n-tiles; elements of one token's slice g (one thread's)
#define NM (NT / 2)          // V: m-tiles of 16 elements (a thread's slice g: rows g, 8 + g)
#define PAIRED (ROWS <= 4)   // V: anchor and second weights share one accumulator (columns 0-3, 4-7)
#define RES_ACC (!PAIRED && R_BITS > 0)  // V: the residual has its own accumulator (cw, sw_r)
#define PAD_ROW (HEAD_DIM == 96 && vgrp >= NGR)  // V column's row (vh, vgrp) is head_dim 96's padding
// KINT (decode_tc.integer_k decides; only where the query rows fit half the MMA's 8 columns,
// ROWS <= 4): the K side on integer tensor cores: codes as u8 (one LOP3 per 4 codes; 2-bit: and
// one SHF per 16), the query as 16-bit fixed point split into two s8 halves, high in columns 0-3
// and low in columns 4-7 of one m16n8k32 (exact s32 sums, no magic); else fp16 codes against the
// fp16 query (m16n8k16, the magic folded out)
// V side: fp16 codes against fp16 weights W 2^-VPRE, the factor taken back in the epilogue.
// 2^-4: W = p c s with p <= 2^8 under the lazy rescale and c s <= 4,094 (an FP8 scale <= 448
// times an LSQ coefficient <= 9) stays below fp16's 65,504, and a group scale s >= 2^-14 2^4 =
// 1e-3 at p = 1 stays a normal fp16. With 2^-8, V values around 1e-3 (scales 4e-4) fell into
// fp16's subnormals: 3-4x bf16 SDPA's error in the emulation (test_decode_tc_numerics.py).
// fp16 beat bf16 codes and weights by 1.005-1.05x (benchmarks/results/h200_2026-12-04f_vf16_ab.json).
#define VPRE 4
#define KI_STEPS (D / 32)    // K: m16n8k32 steps per tile and loop (KINT)
#define QFIX 32512.f         // KINT: the query row's largest |element| as fixed point (hi <= 127)

static_assert(HEAD_DIM == 64 || HEAD_DIM == 96 || HEAD_DIM == 128, "HEAD_DIM");
static_assert(!KINT || ROWS <= 4, "KINT: the query rows' low halves take MMA columns 4-7");
static_assert(A_BITS == 2 || A_BITS == 4, "A_BITS");
static_assert(R_BITS == 0 || R_BITS == 2 || R_BITS == 4, "R_BITS");
static_assert(GS == 32 || GS == 64, "GS");
static_assert(HEAD_DIM % GS == 0, "GS divides HEAD_DIM");
static_assert(NG >= 2, "a thread's two K columns (2t, 2t + 1) belong to one head");
static_assert(HEAD_DIM != 96 || NG == 4, "head_dim 96: three groups of 32 and a padding one");
static_assert(ROWS <= 8, "GQ * NG <= 8");
static_assert((SUBT == 1 || SUBT == 2) && STAGES >= 2 * SUBT, "SUBT tiles per iteration, as many in flight");
// K dots as two MMA chains of half the length (even and odd steps) in the 2-CTA shape (SUBT 2),
// whose 8 warps per SM expose the chain's latency more than the 3-CTA shape's 12
#define KSPLIT (SUBT == 2)
// tokens between the V magic drains (rescale_drain): 256 cost 1-4 % more at 64 x 8k
// (benchmarks/results/h200_2026-12-03c_drain_ab.json)
#define DRAIN_TOKENS 512
#define DRAIN_ITERS (DRAIN_TOKENS / (SUBT * TILE))

// (x & mask) | magic in one LOP3: written as PTX with the magic in a register (with two
// immediates ptxas emits an AND and an OR).
__device__ __forceinline__ uint32_t lop_magic(uint32_t x, uint32_t mask, uint32_t magic) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(x), "r"(mask), "r"(magic));
  return d;
}

// Shift and position of code j (0 <= j < 16/BITS) of a 16-bit half after unpacking into fp16
// (10 mantissa bits: 4-bit codes at positions 0 and 4, 2-bit codes at 0, 2, ..., 8): one shift
// per word.
template <int BITS> __device__ __forceinline__ constexpr int code_shift(int j) {
  return BITS == 4 ? (j < 2 ? 0 : 8) : (j < 5 ? 0 : 10);
}
template <int BITS> __device__ __forceinline__ constexpr int code_pos(int j) {
  return BITS * j - code_shift<BITS>(j);
}
// The magic: fp16x2 (1024, 1024); a code reads as MAGIC + code * 2^pos.
#define MAGIC_BITS 0x64006400u
#define MAGIC 1024.f

// Unpack one 32-bit word X: R[j] = (MAGIC + lo-half code j * 2^pos(j), MAGIC + hi-half code j ...).
// The magic is a register operand (with two immediates ptxas emits an AND and an OR).
template <int BITS> __device__ __forceinline__ void unpack_word(uint32_t x, uint32_t* r,
                                                                uint32_t magic) {
  constexpr int H = 16 / BITS;
#pragma unroll
  for (int j = 0; j < H; ++j) {
    const uint32_t m = ((1u << BITS) - 1u) << code_pos<BITS>(j);
    r[j] = lop_magic(x >> code_shift<BITS>(j), m | (m << 16), magic);
  }
}

__device__ __forceinline__ void mma_f16(float* c, uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_u8s8(int* c, uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Unnormalised fast Walsh-Hadamard transform (Sylvester order) of a row of 32 E elements held
// E per lane (element E lane + e): log2(E) butterfly stages in registers, then 5 by shuffles.
template <int E> __device__ __forceinline__ void fwht(float (&x)[E], int lane) {
#pragma unroll
  for (int m = 1; m < E; m <<= 1) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      if (e & m) continue;
      const float u0 = x[e], u1 = x[e | m];
      x[e] = u0 + u1;
      x[e | m] = u0 - u1;
    }
  }
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const float p = __shfl_xor_sync(0xffffffffu, x[e], m);
      x[e] = (lane & m) ? p - x[e] : x[e] + p;
    }
  }
}

__device__ __forceinline__ uint16_t bf16_bits(float x) {
  uint16_t d;
  asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(d) : "f"(x));
  return d;
}

// Loads that bypass L1 (the fused merge reads what other SMs wrote).
__device__ __forceinline__ float2 ldcg2(const float* p) {
  float2 v;
  asm volatile("ld.global.cg.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ float2 ldca2(const float* p) {
  float2 v;
  asm volatile("ld.global.ca.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ float4 ldca4(const float* p) {
  float4 v;
  asm volatile("ld.global.ca.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ float4 ldcg4(const float* p) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
__device__ __forceinline__ float2 f16_pair(uint32_t h) {  // fp16x2 -> (low, high) fp32
  float lo, hi;
  asm("{\n.reg .b16 l, u;\nmov.b32 {l, u}, %2;\ncvt.f32.f16 %0, l;\ncvt.f32.f16 %1, u;\n}\n"
      : "=f"(lo), "=f"(hi) : "r"(h));
  return make_float2(lo, hi);
}
__device__ __forceinline__ float bf16_lo(uint32_t x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t x) { return __uint_as_float(x & 0xFFFF0000u); }
// V weights as the V MMA takes them (fp16 of W 2^-VPRE, the factor already in p: see the tile
// loop's m_p) and back (in those units)
__device__ __forceinline__ uint32_t pack_w(float lo, float hi) { return pack_f16(lo, hi); }
__device__ __forceinline__ float2 unpack_w(uint32_t x) { return f16_pair(x); }

// Two FP8 e4m3 bytes (scale at the low byte, offset at the high byte) -> fp32 pair.
__device__ __forceinline__ float2 fp8x2(uint16_t v) {
  uint32_t h;
  asm("{\n.reg .b16 t;\nmov.b16 t, %1;\ncvt.rn.f16x2.e4m3x2 %0, t;\n}\n" : "=r"(h) : "h"(v));
  return f16_pair(h);
}

template <int BYTES> struct Words;
template <> struct Words<2> { uint32_t w[1]; };  // the low half
template <> struct Words<4> { uint32_t w[1]; };
template <> struct Words<8> { uint32_t w[2]; };
template <> struct Words<16> { uint32_t w[4]; };

template <int BYTES> __device__ __forceinline__ Words<BYTES> load_words(const uint8_t* p) {
  Words<BYTES> r;
  if constexpr (BYTES == 16) {
    uint4 v = *reinterpret_cast<const uint4*>(p);
    r.w[0] = v.x; r.w[1] = v.y; r.w[2] = v.z; r.w[3] = v.w;
  } else if constexpr (BYTES == 8) {
    uint2 v = *reinterpret_cast<const uint2*>(p);
    r.w[0] = v.x; r.w[1] = v.y;
  } else if constexpr (BYTES == 4) {
    r.w[0] = *reinterpret_cast<const uint32_t*>(p);
  } else {
    r.w[0] = *reinterpret_cast<const uint16_t*>(p);
  }
  return r;
}

// K side: the SL-element slice t of one token -> SL / 2 bf16x2 A-operand registers; register
// r = w * H + j holds slice elements (w * P + j, w * P + H + j) (P codes per word, H per half).
template <int BITS> __device__ __forceinline__ void unpack_k(const Words<SL * BITS / 8>& x,
                                                             uint32_t* u, uint32_t magic) {
  constexpr int H = 16 / BITS;
#pragma unroll
  for (int w = 0; w < SL * BITS / 32; ++w) unpack_word<BITS>(x.w[w], u + w * H, magic);
}

// V side: the NT-element slice g of tokens a and b -> NT registers, register l holding
// (token a, token b) of slice element l (16-bit half l / H of the slice, code l % H).
template <int BITS> __device__ __forceinline__ void unpack_v(const Words<NT * BITS / 8>& a,
                                                             const Words<NT * BITS / 8>& b,
                                                             uint32_t* u, uint32_t magic) {
  constexpr int H = 16 / BITS;
  constexpr int NH = NT * BITS / 16;  // 16-bit halves per slice (1 at D = 64, 2 bits)
#pragma unroll
  for (int w = 0; w < (NH + 1) / 2; ++w) {
    unpack_word<BITS>(__byte_perm(a.w[w], b.w[w], 0x5410), u + w * 2 * H, magic);
    if (2 * w + 1 < NH)
      unpack_word<BITS>(__byte_perm(a.w[w], b.w[w], 0x7632), u + w * 2 * H + H, magic);
  }
}

// Slice element of K register half: r = w*H + j, half 0/1.
template <int BITS> __host__ __device__ constexpr int k_elem(int r, int half) {
  return (r / (16 / BITS)) * (32 / BITS) + half * (16 / BITS) + r % (16 / BITS);
}
// KINT: a token's slice X -> SL / 4 u8x4 A-operand registers, masks only where one shift per
// word does not suffice, so half the registers hold codes times 2^BITS: register r = 4 w + k
// (4-bit: words 2 w, 2 w + 1; 2-bit: word w) holds, k < 2, codes (times 1) and, k >= 2, codes
// times 2^BITS; byte b of register r is slice element k_elem_int(r, b). The K dots' even steps
// (registers 4 w, 4 w + 1) sum codes, the odd steps codes times 2^BITS (two MMA chains).
template <int BITS> __device__ __forceinline__ void unpack_k_int(const Words<SL * BITS / 8>& x,
                                                                 uint32_t* u) {
  constexpr uint32_t M = ((1u << BITS) - 1u) * 0x01010101u;
#pragma unroll
  for (int w = 0; w < SL / 16; ++w) {
    if constexpr (BITS == 4) {
      u[4 * w] = x.w[2 * w] & M;
      u[4 * w + 1] = x.w[2 * w + 1] & M;
      u[4 * w + 2] = x.w[2 * w] & (M << 4);
      u[4 * w + 3] = x.w[2 * w + 1] & (M << 4);
    } else {
      const uint32_t y = x.w[w] >> 4;
      u[4 * w] = x.w[w] & M;
      u[4 * w + 1] = y & M;
      u[4 * w + 2] = x.w[w] & (M << 2);
      u[4 * w + 3] = y & (M << 2);
    }
  }
}
// Slice element of KINT register r, byte b (unpack_k_int).
template <int BITS> __host__ __device__ constexpr int k_elem_int(int r, int b) {
  return BITS == 4 ? (2 * (r / 4) + (r & 1)) * 8 + 2 * b + (r % 4) / 2
                   : (r / 4) * 16 + 4 * b + ((r & 1) ? 2 : 0) + (r % 4) / 2;
}
template <int BITS> __device__ __forceinline__ float pos_scale(int j) {  // 2^-pos
  return 1.0f / float(1 << code_pos<BITS>(j));
}

struct Args {
  // the query [B, HQ, HEAD_DIM] at element strides (q_b, q_h), by q_mode: 0 fp32 in the rotated
  // basis (the query rotation kernel's output); 1 bf16, no rotation; 2 bf16 in the original
  // basis, rotated here by R = q_alpha diag(signs[hk]) H (Sylvester Hadamard; HEAD_DIM = D)
  const void* q;
  int64_t q_b, q_h;
  const float* signs;  // q_mode 2: [num_kv_heads, D] +-1
  const int32_t* kv_indptr;
  const int64_t* kv_indices;
  const uint8_t* ac; int64_t ac_r, ac_kv, ac_h;
  const uint8_t* aso; int64_t aso_r, aso_kv, aso_h;
  const uint8_t* rc; int64_t rc_r, rc_kv, rc_h;
  const uint8_t* rso; int64_t rso_r, rso_kv, rso_h;
  const uint16_t* cf; int64_t cf_r, cf_kv, cf_h;  // bf16 bits, element strides
  float* mid_o;
  float* mid_ml;
  float qk_scale;
  float q_alpha;
  // equal splits: num_splits per request, MidO [B, HQ, S, D]; balanced: num_splits = G split
  // rows shared by the batch, MidO [HQ, G, D] (request b's rows from its first)
  int num_splits;
  int num_qo_heads;
  int q_mode;
  int batch;
  int fill_rows;  // balanced splits where > 0: the plan's B x S rows (balanced_split)
  // balanced without the fused merge: [B, 2] (first row, split count) of each request, for the
  // merge kernel
  int* split_rows;
  // fused merge (q_mode 1 or 2): the last warps of each (request, KV head) to finish reduce the
  // splits, add the in-flight token (k_cur, v_cur [B, Hkv, HEAD_DIM] bf16 at element strides)
  // and write out [B, HQ, HEAD_DIM] bf16; counters: the finished splits of each chunk and the
  // finished chunks of each pair (merge_pair; zero between launches: each last arrival resets its
  // own)
  int fused;
  int merge_chunk;  // splits per chunk (fused)
  const uint16_t* k_cur; int64_t k_cur_b, k_cur_h;
  const uint16_t* v_cur; int64_t v_cur_b, v_cur_h;
  uint16_t* out; int64_t out_b, out_h;
  int* counters;
};

// ---- shared-memory pipeline: each warp streams its split through STAGES tile stages, SUBT
// consumed per iteration while STAGES - SUBT are in flight.
// A stage holds one tile's raw bytes, gathered by cp.async from the pool rows of its 16 tokens:
//   K anchor codes [16][BA] | V anchor codes [16][BA] | K residual [16][BR] | V residual [16][BR]
//   | (scale, offset) rows [4 kinds][16][8] (K anchor, V anchor, K residual, V residual)
//   | LSQ coefficients [2 kinds (K, V)][16] as the aligned 32-bit word holding each bf16 value.
// head_dim 96: the codes' pitch stays D wide (only the 96 elements' bytes are copied) and the
// 6 (scale, offset) bytes of a row are copied as the two aligned 4-byte words holding them (a
// row starts 0 or 2 bytes into them: so_offset).
#define BA (D * A_BITS / 8)  // stage pitch of the anchor codes of one (token, head)
#define BR (D * R_BITS / 8)
#define SB (NG * 2)          // (scale, offset) bytes per (token, head) (head_dim 96: 8 copied)
#define OFF_VA (TILE * BA)
#define OFF_KR (2 * TILE * BA)
#define OFF_VR (2 * TILE * BA + TILE * BR)
#define OFF_SO (2 * TILE * (BA + BR))
// COOP (from the launcher, `decode_tc.coop_copies`): the CTA's WARPS warps are WARPS adjacent
// KV heads of one split, whose (scale, offset) rows and coefficients lie side by side in each
// token-major pool row; they are copied once per CTA into small data of their own
// ([STAGES][SMALL_BYTES] after the warps' stages: rows [4 kinds][16][WARPS * SB], coefficients
// [2 kinds][16][WARPS] bf16), warp w copying kind w, and the warps meet at a CTA barrier per
// iteration. Without COOP each warp copies its own head's into its stage (rows padded to 8
// bytes, each coefficient as the aligned word holding it) and the CTA's warps share those
// sectors through L1 (38 % hit rate at 16 x 16k, 12-03f), the small copies being most of the
// L2 requests. Same lease against per-warp copies, two reps
// (`benchmarks/results/h200_2026-12-04_coop_ab.json`, Ouro): consecutive rows 1.00-1.05x
// (64 x 8k 1.005-1.054x, 55 x 4k 1.03-1.04x, batch 1-4 1.01-1.03x), scattered rows 1.11-1.13x
// (16 x 16k); decode step 32 GiB 3.15x against 3.13x, whole card 2.09x against 2.04x.
#ifndef COOP
#define COOP 0
#endif
// STREAM (from the launcher, `decode_tc.stream_codes`; COOP only): the codes are copied with an
// L2 evict_first policy (`l2_policy`), where each CTA's codes of a token row are whole 128-byte
// lines that no other CTA reads, so a line is dead once the CTA has copied it. See cp_async_n.
#ifndef STREAM
#define STREAM 0
#endif
static_assert(!STREAM || COOP, "STREAM: the CTA's warps are adjacent KV heads (COOP)");
#if COOP
#define SO_PITCH (WARPS * SB)
#define CF_PITCH (WARPS * 2)
#define STAGE_BYTES OFF_SO
#else
#define SO_PITCH 8
#define CF_PITCH 4
#define STAGE_BYTES (OFF_SO + SMALL_BYTES)
#endif
#define SMALL_BYTES (4 * TILE * SO_PITCH + 2 * TILE * CF_PITCH)
#define OFF_CF (4 * TILE * SO_PITCH)  // in a stage's small data
// WARPS (per CTA), STAGES (tile stages per warp) and MINB (CTAs per SM, __launch_bounds__)
// come from the launcher, which passes WARPS * STAGES * STAGE_BYTES (+ STAGES * SMALL_BYTES,
// COOP) of dynamic shared memory.
static_assert(SB >= 4, "cp.async copies at least 4 bytes");
static_assert(!COOP || (WARPS == 4 && HEAD_DIM != 96 && WARPS * SB % 16 == 0),
              "COOP: 4 warps, one per (scale, offset) kind, copying whole 16-byte chunks");
static_assert(GQ * D * 2 <= STAGE_BYTES, "the query rows (bf16) fit one stage");

// The pool bytes of one (token, head)'s codes and the cp.async chunk they are copied in (the
// launcher checks the pool's pointers and strides for this alignment: `decode_tc.code_chunk`).
template <int BITS> __host__ __device__ constexpr int code_bytes() { return HEAD_DIM * BITS / 8; }
template <int BITS> __host__ __device__ constexpr int code_chunk() { return code_bytes<BITS>() % 16 == 0 ? 16 : 8; }

// Every copy asks the L2 to fetch the whole aligned 128-byte block (.L2::128B): a warp's piece of
// a pool row (one KV head's) is followed by the neighbouring heads', which the CTA's other warps
// and the next CTA read in the same call. Same lease against no hint
// (`benchmarks/results/h200_2026-12-03g_prefetch_ab.json`): Ouro batch 1-4 1.02-1.03x, Huginn
// 4 x 8k 1.01x, batch 13-64 1.00x; .L2::256B the same.
// HINT: the copy carries the L2 cache policy `policy`. The (scale, offset) rows and coefficients
// carry evict_last (`l2_policy`; issue_tile). A token's small data of all KV heads shares a few 128-byte
// lines, read by every CTA of the split (6 at Huginn's 24 heads without COOP): normal eviction
// lost some of them between the first CTA's read and the last one's once the loop waited on
// memory rather than on its instructions, Huginn 64 x 8k moving 2.52 GB from DRAM for 2.16 GB
// of data; kept, 2.26 GB and 0.96x the time (H200, Nsight; main 2.22 GB). Codes kept normal:
// evict_first on them cost 0.74-0.88x there (its shared boundary lines, 3.94 GB)
// (`benchmarks/results/h200_2026-12-05e_cut_arms_ab.json`). Where no CTA shares a code line
// (STREAM: Ouro), the codes carry evict_first: chained, on an H100, Ouro 1 x 8k to
// 64 x 8k 1.015-1.07x against normal eviction (4 x 32k 1.00x), the step at batch 13 1.01x, batch
// 2 1.00x (`benchmarks/results/h100_2026-12-05f_stream_ab.json`); where CTAs share code lines
// (Huginn) 0.67x at 64 x 8k (`…/h100_2026-12-05f_first_ab.json`).
template <int BYTES, bool HINT = false>
__device__ __forceinline__ void cp_async_n(uint32_t dst, const void* src, uint64_t policy = 0) {
  if constexpr (HINT && BYTES == 16)
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(src), "l"(policy));
  else if constexpr (HINT)
    asm volatile("cp.async.ca.shared.global.L2::cache_hint.L2::128B [%0], [%1], %2, %3;\n" ::"r"(dst),
                 "l"(src), "n"(BYTES), "l"(policy));
  else if constexpr (BYTES == 16)
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
  else
    asm volatile("cp.async.ca.shared.global.L2::128B [%0], [%1], %2;\n" ::"r"(dst), "l"(src),
                 "n"(BYTES));
}
// The L2 policies of HINT copies, for all their lines: evict_last (`l2_policy<false>`, the small
// copies) and evict_first (`l2_policy<true>`, the codes under STREAM). Off the device, 1 and 2:
// tokens the host copy test reads.
template <bool FIRST> __host__ __device__ __forceinline__ uint64_t l2_policy() {
#ifdef __CUDA_ARCH__
  uint64_t policy;
  if constexpr (FIRST)
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  else
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
#else
  return FIRST ? 2 : 1;
#endif
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Address of pool row slot of a tensor whose base (with this lane's head and chunk applied) is
// base: one 32 x 32 + 64-bit multiply-add (IMAD.WIDE.U32; the launcher checks that pool rows and
// row strides in bytes are below 2^32).
__host__ __device__ __forceinline__ const uint8_t* row_ptr(const uint8_t* base, uint32_t slot,
                                                           uint32_t stride) {
#ifdef __CUDA_ARCH__
  uint64_t r;
  asm("mad.wide.u32 %0, %1, %2, %3;\n" : "=l"(r) : "r"(slot), "r"(stride), "l"(base));
  return reinterpret_cast<const uint8_t*>(r);
#else
  return base + (uint64_t)slot * stride;
#endif
}
template <class T> __host__ __device__ __forceinline__ const uint8_t* bytes_of(const T* p) {
  return reinterpret_cast<const uint8_t*>(p);
}
// The aligned 4-byte word holding p (a row's whole (scale, offset) words at head_dim 96, a bf16
// coefficient's word): row strides are multiples of 4 (the launcher checks), so aligning a
// lane's base once aligns every row's address.
__host__ __device__ __forceinline__ const uint8_t* word_of(const uint8_t* p) {
  return reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(3));
}

// The codes of one kind (anchor or residual) of a tile's 16 tokens: CHUNKS cp.async chunks of CB
// bytes per token. Up to 2 chunks, lane (token, chunk) = (lane & 15, lane >> 4): one instruction
// per K or V. More (48 or 64 bytes per token), lanes chunk-fastest in two rounds of 8 tokens of
// 4 lanes (token 8 r + lane / 4, chunk lane % 4), so one instruction reads whole token rows
// instead of the same 32 bytes of 16 rows; their pool rows come by shuffles. Same lease against
// lanes token-fastest (`benchmarks/results/h200_2026-12-03f_coalesce_ab.json`, v2): Huginn
// 1.06-1.08x, Ouro batch 1-4 1.04-1.06x, batch 13-64 1.01-1.02x per call.
template <int BITS> struct CodeMap {
  static constexpr int CB = code_chunk<BITS>(), CHUNKS = code_bytes<BITS>() / CB;
  static_assert(CHUNKS <= 4, "at most 4 chunks per token");
  static constexpr bool ROUNDS = CHUNKS > 2;  // chunk-fastest
  __host__ __device__ static int token(int lane) { return ROUNDS ? lane / 4 : lane & 15; }
  __host__ __device__ static int chunk(int lane) { return ROUNDS ? lane % 4 : lane >> 4; }
  __host__ __device__ static bool on(int lane) { return chunk(lane) < CHUNKS; }
};

// One lane's copies, set once per warp before the loop (copy_setup): each pool tensor's address
// for row 0 with the lane's KV head, kind and chunk applied, and where in the stage (st) or its
// small data (sm) the lane's bytes go; per tile only the row's multiply-add remains (issue_tile).
// The row strides stay in the kernel's parameters (IMAD operands).
struct Copies {
  const uint8_t* ak; const uint8_t* av;  // anchor codes, K and V
  uint32_t a_dst;                        // + st: K (V at + OFF_VA), round 0
#if R_BITS > 0
  const uint8_t* rk; const uint8_t* rv;  // residual codes
  uint32_t r_dst;                        // + st + OFF_KR: K (V at + TILE * BR), round 0
#endif
  // (scale, offset) rows of this lane's kind pair: without COOP, half 0 the anchor's and half 1
  // the residual's (K, V at + TILE * 8); with COOP warp w's kind w, a 16-byte chunk per lane
  const uint8_t* sk; const uint8_t* sv;
  uint32_t so_r;                         // their row stride (bytes)
  uint32_t so_dst;                       // + sm
  bool so_on;
#if HAS_COEF
  const uint8_t* cf;                     // the word holding this lane's coefficient
  uint32_t cf_r;                         // row stride (bytes)
  uint32_t cf_dst;                       // + sm
  bool cf_on;
#endif
  uint64_t keep;                         // the small copies' L2 policy (evict_last)
  uint64_t stream;                       // the codes' (STREAM: evict_first)
};

// warp: this warp's index in the CTA (COOP: hk - warp is the CTA's first KV head).
__host__ __device__ __forceinline__ Copies copy_setup(const Args& A, int hk, int warp, int lane) {
  Copies c;
  c.keep = l2_policy<false>();
  c.stream = STREAM ? l2_policy<true>() : 0;
  using MA = CodeMap<A_BITS>;
  const uint8_t* ac = A.ac + hk * A.ac_h + MA::chunk(lane) * MA::CB;
  c.ak = ac;
  c.av = ac + A.ac_kv;
  c.a_dst = MA::token(lane) * BA + MA::chunk(lane) * MA::CB;
#if R_BITS > 0
  using MR = CodeMap<R_BITS>;
  const uint8_t* rc = A.rc + hk * A.rc_h + MR::chunk(lane) * MR::CB;
  c.rk = rc;
  c.rv = rc + A.rc_kv;
  c.r_dst = MR::token(lane) * BR + MR::chunk(lane) * MR::CB;
#endif
  const int tok = lane & 15, half = lane >> 4;
#if COOP
  // warp w copies kind w (K anchor, V anchor, K residual, V residual) of the CTA's heads
  const int hk0 = hk - warp;
  const uint8_t* so = warp < 2 ? A.aso + hk0 * A.aso_h + (warp & 1) * A.aso_kv
                               : A.rso + hk0 * A.rso_h + (warp & 1) * A.rso_kv;
  c.sk = c.sv = so + half * 16;
  c.so_r = (uint32_t)(warp < 2 ? A.aso_r : A.rso_r);
  c.so_dst = (warp * TILE + tok) * SO_PITCH + half * 16;
  c.so_on = half < WARPS * SB / 16 && (R_BITS > 0 || warp < 2);
#if HAS_COEF
  // the last warp: the CTA's WARPS coefficients of kind half
  c.cf = bytes_of(A.cf + hk0 * A.cf_h + half * A.cf_kv);
  c.cf_r = (uint32_t)(A.cf_r * 2);
  c.cf_dst = OFF_CF + (half * TILE + tok) * CF_PITCH;
  c.cf_on = warp == WARPS - 1;
#endif
#else
  (void)warp;
  const uint8_t* so = half == 0 ? A.aso + hk * A.aso_h : A.rso + hk * A.rso_h;
  const int64_t so_kv = half == 0 ? A.aso_kv : A.rso_kv;
#if HEAD_DIM == 96
  // a 6-byte row as the two aligned words holding it (no fault past its tensor)
  c.sk = word_of(so);
  c.sv = word_of(so + so_kv);
#else
  c.sk = so;
  c.sv = so + so_kv;
#endif
  c.so_r = (uint32_t)(half == 0 ? A.aso_r : A.rso_r);
  c.so_dst = (2 * half * TILE + tok) * 8;
  c.so_on = half == 0 || R_BITS > 0;
#if HAS_COEF
  // the aligned word holding this token's K (half 0) or V (half 1) coefficient
  c.cf = word_of(bytes_of(A.cf + hk * A.cf_h + half * A.cf_kv));
  c.cf_r = (uint32_t)(A.cf_r * 2);
  c.cf_dst = OFF_CF + (half * TILE + tok) * 4;
  c.cf_on = true;
#endif
#endif
  return c;
}

// One kind's codes (CodeMap) of row slot (round 0) and s1 (round 1, chunk-fastest), with the L2
// policy the codes carry (STREAM).
template <int BITS, int PITCH> __device__ __forceinline__ void issue_codes(
    const uint8_t* k, const uint8_t* v, uint32_t stride, uint32_t dk, uint32_t dv, int lane,
    uint32_t s0, uint32_t s1, uint64_t policy) {
  using M = CodeMap<BITS>;
  if (M::CHUNKS == 4 || M::CHUNKS == 2 || M::on(lane)) {
    cp_async_n<M::CB, STREAM>(dk, row_ptr(k, s0, stride), policy);
    cp_async_n<M::CB, STREAM>(dv, row_ptr(v, s0, stride), policy);
    if constexpr (M::ROUNDS) {
      cp_async_n<M::CB, STREAM>(dk + 8 * PITCH, row_ptr(k, s1, stride), policy);
      cp_async_n<M::CB, STREAM>(dv + 8 * PITCH, row_ptr(v, s1, stride), policy);
    }
  }
}

// Gather the tile whose token lane & 15 lies in pool row slot (0 past the split's end) into the
// stage at shared address st, its (scale, offset) rows and coefficients into the small data at sm
// (without COOP: st + OFF_SO), if go; every lane calls it (the slots' shuffles run before go is
// tested, so they need no divergence handling).
__device__ __forceinline__ void issue_tile(const Args& A, const Copies& c, uint32_t st,
                                           uint32_t sm, int lane, uint32_t slot, bool go) {
  uint32_t s0 = slot, s1 = slot;
  if constexpr (CodeMap<A_BITS>::ROUNDS || CodeMap<R_BITS == 0 ? A_BITS : R_BITS>::ROUNDS) {
    s0 = __shfl_sync(0xffffffffu, slot, lane / 4);
    s1 = __shfl_sync(0xffffffffu, slot, 8 + lane / 4);
  }
  if (!go) return;
  {
    using MA = CodeMap<A_BITS>;
    issue_codes<A_BITS, BA>(c.ak, c.av, (uint32_t)A.ac_r, st + c.a_dst, st + OFF_VA + c.a_dst,
                            lane, MA::ROUNDS ? s0 : slot, s1, c.stream);
  }
#if R_BITS > 0
  {
    using MR = CodeMap<R_BITS>;
    issue_codes<R_BITS, BR>(c.rk, c.rv, (uint32_t)A.rc_r, st + OFF_KR + c.r_dst,
                            st + OFF_VR + c.r_dst, lane, MR::ROUNDS ? s0 : slot, s1, c.stream);
  }
#endif
  if (c.so_on) {
#if COOP
    cp_async_n<16, true>(sm + c.so_dst, row_ptr(c.sk, slot, c.so_r), c.keep);
#elif HEAD_DIM == 96
    const uint8_t* k = row_ptr(c.sk, slot, c.so_r);
    const uint8_t* v = row_ptr(c.sv, slot, c.so_r);
    cp_async_n<4, true>(sm + c.so_dst, k, c.keep);
    cp_async_n<4, true>(sm + c.so_dst + 4, k + 4, c.keep);
    cp_async_n<4, true>(sm + c.so_dst + TILE * 8, v, c.keep);
    cp_async_n<4, true>(sm + c.so_dst + TILE * 8 + 4, v + 4, c.keep);
#else
    cp_async_n<SB, true>(sm + c.so_dst, row_ptr(c.sk, slot, c.so_r), c.keep);
    cp_async_n<SB, true>(sm + c.so_dst + TILE * 8, row_ptr(c.sv, slot, c.so_r), c.keep);
#endif
  }
#if HAS_COEF
#if COOP
  if (c.cf_on) cp_async_n<2 * WARPS, true>(sm + c.cf_dst, row_ptr(c.cf, slot, c.cf_r), c.keep);
#else
  cp_async_n<4, true>(sm + c.cf_dst, row_ptr(c.cf, slot, c.cf_r), c.keep);
#endif
#endif
}

// Where a stage's (scale, offset) row of kind (0-3) starts in its 8 bytes: 0, except at
// head_dim 96 (6-byte rows), where it is the pool row's address mod 4: the same for every token
// of this warp, as the launcher checks that the row stride is a multiple of 4.
__device__ __forceinline__ int so_offset(const Args& A, int hk, int kind) {
#if HEAD_DIM == 96
  const uint8_t* so = kind < 2 ? A.aso + hk * A.aso_h + (kind & 1) * A.aso_kv
                               : A.rso + hk * A.rso_h + (kind & 1) * A.rso_kv;
  return (int)(reinterpret_cast<uintptr_t>(so) & 3);
#else
  return 0;
#endif
}

// Pool row of token n + (lane & 15) of the request whose rows start at kv_indices[base] (0 at and
// past hi): the low word of the int64 index (rows are below 2^32: the launcher checks).
__device__ __forceinline__ uint32_t tile_slot(const Args& A, int64_t base, int n, int hi,
                                              int lane) {
  const int tok = n + (lane & 15);
  return tok < hi ? reinterpret_cast<const uint32_t*>(A.kv_indices + base + tok)[0] : 0u;
}

// LSQ coefficient of token tok, kind 0 (K) or 1 (V), as fp32: the bf16 half of its word selected
// by shift (16 when the value sits at an address = 2 mod 4; the launcher checks that the row
// stride keeps this the same for every row).
// sp: the stage's small data plus, with COOP, this warp's head: 2 x its index (the kernel's cfs).
__device__ __forceinline__ float coef_of(const uint8_t* sp, int kind, int tok, int shift) {
#if COOP
  (void)shift;
  return __uint_as_float((uint32_t)*reinterpret_cast<const uint16_t*>(
      sp + OFF_CF + (kind * TILE + tok) * CF_PITCH) << 16);
#else
  const uint32_t w = *reinterpret_cast<const uint32_t*>(sp + OFF_CF + (kind * TILE + tok) * 4);
  return __uint_as_float((w >> shift) << 16);
#endif
}

// The (scale, offset) pair of group grp; off: `so_offset` of the kind; sp: the stage's small
// data plus, with COOP, this warp's head: SB x its index (the kernel's sos).
__device__ __forceinline__ uint16_t so_pair(const uint8_t* sp, int kind, int tok, int grp,
                                            int off) {
  return *reinterpret_cast<const uint16_t*>(sp + (kind * TILE + tok) * SO_PITCH + off + grp * 2);
}

// The (scale, offset) pairs of groups cg and cg + 1 (cg even) as one 32-bit word (head_dim 96:
// group 3 is padding, its bits are whatever follows the row).
__device__ __forceinline__ uint32_t so_word(const uint8_t* sp, int kind, int tok, int cg,
                                            int off) {
#if HEAD_DIM == 96
  return so_pair(sp, kind, tok, cg, off) | (uint32_t)so_pair(sp, kind, tok, cg + 1, off) << 16;
#else
  return *reinterpret_cast<const uint32_t*>(sp + (kind * TILE + tok) * SO_PITCH + cg * 2);
#endif
}

template <int BYTES> __device__ __forceinline__ Words<BYTES> lds_words(const uint8_t* p) {
  return load_words<BYTES>(p);  // generic pointer into shared memory: LDS
}

// K dots of one loop (anchor or residual) for the tile in shared memory at k (codes of 16 tokens,
// pitch bytes apart): x = C[tok g | 8 + g][cols 2t, 2t + 1] of A = codes (tokens on M, fp16), B =
// the masked query fragments qf (fp16); magic: MAGIC_BITS.
template <int BITS> __device__ __forceinline__ void k_dots(const uint8_t* k, int pitch, int g, int t,
                                                         const uint32_t (&qf)[K_STEPS][2],
                                                         uint32_t magic, float (&x)[4]) {
  constexpr int KB = SL * BITS / 8;  // bytes of one token's slice
  uint32_t u0[SL / 2], u1[SL / 2];
  unpack_k<BITS>(lds_words<KB>(k + g * pitch + t * KB), u0, magic);
  unpack_k<BITS>(lds_words<KB>(k + (8 + g) * pitch + t * KB), u1, magic);
  x[0] = x[1] = x[2] = x[3] = 0.f;
#if KSPLIT
  float y[4] = {0.f, 0.f, 0.f, 0.f};  // odd steps: two MMA chains of half the length
#pragma unroll
  for (int s = 0; s < K_STEPS; s += 2) {
    mma_f16(x, u0[2 * s], u1[2 * s], u0[2 * s + 1], u1[2 * s + 1], qf[s][0], qf[s][1]);
    mma_f16(y, u0[2 * s + 2], u1[2 * s + 2], u0[2 * s + 3], u1[2 * s + 3], qf[s + 1][0], qf[s + 1][1]);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) x[i] += y[i];
#else
#pragma unroll
  for (int s = 0; s < K_STEPS; ++s)
    mma_f16(x, u0[2 * s], u1[2 * s], u0[2 * s + 1], u1[2 * s + 1], qf[s][0], qf[s][1]);
#endif
}

// KINT: the K dots as exact s32 sums times 2^BITS, x = C[tok g | 8 + g][cols 2t, 2t + 1] of
// A = u8 codes, B = the fixed-point query fragments qf (columns 0-3 high halves, 4-7 low
// halves): the even steps' chain times 2^BITS plus the odd steps' (unpack_k_int).
template <int BITS> __device__ __forceinline__ void k_dots_int(const uint8_t* k, int pitch, int g,
                                                             int t,
                                                             const uint32_t (&qf)[KI_STEPS][2],
                                                             int (&x)[4]) {
  constexpr int KB = SL * BITS / 8;
  uint32_t u0[SL / 4], u1[SL / 4];
  unpack_k_int<BITS>(lds_words<KB>(k + g * pitch + t * KB), u0);
  unpack_k_int<BITS>(lds_words<KB>(k + (8 + g) * pitch + t * KB), u1);
  int y[4] = {0, 0, 0, 0};
  x[0] = x[1] = x[2] = x[3] = 0;
#pragma unroll
  for (int s = 0; s < KI_STEPS; s += 2) {
    mma_u8s8(x, u0[2 * s], u1[2 * s], u0[2 * s + 1], u1[2 * s + 1], qf[s][0], qf[s][1]);
    mma_u8s8(y, u0[2 * s + 2], u1[2 * s + 2], u0[2 * s + 3], u1[2 * s + 3], qf[s + 1][0], qf[s + 1][1]);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) x[i] = x[i] * (1 << BITS) + y[i];
}

// KINT: lanes t < 2 (the high halves' columns) and t + 2 (the low halves' of the same columns)
// both hold k_dots_int's sums x[2 j + c] of tokens g (j = 0) and 8 + g (j = 1), column 2 (t & 1)
// + c. Each gives the partner the token it does not finish (one shuffle per column) and returns
// its own token's whole sums 256 hi + lo: lane t token g, lane t + 2 token 8 + g (|sum| < 2^29:
// at most 64 elements x 15 x 128 x 2^4 x 256), so each (scale, offset) pair of the logit
// epilogue is converted once, not on both lanes.
__device__ __forceinline__ void k_whole(const int (&x)[4], bool low, int (&w)[2]) {
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int got = __shfl_xor_sync(0xffffffffu, low ? x[c] : x[2 + c], 2);
    w[c] = low ? 256 * got + x[2 + c] : 256 * x[c] + got;
  }
}

// V codes of the tile at v (pitch bytes per token): this thread's slice g of tokens 2t, 2t + 1
// (u01) and 2t + 8, 2t + 9 (u89) as (token, token) fp16 pairs, one register per slice element.
template <int BITS> __device__ __forceinline__ void v_codes(const uint8_t* v, int pitch, int g,
                                                            int t, uint32_t* u01, uint32_t* u89,
                                                            uint32_t magic) {
  constexpr int VB = NT * BITS / 8;  // bytes of one token's slice
  Words<VB> w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = lds_words<VB>(v + (2 * t + (i & 1) + 8 * (i >> 1)) * pitch + g * VB);
  unpack_v<BITS>(w[0], w[1], u01, magic);
  unpack_v<BITS>(w[2], w[3], u89, magic);
}

// c[m] += codes x B for the NM m-tiles: rows g, 8 + g of m-tile m are slice elements 2m, 2m + 1
// (A fragments from v_codes), B = this thread's weight column g at tokens (2t, 2t+1), (2t+8, 2t+9).
__device__ __forceinline__ void v_mmas(float (&c)[NM][4], const uint32_t* u01,
                                       const uint32_t* u89, uint32_t b0, uint32_t b1) {
#pragma unroll
  for (int m = 0; m < NM; ++m)
    mma_f16(c[m], u01[2 * m], u01[2 * m + 1], u89[2 * m], u89[2 * m + 1], b0, b1);
}

// The softmax rescale of V accumulators c by the factors f0, f1 of columns 2t, 2t + 1, draining
// their magic share M sum W first (sw: this thread's part of column g's weight sum since the
// last drain; zeroed): c = (c - M SW) f, one FFMA per element. Left in, the magic share grows
// with the split: the tensor cores' fp32 accumulation rounds each m16n8k16's sum with a bias
// (truncation; Fasi et al. 2021, "Numerical behavior of NVIDIA tensor cores") relative to
// the running sum, which is mostly magic (M against a code's c 2^pos, 0-15 at pos 0; measured with bf16's 128). Over a
// 16k-token split, or 64 x 8k in one split each, that bias was 2-10x bf16 SDPA's error
// (benchmarks/results/h200_2026-12-03c_drain_ab.json); drained every DRAIN_ITERS iterations it
// is within 1.2x of it.
__device__ __forceinline__ void rescale_drain(float (&c)[NM][4], float& sw, int t, float f0,
                                              float f1) {
  float s = sw + __shfl_xor_sync(0xffffffffu, sw, 1);
  s += __shfl_xor_sync(0xffffffffu, s, 2);  // column g's, over the quad's tokens
  const float d0 = -MAGIC * __shfl_sync(0xffffffffu, s, 4 * (2 * t)) * f0;
  const float d1 = -MAGIC * __shfl_sync(0xffffffffu, s, 4 * (2 * t + 1)) * f1;
#pragma unroll
  for (int l = 0; l < NM; ++l) {
    c[l][0] = fmaf(c[l][0], f0, d0); c[l][1] = fmaf(c[l][1], f1, d1);
    c[l][2] = fmaf(c[l][2], f0, d0); c[l][3] = fmaf(c[l][3], f1, d1);
  }
  sw = 0.f;
}

// Balanced splits (A.fill_rows > 0): one split length for the whole batch, so every split reads
// about as many tokens whatever the request's length (token-balanced work, as FlashDecoding++
// and FlashInfer's planner do; kv_indptr is read here, so one captured launch serves any
// lengths). The length c is the smallest of 32 candidates (lane j tests candidate j) whose
// splits sum_b max(1, cdiv(L_b, c)) fit the G = A.num_splits rows, between cdiv(total,
// fill_rows) (the plan's B x S rows: uniform lengths get the plan's equal split, so a one-split
// plan keeps one split per request) and cdiv(total, G - B) (any lengths fit there: sum_b
// cdiv(L_b, c) <= total / c + B <= G). Needs fill_rows >= G - B > 0. Returns the request
// holding split row s (-1 past the batch's last split) with its first row and split count: a
// warp scan of the requests' split counts, 32 requests per round (the first round's lengths
// are kept from the fit test).
__device__ __forceinline__ int used_splits(int len, int c) { return max((len + c - 1) / c, 1); }

__device__ __forceinline__ int request_length(const Args& A, int r) {
  return r < A.batch ? A.kv_indptr[r + 1] - A.kv_indptr[r] : 0;
}

__device__ __forceinline__ int balanced_split(const Args& A, int s, int lane, int step, int& c,
                                              int& first, int& used) {
  const int B = A.batch, G = A.num_splits;
  const int len0 = request_length(A, lane);
  const int total = A.kv_indptr[B] - A.kv_indptr[0];
  const int lo = (total + A.fill_rows - 1) / A.fill_rows;
  const int hi = (total + (G - B) - 1) / (G - B);
  const int cand = max((lo + (int)((int64_t)(hi - lo) * lane / 31) + step - 1) / step, 1) * step;
  c = cand;
  if (lo < hi) {  // else every candidate is the same and fits
    int sum = 0;
    for (int b0 = 0; b0 < B; b0 += 32) {
      const int len = b0 == 0 ? len0 : request_length(A, b0 + lane);
      const int n = min(32, B - b0);
      for (int i = 0; i < n; ++i) sum += used_splits(__shfl_sync(0xffffffffu, len, i), cand);
    }
    const unsigned fit = __ballot_sync(0xffffffffu, sum <= G);
    c = __shfl_sync(0xffffffffu, cand, fit ? __ffs(fit) - 1 : 31);
  }
  int carry = 0;
  for (int b0 = 0; b0 < B; b0 += 32) {
    const int r = b0 + lane;
    const int u = r < B ? used_splits(b0 == 0 ? len0 : request_length(A, r), c) : 0;
    int incl = u;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int x = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += x;
    }
    const int start = carry + incl - u;
    const unsigned hit = __ballot_sync(0xffffffffu, u > 0 && s >= start && s < start + u);
    if (hit) {
      const int src = __ffs(hit) - 1;
      first = __shfl_sync(0xffffffffu, start, src);
      used = __shfl_sync(0xffffffffu, u, src);
      return b0 + src;
    }
    carry += __shfl_sync(0xffffffffu, incl, 31);
  }
  return -1;
}

// ---- the fused merge (q_mode 1 or 2): the splits of each (request, KV head) pair form chunks of
// A.merge_chunk (the host's choice: decode_tc.merge_chunk); the last warp of a chunk to finish
// reduces the chunk's rows and writes the partial over the chunk's first row; the last chunk to
// finish reduces the partials (a two-level tree where one warp over all the splits would be
// latency-bound, ~1 µs per MERGE_U rows), un-rotates, adds the in-flight token and writes the
// output.
// Counters (zero between launches, each wraps back to 0 at its last arrival) per pair: one per
// chunk, then one for the pair: pair * (chunks + 1) + c.
#define MERGE_U (GQ == 1 ? 16 : GQ == 2 ? 8 : GQ == 3 ? 4 : 2)  // rows per head in flight
constexpr int ME = D / 32;  // MidO elements per lane: ME lane + e
static_assert(ME == 2 || ME == 4, "D is 64 or 128");

// Count this warp's arrival at counter (members arrivals in all); true in the last one, which
// then holds what the others wrote. The warp barrier orders every lane's stores before lane 0's
// atomic, which releases them and acquires the earlier arrivals' (each arrival's read-modify-write
// continues the release sequence of those before it), and the second barrier orders lane 0's
// acquire before the other lanes' loads. One acq_rel atomic, not a release atomic and a fence in
// the last arrival: on an H100 the tail at batch 1-4 took about 1.1 µs per arrival with the fence
// and calls ran 1.5-4 % faster without it (benchmarks/results/h100_2026-12-06d_merge_ab.json).
__device__ __forceinline__ bool arrive_last(int* counter, int members, int lane) {
  __syncwarp();
  unsigned old = 0;
  if (lane == 0)
    asm volatile("atom.acq_rel.gpu.global.inc.u32 %0, [%1], %2;\n"
                 : "=r"(old) : "l"(counter), "r"(members - 1) : "memory");
  old = __shfl_sync(0xffffffffu, old, 0);
  if (old != (unsigned)(members - 1)) return false;
  __syncwarp();
  return true;
}

// (m, l, acc) of the GQ heads = the log-sum-exp reduction of the MidO/MidML rows first + i stride
// (i < count) of each head (head hq's rows: rb + hq S + row): MERGE_U rows per head loaded at a
// time, their common max taken first, so the rescale is one exp2 per round, not one per row.
__device__ __forceinline__ void reduce_rows(const Args& A, int64_t rb, int first, int stride,
                                            int count, int lane, float (&m)[GQ], float (&l)[GQ],
                                            float (&acc)[GQ][ME]) {
  const int S = A.num_splits;
#pragma unroll
  for (int hq = 0; hq < GQ; ++hq) {
    m[hq] = -INFINITY;
    l[hq] = 0.f;
#pragma unroll
    for (int e = 0; e < ME; ++e) acc[hq][e] = 0.f;
  }
  {  // every row's 128-byte lines into this SM's L1 (after the acquire: fresh from the L2)
    constexpr int LPR = D * 4 / 128;
    const int lines = GQ * count * LPR;
    for (int x = lane; x < lines; x += 32) {
      const int hq = x / (count * LPR), rest = x % (count * LPR), i = rest / LPR, part = rest % LPR;
      const float* p = A.mid_o + (rb + (int64_t)hq * S + first + (int64_t)i * stride) * D + part * 32;
      asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p));
    }
    for (int x = lane; x < GQ * count; x += 32) {
      const int hq = x / count, i = x % count;
      asm volatile("prefetch.global.L1 [%0];\n" ::"l"(A.mid_ml + (rb + (int64_t)hq * S + first + (int64_t)i * stride) * 2));
    }
  }
  for (int i0 = 0; i0 < count; i0 += MERGE_U) {
    float2 ml[MERGE_U][GQ];
    float o[MERGE_U][GQ][ME];
#pragma unroll
    for (int u = 0; u < MERGE_U; ++u) {
#pragma unroll
      for (int hq = 0; hq < GQ; ++hq) {
        const int64_t row = rb + (int64_t)hq * S + first + (int64_t)(i0 + u) * stride;
        if (i0 + u < count) {  // an empty split: max -1e30, sum 0, output 0
          ml[u][hq] = ldca2(A.mid_ml + row * 2);
          const float* op = A.mid_o + row * D + ME * lane;
          if constexpr (ME == 4) {
            const float4 v = ldca4(op);
            o[u][hq][0] = v.x; o[u][hq][1] = v.y; o[u][hq][2] = v.z; o[u][hq][3] = v.w;
          } else {
            const float2 v = ldca2(op);
            o[u][hq][0] = v.x; o[u][hq][1] = v.y;
          }
        } else {  // past the last row: weight 0 (row 0 is real, so the max is finite)
          ml[u][hq] = make_float2(-INFINITY, 0.f);
#pragma unroll
          for (int e = 0; e < ME; ++e) o[u][hq][e] = 0.f;
        }
      }
    }
#pragma unroll
    for (int hq = 0; hq < GQ; ++hq) {
      float mn = m[hq];
#pragma unroll
      for (int u = 0; u < MERGE_U; ++u) mn = fmaxf(mn, ml[u][hq].x);
      const float a = exp2f(m[hq] - mn);
      l[hq] *= a;
#pragma unroll
      for (int e = 0; e < ME; ++e) acc[hq][e] *= a;
#pragma unroll
      for (int u = 0; u < MERGE_U; ++u) {
        const float w = exp2f(ml[u][hq].x - mn);
        l[hq] += w * ml[u][hq].y;
#pragma unroll
        for (int e = 0; e < ME; ++e) acc[hq][e] += w * o[u][hq][e];
      }
      m[hq] = mn;
    }
  }
}

// The fused merge of (request b, KV head hk) by the last warp of chunk c of its splits (all of
// the chunk written): per query head, the log-sum-exp reduction as rq_decode_merge_kernel (the
// chunk, then across chunks as above), the un-rotation (q_mode 2: R^T = alpha H diag(s), the
// query's FWHT then signs and alpha), the in-flight token q.k_cur * qk_scale with v_cur, the bf16
// output. The in-flight token is loaded first.
__device__ __forceinline__ void merge_pair(const Args& A, int b, int hk, int64_t rb, int c,
                                           int chunks, int used, int* pair_counter, int lane) {
  constexpr int E = ME;
  const int S = A.num_splits;
  float kc[E], vc[E], qv[GQ][E];
  {
    const uint16_t* kp = A.k_cur + (int64_t)b * A.k_cur_b + (int64_t)hk * A.k_cur_h;
    const uint16_t* vp = A.v_cur + (int64_t)b * A.v_cur_b + (int64_t)hk * A.v_cur_h;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int i = E * lane + e;
      kc[e] = i < HEAD_DIM ? bf16_lo(kp[i]) : 0.f;
      vc[e] = i < HEAD_DIM ? bf16_lo(vp[i]) : 0.f;
    }
#pragma unroll
    for (int hq = 0; hq < GQ; ++hq) {
      const uint16_t* qp = static_cast<const uint16_t*>(A.q) + (int64_t)b * A.q_b +
                           (int64_t)(hk * GQ + hq) * A.q_h;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int i = E * lane + e;
        qv[hq][e] = i < HEAD_DIM ? bf16_lo(qp[i]) : 0.f;
      }
    }
  }
  // head hq's rows: rb + hq S + split
  float m[GQ], l[GQ], acc[GQ][E];
  const int C = A.merge_chunk;
  reduce_rows(A, rb, c * C, 1, min(C, used - c * C), lane, m, l, acc);
  if (chunks > 1) {  // the chunk's partial over its first row; the last chunk reduces them all
#pragma unroll
    for (int hq = 0; hq < GQ; ++hq) {
      const int64_t row = rb + (int64_t)hq * S + c * C;
      if (lane == 0) *reinterpret_cast<float2*>(A.mid_ml + row * 2) = make_float2(m[hq], l[hq]);
      float* op = A.mid_o + row * D + E * lane;
      if constexpr (E == 4)
        *reinterpret_cast<float4*>(op) = make_float4(acc[hq][0], acc[hq][1], acc[hq][2], acc[hq][3]);
      else
        *reinterpret_cast<float2*>(op) = make_float2(acc[hq][0], acc[hq][1]);
    }
    if (!arrive_last(pair_counter, chunks, lane)) return;
    reduce_rows(A, rb, 0, C, chunks, lane, m, l, acc);
  }
#pragma unroll
  for (int hq = 0; hq < GQ; ++hq) {
    if (A.q_mode == 2) {  // back to the original basis: o R^T = alpha (H o) * s
      fwht<E>(acc[hq], lane);
#pragma unroll
      for (int e = 0; e < E; ++e) acc[hq][e] *= A.signs[hk * D + E * lane + e] * A.q_alpha;
    }
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) dot += qv[hq][e] * kc[e];
#pragma unroll
    for (int x = 16; x; x >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, x);
    const float s_cur = dot * A.qk_scale;
    const float m_new = fmaxf(m[hq], s_cur);
    const float a_old = exp2f(m[hq] - m_new), p_cur = exp2f(s_cur - m_new);
    const float den = l[hq] * a_old + p_cur;
    uint16_t* op = A.out + (int64_t)b * A.out_b + (int64_t)(hk * GQ + hq) * A.out_h;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int i = E * lane + e;
      if (i < HEAD_DIM) op[i] = bf16_bits((acc[hq][e] * a_old + vc[e] * p_cur) / den);
    }
  }
}

extern "C" __global__ void __launch_bounds__(WARPS * 32, MINB)
rq_decode_tc_split(const Args A) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const uint32_t magic = MAGIC_BITS;  // LOP3 operand
  const int g = lane >> 2, t = lane & 3;
  // this warp's (split, KV head) of request b, KV head fastest: the CTA's warps are adjacent
  // units (adjacent KV heads of one split when num_kv_heads % 4 == 0: COOP copies their
  // (scale, offset) rows and coefficients once for the CTA; otherwise those shared sectors and
  // the pool slots come from L1 after the first warp's miss)
  const int num_kv_heads = A.num_qo_heads / GQ;
  const int unit = blockIdx.x * WARPS + warp;
  griddep_launch_dependents();
  if (unit >= (A.fill_rows ? A.num_splits : A.num_splits * A.batch) * num_kv_heads) {
    griddep_wait();  // every thread waits, so this grid never completes before its primary
    return;
  }
  const int hk = unit % num_kv_heads, rest = unit / num_kv_heads;
  constexpr int STEP = SUBT * TILE;  // tokens per iteration
  // request b, its split, the split length and its splits; its first MidO row (row_b: the row
  // base of its KV head's first query head, that head's rows rb + split, the next head's S
  // further)
  int b, split, per_split, used, first = 0;
  if (A.fill_rows) {
    b = balanced_split(A, rest, lane, STEP, per_split, first, used);
    if (b < 0) {  // past the last request's splits
      griddep_wait();
      return;
    }
    split = rest - first;
    if (!A.fused && split == 0 && hk == 0 && lane == 0) {
      A.split_rows[2 * b] = first;
      A.split_rows[2 * b + 1] = used;
    }
  } else {  // equal splits of each request's own length, request-major
    b = rest / A.num_splits;
    split = rest % A.num_splits;
    const int len = A.kv_indptr[b + 1] - A.kv_indptr[b];
    per_split = ((len + A.num_splits - 1) / A.num_splits + STEP - 1) / STEP * STEP;
    used = A.num_splits;
  }
  const int64_t base = A.kv_indptr[b];
  const int seq = A.kv_indptr[b + 1] - (int)base;
  const int lo = split * per_split;
  const int hi = min(lo + per_split, seq);

  // ---- this thread's K query column: g = (head h, group grp) when g < ROWS; its K slice t is
  // group gt (head_dim 96: group 3, slice 3 and rows (h, 3) are padding)
  // (KINT: columns g >= 4 carry the low halves of row g - 4)
  const int gt = (SL * t) / GS;
  const int grp = (KINT ? g & 3 : g) % NG;
  const int h = (KINT ? g & 3 : g) / NG;
  const bool row_ok = (KINT ? g & 3 : g) < ROWS;
  const bool a_rows = row_ok && grp == gt && (HEAD_DIM != 96 || gt < NGR);  // slice t feeds row g
  // V: this thread builds the weights of B column g, row vr = (head vh, group vgrp); PAIRED, the
  // columns g >= 4 (second) carry the second term's weights of row g - 4
  const int vr = PAIRED ? (g & 3) : g;
  const bool second = PAIRED && g >= 4;
  const int vgrp = vr % NG, vh = vr / NG;
  const bool v_ok = vr < ROWS;

  float cv[NM][4];  // V: elements NT g + 2 mt (0, 1) and NT g + 2 mt + 1 (2, 3), columns 2t, 2t + 1
#pragma unroll
  for (int l = 0; l < NM; ++l) cv[l][0] = cv[l][1] = cv[l][2] = cv[l][3] = 0.f;
#if RES_ACC
  float cw[NM][4];  // the residual's, same map
#pragma unroll
  for (int l = 0; l < NM; ++l) cw[l][0] = cw[l][1] = cw[l][2] = cw[l][3] = 0.f;
#endif
  // l_run: sum p of head vh; sw_a (sw_r): sum of the fp16 weights fed to column g (of the
  // residual's accumulator); m_off: sum p (c m_a + m_r) of this thread's part
  float m_run = -INFINITY, l_run = 0.f, sw_a = 0.f, m_off = 0.f;
#if RES_ACC
  float sw_r = 0.f;
#endif

  // [WARPS][STAGES][STAGE_BYTES] (+ [STAGES][SMALL_BYTES], COOP)
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* wsm = smem + warp * (STAGES * STAGE_BYTES);
  const uint32_t wsa = (uint32_t)__cvta_generic_to_shared(wsm);
#if COOP
  const uint8_t* small0 = smem + WARPS * STAGES * STAGE_BYTES;  // stage 0's small data
  constexpr int SMALL_STRIDE = SMALL_BYTES;
  const int so_head = warp * SB, cf_head = warp * 2;
#else
  const uint8_t* small0 = wsm + OFF_SO;
  constexpr int SMALL_STRIDE = STAGE_BYTES;
  const int so_head = 0, cf_head = 0;
#endif
  const uint32_t small0a = (uint32_t)__cvta_generic_to_shared(small0);
  // tiles of this split, rounded up to whole iterations: a tile past hi is copied from pool row 0
  // (its tokens are masked; row 0 holds finite scales, unlike unwritten shared memory)
  const int ntiles = lo < hi ? (hi - lo + STEP - 1) / STEP * SUBT : 0;
  const Copies cps = copy_setup(A, hk, warp, lane);
#pragma unroll
  for (int s = 0; s < STAGES - SUBT; ++s) {
    issue_tile(A, cps, wsa + s * STAGE_BYTES, small0a + s * SMALL_STRIDE, lane,
               tile_slot(A, base, lo + s * TILE, hi, lane), s < ntiles);
    cp_commit();
  }
  uint32_t pslot[SUBT];  // pool rows of the next tiles to issue (loaded an iteration ahead)
#pragma unroll
  for (int u = 0; u < SUBT; ++u) pslot[u] = tile_slot(A, base, lo + (STAGES - SUBT + u) * TILE, hi, lane);
  // q_mode 2: this lane's Hadamard signs (not another kernel's output: loaded before the wait)
  float sg[D / 32];
#pragma unroll
  for (int e = 0; e < D / 32; ++e) sg[e] = A.q_mode == 2 ? A.signs[hk * D + (D / 32) * lane + e] : 1.f;
  __syncwarp();
  // the history copies are in flight; the query is the previous kernel's output
  griddep_wait();

  // ---- the query rows of this KV head as bf16 in the last stage (free until the first
  // iteration issues into it); q_mode 2 rotates them here: x s, one fast Walsh-Hadamard
  // transform across the warp (log2(D / 32) butterfly stages in registers, then 5 by shuffles;
  // element E lane + e), times alpha, instead of a rotation kernel before this one
  uint16_t* qs = reinterpret_cast<uint16_t*>(wsm + (STAGES - 1) * STAGE_BYTES);  // [GQ][D]
  {
    constexpr int E = D / 32;
#pragma unroll
    for (int hq = 0; hq < GQ; ++hq) {
      const int64_t off = (int64_t)b * A.q_b + (int64_t)(hk * GQ + hq) * A.q_h;
      float x[E];
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int i = E * lane + e;
        if (i >= HEAD_DIM) x[e] = 0.f;
        else if (A.q_mode == 0) x[e] = static_cast<const float*>(A.q)[off + i];
        else x[e] = __uint_as_float((uint32_t)static_cast<const uint16_t*>(A.q)[off + i] << 16);
      }
      if (A.q_mode == 2) {
#pragma unroll
        for (int e = 0; e < E; ++e) x[e] *= sg[e];
        fwht<E>(x, lane);
#pragma unroll
        for (int e = 0; e < E; ++e) x[e] *= A.q_alpha;
      }
#pragma unroll
      for (int e = 0; e < E; e += 2)
        *reinterpret_cast<uint32_t*>(qs + hq * D + E * lane + e) = pack_bf16(x[e], x[e + 1]);
    }
    __syncwarp();
  }

  // ---- this thread's slice of its query row: SL elements SL t + e of row h as fp32 (0 where
  // slice t does not feed row g: a_rows), from SL / 8 16-byte shared loads, each element
  // converted once (both K sides take the anchor's and the residual's fragments from it)
  float qv[SL];
  {
    const uint4* q4 = reinterpret_cast<const uint4*>(qs + (row_ok ? h : 0) * D + SL * t);
#pragma unroll
    for (int i = 0; i < SL / 8; ++i) {
      const uint4 w = a_rows ? q4[i] : make_uint4(0u, 0u, 0u, 0u);
      const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        qv[8 * i + 2 * j] = __uint_as_float(ws[j] << 16);
        qv[8 * i + 2 * j + 1] = __uint_as_float(ws[j] & 0xFFFF0000u);
      }
    }
  }
#if KINT
  // ---- query fragments (fixed point: row g & 3 scaled so its largest |element| is QFIX, split
  // q16 = 256 hi + lo into s8 halves; columns g < 4 the high, g >= 4 the low halves), the
  // row's dequantization factor and sum q
  uint32_t qa[KI_STEPS][2];
#if R_BITS > 0
  uint32_t qr[KI_STEPS][2];
#endif
  float qsum = 0.f, qmax = 0.f;
  {
#pragma unroll
    for (int e = 0; e < SL; ++e) {
      qsum += qv[e];
      qmax = fmaxf(qmax, fabsf(qv[e]));
    }
    qsum = g < 4 ? qsum : 0.f;
    // the row's group spans the quad's slices of it (GS 64: two); other slices hold 0
    qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, 1));
    qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, 2));
    const float qscale = qmax > 0.f ? QFIX / qmax : 0.f;
    const bool low = g >= 4;
    uint32_t qb[SL];  // element e's s8 half as a byte
#pragma unroll
    for (int e = 0; e < SL; ++e) {
      const int q16 = __float2int_rn(qv[e] * qscale);
      const int qhi = (q16 + 128) >> 8;
      qb[e] = (uint32_t)(low ? q16 - 256 * qhi : qhi) & 0xFFu;
    }
#pragma unroll
    for (int r = 0; r < SL / 4; ++r) {
      uint32_t wa = 0;
#if R_BITS > 0
      uint32_t wr = 0;
#endif
#pragma unroll
      for (int bb = 0; bb < 4; ++bb) {
        wa |= qb[k_elem_int<A_BITS>(r, bb)] << (8 * bb);
#if R_BITS > 0
        wr |= qb[k_elem_int<R_BITS>(r, bb)] << (8 * bb);
#endif
      }
      qa[r / 2][r % 2] = wa;
#if R_BITS > 0
      qr[r / 2][r % 2] = wr;
#endif
    }
    qsum += __shfl_xor_sync(0xffffffffu, qsum, 1);
    qsum += __shfl_xor_sync(0xffffffffu, qsum, 2);
  }
  // K side (tokens on M): this thread's accumulator columns 2t, 2t + 1 are rows (head ht,
  // groups cg, cg + 1) of the query, high halves for t < 2, low for t >= 2; their factors (the
  // row's qmax / QFIX, times 256 for a high half) and sums come from the quads that built them
  const int tq = t & 1;
  const bool k_low = t >= 2;
  const int cg = (2 * tq) % NG;
  const bool col_ok = 2 * tq < ROWS;
  // (the whole sums 256 hi + lo: k_whole; times 2^-BITS: k_dots_int's are codes times 2^BITS)
  float cs[2], cq[2];
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    cs[c] = __shfl_sync(0xffffffffu, qmax, 4 * (2 * tq + c)) * (1.f / QFIX);
    cq[c] = __shfl_sync(0xffffffffu, qsum, 4 * (2 * tq + c));
  }
#else
  // ---- query fragments (fp16, pre-divided by 2^pos) and the folds 1024 * sum q, sum q per row
  uint32_t qa[K_STEPS][2];
#if R_BITS > 0
  uint32_t qr[K_STEPS][2];
#endif
  float fold_a = 0.f, fold_r = 0.f, qsum = 0.f;
  {
#pragma unroll
    for (int r = 0; r < SL / 2; ++r) {
      float v[2];
#if R_BITS > 0
      float w[2];
#endif
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float x = qv[k_elem<A_BITS>(r, half)];
        v[half] = x * pos_scale<A_BITS>(r % (16 / A_BITS));
        qsum += x;
#if R_BITS > 0
        w[half] = qv[k_elem<R_BITS>(r, half)] * pos_scale<R_BITS>(r % (16 / R_BITS));
#endif
      }
      // the folds from the fragments as rounded (an element below fp16's normal range rounds)
      qa[r / 2][r % 2] = pack_f16(v[0], v[1]);
      const float2 va = f16_pair(qa[r / 2][r % 2]);
      fold_a += MAGIC * (va.x + va.y);
#if R_BITS > 0
      qr[r / 2][r % 2] = pack_f16(w[0], w[1]);
      const float2 wr = f16_pair(qr[r / 2][r % 2]);
      fold_r += MAGIC * (wr.x + wr.y);
#endif
    }
    // sum over the quad's slices of this row's group (slices of other groups contribute 0)
    fold_a += __shfl_xor_sync(0xffffffffu, fold_a, 1);
    fold_a += __shfl_xor_sync(0xffffffffu, fold_a, 2);
    fold_r += __shfl_xor_sync(0xffffffffu, fold_r, 1);
    fold_r += __shfl_xor_sync(0xffffffffu, fold_r, 2);
    qsum += __shfl_xor_sync(0xffffffffu, qsum, 1);
    qsum += __shfl_xor_sync(0xffffffffu, qsum, 2);
  }
  // K side (tokens on M): this thread's accumulator columns 2t, 2t + 1 are rows (head ht,
  // groups cg, cg + 1) of the query; their folds come from the quads that built them.
  const int cg = (2 * t) % NG;
  const bool col_ok = 2 * t < ROWS;
  float cf_a[2], cf_r[2], cq[2];
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    cf_a[c] = __shfl_sync(0xffffffffu, fold_a, 4 * (2 * t + c));
    cf_r[c] = __shfl_sync(0xffffffffu, fold_r, 4 * (2 * t + c));
    cq[c] = __shfl_sync(0xffffffffu, qsum, 4 * (2 * t + c));
  }
  const int tq = t;
  const bool k_low = false;  // (KINT: lanes t >= 2 hold the low halves' columns)
#endif
  // the lane (of quad 0) whose columns belong to this thread's V head vh
  const int src_t = (vh * NG) / 2 < 4 ? (vh * NG) / 2 : 0;
  // the head of this thread's K columns 2t, 2t + 1 (a padding column's: head 0; its logits are
  // -inf) and that head's running max, kept beside m_run (this thread's V head vh's)
  const int ht_k = col_ok ? (2 * tq) / NG : 0;
  float m_run_k = -INFINITY;
  // where the (scale, offset) rows of this thread's V weights start (PAIRED: its kind's)
  const int so_v = so_offset(A, hk, second && R_BITS > 0 ? 3 : 1);

#if HAS_COEF
  // which half of a coefficient word holds this KV head's K / V value (the same for every row)
  const int sh_k = (reinterpret_cast<uintptr_t>(A.cf + hk * A.cf_h) & 2) ? 16 : 0;
  const int sh_v = (reinterpret_cast<uintptr_t>(A.cf + hk * A.cf_h + A.cf_kv) & 2) ? 16 : 0;
#endif
  // SUBT tiles per iteration: their K phases are independent work between the softmax steps,
  // which run once per iteration (max, rescale)
  for (int it = 0; it < ntiles; it += SUBT) {
    const uint8_t* stps[SUBT];
    const uint8_t* sos[SUBT];  // the stages' (scale, offset) rows of this warp's head
    const uint8_t* cfs[SUBT];  // the stages' coefficients of this warp's head
#pragma unroll
    for (int u = 0; u < SUBT; ++u) {
      stps[u] = wsm + ((it + u) % STAGES) * STAGE_BYTES;
      sos[u] = small0 + ((it + u) % STAGES) * SMALL_STRIDE + so_head;
      cfs[u] = small0 + ((it + u) % STAGES) * SMALL_STRIDE + cf_head;
    }
    cp_wait<STAGES - 2 * SUBT>();
#if COOP
    __syncthreads();  // every warp's copies of these stages landed; the last ones' reads are done
#else
    __syncwarp();
#endif
#pragma unroll
    for (int u = 0; u < SUBT; ++u) {  // into the stages the previous iteration read
      const int nt = it + STAGES - SUBT + u;
      issue_tile(A, cps, wsa + (nt % STAGES) * STAGE_BYTES, small0a + (nt % STAGES) * SMALL_STRIDE,
                 lane, pslot[u], nt < ntiles);
      cp_commit();
      pslot[u] = tile_slot(A, base, lo + (nt + SUBT) * TILE, hi, lane);
    }

    float lg[SUBT][2];
#pragma unroll
    for (int u = 0; u < SUBT; ++u) {
    const uint8_t* stp = stps[u];
    const int n = lo + (it + u) * TILE;
    // ---- K (tokens on M): X[tok, col] for tokens g, 8 + g and columns 2t, 2t + 1
#if KINT
    int ia[4];
    k_dots_int<A_BITS>(stp, BA, g, t, qa, ia);
#if R_BITS > 0
    int ir[4];
    k_dots_int<R_BITS>(stp + OFF_KR, BR, g, t, qr, ir);
#endif
#else
    float xa[4];
    k_dots<A_BITS>(stp, BA, g, t, qa, magic, xa);
#if R_BITS > 0
    float xr[4];
    k_dots<R_BITS>(stp + OFF_KR, BR, g, t, qr, magic, xr);
#endif
#endif
    // ---- logits of head ht, per token: this thread's two columns' dot terms (xk: anchor, xkr:
    // residual), then the head's other columns (NG = 4: the neighbour thread). KINT: one token
    // per lane (t < 2: g, else 8 + g; k_whole), lg[u][0] = lg[u][1]; else tokens g (j = 0) and
    // 8 + g (j = 1)
    constexpr int J = KINT ? 1 : 2;
    float xk[J][2], xkr[J][2];
#if KINT
    {
      int w[2];
      k_whole(ia, k_low, w);
#pragma unroll
      for (int c = 0; c < 2; ++c) xk[0][c] = cs[c] * (1.f / (1 << A_BITS)) * __int2float_rn(w[c]);
#if R_BITS > 0
      k_whole(ir, k_low, w);
#pragma unroll
      for (int c = 0; c < 2; ++c) xkr[0][c] = cs[c] * (1.f / (1 << R_BITS)) * __int2float_rn(w[c]);
#endif
    }
#else
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        xk[j][c] = xa[2 * j + c] - cf_a[c];
#if R_BITS > 0
        xkr[j][c] = xr[2 * j + c] - cf_r[c];
#endif
      }
    }
#endif
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int tk = KINT ? (k_low ? 8 + g : g) : 8 * j + g;
      const uint32_t ska = so_word(sos[u], 0, tk, cg, so_offset(A, hk, 0));
#if HAS_COEF
      const float c_k = coef_of(cfs[u], 0, tk, sh_k);
#else
      const float c_k = 1.f;
#endif
      float acc = -0.f;  // x + -0 == x: no add of the initial zero
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float2 sa = fp8x2((uint16_t)(ska >> (16 * c)));
        float v = c_k * (sa.x * xk[j][c] + sa.y * cq[c]);
#if R_BITS > 0
        const float2 sr = fp8x2((uint16_t)(so_word(sos[u], 2, tk, cg, so_offset(A, hk, 2)) >> (16 * c)));
        v += sr.x * xkr[j][c] + sr.y * cq[c];
#endif
        acc += col_ok && (HEAD_DIM != 96 || cg + c < NGR) ? v : 0.f;  // 96: not group 3
      }
      if (NG == 4) acc += __shfl_xor_sync(0xffffffffu, acc, 1);
      lg[u][j] = (col_ok && n + tk < hi) ? acc * A.qk_scale : -INFINITY;
      if (KINT) lg[u][1] = lg[u][j];
    }
    }
    // logits of head vh for the V tokens 2t + (i & 1) + 8 (i >> 1), from the threads holding them
    float qk[SUBT][4], cvv[SUBT][4];
#pragma unroll
    for (int u = 0; u < SUBT; ++u) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        // (KINT: token 8 + g's logit on lane src_t + 2: k_whole)
        qk[u][i] = __shfl_sync(0xffffffffu, lg[u][i >> 1],
                               4 * (2 * t + (i & 1)) + src_t + (KINT ? 2 * (i >> 1) : 0));
        if (!v_ok || PAD_ROW) qk[u][i] = -INFINITY;
#if HAS_COEF
        cvv[u][i] = coef_of(cfs[u], 1, 2 * t + (i & 1) + 8 * (i >> 1), sh_v);
#else
        cvv[u][i] = 1.f;
#endif
      }
    }
    // lazy rescaling: keep the running max unless a logit exceeds its head's by 2^8 (each
    // thread checks its own K-side logits against m_run_k, the running max of their head ht; the
    // head's exact max over the iteration is taken only then)
    // (and every DRAIN_ITERS iterations, for the magic drain)
    bool over = (it / SUBT) % DRAIN_ITERS == DRAIN_ITERS - 1;
#pragma unroll
    for (int u = 0; u < SUBT; ++u) over |= fmaxf(lg[u][0], lg[u][1]) > m_run_k + 8.f;
    if (__any_sync(0xffffffffu, over)) {
      // max of head ht over the iteration's tokens, then of this thread's V head vh
      float mt = fmaxf(lg[0][0], lg[0][1]);
#pragma unroll
      for (int u = 1; u < SUBT; ++u) mt = fmaxf(mt, fmaxf(lg[u][0], lg[u][1]));
      if (KINT) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));  // tokens g, 8 + g
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 4));
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 8));
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 16));
      mt = __shfl_sync(0xffffffffu, mt, src_t);
      if (!v_ok) mt = -INFINITY;
      const float m_new = fmaxf(m_run, mt);
      const float f = m_new == -INFINITY ? 1.f : exp2f(m_run - m_new);
      // the accumulator columns 2t, 2t + 1 belong to the heads of columns 2t, 2t + 1: their
      // factors come from quads 2t, 2t + 1 (which build those columns' weights)
      const float f0 = __shfl_sync(0xffffffffu, f, 4 * (2 * t));
      const float f1 = __shfl_sync(0xffffffffu, f, 4 * (2 * t + 1));
      rescale_drain(cv, sw_a, t, f0, f1);
#if RES_ACC
      rescale_drain(cw, sw_r, t, f0, f1);
#endif
      l_run *= f; m_off *= f;
      m_run = m_new;
      m_run_k = __shfl_sync(0xffffffffu, m_run, 4 * (ht_k * NG));  // row (ht, group 0)
    }

    // p = 2^(logit - m_run - VPRE): the V weights' factor 2^-VPRE comes with the exponent, so
    // l_run and m_off run in those units too (taken back after the loop). A finite m_p makes
    // exp2 of a masked logit (-inf) exactly 0 with no select, also before any logit of the head
    // (m_run = -inf).
    const float m_p = fmaxf(m_run, -1.0e30f) + VPRE;
#pragma unroll
    for (int u = 0; u < SUBT; ++u) {
    const uint8_t* stp = stps[u];
    // ---- weights of B column g for tokens 2t + (i & 1) + 8 (i >> 1): p c s_a (the anchor's),
    // or p s_r (the residual's; PAIRED, the columns 4-7)
    float wa[4];
#if RES_ACC
    float wr[4];
#endif
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float p = exp2f(qk[u][i] - m_p);
      const int tk = 2 * t + (i & 1) + 8 * (i >> 1);
#if PAIRED && R_BITS > 0
      // the anchor's (kind 1, times c) or the residual's (kind 3) scale and offset
      const float2 s = fp8x2(so_pair(sos[u], second ? 3 : 1, tk, PAD_ROW ? 0 : vgrp, so_v));
      const float pc = second ? p : p * cvv[u][i];
      wa[i] = pc * s.x;
      m_off += pc * s.y;
#else
      const float2 sa = fp8x2(so_pair(sos[u], 1, tk, PAD_ROW ? 0 : vgrp, so_v));
      wa[i] = p * cvv[u][i] * sa.x;
#if R_BITS > 0
      const float2 sr = fp8x2(so_pair(sos[u], 3, tk, PAD_ROW ? 0 : vgrp, so_offset(A, hk, 3)));
      wr[i] = p * sr.x;
      m_off += p * (cvv[u][i] * sa.y + sr.y);
#else
      m_off += second ? 0.f : p * cvv[u][i] * sa.y;
#endif
#endif
      l_run += p;
    }
    uint32_t wa01 = pack_w(wa[0], wa[1]), wa89 = pack_w(wa[2], wa[3]);
    const float2 fa01 = unpack_w(wa01), fa89 = unpack_w(wa89);
#if R_BITS == 0 && PAIRED
    // no residual: columns 4-7 carry nothing (fp16 weights W 2^-VPRE err by 2^-11 W code, within
    // the tolerance policy even in a group with a large offset; test_decode_tc_numerics.py)
    if (second) { wa01 = 0u; wa89 = 0u; }
    const float sw_t = second ? 0.f : fa01.x + fa01.y + fa89.x + fa89.y;
#else
    const float sw_t = fa01.x + fa01.y + fa89.x + fa89.y;
#endif
    sw_a += sw_t;
#if RES_ACC
    const uint32_t wr01 = pack_w(wr[0], wr[1]), wr89 = pack_w(wr[2], wr[3]);
    const float2 fr01 = unpack_w(wr01), fr89 = unpack_w(wr89);
    sw_r += fr01.x + fr01.y + fr89.x + fr89.y;
#endif

    // ---- V: NM m-tiles; rows g, 8 + g of m-tile mt are elements NT g + 2 mt, NT g + 2 mt + 1
    // (this thread's slice g of NT elements, unpacked as (token, token) pairs)
    {
      uint32_t u01[NT], u89[NT];
      v_codes<A_BITS>(stp + OFF_VA, BA, g, t, u01, u89, magic);
#if PAIRED && R_BITS > 0
      v_mmas(cv, u01, u89, second ? 0u : wa01, second ? 0u : wa89);  // the anchor's columns 0-3
#else
      v_mmas(cv, u01, u89, wa01, wa89);
#endif
#if R_BITS > 0
      v_codes<R_BITS>(stp + OFF_VR, BR, g, t, u01, u89, magic);
#if PAIRED
      v_mmas(cv, u01, u89, second ? wa01 : 0u, second ? wa89 : 0u);  // the residual's columns 4-7
#else
      v_mmas(cw, u01, u89, wr01, wr89);
#endif
#endif
    }
    }
  }

  l_run *= 1 << VPRE;  // back from the units of p (m_p)
  m_off *= 1 << VPRE;
  // ---- sums over the quad (tokens): column g's weight sums, row vr's p sum and offsets
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    l_run += __shfl_xor_sync(0xffffffffu, l_run, x);
    sw_a += __shfl_xor_sync(0xffffffffu, sw_a, x);
#if RES_ACC
    sw_r += __shfl_xor_sync(0xffffffffu, sw_r, x);
#endif
    m_off += __shfl_xor_sync(0xffffffffu, m_off, x);
  }
  // the weight sums of this thread's accumulator columns 2t, 2t + 1 (built by quads 2t, 2t + 1)
  float swc_a[2];
#if RES_ACC
  float swc_r[2];
#endif
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    swc_a[c] = __shfl_sync(0xffffffffu, sw_a, 4 * (2 * t + c));
#if RES_ACC
    swc_r[c] = __shfl_sync(0xffffffffu, sw_r, 4 * (2 * t + c));
#endif
  }
  const int64_t rb = A.fill_rows ? (int64_t)hk * GQ * A.num_splits + first
                                : ((int64_t)b * A.num_qo_heads + hk * GQ) * A.num_splits;
  // ---- per head: element NT g + l (group ge) is column (head, ge)'s anchor term plus its second
  // term (PAIRED: column 4 + that; else the residual accumulator's same column), summed over the
  // quad; thread t writes the elements l = t mod 4
  const int ge = (NT * g) / GS;
#pragma unroll
  for (int hq = 0; hq < GQ; ++hq) {
    const int col = hq * NG + ge;
    float moff = __shfl_sync(0xffffffffu, m_off, 4 * col);
    if (PAIRED) moff += __shfl_sync(0xffffffffu, m_off, 4 * (col + 4));
    const int64_t row = rb + (int64_t)hq * A.num_splits + split;
    float* o = A.mid_o + row * D + NT * g;
#pragma unroll
    for (int l = 0; l < NT; ++l) {
      constexpr int HA = 16 / A_BITS;
      constexpr int SBITS = R_BITS > 0 ? R_BITS : A_BITS;  // the second term's codes
      constexpr int HS = 16 / SBITS;
      float v = 0.f;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int n = 2 * t + c;
        const float x = cv[l / 2][2 * (l % 2) + c];
        constexpr float WS = 1 << VPRE;  // the weights' units back to W's
        if (n == col) v += (x - MAGIC * swc_a[c]) * (WS * pos_scale<A_BITS>(l % HA));
#if PAIRED && R_BITS > 0  // columns 4-7: the residual's
        if (n == col + 4) v += (x - MAGIC * swc_a[c]) * (WS * pos_scale<SBITS>(l % HS));
#elif RES_ACC
        if (n == col) v += (cw[l / 2][2 * (l % 2) + c] - MAGIC * swc_r[c]) * (WS * pos_scale<SBITS>(l % HS));
#endif
      }
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if (l % 4 == t) o[l] = (HEAD_DIM == 96 && ge >= NGR) ? 0.f : v + moff;  // 96: padding is 0
    }
  }
  if (v_ok && !second && vgrp == 0 && t == 0) {
    const int64_t row = rb + (int64_t)vh * A.num_splits + split;
    A.mid_ml[row * 2] = lo < hi ? m_run : -1.0e30f;
    A.mid_ml[row * 2 + 1] = l_run;
  }
  if (A.fused) {  // count this split in its chunk; the chunk's last warp merges
    const int C = A.merge_chunk, c = split / C, chunks = (used + C - 1) / C;
    const int slots = (A.num_splits + C - 1) / C;  // a pair's chunk counters, then its own
    int* pc = A.counters + ((int64_t)b * num_kv_heads + hk) * (slots + 1);
    if (arrive_last(pc + c, min(C, used - c * C), lane))
      merge_pair(A, b, hk, rb, c, chunks, used, pc + slots, lane);
  }
}
