/*
 * recursive.c -- the latency-bound algorithms for small and medium sizes: recursive doubling and
 * Rabenseifner's recursive halving/doubling (allreduce, reduce-scatter), and Bruck's allgather.
 *
 * Fold (N not a power of two): p = the largest power of two <= N, rem = N - p. The first 2 rem
 * ranks pair up: even rank 2i hands its vector to 2i+1, which combines the two (2i's values
 * first) and stands for both as virtual rank i; rank r >= 2 rem is virtual rank r - rem. The p
 * virtual ranks run the power-of-two algorithm; at the end 2i+1 hands the result back to 2i.
 *
 *     N = 6 (p 4, rem 2):   rank   0  1  2  3  4  5       0 -> 1 and 2 -> 3 before,
 *                           virt   -  0  -  1  2  3       1 -> 0 and 3 -> 2 after
 *
 * Each virtual rank stands for a contiguous run of ranks, in rank order.
 *
 * Recursive doubling allreduce (log2 p rounds of the whole vector):
 *
 *     mask 1:  v0 <-> v1   v2 <-> v3     then v0, v1 hold {0 1}, v2, v3 hold {2 3}
 *     mask 2:  v0 <-> v2   v1 <-> v3     then every rank holds {0 1 2 3} = (v0 v1)(v2 v3)
 *
 * Bitwise identical results: the partners of a round hold bitwise identical values for their
 * groups (by induction), and both compute (lower group) op (higher group) in that operand order,
 * so both perform exactly the same operations: every rank evaluates one shared binary tree. The
 * fold's combine puts the even (lower) rank first likewise.
 *
 * Rabenseifner allreduce (medium sizes): the vector is cut into p blocks. Recursive halving
 * reduce-scatters them: round mask p/2 .. 1 keeps the half of the window holding block v, sends
 * the other half to v ^ mask and combines what comes back (lower rank's values first), so v
 * ends with block v reduced over all ranks; recursive doubling then allgathers the blocks
 * (mask 1 .. p/2, the windows double). 2 log2 p rounds, about 2 (p-1)/p of the vector sent per
 * rank. Each element is reduced by one rank only and then copied: identical everywhere.
 *
 * Rabenseifner reduce-scatter: the halving alone, with virtual block i made of the users' blocks
 * of the ranks i stands for (2i and 2i+1, or i + rem), so that after it 2i+1 hands 2i its block.
 *
 * Bruck allgather (any N, ceil(log2 N) rounds): tmp[i] holds the block of rank (r+i) mod N;
 * round d = 1, 2, 4, .. sends tmp[0, min(d, N-d)) to rank r-d and receives tmp[d, ..) from r+d;
 * at the end tmp is rotated into place.
 *
 * Messages of 0 bytes are not sent (both sides know the size). Every round waits for its send
 * and receive before the next one, so no pair ever has two messages in flight. These need
 * receives posted ahead of sends: the selection keeps the ring on FIFO transports.
 */
#include <stdlib.h>
#include <string.h>

#include "gvq_algo.h"

typedef struct {
    gvq_transport_t *t;
    const gvq_device_ops_t *dev;
    int n, r, p, rem;
    int v;          /* virtual rank; -1 for the even rank of a fold pair */
    const int *map; /* the transport's rank at each position (gvq_rd_allreduce_members), or NULL */
    size_t esize;
    gvqDataType_t dtype;
    gvqRedOp_t op; /* elementwise (gvqAvg reduces as gvqSum; the divide comes last) */
} rec_t;

static void rec_init(rec_t *g, const gvq_coll_ctx_t *ctx, gvqDataType_t dtype, gvqRedOp_t op) {
    g->t = ctx->xport;
    g->dev = ctx->dev;
    g->n = g->t->nranks;
    g->r = g->t->rank;
    for (g->p = 1; g->p * 2 <= g->n; g->p *= 2)
        ;
    g->rem = g->n - g->p;
    if (g->r < 2 * g->rem)
        g->v = (g->r & 1) ? g->r / 2 : -1;
    else
        g->v = g->r - g->rem;
    g->esize = gvq_dtype_size(dtype);
    g->dtype = dtype;
    g->op = op == gvqAvg ? gvqSum : op;
    g->map = NULL;
}

