/*
 * chain.c -- pipelined chains for broadcast and reduce.
 *
 *   broadcast from root 1 of 4:   1 -> 2 -> 3 -> 0      each chunk is forwarded the moment it
 *   reduce to root 1 of 4:        2 -> 3 -> 0 -> 1      arrives (and, for reduce, is added)
 *
 * Every link carries the buffer once, so for large buffers the time approaches size/bandwidth
 * plus (N-2) chunk times to fill the pipeline.
 */
#include <stdlib.h>

#include "gvq_algo.h"

gvqResult_t gvq_coll_scratch(gvq_coll_ctx_t *ctx, size_t bytes, void **out) {
    if (*ctx->scratch_bytes < bytes || *ctx->scratch == NULL) {
        void *p = ctx->dev->alloc(bytes);
        if (p == NULL) {
            GVQ_WARN("cannot allocate %zu bytes of scratch on the %s device", bytes,
                     ctx->dev->name);
            return gvqSystemError;
        }
        if (*ctx->scratch != NULL) ctx->dev->free(*ctx->scratch);
        *ctx->scratch = p;
        *ctx->scratch_bytes = bytes;
    }
    *out = *ctx->scratch;
    return gvqSuccess;
}

gvqResult_t gvq_chain_broadcast(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t bytes,
                                int root) {
    gvq_transport_t *t = ctx->xport;
    int n = t->nranks, r = t->rank;
    int pos = (r - root + n) % n, next = (r + 1) % n, prev = (r - 1 + n) % n;
    gvqResult_t res = gvqSuccess;
    if (r == root) GVQCHECK(ctx->dev->copy(dst, src, bytes));
    if (n == 1 || bytes == 0) return gvqSuccess;
    size_t cb = GVQ_MAX((size_t)1, ctx->chunk_bytes), nc = GVQ_DIV_UP(bytes, cb);
    gvq_req_t *rreq = calloc(2 * nc, sizeof(gvq_req_t));
    if (rreq == NULL) return gvqSystemError;
    gvq_req_t *sreq = rreq + nc;
    char *buf = dst;
    if (pos != 0)
        for (size_t c = 0; c < nc; c++)
            GVQCHECKGOTO(t->ops->irecv(t, prev, GVQ_TAG_COLL, buf + c * cb,
                                       GVQ_MIN(cb, bytes - c * cb), &rreq[c]),
                         res, err_cancel);
    for (size_t c = 0; c < nc; c++) {
        if (pos != 0)
            GVQCHECKGOTO(gvq_xport_wait(t, &rreq[c], "broadcast receive"), res, err_cancel);
        if (pos != n - 1)
            GVQCHECKGOTO(t->ops->isend(t, next, GVQ_TAG_COLL, buf + c * cb,
                                       GVQ_MIN(cb, bytes - c * cb), &sreq[c]),
                         res, err_cancel);
    }
    GVQCHECKGOTO(gvq_xport_waitall(t, sreq, (int)nc, "broadcast send"), res, err_cancel);
    free(rreq);
    return gvqSuccess;
err_cancel:
    gvq_xport_cancelall(t, rreq, (int)(2 * nc));
    free(rreq);
    return res;
}

#define CHAIN_WINDOW 8 /* chunks in flight per rank */

gvqResult_t gvq_chain_reduce(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                             gvqDataType_t dtype, gvqRedOp_t op, int root) {
    gvq_transport_t *t = ctx->xport;
    const gvq_device_ops_t *dev = ctx->dev;
    int n = t->nranks, r = t->rank;
    int q = (r - root - 1 + 2 * n) % n, next = (r + 1) % n, prev = (r - 1 + n) % n;
    size_t esize = gvq_dtype_size(dtype);
    gvqRedOp_t eop = op == gvqAvg ? gvqSum : op;
    gvqResult_t res = gvqSuccess;
    if (count == 0) return gvqSuccess;
    if (n == 1) {
        GVQCHECK(dev->copy(dst, src, count * esize));
        return gvqSuccess;
    }
    size_t ce = GVQ_MAX((size_t)1, ctx->chunk_bytes / esize), nc = GVQ_DIV_UP(count, ce);
    size_t slot = ce * esize;
    gvq_req_t rreq[CHAIN_WINDOW], sreq[CHAIN_WINDOW];
    memset(rreq, 0, sizeof rreq);
    memset(sreq, 0, sizeof sreq);
    const char *in = src;
    char *tmp = NULL, *out = NULL;
    if (q == 0) { /* the chain's head sends its own values, a window at a time */
        for (size_t c = 0; c < nc; c++) {
            gvq_req_t *s = &sreq[c % CHAIN_WINDOW];
            GVQCHECKGOTO(gvq_xport_wait(t, s, "reduce send"), res, err_cancel);
            GVQCHECKGOTO(t->ops->isend(t, next, GVQ_TAG_COLL, in + c * slot,
                                       GVQ_MIN(ce, count - c * ce) * esize, s),
                         res, err_cancel);
        }
        GVQCHECKGOTO(gvq_xport_waitall(t, sreq, CHAIN_WINDOW, "reduce send"), res, err_cancel);
        return gvqSuccess;
    }
    void *sc = NULL;
    int last = (q == n - 1); /* the root */
    GVQCHECK(gvq_coll_scratch(ctx, (last ? 1 : 2) * CHAIN_WINDOW * slot, &sc));
    tmp = sc;
    out = last ? dst : tmp + CHAIN_WINDOW * slot;
    for (size_t c = 0; c < GVQ_MIN(nc, (size_t)CHAIN_WINDOW); c++)
        GVQCHECKGOTO(t->ops->irecv(t, prev, GVQ_TAG_COLL, tmp + c * slot,
                                   GVQ_MIN(ce, count - c * ce) * esize, &rreq[c]),
                     res, err_cancel);
    for (size_t c = 0; c < nc; c++) {
        size_t w = c % CHAIN_WINDOW, len = GVQ_MIN(ce, count - c * ce);
        GVQCHECKGOTO(gvq_xport_wait(t, &rreq[w], "reduce receive"), res, err_cancel);
        char *o = last ? out + c * slot : out + w * slot;
        if (!last) GVQCHECKGOTO(gvq_xport_wait(t, &sreq[w], "reduce send"), res, err_cancel);
        GVQCHECKGOTO(dev->reduce(o, in + c * slot, tmp + w * slot, len, dtype, eop), res,
                     err_cancel);
        if (!last)
            GVQCHECKGOTO(t->ops->isend(t, next, GVQ_TAG_COLL, o, len * esize, &sreq[w]), res,
                         err_cancel);
        size_t c2 = c + CHAIN_WINDOW;
        if (c2 < nc)
            GVQCHECKGOTO(t->ops->irecv(t, prev, GVQ_TAG_COLL, tmp + w * slot,
                                       GVQ_MIN(ce, count - c2 * ce) * esize, &rreq[w]),
                         res, err_cancel);
    }
    GVQCHECKGOTO(gvq_xport_waitall(t, sreq, CHAIN_WINDOW, "reduce send"), res, err_cancel);
    if (last && op == gvqAvg) GVQCHECK(dev->divide(dst, count, dtype, n));
    return gvqSuccess;
err_cancel:
    gvq_xport_cancelall(t, rreq, CHAIN_WINDOW);
    gvq_xport_cancelall(t, sreq, CHAIN_WINDOW);
    return res;
}
