/* The SIMD dot products (included by kernels.c, which defines the scalar ones and the helpers): AVX2 with
 * 256-bit registers; AVX-512 (BW) Q6_K with two groups' codes a register. Both decode the K-quant scales and mins
 * with word operations and fold the mins' and offsets' terms with one multiply-add a block. */
#if defined(__AVX2__)
/* weight bytes ahead of the block being read that a kernel asks the cache for: one core streamed Q4_K rows
 * from memory at 7.3 GB/s without, 10.4 / 12.2 / 12.4 GB/s with 1 / 4 / 8 KB (the hardware prefetcher alone
 * does not keep up with a compute-heavy loop) */
#ifndef KQ_PREFETCH
#define KQ_PREFETCH 4096
#endif
static inline void prefetch_block(const uint8_t *w, int bytes) {
    for (int at = 0; at < bytes; at += 64) _mm_prefetch((const char *)w + KQ_PREFETCH + at, _MM_HINT_T0);
}

static inline int32_t hsum_epi32_128(__m128i v) {
    v = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
    return _mm_cvtsi128_si32(_mm_add_epi32(v, _mm_shuffle_epi32(v, 0xb1)));
}

static inline int32_t hsum_epi32(__m256i v) {
    return hsum_epi32_128(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

/* Q4_K / Q5_K's 12 bytes of 6-bit scales and mins as 16 bytes: scales 0..7, then mins 0..7 (the high two
 * bits of sub-blocks 4..7 sit in the top bits of the first eight bytes) */
static inline __m128i scales_mins_simd(const uint8_t *q) {
    uint32_t c;
    memcpy(&c, q + 8, 4);
    const __m128i v = _mm_insert_epi32(_mm_loadl_epi64((const __m128i *)q), (int)c, 2); /* [a, b, c, 0] */
    /* [a, c, b, c >> 4] masked to the low bits, or'ed with [0, a >> 2, 0, b >> 2] masked to bits 4-5 */
    const __m128i x = _mm_srlv_epi32(_mm_shuffle_epi32(v, 0x98), _mm_setr_epi32(0, 0, 0, 4));
    const __m128i lo = _mm_and_si128(x, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(v, 0x50), 2),
                                     _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

/* sum_j m_j * (activation sum of sub-block j): 4 int32 lanes */
static inline __m128i mins_simd(__m128i sm, const kq_block_q8 *y) {
    return _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)), _mm_loadu_si128((const __m128i *)y->bsums32));
}

/* the 16-bit scale of sub-block j, in every lane (from the 8 scales widened to 16 bits, in both halves) */
static inline __m256i scale_of(__m256i sc16x2, int j) {
    return _mm256_shuffle_epi8(sc16x2, _mm256_set1_epi16((short)(0x0100 + 0x0202 * j)));
}

static inline __m256i dot32(__m256i q, const int8_t *y, __m256i scale16) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)y)), scale16);
}

/* Q6_K's offset term: sum_g sc_g * (activation sum of group g), 8 int32 lanes */
static inline __m256i offsets_q6(const int8_t *sc, const int16_t *bsums) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
    return _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)bsums));
}

/* Q4_K / Q5_K: 32 code bytes (chunk j) give inputs 64j .. 64j + 31 (low nibbles, *lo) and the next 32 (high,
 * *hi); Q5_K's fifth bits (h: its 32 high bytes) are bit 2j / 2j + 1. Shared by the row kernels and the tile. */
static inline void codes_q45_chunk(const uint8_t *qs, __m256i h, int j, int q5, __m256i *lo, __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0xf), one = _mm256_set1_epi8(1);
    const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
    *lo = _mm256_and_si256(q, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    if (q5) {
        const __m256i hl = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * j)), one);
        const __m256i hh = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * j + 1)), one);
        *lo = _mm256_or_si256(*lo, _mm256_slli_epi16(hl, 4));
        *hi = _mm256_or_si256(*hi, _mm256_slli_epi16(hh, 4));
    }
}

/* Q6_K: half `half`'s 128 codes (inputs 128 half + 32 i, i < 4) from 64 bytes of low nibbles and 32 of high
 * pairs, unsigned (the +32 offset is the callers') */
static inline void codes_q6_half(const uint8_t *w, int half, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(0xf), m2 = _mm256_set1_epi8(3);
    const __m256i hb = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * half));
    const __m256i l0 = _mm256_loadu_si256((const __m256i *)(w + 64 * half));
    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(w + 64 * half + 32));
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
}

/* Up to 4 activation rows against one weight row (one row: a decode step; more: a prompt, a verify step):
 * each weight block is decoded once for all of them. nr is a constant at each call site, so the compiler
 * unrolls the row loops. Q4_K and Q5_K differ only in the fifth bit (q5). */