/* The rank that virtual rank v runs on. */
static int real_rank(const rec_t *g, int v) {
    return v < g->rem ? 2 * v + 1 : v + g->rem;
}

/* The first of the ranks virtual rank v stands for. */
static int first_rank(const rec_t *g, int v) {
    return v < g->rem ? 2 * v : v + g->rem;
}

/* The transport's rank at position x (-1 stays -1: no peer). */
static int tr(const rec_t *g, int x) {
    return x < 0 || g->map == NULL ? x : g->map[x];
}

/* Send sbytes of sbuf to `to` and receive rbytes into rbuf from `from` (either may be 0). */
static gvqResult_t sendrecv(gvq_transport_t *t, int to, const void *sbuf, size_t sbytes, int from,
                            void *rbuf, size_t rbytes, const char *what) {
    gvq_req_t req[2];
    memset(req, 0, sizeof req);
    gvqResult_t res = gvqSuccess;
    if (rbytes > 0) res = t->ops->irecv(t, from, GVQ_TAG_COLL, rbuf, rbytes, &req[0]);
    if (res == gvqSuccess && sbytes > 0)
        res = t->ops->isend(t, to, GVQ_TAG_COLL, sbuf, sbytes, &req[1]);
    if (res == gvqSuccess) res = gvq_xport_waitall(t, req, 2, what);
    if (res != gvqSuccess) gvq_xport_cancelall(t, req, 2);
    return res;
}

/* mine = (lower rank's values) op (higher rank's values): the operand order every rank shares. */
static gvqResult_t combine(const rec_t *g, void *mine, const void *in, size_t count,
                           int in_is_lower) {
    if (count == 0) return gvqSuccess;
    if (in_is_lower) return g->dev->reduce(mine, in, mine, count, g->dtype, g->op);
    return g->dev->reduce(mine, mine, in, count, g->dtype, g->op);
}

/* Before the virtual ranks run: the even rank of a pair hands buf to the odd one, which
 * combines it into its own (tmp: count elements of room). */
static gvqResult_t fold_in(const rec_t *g, void *buf, void *tmp, size_t count) {
    size_t bytes = count * g->esize;
    if (g->r >= 2 * g->rem) return gvqSuccess;
    if (g->v < 0) return sendrecv(g->t, tr(g, g->r + 1), buf, bytes, -1, NULL, 0, "fold send");
    GVQCHECK(sendrecv(g->t, -1, NULL, 0, tr(g, g->r - 1), tmp, bytes, "fold receive"));
    return combine(g, buf, tmp, count, 1);
}

/* After: the odd rank of a pair hands the result back. */
static gvqResult_t fold_out(const rec_t *g, void *buf, size_t bytes) {
    if (g->r >= 2 * g->rem) return gvqSuccess;
    if (g->v < 0)
        return sendrecv(g->t, -1, NULL, 0, tr(g, g->r + 1), buf, bytes, "fold result receive");
    return sendrecv(g->t, tr(g, g->r - 1), buf, bytes, -1, NULL, 0, "fold result send");
}

/* Cut count elements into p blocks: off[0..p]. */
static void even_blocks(size_t *off, int p, size_t count) {
    size_t base = count / (size_t)p, extra = count % (size_t)p;
    off[0] = 0;
    for (int b = 0; b < p; b++)
        off[b + 1] = off[b] + base + ((size_t)b < extra);
}

/* Recursive halving: afterwards block v of buf (blocks off[0..p]) holds the reduction over all
 * ranks. tmp holds half of the vector at least. */
static gvqResult_t halving(const rec_t *g, char *buf, char *tmp, const size_t *off) {
    size_t es = g->esize;
    int lo = 0, hi = g->p;
    for (int mask = g->p / 2; mask >= 1; mask >>= 1) {
        int mid = lo + mask, pv = g->v ^ mask, upper = (g->v & mask) != 0;
        int klo = upper ? mid : lo, khi = upper ? hi : mid; /* the half kept */
        int slo = upper ? lo : mid, shi = upper ? mid : hi; /* the half sent */
        size_t kn = off[khi] - off[klo], sn = off[shi] - off[slo];
        int peer = real_rank(g, pv);
        GVQCHECK(sendrecv(g->t, peer, buf + off[slo] * es, sn * es, peer, tmp, kn * es,
                          "recursive halving"));
        GVQCHECK(combine(g, buf + off[klo] * es, tmp, kn, pv < g->v));
        lo = klo;
        hi = khi;
    }
    return gvqSuccess;
}

