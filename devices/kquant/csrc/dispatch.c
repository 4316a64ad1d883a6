/* Which kernels this CPU runs, and the product over rows that the ONNX Runtime op and the tests share. */
#include <stdlib.h>

#include "kquant.h"

int64_t kq_row_bytes(int type, int64_t k) {
    if (k <= 0 || k % KQ_QK != 0) return 0;
    switch (type) {
    case KQ_Q4_K: return k / KQ_QK * 144;
    case KQ_Q5_K: return k / KQ_QK * 176;
    case KQ_Q6_K: return k / KQ_QK * 210;
    default: return 0;
    }
}

static int cpu_has_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

static int cpu_has_avx512(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
#else
    return 0;
#endif
}

static int cpu_has_avx512vnni(void) {
#if defined(__x86_64__) || defined(__i386__)
    return cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

const kq_kernels *kq_kernels_for(int isa) {
    switch (isa) {
    case KQ_ISA_PORTABLE: return &kq_portable;
#if defined(__x86_64__) || defined(__i386__)
    case KQ_ISA_AVX2: return cpu_has_avx2() ? &kq_avx2 : NULL;
    case KQ_ISA_AVX512: return cpu_has_avx512() ? &kq_avx512 : NULL;
    case KQ_ISA_AVX512VNNI: return cpu_has_avx512vnni() ? &kq_avx512vnni : NULL;
#endif
    default: return NULL;
    }
}

int kq_best_isa(void) {
    if (cpu_has_avx512vnni()) return KQ_ISA_AVX512VNNI;
    if (cpu_has_avx512()) return KQ_ISA_AVX512;
    if (cpu_has_avx2()) return KQ_ISA_AVX2;
    return KQ_ISA_PORTABLE;
}

/* from how many activation rows the tiled product (where the ISA has one) beats the row kernels: below, its
 * decoding of the tile is not paid back; the bits are the same either way */
#ifndef KQ_GEMM_MIN_ROWS
#define KQ_GEMM_MIN_ROWS 12
#endif

void kq_matmul_rows(const kq_kernels *kern, int type, const kq_block_q8 *xq, int64_t m, int64_t k,
                    const uint8_t *w, int64_t n0, int64_t n1, int64_t n_total, float *y) {
    const int64_t nb = k / KQ_QK, rb = kq_row_bytes(type, k);
    if (m == 1) {
        float (*dot)(const uint8_t *, const kq_block_q8 *, int64_t) =
            type == KQ_Q4_K ? kern->dot_q4_k : type == KQ_Q5_K ? kern->dot_q5_k : kern->dot_q6_k;
        for (int64_t n = n0; n < n1; n++) y[n] = dot(w + n * rb, xq, nb);
        return;
    }
    if (kern->gemm != NULL && m >= KQ_GEMM_MIN_ROWS) {
        const int64_t whole = n0 + (n1 - n0) / kern->gemm_rows * kern->gemm_rows;
        if (whole > n0 && kern->gemm(type, w, xq, m, nb, n0, whole, n_total, y) == 0) n0 = whole;
    }
    /* a few weight rows at a time against every activation row, four of those a call: the weight rows stay
     * in L1 while m runs, and each block is decoded once per four activation rows */
    enum { TILE = 8, GROUP = 4 };
    for (int64_t t0 = n0; t0 < n1; t0 += TILE) {
        const int64_t t1 = t0 + TILE < n1 ? t0 + TILE : n1;
        for (int64_t r = 0; r < m; r += GROUP) {
            const int nr = (int)(m - r < GROUP ? m - r : GROUP);
            const kq_block_q8 *ys[GROUP];
            for (int i = 0; i < nr; i++) ys[i] = xq + (r + i) * nb;
            for (int64_t n = t0; n < t1; n++) {
                float out[GROUP];
                kern->dotn(type, w + n * rb, ys, nr, nb, out);
                for (int i = 0; i < nr; i++) y[(r + i) * n_total + n] = out[i];
            }
        }
    }
}

int kq_matmul(int isa, int type, const float *x, int64_t m, int64_t k, const uint8_t *w, int64_t n, float *y) {
    const kq_kernels *kern = kq_kernels_for(isa);
    if (kern == NULL || kq_row_bytes(type, k) == 0 || m < 0 || n < 0) return -1;
    kq_block_q8 *xq = malloc(sizeof(kq_block_q8) * (size_t)(m * (k / KQ_QK)) + 1);
    if (xq == NULL) return -1;
    for (int64_t r = 0; r < m; r++) kern->quantize(x + r * k, xq + r * (k / KQ_QK), k);
    kq_matmul_rows(kern, type, xq, m, k, w, 0, n, n, y);
    free(xq);
    return 0;
}
