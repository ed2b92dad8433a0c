/*
 * cuda_device.cu -- the CUDA device: the device ops table (src/include/gvq_device.h) for CUDA
 * device memory. Kernels for the elementwise operations, cuBLAS for the gemms and the
 * covariance, cuSOLVER for the symmetric eigen-solve.
 *
 *   thread -> context (first use): the device current then, a stream of its own, a cuBLAS and a
 *             cuSOLVER handle bound to the current stream, a scratch area, 3 doubles for norms
 *   op     -> queued on the thread's current stream (set_stream picks the caller's stream);
 *             sync / event_sync / copy_to_host are where the host waits
 *
 * Bit-for-bit agreement with the host device where the arithmetic allows it: the elementwise
 * kernels do the host's operations in the host's types (fp16/bf16 through the very conversion
 * functions of gvq_util.h, compiled as device functions here), the QSGD kernels draw their bits
 * from gvq_rng.h's Philox and take each bucket's norm in the host's order (one thread per bucket),
 * and the PCA mean is summed in double in the host's order. Products through cuBLAS differ from
 * CBLAS by rounding only. nvcc contracts a*b+c into an FMA by default, so the kernels that mirror
 * host code spell their roundings with __fmul_rn/__fadd_rn where it matters.
 *
 * Every pointer handed to these operations is device memory (copy_from_host/copy_to_host and
 * host_alloc excepted). The scratch area is shared by the operations of one thread, which is safe
 * because they are ordered on one stream; set_stream drains the old stream before switching.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "gvq_device.h"
#include "gvq_rng.h"
}
#include "gvq_cuda_check.h" /* CUDACHECK */

/* ---- errors: one check per foreign library, converting at the boundary ------------------------ */

#define CUBLASCHECK(call)                                                                \
    do {                                                                                 \
        cublasStatus_t s_ = (call);                                                      \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                               \
            GVQ_WARN("cuBLAS: %s failed: status %d", #call, (int)s_);                    \
            return gvqUnhandledCudaError;                                                \
        }                                                                                \
    } while (0)
#define CUSOLVERCHECK(call)                                                              \
    do {                                                                                 \
        cusolverStatus_t s_ = (call);                                                    \
        if (s_ != CUSOLVER_STATUS_SUCCESS) {                                             \
            GVQ_WARN("cuSOLVER: %s failed: status %d", #call, (int)s_);                  \
            return gvqUnhandledCudaError;                                                \
        }                                                                                \
    } while (0)
/* A kernel launch: configuration errors surface at once, execution errors at the next wait. */
#define LAUNCHCHECK(what) CUDACHECK(cudaGetLastError())

/* ---- the per-thread context -------------------------------------------------------------------- */

typedef struct {
    int device;
    cudaStream_t own, cur;
    cublasHandle_t blas;
    cusolverDnHandle_t solver;
    void *scratch;
    size_t scratch_bytes;
    double *norms; /* 3 doubles on the device */
    int *info;     /* cuSOLVER's info on the device */
} cuda_ctx_t;

static pthread_key_t ctx_key;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;

static void ctx_free(void *p) {
    cuda_ctx_t *c = (cuda_ctx_t *)p;
    if (c == NULL) return;
    if (c->own) cudaStreamSynchronize(c->own);
    if (c->solver) cusolverDnDestroy(c->solver);
    if (c->blas) cublasDestroy(c->blas);
    cudaFree(c->scratch);
    cudaFree(c->norms);
    cudaFree(c->info);
    if (c->own) cudaStreamDestroy(c->own);
    free(c);
}

static void ctx_key_init(void) { pthread_key_create(&ctx_key, ctx_free); }

static gvqResult_t ctx_create(cuda_ctx_t **out) {
    cuda_ctx_t *c = (cuda_ctx_t *)calloc(1, sizeof *c);
    if (c == NULL) return gvqSystemError;
    gvqResult_t res = gvqUnhandledCudaError;
    if (cudaGetDevice(&c->device) != cudaSuccess ||
        cudaStreamCreateWithFlags(&c->own, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc((void **)&c->norms, 3 * sizeof(double)) != cudaSuccess ||
        cudaMalloc((void **)&c->info, sizeof(int)) != cudaSuccess) {
        GVQ_WARN("CUDA device: cannot set up the thread's stream and buffers: %s",
                 cudaGetErrorString(cudaGetLastError()));
        goto err_free;
    }
    c->cur = c->own;
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(c->blas, c->cur) != CUBLAS_STATUS_SUCCESS) {
        GVQ_WARN("CUDA device: cannot create the cuBLAS handle");
        goto err_free;
    }
    if (cusolverDnCreate(&c->solver) != CUSOLVER_STATUS_SUCCESS ||
        cusolverDnSetStream(c->solver, c->cur) != CUSOLVER_STATUS_SUCCESS) {
        GVQ_WARN("CUDA device: cannot create the cuSOLVER handle");
        goto err_free;
    }
    *out = c;
    return gvqSuccess;
err_free:
    ctx_free(c);
    return res;
}

static gvqResult_t get_ctx(cuda_ctx_t **out) {
    pthread_once(&ctx_once, ctx_key_init);
    cuda_ctx_t *c = (cuda_ctx_t *)pthread_getspecific(ctx_key);
    if (c == NULL) {
        if (gvq_cuda_device_count() == 0) {
            GVQ_WARN("CUDA device: no usable CUDA device");
            return gvqUnhandledCudaError;
        }
        GVQCHECK(ctx_create(&c));
        pthread_setspecific(ctx_key, c);
    }
    *out = c;
    return gvqSuccess;
}
#define CTX(c)        \
    cuda_ctx_t *c;    \
    GVQCHECK(get_ctx(&c))

static gvqResult_t ctx_scratch(cuda_ctx_t *c, size_t bytes, void **out) {
    if (c->scratch_bytes < bytes) {
        CUDACHECK(cudaStreamSynchronize(c->cur));
        cudaFree(c->scratch);
        c->scratch = NULL;
        c->scratch_bytes = 0;
        size_t want = bytes + bytes / 4 + 256;
        CUDACHECK(cudaMalloc(&c->scratch, want));
        c->scratch_bytes = want;
    }
    *out = c->scratch;
    return gvqSuccess;
}

extern "C" void *gvq_cuda_current_stream(void) {
    cuda_ctx_t *c;
    if (get_ctx(&c) != gvqSuccess) return NULL;
    return (void *)c->cur;
}

/* ---- launch geometry -------------------------------------------------------------------------- */

enum { THREADS = 256 };
static unsigned blocks_for(size_t n) {
    size_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}
#define GRID_LOOP(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

/* ---- memory ----------------------------------------------------------------------------------- */

static void *cu_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 64) != cudaSuccess) {
        GVQ_WARN("CUDA device: cudaMalloc(%zu) failed: %s", bytes, cudaGetErrorString(cudaGetLastError()));
        return NULL;
    }
    return p;
}

