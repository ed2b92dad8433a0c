/*
 * hier.c -- the hierarchical allreduce for hosts of several ranks (docs/ALGORITHMS.md section 1,
 * "Hosts of several ranks").
 *
 * H hosts of K ranks each. The vector is cut into K pieces on the codec's granule:
 *
 *   1. inside each host, a ring reduce-scatter over its K ranks: local rank j holds piece j of
 *      the host's sum (shared memory or loopback: no host link is crossed);
 *   2. across the hosts, K rings of H ranks, ring j made of every host's local rank j, each
 *      allreducing piece j (cut into H segments) through the codec. A host's K rings run at
 *      once, so its link carries 2 (H - 1) / H of the vector each way, against
 *      2 (N - 1) / N for a flat ring in host order, in 2 (H - 1) steps instead of 2 (N - 1);
 *   3. inside each host, a ring allgather of the K pieces.
 *
 * Only stage 2 crosses host links, so only stage 2 is compressed: a re-quantizing codec adds
 * its error H - 1 times instead of N - 1. An integer-summed wire (codec_intsum.c) agrees on its
 * scales between stages 1 and 2 (begin_part: each rank's maxima over its piece of the host's
 * sum, the max over all ranks) and adds H host sums, so its headroom is H's: each host's level
 * is bounded by floor((2^(b-1) - 1) / H), the caller makes the wire with H. Every rank ends with
 * the same bits: stage 2 gives the same piece to every host (a ring allreduce does), stage 3 copies
 * it. gvqAvg divides once at the end by N.
 *
 * Small vectors, where the steps' latency is the cost (gvq_hier_allreduce_small): recursive
 * doubling of the whole vector among each host's ranks, then among each cross ring's: every
 * local rank sends the whole vector across (K times the bytes of one leader, but no allgather
 * inside the host afterwards), log2 K + log2 H steps of which log2 H cross a link, against
 * 2 (N - 1) for the flat ring. Identical on every rank: a host's ranks end with the same bits
 * (recursive doubling is identical on every rank), so the K cross rings add the same values in
 * the same order.
 */
#include <stdint.h>
#include <stdlib.h>

#include "gvq_algo.h"

void gvq_hier_free(gvq_hier_t *h) {
    if (h == NULL) return;
    free(h->local);
    free(h->cross);
    free(h->local_pos);
    free(h->order);
    if (h->scratch != NULL) {
        free(h->scratch->off);
        free(h->scratch->blocks);
        free(h->scratch);
    }
    free(h);
}

gvqResult_t gvq_hier_of_hosts(const uint64_t *keys, int n, int rank, gvq_hier_t **out) {
    *out = NULL;
    int *order = malloc(sizeof(int) * (size_t)n);
    if (order == NULL) return gvqSystemError;
    (void)gvq_ring_order_hosts(keys, n, order); /* hosts in one run each */
    int H = 0, K = 0, uniform = 1;
    for (int p = 0; p < n;) {
        int q = p;
        while (q < n && keys[order[q]] == keys[order[p]])
            q++;
        if (H == 0) K = q - p;
        uniform &= q - p == K;
        H++;
        p = q;
    }
    if (!uniform || H < 2 || K < 2) {
        free(order);
        return gvqSuccess;
    }
    gvq_hier_t *h = calloc(1, sizeof *h);
    if (h != NULL) {
        h->local = malloc(sizeof(int) * (size_t)K);
        h->local_pos = malloc(sizeof(int) * (size_t)K);
        h->cross = malloc(sizeof(int) * (size_t)H);
        h->scratch = calloc(1, sizeof *h->scratch);
        if (h->scratch != NULL) h->scratch->off = malloc(sizeof(size_t) * (size_t)(K + 1 + H + 1));
    }
    if (h == NULL || h->local == NULL || h->local_pos == NULL || h->cross == NULL ||
        h->scratch == NULL || h->scratch->off == NULL) {
        gvq_hier_free(h);
        free(order);
        return gvqSystemError;
    }
    h->nhosts = H;
    h->per_host = K;
    int mine = 0;
    for (int p = 0; p < n; p++)
        if (order[p] == rank) mine = p;
    h->local_index = mine % K;
    h->host_index = mine / K;
    for (int j = 0; j < K; j++) {
        h->local[j] = order[mine - mine % K + j];
        h->local_pos[j] = j;
    }
    for (int g = 0; g < H; g++)
        h->cross[g] = order[g * K + h->local_index];
    h->order = order; /* kept: the reduce-scatter's and allgather's block layout */
    *out = h;
    return gvqSuccess;
}