static inline void dotn_q45_k_avx2(const uint8_t *w, const kq_block_q8 *const *ys, const int nr, int64_t nb,
                                   int q5, float *out) {
    const int bytes = q5 ? 176 : 144;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t b = 0; b < nb; b++, w += bytes) {
        prefetch_block(w, bytes);
        const float d = _cvtsh_ss((uint16_t)(w[0] | (w[1] << 8)));
        const float dmin = _cvtsh_ss((uint16_t)(w[2] | (w[3] << 8)));
        const __m128i sm = scales_mins_simd(w + 4);
        const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
        const uint8_t *qs = w + (q5 ? 48 : 16);
        const __m256i h = q5 ? _mm256_loadu_si256((const __m256i *)(w + 16)) : _mm256_setzero_si256();
        __m256i isum[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                           _mm256_setzero_si256()};
        for (int j = 0; j < 4; j++) {
            __m256i lo, hi;
            codes_q45_chunk(qs, h, j, q5, &lo, &hi);
            const __m256i s_lo = scale_of(sc, 2 * j), s_hi = scale_of(sc, 2 * j + 1);
            for (int r = 0; r < nr; r++) {
                const int8_t *y8 = ys[r][b].qs + 64 * j;
                isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(dot32(lo, y8, s_lo), dot32(hi, y8 + 32, s_hi)));
            }
        }
        for (int r = 0; r < nr; r++) {
            const float yd = ys[r][b].d;
            acc[r] = block_sum(acc[r], d * yd, hsum_epi32(isum[r]));
            acc[r] = block_sum(acc[r], -(dmin * yd), hsum_epi32_128(mins_simd(sm, &ys[r][b])));
        }
    }
    for (int r = 0; r < nr; r++) out[r] = acc[r];
}

static inline void dotn_q6_k_avx2(const uint8_t *w, const kq_block_q8 *const *ys, const int nr, int64_t nb,
                                  float *out) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t b = 0; b < nb; b++, w += 210) {
        prefetch_block(w, 210);
        const int8_t *sc = (const int8_t *)(w + 192);
        const float d = _cvtsh_ss((uint16_t)(w[208] | (w[209] << 8)));
        __m256i isum[4];
        for (int r = 0; r < nr; r++)
            isum[r] = _mm256_mullo_epi32(offsets_q6(sc, ys[r][b].bsums), _mm256_set1_epi32(-32));
        for (int half = 0; half < 2; half++) {
            __m256i q[4];
            codes_q6_half(w, half, q);
            for (int i = 0; i < 4; i++) {
                const int g = 8 * half + 2 * i;
                const __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]), _mm_set1_epi16(sc[g]));
                for (int r = 0; r < nr; r++)
                    isum[r] = _mm256_add_epi32(isum[r], dot32(q[i], ys[r][b].qs + 128 * half + 32 * i, s));
            }
        }
        for (int r = 0; r < nr; r++) acc[r] = block_sum(acc[r], d * ys[r][b].d, hsum_epi32(isum[r]));
    }
    for (int r = 0; r < nr; r++) out[r] = acc[r];
}

#endif

#if defined(__AVX512BW__)
/* 64 unsigned codes times 64 int8 activations, in pairs, times a 16-bit scale per lane: 16 int32 */
static inline __m512i dot64(__m512i q, const int8_t *y, __m512i scale16) {
    return _mm512_madd_epi16(_mm512_maddubs_epi16(q, _mm512_loadu_si512((const void *)y)), scale16);
}

static inline void dotn_q6_k_avx512(const uint8_t *w, const kq_block_q8 *const *ys, const int nr, int64_t nb,
                                    float *out) {
    const __m512i m4 = _mm512_set1_epi8(0xf), m2 = _mm512_set1_epi8(3);
    /* the high pairs: bits 0-1 / 2-3 for the first 64 codes of a half, 4-5 / 6-7 for the next */
    const __m512i shift_a = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i shift_b = _mm512_add_epi16(shift_a, _mm512_set1_epi16(4));
    /* 16-bit lane i covers codes 2i, 2i + 1 of 64: group i / 8 of the four (qa), + 4 (qb) */
    const __m512i lane_group = _mm512_srli_epi16(
        _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9,
                         8, 7, 6, 5, 4, 3, 2, 1, 0),
        3);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t b = 0; b < nb; b++, w += 210) {
        prefetch_block(w, 210);
        const uint8_t *ql = w, *qh = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        const float d = _cvtsh_ss((uint16_t)(w[208] | (w[209] << 8)));
        const __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)));
        __m512i isum[4];
        for (int r = 0; r < nr; r++) {
            const __m256i off = _mm256_mullo_epi32(offsets_q6(sc, ys[r][b].bsums), _mm256_set1_epi32(-32));
            isum[r] = _mm512_maskz_mov_epi32(0x00ff, _mm512_castsi256_si512(off));
        }
        for (int half = 0; half < 2; half++) {
            const __m512i l = _mm512_loadu_si512((const void *)(ql + 64 * half));
            const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qh + 32 * half)));
            const __m512i qa = _mm512_or_si512(
                _mm512_and_si512(l, m4), _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(h, shift_a), m2), 4));
            const __m512i qb =
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(h, shift_b), m2), 4));
            const __m512i ga = _mm512_add_epi16(_mm512_set1_epi16((short)(8 * half)), lane_group);
            const __m512i sa = _mm512_permutexvar_epi16(ga, sc16);
            const __m512i sb = _mm512_permutexvar_epi16(_mm512_add_epi16(ga, _mm512_set1_epi16(4)), sc16);
            for (int r = 0; r < nr; r++) {
                isum[r] = _mm512_add_epi32(isum[r], dot64(qa, ys[r][b].qs + 128 * half, sa));
                isum[r] = _mm512_add_epi32(isum[r], dot64(qb, ys[r][b].qs + 128 * half + 64, sb));
            }
        }
        for (int r = 0; r < nr; r++)
            acc[r] = block_sum(acc[r], d * ys[r][b].d, _mm512_reduce_add_epi32(isum[r]));
    }
    for (int r = 0; r < nr; r++) out[r] = acc[r];
}
#endif