static void cu_free(void *p) {
    if (p != NULL) cudaFree(p);
}

static void *cu_host_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 64) != cudaSuccess) {
        GVQ_WARN("CUDA device: cudaMallocHost(%zu) failed: %s", bytes,
                 cudaGetErrorString(cudaGetLastError()));
        return NULL;
    }
    return p;
}

static void cu_host_free(void *p) {
    if (p != NULL) cudaFreeHost(p);
}

static gvqResult_t cu_copy(void *dst, const void *src, size_t bytes) {
    if (dst == src || bytes == 0) return gvqSuccess;
    CTX(c);
    CUDACHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->cur));
    return gvqSuccess;
}

static gvqResult_t cu_copy_from_host(void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return gvqSuccess;
    CTX(c);
    CUDACHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->cur));
    CUDACHECK(cudaStreamSynchronize(c->cur));
    return gvqSuccess;
}

static gvqResult_t cu_copy_to_host(void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return gvqSuccess;
    CTX(c);
    CUDACHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->cur));
    CUDACHECK(cudaStreamSynchronize(c->cur));
    return gvqSuccess;
}

/* ---- ordering --------------------------------------------------------------------------------- */

static gvqResult_t cu_sync(void) {
    CTX(c);
    CUDACHECK(cudaStreamSynchronize(c->cur));
    return gvqSuccess;
}

static gvqResult_t cu_set_stream(void *stream, void **prev) {
    CTX(c);
    cudaStream_t s = stream != NULL ? (cudaStream_t)stream : c->own;
    if (prev != NULL) *prev = c->cur == c->own ? NULL : (void *)c->cur;
    if (s == c->cur) return gvqSuccess;
    CUDACHECK(cudaStreamSynchronize(c->cur)); /* the scratch area may be in use there */
    c->cur = s;
    CUBLASCHECK(cublasSetStream(c->blas, s));
    CUSOLVERCHECK(cusolverDnSetStream(c->solver, s));
    return gvqSuccess;
}

static gvqResult_t cu_event_create(void **ev) {
    cudaEvent_t e;
    CUDACHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *ev = (void *)e;
    return gvqSuccess;
}

static void cu_event_destroy(void *ev) {
    if (ev != NULL) cudaEventDestroy((cudaEvent_t)ev);
}

static gvqResult_t cu_event_record(void *ev) {
    CTX(c);
    CUDACHECK(cudaEventRecord((cudaEvent_t)ev, c->cur));
    return gvqSuccess;
}

static gvqResult_t cu_event_wait(void *ev) {
    CTX(c);
    CUDACHECK(cudaStreamWaitEvent(c->cur, (cudaEvent_t)ev, 0));
    return gvqSuccess;
}

static gvqResult_t cu_event_sync(void *ev) {
    CUDACHECK(cudaEventSynchronize((cudaEvent_t)ev));
    return gvqSuccess;
}

/* ---- element types: load into the arithmetic type, store back --------------------------------- */

enum { K_PLAIN = 0, K_HALF = 1, K_BF16 = 2 };

template <class S, class A, int KIND> __device__ __forceinline__ A ld(S v) {
    if (KIND == K_HALF) return (A)gvq_half_to_float((uint16_t)v);
    if (KIND == K_BF16) return (A)gvq_bf16_to_float((uint16_t)v);
    return (A)v;
}
template <class S, class A, int KIND> __device__ __forceinline__ S st(A v) {
    if (KIND == K_HALF) return (S)gvq_float_to_half((float)v);
    if (KIND == K_BF16) return (S)gvq_float_to_bf16((float)v);
    return (S)v;
}

enum { R_SUM = 0, R_PROD = 1, R_MAX = 2, R_MIN = 3 };

