/*
 * ring.c -- the pipelined ring behind allreduce, reduce-scatter and allgather, carrying data
 * through a codec (docs/ALGORITHMS.md section 1).
 *
 * The vector is cut into N segments (boundaries on the codec's granule); each segment into
 * chunks of about chunk_bytes. With n the rank, step k sends segment (n - k + shift) mod N to
 * the right neighbour and receives segment (n - k - 1 + shift) mod N from the left one.
 * Steps 0 .. N-2 reduce-scatter, steps N-1 .. 2N-3 allgather (one formula for both):
 *
 *     4 ranks, shift -1, reduce-scatter             allgather
 *     step 0: 0->1 s3  1->2 s0  2->3 s1  3->0 s2    step 3: 0->1 s0  1->2 s1 ...
 *     step 1: 0->1 s2  1->2 s3  2->3 s0  3->0 s1    step 4: 0->1 s3  ...
 *     step 2: 0->1 s1  ...  after it rank n owns s_n step 5: 0->1 s2  ...
 *
 * Pipelining: receives of step k+1 are posted before step k is processed; chunk c of step k+1
 * is sent the moment chunk c of step k is reduced (reduce-scatter) or has arrived (allgather),
 * so the transfer of one chunk overlaps the reduction of the previous one and steps overlap
 * each other. In the allgather a non-identity codec decodes a chunk after forwarding it, so
 * decoding hides behind the transfer (GradiVeQ's Algorithm 1).
 *
 * Where step k's result for (segment s, chunk c) lives:
 *   OUT_DST       the output buffer in the tensor's layout (allreduce, identity codec)
 *   OUT_PINGPONG  two scratch segments alternating by step; the block of the last step is the
 *                 output (reduce-scatter, whose output holds one block only), or stays in
 *                 scratch when there is no output (gvq_ring_reduce_scatter_keep)
 *   OUT_WIRE      one wire slot per (segment, chunk) in scratch (codecs whose wire is not the
 *                 values); decoded into the output when final
 * Reduce-scatter receives land in two alternating scratch areas (tmp) and are combined with the
 * local values; allgather receives land where the step's result lives.
 *
 * FIFO transports (t->fifo, NCCL on one stream) run transfers strictly in issue order, so a
 * receive pre-posted for step k+1 would hold the queue until the left neighbour sends step k+1,
 * which it can only do after its own queue moved past its step k+1 receive: a cycle around the
 * ring. There the ring posts no receive ahead: receive (k, c) is posted with send (k, c), and a
 * step's receives beyond its sends' chunk count right after that step's last send. By induction
 * on (step, chunk) every rank issues in the same order and nothing waits on a later transfer.
 * (With 2 ranks an allgather receive lands in the wire slot of a send of the step before, which
 * the queue has finished by then.)
 *
 * A codec with a begin hook (integer-summed wires: the ranks agree on shared scales) gets the
 * whole local input once, before anything moves.
 *
 * A tally (gvq_tally_t, OUT_WIRE only) adds 4 bytes behind the last chunk of every allgather
 * message: the value of the segment's owner, written when it finishes the segment (by then all
 * of its local encodes are done), forwarded unchanged with the chunk, added up by everyone.
 */
#include <stdlib.h>

#include "gvq_algo.h"

typedef enum { OUT_DST, OUT_PINGPONG, OUT_WIRE } out_mode_t;

typedef struct {
    gvq_coll_ctx_t *ctx;
    gvq_transport_t *t;
    const gvq_codec_t *codec;
    int n, r, shift, nrs, nsteps;
    size_t esize;
    size_t *seg_off; /* n+1 entries, elements */
    size_t ce;       /* chunk elements */
    size_t maxchunks;
    size_t wire_cap; /* bytes of one chunk slot in tmp and wire */
    const char *src; /* local contribution in the tensor's layout (reduce-scatter), or NULL */
    char *dst;       /* output: tensor layout (allreduce, allgather) or one block (RS) */
    out_mode_t mode;
    char *also; /* OUT_PINGPONG without dst: the finished segment is copied here too (tensor
                 * layout) as each chunk is done, while it is in cache */
    char *wire, *tmp[2], *pp[2];
    gvq_req_t *rreq[2], *sreq[2];
    int posted[2];      /* step whose receives sit in rreq[parity], -1 none */
    gvq_tally_t *tally; /* rides along when not NULL */
    const int *order;   /* rank at each ring position (allreduce with ctx->ring_order), or NULL */
    size_t blk; /* reduce-scatter and allgather in ring order: segment s is the block of rank
                 * order[s], [order[s] blk, (order[s] + 1) blk) (0: seg_off) */
} ring_t;

