/*
 * sim_device.h -- a simulated device for the unit tests: the device-resident paths (device
 * codecs, the staged wire, device copies of the compressor's state) run without a GPU.
 *
 * Its memory is ordinary host memory, but the device remembers every allocation and checks
 * every pointer it is handed against the device ops contract (gvq_device.h): operations take
 * device memory, copy_from_host/copy_to_host take exactly one side of each, and a guard on the
 * transport (sim_guard_transport) checks that the MPI-like transport is never handed device
 * memory. A breach is counted in sim_violations and printed. Its arithmetic is the host
 * device's and its codec operations run the host codecs, so a device-resident call must give
 * the host path's bits exactly: what the tests check is the orchestration, not a kernel (the
 * CUDA kernels are compared with the host in tests/gpu, on a GPU).
 */
#ifndef SIM_DEVICE_H_
#define SIM_DEVICE_H_

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "gvq_comm.h"

typedef struct {
    char *p;
    size_t n;
} sim_block_t;

static sim_block_t sim_blocks[4096];
static int sim_nblocks;
static pthread_mutex_t sim_lock = PTHREAD_MUTEX_INITIALIZER;
static int sim_violations;
static long sim_codec_calls;

static inline void sim_violation(const char *op, const char *what) {
    pthread_mutex_lock(&sim_lock);
    if (sim_violations++ < 20) fprintf(stderr, "SIM DEVICE VIOLATION: %s: %s\n", op, what);
    pthread_mutex_unlock(&sim_lock);
}

static inline int sim_owns(const void *q) {
    const char *c = q;
    int found = 0;
    pthread_mutex_lock(&sim_lock);
    for (int i = 0; i < sim_nblocks && !found; i++)
        found = c >= sim_blocks[i].p && c < sim_blocks[i].p + sim_blocks[i].n;
    pthread_mutex_unlock(&sim_lock);
    return found;
}