/* The host's OP_* macros: integer sums and products wrap in the unsigned arithmetic type; float
 * max/min propagate a NaN of either operand. */
template <class A, int OP, bool FLT> __device__ __forceinline__ A apply(A x, A y) {
    if (OP == R_SUM) return x + y;
    if (OP == R_PROD) return x * y;
    if (FLT && x != x) return x;
    if (OP == R_MAX) return x > y ? x : y;
    return x < y ? x : y;
}

template <class S, class A, int KIND, int OP, bool FLT>
__global__ void k_reduce(S *dst, const S *a, const S *b, size_t n) {
    GRID_LOOP(i, n) {
        A x = ld<S, A, KIND>(a[i]), y = ld<S, A, KIND>(b[i]);
        dst[i] = st<S, A, KIND>(apply<A, OP, FLT>(x, y));
    }
}

/* AS: the arithmetic type of sum/prod; AM: that of max/min. */
template <class S, class AS, class AM, int KIND, bool FLT>
static gvqResult_t launch_reduce(void *dst, const void *a, const void *b, size_t n, int op,
                                 cudaStream_t s) {
    S *d = (S *)dst;
    const S *x = (const S *)a, *y = (const S *)b;
    unsigned g = blocks_for(n);
    switch (op) {
    case gvqSum:
    case gvqAvg: k_reduce<S, AS, KIND, R_SUM, FLT><<<g, THREADS, 0, s>>>(d, x, y, n); break;
    case gvqProd: k_reduce<S, AS, KIND, R_PROD, FLT><<<g, THREADS, 0, s>>>(d, x, y, n); break;
    case gvqMax: k_reduce<S, AM, KIND, R_MAX, FLT><<<g, THREADS, 0, s>>>(d, x, y, n); break;
    default: k_reduce<S, AM, KIND, R_MIN, FLT><<<g, THREADS, 0, s>>>(d, x, y, n); break;
    }
    LAUNCHCHECK("reduce");
    return gvqSuccess;
}

static gvqResult_t cu_reduce(void *dst, const void *a, const void *b, size_t count,
                             gvqDataType_t type, gvqRedOp_t op) {
    if (!gvq_dtype_valid((int)type) || !gvq_op_valid((int)op)) {
        GVQ_WARN("CUDA reduce: invalid datatype %d or op %d", (int)type, (int)op);
        return gvqInternalError;
    }
    if (count == 0) return gvqSuccess;
    CTX(c);
    cudaStream_t s = c->cur;
    int o = (int)op;
    switch (type) {
    case gvqInt8: return launch_reduce<int8_t, unsigned int, int8_t, K_PLAIN, false>(dst, a, b, count, o, s);
    case gvqUint8: return launch_reduce<uint8_t, unsigned int, uint8_t, K_PLAIN, false>(dst, a, b, count, o, s);
    case gvqInt32: return launch_reduce<int32_t, uint32_t, int32_t, K_PLAIN, false>(dst, a, b, count, o, s);
    case gvqUint32: return launch_reduce<uint32_t, uint32_t, uint32_t, K_PLAIN, false>(dst, a, b, count, o, s);
    case gvqInt64: return launch_reduce<int64_t, uint64_t, int64_t, K_PLAIN, false>(dst, a, b, count, o, s);
    case gvqUint64: return launch_reduce<uint64_t, uint64_t, uint64_t, K_PLAIN, false>(dst, a, b, count, o, s);
    case gvqFloat16: return launch_reduce<uint16_t, float, float, K_HALF, true>(dst, a, b, count, o, s);
    case gvqFloat32: return launch_reduce<float, float, float, K_PLAIN, true>(dst, a, b, count, o, s);
    case gvqFloat64: return launch_reduce<double, double, double, K_PLAIN, true>(dst, a, b, count, o, s);
    default: return launch_reduce<uint16_t, float, float, K_BF16, true>(dst, a, b, count, o, s);
    }
}

template <class S, class A, int KIND> __global__ void k_divide(S *buf, size_t n, int divisor) {
    GRID_LOOP(i, n) buf[i] = st<S, A, KIND>(ld<S, A, KIND>(buf[i]) / (A)divisor);
}

template <class S, class A, int KIND>
static gvqResult_t launch_divide(void *buf, size_t n, int divisor, cudaStream_t s) {
    k_divide<S, A, KIND><<<blocks_for(n), THREADS, 0, s>>>((S *)buf, n, divisor);
    LAUNCHCHECK("divide");
    return gvqSuccess;
}

static gvqResult_t divide_on(void *buf, size_t count, gvqDataType_t type, int divisor,
                             cudaStream_t s) {
    if (!gvq_dtype_valid((int)type) || divisor <= 0) {
        GVQ_WARN("CUDA divide: invalid datatype %d or divisor %d", (int)type, divisor);
        return gvqInternalError;
    }
    if (count == 0) return gvqSuccess;
    switch (type) { /* the host's STAMP_DIVIDE types */
    case gvqInt8: return launch_divide<int8_t, int, K_PLAIN>(buf, count, divisor, s);
    case gvqUint8: return launch_divide<uint8_t, int, K_PLAIN>(buf, count, divisor, s);
    case gvqInt32: return launch_divide<int32_t, int32_t, K_PLAIN>(buf, count, divisor, s);
    case gvqUint32: return launch_divide<uint32_t, uint32_t, K_PLAIN>(buf, count, divisor, s);
    case gvqInt64: return launch_divide<int64_t, int64_t, K_PLAIN>(buf, count, divisor, s);
    case gvqUint64: return launch_divide<uint64_t, uint64_t, K_PLAIN>(buf, count, divisor, s);
    case gvqFloat16: return launch_divide<uint16_t, float, K_HALF>(buf, count, divisor, s);
    case gvqFloat32: return launch_divide<float, float, K_PLAIN>(buf, count, divisor, s);
    case gvqFloat64: return launch_divide<double, double, K_PLAIN>(buf, count, divisor, s);
    default: return launch_divide<uint16_t, float, K_BF16>(buf, count, divisor, s);
    }
}

