/*
 * gvq_cuda.h -- what the sources of the CUDA device share (cuda/ only, CUDA C++): the calling
 * thread's context, the checks for cuBLAS, cuSOLVER and kernel launches, the launch geometry,
 * and the operations each source contributes to the ops table.
 *
 *   cuda_device.cu        the table; memory, copies, streams, events
 *        |
 *        v
 *   elementwise.cu  linalg.cu  codec_qsgd.cu  codec_gradiveq.cu   <- nccl.c (gvq_cuda_divide_on)
 *        |
 *        v
 *   context.cu            the thread's stream, handles, scratch    <- nccl.c (current stream)
 *        |
 *        v
 *   cuda_probe.c          how many devices there are
 *
 * A file calls only files of the rows below its own (scripts/check-calls.py checks that no two
 * files call each other).
 *
 * Kernels that mirror host code do the host's operations in the host's types, so that the CUDA
 * device agrees with the host device bit for bit where the arithmetic allows it. nvcc contracts
 * a*b+c into an FMA by default, so they spell their roundings with __fmul_rn/__fadd_rn where it
 * matters.
 */
#ifndef GVQ_CUDA_H_
#define GVQ_CUDA_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>
#include <stddef.h>

extern "C" {
#include "gvq_device.h"
}
#include "gvq_cuda_check.h" /* CUDACHECK */

/* ---- errors: one check per foreign library, converting at the boundary ----------------------- */

#define CUBLASCHECK(call)                                             \
    do {                                                              \
        cublasStatus_t s_ = (call);                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                            \
            GVQ_WARN("cuBLAS: %s failed: status %d", #call, (int)s_); \
            return gvqUnhandledCudaError;                             \
        }                                                             \
    } while (0)
#define CUSOLVERCHECK(call)                                             \
    do {                                                                \
        cusolverStatus_t s_ = (call);                                   \
        if (s_ != CUSOLVER_STATUS_SUCCESS) {                            \
            GVQ_WARN("cuSOLVER: %s failed: status %d", #call, (int)s_); \
            return gvqUnhandledCudaError;                               \
        }                                                               \
    } while (0)
/* A kernel launch: configuration errors surface at once, execution errors at the next wait. */
#define LAUNCHCHECK(what) CUDACHECK(cudaGetLastError())

/* ---- the per-thread context (context.cu) ----------------------------------------------------- */

/* Made on a thread's first operation, freed when the thread exits. Operations are queued on
 * `cur`; blas and solver are bound to it, so whoever changes cur rebinds them (set_stream). */
typedef struct {
    int device;            /* the device current when the context was made */
    cudaStream_t own, cur; /* the context's own stream; the current one (own or the caller's) */
    cublasHandle_t blas;
    cusolverDnHandle_t solver;
    void *scratch; /* shared by the thread's operations: they are ordered on cur */
    size_t scratch_bytes;
    double *norms; /* 3 doubles on the device */
    int *info;     /* cuSOLVER's info on the device */
} gvq_cuda_ctx_t;

extern "C" {
/* The calling thread's context, made on first use; gvqUnhandledCudaError without a device. */
gvqResult_t gvq_cuda_ctx(gvq_cuda_ctx_t **out);
/* At least `bytes` of the context's scratch area; growing it waits for the current stream. */
gvqResult_t gvq_cuda_scratch(gvq_cuda_ctx_t *c, size_t bytes, void **out);
}

/* Declares c, the calling thread's context, or returns its error. */
#define CTX(c)         \
    gvq_cuda_ctx_t *c; \
    GVQCHECK(gvq_cuda_ctx(&c))

/* ---- launch geometry ------------------------------------------------------------------------- */

enum { THREADS = 256 };
static inline unsigned blocks_for(size_t n) {
    size_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}
#define GRID_LOOP(i, n)                                                     \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)

/* ---- the operations of the table, by the file that holds them (see gvq_device.h) ------------- */

extern "C" {
/* elementwise.cu */
gvqResult_t gvq_cuda_reduce(void *dst, const void *a, const void *b, size_t count,
                            gvqDataType_t type, gvqRedOp_t op);
gvqResult_t gvq_cuda_divide(void *buf, size_t count, gvqDataType_t type, int divisor);
gvqResult_t gvq_cuda_scale(void *dst, const void *src, size_t count, gvqDataType_t type,
                           double alpha);
gvqResult_t gvq_cuda_cast(void *dst, gvqDataType_t dtype, const void *src, gvqDataType_t stype,
                          size_t count);
gvqResult_t gvq_cuda_collocate(const float *src, float *dst, size_t K, size_t D, size_t H, size_t W,
                               int inverse);

/* linalg.cu */
gvqResult_t gvq_cuda_sgemm(int transa, int transb, int m, int n, int k, float alpha, const float *a,
                           int lda, const float *b, int ldb, float beta, float *cm, int ldc);
gvqResult_t gvq_cuda_ssyevd(int n, float *a, int lda, float *w);
gvqResult_t gvq_cuda_scov(int L, int T, const float *samples, float *Z, float *cov);

/* codec_qsgd.cu */
gvqResult_t gvq_cuda_qsgd_encode_combine(const gvq_dev_qsgd_t *q, size_t off, size_t count,
                                         const float *local, const void *in, void *out);
gvqResult_t gvq_cuda_qsgd_decode(const gvq_dev_qsgd_t *q, size_t off, size_t count,
                                 const void *wire, float *dst);

/* codec_gradiveq.cu */
gvqResult_t gvq_cuda_gq_encode_combine(const gvq_dev_gq_t *g, size_t off, size_t count,
                                       const float *x, const void *in, void *out, double norms[3]);
gvqResult_t gvq_cuda_gq_decode(const gvq_dev_gq_t *g, size_t off, size_t count, const void *wire,
                               float *dst);
}

#endif /* GVQ_CUDA_H_ */