/* Recursive doubling allgather: before it v holds block v of buf, afterwards every block. */
static gvqResult_t doubling(const rec_t *g, char *buf, const size_t *off) {
    size_t es = g->esize;
    for (int mask = 1; mask < g->p; mask <<= 1) {
        int pv = g->v ^ mask, peer = real_rank(g, pv);
        int mine = g->v & ~(mask - 1), theirs = pv & ~(mask - 1); /* the groups' first blocks */
        GVQCHECK(sendrecv(g->t, peer, buf + off[mine] * es, (off[mine + mask] - off[mine]) * es,
                          peer, buf + off[theirs] * es, (off[theirs + mask] - off[theirs]) * es,
                          "recursive doubling allgather"));
    }
    return gvqSuccess;
}

/* Copy src into dst unless in place. */
static gvqResult_t start_copy(const gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t bytes) {
    return src == dst ? gvqSuccess : ctx->dev->copy(dst, src, bytes);
}

/* Recursive doubling on the ranks of g (all of the transport's, or a member list). */
static gvqResult_t rd_run(gvq_coll_ctx_t *ctx, rec_t *g, const void *src, void *dst, size_t count,
                          gvqRedOp_t op) {
    size_t bytes = count * g->esize;
    if (count == 0) return gvqSuccess;
    GVQCHECK(start_copy(ctx, src, dst, bytes));
    if (g->n > 1) {
        void *tmp = NULL;
        GVQCHECK(gvq_coll_scratch(ctx, bytes, &tmp));
        GVQCHECK(fold_in(g, dst, tmp, count));
        for (int mask = 1; g->v >= 0 && mask < g->p; mask <<= 1) {
            int pv = g->v ^ mask, peer = tr(g, real_rank(g, pv));
            GVQCHECK(sendrecv(g->t, peer, dst, bytes, peer, tmp, bytes, "recursive doubling"));
            GVQCHECK(combine(g, dst, tmp, count, pv < g->v));
        }
        GVQCHECK(fold_out(g, dst, bytes));
    }
    if (op == gvqAvg) GVQCHECK(ctx->dev->divide(dst, count, g->dtype, g->n));
    return gvqSuccess;
}

gvqResult_t gvq_rd_allreduce_members(gvq_coll_ctx_t *ctx, const int *members, int n,
                                     const void *src, void *dst, size_t count, gvqDataType_t dtype,
                                     gvqRedOp_t op) {
    rec_t g;
    rec_init(&g, ctx, dtype, op);
    int r = -1;
    for (int p = 0; p < n; p++)
        if (members[p] == g.r) r = p;
    if (r < 0) return gvqInternalError; /* not a member */
    g.n = n;
    g.r = r;
    g.map = members;
    for (g.p = 1; g.p * 2 <= g.n; g.p *= 2)
        ;
    g.rem = g.n - g.p;
    g.v = g.r < 2 * g.rem ? ((g.r & 1) ? g.r / 2 : -1) : g.r - g.rem;
    return rd_run(ctx, &g, src, dst, count, op);
}

gvqResult_t gvq_rd_allreduce(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                             gvqDataType_t dtype, gvqRedOp_t op) {
    rec_t g;
    rec_init(&g, ctx, dtype, op);
    return rd_run(ctx, &g, src, dst, count, op);
}

/* ---- the signed exchange (gvq_algo.h) ----------------------------------------------------------
 *
 * Recursive doubling with the fold, where every message is a header and an optional payload:
 *
 *     [ magic | flags | lo rank, lo row (n) | hi rank, hi row (n) | vector (count elements) ]
 *
 *     fold in:   2i   -> 2i+1         2i+1 merges the header, combines the vector (2i's first)
 *     round k:   v   <-> v ^ 2^k      both merge, both combine (lower group first)
 *     fold out:  2i+1 -> 2i           2i takes the final header and result
 *
 * so every rank ends with the extremes of all rows (gvq_agree_extremes's result) and, riding
 * along, the recursive-doubling allreduce of the vectors, in gvq_rd_allreduce's operand order.
 * Receives accept any length up to a header and GVQ_SIGNED_MAX_BYTES (irecv_upto): a rank
 * whose call differs (another count, a refusal, a signature-only agreement) sends the same
 * messages with another payload or none, is read all the same, and every rank still learns the
 * extremes in the same rounds; no message is left for a later call. A payload of another length
 * than this rank's is not combined, and the vector is copied to dst only when all rows agree.
 * Rows that define the payload's length make equal rows mean equal lengths; should a length
 * differ all the same, the receiver sets a flag that travels with the extremes (OR), and every
 * rank fails the call alike instead of passing on a partial sum.
 */

