/*
 * gvq_device.h -- the device ops table: where buffers live and where math runs.
 * The host device (host_device.c) is synchronous and uses BLAS/LAPACKE; the CUDA device
 * (src/device/cuda/cuda_device.cu) queues kernels, cuBLAS and cuSOLVER calls on a stream. Pointers
 * handed to a device's operations are memory of that device.
 */
#ifndef GVQ_DEVICE_H_
#define GVQ_DEVICE_H_

#include <stddef.h>

#include "gvq_util.h"

struct gvq_dev_qsgd;
struct gvq_dev_gq;

typedef struct gvq_device_ops {
    size_t size;
    const char *name;
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    gvqResult_t (*copy)(void *dst, const void *src, size_t bytes);
    /* dst[i] = a[i] op b[i] for i < count; dst may alias a or b. gvqAvg reduces as gvqSum.
     * fp16/bf16 compute in fp32. */
    gvqResult_t (*reduce)(void *dst, const void *a, const void *b, size_t count, gvqDataType_t type,
                          gvqRedOp_t op);
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

    /* ---- queued devices. A table carries its `size`, so a table shorter than this layout
     * lacks the entries past its end (check with GVQ_DEVICE_HAS).
     *
     * Ordering: a device may queue work instead of finishing it (the CUDA device queues on the
     * calling thread's current stream). Operations of one thread run in the order issued; the
     * results are visible to the host after sync(), after an event_sync() on an event recorded
     * behind them, and after copy_to_host (which waits). The host device finishes everything
     * before returning, and its stream/event entries do nothing. ---- */

    /* Make `stream` (a cudaStream_t; NULL: the device's own stream) the calling thread's
     * current stream; returns the previous one in *prev when prev is not NULL. */
    gvqResult_t (*set_stream)(void *stream, void **prev);
    /* Events: record one behind the work queued so far on the current stream, make the current
     * stream wait for one, wait on the host for one. */
    gvqResult_t (*event_create)(void **ev);
    void (*event_destroy)(void *ev);
    gvqResult_t (*event_record)(void *ev);
    gvqResult_t (*event_wait)(void *ev);
    gvqResult_t (*event_sync)(void *ev);
    /* Host memory the device copies fastest (pinned on CUDA), and copies between it (or any
     * host memory) and device memory; both copies have finished when they return. */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
    gvqResult_t (*copy_from_host)(void *dst, const void *host_src, size_t bytes);
    gvqResult_t (*copy_to_host)(void *host_dst, const void *src, size_t bytes);
    /* dst[i] = src[i] * alpha for the float types (fp16/bf16 in fp32, fp64 in fp64); dst may be
     * src. Other types: gvqInvalidArgument. */
    gvqResult_t (*scale)(void *dst, const void *src, size_t count, gvqDataType_t type,
                         double alpha);
    /* dst = src converted between float types (through fp32 for fp16/bf16, round to nearest
     * even as gvq_float_to_half / gvq_float_to_bf16). */
    gvqResult_t (*cast)(void *dst, gvqDataType_t dtype, const void *src, gvqDataType_t stype,
                        size_t count);
    /* Filter collocation of fp32 [K][D][H][W] (gvq_collocate in gvq_algo.h) or, with inverse,
     * its inverse. dst must not alias src. */
    gvqResult_t (*collocate)(const float *src, float *dst, size_t K, size_t D, size_t H, size_t W,
                             int inverse);
    /* Mean and covariance of T samples of length L (column-major L x T): Z = mean,
     * cov (L x L, lower triangle written) = (1/T) sum (s - Z)(s - Z)^T. */
    gvqResult_t (*scov)(int L, int T, const float *samples, float *Z, float *cov);
    /* The codecs' chunk operations, with the meaning of the gvq_codec_t entries of the same
     * names in src/algorithms/gvq_algo.h (same wire format, bit for bit for QSGD); every pointer,
     * those in the parameter structs included, is memory of this device. The host device points
     * them at the "not supported" stub: the host codecs run their own loops. */
    gvqResult_t (*qsgd_encode_combine)(const struct gvq_dev_qsgd *q, size_t off, size_t count,
                                       const float *local, const void *in, void *out);
    gvqResult_t (*qsgd_decode)(const struct gvq_dev_qsgd *q, size_t off, size_t count,
                               const void *wire, float *dst);
    /* norms (host memory, may be NULL): adds ||x - Z/N||^2, ||c||^2 and ||x||^2 over the full
     * slices whose global index is a multiple of GVQ_GQ_LOSS_STRIDE, as the host codec's
     * local_x2/local_c2/local_all2 (waits). */
    gvqResult_t (*gq_encode_combine)(const struct gvq_dev_gq *g, size_t off, size_t count,
                                     const float *local, const void *in, void *out,
                                     double norms[3]);
    gvqResult_t (*gq_decode)(const struct gvq_dev_gq *g, size_t off, size_t count, const void *wire,
                             float *dst);
} gvq_device_ops_t;

/* Whether a table has an entry (a table whose `size` ends before it does not). */
#define GVQ_DEVICE_HAS(ops, field) \
    ((ops)->size >= offsetof(gvq_device_ops_t, field) + sizeof((ops)->field))

/* Parameters of the QSGD codec ops (gvq_qsgd_t in src/algorithms/gvq_algo.h, less its scratch). */
typedef struct gvq_dev_qsgd {
    int bits, levels, norm;
    size_t bucket;
    uint32_t seed, rank, call;
} gvq_dev_qsgd_t;

/* The local loss of GradiVeQ's vote is estimated on every GVQ_GQ_LOSS_STRIDE-th full slice (by
 * global slice index), by the host codec and the device ops alike. */
#define GVQ_GQ_LOSS_STRIDE 4

/* Parameters of the GradiVeQ codec ops (gvq_gradiveq_t less its host bookkeeping); U, Z, UZ
 * live on the device. */
typedef struct gvq_dev_gq {
    size_t L, d, C;
    int nranks, wire_fp16;
    const float *U, *Z, *UZ;
} gvq_dev_gq_t;

/* The shared stub of operations a device does not support (not_supported.c): WARNs and
 * returns gvqInternalError. */
gvqResult_t gvq_device_not_supported(const char *device, const char *op);

/* The host device (host_device.c). */
extern const gvq_device_ops_t gvq_host_device;
/* The host device's sgemm as a plain function (for the training layer, gvq_train_below.h). */
gvqResult_t gvq_host_sgemm(int transa, int transb, int m, int n, int k, float alpha, const float *a,
                           int lda, const float *b, int ldb, float beta, float *c, int ldc);
#ifdef GVQ_WITH_CUDA
extern const gvq_device_ops_t gvq_cuda_device; /* src/device/cuda/cuda_device.cu */
/* 1 if p is CUDA device or managed memory (cudaPointerGetAttributes); 0 on any error. */
int gvq_cuda_is_device_ptr(const void *p);
/* The calling thread's current stream of the CUDA device (a cudaStream_t). */
void *gvq_cuda_current_stream(void);
/* buf /= divisor on the device, launched on `stream` (a cudaStream_t; NULL: the default stream),
 * without switching the thread's stream. */
gvqResult_t gvq_cuda_divide_on(void *buf, size_t count, gvqDataType_t type, int divisor,
                               void *stream);
/* cudaStreamLegacy: what stream 0 means in the CUDA and NCCL APIs. */
void *gvq_cuda_legacy_stream(void);
#endif
/* Number of usable CUDA devices: 0 in builds without CUDA, and after any CUDA error. */
int gvq_cuda_device_count(void);

#endif /* GVQ_DEVICE_H_ */
