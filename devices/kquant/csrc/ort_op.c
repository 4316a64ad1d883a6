/* edge.kquant.MatMulKQuant as an ONNX Runtime custom op (graph_opt/kquant_op.py has its contract):
 * y[.., n] = x[.., k] . w[n, :]^T with w the GGUF rows as stored.
 *
 * The onnxruntime wheel ships no C headers, so this file declares the little of ORT's C ABI it uses: the
 * OrtApi table is append-only (an entry's index never changes across versions), so a call is the table entry
 * at its index; the indices are ORT's own (onnxruntime_c_api.h, checked against libonnxruntime 1.30 and
 * 1.32 by calling each). API version 17 (ORT 1.17) is the oldest that has every entry used here. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kquant.h"

#define KQ_ORT_API_VERSION 17

typedef struct OrtStatus OrtStatus;
typedef struct OrtValue OrtValue;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtTensorTypeAndShapeInfo OrtShapeInfo;
typedef void *const *OrtApiTable; /* the OrtApi struct: a table of function pointers */

typedef struct {
    OrtApiTable (*GetApi)(uint32_t version);
    const char *(*GetVersionString)(void);
} OrtApiBase;

/* the OrtApi entries used, by index */
enum {
    I_CreateStatus = 0,
    I_CreateCustomOpDomain = 26,
    I_CustomOpDomain_Add = 27,
    I_AddCustomOpDomain = 28,
    I_GetTensorMutableData = 51,
    I_GetTensorElementType = 60,
    I_GetDimensionsCount = 61,
    I_GetDimensions = 62,
    I_GetTensorTypeAndShape = 65,
    I_KernelInfoGetAttribute_int64 = 86,
    I_KernelContext_GetInput = 90,
    I_KernelContext_GetOutput = 91,
    I_ReleaseStatus = 93,
    I_ReleaseTensorTypeAndShapeInfo = 99,
    I_KernelContext_ParallelFor = 274,
};

enum { ORT_INVALID_ARGUMENT = 2, ORT_FAIL = 1 };
enum { T_FLOAT = 1, T_UINT8 = 2 }; /* ONNXTensorElementDataType */

typedef OrtStatus *(*CreateStatus_t)(int code, const char *msg);
typedef OrtStatus *(*CreateCustomOpDomain_t)(const char *domain, OrtCustomOpDomain **out);
typedef OrtStatus *(*CustomOpDomain_Add_t)(OrtCustomOpDomain *domain, const void *op);
typedef OrtStatus *(*AddCustomOpDomain_t)(OrtSessionOptions *options, OrtCustomOpDomain *domain);
typedef OrtStatus *(*GetTensorMutableData_t)(OrtValue *value, void **out);
typedef OrtStatus *(*GetTensorElementType_t)(const OrtShapeInfo *info, int *out);
typedef OrtStatus *(*GetDimensionsCount_t)(const OrtShapeInfo *info, size_t *out);
typedef OrtStatus *(*GetDimensions_t)(const OrtShapeInfo *info, int64_t *dims, size_t n);
typedef OrtStatus *(*GetTensorTypeAndShape_t)(const OrtValue *value, OrtShapeInfo **out);
typedef OrtStatus *(*KernelInfoGetAttribute_int64_t)(const OrtKernelInfo *info, const char *name, int64_t *out);
typedef OrtStatus *(*KernelContext_GetInput_t)(const OrtKernelContext *ctx, size_t i, const OrtValue **out);
typedef OrtStatus *(*KernelContext_GetOutput_t)(OrtKernelContext *ctx, size_t i, const int64_t *dims, size_t n,
                                                OrtValue **out);
typedef void (*ReleaseStatus_t)(OrtStatus *status);
typedef void (*ReleaseShapeInfo_t)(OrtShapeInfo *info);
typedef OrtStatus *(*KernelContext_ParallelFor_t)(const OrtKernelContext *ctx, void (*fn)(void *, size_t), size_t total,
                                    size_t num_batch, void *data);