/* Whether (a, ra) comes before (b, rb). */
static int row_less(const int64_t *a, int ra, const int64_t *b, int rb, int n) {
    for (int f = 0; f < n; f++)
        if (a[f] != b[f]) return a[f] < b[f];
    return ra < rb;
}

/* Extremes: [lo rank, lo row (n), hi rank, hi row (n)]; merge `in` into `have` (also agree.c's
 * dissemination). Rows compare field by field, ties by rank. */
void gvq_extremes_merge(int64_t *have, const int64_t *in, int n) {
    if (row_less(in + 1, (int)in[0], have + 1, (int)have[0], n))
        for (int f = 0; f <= n; f++)
            have[f] = in[f];
    const int64_t *ih = in + n + 1;
    int64_t *hh = have + n + 1;
    if (row_less(hh + 1, (int)hh[0], ih + 1, (int)ih[0], n))
        for (int f = 0; f <= n; f++)
            hh[f] = ih[f];
}

#define SIGNED_MAGIC 0x6776715369676e00ull /* "gvqSign" and the row's field count */
enum { SIGNED_LENGTH_DIFFERS = 1 };        /* flags: a payload's length differed somewhere */

typedef struct {
    rec_t g;
    int n;                 /* fields of a row */
    size_t hbytes, pbytes; /* header, this rank's payload */
    int64_t *out, *in;     /* out: header + vector (sent, combined into); in: header + room */
    size_t count;
} signed_t;

static size_t signed_header_bytes(int n) {
    return (size_t)(2 + 2 * (n + 1)) * sizeof(int64_t);
}

static char *signed_vector(int64_t *msg, const signed_t *s) {
    return (char *)msg + s->hbytes;
}

/* Send out to `to` and/or receive into in from `from` (-1: none); *got is the received length. */
static gvqResult_t signed_sendrecv(signed_t *s, int to, int from, size_t *got, const char *what) {
    gvq_transport_t *t = s->g.t;
    gvq_req_t req[2];
    memset(req, 0, sizeof req);
    gvqResult_t res = gvqSuccess;
    if (from >= 0)
        res = t->ops->irecv_upto(t, from, GVQ_TAG_SIGNED, s->in, s->hbytes + GVQ_SIGNED_MAX_BYTES,
                                 &req[0]);
    if (res == gvqSuccess && to >= 0)
        res = t->ops->isend(t, to, GVQ_TAG_SIGNED, s->out, s->hbytes + s->pbytes, &req[1]);
    if (res == gvqSuccess) res = gvq_xport_waitall(t, req, 2, what);
    if (res != gvqSuccess) {
        gvq_xport_cancelall(t, req, 2);
        return res;
    }
    *got = from >= 0 ? req[0].bytes : 0;
    return gvqSuccess;
}

/* Take in (got bytes from `from`): merge its header into out's and, when its payload has this
 * rank's length, combine (in_is_lower: its values first) or adopt (replace) its vector. */
static gvqResult_t signed_take(signed_t *s, int from, size_t got, int in_is_lower, int replace) {
    if (got < s->hbytes || (uint64_t)s->in[0] != (SIGNED_MAGIC | (uint64_t)s->n)) {
        GVQ_WARN("call agreement: rank %d sent %zu bytes that are not a call signature of this "
                 "gvq (another version or another program on this communicator?)",
                 from, got);
        return gvqRemoteError;
    }
    if (replace) {
        memcpy(s->out + 1, s->in + 1, s->hbytes - sizeof(int64_t));
    } else {
        s->out[1] |= s->in[1];
        gvq_extremes_merge(s->out + 2, s->in + 2, s->n);
    }
    if (got - s->hbytes != s->pbytes) {
        s->out[1] |= SIGNED_LENGTH_DIFFERS;
        return gvqSuccess;
    }
    if (s->pbytes == 0) return gvqSuccess;
    if (replace)
        return s->g.dev->copy(signed_vector(s->out, s), signed_vector(s->in, s), s->pbytes);
    return combine(&s->g, signed_vector(s->out, s), signed_vector(s->in, s), s->count, in_is_lower);
}