static int ring_mod(int a, int n) {
    return ((a % n) + n) % n;
}
/* The rank at ring position p (r and the segments are positions; rank order without `order`). */
static int ring_peer(const ring_t *g, int p) {
    p = ring_mod(p, g->n);
    return g->order != NULL ? g->order[p] : p;
}

int gvq_ring_order_hosts(const uint64_t *host_keys, int n, int *order) {
    int k = 0, moved = 0;
    for (int first = 0; first < n; first++) {
        int seen = 0; /* a host is taken at its lowest rank */
        for (int q = 0; q < first && !seen; q++)
            seen = host_keys[q] == host_keys[first];
        if (seen) continue;
        for (int p = first; p < n; p++)
            if (host_keys[p] == host_keys[first]) {
                moved |= p != k;
                order[k++] = p;
            }
    }
    return moved;
}

static int seg_sent(const ring_t *g, int k) {
    return ring_mod(g->r - k + g->shift, g->n);
}
static int seg_recv(const ring_t *g, int k) {
    return ring_mod(g->r - k - 1 + g->shift, g->n);
}
static size_t seg_len(const ring_t *g, int s) {
    return g->blk ? g->blk : g->seg_off[s + 1] - g->seg_off[s];
}
static size_t seg_chunks(const ring_t *g, int s) {
    return GVQ_DIV_UP(seg_len(g, s), g->ce);
}
static size_t chunk_len(const ring_t *g, int s, size_t c) {
    return GVQ_MIN(g->ce, seg_len(g, s) - c * g->ce);
}
/* Element offset of chunk c of segment s in the tensor. */
static size_t chunk_off(const ring_t *g, int s, size_t c) {
    return (g->blk ? (size_t)g->order[s] * g->blk : g->seg_off[s]) + c * g->ce;
}

static size_t chunk_wire_bytes(const ring_t *g, int s, size_t c) {
    size_t len = chunk_len(g, s, c);
    if (g->codec->wire_is_values) return len * g->esize;
    return g->codec->wire_bytes(g->codec, chunk_off(g, s, c), len);
}

/* Bytes of the message carrying chunk c of segment s at step k: the wire, and the tally behind
 * the last chunk of an allgather step. */
static size_t msg_bytes(const ring_t *g, int k, int s, size_t c) {
    size_t b = chunk_wire_bytes(g, s, c);
    if (g->tally != NULL && k >= g->nrs && c + 1 == seg_chunks(g, s)) b += sizeof(int32_t);
    return b;
}

/* Where step k's result for chunk c of segment s lives (see the header). */
static char *result_ptr(const ring_t *g, int k, int s, size_t c) {
    switch (g->mode) {
    case OUT_DST:
        return g->dst + chunk_off(g, s, c) * g->esize;
    case OUT_PINGPONG:
        return (k == g->nrs - 1 && g->dst != NULL ? g->dst : g->pp[k & 1]) + c * g->ce * g->esize;
    case OUT_WIRE:
    default:
        return g->wire + ((size_t)s * g->maxchunks + c) * g->wire_cap;
    }
}

/* Where step k receives chunk c. */
static char *recv_ptr(const ring_t *g, int k, int s, size_t c) {
    if (k < g->nrs) return g->tmp[k & 1] + c * g->wire_cap;
    return result_ptr(g, k, s, c);
}