static gvqResult_t cu_divide(void *buf, size_t count, gvqDataType_t type, int divisor) {
    CTX(c);
    return divide_on(buf, count, type, divisor, c->cur);
}

extern "C" gvqResult_t gvq_cuda_divide_on(void *buf, size_t count, gvqDataType_t type,
                                          int divisor, void *stream) {
    return divide_on(buf, count, type, divisor, (cudaStream_t)stream);
}

/* ---- scale and cast (float types) ------------------------------------------------------------- */

static bool is_float(gvqDataType_t t) {
    return t == gvqFloat16 || t == gvqBfloat16 || t == gvqFloat32 || t == gvqFloat64;
}

/* The host's host_load_float / host_store_float. */
__device__ __forceinline__ double load_f(const void *p, size_t i, int t) {
    switch (t) {
    case gvqFloat16: return gvq_half_to_float(((const uint16_t *)p)[i]);
    case gvqBfloat16: return gvq_bf16_to_float(((const uint16_t *)p)[i]);
    case gvqFloat32: return ((const float *)p)[i];
    default: return ((const double *)p)[i];
    }
}
__device__ __forceinline__ void store_f(void *p, size_t i, int t, double v) {
    switch (t) {
    case gvqFloat16: ((uint16_t *)p)[i] = gvq_float_to_half((float)v); break;
    case gvqBfloat16: ((uint16_t *)p)[i] = gvq_float_to_bf16((float)v); break;
    case gvqFloat32: ((float *)p)[i] = (float)v; break;
    default: ((double *)p)[i] = v; break;
    }
}

__global__ void k_scale(void *dst, const void *src, size_t n, int t, double alpha) {
    const float a = (float)alpha;
    GRID_LOOP(i, n) {
        if (t == gvqFloat64) ((double *)dst)[i] = __dmul_rn(((const double *)src)[i], alpha);
        else store_f(dst, i, t, (double)__fmul_rn((float)load_f(src, i, t), a));
    }
}

static gvqResult_t cu_scale(void *dst, const void *src, size_t count, gvqDataType_t type,
                            double alpha) {
    if (!is_float(type)) {
        GVQ_WARN("CUDA scale: datatype %d is not a float type", (int)type);
        return gvqInvalidArgument;
    }
    if (count == 0) return gvqSuccess;
    CTX(c);
    k_scale<<<blocks_for(count), THREADS, 0, c->cur>>>(dst, src, count, (int)type, alpha);
    LAUNCHCHECK("scale");
    return gvqSuccess;
}

__global__ void k_cast(void *dst, int dt, const void *src, int stype, size_t n) {
    GRID_LOOP(i, n) store_f(dst, i, dt, load_f(src, i, stype));
}

static gvqResult_t cu_cast(void *dst, gvqDataType_t dtype, const void *src, gvqDataType_t stype,
                           size_t count) {
    if (!is_float(dtype) || !is_float(stype)) {
        GVQ_WARN("CUDA cast: datatypes %d -> %d are not both float types", (int)stype, (int)dtype);
        return gvqInvalidArgument;
    }
    if (count == 0) return gvqSuccess;
    CTX(c);
    k_cast<<<blocks_for(count), THREADS, 0, c->cur>>>(dst, (int)dtype, src, (int)stype, count);
    LAUNCHCHECK("cast");
    return gvqSuccess;
}

/* ---- filter collocation ----------------------------------------------------------------------- */

__global__ void k_collocate(const float *src, float *dst, size_t K, size_t D, size_t H, size_t W,
                            int inverse) {
    size_t n = K * D * H * W;
    GRID_LOOP(i, n) { /* i: natural index ((k*D + d)*H + h)*W + w */
        size_t w = i % W, h = (i / W) % H, d = (i / (W * H)) % D, k = i / (W * H * D);
        size_t coll = ((h * W + w) * D + d) * K + k;
        if (inverse) dst[i] = src[coll];
        else dst[coll] = src[i];
    }
}

static gvqResult_t cu_collocate(const float *src, float *dst, size_t K, size_t D, size_t H,
                                size_t W, int inverse) {
    size_t n = K * D * H * W;
    if (n == 0) return gvqSuccess;
    CTX(c);
    k_collocate<<<blocks_for(n), THREADS, 0, c->cur>>>(src, dst, K, D, H, W, inverse);
    LAUNCHCHECK("collocate");
    return gvqSuccess;
}

/* ---- linear algebra --------------------------------------------------------------------------- */

static gvqResult_t cu_sgemm(int transa, int transb, int m, int n, int k, float alpha,
                            const float *a, int lda, const float *b, int ldb, float beta, float *cm,
                            int ldc) {
    if (m == 0 || n == 0) return gvqSuccess;
    CTX(c);
    CUBLASCHECK(cublasSgemm(c->blas, transa ? CUBLAS_OP_T : CUBLAS_OP_N,
                            transb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, a, lda, b, ldb,
                            &beta, cm, ldc));
    return gvqSuccess;
}