#define ORT(api, name) ((name##_t)(api)[I_##name])
#define ORT_RELEASE_SHAPE(api) ((ReleaseShapeInfo_t)(api)[I_ReleaseTensorTypeAndShapeInfo])

/* OrtCustomOp up to API 17's fields (ORT reads no field past what `version` declares) */
typedef struct OrtCustomOp {
    uint32_t version;
    void *(*CreateKernel)(const struct OrtCustomOp *op, OrtApiTable api, const OrtKernelInfo *info);
    const char *(*GetName)(const struct OrtCustomOp *op);
    const char *(*GetExecutionProviderType)(const struct OrtCustomOp *op);
    int (*GetInputType)(const struct OrtCustomOp *op, size_t index);
    size_t (*GetInputTypeCount)(const struct OrtCustomOp *op);
    int (*GetOutputType)(const struct OrtCustomOp *op, size_t index);
    size_t (*GetOutputTypeCount)(const struct OrtCustomOp *op);
    void (*KernelCompute)(void *kernel, OrtKernelContext *context);
    void (*KernelDestroy)(void *kernel);
    int (*GetInputCharacteristic)(const struct OrtCustomOp *op, size_t index);
    int (*GetOutputCharacteristic)(const struct OrtCustomOp *op, size_t index);
    int (*GetInputMemoryType)(const struct OrtCustomOp *op, size_t index);
    int (*GetVariadicInputMinArity)(const struct OrtCustomOp *op);
    int (*GetVariadicInputHomogeneity)(const struct OrtCustomOp *op);
    int (*GetVariadicOutputMinArity)(const struct OrtCustomOp *op);
    int (*GetVariadicOutputHomogeneity)(const struct OrtCustomOp *op);
    OrtStatus *(*CreateKernelV2)(const struct OrtCustomOp *op, OrtApiTable api, const OrtKernelInfo *info,
                                 void **kernel);
    OrtStatus *(*KernelComputeV2)(void *kernel, OrtKernelContext *context);
    void *InferOutputShapeFn;
    int (*GetStartVersion)(const struct OrtCustomOp *op);
    int (*GetEndVersion)(const struct OrtCustomOp *op);
} OrtCustomOp;

typedef struct {
    OrtApiTable api;
    const kq_kernels *kern;
    int64_t type, k, n;
} Kernel;

/* one call's work, shared by ORT's threads */
typedef struct {
    const Kernel *kn;
    const float *x;
    kq_block_q8 *xq;
    const uint8_t *w;
    float *y;
    int64_t m, rows_per_task;
} Job;

/* EDGE_KQUANT_ISA=portable|avx2|avx512|avx512vnni forces one instruction set (tests); unset: the best this CPU runs */
static const kq_kernels *chosen_kernels(void) {
    const char *want = getenv("EDGE_KQUANT_ISA");
    if (want == NULL || *want == '\0') return kq_kernels_for(kq_best_isa());
    if (strcmp(want, "portable") == 0) return kq_kernels_for(KQ_ISA_PORTABLE);
    if (strcmp(want, "avx2") == 0) return kq_kernels_for(KQ_ISA_AVX2);
    if (strcmp(want, "avx512") == 0) return kq_kernels_for(KQ_ISA_AVX512);
    if (strcmp(want, "avx512vnni") == 0) return kq_kernels_for(KQ_ISA_AVX512VNNI);
    return NULL;
}

static OrtStatus *fail(OrtApiTable api, int code, const char *msg) { return ORT(api, CreateStatus)(code, msg); }

