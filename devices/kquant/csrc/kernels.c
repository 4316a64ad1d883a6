/* One instruction set's kernels; built once per ISA with its compiler flags and KQ_NAME set to the table's
 * name (kq_portable, kq_avx2, kq_avx512, kq_avx512vnni). The portable C is the reference the SIMD paths are tested against
 * (and all of them against a float64 dequantize-and-dot in Python). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kquant.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#ifndef KQ_NAME
#error "build with -DKQ_NAME=<table name>"
#endif

static inline float half_to_float(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else { /* subnormal: normalize */
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while (!(mant & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

/* Q4_K / Q5_K: eight 6-bit (scale, min) pairs packed in 12 bytes */
static inline void scales_mins(const uint8_t *q, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        mn[j] = q[j + 4] & 63;
        sc[j + 4] = (q[j + 8] & 0xf) | ((q[j] >> 6) << 4);
        mn[j + 4] = (q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4);
    }
}

/* the mins' term: sum_j m_j * (sum of the activation codes of sub-block j, 32 values) */
static inline int32_t mins_term(const uint8_t mn[8], const int16_t *bsums) {
    int32_t s = 0;
    for (int j = 0; j < 8; j++) s += mn[j] * (bsums[2 * j] + bsums[2 * j + 1]);
    return s;
}

/* One block's share of a product, added as every kernel adds it (the portable C, each SIMD row kernel and
 * the tiled GEMM): the block's integer sum is exact whatever order its terms were added in, then one fused
 * multiply-add by (weight scale x activation scale) in block order. So a row's bits do not depend on the
 * kernel or on how many rows share the call (batch-invariant rows, which greedy speculative decoding needs). */
static inline float block_sum(float acc, float scale, int32_t isum) { return fmaf(scale, (float)isum, acc); }

/* ---- activations -------------------------------------------------------------------------------- */

static void quantize(const float *x, kq_block_q8 *y, int64_t k) {
    for (int64_t b = 0; b < k / KQ_QK; b++, x += KQ_QK) {
        float amax = 0.0f; /* NOTE: not fmaxf, a libm call per value without -ffast-math */
        for (int i = 0; i < KQ_QK; i++) {
            const float a = fabsf(x[i]);
            amax = a > amax || a != a ? a : amax; /* a NaN stays */
        }
        kq_block_q8 *out = &y[b];
        if (!(amax > 0.0f) || !isfinite(amax)) { /* all zero: zero products; NaN or inf: NaN ones, not garbage */
            memset(out, 0, sizeof *out);
            out->d = amax > 0.0f || amax != amax ? NAN : 0.0f;
            continue;
        }
        const float iscale = 127.0f / amax;
        if (!isfinite(iscale)) { /* amax below ~3.7e-37: a zero block, not codes of the wrong sign */
            memset(out, 0, sizeof *out);
            continue;
        }
        out->d = amax / 127.0f;
#if defined(__AVX2__)
        const __m256 vs = _mm256_set1_ps(iscale);
        for (int i = 0; i < KQ_QK; i += 32) {
            __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
            __m256i b2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), vs));
            __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 16), vs));
            __m256i d = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 24), vs));
            __m256i ab = _mm256_packs_epi32(a, b2), cd = _mm256_packs_epi32(c, d);
            __m256i q = _mm256_packs_epi16(ab, cd);
            /* packs work per 128-bit lane: restore the order of the 8 dwords */
            q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(out->qs + i), q);
        }
#else
        for (int i = 0; i < KQ_QK; i++) out->qs[i] = (int8_t)nearbyintf(x[i] * iscale);
#endif
        for (int g = 0; g < KQ_QK / 16; g++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += out->qs[16 * g + i];
            out->bsums[g] = (int16_t)s;
        }
        for (int j = 0; j < KQ_QK / 32; j++) out->bsums32[j] = (int16_t)(out->bsums[2 * j] + out->bsums[2 * j + 1]);
    }
}


/* ---- Q4_K: 144 bytes = d, dmin (f16), 12 bytes of scales and mins, 128 bytes of 4-bit codes; Q5_K: 176 =
 * the same with 32 bytes of fifth bits before the codes ---------------------------------------------- */

/* Q4_K and Q5_K (q5: its fifth bit, bit j of qh[l] for sub-block j) */
static float dot_q45_k_c(const uint8_t *w, const kq_block_q8 *y, int64_t nb, int q5) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += q5 ? 176 : 144) {
        uint8_t sc[8], mn[8];
        scales_mins(w + 4, sc, mn);
        const uint8_t *qh = w + 16, *qs = w + (q5 ? 48 : 16);
        const int8_t *ys = y[b].qs;
        int32_t isum = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = qs + 32 * (j / 2);
            const int shift = 4 * (j & 1);
            int32_t t = 0;
            for (int l = 0; l < 32; l++) {
                const int code = ((q[l] >> shift) & 0xf) | (q5 ? ((qh[l] >> j) & 1) << 4 : 0);
                t += code * ys[32 * j + l];
            }
            isum += sc[j] * t;
        }
        sum = block_sum(sum, half_to_float(w) * y[b].d, isum);
        sum = block_sum(sum, -(half_to_float(w + 2) * y[b].d), mins_term(mn, y[b].bsums));
    }
    return sum;
}

