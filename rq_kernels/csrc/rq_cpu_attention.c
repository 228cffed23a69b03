/*
 * CPU attention over the compressed history of the ResidualQuant KV cache.
 *
 * One call handles one (layer, loop) of a batch: for every request b, every KV head h and every
 * query row of the request, softmax(q' K'^T * scale) V' over the request's history rows, where
 * K'/V' are the loop's K/V in the rotated basis, rebuilt block by block in an L1-resident
 * scratch (anchor, then c_i * x + residual along the loop's base chain; DESIGN.md section 1) and
 * never written back. The caller rotates q into that basis, un-rotates the output and merges the
 * in-flight chunk through the returned log-sum-exp (rq_kernels/cpu_attention.py).
 *
 * Pool layout (sglang_rq/pool.py), per stored loop of the layer:
 *   codes [rows, 2, H, code_bytes] uint8, codes of element e at bits (e % per) * bits of byte
 *         e / per (per = 8 / bits),
 *   scale_offset  [rows, 2, H, D/g, 2] uint8, FP8 e4m3fn (scale, offset) per quantization group,
 *   coef  [rows, 2, H] bf16, least-squares coefficient c_i (residual loops, LSQ on).
 * Strides are in elements of each buffer's dtype. Standard C11 + OpenMP; no Python headers.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RQ_MAX_CHAIN 16
#define RQ_BLOCK_N 32   /* history tokens rebuilt per scratch block */
#define RQ_MAX_D 256

/* One stored loop of one layer in the pool (attention reads it, commit writes it). */
typedef struct {
    uint8_t *codes;
    int64_t codes_row, codes_kv, codes_head;
    uint8_t *scale_offset;        /* NULL: no scale/offset (0-bit loop) */
    int64_t scale_offset_row, scale_offset_kv, scale_offset_head;
    uint16_t *coef;       /* NULL: c = 1 */
    int64_t coef_row, coef_kv, coef_head;
    int32_t bits;         /* 0, 2, 4 or 8 */
    int32_t base;         /* loop id of the base (== own id for an anchor); read by commit */
} rq_stored_loop;

static float fp8_e4m3fn_table[256];
static int fp8_table_ready = 0;

static void build_fp8_table(void) {
    for (int b = 0; b < 256; ++b) {
        int sign = b >> 7, ex = (b >> 3) & 15, man = b & 7;
        float v;
        if (ex == 15 && man == 7) v = NAN;
        else if (ex == 0) v = ldexpf((float)man / 8.0f, -6);
        else v = ldexpf(1.0f + (float)man / 8.0f, ex - 7);
        fp8_e4m3fn_table[b] = sign ? -v : v;
    }
    fp8_table_ready = 1;
}

static inline float bf16_to_float(uint16_t x) {
    union { uint32_t u; float f; } c;
    c.u = (uint32_t)x << 16;
    return c.f;
}

/*
 * Element order. Within each quantization group of G elements, a byte holds per = 8 / bits
 * consecutive elements, so the group's codes unpack contiguously in "plane" order: position
 * k * (G / per) + i holds element per * i + k (plane k = bits k*bits.. of every byte of the
 * group). Dot products do not depend on the order, so the query is permuted into plane order
 * once per call and the codes are never interleaved back; V accumulates in plane order and is
 * un-permuted once per output row.
 */
static inline int64_t plane_element(int64_t pos, int bits, int64_t G) {
    const int64_t per = 8 / bits, sub = G / per, g0 = pos - pos % G, p = pos % G;
    return g0 + per * (p % sub) + p / sub;
}

/* GCC/Clang vector extensions: 8 codes at a time, widened and converted in registers (AVX2
 * vpmovzxbd + vcvtdq2ps, NEON on aarch64) instead of the byte-by-byte inserts the compiler
 * emits for the scalar loops. */
