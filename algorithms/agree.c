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