static gvqResult_t signed_rounds(signed_t *s) {
    rec_t *g = &s->g;
    size_t got = 0;
    if (g->r < 2 * g->rem && g->v < 0) { /* the even rank of a fold pair */
        GVQCHECK(signed_sendrecv(s, g->r + 1, -1, &got, "call agreement (fold)"));
        GVQCHECK(signed_sendrecv(s, -1, g->r + 1, &got, "call agreement (fold result)"));
        return signed_take(s, g->r + 1, got, 0, 1);
    }
    if (g->r < 2 * g->rem) {
        GVQCHECK(signed_sendrecv(s, -1, g->r - 1, &got, "call agreement (fold)"));
        GVQCHECK(signed_take(s, g->r - 1, got, 1, 0));
    }
    for (int mask = 1; mask < g->p; mask <<= 1) {
        int pv = g->v ^ mask, peer = real_rank(g, pv);
        GVQCHECK(signed_sendrecv(s, peer, peer, &got, "call agreement"));
        GVQCHECK(signed_take(s, peer, got, pv < g->v, 0));
    }
    if (g->r < 2 * g->rem)
        GVQCHECK(signed_sendrecv(s, g->r - 1, -1, &got, "call agreement (fold result)"));
    return gvqSuccess;
}

/* Whether the extremes (out's header) are one row: every rank passed the same. */
static int signed_agreed(const signed_t *s) {
    const int64_t *lo = s->out + 3, *hi = s->out + 4 + s->n;
    return memcmp(lo, hi, (size_t)s->n * sizeof(int64_t)) == 0;
}

/* The other collectives ride along as an allreduce of one vector (gvq_rd_signed_bytes): a
 * reducescatter's whole input (each rank then keeps its block), a reduce's (the root keeps it);
 * an allgather's blocks and a broadcast's root vector as bytes summed with zeros, which is exact
 * whatever the bits (uint8: x + 0 = x), so every rank ends with every block and the root's
 * vector bit for bit. */
static int pay_bytewise(const gvq_signed_payload_t *pay) {
    return pay->kind == GVQ_PAY_ALLGATHER || pay->kind == GVQ_PAY_BROADCAST;
}

size_t gvq_rd_signed_bytes(const gvq_signed_payload_t *pay, int nranks) {
    size_t b = pay->count * gvq_dtype_size(pay->dtype);
    int whole = pay->kind == GVQ_PAY_ALLGATHER || pay->kind == GVQ_PAY_REDUCE_SCATTER;
    return whole ? b * (size_t)nranks : b;
}

/* This rank's contribution into the vector v (pbytes): its input, its block among zeros, or
 * zeros (a broadcast's non-root). */
static gvqResult_t signed_fill(const signed_t *s, const gvq_signed_payload_t *pay, char *v) {
    size_t block = pay->count * gvq_dtype_size(pay->dtype);
    if (pay->kind == GVQ_PAY_ALLGATHER) {
        memset(v, 0, s->pbytes);
        return s->g.dev->copy(v + (size_t)s->g.r * block, pay->src, block);
    }
    if (pay->kind == GVQ_PAY_BROADCAST && s->g.r != pay->root) {
        memset(v, 0, s->pbytes);
        return gvqSuccess;
    }
    return s->g.dev->copy(v, pay->src, s->pbytes);
}

/* The call's output from the exchanged vector v: all of it, this rank's block of it
 * (reducescatter) or nothing (a reduce's non-root); gvqAvg divided. */
static gvqResult_t signed_output(const signed_t *s, const gvq_signed_payload_t *pay,
                                 const char *v) {
    size_t block = pay->count * gvq_dtype_size(pay->dtype), bytes = s->pbytes;
    if (pay->kind == GVQ_PAY_REDUCE && s->g.r != pay->root) return gvqSuccess;
    if (pay->kind == GVQ_PAY_REDUCE_SCATTER) v += (size_t)s->g.r * block, bytes = block;
    GVQCHECK(s->g.dev->copy(pay->dst, v, bytes));
    if (pay_bytewise(pay) || pay->op != gvqAvg) return gvqSuccess;
    return s->g.dev->divide(pay->dst, pay->count, pay->dtype, s->g.n);
}