static gvqResult_t cu_ssyevd(int n, float *a, int lda, float *w) {
    if (n <= 0) return gvqSuccess;
    CTX(c);
    int lwork = 0;
    CUSOLVERCHECK(cusolverDnSsyevd_bufferSize(c->solver, CUSOLVER_EIG_MODE_VECTOR,
                                              CUBLAS_FILL_MODE_LOWER, n, a, lda, w, &lwork));
    void *work = NULL;
    GVQCHECK(ctx_scratch(c, (size_t)lwork * sizeof(float), &work));
    CUSOLVERCHECK(cusolverDnSsyevd(c->solver, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, n,
                                   a, lda, w, (float *)work, lwork, c->info));
    int info = 0;
    CUDACHECK(cudaMemcpyAsync(&info, c->info, sizeof info, cudaMemcpyDeviceToHost, c->cur));
    CUDACHECK(cudaStreamSynchronize(c->cur));
    if (info != 0) {
        GVQ_WARN("cusolverDnSsyevd(n=%d) failed: info=%d (%s)", n, info,
                 info < 0 ? "illegal argument" : "no convergence");
        return gvqInternalError;
    }
    return gvqSuccess;
}

/* Z[i] = mean over t, summed in double in the host's order (one thread per row). */
__global__ void k_mean(const float *s, float *Z, int L, int T) {
    GRID_LOOP(i, (size_t)L) {
        double m = 0;
        for (int t = 0; t < T; t++) m += s[(size_t)t * L + i];
        Z[i] = (float)(m / (double)T);
    }
}

__global__ void k_center(const float *s, const float *Z, float *xc, int L, size_t n) {
    GRID_LOOP(i, n) xc[i] = __fsub_rn(s[i], Z[i % (size_t)L]);
}

static gvqResult_t cu_scov(int L, int T, const float *samples, float *Z, float *cov) {
    if (L <= 0 || T <= 0) {
        GVQ_WARN("CUDA scov: L=%d T=%d must be positive", L, T);
        return gvqInvalidArgument;
    }
    CTX(c);
    size_t n = (size_t)L * (size_t)T;
    void *xc = NULL;
    GVQCHECK(ctx_scratch(c, n * sizeof(float), &xc));
    k_mean<<<blocks_for((size_t)L), THREADS, 0, c->cur>>>(samples, Z, L, T);
    LAUNCHCHECK("mean");
    k_center<<<blocks_for(n), THREADS, 0, c->cur>>>(samples, Z, (float *)xc, L, n);
    LAUNCHCHECK("center");
    const float alpha = 1.0f / (float)T, beta = 0.0f;
    CUBLASCHECK(cublasSsyrk(c->blas, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, L, T, &alpha,
                            (const float *)xc, L, &beta, cov, L));
    return gvqSuccess;
}

/* ---- block reduction of up to two doubles into device accumulators ----------------------------- */

__device__ __forceinline__ void block_add2(double a, double b, double *acc_a, double *acc_b) {
    __shared__ double sa[THREADS / 32], sb[THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_down_sync(0xffffffffu, a, o);
        b += __shfl_down_sync(0xffffffffu, b, o);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sa[warp] = a;
        sb[warp] = b;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double ta = 0, tb = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) {
            ta += sa[w];
            tb += sb[w];
        }
        if (acc_a != NULL) atomicAdd(acc_a, ta);
        if (acc_b != NULL) atomicAdd(acc_b, tb);
    }
}

/* ---- QSGD (algorithms/codec_qsgd.c, the same wire bit for bit) ---------------------------------- */

__host__ __device__ __forceinline__ size_t qs_bucket_bytes(int bits, size_t len) {
    return sizeof(float) + (len * (size_t)bits + 7) / 8;
}

__device__ __forceinline__ float qs_scale_of(const uint8_t *bucket_wire) {
    float s;
    memcpy(&s, bucket_wire, sizeof s);
    return s;
}

/* Element i of a bucket's wire, dequantized (qsgd_dequantize). */
__device__ __forceinline__ float qs_deq(const uint8_t *bw, int bits, int levels, size_t i) {
    float scale = qs_scale_of(bw);
    const uint8_t *codes = bw + sizeof(float);
    const int per_byte = 8 / bits;
    const unsigned mask = (1u << (bits - 1)) - 1u;
    const float unit = scale / (float)levels;
    unsigned code = (codes[i / (size_t)per_byte] >> ((i % (size_t)per_byte) * (size_t)bits)) &
                    ((1u << bits) - 1u);
    float mag = __fmul_rn((float)(code & mask), unit);
    float out = (code >> (bits - 1)) ? -mag : mag;
    if (scale != scale) out = scale;
    return out;
}

/* One thread per bucket: the combined values (decode of `in` plus local) into tmp when in is
 * given, and the bucket's scale into the wire, summed in the host's order. */
