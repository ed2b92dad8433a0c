/*
 * gvq_device.h -- the device ops table: where buffers live and where math runs.
 * The host device (src/host/) is synchronous and uses BLAS/LAPACKE; the CUDA device (cuda/)
 * comes with the CUDA backend.
 */
#ifndef GVQ_DEVICE_H_
#define GVQ_DEVICE_H_

#include "gvq_util.h"

typedef struct gvq_device_ops {
    size_t size;
    const char *name;
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    gvqResult_t (*copy)(void *dst, const void *src, size_t bytes);
    /* dst[i] = a[i] op b[i] for i < count; dst may alias a or b. gvqAvg reduces as gvqSum.
     * fp16/bf16 compute in fp32. */
    gvqResult_t (*reduce)(void *dst, const void *a, const void *b, size_t count,
                          gvqDataType_t type, gvqRedOp_t op);
    /* buf[i] /= divisor (the final step of gvqAvg). */
    gvqResult_t (*divide)(void *buf, size_t count, gvqDataType_t type, int divisor);
    /* Column-major sgemm: C = alpha * op(A) op(B) + beta * C (transa/transb: 0 or 1). */
    gvqResult_t (*sgemm)(int transa, int transb, int m, int n, int k, float alpha, const float *a,
                         int lda, const float *b, int ldb, float beta, float *c, int ldc);
    /* Symmetric eigen-decomposition of the column-major n x n matrix a (lower triangle used):
     * eigenvalues ascending into w, eigenvectors overwrite a. */
    gvqResult_t (*ssyevd)(int n, float *a, int lda, float *w);
    /* Wait for queued device work (a no-op on the synchronous host device). */
    gvqResult_t (*sync)(void);
} gvq_device_ops_t;

/* The registry of devices built into this library (src/device.c): "host" always; "cuda" is
 * listed in builds with GVQ_WITH_CUDA, its ops table arrives with the CUDA backend. Returns NULL,
 * with a WARN, for a name that is not built in or has no ops table yet. */
const gvq_device_ops_t *gvq_device_find(const char *name);
extern const gvq_device_ops_t gvq_host_device;
/* Number of usable CUDA devices: 0 in builds without CUDA, and after any CUDA error. */
int gvq_cuda_device_count(void);

#endif /* GVQ_DEVICE_H_ */