gvqResult_t gvq_rd_signed(gvq_coll_ctx_t *ctx, const int64_t *mine, int n, int64_t *lo,
                          int *lo_rank, int64_t *hi, int *hi_rank,
                          const gvq_signed_payload_t *pay) {
    signed_t s;
    memset(&s, 0, sizeof s);
    int bytewise = pay != NULL && pay_bytewise(pay);
    rec_init(&s.g, ctx, pay != NULL && !bytewise ? pay->dtype : gvqUint8,
             pay != NULL && !bytewise ? pay->op : gvqSum);
    s.n = n;
    s.hbytes = signed_header_bytes(n);
    s.pbytes = pay != NULL ? gvq_rd_signed_bytes(pay, ctx->xport->nranks) : 0;
    s.count = s.pbytes / s.g.esize;
    if (n < 1 || s.pbytes > GVQ_SIGNED_MAX_BYTES || ctx->xport->ops->irecv_upto == NULL)
        return gvqInternalError;
    size_t room = 2 * s.hbytes + s.pbytes + GVQ_SIGNED_MAX_BYTES + 8;
    /* with a payload the communicator's scratch (sent without a staging copy); the signature
     * alone on the heap, left to the transport after a failure if it may still touch it */
    void *mem = NULL;
    if (s.pbytes > 0)
        GVQCHECK(gvq_coll_scratch(ctx, room, &mem));
    else if ((mem = malloc(room)) == NULL)
        return gvqSystemError;
    s.out = mem;
    s.in = (int64_t *)((char *)mem + GVQ_DIV_UP(s.hbytes + s.pbytes, 8) * 8);
    s.out[0] = (int64_t)(SIGNED_MAGIC | (uint64_t)n);
    s.out[1] = 0;
    s.out[2] = s.out[3 + n] = s.g.r;
    memcpy(s.out + 3, mine, (size_t)n * sizeof(int64_t));
    memcpy(s.out + 4 + n, mine, (size_t)n * sizeof(int64_t));
    gvqResult_t res = gvqSuccess;
    int kept = 0; /* a transfer failed: the transport may still touch mem */
    if (s.pbytes > 0) res = signed_fill(&s, pay, signed_vector(s.out, &s));
    if (res == gvqSuccess && s.g.n > 1) kept = (res = signed_rounds(&s)) != gvqSuccess;
    if (res == gvqSuccess) {
        *lo_rank = (int)s.out[2];
        *hi_rank = (int)s.out[3 + n];
        memcpy(lo, s.out + 3, (size_t)n * sizeof(int64_t));
        memcpy(hi, s.out + 4 + n, (size_t)n * sizeof(int64_t));
    }
    if (res == gvqSuccess && signed_agreed(&s)) {
        if (s.out[1] & SIGNED_LENGTH_DIFFERS) { /* equal rows should define equal lengths */
            GVQ_WARN("call agreement: every rank's signature agrees but the data that rode along "
                     "differs in length between ranks; nothing was written");
            res = gvqInternalError;
        } else if (s.pbytes > 0) {
            res = signed_output(&s, pay, signed_vector(s.out, &s));
        }
    }
    if (s.pbytes == 0 && !(kept && ctx->xport->cancel_keeps_buffers)) free(mem);
    return res;
}

gvqResult_t gvq_rab_allreduce(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                              gvqDataType_t dtype, gvqRedOp_t op) {
    rec_t g;
    rec_init(&g, ctx, dtype, op);
    size_t bytes = count * g.esize;
    if (count == 0) return gvqSuccess;
    GVQCHECK(start_copy(ctx, src, dst, bytes));
    if (g.n > 1) {
        void *tmp = NULL;
        GVQCHECK(gvq_coll_scratch(ctx, bytes, &tmp)); /* the fold receives the whole vector */
        size_t *off = malloc(sizeof(size_t) * (size_t)(g.p + 1));
        if (off == NULL) return gvqSystemError;
        even_blocks(off, g.p, count);
        gvqResult_t res = fold_in(&g, dst, tmp, count);
        if (res == gvqSuccess && g.v >= 0) res = halving(&g, dst, tmp, off);
        if (res == gvqSuccess && g.v >= 0) res = doubling(&g, dst, off);
        if (res == gvqSuccess) res = fold_out(&g, dst, bytes);
        free(off);
        GVQCHECK(res);
    }
    if (op == gvqAvg) GVQCHECK(ctx->dev->divide(dst, count, dtype, g.n));
    return gvqSuccess;
}

