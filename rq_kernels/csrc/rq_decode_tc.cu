// Decode attention over the ResidualQuant cache on tensor cores: the split kernel.
//
// One warp handles one (KV head, request, split); four warps per CTA are four splits. Each
// 16-token tile of the history runs two MMA phases (mma.sync m16n8k16, bf16 in, fp32 out):
//
//   K:  C_k[row, tok] = sum_k Qmask[row, k] * code[tok, k]      rows = (head, group) of the
//       anchor (rows 0-7) and of the residual (rows 8-15); tokens on N (two n-tiles of 8).
//   V:  C_v[row, e]  += sum_tok W[row, tok] * code[tok, e]       W = p c s_a (rows 0-7) and
//       p s_r (rows 8-15); elements on N (16 n-tiles of 8).
//
// The K accumulator fragment of a thread (row g, tokens 2t, 2t+1 of each n-tile) is exactly
// the V A-operand fragment (row g, tokens 2t, 2t+1, 2t+8, 2t+9), so the logits become weights in
// registers (FlashAttention-2's trick, with the roles of query and keys swapped per group).
//
// Codes become bf16 with one LOP3 each (magic number 0x4300 = 128.0: a code c at bit position
// pos of a 16-bit half reads as 128 + c * 2^pos). The 128 is never subtracted per element:
// sum_e q_e (128 + c_e 2^pos_e) = 128 sum_e q_e + sum_e q_e 2^pos_e c_e, so the query is
// pre-divided by 2^pos_e (exact in bf16) and 128 * sum q folded into the per-group epilogue;
// on the V side 128 * sum W and the 2^pos factor are taken out once at the end.
//
// Logit of (head h, token):  sum_g  c s_a (X_a - F_a) + s_r (X_r - F_r) + (c m_a + m_r) S_q
// Output (rotated basis):    sum_g  (C_a - 128 SW_a) + (C_r - 128 SW_r) / 2^pos + sum p (c m_a + m_r)
// (s, m: FP8 scale and offset of the group; c: LSQ coefficient; DESIGN.md section 2.)
//
// Compile-time parameters (nvcc -D...): A_BITS (2, 4), R_BITS (0, 2, 4), GS (32, 64, 128),
// GQ (query heads per KV head, GQ * 128 / GS <= 8), HAS_COEF (0, 1). head_dim is 128.
// Writes the unnormalised split output MidO [B, HQ, S, 128] fp32 and MidML [B, HQ, S, 2]
// (running max in log2 units, sum), the layout rq_decode_merge_kernel reduces.

#include <stdint.h>

#define D 128
#define TILE 16
#define WARPS 4
#define NG (D / GS)
#define ROWS (GQ * NG)

static_assert(A_BITS == 2 || A_BITS == 4, "A_BITS");
static_assert(R_BITS == 0 || R_BITS == 2 || R_BITS == 4, "R_BITS");
static_assert(GS == 32 || GS == 64 || GS == 128, "GS");
static_assert(ROWS <= 8, "GQ * NG <= 8");

__device__ __forceinline__ uint32_t lop_magic(uint32_t x, uint32_t mask) {
  return (x & mask) | 0x43004300u;  // one LOP3
}

// Shift and position of code j (0 <= j < 16/BITS) of a 16-bit half after unpacking.
template <int BITS> __device__ __forceinline__ constexpr int code_shift(int j) {
  return BITS == 4 ? 4 * j : (j < 3 ? 0 : (j < 6 ? 6 : 12));
}
template <int BITS> __device__ __forceinline__ constexpr int code_pos(int j) {
  return BITS == 4 ? 0 : 2 * j - code_shift<2>(j);
}

// Unpack one 32-bit word X: R[j] = (128 + lo-half code j * 2^pos(j), 128 + hi-half code j ...).
template <int BITS> __device__ __forceinline__ void unpack_word(uint32_t x, uint32_t* r) {
  constexpr int H = 16 / BITS;
#pragma unroll
  for (int j = 0; j < H; ++j) {
    const uint32_t m = ((1u << BITS) - 1u) << code_pos<BITS>(j);
    r[j] = lop_magic(x >> code_shift<BITS>(j), m | (m << 16));
  }
}