typedef uint8_t u8x8 __attribute__((vector_size(8)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef float f32x8 __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) void put8(float *dst, u8x8 c, float sc) {
    f32x8 f = __builtin_convertvector(__builtin_convertvector(c, i32x8), f32x8) * sc;
    memcpy(dst, &f, sizeof f);
}

static inline __attribute__((always_inline)) f32x8 load8f(const float *p) {
    f32x8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* a . b with four independent vector accumulators: one accumulator would chain D/8 dependent
 * FMAs (4-cycle latency each), which dominated the K side. */
static inline __attribute__((always_inline)) float dot_f32(const float *restrict a,
                                                           const float *restrict b, int64_t D) {
    f32x8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    int64_t e = 0;
    for (; e + 32 <= D; e += 32) {
        s0 += load8f(a + e) * load8f(b + e);
        s1 += load8f(a + e + 8) * load8f(b + e + 8);
        s2 += load8f(a + e + 16) * load8f(b + e + 16);
        s3 += load8f(a + e + 24) * load8f(b + e + 24);
    }
    for (; e + 8 <= D; e += 8) s0 += load8f(a + e) * load8f(b + e);
    const f32x8 t = (s0 + s1) + (s2 + s3);
    float r = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
    for (; e < D; ++e) r += a[e] * b[e];
    return r;
}

/* One group's codes (PER codes per byte, G a compile-time constant in the callers) ->
 * dst[G] = sc * code in plane order. */
static inline __attribute__((always_inline)) void unpack_group(const uint8_t *restrict c, float sc,
                                                               const int PER, const int64_t G,
                                                               float *restrict d) {
    const int64_t sub = G / PER;  /* codes per plane */
    const int bits = 8 / PER;
    const uint8_t mask = (uint8_t)((1 << bits) - 1);
    if (sub % 8 == 0) {
        for (int64_t i = 0; i < sub; i += 8) {
            u8x8 v;
            memcpy(&v, c + i, sizeof v);
            for (int k = 0; k < PER; ++k) put8(d + k * sub + i, (v >> (k * bits)) & mask, sc);
        }
    } else {
        for (int k = 0; k < PER; ++k)
            for (int64_t i = 0; i < sub; ++i) d[k * sub + i] = sc * (float)((c[i] >> (k * bits)) & mask);
    }
}

/* codes of one (row, kv, head) -> dst[D] = scale_g * code in plane order, off[g] = offset_g */
static inline __attribute__((always_inline)) void
unpack_scaled(const uint8_t *restrict src, const uint8_t *restrict scale_offset, int bits,
              int64_t D, const int64_t G, float *restrict dst, float *restrict off) {
    for (int64_t g0 = 0, gi = 0; g0 < D; g0 += G, ++gi) {
        const float sc = fp8_e4m3fn_table[scale_offset[2 * gi]];
        off[gi] = fp8_e4m3fn_table[scale_offset[2 * gi + 1]];
        if (bits == 4) unpack_group(src + (g0 >> 1), sc, 2, G, dst + g0);
        else if (bits == 2) unpack_group(src + (g0 >> 2), sc, 4, G, dst + g0);
        else unpack_group(src + g0, sc, 1, G, dst + g0);
    }
}

/* Software prefetch of a later history row: the rows of one KV head are 2*H*code_bytes apart
 * and several streams (codes, scale_offset, coefficients of every stored loop) interleave, more
 * than the hardware prefetchers follow; without it the unpack waits on the codes' cache misses. */
#define RQ_PREFETCH_AHEAD 4

static inline const uint8_t *loop_codes(const rq_stored_loop *L, int64_t row, int kv, int64_t h) {
    return L->codes + row * L->codes_row + kv * L->codes_kv + h * L->codes_head;
}

static inline const uint8_t *loop_scale_offset(const rq_stored_loop *L, int64_t row, int kv,
                                               int64_t h) {
    return L->scale_offset + row * L->scale_offset_row + kv * L->scale_offset_kv +
           h * L->scale_offset_head;
}

/* Weight of each chain member in x = deq_0 + c_0 (deq_1 + c_1 (... deq_anchor)):
 * w_0 = 1, w_k = c_0 ... c_{k-1} (c of member i = its least-squares coefficient, 1 without). */
static inline void prefetch_row(const rq_stored_loop *chain, int n, int64_t row, int kv,
                                int64_t h) {
    for (int k = 0; k < n; ++k) {
        const rq_stored_loop *L = &chain[k];
        if (L->bits) {
            __builtin_prefetch(loop_codes(L, row, kv, h));
            __builtin_prefetch(loop_scale_offset(L, row, kv, h));
        }
        if (L->coef) __builtin_prefetch(L->coef + row * L->coef_row + kv * L->coef_kv + h * L->coef_head);
    }
}

static inline void chain_weights(const rq_stored_loop *chain, int n, int64_t row, int kv,
                                 int64_t h, float *w) {
    w[0] = 1.0f;
    for (int k = 1; k < n; ++k) {
        const rq_stored_loop *L = &chain[k - 1];
        const float c = L->coef ? bf16_to_float(L->coef[row * L->coef_row + kv * L->coef_kv + h * L->coef_head]) : 1.0f;
        w[k] = w[k - 1] * c;
    }
}

/* Fused paths for one query row (decode with MHA): the codes are converted in registers and
 * consumed at once, no scratch row. K: sum_g s_g (q'_g . codes_g) + m_g sum(q'_g), with the
 * group's partial dot kept in vector registers and scaled by s_g before one final reduction. */
static inline __attribute__((always_inline)) float k_dot_fused(const uint8_t *restrict codes,
                                                              const uint8_t *restrict scale_offset,
                                                              const float *restrict qk,
                                                              const float *restrict qsum,
                                                              const int PER, const int64_t D,
                                                              const int64_t G) {
    const int64_t sub = G / PER;
    const int bits = 8 / PER;
    const uint8_t mask = (uint8_t)((1 << bits) - 1);
    f32x8 tot = {0};
    float offs = 0.0f, tail = 0.0f;
    for (int64_t g0 = 0, gi = 0; g0 < D; g0 += G, ++gi) {
        const float sc = fp8_e4m3fn_table[scale_offset[2 * gi]];
        offs += fp8_e4m3fn_table[scale_offset[2 * gi + 1]] * qsum[gi];
        const uint8_t *restrict c = codes + g0 / PER;
        const float *restrict qg = qk + g0;
        if (sub % 8 == 0) {
            f32x8 a0 = {0}, a1 = {0};
            for (int64_t i = 0; i < sub; i += 8) {
                u8x8 v;
                memcpy(&v, c + i, sizeof v);
                for (int k = 0; k < PER; ++k) {
                    const u8x8 cv = (v >> (k * bits)) & mask;
                    const f32x8 f = __builtin_convertvector(__builtin_convertvector(cv, i32x8), f32x8);
                    if (k & 1) a1 += load8f(qg + k * sub + i) * f;
                    else a0 += load8f(qg + k * sub + i) * f;
                }
            }
            tot += sc * (a0 + a1);
        } else {
            float a = 0.0f;
            for (int k = 0; k < PER; ++k)
                for (int64_t i = 0; i < sub; ++i) a += qg[k * sub + i] * (float)((c[i] >> (k * bits)) & mask);
            tail += sc * a;
        }
    }
    return (((tot[0] + tot[1]) + (tot[2] + tot[3])) + ((tot[4] + tot[5]) + (tot[6] + tot[7]))) + tail + offs;
}

/* V: ar[D] += pw * s_g * codes (plane order), offr[g] += pw * m_g. */
static inline __attribute__((always_inline)) void v_axpy_fused(const uint8_t *restrict codes,
                                                              const uint8_t *restrict scale_offset,
                                                              float pw, float *restrict ar,
                                                              float *restrict offr, const int PER,
                                                              const int64_t D, const int64_t G) {
    const int64_t sub = G / PER;
    const int bits = 8 / PER;
    const uint8_t mask = (uint8_t)((1 << bits) - 1);
    for (int64_t g0 = 0, gi = 0; g0 < D; g0 += G, ++gi) {
        const float a = pw * fp8_e4m3fn_table[scale_offset[2 * gi]];
        offr[gi] += pw * fp8_e4m3fn_table[scale_offset[2 * gi + 1]];
        const uint8_t *restrict c = codes + g0 / PER;
        float *restrict dg = ar + g0;
        if (sub % 8 == 0) {
            for (int64_t i = 0; i < sub; i += 8) {
                u8x8 v;
                memcpy(&v, c + i, sizeof v);
                for (int k = 0; k < PER; ++k) {
                    const u8x8 cv = (v >> (k * bits)) & mask;
                    const f32x8 f = load8f(dg + k * sub + i)
                        + a * __builtin_convertvector(__builtin_convertvector(cv, i32x8), f32x8);
                    memcpy(dg + k * sub + i, &f, sizeof f);
                }
            }
        } else {
            for (int k = 0; k < PER; ++k)
                for (int64_t i = 0; i < sub; ++i) dg[k * sub + i] += a * (float)((c[i] >> (k * bits)) & mask);
        }
    }
}

typedef struct {
    int64_t HQ, GQ, QT, D, n;
    const float *q;
    const int64_t *qo_indptr, *kv_indptr, *kv_indices;
    const rq_stored_loop *chain;
    float sm_scale;
    float *out, *lse;
} rq_problem;

/* One work item (request b, KV head h, query rows t0..t0+QT of b); G is a compile-time
 * constant in the specialised callers below, so the group loops are straight-line vector code. */
static inline __attribute__((always_inline)) void attend_item(const rq_problem *P,
                                                              const int64_t *itm, float *scratch,
                                                              const int64_t G) {
    const int64_t HQ = P->HQ, GQ = P->GQ, QT = P->QT, D = P->D, n = P->n, NG = D / G, M = QT * GQ;
    const float *q = P->q, sm_scale = P->sm_scale;
    const int64_t *qo_indptr = P->qo_indptr, *kv_indptr = P->kv_indptr, *kv_indices = P->kv_indices;
    const rq_stored_loop *chain = P->chain;
    float *out = P->out, *lse = P->lse;
    float *qp = scratch, *acc = qp + M * n * D, *qs = acc + M * n * D, *off = qs + M * n * NG;
    float *s = off + M * NG, *mx = s + M * RQ_BLOCK_N, *l = mx + M, *tmp = l + M;
    float *w = tmp + D, *goff = w + RQ_BLOCK_N * n;
    const int64_t b = itm[0], h = itm[1], t0 = itm[2];
    const int64_t q0 = qo_indptr[b] + t0, left = qo_indptr[b + 1] - q0;
    const int64_t rows = (left < QT ? left : QT) * GQ;
    const int64_t p0 = kv_indptr[b], np = kv_indptr[b + 1] - kv_indptr[b];
    /* row r = (t, g): query row q0 + r / GQ, head h * GQ + r % GQ */
    for (int64_t r = 0; r < rows; ++r) {
        const float *qr = q + ((q0 + r / GQ) * HQ + h * GQ + r % GQ) * D;
        for (int64_t k = 0; k < n; ++k) {
            float *dst = qp + (r * n + k) * D;
            const int bits = chain[k].bits ? chain[k].bits : 8;
            for (int64_t pos = 0; pos < D; ++pos) dst[pos] = qr[plane_element(pos, bits, G)];
            for (int64_t g = 0; g < NG; ++g) {
                float sum = 0.0f;
                for (int64_t e = 0; e < G; ++e) sum += dst[g * G + e];
                qs[(r * n + k) * NG + g] = sum;
            }
        }
        mx[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(acc, 0, sizeof(float) * (size_t)(rows * n * D));
    memset(off, 0, sizeof(float) * (size_t)(rows * NG));
    for (int64_t j0 = 0; j0 < np; j0 += RQ_BLOCK_N) {
        const int64_t nb = np - j0 < RQ_BLOCK_N ? np - j0 : RQ_BLOCK_N;
        /* K side: logits of the block */
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < nb; ++j) s[r * RQ_BLOCK_N + j] = 0.0f;
        for (int64_t j = 0; j < nb; ++j) {
            const int64_t row = kv_indices[p0 + j0 + j];
            if (j0 + j + RQ_PREFETCH_AHEAD < np)
                prefetch_row(chain, (int)n, kv_indices[p0 + j0 + j + RQ_PREFETCH_AHEAD], 0, h);
            chain_weights(chain, (int)n, row, 0, h, w + j * n);
            for (int64_t k = 0; k < n; ++k) {
                const rq_stored_loop *L = &chain[k];
                if (!L->bits) continue;
                const float wk = w[j * n + k];
                if (rows == 1) {
                    const uint8_t *cd = loop_codes(L, row, 0, h);
                    const uint8_t *mt = loop_scale_offset(L, row, 0, h);
                    const float *qk = qp + k * D, *qsum = qs + k * NG;
                    const float dot = L->bits == 4 ? k_dot_fused(cd, mt, qk, qsum, 2, D, G)
                                    : L->bits == 2 ? k_dot_fused(cd, mt, qk, qsum, 4, D, G)
                                                   : k_dot_fused(cd, mt, qk, qsum, 1, D, G);
                    s[j] += wk * dot;
                    continue;
                }
                unpack_scaled(loop_codes(L, row, 0, h), loop_scale_offset(L, row, 0, h), L->bits,
                              D, G, tmp, goff);
                for (int64_t r = 0; r < rows; ++r) {
                    const float *restrict qk = qp + (r * n + k) * D;
                    const float *restrict qsum = qs + (r * n + k) * NG;
                    float dot = dot_f32(qk, tmp, D);
                    for (int64_t g = 0; g < NG; ++g) dot += goff[g] * qsum[g];
                    s[r * RQ_BLOCK_N + j] += wk * dot;
                }
            }
        }
        /* online softmax: logits -> probabilities of the block, rescale accumulators */
        for (int64_t r = 0; r < rows; ++r) {
            float *sr = s + r * RQ_BLOCK_N, bmax = -INFINITY;
            for (int64_t j = 0; j < nb; ++j) {
                sr[j] *= sm_scale;
                bmax = sr[j] > bmax ? sr[j] : bmax;
            }
            const float mnew = mx[r] > bmax ? mx[r] : bmax, alpha = expf(mx[r] - mnew);
            float psum = 0.0f;
            for (int64_t j = 0; j < nb; ++j) {
                sr[j] = expf(sr[j] - mnew);
                psum += sr[j];
            }
            if (alpha != 1.0f) {
                float *ar = acc + r * n * D;
                for (int64_t e = 0; e < n * D; ++e) ar[e] *= alpha;
                for (int64_t g = 0; g < NG; ++g) off[r * NG + g] *= alpha;
            }
            l[r] = l[r] * alpha + psum;
            mx[r] = mnew;
        }
        /* V side */
        for (int64_t j = 0; j < nb; ++j) {
            const int64_t row = kv_indices[p0 + j0 + j];
            if (j0 + j + RQ_PREFETCH_AHEAD < np)
                prefetch_row(chain, (int)n, kv_indices[p0 + j0 + j + RQ_PREFETCH_AHEAD], 1, h);
            chain_weights(chain, (int)n, row, 1, h, w + j * n);
            for (int64_t k = 0; k < n; ++k) {
                const rq_stored_loop *L = &chain[k];
                if (!L->bits) continue;
                const float wk = w[j * n + k];
                if (rows == 1) {
                    const uint8_t *cd = loop_codes(L, row, 1, h);
                    const uint8_t *mt = loop_scale_offset(L, row, 1, h);
                    const float pw = s[j] * wk;
                    float *ar = acc + k * D;
                    if (L->bits == 4) v_axpy_fused(cd, mt, pw, ar, off, 2, D, G);
                    else if (L->bits == 2) v_axpy_fused(cd, mt, pw, ar, off, 4, D, G);
                    else v_axpy_fused(cd, mt, pw, ar, off, 1, D, G);
                    continue;
                }
                unpack_scaled(loop_codes(L, row, 1, h), loop_scale_offset(L, row, 1, h), L->bits,
                              D, G, tmp, goff);
                for (int64_t r = 0; r < rows; ++r) {
                    const float pw = s[r * RQ_BLOCK_N + j] * wk;
                    float *restrict ar = acc + (r * n + k) * D;
#pragma omp simd
                    for (int64_t e = 0; e < D; ++e) ar[e] += pw * tmp[e];
                    for (int64_t g = 0; g < NG; ++g) off[r * NG + g] += pw * goff[g];
                }
            }
        }
    }
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t o = (q0 + r / GQ) * HQ + h * GQ + r % GQ;
        float *orow = out + o * D;
        if (np == 0) {
            memset(orow, 0, sizeof(float) * (size_t)D);
            lse[o] = -INFINITY;
            continue;
        }
        const float inv = 1.0f / l[r];
        for (int64_t e = 0; e < D; ++e) orow[e] = off[r * NG + e / G];
        for (int64_t k = 0; k < n; ++k) {
            if (!chain[k].bits) continue;
            const float *ar = acc + (r * n + k) * D;
            for (int64_t pos = 0; pos < D; ++pos) orow[plane_element(pos, chain[k].bits, G)] += ar[pos];
        }
        for (int64_t e = 0; e < D; ++e) orow[e] *= inv;
        lse[o] = mx[r] + logf(l[r]);
    }
}

static void attend_item_g16(const rq_problem *P, const int64_t *itm, float *scratch) {
    attend_item(P, itm, scratch, 16);
}
static void attend_item_g32(const rq_problem *P, const int64_t *itm, float *scratch) {
    attend_item(P, itm, scratch, 32);
}
static void attend_item_g64(const rq_problem *P, const int64_t *itm, float *scratch) {
    attend_item(P, itm, scratch, 64);
}
static void attend_item_any(const rq_problem *P, const int64_t *itm, float *scratch, int64_t G) {
    attend_item(P, itm, scratch, G);
}

/* 1 if any of the n pool rows idx[0..n) is outside [0, rows) (one pass, no early exit, so
 * the compiler vectorizes it). */
static int rows_out_of_range(const int64_t *idx, int64_t n, int64_t rows) {
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) bad |= (uint64_t)idx[i] >= (uint64_t)rows;
    return bad;
}

/*
 * q      [T, HQ, D] float32 contiguous, rotated basis (q'_h = q_h R[h_kv]).
 * out    [T, HQ, D] float32 contiguous: softmax-normalised history attention (rotated basis);
 *        rows of requests without history are 0.
 * lse    [T, HQ] float32: natural-log log-sum-exp of the scaled history logits (-inf if none).
 * qo_indptr [B+1], kv_indptr [B+1], kv_indices [nnz] int64.
 * chain  n stored loops, attended loop first, anchor last.
 *
 * Per history token and chain member k with scale s_g and offset m_g per group g:
 *   q' . x = sum_k w_k sum_g (s_g (q'_g . codes_g) + m_g sum(q'_g))        (K side)
 *   sum_t p_t x_t = sum_k sum_t p_t w_k (s_g codes_g + m_g)                (V side)
 * so codes are only unpacked and multiplied, never rebuilt into K'/V' rows.
 * T query rows, nnz entries of kv_indices, rows pool rows: checked before any work.
 * Returns 0, or a negative error code (-1: D > RQ_MAX_D, G does not divide D or HKV does not
 * divide HQ; -2: n out of range or a member with unsupported bits; -3: allocation failed;
 * -4: qo_indptr is not 0, ..., T non-decreasing; -5: kv_indptr is not non-decreasing from 0
 * to at most nnz; -6: a kv_indices entry it covers is outside [0, rows)).
 */
int rq_history_attention(int64_t B, int64_t T, int64_t nnz, int64_t rows, int64_t HQ,
                         int64_t HKV, int64_t D, int64_t G, const float *q,
                         const int64_t *qo_indptr, const int64_t *kv_indptr,
                         const int64_t *kv_indices, const rq_stored_loop *chain, int64_t n,
                         float sm_scale, float *out, float *lse) {
    if (D > RQ_MAX_D || G <= 0 || D % G != 0 || HQ % HKV != 0) return -1;
    if (n < 1 || n > RQ_MAX_CHAIN) return -2;
    if (B < 0 || qo_indptr[0] != 0 || qo_indptr[B] != T) return -4;
    if (kv_indptr[0] < 0 || kv_indptr[B] > nnz) return -5;
    for (int64_t b = 0; b < B; ++b) {
        if (qo_indptr[b + 1] < qo_indptr[b]) return -4;
        if (kv_indptr[b + 1] < kv_indptr[b]) return -5;
    }
    if (rows_out_of_range(kv_indices + kv_indptr[0], kv_indptr[B] - kv_indptr[0], rows)) return -6;
    for (int64_t k = 0; k < n; ++k) {
        const int bits = chain[k].bits;
        if (!(bits == 0 || bits == 2 || bits == 4 || bits == 8) || (bits && !chain[k].scale_offset))
            return -2;
        if (bits && G % (8 / bits) != 0) return -1;
    }
    if (!fp8_table_ready) build_fp8_table();
    const int64_t GQ = HQ / HKV, NG = D / G;
    const int64_t QT = GQ >= 64 ? 1 : 64 / GQ;  /* query rows per work item */
    int64_t items = 0;
    for (int64_t b = 0; b < B; ++b) items += HKV * ((qo_indptr[b + 1] - qo_indptr[b] + QT - 1) / QT);
    int64_t *item = (int64_t *)malloc(sizeof(int64_t) * (size_t)(items + 1) * 3);
    if (!item) return -3;
    int64_t it = 0;
    for (int64_t b = 0; b < B; ++b) {
        const int64_t nq = qo_indptr[b + 1] - qo_indptr[b];
        for (int64_t h = 0; h < HKV; ++h)
            for (int64_t t0 = 0; t0 < nq; t0 += QT) {
                item[3 * it] = b; item[3 * it + 1] = h; item[3 * it + 2] = t0; ++it;
            }
    }
    const rq_problem P = {HQ, GQ, QT, D, n, q, qo_indptr, kv_indptr, kv_indices, chain, sm_scale,
                          out, lse};
    int failed = 0;
#pragma omp parallel
    {
        const int64_t M = QT * GQ;  /* rows of one item: query rows x query heads of the KV head */
        /* per thread: qp [M, n, D] permuted queries, qs [M, n, NG] group sums, acc [M, n, D],
         * off [M, NG] offsets, s [M, BN] logits, mx/l [M], tmp [D], w [BN, n] */
        const size_t floats = (size_t)(M * n * D * 2 + M * n * NG + M * NG + M * RQ_BLOCK_N + 2 * M
                                       + D + RQ_BLOCK_N * n + RQ_MAX_D);
        float *scratch = (float *)malloc(sizeof(float) * floats);
        if (!scratch) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t wi = 0; wi < items; ++wi) {
            if (!scratch) continue;
            switch (G) {
            case 16: attend_item_g16(&P, item + 3 * wi, scratch); break;
            case 32: attend_item_g32(&P, item + 3 * wi, scratch); break;
            case 64: attend_item_g64(&P, item + 3 * wi, scratch); break;
            default: attend_item_any(&P, item + 3 * wi, scratch, G);
            }
        }
        free(scratch);
    }
    free(item);
    return failed ? -3 : 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Commit: quantize every loop of new tokens into the pool (the reference codec's arithmetic,  */
/* sglang_rq/reference.py `encode`, in its order; DESIGN.md section 1).                       */

/* Largest (down) or smallest (up) FP8 e4m3fn value <= / >= x, x clamped to +-448, as a byte.
 * Zero keeps the sign of a zero x (what torch's cast of the same float stores). */
static uint8_t fp8_round_byte(float x, int up) {
    if (x != x) return 0x7f;
    if (x > 448.0f) x = 448.0f;
    if (x < -448.0f) x = -448.0f;
    if (x == 0.0f) return signbit(x) ? 0x80 : 0x00;
    /* positive magnitudes: codes 0x00..0x7e are increasing */
    const float a = fabsf(x);
    int lo = 0, hi = 0x7e;  /* largest code with value <= a */
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (fp8_e4m3fn_table[mid] <= a) lo = mid; else hi = mid - 1;
    }
    int code = lo;  /* value <= a */
    const int exact = fp8_e4m3fn_table[code] == a;
    const int toward_zero = (x > 0) ? !up : up;  /* down on positives / up on negatives */
    if (!exact && !toward_zero) code += 1;       /* away from zero: next code up in magnitude */
    if (code == 0) return (x > 0) ? 0x00 : 0x80;
    return (uint8_t)(x > 0 ? code : (code | 0x80));
}

static inline uint16_t float_to_bf16_rne(float f) {
    union { float f; uint32_t u; } c = {f};
    if ((c.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((c.u >> 16) | 0x40);  /* NaN */
    const uint32_t rounding = 0x7fffu + ((c.u >> 16) & 1u);
    return (uint16_t)((c.u + rounding) >> 16);
}

/* Quantize x[D] with `bits` in groups of G into packed codes, scale_offset bytes, and deq[D]. */
static void quantize_pack(const float *x, int bits, int64_t D, int64_t G, uint8_t *codes,
                          uint8_t *scale_offset, float *deq) {
    const int per = 8 / bits;
    const float levels = (float)((1 << bits) - 1);
    memset(codes, 0, (size_t)(D / per));
    for (int64_t g0 = 0, gi = 0; g0 < D; g0 += G, ++gi) {
        float mn = x[g0], mxv = x[g0];
        for (int64_t e = g0 + 1; e < g0 + G; ++e) {
            mn = x[e] < mn ? x[e] : mn;
            mxv = x[e] > mxv ? x[e] : mxv;
        }
        const uint8_t ob = fp8_round_byte(mn, 0);
        const float off = fp8_e4m3fn_table[ob];
        const float range = mxv - off;
        const uint8_t sb = fp8_round_byte(range / levels, 1);
        const float sc = fp8_e4m3fn_table[sb];
        scale_offset[2 * gi] = sb;
        scale_offset[2 * gi + 1] = ob;
        for (int64_t e = g0; e < g0 + G; ++e) {
            float q = 0.0f;
            if (sc > 0.0f) {
                const float t = (x[e] - off) / sc + 0.5f;
                q = floorf(t);
                q = q < 0.0f ? 0.0f : (q > levels ? levels : q);
            }
            const float prod = sc * q;
            deq[e] = off + prod;
            codes[e / per] |= (uint8_t)((int)q << ((e % per) * bits));
        }
    }
}

/*
 * x     [L, T, 2, H, D] float32 contiguous: every loop's K (index 0) and V (1) of T tokens,
 *       already rotated when the format rotates (the reference's `work`).
 * loc   [T] int64 pool rows.
 * loops L entries; order: L loop ids, every base before the loops stored against it.
 * lsq   1: c_i = bf16(<x_i, base> / max(<base, base>, 1e-12)) stored in coef; 0: c_i = 1.
 * rows  pool rows: every loc must be in [0, rows).
 * Returns 0, -1 (D > RQ_MAX_D, G, or L > RQ_MAX_CHAIN), -2 (bad bits), -6 (a loc outside
 * [0, rows)).
 */
int rq_commit(int64_t L, int64_t T, int64_t rows, int64_t H, int64_t D, int64_t G,
              const float *x, const int64_t *loc, const rq_stored_loop *loops,
              const int32_t *order, int32_t lsq) {
    if (D > RQ_MAX_D || G <= 0 || D % G != 0 || L < 1 || L > RQ_MAX_CHAIN) return -1;
    if (rows_out_of_range(loc, T, rows)) return -6;
    for (int64_t i = 0; i < L; ++i) {
        const int b = loops[i].bits;
        if (!(b == 0 || b == 2 || b == 4 || b == 8) || (b && G % (8 / b) != 0)) return -2;
        if (loops[i].base == i && b == 0) return -2;
    }
    if (!fp8_table_ready) build_fp8_table();
    const int64_t units = T * 2 * H;
#pragma omp parallel for schedule(static)
    for (int64_t u = 0; u < units; ++u) {
        const int64_t t = u / (2 * H), kv = (u / H) % 2, h = u % H;
        float recon[RQ_MAX_CHAIN][RQ_MAX_D], res[RQ_MAX_D], deq[RQ_MAX_D];
        uint8_t codes[RQ_MAX_D], scale_offset[RQ_MAX_D / 8 * 2 + 2];
        const int64_t row = loc[t];
        for (int64_t oi = 0; oi < L; ++oi) {
            const int64_t i = order[oi];
            const rq_stored_loop *S = &loops[i];
            const float *xi = x + (((i * T + t) * 2 + kv) * H + h) * D;
            const int64_t per = S->bits ? 8 / S->bits : 1;
            if (S->base == i) { /* anchor */
                quantize_pack(xi, S->bits, D, G, codes, scale_offset, recon[i]);
            } else {
                const float *base = recon[S->base];
                float c = 1.0f;
                uint16_t cb = 0x3f80;
                if (lsq) {
                    float num = 0.0f, den = 0.0f;
                    for (int64_t e = 0; e < D; ++e) {
                        num += xi[e] * base[e];
                        den += base[e] * base[e];
                    }
                    cb = float_to_bf16_rne(num / (den > 1e-12f ? den : 1e-12f));
                    c = bf16_to_float(cb);
                }
                for (int64_t e = 0; e < D; ++e) {
                    const float cbase = c * base[e];
                    res[e] = xi[e] - cbase;
                }
                if (S->bits) quantize_pack(res, S->bits, D, G, codes, scale_offset, deq);
                else memset(deq, 0, sizeof(float) * (size_t)D);
                for (int64_t e = 0; e < D; ++e) {
                    const float cbase = c * base[e];
                    recon[i][e] = cbase + deq[e];
                }
                if (S->coef) S->coef[row * S->coef_row + kv * S->coef_kv + h * S->coef_head] = cb;
            }
            if (S->bits) {
                memcpy(S->codes + row * S->codes_row + kv * S->codes_kv + h * S->codes_head, codes,
                       (size_t)(D / per));
                memcpy(S->scale_offset + row * S->scale_offset_row + kv * S->scale_offset_kv +
                           h * S->scale_offset_head,
                       scale_offset,
                       (size_t)(2 * (D / G)));
            }
        }
    }
    return 0;
}