/* Post the receives of step k for chunks [c0, c1) (clipped to the step's chunk count). */
static gvqResult_t post_recv_range(ring_t *g, int k, size_t c0, size_t c1) {
    int s = seg_recv(g, k), left = ring_peer(g, g->r - 1);
    size_t nc = GVQ_MIN(c1, seg_chunks(g, s));
    for (size_t c = c0; c < nc; c++)
        GVQCHECK(g->t->ops->irecv(g->t, left, GVQ_TAG_COLL, recv_ptr(g, k, s, c),
                                  msg_bytes(g, k, s, c), &g->rreq[k & 1][c]));
    return gvqSuccess;
}

static gvqResult_t post_recvs(ring_t *g, int k) {
    GVQCHECK(post_recv_range(g, k, 0, SIZE_MAX));
    g->posted[k & 1] = k;
    return gvqSuccess;
}

/* FIFO transports: step k's receives that no send of step k carries along (posted after its
 * last send). */
static gvqResult_t post_recv_rest(ring_t *g, int k) {
    if (!g->t->fifo || k >= g->nsteps) return gvqSuccess;
    return post_recv_range(g, k, seg_chunks(g, seg_sent(g, k)), SIZE_MAX);
}

static gvqResult_t send_chunk(ring_t *g, int k, size_t c, const void *buf) {
    int s = seg_sent(g, k), right = ring_peer(g, g->r + 1);
    size_t bytes = msg_bytes(g, k, s, c);
    if (g->t->fifo) GVQCHECK(post_recv_range(g, k, c, c + 1)); /* receive (k, c) goes with it */
    if (g->ctx->bytes_sent != NULL) *g->ctx->bytes_sent += bytes;
    return g->t->ops->isend(g->t, right, GVQ_TAG_COLL, buf, bytes, &g->sreq[k & 1][c]);
}

/* Step 0 sends the local contribution (or, allgather only, the rank's own block). */
static gvqResult_t send_first(ring_t *g) {
    int s = seg_sent(g, 0);
    size_t nc = seg_chunks(g, s);
    for (size_t c = 0; c < nc; c++) {
        const char *buf;
        if (g->nrs == 0) {
            buf = g->dst + chunk_off(g, s, c) * g->esize;
        } else if (g->codec->wire_is_values) {
            buf = g->src + chunk_off(g, s, c) * g->esize;
        } else {
            char *w = result_ptr(g, -1, s, c);
            GVQCHECK(g->codec->encode_combine(g->codec, chunk_off(g, s, c), chunk_len(g, s, c),
                                              g->src + chunk_off(g, s, c) * g->esize, NULL, w));
            buf = w;
        }
        GVQCHECK(send_chunk(g, 0, c, buf));
    }
    return post_recv_rest(g, 0);
}

/* Chunk c of step k has arrived: combine or decode it, and send it on as step k+1. */
static gvqResult_t process_chunk(ring_t *g, int k, size_t c) {
    int s = seg_recv(g, k);
    size_t off = chunk_off(g, s, c), len = chunk_len(g, s, c);
    char *res = result_ptr(g, k, s, c);
    int forward = k + 1 < g->nsteps;
    int last = c + 1 == seg_chunks(g, s);
    if (k < g->nrs) {
        GVQCHECK(g->codec->encode_combine(g->codec, off, len, g->src + off * g->esize,
                                          recv_ptr(g, k, s, c), res));
        if (g->tally != NULL && k == g->nrs - 1 && last) { /* every local encode is done */
            int32_t v = g->tally->value(g->tally->arg);
            g->tally->sum = v; /* the wire may be device memory (NCCL transport) */
            GVQCHECK(g->ctx->dev->copy_from_host(res + chunk_wire_bytes(g, s, c), &v, sizeof v));
        }
        if (forward) GVQCHECK(send_chunk(g, k + 1, c, res));
        if (k == g->nrs - 1 && g->mode == OUT_WIRE) /* this rank's finished segment */
            GVQCHECK(g->codec->decode(g->codec, off, len, res, g->dst + off * g->esize));
        if (k == g->nrs - 1 && g->also != NULL)
            GVQCHECK(g->ctx->dev->copy(g->also + off * g->esize, res, len * g->esize));
    } else {
        if (forward) GVQCHECK(send_chunk(g, k + 1, c, res));
        if (g->tally != NULL && last) {
            int32_t v;
            GVQCHECK(g->ctx->dev->copy_to_host(&v, res + chunk_wire_bytes(g, s, c), sizeof v));
            g->tally->sum += v;
        }
        if (g->mode == OUT_WIRE)
            GVQCHECK(g->codec->decode(g->codec, off, len, res, g->dst + off * g->esize));
    }
    return gvqSuccess;
}