static OrtStatus *create_kernel(const OrtCustomOp *op, OrtApiTable api, const OrtKernelInfo *info, void **out) {
    (void)op;
    Kernel *kn = calloc(1, sizeof *kn);
    if (kn == NULL) return fail(api, ORT_FAIL, "MatMulKQuant: out of memory");
    kn->api = api;
    OrtStatus *st = NULL;
    const char *names[3] = {"ggml_type", "k", "n"};
    int64_t *slots[3] = {&kn->type, &kn->k, &kn->n};
    for (int i = 0; i < 3 && st == NULL; i++) st = ORT(api, KernelInfoGetAttribute_int64)(info, names[i], slots[i]);
    if (st == NULL && kq_row_bytes((int)kn->type, kn->k) == 0)
        st = fail(api, ORT_INVALID_ARGUMENT, "MatMulKQuant: a ggml_type / k these kernels do not take");
    if (st == NULL && (kn->kern = chosen_kernels()) == NULL)
        st = fail(api, ORT_INVALID_ARGUMENT, "MatMulKQuant: EDGE_KQUANT_ISA names kernels this CPU cannot run");
    if (st != NULL) {
        free(kn);
        return st;
    }
    *out = kn;
    return NULL;
}

static void quantize_task(void *data, size_t i) {
    Job *job = data;
    const int64_t k = job->kn->k;
    job->kn->kern->quantize(job->x + (int64_t)i * k, job->xq + (int64_t)i * (k / KQ_QK), k);
}

static void rows_task(void *data, size_t i) {
    Job *job = data;
    const Kernel *kn = job->kn;
    const int64_t n0 = (int64_t)i * job->rows_per_task;
    const int64_t n1 = n0 + job->rows_per_task < kn->n ? n0 + job->rows_per_task : kn->n;
    kq_matmul_rows(kn->kern, (int)kn->type, job->xq, job->m, kn->k, job->w, n0, n1, kn->n, job->y);
}

/* dims of input i into dims (at most 8), its count into *rank, its element type into *etype */
static OrtStatus *input_shape(OrtApiTable api, const OrtValue *v, int64_t *dims, size_t *rank, int *etype) {
    OrtShapeInfo *info = NULL;
    OrtStatus *st = ORT(api, GetTensorTypeAndShape)(v, &info);
    if (st == NULL) st = ORT(api, GetDimensionsCount)(info, rank);
    if (st == NULL && (*rank < 1 || *rank > 8)) st = fail(api, ORT_INVALID_ARGUMENT, "MatMulKQuant: rank 1..8");
    if (st == NULL) st = ORT(api, GetDimensions)(info, dims, *rank);
    if (st == NULL) st = ORT(api, GetTensorElementType)(info, etype);
    if (info != NULL) ORT_RELEASE_SHAPE(api)(info);
    return st;
}

static OrtStatus *compute(void *kernel, OrtKernelContext *ctx) {
    const Kernel *kn = kernel;
    OrtApiTable api = kn->api;
    const OrtValue *xv = NULL, *wv = NULL;
    int64_t xd[8], wd[8];
    size_t xr = 0, wr = 0;
    int xt = 0, wt = 0;
    OrtStatus *st = ORT(api, KernelContext_GetInput)(ctx, 0, &xv);
    if (st == NULL) st = ORT(api, KernelContext_GetInput)(ctx, 1, &wv);
    if (st == NULL) st = input_shape(api, xv, xd, &xr, &xt);
    if (st == NULL) st = input_shape(api, wv, wd, &wr, &wt);
    if (st != NULL) return st;
    if (xt != T_FLOAT || wt != T_UINT8 || xd[xr - 1] != kn->k || wr != 2 || wd[0] != kn->n ||
        wd[1] != kq_row_bytes((int)kn->type, kn->k))
        return fail(api, ORT_INVALID_ARGUMENT, "MatMulKQuant: inputs do not match the node's type, k and n");
    int64_t m = 1;
    for (size_t i = 0; i + 1 < xr; i++) m *= xd[i];
    xd[xr - 1] = kn->n;
    OrtValue *yv = NULL;
    void *x = NULL, *w = NULL, *y = NULL;
    st = ORT(api, KernelContext_GetOutput)(ctx, 0, xd, xr, &yv);
    if (st == NULL) st = ORT(api, GetTensorMutableData)((OrtValue *)xv, &x);
    if (st == NULL) st = ORT(api, GetTensorMutableData)((OrtValue *)wv, &w);
    if (st == NULL) st = ORT(api, GetTensorMutableData)(yv, &y);
    if (st != NULL || m == 0) return st;
    Job job = {kn, x, NULL, w, y, m, 0};
    job.xq = malloc(sizeof(kq_block_q8) * (size_t)(m * (kn->k / KQ_QK)));
    if (job.xq == NULL) return fail(api, ORT_FAIL, "MatMulKQuant: out of memory");
    if (m == 1) {
        quantize_task(&job, 0);
    } else {
        st = ORT(api, KernelContext_ParallelFor)(ctx, quantize_task, (size_t)m, 0, &job);
    }
    /* ~16 rows a task for one token (a task per 16 KB of Q4_K weights at k = 1536); fewer, larger tasks for
     * a prompt, whose rows are reused by every token in the tile loop */
    job.rows_per_task = m == 1 ? 16 : 64;
    if (st == NULL) {
        const size_t tasks = (size_t)((kn->n + job.rows_per_task - 1) / job.rows_per_task);
        st = ORT(api, KernelContext_ParallelFor)(ctx, rows_task, tasks, 0, &job);
    }
    free(job.xq);
    return st;
}

