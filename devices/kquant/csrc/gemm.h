/* The many-row product (prompts): a tile of weight rows (32 with AVX-512, 16 with AVX2) is decoded once into
 * codes laid out for a multiply across rows (four consecutive inputs of each row of a register's width), then
 * every activation row, a few at a time, runs against them: a register holds as many rows' sums as it has
 * 32-bit lanes, so an activation's four codes are broadcast once for all of them, and the sub-block scales ride
 * in the 16-bit multiply-add (vpdpwssd where the CPU has AVX512-VNNI). The row kernels instead decode every
 * block again for each four activation rows and sum each product in a register of its own.
 * Included by kernels.c (it defines block_sum, scales_mins and half_to_float): the block sums are the same exact
 * integers, added in the same order, so a row has the row kernels' bits. */
#if defined(__AVX2__)

#if defined(__AVX512BW__)
enum { LANES = 16, GEMM_NR = 4 }; /* 4 activation rows x 2 registers of sums: 24 of the 32 registers */
typedef __m512i vi;
typedef __m512 vf;
#define V(op) _mm512_##op
static inline vi v_load(const void *p) { return _mm512_load_si512(p); }
static inline void v_store(void *p, vi v) { _mm512_store_si512(p, v); }
static inline vi v_zero(void) { return _mm512_setzero_si512(); }
static inline vi v_gather(vi idx, const void *base) { return _mm512_i32gather_epi32(idx, base, 1); }
static inline vi v_iota(void) { return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
static inline vi dpwssd(vi acc, vi a, vi b) {
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(acc, a, b);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}
#else
enum { LANES = 8, GEMM_NR = 2 }; /* AVX2 has 16 registers: 2 activation rows x 2 registers of sums */
typedef __m256i vi;
typedef __m256 vf;
#define V(op) _mm256_##op
static inline vi v_load(const void *p) { return _mm256_load_si256((const __m256i *)p); }
static inline void v_store(void *p, vi v) { _mm256_store_si256((__m256i *)p, v); }
static inline vi v_zero(void) { return _mm256_setzero_si256(); }
static inline vi v_gather(vi idx, const void *base) { return _mm256_i32gather_epi32((const int *)base, idx, 1); }
static inline vi v_iota(void) { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
static inline vi dpwssd(vi acc, vi a, vi b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
#endif

enum { GEMM_ROWS = 2 * LANES };

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

/* a row's 256 codes in input order (64-byte aligned): the row kernels' unpacking, stored */
static inline void codes_q6(const uint8_t *w, uint8_t codes[KQ_QK]) {
    for (int half = 0; half < 2; half++) {
        __m256i q[4];
        codes_q6_half(w, half, q);
        for (int i = 0; i < 4; i++) _mm256_store_si256((__m256i *)(codes + 128 * half + 32 * i), q[i]);
    }
}

static inline void codes_q45(const uint8_t *w, int q5, uint8_t codes[KQ_QK]) {
    const uint8_t *qs = w + (q5 ? 48 : 16);
    const __m256i h = q5 ? _mm256_loadu_si256((const __m256i *)(w + 16)) : _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        __m256i lo, hi;
        codes_q45_chunk(qs, h, j, q5, &lo, &hi);
        _mm256_store_si256((__m256i *)(codes + 64 * j), lo);
        _mm256_store_si256((__m256i *)(codes + 64 * j + 32), hi);
    }
}

/* one row's block: its 256 codes in input order (64-byte aligned), and its scales into the tile */
static void gemm_decode_row(int type, const uint8_t *w, uint8_t codes[KQ_QK], gemm_block *t, int row) {
    if (type == KQ_Q6_K) {
        const int8_t *sc = (const int8_t *)(w + 192);
        codes_q6(w, codes);
        for (int g = 0; g < 16; g++) t->scale[g][row] = pair16(sc[g], sc[g]);
        for (int p = 0; p < 8; p++) t->corr[p][row] = pair16(sc[2 * p], sc[2 * p + 1]);
        t->d[row] = half_to_float(w + 208);
        t->f[row] = 0.0f; /* unused: the offsets (x 32) are subtracted in integers, as the row kernels do */
        return;
    }
    codes_q45(w, type == KQ_Q5_K, codes);
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
    const vi rows_lo = V(mullo_epi32)(v_iota(), V(set1_epi32)(KQ_QK));
    const vi rows_hi = V(add_epi32)(rows_lo, V(set1_epi32)(LANES * KQ_QK));
    for (int q = 0; q < KQ_QK / 4; q++) {
        v_store((void *)t->codes[q][0], v_gather(rows_lo, codes[0] + 4 * q));
        v_store((void *)t->codes[q][LANES], v_gather(rows_hi, codes[0] + 4 * q));
    }
}

static inline vi bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return V(set1_epi32)(v);
}

/* nr (<= GEMM_NR, a constant where it is inlined) activation rows against one decoded block: the block's exact
 * integer sums, then the row kernels' two (Q6_K: one) multiply-adds into acc */
static inline void gemm_block_rows(int type, const gemm_block *t, const kq_block_q8 *const *xs, const int nr,
                                   vf acc[GEMM_NR][2]) {
    const int subs = gemm_subs(type), steps = KQ_QK / 4 / subs;
    vi is[GEMM_NR][2], cs[GEMM_NR][2];
    for (int r = 0; r < nr; r++) is[r][0] = is[r][1] = cs[r][0] = cs[r][1] = v_zero();
    for (int s = 0; s < subs; s++) {
        const vi s0 = v_load(t->scale[s]), s1 = v_load(t->scale[s] + LANES);
        for (int q = s * steps; q < (s + 1) * steps; q++) {
            const vi w0 = v_load(t->codes[q][0]), w1 = v_load(t->codes[q][LANES]);
            for (int r = 0; r < nr; r++) {
                const vi x = bcast32(xs[r]->qs + 4 * q);
                is[r][0] = dpwssd(is[r][0], V(maddubs_epi16)(w0, x), s0);
                is[r][1] = dpwssd(is[r][1], V(maddubs_epi16)(w1, x), s1);
            }
        }
    }
    const int pairs = type == KQ_Q6_K ? 8 : 4;
    for (int p = 0; p < pairs; p++) {
        const vi c0 = v_load(t->corr[p]), c1 = v_load(t->corr[p] + LANES);
        for (int r = 0; r < nr; r++) {
            const vi x = bcast32(type == KQ_Q6_K ? xs[r]->bsums + 2 * p : xs[r]->bsums32 + 2 * p);
            cs[r][0] = dpwssd(cs[r][0], c0, x);
            cs[r][1] = dpwssd(cs[r][1], c1, x);
        }
    }
    for (int h = 0; h < 2; h++) {
        const vf d = V(load_ps)(t->d + LANES * h), f = V(load_ps)(t->f + LANES * h);
        for (int r = 0; r < nr; r++) {
            const vf dx = V(set1_ps)(xs[r]->d);
            if (type == KQ_Q6_K) { /* as the row kernels: the offsets inside the integer sum */
                const vi total = V(sub_epi32)(is[r][h], V(slli_epi32)(cs[r][h], 5));
                acc[r][h] = V(fmadd_ps)(V(mul_ps)(d, dx), V(cvtepi32_ps)(total), acc[r][h]);
            } else { /* + (-(dmin dx)) x mins, one rounding: fnmadd */
                acc[r][h] = V(fmadd_ps)(V(mul_ps)(d, dx), V(cvtepi32_ps)(is[r][h]), acc[r][h]);
                acc[r][h] = V(fnmadd_ps)(V(mul_ps)(f, dx), V(cvtepi32_ps)(cs[r][h]), acc[r][h]);
            }
        }
    }
}

/* activation rows r0 .. r0 + nr - 1 against the decoded tile (nb blocks): y rows n_total apart */
static inline void gemm_rows(int type, const gemm_block *tile, const kq_block_q8 *xq, int64_t nb, int64_t r0,
                             const int nr, float *y, int64_t n_total) {
    vf acc[GEMM_NR][2];
    for (int r = 0; r < nr; r++) acc[r][0] = acc[r][1] = V(setzero_ps)();
    for (int64_t b = 0; b < nb; b++) {
        const kq_block_q8 *xs[GEMM_NR];
        for (int r = 0; r < nr; r++) xs[r] = xq + (r0 + r) * nb + b;
        gemm_block_rows(type, tile + b, xs, nr, acc);
    }
    for (int r = 0; r < nr; r++) {
        V(storeu_ps)(y + (r0 + r) * n_total, acc[r][0]);
        V(storeu_ps)(y + (r0 + r) * n_total + LANES, acc[r][1]);
    }
}

/* y[:, n0:n1] for m activation rows, (n1 - n0) a multiple of GEMM_ROWS; 0, or -1 without memory for the tile */
static int gemm(int type, const uint8_t *w, const kq_block_q8 *xq, int64_t m, int64_t nb, int64_t n0, int64_t n1,
                int64_t n_total, float *y) {
    const int64_t rb = kq_row_bytes(type, nb * KQ_QK);
    gemm_block *tile = aligned_alloc(64, sizeof(gemm_block) * (size_t)nb);
    if (tile == NULL) return -1;
    for (int64_t n = n0; n < n1; n += GEMM_ROWS) {
        for (int64_t b = 0; b < nb; b++) gemm_decode(type, w + n * rb, rb, b, tile + b);
        int64_t r = 0;
        for (; r + GEMM_NR <= m; r += GEMM_NR) gemm_rows(type, tile, xq, nb, r, GEMM_NR, y + n, n_total);
        switch (m - r) { /* nr a constant in each call, so the row loops unroll (AVX2: 1 at most) */
        case 3: gemm_rows(type, tile, xq, nb, r, 3 % GEMM_NR, y + n, n_total); break;
        case 2: gemm_rows(type, tile, xq, nb, r, 2 % GEMM_NR, y + n, n_total); break;
        case 1: gemm_rows(type, tile, xq, nb, r, 1, y + n, n_total); break;
        default: break;
        }
    }
    free(tile);
    return 0;
}
#endif