__global__ void k_qsgd_scale(gvq_dev_qsgd_t q, size_t count, const float *x, const uint8_t *in,
                             float *tmp, uint8_t *out) {
    size_t nb = (count + q.bucket - 1) / q.bucket, full = qs_bucket_bytes(q.bits, q.bucket);
    GRID_LOOP(b, nb) {
        size_t first = b * q.bucket, len = count - first < q.bucket ? count - first : q.bucket;
        double acc = 0;
        int finite = 1;
        for (size_t i = 0; i < len; i++) {
            float v = x[first + i];
            if (in != NULL) {
                v = __fadd_rn(qs_deq(in + b * full, q.bits, q.levels, i), v);
                tmp[first + i] = v;
            }
            float a = fabsf(v);
            if (!(a <= 3.0e38f)) finite = 0;
            if (q.norm == 1 /* GVQ_QSGD_NORM_MAX */) acc = a > acc ? a : acc;
            else acc = __dadd_rn(acc, __dmul_rn((double)v, (double)v));
        }
        float scale = q.norm == 1 ? (float)acc : (float)sqrt(acc);
        if (!finite) scale = __int_as_float(0x7fc00000);
        memcpy(out + b * full, &scale, sizeof scale);
    }
}

/* One thread per code byte: the levels drawn with Philox keyed (seed, rank), counted by
 * (element >> 2, call), element e using word e & 3 -- as qsgd_quantize does. */
__global__ void k_qsgd_codes(gvq_dev_qsgd_t q, size_t off, size_t count, const float *src,
                             uint8_t *out) {
    const int bits = q.bits, per_byte = 8 / bits, s = q.levels;
    size_t full = qs_bucket_bytes(q.bits, q.bucket), cbf = full - sizeof(float);
    size_t nfull = count / q.bucket, tail = count % q.bucket;
    size_t nbytes = nfull * cbf + (tail ? (tail * (size_t)bits + 7) / 8 : 0);
    uint32_t key[2] = {q.seed, q.rank};
    GRID_LOOP(t, nbytes) {
        size_t b = t / cbf, j = t % cbf;
        size_t first = b * q.bucket, len = count - first < q.bucket ? count - first : q.bucket;
        uint8_t *bw = out + b * full;
        float scale = qs_scale_of(bw);
        uint8_t byte = 0;
        if (scale > 0) { /* zero bucket: codes 0; NaN scale: codes 0 */
            const float inv = (float)s / scale;
            for (size_t i = j * (size_t)per_byte; i < len && i < (j + 1) * (size_t)per_byte; i++) {
                size_t e = off + first + i;
                uint32_t ctr[4] = {(uint32_t)(e >> 2), (uint32_t)(e >> 34), q.call, 0x51534744u};
                uint32_t rnd[4];
                gvq_philox4x32_10(ctr, key, rnd);
                float v = src[first + i];
                float r = __fmul_rn(fabsf(v), inv);
                float l = floorf(r);
                int level = (int)l + (gvq_u01(rnd[e & 3]) < __fsub_rn(r, l));
                if (level > s) level = s;
                unsigned code = (unsigned)level | ((v < 0 && level) ? 1u << (bits - 1) : 0u);
                byte |= (uint8_t)(code << ((i % (size_t)per_byte) * (size_t)bits));
            }
        }
        bw[sizeof(float) + j] = byte;
    }
}

__global__ void k_qsgd_decode(gvq_dev_qsgd_t q, size_t count, const uint8_t *wire, float *dst) {
    size_t full = qs_bucket_bytes(q.bits, q.bucket);
    GRID_LOOP(i, count) {
        size_t b = i / q.bucket;
        dst[i] = qs_deq(wire + b * full, q.bits, q.levels, i - b * q.bucket);
    }
}

static gvqResult_t qsgd_check(const gvq_dev_qsgd_t *q) {
    if ((q->bits != 2 && q->bits != 4 && q->bits != 8) || q->bucket < 1 ||
        q->levels != (1 << (q->bits - 1)) - 1) {
        GVQ_WARN("CUDA QSGD: invalid parameters bits=%d levels=%d bucket=%zu", q->bits, q->levels,
                 q->bucket);
        return gvqInternalError;
    }
    return gvqSuccess;
}

static gvqResult_t cu_qsgd_encode_combine(const gvq_dev_qsgd_t *q, size_t off, size_t count,
                                          const float *local, const void *in, void *out) {
    GVQCHECK(qsgd_check(q));
    if (count == 0) return gvqSuccess;
    CTX(c);
    void *tmp = NULL;
    if (in != NULL) GVQCHECK(ctx_scratch(c, count * sizeof(float), &tmp));
    size_t nb = (count + q->bucket - 1) / q->bucket;
    k_qsgd_scale<<<blocks_for(nb), THREADS, 0, c->cur>>>(*q, count, local, (const uint8_t *)in,
                                                         (float *)tmp, (uint8_t *)out);
    LAUNCHCHECK("qsgd scale");
    const float *src = in != NULL ? (const float *)tmp : local;
    size_t cbytes = count * (size_t)q->bits / 8 + 1;
    k_qsgd_codes<<<blocks_for(cbytes), THREADS, 0, c->cur>>>(*q, off, count, src, (uint8_t *)out);
    LAUNCHCHECK("qsgd codes");
    return gvqSuccess;
}

static gvqResult_t cu_qsgd_decode(const gvq_dev_qsgd_t *q, size_t off, size_t count,
                                  const void *wire, float *dst) {
    (void)off;
    GVQCHECK(qsgd_check(q));
    if (count == 0) return gvqSuccess;
    CTX(c);
    k_qsgd_decode<<<blocks_for(count), THREADS, 0, c->cur>>>(*q, count, (const uint8_t *)wire, dst);
    LAUNCHCHECK("qsgd decode");
    return gvqSuccess;
}

