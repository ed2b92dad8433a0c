/*
 * context.cu -- the CUDA device's per-thread context: what every operation of a thread queues
 * its work with (gvq_cuda_ctx_t in gvq_cuda.h).
 *
 *   thread -> context (first use): the device current then, a stream of its own, a cuBLAS and a
 *             cuSOLVER handle bound to the current stream, a scratch area, 3 doubles for norms
 *             and cuSOLVER's info on the device
 *   thread exit -> the context is freed (its own stream drained first)
 *
 * The context lives in a pthread key, so threads never share one and need no lock.
 */
#include <pthread.h>
#include <stdlib.h>

#include "gvq_cuda.h"

static pthread_key_t ctx_key;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;

static void ctx_free(void *p) {
    gvq_cuda_ctx_t *c = (gvq_cuda_ctx_t *)p;
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

static void ctx_key_init(void) {
    pthread_key_create(&ctx_key, ctx_free);
}

static gvqResult_t ctx_create(gvq_cuda_ctx_t **out) {
    gvq_cuda_ctx_t *c = (gvq_cuda_ctx_t *)calloc(1, sizeof *c);
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

extern "C" gvqResult_t gvq_cuda_ctx(gvq_cuda_ctx_t **out) {
    pthread_once(&ctx_once, ctx_key_init);
    gvq_cuda_ctx_t *c = (gvq_cuda_ctx_t *)pthread_getspecific(ctx_key);
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

extern "C" gvqResult_t gvq_cuda_scratch(gvq_cuda_ctx_t *c, size_t bytes, void **out) {
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
    gvq_cuda_ctx_t *c;
    if (gvq_cuda_ctx(&c) != gvqSuccess) return NULL;
    return (void *)c->cur;
}
