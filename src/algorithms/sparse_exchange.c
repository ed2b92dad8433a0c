/*
 * sparse_exchange.c -- moving row blocks between ranks: the all-to-all of a parameter server's
 * push and pull, and the two transfers of the sparse allgatherv (ring, or the transport's own).
 *
 * All-to-all, as one rank sees it (headers first, so that nothing is received blind):
 *
 *     post header receives from every peer      {magic ^ kind, status, nrows}   24 bytes
 *     send a header to every peer
 *     wait for the headers; check magic, status, nrows <= what this rank accepts from the peer
 *     post block receives of exactly nrows * (8 + row_bytes) bytes (pieces of <= 1 GiB)
 *     send the blocks; wait for everything
 *
 * The ring allgatherv posts every receive of its N-1 steps at once (each block's place in the
 * output is known from the exchanged counts) and forwards each chunk the moment it arrives:
 *
 *     step 0: 0->1 b0  1->2 b1  2->3 b2  3->0 b3        block b_r starts on rank r
 *     step 1: 0->1 b3  1->2 b0  2->3 b1  3->0 b2        step k: send b_(r-k), recv b_(r-k-1)
 *     step 2: 0->1 b2  1->2 b3  2->3 b0  3->0 b1        after N-1 steps every rank has all
 */
#include <limits.h>
#include <stdlib.h>

#include "gvq_sparse.h"

#define SX_PIECE ((size_t)1 << 30) /* one transport message holds < 2 GiB */

static size_t pieces_of(size_t bytes) {
    return GVQ_DIV_UP(bytes, SX_PIECE);
}

static void mark_broken(gvq_transport_t *t) {
    gvq_broken_set(t->broken, gvqRemoteError);
}

/* Post `bytes` as pieces to or from `peer`; reqs advances past the pieces. */
static gvqResult_t post_pieces(gvq_transport_t *t, int send, int peer, void *buf, size_t bytes,
                               gvq_req_t **reqs) {
    size_t np = pieces_of(bytes);
    for (size_t i = 0; i < np; i++) {
        size_t len = GVQ_MIN(SX_PIECE, bytes - i * SX_PIECE);
        char *p = (char *)buf + i * SX_PIECE;
        if (send)
            GVQCHECK(t->ops->isend(t, peer, GVQ_TAG_COLL, p, len, *reqs));
        else
            GVQCHECK(t->ops->irecv(t, peer, GVQ_TAG_COLL, p, len, *reqs));
        (*reqs)++;
    }
    return gvqSuccess;
}