/* ---- GradiVeQ (algorithms/codec_gradiveq.c, the same wire) -------------------------------------
 *
 *   slices [s0, s0+k) of a chunk, reuse group = slice / C:
 *     | head: partial group | full groups of C slices ...      | rest: partial group |
 *       one sgemm             one strided-batched sgemm            one sgemm
 * encode: C_run = U_g^T X_run (d x k); decode: X_run = U_g C_run + X_run (X_run holds Z_g). */

static size_t gq_coef_bytes(const gvq_dev_gq_t *g, size_t slices) {
    size_t b = slices * g->d * (g->wire_fp16 ? 2 : 4);
    return (b + 3) & ~(size_t)3;
}

static gvqResult_t gq_gemm(cuda_ctx_t *c, const gvq_dev_gq_t *g, size_t s0, size_t slices,
                           int encode, const float *X, float *Cf, float *Xout) {
    const int L = (int)g->L, d = (int)g->d;
    const float one = 1.0f, zero = 0.0f;
    size_t rel = 0;
    while (rel < slices) {
        size_t grp = (s0 + rel) / g->C, k = GVQ_MIN(slices - rel, (grp + 1) * g->C - (s0 + rel));
        size_t batch = 1;
        if (k == g->C) { /* full groups from here on: one batched call for all of them */
            batch = (slices - rel) / g->C;
        }
        const float *U = g->U + grp * g->L * g->d;
        long long sU = (long long)g->L * d, sX = (long long)g->C * L, sC = (long long)g->C * d;
        if (encode) {
            if (batch == 1)
                CUBLASCHECK(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, d, (int)k, L, &one, U, L,
                                        X + rel * g->L, L, &zero, Cf + rel * g->d, d));
            else
                CUBLASCHECK(cublasSgemmStridedBatched(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, d, (int)k, L,
                                                      &one, U, L, sU, X + rel * g->L, L, sX, &zero,
                                                      Cf + rel * g->d, d, sC, (int)batch));
        } else {
            if (batch == 1)
                CUBLASCHECK(cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, L, (int)k, d, &one, U, L,
                                        Cf + rel * g->d, d, &one, Xout + rel * g->L, L));
            else
                CUBLASCHECK(cublasSgemmStridedBatched(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, L, (int)k, d,
                                                      &one, U, L, sU, Cf + rel * g->d, d, sC, &one,
                                                      Xout + rel * g->L, L, sX, (int)batch));
        }
        rel += k * batch;
    }
    return gvqSuccess;
}

/* ||x - Z/N||^2 and ||x||^2 over the full slices whose global index is a multiple of
 * GVQ_GQ_LOSS_STRIDE, as the host sums them. */
__global__ void k_gq_xnorms(const float *x, const float *Z, size_t L, size_t C, size_t s0,
                            size_t full_elems, float inv_n, double *acc) {
    double x2 = 0, all2 = 0;
    GRID_LOOP(e, full_elems) {
        size_t j = e / L;
        if ((s0 + j) % GVQ_GQ_LOSS_STRIDE != 0) continue;
        double v = x[e];
        all2 += v * v;
        size_t grp = (s0 + j) / C;
        double u = __dsub_rn(v, __dmul_rn((double)Z[grp * L + e % L], (double)inv_n));
        x2 += u * u;
    }
    block_add2(x2, all2, acc + 0, acc + 2);
}

/* c = coef - UZ_g / N, ||c||^2, then + incoming, stored in the wire's precision. */
__global__ void k_gq_finish(const float *coef, const float *UZ, size_t d, size_t C, size_t s0,
                            size_t n, float inv_n, const void *in, void *out, int fp16,
                            double *acc) {
    double c2 = 0;
    GRID_LOOP(idx, n) {
        size_t j = idx / d, i = idx % d, grp = (s0 + j) / C;
        float cv = __fsub_rn(coef[idx], __fmul_rn(UZ[grp * d + i], inv_n));
        if ((s0 + j) % GVQ_GQ_LOSS_STRIDE == 0) c2 += (double)cv * cv;
        if (in != NULL)
            cv = __fadd_rn(cv, fp16 ? gvq_half_to_float(((const uint16_t *)in)[idx]) : ((const float *)in)[idx]);
        if (fp16) ((uint16_t *)out)[idx] = gvq_float_to_half(cv);
        else ((float *)out)[idx] = cv;
    }
    if (acc != NULL) block_add2(c2, 0.0, acc + 1, NULL);
}

__global__ void k_gq_tail(const float *x, const float *tin, float *t, size_t n) {
    GRID_LOOP(i, n) t[i] = __fadd_rn(x[i], tin != NULL ? tin[i] : 0.0f);
}

__global__ void k_gq_fill_z(float *x, const float *Z, size_t L, size_t C, size_t s0, size_t n) {
    GRID_LOOP(e, n) {
        size_t j = e / L, grp = (s0 + j) / C;
        x[e] = Z[grp * L + e % L];
    }
}

__global__ void k_half_to_float(const uint16_t *h, float *f, size_t n) {
    GRID_LOOP(i, n) f[i] = gvq_half_to_float(h[i]);
}