static float dot_q4_k_c(const uint8_t *w, const kq_block_q8 *y, int64_t nb) { return dot_q45_k_c(w, y, nb, 0); }
static float dot_q5_k_c(const uint8_t *w, const kq_block_q8 *y, int64_t nb) { return dot_q45_k_c(w, y, nb, 1); }

/* ---- Q6_K: 210 bytes = 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, d (f16) ----- */

static float dot_q6_k_c(const uint8_t *w, const kq_block_q8 *y, int64_t nb) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 210) {
        const uint8_t *ql = w, *qh = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        const int8_t *ys = y[b].qs;
        /* codes are stored + 32: subtract 32 * sum_g sc_g * (sum of group g's activation codes) */
        int32_t offset = 0;
        for (int g = 0; g < 16; g++) offset += sc[g] * y[b].bsums[g];
        int32_t isum = 0;
        for (int half = 0; half < 2; half++) {
            const uint8_t *l = ql + 64 * half, *h = qh + 32 * half;
            for (int i = 0; i < 4; i++) {
                for (int e = 0; e < 32; e++) {
                    const int lo = i & 1 ? l[32 + e] : l[e];
                    const int code = ((i < 2 ? lo : lo >> 4) & 0xf) | (((h[e] >> (2 * i)) & 3) << 4);
                    const int g = 8 * half + 2 * i + e / 16;
                    isum += sc[g] * code * ys[128 * half + 32 * i + e];
                }
            }
        }
        sum = block_sum(sum, half_to_float(w + 208) * y[b].d, isum - 32 * offset);
    }
    return sum;
}

#include "kernels_simd.h"
#include "gemm.h"

/* NOTE: one row alone and the same row among others must give the same bits (batch-invariant rows, which
 * greedy speculative decoding relies on): a single-row kernel is its type's rows kernel with one row. */
#if defined(__AVX2__)
static float dot_q4_k(const uint8_t *w, const kq_block_q8 *y, int64_t nb) {
    float out;
    dotn_q45_k_avx2(w, &y, 1, nb, 0, &out);
    return out;
}
static float dot_q5_k(const uint8_t *w, const kq_block_q8 *y, int64_t nb) {
    float out;
    dotn_q45_k_avx2(w, &y, 1, nb, 1, &out);
    return out;
}
static inline void dotn_q6_k(const uint8_t *w, const kq_block_q8 *const *ys, const int nr, int64_t nb, float *out) {
#if defined(__AVX512BW__)
    dotn_q6_k_avx512(w, ys, nr, nb, out); /* faster there: 17 against 11 GB/s in cache, one core */
#else
    dotn_q6_k_avx2(w, ys, nr, nb, out);
#endif
}
static float dot_q6_k(const uint8_t *w, const kq_block_q8 *y, int64_t nb) {
    float out;
    dotn_q6_k(w, &y, 1, nb, &out);
    return out;
}
#else
#define dot_q4_k dot_q4_k_c
#define dot_q5_k dot_q5_k_c
#define dot_q6_k dot_q6_k_c
#endif

/* up to 4 activation rows against one weight row */
static void dotn(int type, const uint8_t *w, const kq_block_q8 *const *ys, int nr, int64_t nb, float *out) {
#if defined(__AVX2__)
    switch (nr * 16 + type) {
#define KQ_CASE(n)                                                                                         \
    case n * 16 + KQ_Q4_K: dotn_q45_k_avx2(w, ys, n, nb, 0, out); return;                                   \
    case n * 16 + KQ_Q5_K: dotn_q45_k_avx2(w, ys, n, nb, 1, out); return;                                   \
    case n * 16 + KQ_Q6_K: dotn_q6_k(w, ys, n, nb, out); return;
        KQ_CASE(2) KQ_CASE(3) KQ_CASE(4)
#undef KQ_CASE
    default: break;
    }
#endif
    float (*dot)(const uint8_t *, const kq_block_q8 *, int64_t) =
        type == KQ_Q4_K ? dot_q4_k : type == KQ_Q5_K ? dot_q5_k : dot_q6_k;
    for (int r = 0; r < nr; r++) out[r] = dot(w, ys[r], nb);
}

#if defined(__AVX2__)
const kq_kernels KQ_NAME = {quantize, dot_q4_k, dot_q5_k, dot_q6_k, dotn, gemm, GEMM_ROWS};
#else
const kq_kernels KQ_NAME = {quantize, dot_q4_k, dot_q5_k, dot_q6_k, dotn, NULL, 0};
#endif