static gvqResult_t ring_steps(ring_t *g) {
    int fifo = g->t->fifo;
    if (!fifo) GVQCHECK(post_recvs(g, 0));
    GVQCHECK(send_first(g));
    for (int k = 0; k < g->nsteps; k++) {
        if (!fifo && g->posted[k & 1] != k) GVQCHECK(post_recvs(g, k));
        /* Pre-post step k+1. With 2 ranks an allgather receive would land on the segment whose
         * send is still in flight, so those wait for their own step. */
        if (!fifo && k + 1 < g->nsteps && (g->n > 2 || k + 1 < g->nrs))
            GVQCHECK(post_recvs(g, k + 1));
        int s = seg_recv(g, k);
        size_t nc = seg_chunks(g, s);
        for (size_t c = 0; c < nc; c++) {
            GVQCHECK(gvq_xport_wait(g->t, &g->rreq[k & 1][c], "ring receive"));
            GVQCHECK(process_chunk(g, k, c));
        }
        if (fifo) GVQCHECK(post_recv_rest(g, k + 1)); /* step k+1's sends are all posted */
        GVQCHECK(gvq_xport_waitall(g->t, g->sreq[k & 1], (int)seg_chunks(g, seg_sent(g, k)),
                                   "ring send"));
    }
    return gvqSuccess;
}

/* Cut count elements into n segments on granule boundaries. */
void gvq_ring_partition(size_t *seg_off, int n, size_t count, size_t granule) {
    size_t units = GVQ_DIV_UP(count, granule), base = units / (size_t)n, rem = units % (size_t)n;
    size_t u = 0;
    for (int s = 0; s <= n; s++) {
        seg_off[s] = GVQ_MIN(count, u * granule);
        if (s < n) u += base + ((size_t)s < rem);
    }
}