static gvqResult_t gq_check(const gvq_dev_gq_t *g) {
    if (g->L == 0 || g->d == 0 || g->d > g->L || g->C == 0 || g->nranks < 1 || g->U == NULL ||
        g->Z == NULL || g->UZ == NULL) {
        GVQ_WARN("CUDA GradiVeQ: invalid shape L=%zu d=%zu C=%zu nranks=%d", g->L, g->d, g->C,
                 g->nranks);
        return gvqInternalError;
    }
    return gvqSuccess;
}

static gvqResult_t cu_gq_encode_combine(const gvq_dev_gq_t *g, size_t off, size_t count,
                                        const float *x, const void *in, void *out,
                                        double norms[3]) {
    GVQCHECK(gq_check(g));
    if (count == 0) return gvqSuccess;
    CTX(c);
    size_t L = g->L, d = g->d, s0 = off / L, slices = count / L, tail = count % L;
    const float inv_n = 1.0f / (float)g->nranks;
    float *coef = (float *)out;
    if (g->wire_fp16 && slices) {
        void *t = NULL;
        GVQCHECK(ctx_scratch(c, slices * d * sizeof(float), &t));
        coef = (float *)t;
    }
    double *acc = norms != NULL ? c->norms : NULL;
    if (acc != NULL) {
        CUDACHECK(cudaMemsetAsync(acc, 0, 3 * sizeof(double), c->cur));
        if (slices) {
            k_gq_xnorms<<<blocks_for(slices * L), THREADS, 0, c->cur>>>(x, g->Z, L, g->C, s0,
                                                                        slices * L, inv_n, acc);
            LAUNCHCHECK("gq norms");
        }
    }
    if (slices) {
        GVQCHECK(gq_gemm(c, g, s0, slices, 1, x, coef, NULL));
        k_gq_finish<<<blocks_for(slices * d), THREADS, 0, c->cur>>>(
            coef, g->UZ, d, g->C, s0, slices * d, inv_n, in, out, g->wire_fp16, acc);
        LAUNCHCHECK("gq finish");
    }
    if (tail) {
        size_t cb = gq_coef_bytes(g, slices);
        const float *tin = in != NULL ? (const float *)((const char *)in + cb) : NULL;
        k_gq_tail<<<blocks_for(tail), THREADS, 0, c->cur>>>(x + slices * L, tin,
                                                            (float *)((char *)out + cb), tail);
        LAUNCHCHECK("gq tail");
    }
    if (acc != NULL) {
        double h[3];
        CUDACHECK(cudaMemcpyAsync(h, acc, sizeof h, cudaMemcpyDeviceToHost, c->cur));
        CUDACHECK(cudaStreamSynchronize(c->cur));
        for (int i = 0; i < 3; i++) norms[i] += h[i];
    }
    return gvqSuccess;
}

static gvqResult_t cu_gq_decode(const gvq_dev_gq_t *g, size_t off, size_t count, const void *wire,
                                float *dst) {
    GVQCHECK(gq_check(g));
    if (count == 0) return gvqSuccess;
    CTX(c);
    size_t L = g->L, d = g->d, s0 = off / L, slices = count / L, tail = count % L;
    if (slices) {
        const float *coef = (const float *)wire;
        if (g->wire_fp16) {
            void *t = NULL;
            GVQCHECK(ctx_scratch(c, slices * d * sizeof(float), &t));
            k_half_to_float<<<blocks_for(slices * d), THREADS, 0, c->cur>>>(
                (const uint16_t *)wire, (float *)t, slices * d);
            LAUNCHCHECK("gq half");
            coef = (const float *)t;
        }
        k_gq_fill_z<<<blocks_for(slices * L), THREADS, 0, c->cur>>>(dst, g->Z, L, g->C, s0, slices * L);
        LAUNCHCHECK("gq fill");
        GVQCHECK(gq_gemm(c, g, s0, slices, 0, NULL, (float *)coef, dst));
    }
    if (tail)
        CUDACHECK(cudaMemcpyAsync(dst + slices * L, (const char *)wire + gq_coef_bytes(g, slices),
                                  tail * sizeof(float), cudaMemcpyDeviceToDevice, c->cur));
    return gvqSuccess;
}

/* ---- the table -------------------------------------------------------------------------------- */

extern "C" const gvq_device_ops_t gvq_cuda_device = {
    .size = sizeof(gvq_device_ops_t),
    .name = "cuda",
    .alloc = cu_alloc,
    .free = cu_free,
    .copy = cu_copy,
    .reduce = cu_reduce,
    .divide = cu_divide,
    .sgemm = cu_sgemm,
    .ssyevd = cu_ssyevd,
    .sync = cu_sync,
    .set_stream = cu_set_stream,
    .event_create = cu_event_create,
    .event_destroy = cu_event_destroy,
    .event_record = cu_event_record,
    .event_wait = cu_event_wait,
    .event_sync = cu_event_sync,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .copy_from_host = cu_copy_from_host,
    .copy_to_host = cu_copy_to_host,
    .scale = cu_scale,
    .cast = cu_cast,
    .collocate = cu_collocate,
    .scov = cu_scov,
    .qsgd_encode_combine = cu_qsgd_encode_combine,
    .qsgd_decode = cu_qsgd_decode,
    .gq_encode_combine = cu_gq_encode_combine,
    .gq_decode = cu_gq_decode,
};