/* The halving on a copy of the n blocks in work; the result block goes to dst. */
static gvqResult_t rab_rs_run(const rec_t *g, char *work, char *tmp, void *dst, size_t rc) {
    size_t es = g->esize, bbytes = rc * es;
    GVQCHECK(fold_in(g, work, tmp, (size_t)g->n * rc));
    if (g->v < 0) /* the even rank of a pair: its block comes from the odd one */
        return sendrecv(g->t, -1, NULL, 0, g->r + 1, dst, bbytes, "fold result receive");
    size_t *off = malloc(sizeof(size_t) * (size_t)(g->p + 1));
    if (off == NULL) return gvqSystemError;
    for (int b = 0; b < g->p; b++)
        off[b] = (size_t)first_rank(g, b) * rc;
    off[g->p] = (size_t)g->n * rc;
    gvqResult_t res = halving(g, work, tmp, off);
    free(off);
    GVQCHECK(res);
    if (g->r < 2 * g->rem)
        GVQCHECK(sendrecv(g->t, g->r - 1, work + (size_t)(g->r - 1) * bbytes, bbytes, -1, NULL, 0,
                          "fold result send"));
    return g->dev->copy(dst, work + (size_t)g->r * bbytes, bbytes);
}

gvqResult_t gvq_rab_reduce_scatter(gvq_coll_ctx_t *ctx, const void *src, void *dst,
                                   size_t recvcount, gvqDataType_t dtype, gvqRedOp_t op) {
    rec_t g;
    rec_init(&g, ctx, dtype, op);
    size_t total = (size_t)g.n * recvcount * g.esize;
    if (recvcount == 0) return gvqSuccess;
    if (g.n == 1) {
        GVQCHECK(start_copy(ctx, src, dst, total));
    } else {
        char *work = NULL; /* the whole vector, then the fold's or the halving's receives */
        GVQCHECK(gvq_coll_scratch(ctx, 2 * total, (void **)&work));
        GVQCHECK(ctx->dev->copy(work, src, total)); /* dst may lie inside src (in place) */
        GVQCHECK(rab_rs_run(&g, work, work + total, dst, recvcount));
    }
    if (op == gvqAvg) GVQCHECK(ctx->dev->divide(dst, recvcount, dtype, g.n));
    return gvqSuccess;
}

gvqResult_t gvq_bruck_allgather(gvq_coll_ctx_t *ctx, const void *src, void *dst, size_t count,
                                gvqDataType_t dtype) {
    gvq_transport_t *t = ctx->xport;
    int n = t->nranks, r = t->rank;
    size_t bytes = count * gvq_dtype_size(dtype);
    char *out = dst, *tmp = NULL;
    if (count == 0) return gvqSuccess;
    if (n == 1) return start_copy(ctx, src, dst, bytes);
    GVQCHECK(gvq_coll_scratch(ctx, (size_t)n * bytes, (void **)&tmp));
    GVQCHECK(ctx->dev->copy(tmp, src, bytes)); /* src may be dst's block r (in place) */
    for (int d = 1; d < n; d *= 2) {
        size_t nb = (size_t)GVQ_MIN(d, n - d);
        GVQCHECK(sendrecv(t, (r - d + n) % n, tmp, nb * bytes, (r + d) % n, tmp + (size_t)d * bytes,
                          nb * bytes, "Bruck allgather"));
    }
    /* tmp[i] is rank (r+i) mod n's block */
    GVQCHECK(ctx->dev->copy(out + (size_t)r * bytes, tmp, (size_t)(n - r) * bytes));
    if (r > 0) GVQCHECK(ctx->dev->copy(out, tmp + (size_t)(n - r) * bytes, (size_t)r * bytes));
    return gvqSuccess;
}
