/* One instruction set's kernels; built once per ISA with its compiler flags and KQ_NAME set to the table's
 * name (kq_portable, kq_avx2, kq_avx512). The portable C is the reference the SIMD paths are tested against
 * (and all of them against a float64 dequantize-and-dot in Python). */
#include <math.h>
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

/* ---- activations -------------------------------------------------------------------------------- */

static void quantize(const float *x, kq_block_q8 *y, int64_t k) {
    for (int64_t b = 0; b < k / KQ_QK; b++, x += KQ_QK) {
        float amax = 0.0f;
        for (int i = 0; i < KQ_QK; i++) amax = fmaxf(amax, fabsf(x[i]));
        kq_block_q8 *out = &y[b];
        if (!(amax > 0.0f)) { /* all zero (or NaN: the product is then zero too, never garbage) */
            memset(out, 0, sizeof *out);
            continue;
        }
        const float iscale = 127.0f / amax;
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
    }
}

#if defined(__AVX2__)
static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 unsigned codes times 32 int8 activations, summed in pairs, times one scale per 16 codes: 8 int32 */
static inline __m256i dot32(__m256i q, const int8_t *y, __m256i scale16) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)y)), scale16);
}
#endif

/* ---- Q4_K: 144 bytes = d, dmin (f16), 12 bytes of scales and mins, 128 bytes of 4-bit codes ------- */

static float dot_q4_k(const uint8_t *w, const kq_block_q8 *y, int64_t nb) {
    float sum = 0.0f;
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xf);
#endif
    for (int64_t b = 0; b < nb; b++, w += 144) {
        const float d = y[b].d * half_to_float(w), dmin = y[b].d * half_to_float(w + 2);
        uint8_t sc[8], mn[8];
        scales_mins(w + 4, sc, mn);
        const uint8_t *qs = w + 16;
        const int8_t *ys = y[b].qs;
        sum -= dmin * (float)mins_term(mn, y[b].bsums);
#if defined(__AVX2__)
        __m256i isum = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            isum = _mm256_add_epi32(isum, dot32(lo, ys + 64 * j, _mm256_set1_epi16(sc[2 * j])));
            isum = _mm256_add_epi32(isum, dot32(hi, ys + 64 * j + 32, _mm256_set1_epi16(sc[2 * j + 1])));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
#else
        int32_t isum = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = qs + 32 * (j / 2);
            const int shift = 4 * (j & 1);
            int32_t t = 0;
            for (int l = 0; l < 32; l++) t += ((q[l] >> shift) & 0xf) * ys[32 * j + l];
            isum += sc[j] * t;
        }
        sum += d * (float)isum;
#endif
    }
#if defined(__AVX2__)
    sum += hsum_ps(acc);
#endif
    return sum;
}

/* ---- Q5_K: 176 bytes = d, dmin, 12 bytes of scales and mins, 32 bytes of high bits, 128 of low nibbles */

static float dot_q5_k(const uint8_t *w, const kq_block_q8 *y, int64_t nb) {
    float sum = 0.0f;
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xf), one = _mm256_set1_epi8(1);
#endif
    for (int64_t b = 0; b < nb; b++, w += 176) {
        const float d = y[b].d * half_to_float(w), dmin = y[b].d * half_to_float(w + 2);
        uint8_t sc[8], mn[8];
        scales_mins(w + 4, sc, mn);
        const uint8_t *qh = w + 16, *qs = w + 48;
        const int8_t *ys = y[b].qs;
        sum -= dmin * (float)mins_term(mn, y[b].bsums);
#if defined(__AVX2__)
        const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
        __m256i isum = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            const __m256i hlo = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * j)), one);
            const __m256i hhi = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * j + 1)), one);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_slli_epi16(hlo, 4));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                                               _mm256_slli_epi16(hhi, 4));
            isum = _mm256_add_epi32(isum, dot32(lo, ys + 64 * j, _mm256_set1_epi16(sc[2 * j])));
            isum = _mm256_add_epi32(isum, dot32(hi, ys + 64 * j + 32, _mm256_set1_epi16(sc[2 * j + 1])));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
#else
        int32_t isum = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = qs + 32 * (j / 2);
            const int shift = 4 * (j & 1);
            int32_t t = 0;
            for (int l = 0; l < 32; l++) {
                const int code = ((q[l] >> shift) & 0xf) | (((qh[l] >> j) & 1) << 4);
                t += code * ys[32 * j + l];
            }
            isum += sc[j] * t;
        }
        sum += d * (float)isum;
#endif
    }
#if defined(__AVX2__)
    sum += hsum_ps(acc);
#endif
    return sum;
}

/* ---- Q6_K: 210 bytes = 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, d (f16) ----- */

static float dot_q6_k(const uint8_t *w, const kq_block_q8 *y, int64_t nb) {
    float sum = 0.0f;
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0xf), m2 = _mm256_set1_epi8(3);
#endif
    for (int64_t b = 0; b < nb; b++, w += 210) {
        const uint8_t *ql = w, *qh = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        const float d = y[b].d * half_to_float(w + 208);
        const int8_t *ys = y[b].qs;
        /* codes are stored + 32: subtract 32 * sum_g sc_g * (sum of group g's activation codes) */
        int32_t offset = 0;
        for (int g = 0; g < 16; g++) offset += sc[g] * y[b].bsums[g];
        sum -= 32.0f * d * (float)offset;
#if defined(__AVX2__)
        __m256i isum = _mm256_setzero_si256();
        for (int half = 0; half < 2; half++) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)(qh + 32 * half));
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(ql + 64 * half));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 64 * half + 32));
            const __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4)),
                _mm256_or_si256(_mm256_and_si256(l1, m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4)),
            };
            for (int i = 0; i < 4; i++) {
                const int g = 8 * half + 2 * i; /* each 32 codes are two groups of 16, one scale each */
                const __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]), _mm_set1_epi16(sc[g]));
                isum = _mm256_add_epi32(isum, dot32(q[i], ys + 128 * half + 32 * i, s));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
#else
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
        sum += d * (float)isum;
#endif
    }
#if defined(__AVX2__)
    sum += hsum_ps(acc);
#endif
    return sum;
}

const kq_kernels KQ_NAME = {quantize, dot_q4_k, dot_q5_k, dot_q6_k};
