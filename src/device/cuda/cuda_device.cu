/*
 * cuda_device.cu -- the CUDA device: the device ops table (src/device/gvq_device.h) for CUDA
 * device memory, with its memory, copies, streams and events. The math lives beside it, one
 * file a job (gvq_cuda.h draws the calls):
 *
 *   elementwise.cu      reduce, divide, scale, cast, collocate       kernels
 *   linalg.cu           sgemm, ssyevd, scov                          cuBLAS, cuSOLVER, kernels
 *   codec_qsgd.cu       qsgd_encode_combine, qsgd_decode             kernels
 *   codec_gradiveq.cu   gq_encode_combine, gq_decode                 cuBLAS, kernels
 *   context.cu          the per-thread context they all queue on
 *
 *   thread -> context (first use): a stream of its own, cuBLAS and cuSOLVER handles bound to
 *             the current stream, a scratch area
 *   op     -> queued on the thread's current stream (set_stream picks the caller's stream);
 *             sync / event_sync / copy_to_host / copy_from_host are where the host waits
 *
 * Every pointer handed to these operations is device memory (copy_from_host/copy_to_host and
 * host_alloc excepted). The scratch area is shared by the operations of one thread, which is safe
 * because they are ordered on one stream; set_stream drains the old stream before switching.
 */
#include "gvq_cuda.h"

/* ---- memory ---------------------------------------------------------------------------------- */

static void *cu_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 64) != cudaSuccess) {
        GVQ_WARN("CUDA device: cudaMalloc(%zu) failed: %s", bytes,
                 cudaGetErrorString(cudaGetLastError()));
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

/* ---- ordering -------------------------------------------------------------------------------- */

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

/* ---- the table ------------------------------------------------------------------------------- */

extern "C" const gvq_device_ops_t gvq_cuda_device = {
    .size = sizeof(gvq_device_ops_t),
    .name = "cuda",
    .alloc = cu_alloc,
    .free = cu_free,
    .copy = cu_copy,
    .reduce = gvq_cuda_reduce,
    .divide = gvq_cuda_divide,
    .sgemm = gvq_cuda_sgemm,
    .ssyevd = gvq_cuda_ssyevd,
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
    .scale = gvq_cuda_scale,
    .cast = gvq_cuda_cast,
    .collocate = gvq_cuda_collocate,
    .scov = gvq_cuda_scov,
    .qsgd_encode_combine = gvq_cuda_qsgd_encode_combine,
    .qsgd_decode = gvq_cuda_qsgd_decode,
    .gq_encode_combine = gvq_cuda_gq_encode_combine,
    .gq_decode = gvq_cuda_gq_decode,
};