/* The context and members of the stages inside the host (see gvq_hier_t.local_xport). */
gvq_coll_ctx_t gvq_hier_local_ctx(const gvq_coll_ctx_t *ctx, const int **members) {
    const gvq_hier_t *h = ctx->hier;
    gvq_coll_ctx_t l = *ctx;
    *members = h->local;
    if (h->local_xport != NULL) {
        l.xport = h->local_xport;
        l.ring_order = NULL;
        *members = h->local_pos;
    }
    return l;
}

gvqResult_t gvq_hier_allreduce(gvq_coll_ctx_t *ctx, const gvq_codec_t *codec, const void *src,
                               void *dst, size_t count, gvqRedOp_t op) {
    const gvq_hier_t *h = ctx->hier;
    if (h == NULL || (codec->begin != NULL && codec->begin_part == NULL)) return gvqInternalError;
    if (count == 0) return gvqSuccess;
    int H = h->nhosts, K = h->per_host, j = h->local_index;
    size_t *off = h->scratch->off, *cross_off = off + K + 1;
    gvq_ring_partition(off, K, count, codec->granule);
    gvq_ring_partition(cross_off, H, off[j + 1] - off[j], codec->granule);
    for (int s = 0; s <= H; s++)
        cross_off[s] += off[j];
    const int *lm;
    gvq_coll_ctx_t lctx = gvq_hier_local_ctx(ctx, &lm);
    gvq_subring_t local = {lm, K, off}, cross = {h->cross, H, cross_off};
    gvqResult_t res = gvq_subring_reduce_scatter(&lctx, &local, src, dst, codec->dtype, op);
    /* an integer wire's scales: each rank's maxima over its piece of the host's sum, the max
     * over all N ranks (every host holds every piece), so each block's scale is the largest of
     * the H host sums that its ring adds */
    if (res == gvqSuccess && codec->begin != NULL)
        res = codec->begin_part(codec, ctx, dst, count, off[j], off[j + 1]);
    if (res == gvqSuccess) res = gvq_subring_allreduce(ctx, &cross, codec, dst, dst);
    if (res == gvqSuccess) res = gvq_subring_allgather(&lctx, &local, dst, codec->dtype);
    if (res == gvqSuccess && op == gvqAvg) res = ctx->dev->divide(dst, count, codec->dtype, H * K);
    return res;
}

gvqResult_t gvq_hier_allreduce_small(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                                     gvqDataType_t dtype, gvqRedOp_t op) {
    const gvq_hier_t *h = ctx->hier;
    if (h == NULL) return gvqInternalError;
    if (count == 0) return gvqSuccess;
    gvqRedOp_t sum_op = op == gvqAvg ? gvqSum : op;
    const int *lm;
    gvq_coll_ctx_t lctx = gvq_hier_local_ctx(ctx, &lm);
    GVQCHECK(gvq_rd_allreduce_members(&lctx, lm, h->per_host, src, dst, count, dtype, sum_op));
    GVQCHECK(gvq_rd_allreduce_members(ctx, h->cross, h->nhosts, dst, dst, count, dtype, sum_op));
    if (op == gvqAvg) GVQCHECK(ctx->dev->divide(dst, count, dtype, h->nhosts * h->per_host));
    return gvqSuccess;
}

/* ---- reduce-scatter and allgather --------------------------------------------------------
 * The buffer holds the N blocks piece by piece: position j * H + g is the block of host g's
 * local rank j (h->order[g * K + j]), so piece j (the blocks of ring j's members) is contiguous
 * and its H blocks are in ring j's order. */
typedef struct {
    char *buf;    /* the communicator's (h->scratch), grown on demand */
    size_t bytes; /* of one block */
    size_t *off;  /* K + 1 piece boundaries, then H + 1 block boundaries of piece j (elements) */
} hier_blocks_t;