__device__ __forceinline__ void mma_bf16(float* c, uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
__device__ __forceinline__ float bf16_lo(uint32_t x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t x) { return __uint_as_float(x & 0xFFFF0000u); }

// Two FP8 e4m3 bytes (scale at the low byte, offset at the high byte) -> fp32 pair.
__device__ __forceinline__ float2 fp8x2(uint16_t v) {
  uint32_t h;
  asm("{\n.reg .b16 t;\nmov.b16 t, %1;\ncvt.rn.f16x2.e4m3x2 %0, t;\n}\n" : "=r"(h) : "h"(v));
  float lo, hi;
  asm("{\n.reg .b16 l, u;\nmov.b32 {l, u}, %2;\ncvt.f32.f16 %0, l;\ncvt.f32.f16 %1, u;\n}\n"
      : "=f"(lo), "=f"(hi) : "r"(h));
  return make_float2(lo, hi);
}

template <int BYTES> struct Words;
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
  } else {
    r.w[0] = *reinterpret_cast<const uint32_t*>(p);
  }
  return r;
}

// K side: the 32-element slice t of one token -> 16 bf16x2 B-operand registers; register
// r = w * H + j holds slice elements (w * P + j, w * P + H + j) (P codes per word, H per half).
template <int BITS> __device__ __forceinline__ void unpack_k(const Words<4 * BITS>& x, uint32_t* u) {
  constexpr int H = 16 / BITS;
#pragma unroll
  for (int w = 0; w < BITS; ++w) unpack_word<BITS>(x.w[w], u + w * H);
}

// V side: the 16-element slice g of tokens a and b -> 16 registers, register l holding
// (token a, token b) of slice element l.
template <int BITS> __device__ __forceinline__ void unpack_v(const Words<2 * BITS>& a,
                                                             const Words<2 * BITS>& b,
                                                             uint32_t* u) {
  constexpr int H = 16 / BITS;
  constexpr int NW = BITS / 2;  // words per slice
#pragma unroll
  for (int w = 0; w < NW; ++w) {
    unpack_word<BITS>(__byte_perm(a.w[w], b.w[w], 0x5410), u + w * 2 * H);
    unpack_word<BITS>(__byte_perm(a.w[w], b.w[w], 0x7632), u + w * 2 * H + H);
  }
}

// Slice element of K register half: r = w*H + j, half 0/1.
template <int BITS> __host__ __device__ constexpr int k_elem(int r, int half) {
  return (r / (16 / BITS)) * (32 / BITS) + half * (16 / BITS) + r % (16 / BITS);
}
template <int BITS> __device__ __forceinline__ float pos_scale(int j) {  // 2^-pos of code j
  return 1.0f / float(1 << code_pos<BITS>(j));
}

struct TileRaw {
  int64_t slot_k[2];   // tokens g, 8 + g (K B-operand)
  int64_t slot_v[4];   // tokens 2t, 2t+1, 2t+8, 2t+9 (epilogue and V B-operand)
  Words<4 * A_BITS> ka[2];
  Words<2 * A_BITS> va[4];
#if R_BITS > 0
  Words<4 * R_BITS> kr[2];
  Words<2 * R_BITS> vr[4];
#endif
  uint16_t kso_a[4], vso_a[4];
#if R_BITS > 0
  uint16_t kso_r[4], vso_r[4];
#endif
#if HAS_COEF
  uint16_t ck[4], cv[4];
#endif
};

struct Args {
  const float* q;  // [B, HQ, D] fp32, rotated basis
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
  int num_splits;
  int num_qo_heads;
};

__device__ __forceinline__ void load_tile(const Args& A, int hk, int64_t base, int n, int hi,
                                          int g, int t, TileRaw& T) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int tok = n + 8 * i + g;
    T.slot_k[i] = tok < hi ? A.kv_indices[base + tok] : 0;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int tok = n + 2 * t + (i & 1) + 8 * (i >> 1);
    T.slot_v[i] = tok < hi ? A.kv_indices[base + tok] : 0;
  }
  const uint8_t* ach = A.ac + hk * A.ac_h;
#pragma unroll
  for (int i = 0; i < 2; ++i)
    T.ka[i] = load_words<4 * A_BITS>(ach + T.slot_k[i] * A.ac_r + t * (4 * A_BITS));
