/*
 * elementwise.cu -- the CUDA device's elementwise operations: reduce, divide (the final step of
 * gvqAvg), scale, cast and filter collocation, one grid-stride kernel each.
 *
 * They agree with the host device bit for bit: each kernel does the host's operations in the
 * host's types (src/device/host_device.c), fp16 and bf16 through the very conversion functions of
 * gvq_util.h, compiled as device functions here. Per datatype, one kernel template is stamped out
 * by a switch over the type, as the host stamps its loops with a macro:
 *
 *   k_reduce<S, A, KIND, OP, FLT>   S the stored type, A the arithmetic type, KIND how to load
 *   k_divide<S, A, KIND>            (plain, fp16, bf16), OP the reduction, FLT NaN-propagating
 */
#include <stdint.h>

#include "gvq_cuda.h"

/* ---- element types: load into the arithmetic type, store back -------------------------------- */

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
    case gvqAvg:
        k_reduce<S, AS, KIND, R_SUM, FLT><<<g, THREADS, 0, s>>>(d, x, y, n);
        break;
    case gvqProd:
        k_reduce<S, AS, KIND, R_PROD, FLT><<<g, THREADS, 0, s>>>(d, x, y, n);
        break;
    case gvqMax:
        k_reduce<S, AM, KIND, R_MAX, FLT><<<g, THREADS, 0, s>>>(d, x, y, n);
        break;
    default:
        k_reduce<S, AM, KIND, R_MIN, FLT><<<g, THREADS, 0, s>>>(d, x, y, n);
        break;
    }
    LAUNCHCHECK("reduce");
    return gvqSuccess;
}

extern "C" gvqResult_t gvq_cuda_reduce(void *dst, const void *a, const void *b, size_t n,
                                       gvqDataType_t type, gvqRedOp_t op) {
    if (!gvq_dtype_valid((int)type) || !gvq_op_valid((int)op)) {
        GVQ_WARN("CUDA reduce: invalid datatype %d or op %d", (int)type, (int)op);
        return gvqInternalError;
    }
    if (n == 0) return gvqSuccess;
    CTX(c);
    cudaStream_t s = c->cur;
    int o = (int)op;
    switch (type) {
    case gvqInt8:
        return launch_reduce<int8_t, unsigned int, int8_t, K_PLAIN, false>(dst, a, b, n, o, s);
    case gvqUint8:
        return launch_reduce<uint8_t, unsigned int, uint8_t, K_PLAIN, false>(dst, a, b, n, o, s);
    case gvqInt32:
        return launch_reduce<int32_t, uint32_t, int32_t, K_PLAIN, false>(dst, a, b, n, o, s);
    case gvqUint32:
        return launch_reduce<uint32_t, uint32_t, uint32_t, K_PLAIN, false>(dst, a, b, n, o, s);
    case gvqInt64:
        return launch_reduce<int64_t, uint64_t, int64_t, K_PLAIN, false>(dst, a, b, n, o, s);
    case gvqUint64:
        return launch_reduce<uint64_t, uint64_t, uint64_t, K_PLAIN, false>(dst, a, b, n, o, s);
    case gvqFloat16:
        return launch_reduce<uint16_t, float, float, K_HALF, true>(dst, a, b, n, o, s);
    case gvqFloat32:
        return launch_reduce<float, float, float, K_PLAIN, true>(dst, a, b, n, o, s);
    case gvqFloat64:
        return launch_reduce<double, double, double, K_PLAIN, true>(dst, a, b, n, o, s);
    default:
        return launch_reduce<uint16_t, float, float, K_BF16, true>(dst, a, b, n, o, s);
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
    case gvqInt8:
        return launch_divide<int8_t, int, K_PLAIN>(buf, count, divisor, s);
    case gvqUint8:
        return launch_divide<uint8_t, int, K_PLAIN>(buf, count, divisor, s);
    case gvqInt32:
        return launch_divide<int32_t, int32_t, K_PLAIN>(buf, count, divisor, s);
    case gvqUint32:
        return launch_divide<uint32_t, uint32_t, K_PLAIN>(buf, count, divisor, s);
    case gvqInt64:
        return launch_divide<int64_t, int64_t, K_PLAIN>(buf, count, divisor, s);
    case gvqUint64:
        return launch_divide<uint64_t, uint64_t, K_PLAIN>(buf, count, divisor, s);
    case gvqFloat16:
        return launch_divide<uint16_t, float, K_HALF>(buf, count, divisor, s);
    case gvqFloat32:
        return launch_divide<float, float, K_PLAIN>(buf, count, divisor, s);
    case gvqFloat64:
        return launch_divide<double, double, K_PLAIN>(buf, count, divisor, s);
    default:
        return launch_divide<uint16_t, float, K_BF16>(buf, count, divisor, s);
    }
}

extern "C" gvqResult_t gvq_cuda_divide(void *buf, size_t count, gvqDataType_t type, int divisor) {
    CTX(c);
    return divide_on(buf, count, type, divisor, c->cur);
}

extern "C" gvqResult_t gvq_cuda_divide_on(void *buf, size_t count, gvqDataType_t type, int divisor,
                                          void *stream) {
    return divide_on(buf, count, type, divisor, (cudaStream_t)stream);
}

/* ---- scale and cast (float types) ------------------------------------------------------------ */

static bool is_float(gvqDataType_t t) {
    return t == gvqFloat16 || t == gvqBfloat16 || t == gvqFloat32 || t == gvqFloat64;
}

/* The host's host_load_float / host_store_float. */
__device__ __forceinline__ double load_f(const void *p, size_t i, int t) {
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
__device__ __forceinline__ void store_f(void *p, size_t i, int t, double v) {
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

__global__ void k_scale(void *dst, const void *src, size_t n, int t, double alpha) {
    const float a = (float)alpha;
    GRID_LOOP(i, n) {
        if (t == gvqFloat64)
            ((double *)dst)[i] = __dmul_rn(((const double *)src)[i], alpha);
        else
            store_f(dst, i, t, (double)__fmul_rn((float)load_f(src, i, t), a));
    }
}

extern "C" gvqResult_t gvq_cuda_scale(void *dst, const void *src, size_t count, gvqDataType_t type,
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

extern "C" gvqResult_t gvq_cuda_cast(void *dst, gvqDataType_t dtype, const void *src,
                                     gvqDataType_t stype, size_t count) {
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

/* ---- filter collocation ---------------------------------------------------------------------- */

__global__ void k_collocate(const float *src, float *dst, size_t K, size_t D, size_t H, size_t W,
                            int inverse) {
    size_t n = K * D * H * W;
    GRID_LOOP(i, n) { /* i: natural index ((k*D + d)*H + h)*W + w */
        size_t w = i % W, h = (i / W) % H, d = (i / (W * H)) % D, k = i / (W * H * D);
        size_t coll = ((h * W + w) * D + d) * K + k;
        if (inverse)
            dst[i] = src[coll];
        else
            dst[coll] = src[i];
    }
}

extern "C" gvqResult_t gvq_cuda_collocate(const float *src, float *dst, size_t K, size_t D,
                                          size_t H, size_t W, int inverse) {
    size_t n = K * D * H * W;
    if (n == 0) return gvqSuccess;
    CTX(c);
    k_collocate<<<blocks_for(n), THREADS, 0, c->cur>>>(src, dst, K, D, H, W, inverse);
    LAUNCHCHECK("collocate");
    return gvqSuccess;
}
