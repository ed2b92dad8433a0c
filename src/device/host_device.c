/*
 * host_device.c -- the host device: plain memory, elementwise kernels stamped out per type
 * from one definition, sgemm through CBLAS and the symmetric eigen-solve through LAPACKE.
 * Synchronous: every operation is complete when it returns.
 */
#include <cblas.h>
#include <lapacke.h>
#include <pthread.h>
#include <stdlib.h>

#include "gvq_device.h"

static void *host_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

static void host_free(void *p) {
    free(p);
}

static gvqResult_t host_copy(void *dst, const void *src, size_t bytes) {
    if (dst != src && bytes) memmove(dst, src, bytes);
    return gvqSuccess;
}

/* half -> float through a table of all 65536 values: the bit-level conversion's branches made
 * fp16 reductions about ten times slower than bf16 ones */
static float half_table[65536];
static pthread_once_t half_once = PTHREAD_ONCE_INIT;
static void half_table_init(void) {
    for (uint32_t h = 0; h < 65536; h++)
        half_table[h] = gvq_half_to_float((uint16_t)h);
}
#define HALF_LOAD(h) (half_table[(h)])

/* Integer sums and products wrap (computed in the unsigned type, so no signed overflow). */
#define OP_SUM(a, b) ((a) + (b))
#define OP_PROD(a, b) ((a) * (b))
#define OP_MAX(a, b) ((a) > (b) ? (a) : (b))
#define OP_MIN(a, b) ((a) < (b) ? (a) : (b))
/* Floating max/min propagate NaN (either operand), as Open MPI's do. NCCL's (fmaxf/fminf,
 * __hmax/__hmin) return the other operand instead, so a NaN can vanish on the NCCL path for
 * CUDA buffers (README, the paragraph on CUDA buffers). */
#define OP_MAXF(a, b) ((a) != (a) ? (a) : ((a) > (b) ? (a) : (b)))
#define OP_MINF(a, b) ((a) != (a) ? (a) : ((a) < (b) ? (a) : (b)))

/* One kernel per (type, op): T is the storage type, A the arithmetic type, LOAD/STORE convert. */
#define STAMP_KERNEL(name, T, A, LOAD, STORE, OP)                            \
    static void name(void *dstv, const void *av, const void *bv, size_t n) { \
        T *dst = (T *)dstv;                                                  \
        const T *a = (const T *)av, *b = (const T *)bv;                      \
        for (size_t i = 0; i < n; i++) {                                     \
            A x = LOAD(a[i]), y = LOAD(b[i]);                                \
            dst[i] = STORE(OP(x, y));                                        \
        }                                                                    \
    }