/* A ring over some of the transport's ranks (gvq_subring_t), or all of them (sub NULL). */
static gvqResult_t ring_run(gvq_coll_ctx_t *ctx, const gvq_codec_t *codec, const void *src,
                            void *dst, size_t count, int nrs, int nag, int shift, out_mode_t mode,
                            const size_t *given_off, gvq_tally_t *tally, char **kept, char *also,
                            const gvq_subring_t *sub, size_t blk) {
    ring_t g;
    memset(&g, 0, sizeof g);
    gvqResult_t res = gvqSuccess;
    g.ctx = ctx;
    g.t = ctx->xport;
    g.codec = codec;
    g.n = sub != NULL ? sub->n : g.t->nranks;
    g.r = g.t->rank;
    const int *order = sub != NULL ? sub->members : NULL;
    if (sub == NULL && ctx->ring_order != NULL && ((nrs == g.n - 1 && nag == g.n - 1) || blk))
        /* an allreduce: its segments are a partition of the vector, so the ring may take any
         * order; reduce-scatter and allgather (blk): segment s is then the block of the rank at
         * position s, so each rank still ends with (or starts from) its own block */
        order = ctx->ring_order;
    if (order != NULL && sub == NULL && blk) g.blk = blk;
    if (order != NULL) {
        g.order = order;
        g.r = -1;
        for (int p = 0; p < g.n; p++)
            if (order[p] == g.t->rank) g.r = p;
        if (g.r < 0) return gvqInternalError; /* not a member */
    }
    g.shift = shift;
    g.nrs = nrs;
    g.nsteps = nrs + nag;
    g.esize = gvq_dtype_size(codec->dtype);
    g.src = src;
    g.dst = dst;
    g.mode = mode;
    g.also = also;
    g.posted[0] = g.posted[1] = -1;
    g.seg_off = malloc(sizeof(size_t) * (size_t)(g.n + 1));
    if (g.seg_off == NULL) return gvqSystemError;
    if (sub != NULL)
        memcpy(g.seg_off, sub->seg_off, sizeof(size_t) * (size_t)(g.n + 1));
    else if (given_off != NULL)
        memcpy(g.seg_off, given_off, sizeof(size_t) * (size_t)(g.n + 1));
    else
        gvq_ring_partition(g.seg_off, g.n, count, codec->granule);

    size_t gran = codec->granule;
    g.ce = GVQ_MAX(gran, (ctx->chunk_bytes / g.esize) / gran * gran);
    for (int s = 0; s < g.n; s++)
        g.maxchunks = GVQ_MAX(g.maxchunks, seg_chunks(&g, s));
    if (tally != NULL) { /* it rides only if every segment has a last chunk to ride on */
        int ok = mode == OUT_WIRE && nrs > 0 && nag > 0;
        for (int s = 0; s < g.n; s++)
            ok &= seg_chunks(&g, s) > 0;
        tally->carried = ok;
        if (ok) g.tally = tally;
    }
    for (int s = 0; s < g.n; s++)
        for (size_t c = 0; c < seg_chunks(&g, s); c++)
            g.wire_cap = GVQ_MAX(g.wire_cap, chunk_wire_bytes(&g, s, c) +
                                                 (g.tally != NULL ? sizeof(int32_t) : 0));
    g.wire_cap = GVQ_DIV_UP(g.wire_cap, 64) * 64; /* keep slots aligned */

    size_t slot_bytes = g.maxchunks * g.wire_cap;
    size_t pp_bytes = g.maxchunks * g.ce * g.esize;
    size_t scratch = 2 * slot_bytes + (mode == OUT_PINGPONG ? 2 * pp_bytes : 0) +
                     (mode == OUT_WIRE ? (size_t)g.n * slot_bytes : 0);
    size_t nreq = 4 * GVQ_MAX(g.maxchunks, 1);
    g.rreq[0] = calloc(nreq, sizeof(gvq_req_t));
    if (g.rreq[0] == NULL) {
        res = gvqSystemError;
        goto err_free_off;
    }
    g.rreq[1] = g.rreq[0] + g.maxchunks;
    g.sreq[0] = g.rreq[1] + g.maxchunks;
    g.sreq[1] = g.sreq[0] + g.maxchunks;
    char *sc = NULL;
    GVQCHECKGOTO(gvq_coll_scratch(ctx, scratch, (void **)&sc), res, err_free_req);
    g.tmp[0] = sc;
    g.tmp[1] = sc + slot_bytes;
    sc += 2 * slot_bytes;
    if (mode == OUT_PINGPONG) {
        g.pp[0] = sc;
        g.pp[1] = sc + pp_bytes;
        sc += 2 * pp_bytes;
    }
    if (mode == OUT_WIRE) g.wire = sc;

    res = ring_steps(&g);
    if (kept != NULL) *kept = g.pp[(nrs - 1) & 1];
    if (res != gvqSuccess) gvq_xport_cancelall(g.t, g.rreq[0], (int)nreq);
err_free_req:
    free(g.rreq[0]);
err_free_off:
    free(g.seg_off);
    return res;
}

gvqResult_t gvq_ring_allreduce(gvq_coll_ctx_t *ctx, const gvq_codec_t *codec, const void *src,
                               void *dst, size_t count, gvqRedOp_t op) {
    return gvq_ring_allreduce_tally(ctx, codec, src, dst, count, op, NULL);
}