#define SIM_DEV(op, p)                                                                  \
    do {                                                                                \
        if ((p) != NULL && !sim_owns(p)) sim_violation(op, #p " is not device memory"); \
    } while (0)
#define SIM_HOST(op, p)                                                            \
    do {                                                                           \
        if ((p) != NULL && sim_owns(p)) sim_violation(op, #p " is device memory"); \
    } while (0)

static const gvq_device_ops_t *const H = &gvq_host_device;

static inline void *sim_alloc(size_t bytes) {
    char *p = malloc(bytes ? bytes : 64);
    if (p == NULL) return NULL;
    pthread_mutex_lock(&sim_lock);
    if (sim_nblocks < (int)(sizeof sim_blocks / sizeof *sim_blocks))
        sim_blocks[sim_nblocks++] = (sim_block_t){p, bytes ? bytes : 64};
    pthread_mutex_unlock(&sim_lock);
    return p;
}

static inline void sim_free(void *p) {
    if (p == NULL) return;
    int found = 0;
    pthread_mutex_lock(&sim_lock);
    for (int i = 0; i < sim_nblocks; i++)
        if (sim_blocks[i].p == p) {
            sim_blocks[i] = sim_blocks[--sim_nblocks];
            found = 1;
            break;
        }
    pthread_mutex_unlock(&sim_lock);
    if (!found) sim_violation("free", "not a device allocation");
    free(p);
}

static inline gvqResult_t sim_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) {
        SIM_DEV("copy", dst);
        SIM_DEV("copy", src);
    }
    return H->copy(dst, src, bytes);
}
static inline gvqResult_t sim_reduce(void *dst, const void *a, const void *b, size_t count,
                                     gvqDataType_t type, gvqRedOp_t op) {
    SIM_DEV("reduce", dst);
    SIM_DEV("reduce", a);
    SIM_DEV("reduce", b);
    return H->reduce(dst, a, b, count, type, op);
}
static inline gvqResult_t sim_divide(void *buf, size_t count, gvqDataType_t type, int divisor) {
    SIM_DEV("divide", buf);
    return H->divide(buf, count, type, divisor);
}
static inline gvqResult_t sim_sgemm(int ta, int tb, int m, int n, int k, float alpha,
                                    const float *a, int lda, const float *b, int ldb, float beta,
                                    float *c, int ldc) {
    SIM_DEV("sgemm", a);
    SIM_DEV("sgemm", b);
    SIM_DEV("sgemm", c);
    return H->sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
static inline gvqResult_t sim_ssyevd(int n, float *a, int lda, float *w) {
    SIM_DEV("ssyevd", a);
    SIM_DEV("ssyevd", w);
    return H->ssyevd(n, a, lda, w);
}
static inline gvqResult_t sim_sync(void) {
    return gvqSuccess;
}
static inline gvqResult_t sim_set_stream(void *stream, void **prev) {
    (void)stream;
    if (prev != NULL) *prev = NULL;
    return gvqSuccess;
}
static inline gvqResult_t sim_event_create(void **ev) {
    *ev = malloc(1);
    return *ev != NULL ? gvqSuccess : gvqSystemError;
}
static inline void sim_event_destroy(void *ev) {
    free(ev);
}
static inline gvqResult_t sim_event_noop(void *ev) {
    (void)ev;
    return gvqSuccess;
}
/* "pinned" host memory: counted, so tests can see it used and given back */
static long sim_pinned_allocs, sim_pinned_live;
static inline void *sim_host_alloc(size_t bytes) {
    __atomic_add_fetch(&sim_pinned_allocs, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&sim_pinned_live, 1, __ATOMIC_RELAXED);
    return malloc(bytes ? bytes : 64);
}
static inline void sim_host_free(void *p) {
    if (p != NULL) __atomic_sub_fetch(&sim_pinned_live, 1, __ATOMIC_RELAXED);
    free(p);
}
static inline gvqResult_t sim_copy_from_host(void *dst, const void *src, size_t bytes) {
    if (bytes) {
        SIM_DEV("copy_from_host", dst);
        SIM_HOST("copy_from_host", src);
    }
    return H->copy(dst, src, bytes);
}
static inline gvqResult_t sim_copy_to_host(void *dst, const void *src, size_t bytes) {
    if (bytes) {
        SIM_HOST("copy_to_host", dst);
        SIM_DEV("copy_to_host", src);
    }
    return H->copy(dst, src, bytes);
}
static inline gvqResult_t sim_scale(void *dst, const void *src, size_t count, gvqDataType_t type,
                                    double alpha) {
    SIM_DEV("scale", dst);
    SIM_DEV("scale", src);
    return H->scale(dst, src, count, type, alpha);
}
static inline gvqResult_t sim_cast(void *dst, gvqDataType_t dt, const void *src, gvqDataType_t st,
                                   size_t count) {
    SIM_DEV("cast", dst);
    SIM_DEV("cast", src);
    return H->cast(dst, dt, src, st, count);
}
static inline gvqResult_t sim_collocate(const float *src, float *dst, size_t K, size_t D, size_t Hh,
                                        size_t W, int inverse) {
    SIM_DEV("collocate", dst);
    SIM_DEV("collocate", src);
    return H->collocate(src, dst, K, D, Hh, W, inverse);
}
static inline gvqResult_t sim_scov(int L, int T, const float *s, float *Z, float *cov) {
    SIM_DEV("scov", s);
    SIM_DEV("scov", Z);
    SIM_DEV("scov", cov);
    return H->scov(L, T, s, Z, cov);
}

/* The codec operations run the host codecs on the parameters they are given. */
static inline gvqResult_t sim_qsgd(const gvq_dev_qsgd_t *q, size_t off, size_t count,
                                   const float *local, const void *in, void *out, const void *wire,
                                   float *dst) {
    __atomic_add_fetch(&sim_codec_calls, 1, __ATOMIC_RELAXED);
    gvq_qsgd_t h;
    memset(&h, 0, sizeof h);
    GVQCHECK(gvq_qsgd_init(&h, q->bits, q->bucket, q->norm, q->seed, q->rank));
    h.call = q->call;
    if (h.levels != q->levels) sim_violation("qsgd", "levels do not match bits");
    gvq_codec_t c;
    gvq_codec_qsgd_init(&c, H, &h);
    gvqResult_t res = wire == NULL ? c.encode_combine(&c, off, count, local, in, out)
                                   : c.decode(&c, off, count, wire, dst);
    gvq_qsgd_fini(&h);
    return res;
}
static inline gvqResult_t sim_qsgd_encode_combine(const gvq_dev_qsgd_t *q, size_t off, size_t count,
                                                  const float *local, const void *in, void *out) {
    SIM_DEV("qsgd_encode_combine", local);
    SIM_DEV("qsgd_encode_combine", in);
    SIM_DEV("qsgd_encode_combine", out);
    return sim_qsgd(q, off, count, local, in, out, NULL, NULL);
}
static inline gvqResult_t sim_qsgd_decode(const gvq_dev_qsgd_t *q, size_t off, size_t count,
                                          const void *wire, float *dst) {
    SIM_DEV("qsgd_decode", wire);
    SIM_DEV("qsgd_decode", dst);
    return sim_qsgd(q, off, count, NULL, NULL, NULL, wire, dst);
}

static inline gvqResult_t sim_gq(const gvq_dev_gq_t *g, size_t off, size_t count,
                                 const float *local, const void *in, void *out, double norms[3],
                                 const void *wire, float *dst) {
    __atomic_add_fetch(&sim_codec_calls, 1, __ATOMIC_RELAXED);
    SIM_DEV("gq", g->U);
    SIM_DEV("gq", g->Z);
    SIM_DEV("gq", g->UZ);
    gvq_gradiveq_t h;
    memset(&h, 0, sizeof h);
    h.count = off + count; /* every group up to this chunk's */
    h.L = g->L, h.d = g->d, h.C = g->C, h.nranks = g->nranks, h.wire_fp16 = g->wire_fp16;
    h.U = g->U, h.Z = g->Z;
    GVQCHECK(gvq_gradiveq_prepare(&h, H));
    /* the caller's U^T Z must be the one of its U and Z */
    if (memcmp(h.UZ, g->UZ, sizeof(float) * h.ngroups * h.d) != 0)
        sim_violation("gq", "UZ is not U^T Z");
    gvq_codec_t c;
    gvq_codec_gradiveq_init(&c, H, &h);
    gvqResult_t res = wire == NULL ? c.encode_combine(&c, off, count, local, in, out)
                                   : c.decode(&c, off, count, wire, dst);
    if (norms != NULL) {
        norms[0] += h.local_x2;
        norms[1] += h.local_c2;
        norms[2] += h.local_all2;
    }
    gvq_gradiveq_fini(&h);
    return res;
}
static inline gvqResult_t sim_gq_encode_combine(const gvq_dev_gq_t *g, size_t off, size_t count,
                                                const float *local, const void *in, void *out,
                                                double norms[3]) {
    SIM_DEV("gq_encode_combine", local);
    SIM_DEV("gq_encode_combine", in);
    SIM_DEV("gq_encode_combine", out);
    SIM_HOST("gq_encode_combine", norms);
    return sim_gq(g, off, count, local, in, out, norms, NULL, NULL);
}
static inline gvqResult_t sim_gq_decode(const gvq_dev_gq_t *g, size_t off, size_t count,
                                        const void *wire, float *dst) {
    SIM_DEV("gq_decode", wire);
    SIM_DEV("gq_decode", dst);
    return sim_gq(g, off, count, NULL, NULL, NULL, NULL, wire, dst);
}

__attribute__((unused)) static const gvq_device_ops_t sim_device = {
    .size = sizeof(gvq_device_ops_t),
    .name = "sim",
    .alloc = sim_alloc,
    .free = sim_free,
    .copy = sim_copy,
    .reduce = sim_reduce,
    .divide = sim_divide,
    .sgemm = sim_sgemm,
    .ssyevd = sim_ssyevd,
    .sync = sim_sync,
    .set_stream = sim_set_stream,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_noop,
    .event_wait = sim_event_noop,
    .event_sync = sim_event_noop,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
    .copy_from_host = sim_copy_from_host,
    .copy_to_host = sim_copy_to_host,
    .scale = sim_scale,
    .cast = sim_cast,
    .collocate = sim_collocate,
    .scov = sim_scov,
    .qsgd_encode_combine = sim_qsgd_encode_combine,
    .qsgd_decode = sim_qsgd_decode,
    .gq_encode_combine = sim_gq_encode_combine,
    .gq_decode = sim_gq_decode,
};

/* ---- a transport guard: the host transport must never see device memory ---------------------- */
static const gvq_transport_ops_t *sim_inner_xport;
static gvq_transport_ops_t sim_guard_ops;
static inline gvqResult_t sim_guard_isend(gvq_transport_t *t, int peer, int tag, const void *buf,
                                          size_t bytes, gvq_req_t *req) {
    SIM_HOST("transport isend", buf);
    return sim_inner_xport->isend(t, peer, tag, buf, bytes, req);
}
static inline gvqResult_t sim_guard_irecv(gvq_transport_t *t, int peer, int tag, void *buf,
                                          size_t bytes, gvq_req_t *req) {
    SIM_HOST("transport irecv", buf);
    return sim_inner_xport->irecv(t, peer, tag, buf, bytes, req);
}
static inline gvqResult_t sim_guard_irecv_upto(gvq_transport_t *t, int peer, int tag, void *buf,
                                               size_t bytes, gvq_req_t *req) {
    SIM_HOST("transport irecv_upto", buf);
    return sim_inner_xport->irecv_upto(t, peer, tag, buf, bytes, req);
}
/* Called by every rank thread; all in-process transports share one ops table. */
static inline void sim_guard_transport(gvqComm_t comm) {
    pthread_mutex_lock(&sim_lock);
    if (sim_inner_xport == NULL) {
        sim_inner_xport = comm->xport->ops;
        sim_guard_ops = *sim_inner_xport;
        sim_guard_ops.isend = sim_guard_isend;
        sim_guard_ops.irecv = sim_guard_irecv;
        if (sim_inner_xport->irecv_upto != NULL) sim_guard_ops.irecv_upto = sim_guard_irecv_upto;
    }
    if (comm->xport->ops == sim_inner_xport) comm->xport->ops = &sim_guard_ops;
    pthread_mutex_unlock(&sim_lock);
}

#endif /* SIM_DEVICE_H_ */