gvqResult_t gvq_sx_alltoallv(gvq_coll_ctx_t *ctx, int kind, size_t row_bytes,
                             const gvq_sx_block_t *send, const uint8_t *send_mask,
                             const size_t *recv_cap, const uint8_t *recv_mask, gvq_sx_block_t *recv,
                             gvq_sx_bytes_t *bytes) {
    gvq_transport_t *t = ctx->xport;
    int N = t->nranks, r = t->rank;
    const size_t rowb = 8 + row_bytes;
    gvqResult_t res = gvqSuccess;
    for (int p = 0; p < N; p++)
        recv[p] = (gvq_sx_block_t){0, 0, NULL};
    if (N <= 1) return gvqSuccess;
    int64_t(*hs)[3] = calloc((size_t)N, sizeof *hs);
    int64_t(*hr)[3] = calloc((size_t)N, sizeof *hr);
    gvq_req_t *hreq = calloc(2 * (size_t)N, sizeof *hreq);
    gvq_req_t *breq = NULL;
    if (hs == NULL || hr == NULL || hreq == NULL) {
        res = gvqSystemError;
        goto out_free;
    }
    /* headers */
    for (int p = 0; p < N; p++) {
        if (p == r || (recv_mask != NULL && !recv_mask[p])) continue;
        GVQCHECKGOTO(t->ops->irecv(t, p, GVQ_TAG_COLL, hr[p], sizeof hr[p], &hreq[p]), res,
                     err_cancel);
    }
    for (int p = 0; p < N; p++) {
        if (p == r || (send_mask != NULL && !send_mask[p])) continue;
        hs[p][0] = GVQ_SX_MAGIC ^ kind;
        hs[p][1] = send[p].status;
        hs[p][2] = (int64_t)send[p].nrows;
        GVQCHECKGOTO(t->ops->isend(t, p, GVQ_TAG_COLL, hs[p], sizeof hs[p], &hreq[N + p]), res,
                     err_cancel);
        bytes->sent += sizeof hs[p];
    }
    GVQCHECKGOTO(gvq_xport_waitall(t, hreq, 2 * N, "sparse exchange header"), res, err_cancel);
    /* check every header before anything is received on its strength */
    size_t nbreq = 0;
    for (int p = 0; p < N; p++) {
        if (p == r || (recv_mask != NULL && !recv_mask[p])) continue;
        bytes->received += sizeof hr[p];
        int64_t st = hr[p][1], n = hr[p][2];
        const char *bad = NULL;
        if (hr[p][0] != (GVQ_SX_MAGIC ^ kind))
            bad = "a wrong magic (a message of another call?)";
        else if (st != 0 && st != 1)
            bad = "an unknown status";
        else if (n < 0 || (uint64_t)n > recv_cap[p] || (st == 1 && n != 0))
            bad = "more rows than this rank can accept from it";
        else if ((uint64_t)n > SIZE_MAX / rowb)
            bad = "a size that overflows";
        if (bad != NULL) {
            GVQ_WARN("sparse exchange: rank %d sent a header with %s (status %lld, rows %lld, "
                     "at most %zu accepted); the communicator is broken",
                     p, bad, (long long)st, (long long)n, recv_cap[p]);
            mark_broken(t);
            res = gvqRemoteError;
            goto out_free;
        }
        recv[p].status = st;
        recv[p].nrows = (size_t)n;
        nbreq += pieces_of((size_t)n * rowb);
    }
    for (int p = 0; p < N; p++) {
        if (p == r || (send_mask != NULL && !send_mask[p])) continue;
        nbreq += pieces_of(send[p].nrows * rowb);
    }
    if (nbreq == 0) goto out_free;
    breq = calloc(nbreq, sizeof *breq);
    if (breq == NULL) {
        res = gvqSystemError;
        goto out_free;
    }
    gvq_req_t *q = breq;
    for (int p = 0; p < N; p++) {
        if (recv[p].nrows == 0) continue;
        recv[p].buf = malloc(recv[p].nrows * rowb);
        if (recv[p].buf == NULL) {
            GVQ_WARN("sparse exchange: cannot allocate %zu rows from rank %d", recv[p].nrows, p);
            res = gvqSystemError;
            goto err_cancel_blocks;
        }
        GVQCHECKGOTO(post_pieces(t, 0, p, recv[p].buf, recv[p].nrows * rowb, &q), res,
                     err_cancel_blocks);
        bytes->received += recv[p].nrows * rowb;
    }
    for (int p = 0; p < N; p++) {
        if (p == r || (send_mask != NULL && !send_mask[p]) || send[p].nrows == 0) continue;
        GVQCHECKGOTO(post_pieces(t, 1, p, send[p].buf, send[p].nrows * rowb, &q), res,
                     err_cancel_blocks);
        bytes->sent += send[p].nrows * rowb;
    }
    GVQCHECKGOTO(gvq_xport_waitall(t, breq, (int)(q - breq), "sparse exchange rows"), res,
                 err_cancel_blocks);
    goto out_free;
err_cancel_blocks:
    gvq_xport_cancelall(t, breq, (int)nbreq);
    goto out_free;
err_cancel:
    gvq_xport_cancelall(t, hreq, 2 * N);
    if (t->cancel_keeps_buffers) hs = NULL; /* a cancelled send may still read it: leak */
out_free:
    free(breq);
    free(hreq);
    free(hs);
    free(hr);
    return res;
}

gvqResult_t gvq_sx_exchange(gvq_coll_ctx_t *ctx, void *const *sbuf, const size_t *sbytes,
                            void *const *rbuf, const size_t *rbytes, gvq_sx_bytes_t *bytes) {
    gvq_transport_t *t = ctx->xport;
    int N = t->nranks, r = t->rank;
    size_t nreq = 0;
    for (int p = 0; p < N; p++)
        if (p != r) nreq += pieces_of(sbytes[p]) + pieces_of(rbytes[p]);
    if (nreq == 0) return gvqSuccess;
    gvq_req_t *reqs = calloc(nreq, sizeof *reqs), *q = reqs;
    if (reqs == NULL) return gvqSystemError;
    gvqResult_t res = gvqSuccess;
    for (int p = 0; p < N; p++) {
        if (p == r || rbytes[p] == 0) continue;
        GVQCHECKGOTO(post_pieces(t, 0, p, rbuf[p], rbytes[p], &q), res, err_cancel);
        bytes->received += rbytes[p];
    }
    for (int p = 0; p < N; p++) {
        if (p == r || sbytes[p] == 0) continue;
        GVQCHECKGOTO(post_pieces(t, 1, p, sbuf[p], sbytes[p], &q), res, err_cancel);
        bytes->sent += sbytes[p];
    }
    GVQCHECKGOTO(gvq_xport_waitall(t, reqs, (int)(q - reqs), "sparse exchange replies"), res,
                 err_cancel);
    free(reqs);
    return gvqSuccess;
err_cancel:
    gvq_xport_cancelall(t, reqs, (int)nreq);
    free(reqs);
    return res;
}