#pragma unroll
  for (int i = 0; i < 4; ++i)
    T.va[i] = load_words<2 * A_BITS>(ach + A.ac_kv + T.slot_v[i] * A.ac_r + g * (2 * A_BITS));
#if R_BITS > 0
  const uint8_t* rch = A.rc + hk * A.rc_h;
#pragma unroll
  for (int i = 0; i < 2; ++i)
    T.kr[i] = load_words<4 * R_BITS>(rch + T.slot_k[i] * A.rc_r + t * (4 * R_BITS));
#pragma unroll
  for (int i = 0; i < 4; ++i)
    T.vr[i] = load_words<2 * R_BITS>(rch + A.rc_kv + T.slot_v[i] * A.rc_r + g * (2 * R_BITS));
#endif
}

// The per-token metadata of the 4 epilogue tokens (FP8 scale/offset pairs, coefficients):
// loaded at the start of the tile that uses it (only rows that hold a (head, group)).
__device__ __forceinline__ void load_meta(const Args& A, int hk, int g, bool row_ok, TileRaw& T) {
  const int grp = g % NG;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (row_ok) {
      const uint8_t* a = A.aso + hk * A.aso_h + T.slot_v[i] * A.aso_r + grp * 2;
      T.kso_a[i] = *reinterpret_cast<const uint16_t*>(a);
      T.vso_a[i] = *reinterpret_cast<const uint16_t*>(a + A.aso_kv);
#if R_BITS > 0
      const uint8_t* r = A.rso + hk * A.rso_h + T.slot_v[i] * A.rso_r + grp * 2;
      T.kso_r[i] = *reinterpret_cast<const uint16_t*>(r);
      T.vso_r[i] = *reinterpret_cast<const uint16_t*>(r + A.rso_kv);
#endif
#if HAS_COEF
      const uint16_t* c = A.cf + hk * A.cf_h + T.slot_v[i] * A.cf_r;
      T.ck[i] = c[0];
      T.cv[i] = c[A.cf_kv];
#endif
    } else {
      T.kso_a[i] = T.vso_a[i] = 0;
#if R_BITS > 0
      T.kso_r[i] = T.vso_r[i] = 0;
#endif
#if HAS_COEF
      T.ck[i] = T.cv[i] = 0;
#endif
    }
  }
}


#ifndef MINB
#define MINB 2
#endif
extern "C" __global__ void __launch_bounds__(WARPS * 32, MINB)
rq_decode_tc_split(const Args A) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int hk = blockIdx.x, b = blockIdx.y;
  const int split = blockIdx.z * WARPS + warp;
  if (split >= A.num_splits) return;
  const int64_t base = A.kv_indptr[b];
  const int seq = A.kv_indptr[b + 1] - (int)base;
  const int per_split = ((seq + A.num_splits - 1) / A.num_splits + TILE - 1) / TILE * TILE;
  const int lo = split * per_split;
  const int hi = min(lo + per_split, seq);

  // ---- this thread's rows: g = (head h, group grp) when g < ROWS; its K slice t is group gt
  const int gt = (32 * t) / GS;
  const int grp = g % NG;
  const int h = g / NG;
  const bool row_ok = g < ROWS;
  const bool a_rows = row_ok && grp == gt;  // this thread's query slice feeds row g

  // ---- query fragments (pre-divided by 2^pos) and the folds 128 * sum q, sum q per row
  uint32_t qa[8][2];
#if R_BITS > 0
  uint32_t qr[8][2];
#endif
  float fold_a = 0.f, fold_r = 0.f, qsum = 0.f;
  {
    const float* qh = A.q + ((int64_t)b * A.num_qo_heads + hk * GQ + (row_ok ? h : 0)) * D + 32 * t;
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      float v[2];
#if R_BITS > 0
      float w[2];
#endif
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float x = a_rows ? bf16_lo(pack_bf16(qh[k_elem<A_BITS>(r, half)], 0.f)) : 0.f;
        v[half] = x * pos_scale<A_BITS>(r % (16 / A_BITS));
        qsum += x;
#if R_BITS > 0
        const float y = a_rows ? bf16_lo(pack_bf16(qh[k_elem<R_BITS>(r, half)], 0.f)) : 0.f;
        w[half] = y * pos_scale<R_BITS>(r % (16 / R_BITS));
#endif
      }
      qa[r / 2][r % 2] = pack_bf16(v[0], v[1]);
      fold_a += 128.f * (v[0] + v[1]);
