/*
 * tree.c -- binomial trees for small broadcasts and reduces: ceil(log2 N) steps where the chain
 * (chain.c) takes N-1.
 *
 * Ranks are numbered relative to the root, v = (r - root) mod N. Broadcast: v receives from
 * v - m, m its lowest set bit, then sends to v + m/2, v + m/4, .., 1 (those below N); the root
 * sends to N/2.., 2, 1 (powers of two below N). Reduce runs the same tree upwards: v adds in
 * the values of v + 1, v + 2, v + 4, .. (while the bit is clear in v and the child exists),
 * then sends its sum to v - m. With N = 8:
 *
 *     broadcast   0 -> 4, 2, 1    4 -> 6, 5    2 -> 3    6 -> 7
 *     reduce      7 -> 6    6, 5 -> 4    3 -> 2    4, 2, 1 -> 0
 *
 * A reduce node always puts its own (lower v) values first: (v) op (v+1), then that op (v+2..),
 * so the operand order is fixed by the tree alone. Only the root holds the result.
 */
#include "gvq_algo.h"

/* The lowest set bit of v (N's next power of two for the root, v 0). */
static int low_bit(int v, int n) {
    int m = 1;
    while (m < n && (v & m) == 0)
        m <<= 1;
    return m;
}

gvqResult_t gvq_tree_broadcast(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t bytes,
                               int root) {
    gvq_transport_t *t = ctx->xport;
    int n = t->nranks, r = t->rank, v = (r - root + n) % n;
    if (r == root && src != dst) GVQCHECK(ctx->dev->copy(dst, src, bytes));
    if (n == 1 || bytes == 0) return gvqSuccess;
    int m = low_bit(v, n);
    gvq_req_t req[33];
    memset(req, 0, sizeof req);
    gvqResult_t res = gvqSuccess;
    if (v != 0) {
        GVQCHECK(t->ops->irecv(t, (v - m + root) % n, GVQ_TAG_COLL, dst, bytes, &req[0]));
        GVQCHECK(gvq_xport_wait(t, &req[0], "tree broadcast receive"));
    }
    int k = 0;
    for (int c = m >> 1; c >= 1 && res == gvqSuccess; c >>= 1)
        if (v + c < n)
            res = t->ops->isend(t, (v + c + root) % n, GVQ_TAG_COLL, dst, bytes, &req[k++]);
    if (res == gvqSuccess) res = gvq_xport_waitall(t, req, k, "tree broadcast send");
    if (res != gvqSuccess) gvq_xport_cancelall(t, req, k);
    return res;
}

gvqResult_t gvq_tree_reduce(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                            gvqDataType_t dtype, gvqRedOp_t op, int root) {
    gvq_transport_t *t = ctx->xport;
    const gvq_device_ops_t *dev = ctx->dev;
    int n = t->nranks, r = t->rank, v = (r - root + n) % n;
    size_t bytes = count * gvq_dtype_size(dtype);
    gvqRedOp_t eop = op == gvqAvg ? gvqSum : op;
    if (count == 0) return gvqSuccess;
    if (n == 1) return src == dst ? gvqSuccess : dev->copy(dst, src, bytes);
    char *sc = NULL;
    GVQCHECK(gvq_coll_scratch(ctx, 2 * bytes, (void **)&sc));
    char *acc = v == 0 ? (char *)dst : sc + bytes, *tmp = sc;
    if (acc != src) GVQCHECK(dev->copy(acc, src, bytes));
    int m = low_bit(v, n);
    for (int c = 1; c < m && v + c < n; c <<= 1) { /* children v+1, v+2, v+4, .. */
        gvq_req_t req;
        memset(&req, 0, sizeof req);
        GVQCHECK(t->ops->irecv(t, (v + c + root) % n, GVQ_TAG_COLL, tmp, bytes, &req));
        GVQCHECK(gvq_xport_wait(t, &req, "tree reduce receive"));
        GVQCHECK(dev->reduce(acc, acc, tmp, count, dtype, eop));
    }
    if (v != 0) {
        gvq_req_t req;
        memset(&req, 0, sizeof req);
        GVQCHECK(t->ops->isend(t, (v - m + root) % n, GVQ_TAG_COLL, acc, bytes, &req));
        return gvq_xport_wait(t, &req, "tree reduce send");
    }
    if (op == gvqAvg) GVQCHECK(dev->divide(dst, count, dtype, n));
    return gvqSuccess;
}