gvqResult_t gvq_ring_allreduce_tally(gvq_coll_ctx_t *ctx, const gvq_codec_t *codec, const void *src,
                                     void *dst, size_t count, gvqRedOp_t op, gvq_tally_t *tally) {
    const gvq_device_ops_t *dev = ctx->dev;
    size_t esize = gvq_dtype_size(codec->dtype);
    int n = ctx->xport->nranks;
    if (tally != NULL) tally->carried = 0;
    if (codec->begin != NULL && count > 0) GVQCHECK(codec->begin(codec, ctx, src, count));
    if (count == 0) {
        if (tally != NULL) tally->sum = tally->value(tally->arg);
        return gvqSuccess;
    }
    if (n == 1) {
        if (codec->wire_is_values) {
            GVQCHECK(dev->copy(dst, src, count * esize));
        } else { /* one rank still goes through the codec, so results match what N ranks get */
            void *w = NULL;
            GVQCHECK(gvq_coll_scratch(ctx, codec->wire_bytes(codec, 0, count), &w));
            GVQCHECK(codec->encode_combine(codec, 0, count, src, NULL, w));
            GVQCHECK(codec->decode(codec, 0, count, w, dst));
        }
        if (tally != NULL) { /* the sum of one value */
            tally->sum = tally->value(tally->arg);
            tally->carried = 1;
        }
    } else {
        GVQCHECK(ring_run(ctx, codec, src, dst, count, n - 1, n - 1, -1,
                          codec->wire_is_values ? OUT_DST : OUT_WIRE, NULL, tally, NULL, NULL, NULL,
                          0));
        if (tally != NULL && !tally->carried) tally->sum = tally->value(tally->arg);
    }
    if (op == gvqAvg) GVQCHECK(dev->divide(dst, count, codec->dtype, n));
    return gvqSuccess;
}

gvqResult_t gvq_ring_allreduce_given(gvq_coll_ctx_t *ctx, const gvq_codec_t *codec, const void *src,
                                     void *dst, size_t count, const size_t *seg_off) {
    if (ctx->xport->nranks == 1 || count == 0)
        return gvq_ring_allreduce_tally(ctx, codec, src, dst, count, gvqSum, NULL);
    if (codec->begin != NULL) GVQCHECK(codec->begin(codec, ctx, src, count));
    return ring_run(ctx, codec, src, dst, count, ctx->xport->nranks - 1, ctx->xport->nranks - 1, -1,
                    codec->wire_is_values ? OUT_DST : OUT_WIRE, seg_off, NULL, NULL, NULL, NULL, 0);
}

/* Segment boundaries that are the users' blocks: block s = [s*block, (s+1)*block). */
static size_t *block_offsets(int n, size_t block) {
    size_t *off = malloc(sizeof(size_t) * (size_t)(n + 1));
    if (off != NULL)
        for (int s = 0; s <= n; s++)
            off[s] = (size_t)s * block;
    return off;
}

gvqResult_t gvq_ring_reduce_scatter(gvq_coll_ctx_t *ctx, const void *src, void *dst,
                                    size_t recvcount, gvqDataType_t dtype, gvqRedOp_t op) {
    int n = ctx->xport->nranks;
    size_t esize = gvq_dtype_size(dtype);
    if (recvcount == 0) return gvqSuccess;
    gvq_codec_t codec;
    gvq_codec_identity_init(&codec, ctx->dev, dtype, op);
    if (n == 1) {
        GVQCHECK(ctx->dev->copy(dst, src, recvcount * esize));
    } else {
        size_t *off = block_offsets(n, recvcount);
        if (off == NULL) return gvqSystemError;
        /* shift -1: after n-1 steps position p owns segment p, its rank's own block (the ring
         * in host order when the communicator has one: ctx->ring_order) */
        gvqResult_t res = ring_run(ctx, &codec, src, dst, (size_t)n * recvcount, n - 1, 0, -1,
                                   OUT_PINGPONG, off, NULL, NULL, NULL, NULL, recvcount);
        free(off);
        GVQCHECK(res);
    }
    if (op == gvqAvg) GVQCHECK(ctx->dev->divide(dst, recvcount, dtype, n));
    return gvqSuccess;
}

gvqResult_t gvq_ring_allgather(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                               gvqDataType_t dtype) {
    int n = ctx->xport->nranks, r = ctx->xport->rank;
    size_t esize = gvq_dtype_size(dtype);
    if (count == 0) return gvqSuccess;
    GVQCHECK(ctx->dev->copy((char *)dst + (size_t)r * count * esize, src, count * esize));
    if (n == 1) return gvqSuccess;
    gvq_codec_t codec;
    gvq_codec_identity_init(&codec, ctx->dev, dtype, gvqSum);
    size_t *off = block_offsets(n, count);
    if (off == NULL) return gvqSystemError;
    gvqResult_t res = ring_run(ctx, &codec, NULL, dst, (size_t)n * count, 0, n - 1, 0, OUT_DST, off,
                               NULL, NULL, NULL, NULL, count); /* in host order, as above */
    free(off);
    return res;
}