#if R_BITS > 0
      qr[r / 2][r % 2] = pack_bf16(w[0], w[1]);
      fold_r += 128.f * (w[0] + w[1]);
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

  float cv[16][4];
#pragma unroll
  for (int l = 0; l < 16; ++l) cv[l][0] = cv[l][1] = cv[l][2] = cv[l][3] = 0.f;
  float m_run = -INFINITY, l_run = 0.f, sw_a = 0.f, sw_r = 0.f, m_off = 0.f;

  TileRaw cur, nxt;
  if (lo < hi) load_tile(A, hk, base, lo, hi, g, t, cur);
  for (int n = lo; n < hi; n += TILE) {
    load_meta(A, hk, g, row_ok, cur);
    if (n + TILE < hi) load_tile(A, hk, base, n + TILE, hi, g, t, nxt);

    // ---- K: X[row, tok] for tokens g (n-tile 0) and 8 + g (n-tile 1)
    float ck[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      ck[i][0] = ck[i][1] = ck[i][2] = ck[i][3] = 0.f;
      uint32_t u[16];
      unpack_k<A_BITS>(cur.ka[i], u);
#pragma unroll
      for (int s = 0; s < 8; ++s) mma_bf16(ck[i], qa[s][0], 0u, qa[s][1], 0u, u[2 * s], u[2 * s + 1]);
#if R_BITS > 0
      unpack_k<R_BITS>(cur.kr[i], u);
#pragma unroll
      for (int s = 0; s < 8; ++s) mma_bf16(ck[i], 0u, qr[s][0], 0u, qr[s][1], u[2 * s], u[2 * s + 1]);
#endif
    }

    // ---- logits of tokens 2t + (i & 1) + 8 (i >> 1), summed over the groups of head h
    float qk[4], cvv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float xa = ck[i >> 1][i & 1], xr = ck[i >> 1][2 + (i & 1)];
      const float2 sa = fp8x2(cur.kso_a[i]);
#if HAS_COEF
      const float c_k = bf16_lo(cur.ck[i]);
      cvv[i] = bf16_lo(cur.cv[i]);
#else
      const float c_k = 1.f;
      cvv[i] = 1.f;
#endif
      float lg = c_k * (sa.x * (xa - fold_a) + sa.y * qsum);
#if R_BITS > 0
      const float2 sr = fp8x2(cur.kso_r[i]);
      lg += sr.x * (xr - fold_r) + sr.y * qsum;
#else
      (void)xr;
#endif
      qk[i] = row_ok ? lg : 0.f;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (NG >= 2) qk[i] += __shfl_xor_sync(0xffffffffu, qk[i], 4);
      if (NG >= 4) qk[i] += __shfl_xor_sync(0xffffffffu, qk[i], 8);
      const int tok = n + 2 * t + (i & 1) + 8 * (i >> 1);
      qk[i] = (row_ok && tok < hi) ? qk[i] * A.qk_scale : -INFINITY;
    }
    float mt = fmaxf(fmaxf(qk[0], qk[1]), fmaxf(qk[2], qk[3]));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
    // lazy rescaling: keep the running max unless a row's tile max exceeds it by 2^8
    if (__any_sync(0xffffffffu, mt > m_run + 8.f)) {
      const float m_new = fmaxf(m_run, mt);
      const float f = m_new == -INFINITY ? 1.f : exp2f(m_run - m_new);
#pragma unroll
      for (int l = 0; l < 16; ++l) {
        cv[l][0] *= f; cv[l][1] *= f; cv[l][2] *= f; cv[l][3] *= f;
      }
      l_run *= f; sw_a *= f; sw_r *= f; m_off *= f;
      m_run = m_new;
    }

    // ---- weights W = p c s_a (rows 0-7) and p s_r (rows 8-15), as the V MMA's A fragments
    float wa[4];
#if R_BITS > 0
    float wr[4];