#define ID(x) (x)
#define STAMP_UNSIGNED(tag, T, A, STORE)                 \
    STAMP_KERNEL(k_sum_##tag, T, A, ID, STORE, OP_SUM)   \
    STAMP_KERNEL(k_prod_##tag, T, A, ID, STORE, OP_PROD) \
    STAMP_KERNEL(k_max_##tag, T, T, ID, ID, OP_MAX)      \
    STAMP_KERNEL(k_min_##tag, T, T, ID, ID, OP_MIN)

#define STAMP_FLOAT(tag, T, A, LOAD, STORE)                \
    STAMP_KERNEL(k_sum_##tag, T, A, LOAD, STORE, OP_SUM)   \
    STAMP_KERNEL(k_prod_##tag, T, A, LOAD, STORE, OP_PROD) \
    STAMP_KERNEL(k_max_##tag, T, A, LOAD, STORE, OP_MAXF)  \
    STAMP_KERNEL(k_min_##tag, T, A, LOAD, STORE, OP_MINF)

/* Signed integers: max/min compare signed, sum/prod wrap through the unsigned type. */
#define STAMP_SIGNED(tag, T, U)                         \
    STAMP_KERNEL(k_sum_##tag, T, U, (U), (T), OP_SUM)   \
    STAMP_KERNEL(k_prod_##tag, T, U, (U), (T), OP_PROD) \
    STAMP_KERNEL(k_max_##tag, T, T, ID, ID, OP_MAX)     \
    STAMP_KERNEL(k_min_##tag, T, T, ID, ID, OP_MIN)

/* uint8/int8 promote to int in C; do the arithmetic in unsigned int and truncate. */
STAMP_SIGNED(i8, int8_t, unsigned int)
STAMP_UNSIGNED(u8, uint8_t, unsigned int, (uint8_t))
STAMP_SIGNED(i32, int32_t, uint32_t)
STAMP_UNSIGNED(u32, uint32_t, uint32_t, ID)
STAMP_SIGNED(i64, int64_t, uint64_t)
STAMP_UNSIGNED(u64, uint64_t, uint64_t, ID)
STAMP_FLOAT(f16, uint16_t, float, HALF_LOAD, gvq_float_to_half)
STAMP_FLOAT(f32, float, float, ID, ID)
STAMP_FLOAT(f64, double, double, ID, ID)
STAMP_FLOAT(bf16, uint16_t, float, gvq_bf16_to_float, gvq_float_to_bf16)

typedef void (*kernel_fn)(void *, const void *, const void *, size_t);
#define KROW(tag) \
    { k_sum_##tag, k_prod_##tag, k_max_##tag, k_min_##tag, k_sum_##tag }
static const kernel_fn kernels[gvqNumTypes][gvqNumOps] = {
    [gvqInt8] = KROW(i8),       [gvqUint8] = KROW(u8),    [gvqInt32] = KROW(i32),
    [gvqUint32] = KROW(u32),    [gvqInt64] = KROW(i64),   [gvqUint64] = KROW(u64),
    [gvqFloat16] = KROW(f16),   [gvqFloat32] = KROW(f32), [gvqFloat64] = KROW(f64),
    [gvqBfloat16] = KROW(bf16),
};

static gvqResult_t host_reduce(void *dst, const void *a, const void *b, size_t count,
                               gvqDataType_t type, gvqRedOp_t op) {
    if (!gvq_dtype_valid((int)type) || !gvq_op_valid((int)op)) {
        GVQ_WARN("host reduce: invalid datatype %d or op %d", (int)type, (int)op);
        return gvqInternalError;
    }
    if (type == gvqFloat16) pthread_once(&half_once, half_table_init);
    kernels[type][op](dst, a, b, count);
    return gvqSuccess;
}

#define STAMP_DIVIDE(tag, T, A, LOAD, STORE)                 \
    static void d_##tag(void *bufv, size_t n, int divisor) { \
        T *buf = (T *)bufv;                                  \
        for (size_t i = 0; i < n; i++)                       \
            buf[i] = STORE(LOAD(buf[i]) / (A)divisor);       \
    }
STAMP_DIVIDE(i8, int8_t, int, ID, (int8_t))
STAMP_DIVIDE(u8, uint8_t, int, ID, (uint8_t))
STAMP_DIVIDE(i32, int32_t, int32_t, ID, ID)
STAMP_DIVIDE(u32, uint32_t, uint32_t, ID, ID)
STAMP_DIVIDE(i64, int64_t, int64_t, ID, ID)
STAMP_DIVIDE(u64, uint64_t, uint64_t, ID, ID)
STAMP_DIVIDE(f16, uint16_t, float, HALF_LOAD, gvq_float_to_half)
STAMP_DIVIDE(f32, float, float, ID, ID)
STAMP_DIVIDE(f64, double, double, ID, ID)
STAMP_DIVIDE(bf16, uint16_t, float, gvq_bf16_to_float, gvq_float_to_bf16)

typedef void (*divide_fn)(void *, size_t, int);
static const divide_fn dividers[gvqNumTypes] = {
    [gvqInt8] = d_i8,     [gvqUint8] = d_u8,      [gvqInt32] = d_i32,   [gvqUint32] = d_u32,
    [gvqInt64] = d_i64,   [gvqUint64] = d_u64,    [gvqFloat16] = d_f16, [gvqFloat32] = d_f32,
    [gvqFloat64] = d_f64, [gvqBfloat16] = d_bf16,
};

static gvqResult_t host_divide(void *buf, size_t count, gvqDataType_t type, int divisor) {
    if (!gvq_dtype_valid((int)type) || divisor <= 0) {
        GVQ_WARN("host divide: invalid datatype %d or divisor %d", (int)type, divisor);
        return gvqInternalError;
    }
    if (type == gvqFloat16) pthread_once(&half_once, half_table_init);
    dividers[type](buf, count, divisor);
    return gvqSuccess;
}

static gvqResult_t host_sgemm(int transa, int transb, int m, int n, int k, float alpha,
                              const float *a, int lda, const float *b, int ldb, float beta,
                              float *c, int ldc) {
    cblas_sgemm(CblasColMajor, transa ? CblasTrans : CblasNoTrans,
                transb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return gvqSuccess;
}

static gvqResult_t host_ssyevd(int n, float *a, int lda, float *w) {
    lapack_int info = LAPACKE_ssyevd(LAPACK_COL_MAJOR, 'V', 'L', n, a, lda, w);
    if (info != 0) {
        GVQ_WARN("LAPACKE_ssyevd(n=%d) failed: info=%d (%s)", n, (int)info,
                 info < 0 ? "illegal argument" : "no convergence");
        return gvqInternalError;
    }
    return gvqSuccess;
}

static gvqResult_t host_sync(void) {
    return gvqSuccess;
}

/* ---- streams, events, pinned memory, scale, cast, collocation, covariance -------------------- */

static gvqResult_t host_set_stream(void *stream, void **prev) {
    (void)stream;
    if (prev != NULL) *prev = NULL;
    return gvqSuccess;
}

/* The host device finishes everything before returning: an event is a token with no state. */
static char host_event_token;
static gvqResult_t host_event_create(void **ev) {
    *ev = &host_event_token;
    return gvqSuccess;
}
static void host_event_destroy(void *ev) {
    (void)ev;
}
static gvqResult_t host_event_noop(void *ev) {
    (void)ev;
    return gvqSuccess;
}

static gvqResult_t host_copy_between(void *dst, const void *src, size_t bytes) {
    return host_copy(dst, src, bytes);
}

/* Values of the float types as double (fp16/bf16/fp32 convert exactly) and back. */
static double host_load_float(const void *p, size_t i, gvqDataType_t t) {
    switch (t) {
    case gvqFloat16:
        return gvq_half_to_float(((const uint16_t *)p)[i]);
    case gvqBfloat16:
        return gvq_bf16_to_float(((const uint16_t *)p)[i]);
    case gvqFloat32:
        return ((const float *)p)[i];
    default:
        return ((const double *)p)[i];
    }
}
static void host_store_float(void *p, size_t i, gvqDataType_t t, double v) {
    switch (t) {
    case gvqFloat16:
        ((uint16_t *)p)[i] = gvq_float_to_half((float)v);
        break;
    case gvqBfloat16:
        ((uint16_t *)p)[i] = gvq_float_to_bf16((float)v);
        break;
    case gvqFloat32:
        ((float *)p)[i] = (float)v;
        break;
    default:
        ((double *)p)[i] = v;
        break;
    }
}
static int host_is_float(gvqDataType_t t) {
    return t == gvqFloat16 || t == gvqBfloat16 || t == gvqFloat32 || t == gvqFloat64;
}

static gvqResult_t host_scale(void *dst, const void *src, size_t count, gvqDataType_t type,
                              double alpha) {
    if (!host_is_float(type)) {
        GVQ_WARN("host scale: datatype %d is not a float type", (int)type);
        return gvqInvalidArgument;
    }
    if (type == gvqFloat64) {
        for (size_t i = 0; i < count; i++)
            ((double *)dst)[i] = ((const double *)src)[i] * alpha;
        return gvqSuccess;
    }
    const float a = (float)alpha; /* fp16/bf16/fp32 scale in fp32 */
    for (size_t i = 0; i < count; i++)
        host_store_float(dst, i, type, (double)((float)host_load_float(src, i, type) * a));
    return gvqSuccess;
}

static gvqResult_t host_cast(void *dst, gvqDataType_t dtype, const void *src, gvqDataType_t stype,
                             size_t count) {
    if (!host_is_float(dtype) || !host_is_float(stype)) {
        GVQ_WARN("host cast: datatypes %d -> %d are not both float types", (int)stype, (int)dtype);
        return gvqInvalidArgument;
    }
    for (size_t i = 0; i < count; i++)
        host_store_float(dst, i, dtype, host_load_float(src, i, stype));
    return gvqSuccess;
}

static gvqResult_t host_collocate(const float *src, float *dst, size_t K, size_t D, size_t H,
                                  size_t W, int inverse) {
    for (size_t k = 0; k < K; k++)
        for (size_t d = 0; d < D; d++)
            for (size_t h = 0; h < H; h++)
                for (size_t w = 0; w < W; w++) {
                    size_t natural = ((k * D + d) * H + h) * W + w,
                           coll = ((h * W + w) * D + d) * K + k;
                    if (inverse)
                        dst[natural] = src[coll];
                    else
                        dst[coll] = src[natural];
                }
    return gvqSuccess;
}

static gvqResult_t host_scov(int L, int T, const float *samples, float *Z, float *cov) {
    if (L <= 0 || T <= 0) {
        GVQ_WARN("host scov: L=%d T=%d must be positive", L, T);
        return gvqInvalidArgument;
    }
    float *xc = malloc(sizeof(float) * (size_t)L * (size_t)T);
    if (xc == NULL) return gvqSystemError;
    for (int i = 0; i < L; i++) {
        double m = 0;
        for (int t = 0; t < T; t++)
            m += samples[(size_t)t * L + i];
        Z[i] = (float)(m / (double)T);
    }
    for (int t = 0; t < T; t++)
        for (int i = 0; i < L; i++)
            xc[(size_t)t * L + i] = samples[(size_t)t * L + i] - Z[i];
    cblas_ssyrk(CblasColMajor, CblasLower, CblasNoTrans, L, T, 1.0f / (float)T, xc, L, 0.0f, cov,
                L);
    free(xc);
    return gvqSuccess;
}

static gvqResult_t host_qsgd_encode_combine(const struct gvq_dev_qsgd *q, size_t off, size_t count,
                                            const float *local, const void *in, void *out) {
    (void)q, (void)off, (void)count, (void)local, (void)in, (void)out;
    return gvq_device_not_supported("host",
                                    "qsgd_encode_combine (the host codec runs its own loop)");
}
static gvqResult_t host_qsgd_decode(const struct gvq_dev_qsgd *q, size_t off, size_t count,
                                    const void *wire, float *dst) {
    (void)q, (void)off, (void)count, (void)wire, (void)dst;
    return gvq_device_not_supported("host", "qsgd_decode (the host codec runs its own loop)");
}
static gvqResult_t host_gq_encode_combine(const struct gvq_dev_gq *g, size_t off, size_t count,
                                          const float *local, const void *in, void *out,
                                          double norms[3]) {
    (void)g, (void)off, (void)count, (void)local, (void)in, (void)out, (void)norms;
    return gvq_device_not_supported("host", "gq_encode_combine (the host codec runs its own loop)");
}
static gvqResult_t host_gq_decode(const struct gvq_dev_gq *g, size_t off, size_t count,
                                  const void *wire, float *dst) {
    (void)g, (void)off, (void)count, (void)wire, (void)dst;
    return gvq_device_not_supported("host", "gq_decode (the host codec runs its own loop)");
}

const gvq_device_ops_t gvq_host_device = {
    .size = sizeof(gvq_device_ops_t),
    .name = "host",
    .alloc = host_alloc,
    .free = host_free,
    .copy = host_copy,
    .reduce = host_reduce,
    .divide = host_divide,
    .sgemm = host_sgemm,
    .ssyevd = host_ssyevd,
    .sync = host_sync,
    .set_stream = host_set_stream,
    .event_create = host_event_create,
    .event_destroy = host_event_destroy,
    .event_record = host_event_noop,
    .event_wait = host_event_noop,
    .event_sync = host_event_noop,
    .host_alloc = host_alloc,
    .host_free = host_free,
    .copy_from_host = host_copy_between,
    .copy_to_host = host_copy_between,
    .scale = host_scale,
    .cast = host_cast,
    .collocate = host_collocate,
    .scov = host_scov,
    .qsgd_encode_combine = host_qsgd_encode_combine,
    .qsgd_decode = host_qsgd_decode,
    .gq_encode_combine = host_gq_encode_combine,
    .gq_decode = host_gq_decode,
};

gvqResult_t gvq_host_sgemm(int transa, int transb, int m, int n, int k, float alpha, const float *a,
                           int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    return host_sgemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