gvqResult_t gvq_ring_reduce_scatter_keep(gvq_coll_ctx_t *ctx, const void *src, void *dst,
                                         size_t count, gvqDataType_t dtype, gvqRedOp_t op,
                                         const size_t *seg_off, char **own) {
    gvq_codec_t codec;
    gvq_codec_identity_init(&codec, ctx->dev, dtype, op);
    int n = ctx->xport->nranks;
    *own = NULL;
    /* shift -1: after n-1 steps rank r owns segment r */
    return ring_run(ctx, &codec, src, NULL, count, n - 1, 0, -1, OUT_PINGPONG, seg_off, NULL, own,
                    dst, NULL, 0);
}

/* ---- rings over some of the ranks (the hierarchical allreduce's stages) ---------------------- */

gvqResult_t gvq_subring_reduce_scatter(gvq_coll_ctx_t *ctx, const gvq_subring_t *sub,
                                       const void *src, void *dst, gvqDataType_t dtype,
                                       gvqRedOp_t op) {
    gvq_codec_t codec;
    gvq_codec_identity_init(&codec, ctx->dev, dtype, op);
    size_t end = sub->seg_off[sub->n];
    if (sub->n == 1 || end == sub->seg_off[0]) {
        size_t es = gvq_dtype_size(dtype), off = sub->seg_off[0];
        if (src == dst || end == off) return gvqSuccess;
        return ctx->dev->copy((char *)dst + off * es, (const char *)src + off * es,
                              (end - off) * es);
    }
    char *own = NULL; /* shift -1: after n-1 steps position p owns segment p, copied into dst */
    return ring_run(ctx, &codec, src, NULL, end, sub->n - 1, 0, -1, OUT_PINGPONG, NULL, NULL, &own,
                    dst, sub, 0);
}

gvqResult_t gvq_subring_allreduce(gvq_coll_ctx_t *ctx, const gvq_subring_t *sub,
                                  const gvq_codec_t *codec, const void *src, void *dst) {
    size_t end = sub->seg_off[sub->n];
    if (end == sub->seg_off[0]) return gvqSuccess;
    if (sub->n == 1 && codec->wire_is_values) {
        size_t es = gvq_dtype_size(codec->dtype), off = sub->seg_off[0];
        if (src == dst) return gvqSuccess;
        return ctx->dev->copy((char *)dst + off * es, (const char *)src + off * es,
                              (end - off) * es);
    }
    if (sub->n == 1) { /* one rank still goes through the codec, as gvq_ring_allreduce's */
        size_t off = sub->seg_off[0], len = end - off, es = gvq_dtype_size(codec->dtype);
        void *w = NULL;
        GVQCHECK(gvq_coll_scratch(ctx, codec->wire_bytes(codec, off, len), &w));
        GVQCHECK(codec->encode_combine(codec, off, len, (const char *)src + off * es, NULL, w));
        return codec->decode(codec, off, len, w, (char *)dst + off * es);
    }
    return ring_run(ctx, codec, src, dst, end, sub->n - 1, sub->n - 1, -1,
                    codec->wire_is_values ? OUT_DST : OUT_WIRE, NULL, NULL, NULL, NULL, sub, 0);
}

gvqResult_t gvq_subring_allgather(gvq_coll_ctx_t *ctx, const gvq_subring_t *sub, void *dst,
                                  gvqDataType_t dtype) {
    if (sub->n == 1 || sub->seg_off[sub->n] == sub->seg_off[0]) return gvqSuccess;
    gvq_codec_t codec;
    gvq_codec_identity_init(&codec, ctx->dev, dtype, gvqSum);
    return ring_run(ctx, &codec, NULL, dst, sub->seg_off[sub->n], 0, sub->n - 1, 0, OUT_DST, NULL,
                    NULL, NULL, NULL, sub, 0);
}
