/* The many-row product (prompts) with AVX-512: 32 weight rows at a time are decoded once into codes laid out
 * for a multiply across rows (four consecutive inputs of each of 16 rows in one register), then every activation
 * row, four at a time, runs against them: a register holds 16 rows' sums, so an activation's four codes are
 * broadcast once for 16 rows, and the sub-block scales ride in the 16-bit multiply-add (vpdpwssd with VNNI).
 * The row kernels instead decode every block again for each four activation rows and sum each product in a
 * register of its own. Included by kernels.c (it defines block_sum, scales_mins and half_to_float): the block
 * sums are the same exact integers, added in the same order, so a row has the row kernels' bits. */
#if defined(__AVX512BW__)

enum { GEMM_ROWS = 32 };

/* one block (256 inputs) of 32 weight rows, decoded */
typedef struct {
    uint8_t codes[KQ_QK / 4][GEMM_ROWS][4]; /* [four inputs][row][input]: unsigned codes */
    int32_t scale[16][GEMM_ROWS];           /* [sub-block][row]: its scale in both 16-bit halves */
    int32_t corr[8][GEMM_ROWS];             /* [pair of sub-blocks][row]: the correction's two 16-bit factors */
    float d[GEMM_ROWS], f[GEMM_ROWS];       /* the block scale, and the correction's (dmin; Q6_K: 32 d) */
} gemm_block;

/* Q4_K: sub-blocks of 32 inputs, the mins against the activations' sums of 32; Q6_K: of 16, the codes' +32
 * against the sums of 16 (by the sub-block scales) */
static inline int gemm_subs(int type) { return type == KQ_Q6_K ? 16 : 8; }

static inline int32_t pair16(int a, int b) { return (int32_t)(((uint32_t)(uint16_t)b << 16) | (uint16_t)a); }

/* one row's block: its 256 codes in input order, and its scales into the tile */
static void gemm_decode_row(int type, const uint8_t *w, uint8_t codes[KQ_QK], gemm_block *t, int row) {
    if (type == KQ_Q6_K) {
        const uint8_t *ql = w, *qh = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        for (int half = 0; half < 2; half++)
            for (int e = 0; e < 32; e++) {
                const int l0 = ql[64 * half + e], l1 = ql[64 * half + 32 + e], h = qh[32 * half + e];
                uint8_t *c = codes + 128 * half + e;
                c[0] = (uint8_t)((l0 & 0xf) | ((h & 3) << 4));
                c[32] = (uint8_t)((l1 & 0xf) | (((h >> 2) & 3) << 4));
                c[64] = (uint8_t)((l0 >> 4) | (((h >> 4) & 3) << 4));
                c[96] = (uint8_t)((l1 >> 4) | (((h >> 6) & 3) << 4));
            }
        for (int g = 0; g < 16; g++) t->scale[g][row] = pair16(sc[g], sc[g]);
        for (int p = 0; p < 8; p++) t->corr[p][row] = pair16(sc[2 * p], sc[2 * p + 1]);
        t->d[row] = half_to_float(w + 208);
        t->f[row] = 0.0f; /* unused: the offsets (x 32) are subtracted in integers, as the row kernels do */
        return;
    }
    const int q5 = type == KQ_Q5_K;
    const uint8_t *qh = w + 16, *qs = w + (q5 ? 48 : 16);
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++) {
            const int hl = q5 ? ((qh[l] >> (2 * j)) & 1) << 4 : 0, hh = q5 ? ((qh[l] >> (2 * j + 1)) & 1) << 4 : 0;
            codes[64 * j + l] = (uint8_t)((qs[32 * j + l] & 0xf) | hl);
            codes[64 * j + 32 + l] = (uint8_t)((qs[32 * j + l] >> 4) | hh);
        }
    uint8_t sc[8], mn[8];
    scales_mins(w + 4, sc, mn);
    for (int j = 0; j < 8; j++) t->scale[j][row] = pair16(sc[j], sc[j]);
    for (int p = 0; p < 4; p++) t->corr[p][row] = pair16(mn[2 * p], mn[2 * p + 1]);
    t->d[row] = half_to_float(w);
    t->f[row] = half_to_float(w + 2);
}

/* block b of the 32 rows starting at w (rows rb bytes apart) */
static void gemm_decode(int type, const uint8_t *w, int64_t rb, int64_t b, gemm_block *t) {
    const int bytes = type == KQ_Q4_K ? 144 : type == KQ_Q5_K ? 176 : 210;
    uint8_t codes[GEMM_ROWS][KQ_QK] __attribute__((aligned(64)));
    for (int r = 0; r < GEMM_ROWS; r++) gemm_decode_row(type, w + r * rb + b * bytes, codes[r], t, r);
    const __m512i rows_lo = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(KQ_QK));
    const __m512i rows_hi = _mm512_add_epi32(rows_lo, _mm512_set1_epi32(16 * KQ_QK));
    for (int q = 0; q < KQ_QK / 4; q++) {
        _mm512_store_si512((void *)t->codes[q][0], _mm512_i32gather_epi32(rows_lo, codes[0] + 4 * q, 1));
        _mm512_store_si512((void *)t->codes[q][16], _mm512_i32gather_epi32(rows_hi, codes[0] + 4 * q, 1));
    }
}

