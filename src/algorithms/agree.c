/*
 * agree.c -- small collectives that keep every rank's decisions identical (gvq_algo.h):
 *
 *   gvq_agree_i32      v = op over the ranks           (a ring allreduce of n int32)
 *   gvq_agree_fields   rank 0: [f0 f1 .. fn-1] -.
 *                      rank 1: [f0 f1 .. fn-1]  +--ring allgather--> every rank compares the
 *                      ...                     -'    named fields with its own, in rank order
 *
 * Every rank sees the same gathered table, so a mismatch is refused on every rank alike, and
 * the WARN names the first rank and field that differ from this rank's.
 */
#include <stdlib.h>
#include <string.h>

#include "gvq_algo.h"

gvqResult_t gvq_agree_i32(gvq_coll_ctx_t *ctx, int32_t *v, int n, gvqRedOp_t op) {
    gvq_codec_t id;
    gvq_codec_identity_init(&id, ctx->dev, gvqInt32, op);
    return gvq_ring_allreduce(ctx, &id, v, v, (size_t)n, op);
}

/* The first named field of a gathered row that differs from mine, or -1. */
static int first_difference(const int64_t *row, const int64_t *mine, const char *const *names,
                            int n) {
    for (int f = 0; f < n; f++)
        if (names[f] != NULL && row[f] != mine[f]) return f;
    return -1;
}

gvqResult_t gvq_agree_fields(gvq_coll_ctx_t *ctx, const char *fn, const int64_t *mine,
                             const char *const *names, int n, int64_t *all) {
    int N = ctx->xport->nranks;
    int64_t *table = all != NULL ? all : calloc((size_t)N * (size_t)n, sizeof *table);
    if (table == NULL) return gvqSystemError;
    gvqResult_t res = gvq_ring_allgather(ctx, mine, table, (size_t)n, gvqInt64);
    for (int p = 0; p < N && res == gvqSuccess; p++) {
        const int64_t *row = table + (size_t)p * (size_t)n;
        int f = first_difference(row, mine, names, n);
        if (f >= 0) {
            GVQ_WARN("%s: rank %d passed %s %lld, this rank %lld (must be equal on every rank)", fn,
                     p, names[f], (long long)row[f], (long long)mine[f]);
            res = gvqInvalidArgument;
        }
    }
    if (table != all) free(table);
    return res;
}

/* ---- extremes: every rank learns the smallest and the largest row of all ranks ----------------
 *
 * Dissemination (Hensgen, Finkel, Manber): in round k every rank sends what it has seen so far to
 * rank r + 2^k and merges what rank r - 2^k has seen, so after ceil(log2 N) rounds every rank has
 * merged every rank's row; min and max are idempotent, so rows seen twice do no harm.
 *
 *   N = 4, round 0:  0 -> 1 -> 2 -> 3 -> 0     round 1:  0 -> 2, 1 -> 3, 2 -> 0, 3 -> 1
 *
 * Rows compare lexicographically, ties by rank, so the extremes are one (row, rank) pair each,
 * the same on every rank. Every message has the same size, so no round can read a later one.
 *
 * Transports with irecv_upto (MPI, in-process) run recursive.c's signed exchange instead: the
 * pattern of recursive doubling, which a small allreduce shares, so that its data can ride along
 * with the signature. Dissemination stays for the others (FIFO transports). */

enum { AGREE_TAG = GVQ_TAG_SIGNED, AGREE_MAX_FIELDS = 16 };

gvqResult_t gvq_agree_extremes(gvq_coll_ctx_t *ctx, const int64_t *mine, int n, int64_t *lo,
                               int *lo_rank, int64_t *hi, int *hi_rank) {
    gvq_transport_t *t = ctx->xport;
    int N = t->nranks, r = t->rank;
    if (n < 1 || n > AGREE_MAX_FIELDS) return gvqInternalError;
    if (t->ops->irecv_upto != NULL) /* the pattern that small allreduces share (recursive.c) */
        return gvq_rd_signed(ctx, mine, n, lo, lo_rank, hi, hi_rank, NULL);
    size_t len = 2 * ((size_t)n + 1), bytes = len * sizeof(int64_t);
    int64_t have[2 * (AGREE_MAX_FIELDS + 1)];
    /* the wire on the heap: after a failure the transport may still touch it (then it is left) */
    int64_t *out = malloc(2 * bytes), *in = out + len;
    if (out == NULL) return gvqSystemError;
    have[0] = have[n + 1] = r;
    for (int f = 0; f < n; f++)
        have[1 + f] = have[n + 2 + f] = mine[f];
    for (int d = 1; d < N; d *= 2) {
        gvq_req_t req[2];
        memset(req, 0, sizeof req);
        for (size_t f = 0; f < len; f++)
            out[f] = have[f];
        gvqResult_t res = t->ops->irecv(t, (r - d + N) % N, AGREE_TAG, in, bytes, &req[0]);
        if (res == gvqSuccess) res = t->ops->isend(t, (r + d) % N, AGREE_TAG, out, bytes, &req[1]);
        if (res == gvqSuccess) res = gvq_xport_waitall(t, req, 2, "call agreement");
        if (res != gvqSuccess) {
            gvq_xport_cancelall(t, req, 2);
            if (!t->cancel_keeps_buffers) free(out);
            return res;
        }
        gvq_extremes_merge(have, in, n);
    }
    free(out);
    *lo_rank = (int)have[0];
    *hi_rank = (int)have[n + 1];
    for (int f = 0; f < n; f++) {
        lo[f] = have[1 + f];
        hi[f] = have[n + 2 + f];
    }
    return gvqSuccess;
}