#endif
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float p = qk[i] == -INFINITY ? 0.f : exp2f(qk[i] - m_run);
      const float2 sa = fp8x2(cur.vso_a[i]);
      wa[i] = p * cvv[i] * sa.x;
      float off = cvv[i] * sa.y;
#if R_BITS > 0
      const float2 sr = fp8x2(cur.vso_r[i]);
      wr[i] = p * sr.x;
      off += sr.y;
#endif
      l_run += p;
      m_off += p * off;
    }
    const uint32_t wa01 = pack_bf16(wa[0], wa[1]), wa89 = pack_bf16(wa[2], wa[3]);
    sw_a += bf16_lo(wa01) + bf16_hi(wa01) + bf16_lo(wa89) + bf16_hi(wa89);
#if R_BITS > 0
    const uint32_t wr01 = pack_bf16(wr[0], wr[1]), wr89 = pack_bf16(wr[2], wr[3]);
    sw_r += bf16_lo(wr01) + bf16_hi(wr01) + bf16_lo(wr89) + bf16_hi(wr89);
#endif

    // ---- V: 16 n-tiles of 8 elements; column c of n-tile l is element 16 c + l
    {
      uint32_t u01[16], u89[16];
      unpack_v<A_BITS>(cur.va[0], cur.va[1], u01);
      unpack_v<A_BITS>(cur.va[2], cur.va[3], u89);
#pragma unroll
      for (int l = 0; l < 16; ++l) mma_bf16(cv[l], wa01, 0u, wa89, 0u, u01[l], u89[l]);
#if R_BITS > 0
      unpack_v<R_BITS>(cur.vr[0], cur.vr[1], u01);
      unpack_v<R_BITS>(cur.vr[2], cur.vr[3], u89);
#pragma unroll
      for (int l = 0; l < 16; ++l) mma_bf16(cv[l], 0u, wr01, 0u, wr89, u01[l], u89[l]);
#endif
    }
    if (n + TILE < hi) {
      cur.slot_v[0] = nxt.slot_v[0]; cur.slot_v[1] = nxt.slot_v[1];
      cur.slot_v[2] = nxt.slot_v[2]; cur.slot_v[3] = nxt.slot_v[3];
      cur.ka[0] = nxt.ka[0]; cur.ka[1] = nxt.ka[1];
      cur.va[0] = nxt.va[0]; cur.va[1] = nxt.va[1]; cur.va[2] = nxt.va[2]; cur.va[3] = nxt.va[3];
#if R_BITS > 0
      cur.kr[0] = nxt.kr[0]; cur.kr[1] = nxt.kr[1];
      cur.vr[0] = nxt.vr[0]; cur.vr[1] = nxt.vr[1]; cur.vr[2] = nxt.vr[2]; cur.vr[3] = nxt.vr[3];
#endif
    }
  }

  // ---- reduce the row sums over the quad, write this split's output and (max, sum)
#pragma unroll
  for (int x = 1; x <= 2; x <<= 1) {
    l_run += __shfl_xor_sync(0xffffffffu, l_run, x);
    sw_a += __shfl_xor_sync(0xffffffffu, sw_a, x);
    sw_r += __shfl_xor_sync(0xffffffffu, sw_r, x);
    m_off += __shfl_xor_sync(0xffffffffu, m_off, x);
  }
  const int64_t row = ((int64_t)b * A.num_qo_heads + hk * GQ + h) * A.num_splits + split;
  if (row_ok) {
    float* o = A.mid_o + row * D;
#pragma unroll
    for (int l = 0; l < 16; ++l) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int e = 16 * (2 * t + c) + l;
        if (e / GS != grp) continue;
        constexpr int HA = 16 / A_BITS;
        float v = (cv[l][c] - 128.f * sw_a) * pos_scale<A_BITS>(l % HA);
#if R_BITS > 0
        constexpr int HR = 16 / R_BITS;
        v += (cv[l][2 + c] - 128.f * sw_r) * pos_scale<R_BITS>(l % HR);
#endif
        o[e] = v + m_off;
      }
    }
    if (grp == 0 && t == 0) {
      A.mid_ml[row * 2] = lo < hi ? m_run : -1.0e30f;
      A.mid_ml[row * 2 + 1] = l_run;
    }
  }
}