static void compute_v1(void *kernel, OrtKernelContext *ctx) {
    OrtStatus *st = compute(kernel, ctx);
    if (st != NULL) ((ReleaseStatus_t)((const Kernel *)kernel)->api[I_ReleaseStatus])(st);
}

static void *create_kernel_v1(const OrtCustomOp *op, OrtApiTable api, const OrtKernelInfo *info) {
    void *kn = NULL;
    OrtStatus *st = create_kernel(op, api, info, &kn);
    if (st != NULL) ((ReleaseStatus_t)api[I_ReleaseStatus])(st);
    return kn;
}

static void destroy(void *kernel) { free(kernel); }
static const char *op_name(const OrtCustomOp *op) { (void)op; return "MatMulKQuant"; }
static const char *op_provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static int input_type(const OrtCustomOp *op, size_t i) { (void)op; return i == 0 ? T_FLOAT : T_UINT8; }
static size_t n_inputs(const OrtCustomOp *op) { (void)op; return 2; }
static int output_type(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return T_FLOAT; }
static size_t n_outputs(const OrtCustomOp *op) { (void)op; return 1; }
static int required(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return 0; }
static int mem_default(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return 0; }
static int one(const OrtCustomOp *op) { (void)op; return 1; }
static int start_version(const OrtCustomOp *op) { (void)op; return 1; }
static int end_version(const OrtCustomOp *op) { (void)op; return 0x7fffffff; }

static const OrtCustomOp MATMUL_KQUANT = {
    KQ_ORT_API_VERSION, create_kernel_v1, op_name, op_provider, input_type, n_inputs, output_type, n_outputs,
    compute_v1, destroy, required, required, mem_default, one, one, one, one, create_kernel, compute, NULL,
    start_version, end_version,
};

/* what ORT calls when Python's SessionOptions.register_custom_ops_library loads this library */
OrtStatus *RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
    OrtApiTable api = base->GetApi(KQ_ORT_API_VERSION);
    if (api == NULL) return NULL; /* older than ORT 1.17: edge requires onnxruntime >= 1.20 */
    OrtCustomOpDomain *domain = NULL;
    OrtStatus *st = ORT(api, CreateCustomOpDomain)("edge.kquant", &domain);
    if (st == NULL) st = ORT(api, CustomOpDomain_Add)(domain, &MATMUL_KQUANT);
    if (st == NULL) st = ORT(api, AddCustomOpDomain)(options, domain);
    /* NOTE: the domain is not released: ORT keeps using it for every session these options open */
    return st;
}
