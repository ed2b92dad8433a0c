/*
 * direct.c -- allreduce and allgather whose forwards leave from library memory: for transports that
 * copy a send out of the caller's memory (MPI's default, docs/RELIABILITY.md), where the ring's
 * every forward from the output would cost one more pass over the bytes.
 *
 * The allgather half sends each rank's block straight to every other rank instead of around the
 * ring: the same bytes leave each rank ((N-1) blocks), but nothing is forwarded, so nothing has
 * to come back out of the output buffer, and receives land in it directly. With 4 ranks:
 *
 *     allreduce                                          copies of the caller's bytes
 *     1. ring reduce-scatter into scratch                 step 0's send (one block)
 *        (gvq_ring_reduce_scatter_keep): rank r's
 *        finished segment r stays in scratch
 *     2. each chunk of segment r, as it is finished,      one block, from cache
 *        -> output
 *     3. step j = 1..3: segment r from scratch -> r+j,    none
 *        segment r-j -> output
 *
 *     allgather: the own block -> scratch (one copy), then 3 as above.
 *
 * against 2(N-1) blocks for the ring whose forwards come from the output. The steps j run one
 * after the other (each rank talks to one pair of peers at a time), and they come after every
 * receive of the reduce-scatter (a peer's messages on one tag match in order). Results are the ring
 * reduce-scatter's sums, copied: bitwise identical on every rank.
 */
#include <stdlib.h>

#include "gvq_algo.h"

/* Step j = 1 .. N-1 of the exchange: receive block r-j into dst and send own (this rank's
 * block, in library memory) to rank r+j, in chunks of ctx->chunk_bytes; block p is elements
 * [seg_off[p], seg_off[p+1]) of dst. One peer pair at a time, as the ring has: all N-1 at once
 * measured slower from 64 MiB (perf/RESULTS.md section 7). */
static gvqResult_t exchange_step(gvq_coll_ctx_t *ctx, int j, const char *own, char *dst,
                                 const size_t *seg_off, size_t esize, gvq_req_t *req) {
    gvq_transport_t *t = ctx->xport;
    int n = t->nranks, r = t->rank, from = (r - j + n) % n, to = (r + j) % n;
    size_t ce = GVQ_MAX(ctx->chunk_bytes / esize, 1), own_len = seg_off[r + 1] - seg_off[r];
    gvqResult_t res = gvqSuccess;
    int nreq = 0;
    for (size_t off = seg_off[from]; off < seg_off[from + 1] && res == gvqSuccess; off += ce) {
        size_t len = GVQ_MIN(ce, seg_off[from + 1] - off);
        res = t->ops->irecv(t, from, GVQ_TAG_COLL, dst + off * esize, len * esize, &req[nreq++]);
    }
    for (size_t off = 0; off < own_len && res == gvqSuccess; off += ce) {
        size_t bytes = GVQ_MIN(ce, own_len - off) * esize;
        if (ctx->bytes_sent != NULL) *ctx->bytes_sent += bytes;
        res = t->ops->isend(t, to, GVQ_TAG_COLL, own + off * esize, bytes, &req[nreq++]);
    }
    if (res == gvqSuccess) res = gvq_xport_waitall(t, req, nreq, "direct exchange");
    if (res != gvqSuccess) gvq_xport_cancelall(t, req, nreq);
    return res;
}

/* Every other rank's block into dst, own to every other rank (see exchange_step). */
static gvqResult_t exchange_blocks(gvq_coll_ctx_t *ctx, const char *own, char *dst,
                                   const size_t *seg_off, size_t esize) {
    int n = ctx->xport->nranks;
    size_t ce = GVQ_MAX(ctx->chunk_bytes / esize, 1), maxchunks = 0;
    for (int p = 0; p < n; p++)
        maxchunks = GVQ_MAX(maxchunks, GVQ_DIV_UP(seg_off[p + 1] - seg_off[p], ce));
    if (maxchunks == 0) return gvqSuccess;
    gvq_req_t *req = calloc(2 * maxchunks, sizeof *req);
    if (req == NULL) return gvqSystemError;
    gvqResult_t res = gvqSuccess;
    for (int j = 1; j < n && res == gvqSuccess; j++)
        res = exchange_step(ctx, j, own, dst, seg_off, esize, req);
    free(req);
    return res;
}

gvqResult_t gvq_direct_allreduce(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                                 gvqDataType_t dtype, gvqRedOp_t op) {
    const gvq_device_ops_t *dev = ctx->dev;
    int n = ctx->xport->nranks;
    size_t esize = gvq_dtype_size(dtype);
    if (count == 0) return gvqSuccess;
    if (n == 1) {
        if (src != dst) GVQCHECK(dev->copy(dst, src, count * esize));
        return gvqSuccess;
    }
    size_t *seg_off = malloc(sizeof(size_t) * (size_t)(n + 1));
    if (seg_off == NULL) return gvqSystemError;
    gvq_ring_partition(seg_off, n, count, 1);
    char *own = NULL;
    gvqResult_t res = gvq_ring_reduce_scatter_keep(ctx, src, dst, count, dtype, op, seg_off, &own);
    if (res == gvqSuccess) res = exchange_blocks(ctx, own, dst, seg_off, esize);
    free(seg_off);
    GVQCHECK(res);
    if (op == gvqAvg) GVQCHECK(dev->divide(dst, count, dtype, n));
    return gvqSuccess;
}

gvqResult_t gvq_direct_allgather(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                                 gvqDataType_t dtype) {
    const gvq_device_ops_t *dev = ctx->dev;
    int n = ctx->xport->nranks, r = ctx->xport->rank;
    size_t esize = gvq_dtype_size(dtype), bytes = count * esize;
    if (count == 0) return gvqSuccess;
    GVQCHECK(dev->copy((char *)dst + (size_t)r * bytes, src, bytes));
    if (n == 1) return gvqSuccess;
    char *own = NULL;
    GVQCHECK(gvq_coll_scratch(ctx, bytes, (void **)&own));
    GVQCHECK(dev->copy(own, src, bytes));
    size_t *seg_off = malloc(sizeof(size_t) * (size_t)(n + 1));
    if (seg_off == NULL) return gvqSystemError;
    for (int p = 0; p <= n; p++)
        seg_off[p] = (size_t)p * count;
    gvqResult_t res = exchange_blocks(ctx, own, dst, seg_off, esize);
    free(seg_off);
    return res;
}