static inline __m512i dpwssd(__m512i acc, __m512i a, __m512i b) {
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(acc, a, b);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

static inline __m512i bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* nr (<= 4, a constant where it is inlined) activation rows against one decoded block: the block's exact
 * integer sums, then the row kernels' two (Q6_K: one) multiply-adds into acc */
static inline void gemm_block_rows(int type, const gemm_block *t, const kq_block_q8 *const *xs, const int nr,
                                   __m512 acc[4][2]) {
    const int subs = gemm_subs(type), steps = KQ_QK / 4 / subs;
    __m512i is[4][2], cs[4][2];
    for (int r = 0; r < nr; r++) is[r][0] = is[r][1] = cs[r][0] = cs[r][1] = _mm512_setzero_si512();
    for (int s = 0; s < subs; s++) {
        const __m512i s0 = _mm512_load_si512((const void *)t->scale[s]);
        const __m512i s1 = _mm512_load_si512((const void *)(t->scale[s] + 16));
        for (int q = s * steps; q < (s + 1) * steps; q++) {
            const __m512i w0 = _mm512_load_si512((const void *)t->codes[q][0]);
            const __m512i w1 = _mm512_load_si512((const void *)t->codes[q][16]);
            for (int r = 0; r < nr; r++) {
                const __m512i x = bcast32(xs[r]->qs + 4 * q);
                is[r][0] = dpwssd(is[r][0], _mm512_maddubs_epi16(w0, x), s0);
                is[r][1] = dpwssd(is[r][1], _mm512_maddubs_epi16(w1, x), s1);
            }
        }
    }
    const int pairs = type == KQ_Q6_K ? 8 : 4;
    for (int p = 0; p < pairs; p++) {
        const __m512i c0 = _mm512_load_si512((const void *)t->corr[p]);
        const __m512i c1 = _mm512_load_si512((const void *)(t->corr[p] + 16));
        for (int r = 0; r < nr; r++) {
            const __m512i x = bcast32(type == KQ_Q6_K ? xs[r]->bsums + 2 * p : xs[r]->bsums32 + 2 * p);
            cs[r][0] = dpwssd(cs[r][0], c0, x);
            cs[r][1] = dpwssd(cs[r][1], c1, x);
        }
    }
    for (int h = 0; h < 2; h++) {
        const __m512 d = _mm512_load_ps(t->d + 16 * h), f = _mm512_load_ps(t->f + 16 * h);
        for (int r = 0; r < nr; r++) {
            const __m512 dx = _mm512_set1_ps(xs[r]->d);
            if (type == KQ_Q6_K) { /* as the row kernels: the offsets inside the integer sum */
                const __m512i total = _mm512_sub_epi32(is[r][h], _mm512_slli_epi32(cs[r][h], 5));
                acc[r][h] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(total), acc[r][h]);
            } else { /* + (-(dmin dx)) x mins, one rounding: fnmadd */
                acc[r][h] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(is[r][h]), acc[r][h]);
                acc[r][h] = _mm512_fnmadd_ps(_mm512_mul_ps(f, dx), _mm512_cvtepi32_ps(cs[r][h]), acc[r][h]);
            }
        }
    }
}

/* activation rows r0 .. r0 + nr - 1 against the decoded tile (nb blocks): y rows n_total apart */
static inline void gemm_rows(int type, const gemm_block *tile, const kq_block_q8 *xq, int64_t nb, int64_t r0,
                             const int nr, float *y, int64_t n_total) {
    __m512 acc[4][2];
    for (int r = 0; r < nr; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const kq_block_q8 *xs[4];
        for (int r = 0; r < nr; r++) xs[r] = xq + (r0 + r) * nb + b;
        gemm_block_rows(type, tile + b, xs, nr, acc);
    }
    for (int r = 0; r < nr; r++) {
        _mm512_storeu_ps(y + (r0 + r) * n_total, acc[r][0]);
        _mm512_storeu_ps(y + (r0 + r) * n_total + 16, acc[r][1]);
    }
}

/* y[:, n0:n1] for m activation rows, (n1 - n0) a multiple of 32; 0, or -1 without memory for the tile */
static int gemm(int type, const uint8_t *w, const kq_block_q8 *xq, int64_t m, int64_t nb, int64_t n0, int64_t n1,
                int64_t n_total, float *y) {
    const int64_t rb = kq_row_bytes(type, nb * KQ_QK);
    gemm_block *tile = aligned_alloc(64, sizeof(gemm_block) * (size_t)nb);
    if (tile == NULL) return -1;
    for (int64_t n = n0; n < n1; n += GEMM_ROWS) {
        for (int64_t b = 0; b < nb; b++) gemm_decode(type, w + n * rb, rb, b, tile + b);
        int64_t r = 0;
        for (; r + 4 <= m; r += 4) gemm_rows(type, tile, xq, nb, r, 4, y + n, n_total);
        switch (m - r) {
        case 3: gemm_rows(type, tile, xq, nb, r, 3, y + n, n_total); break;
        case 2: gemm_rows(type, tile, xq, nb, r, 2, y + n, n_total); break;
        case 1: gemm_rows(type, tile, xq, nb, r, 1, y + n, n_total); break;
        default: break;
        }
    }
    free(tile);
    return 0;
}
#endif
