/* edge's K-quant kernels: products of float activations with GGUF's K-quant blocks as the file stores them.
 *
 * The activations are quantized per 256 values to int8 with one float scale (and the sums of each 16 codes,
 * which the blocks' mins and offsets need), then multiplied by the weights' codes in integers; the two-level
 * K-quant scales (6-bit sub-scales under one f16 per 256 weights) are decoded inside the dot product, so a
 * decode step reads each weight byte once.
 *
 * Block layouts are GGML's (gguf-py's quants.py decodes the same bytes; the tests check against it).
 */
#ifndef EDGE_KQUANT_H
#define EDGE_KQUANT_H

#include <stddef.h>
#include <stdint.h>

#define KQ_QK 256

/* GGML type ids (gguf.GGMLQuantizationType) */
enum { KQ_Q4_K = 12, KQ_Q5_K = 13, KQ_Q6_K = 14 };

/* activations: 256 int8 codes under one float scale, with the sums of each 16 codes and of each 32 */
typedef struct {
    float d;
    int8_t qs[KQ_QK];
    int16_t bsums[KQ_QK / 16];
    int16_t bsums32[KQ_QK / 32];
} kq_block_q8;

/* the kernels of one instruction set: portable C, AVX2, AVX-512, AVX-512 with VNNI */
typedef struct {
    void (*quantize)(const float *x, kq_block_q8 *y, int64_t k);
    float (*dot_q4_k)(const uint8_t *w, const kq_block_q8 *y, int64_t nb);
    float (*dot_q5_k)(const uint8_t *w, const kq_block_q8 *y, int64_t nb);
    float (*dot_q6_k)(const uint8_t *w, const kq_block_q8 *y, int64_t nb);
    /* one weight row against nr <= 4 activation rows (each nb blocks), decoding the row once */
    void (*dotn)(int type, const uint8_t *w, const kq_block_q8 *const *ys, int nr, int64_t nb, float *out);
    /* many activation rows against the weight rows n0 .. n1 - 1 ((n1 - n0) % gemm_rows == 0), the same bits as
     * dotn: 0, or -1 when it could not run (no memory); NULL where this ISA has none */
    int (*gemm)(int type, const uint8_t *w, const kq_block_q8 *xq, int64_t m, int64_t nb, int64_t n0, int64_t n1,
                int64_t n_total, float *y);
    int gemm_rows;
} kq_kernels;

extern const kq_kernels kq_portable;
extern const kq_kernels kq_avx2;
extern const kq_kernels kq_avx512;
extern const kq_kernels kq_avx512vnni;

/* ISA ids, as edge's Python side names them */
enum { KQ_ISA_PORTABLE = 0, KQ_ISA_AVX2 = 1, KQ_ISA_AVX512 = 2, KQ_ISA_AVX512VNNI = 3 };

/* bytes of one row of k weights of `type` (0: not a type these kernels take, or k not a multiple of 256) */
int64_t kq_row_bytes(int type, int64_t k);
/* the kernels for `isa` (NULL if this CPU cannot run them) and the best this CPU runs */
const kq_kernels *kq_kernels_for(int isa);
int kq_best_isa(void);

/* y[m, n] = sum_k x[m, k] w[n, k] for the rows n0 <= n < n1, x already quantized (xq: m rows of k / 256
 * blocks); y is [m, n_total] */
void kq_matmul_rows(const kq_kernels *kern, int type, const kq_block_q8 *xq, int64_t m, int64_t k,
                    const uint8_t *w, int64_t n0, int64_t n1, int64_t n_total, float *y);

/* the whole product on the calling thread (tests and measurements): 0, or -1 for an unknown type / shape /
 * ISA */
int kq_matmul(int isa, int type, const float *x, int64_t m, int64_t k, const uint8_t *w, int64_t n, float *y);

#endif