/* ---- sparse allgatherv -------------------------------------------------------------------- */

gvqResult_t gvq_sparse_ring_allgatherv(gvq_coll_ctx_t *ctx, void *blocks, const size_t *displ,
                                       const size_t *blen, gvq_sx_bytes_t *bytes) {
    gvq_transport_t *t = ctx->xport;
    int N = t->nranks, r = t->rank, left = (r - 1 + N) % N, right = (r + 1) % N;
    if (N == 1) return gvqSuccess;
    size_t cb = GVQ_MAX((size_t)1, GVQ_MIN(ctx->chunk_bytes, SX_PIECE)), total = 0;
    for (int p = 0; p < N; p++)
        total += GVQ_DIV_UP(blen[p], cb);
    if (total == 0) return gvqSuccess;
    gvq_req_t *rreq = calloc(2 * total, sizeof *rreq);
    if (rreq == NULL) return gvqSystemError;
    gvq_req_t *sreq = rreq + total;
    size_t *first = calloc((size_t)N, sizeof *first); /* first receive request of step k */
    gvqResult_t res = gvqSuccess;
    if (first == NULL) {
        free(rreq);
        return gvqSystemError;
    }
    char *base = blocks;
    size_t nr = 0, ns = 0;
    for (int k = 0; k < N - 1; k++) { /* every receive, in step order */
        int b = ((r - k - 1) % N + N) % N;
        first[k] = nr;
        for (size_t off = 0; off < blen[b]; off += cb) {
            size_t len = GVQ_MIN(cb, blen[b] - off);
            GVQCHECKGOTO(
                t->ops->irecv(t, left, GVQ_TAG_COLL, base + displ[b] + off, len, &rreq[nr++]), res,
                err_cancel);
            bytes->received += len;
        }
    }
    for (size_t off = 0; off < blen[r]; off += cb) { /* step 0: the own block */
        size_t len = GVQ_MIN(cb, blen[r] - off);
        GVQCHECKGOTO(t->ops->isend(t, right, GVQ_TAG_COLL, base + displ[r] + off, len, &sreq[ns++]),
                     res, err_cancel);
        bytes->sent += len;
    }
    for (int k = 0; k < N - 1; k++) { /* forward what step k brings, chunk by chunk */
        int b = ((r - k - 1) % N + N) % N;
        size_t c = first[k];
        for (size_t off = 0; off < blen[b]; off += cb, c++) {
            size_t len = GVQ_MIN(cb, blen[b] - off);
            GVQCHECKGOTO(gvq_xport_wait(t, &rreq[c], "sparse allgatherv receive"), res, err_cancel);
            if (k == N - 2) continue; /* the last block stops here */
            GVQCHECKGOTO(
                t->ops->isend(t, right, GVQ_TAG_COLL, base + displ[b] + off, len, &sreq[ns++]), res,
                err_cancel);
            bytes->sent += len;
        }
    }
    GVQCHECKGOTO(gvq_xport_waitall(t, sreq, (int)ns, "sparse allgatherv send"), res, err_cancel);
    free(first);
    free(rreq);
    return gvqSuccess;
err_cancel:
    gvq_xport_cancelall(t, rreq, (int)(2 * total));
    free(first);
    free(rreq);
    return res;
}

int gvq_sparse_native_ok(const gvq_transport_t *t, const size_t *blen) {
    if (t->ops->iallgatherv == gvq_xport_iallgatherv_unsupported) return 0;
    size_t total = 0;
    for (int p = 0; p < t->nranks; p++) {
        if (blen[p] > (size_t)INT_MAX) return 0;
        total += blen[p];
    }
    return total <= (size_t)INT_MAX;
}

gvqResult_t gvq_sparse_native_allgatherv(gvq_coll_ctx_t *ctx, void *blocks, const size_t *displ,
                                         const size_t *blen, gvq_sx_bytes_t *bytes) {
    gvq_transport_t *t = ctx->xport;
    int N = t->nranks, r = t->rank;
    if (N == 1) return gvqSuccess;
    gvq_req_t req;
    memset(&req, 0, sizeof req);
    GVQCHECK(t->ops->iallgatherv(t, blocks, displ, blen, &req));
    GVQCHECK(gvq_xport_wait(t, &req, "sparse allgatherv (native)"));
    /* what the blocks amount to; the transport's own algorithm may route them otherwise */
    for (int p = 0; p < N; p++)
        if (p != r) bytes->received += blen[p];
    bytes->sent += (unsigned long long)blen[r] * (unsigned long long)(N - 1);
    return gvqSuccess;
}