static gvqResult_t blocks_init(const gvq_hier_t *h, size_t count, size_t esize, hier_blocks_t *b) {
    int H = h->nhosts, K = h->per_host, j = h->local_index;
    size_t n = (size_t)H * (size_t)K;
    struct gvq_hier_scratch *sc = h->scratch;
    b->bytes = count * esize;
    if (n * b->bytes > sc->cap) {
        free(sc->blocks); /* nothing in it to keep */
        sc->cap = 0;
        char *p = sc->blocks = malloc(n * b->bytes);
        if (p == NULL) {
            GVQ_WARN("hierarchical collective: cannot allocate %zu bytes of blocks", n * b->bytes);
            return gvqSystemError;
        }
        sc->cap = n * b->bytes;
    }
    b->buf = sc->blocks;
    b->off = sc->off;
    for (int k = 0; k <= K; k++)
        b->off[k] = (size_t)k * (size_t)H * count;
    for (int g = 0; g <= H; g++)
        b->off[K + 1 + g] = b->off[j] + (size_t)g * count;
    return gvqSuccess;
}

static char *block_at(const hier_blocks_t *b, const gvq_hier_t *h, int g, int j) {
    return b->buf + ((size_t)j * (size_t)h->nhosts + (size_t)g) * b->bytes;
}

/* Every block between rank order (ranked: block r is rank r's) and b's layout: into b when `in`,
 * else out of it. */
static gvqResult_t blocks_move(gvq_coll_ctx_t *ctx, const hier_blocks_t *b, char *ranked, int in) {
    const gvq_hier_t *h = ctx->hier;
    int H = h->nhosts, K = h->per_host;
    gvqResult_t res = gvqSuccess;
    for (int g = 0; g < H && res == gvqSuccess; g++)
        for (int k = 0; k < K && res == gvqSuccess; k++) {
            char *r = ranked + (size_t)h->order[g * K + k] * b->bytes, *x = block_at(b, h, g, k);
            res = in ? ctx->dev->copy(x, r, b->bytes) : ctx->dev->copy(r, x, b->bytes);
        }
    return res;
}

gvqResult_t gvq_hier_reduce_scatter(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                                    gvqDataType_t dtype, gvqRedOp_t op) {
    const gvq_hier_t *h = ctx->hier;
    if (h == NULL || h->order == NULL) return gvqInternalError;
    if (count == 0) return gvqSuccess;
    int H = h->nhosts, K = h->per_host;
    hier_blocks_t b;
    GVQCHECK(blocks_init(h, count, gvq_dtype_size(dtype), &b));
    gvqResult_t res = blocks_move(ctx, &b, (char *)(uintptr_t)src, 1); /* only read */
    const int *lm;
    gvq_coll_ctx_t lctx = gvq_hier_local_ctx(ctx, &lm);
    gvq_subring_t local = {lm, K, b.off}, cross = {h->cross, H, b.off + K + 1};
    if (res == gvqSuccess) res = gvq_subring_reduce_scatter(&lctx, &local, b.buf, b.buf, dtype, op);
    if (res == gvqSuccess) res = gvq_subring_reduce_scatter(ctx, &cross, b.buf, b.buf, dtype, op);
    if (res == gvqSuccess)
        res = ctx->dev->copy(dst, block_at(&b, h, h->host_index, h->local_index), b.bytes);
    if (res == gvqSuccess && op == gvqAvg) res = ctx->dev->divide(dst, count, dtype, H * K);
    return res;
}

gvqResult_t gvq_hier_allgather(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                               gvqDataType_t dtype) {
    const gvq_hier_t *h = ctx->hier;
    if (h == NULL || h->order == NULL) return gvqInternalError;
    if (count == 0) return gvqSuccess;
    int H = h->nhosts, K = h->per_host;
    hier_blocks_t b;
    GVQCHECK(blocks_init(h, count, gvq_dtype_size(dtype), &b));
    const int *lm;
    gvq_coll_ctx_t lctx = gvq_hier_local_ctx(ctx, &lm);
    gvq_subring_t local = {lm, K, b.off}, cross = {h->cross, H, b.off + K + 1};
    gvqResult_t res = ctx->dev->copy(block_at(&b, h, h->host_index, h->local_index), src, b.bytes);
    if (res == gvqSuccess) res = gvq_subring_allgather(ctx, &cross, b.buf, dtype);
    if (res == gvqSuccess) res = gvq_subring_allgather(&lctx, &local, b.buf, dtype);
    if (res == gvqSuccess) res = blocks_move(ctx, &b, dst, 0);
    return res;
}
