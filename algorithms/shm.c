/*
 * shm.c -- the call agreement and allreduces through memory that every rank maps (ranks on one
 * host; the core makes the memory, src/core/shm.c).
 *
 *   rank r, call k (slots of parity k mod 2):
 *
 *     slot[r]:  row, length, vector          <- written, then call number k (release)
 *     slot[q]:  wait until its call number is k (acquire), for every rank q
 *     every rank reads every row: the same extremes everywhere
 *     rows equal: dst = ((v0 op v1) op v2) ... op v(N-1)     (every rank: the same operations)
 *
 * Above 64 KiB each rank reduces only its segment of the vectors (into its output, then back
 * into its own slot, whose segment no one else reads) and, once each rank's `reduced` number
 * says so, copies the others' reduced segments. A vector longer than a slot goes a slot's
 * worth at a time, each piece an exchange of its own (the row checked on the first).
 *
 * One write and one read of each vector, no message: on one host the exchange is as fast as the
 * cores see each other's cache lines. Why two slots suffice: a rank posts call k+2 into the slot
 * of call k only after it saw every rank post call k+1, and a rank posts k+1 only after it read
 * everything of call k. A rank that never posts is waited for up to the transport's timeout
 * (gvqTimeout, the communicator broken), and gvqCommAbort stops the wait. While it waits, the
 * transport's progress runs: a peer still finishing the previous call's transfers (an MPI
 * rendezvous send waits for this rank's acknowledgement) must not wait on this rank in turn.
 */
#include <string.h>

#include "gvq_algo.h"

typedef struct {
    uint64_t call;    /* the call number of what the slot holds (written last, release) */
    uint64_t reduced; /* large vectors: the call whose segment this rank has reduced in place */
    uint64_t len;     /* the vector's bytes; 0: the signature alone */
    int64_t row[GVQ_SHM_MAX_FIELDS];
} shm_slot_t;

_Static_assert(sizeof(shm_slot_t) <= GVQ_SHM_HEADER, "a slot's header fits GVQ_SHM_HEADER");

static shm_slot_t *slot(const gvq_shm_t *m, int rank, uint64_t call) {
    size_t bytes = (size_t)GVQ_SHM_HEADER + m->slot_data;
    return (shm_slot_t *)(m->base + ((size_t)rank * 2 + (call & 1)) * bytes);
}

static char *slot_vector(shm_slot_t *s) {
    return (char *)s + GVQ_SHM_HEADER;
}

/* Wait until rank q's slot of call k holds k in its call (reduced: its reduced) number;
 * bounded as gvq_xport_waitall is. */
static gvqResult_t wait_posted(gvq_coll_ctx_t *ctx, const gvq_shm_t *m, int q, uint64_t k,
                               int reduced) {
    gvq_transport_t *t = ctx->xport;
    const shm_slot_t *s = slot(m, q, k);
    const uint64_t *field = reduced ? &s->reduced : &s->call;
    const int64_t spin = gvq_param(GVQ_PARAM_SPIN_BEFORE_YIELD);
    uint64_t start = 0;
    for (int64_t idle = 0; __atomic_load_n(field, __ATOMIC_ACQUIRE) != k;) {
        if (t->ops->progress != NULL) t->ops->progress(t); /* the peer may wait on our acks */
        if (++idle < spin) continue;
        idle = 0;
        gvqResult_t res = gvq_xport_idle(t, &start);
        if (res == gvqInvalidUsage) {
            GVQ_WARN("call agreement: communicator aborted while waiting for rank %d", q);
            gvq_broken_set(t->broken, gvqInvalidUsage);
            return gvqInvalidUsage;
        }
        if (res == gvqTimeout) {
            GVQ_WARN("call agreement: rank %d did not reach collective call %llu within %llu ms "
                     "(shared memory); the peer is gone or stuck (GVQ_TIMEOUT_MS)",
                     q, (unsigned long long)k, (unsigned long long)(t->timeout_ns / 1000000ull));
            gvq_broken_set(t->broken, gvqTimeout);
            return gvqTimeout;
        }
    }
    return gvqSuccess;
}

/* The extremes of every rank's row (gvq_extremes_merge's layout and order). */
static void all_extremes(const gvq_shm_t *m, uint64_t k, int n, int64_t *have) {
    int64_t one[2 * (GVQ_SHM_MAX_FIELDS + 1)];
    for (int q = 0; q < m->nranks; q++) {
        const shm_slot_t *s = slot(m, q, k);
        one[0] = one[n + 1] = q;
        memcpy(one + 1, s->row, (size_t)n * sizeof(int64_t));
        memcpy(one + n + 2, s->row, (size_t)n * sizeof(int64_t));
        if (q == 0)
            memcpy(have, one, (size_t)(2 * (n + 1)) * sizeof(int64_t));
        else
            gvq_extremes_merge(have, one, n);
    }
}

/* out[0, n) = v0 op v1 op ... in rank order over elements [off, off + n) of the vectors of
 * call k (out is none of them). */
static gvqResult_t reduce_range(gvq_coll_ctx_t *ctx, const gvq_shm_t *m, uint64_t k,
                                const gvq_signed_payload_t *pay, char *out, size_t off, size_t n) {
    const gvq_device_ops_t *dev = ctx->dev;
    size_t es = gvq_dtype_size(pay->dtype), at = off * es;
    gvqRedOp_t op = pay->op == gvqAvg ? gvqSum : pay->op;
    if (n == 0) return gvqSuccess;
    GVQCHECK(dev->copy(out, slot_vector(slot(m, 0, k)) + at, n * es));
    for (int q = 1; q < m->nranks; q++)
        GVQCHECK(dev->reduce(out, out, slot_vector(slot(m, q, k)) + at, n, pay->dtype, op));
    if (pay->op == gvqAvg) GVQCHECK(dev->divide(out, n, pay->dtype, m->nranks));
    return gvqSuccess;
}

/* Element offset of rank q's segment of count elements (the first count % N get one more). */
static size_t seg_off(const gvq_shm_t *m, size_t count, int q) {
    size_t base = count / (size_t)m->nranks, extra = count % (size_t)m->nranks;
    return (size_t)q * base + GVQ_MIN((size_t)q, extra);
}

/* Large vectors: this rank reduces its segment of every vector into dst, puts it back in its
 * own slot in place of its own values there (a segment of a slot is read by its owner only),
 * then copies every other rank's reduced segment once that rank's `reduced` says it is there. */
static gvqResult_t reduce_scattered(gvq_coll_ctx_t *ctx, gvq_shm_t *m, uint64_t k,
                                    const gvq_signed_payload_t *pay) {
    size_t es = gvq_dtype_size(pay->dtype);
    shm_slot_t *me = slot(m, m->rank, k);
    size_t off = seg_off(m, pay->count, m->rank), n = seg_off(m, pay->count, m->rank + 1) - off;
    char *mine = (char *)pay->dst + off * es;
    GVQCHECK(reduce_range(ctx, m, k, pay, mine, off, n));
    if (n > 0) GVQCHECK(ctx->dev->copy(slot_vector(me) + off * es, mine, n * es));
    __atomic_store_n(&me->reduced, k, __ATOMIC_RELEASE);
    for (int q = 0; q < m->nranks; q++) {
        if (q == m->rank) continue;
        GVQCHECK(wait_posted(ctx, m, q, k, 1));
        size_t qo = seg_off(m, pay->count, q), qn = seg_off(m, pay->count, q + 1) - qo;
        if (qn > 0)
            GVQCHECK(ctx->dev->copy((char *)pay->dst + qo * es,
                                    slot_vector(slot(m, q, k)) + qo * es, qn * es));
    }
    return gvqSuccess;
}

/* Post this rank's row and the vector piece (NULL: none) as the next call, wait until every
 * rank has posted it; *k is its number. */
static gvqResult_t post_and_wait(gvq_coll_ctx_t *ctx, gvq_shm_t *m, const int64_t *mine, int n,
                                 const gvq_signed_payload_t *piece, uint64_t *k) {
    size_t len = piece != NULL ? piece->count * gvq_dtype_size(piece->dtype) : 0;
    *k = ++m->calls;
    shm_slot_t *me = slot(m, m->rank, *k);
    me->len = len;
    memcpy(me->row, mine, (size_t)n * sizeof(int64_t));
    if (len > 0) GVQCHECK(ctx->dev->copy(slot_vector(me), piece->src, len));
    __atomic_store_n(&me->call, *k, __ATOMIC_RELEASE);
    for (int q = 0; q < m->nranks; q++)
        if (q != m->rank) GVQCHECK(wait_posted(ctx, m, q, *k, 0));
    return gvqSuccess;
}

/* Every rank posted a piece of this rank's length (equal rows define equal lengths), then the
 * piece's reduction into piece->dst. */
static gvqResult_t reduce_piece(gvq_coll_ctx_t *ctx, gvq_shm_t *m, uint64_t k,
                                const gvq_signed_payload_t *piece) {
    size_t len = piece->count * gvq_dtype_size(piece->dtype);
    for (int q = 0; q < m->nranks; q++) {
        if (slot(m, q, k)->len != len) {
            GVQ_WARN("call agreement: every rank's signature agrees but the data of rank %d has "
                     "%llu bytes, this rank's %zu; the output is not valid",
                     q, (unsigned long long)slot(m, q, k)->len, len);
            return gvqInternalError;
        }
    }
    if (len > GVQ_SHM_SMALL_BYTES) return reduce_scattered(ctx, m, k, piece);
    return reduce_range(ctx, m, k, piece, piece->dst, 0, piece->count);
}

/* Piece p of pay: at most slot_data bytes of it. */
static gvq_signed_payload_t piece_of(const gvq_shm_t *m, const gvq_signed_payload_t *pay,
                                     size_t p) {
    size_t es = gvq_dtype_size(pay->dtype), per = m->slot_data / es, first = p * per;
    gvq_signed_payload_t piece = *pay;
    piece.src = (const char *)pay->src + first * es;
    piece.dst = (char *)pay->dst + first * es;
    piece.count = GVQ_MIN(per, pay->count - first);
    return piece;
}

gvqResult_t gvq_shm_signed(gvq_coll_ctx_t *ctx, gvq_shm_t *m, const int64_t *mine, int n,
                           int64_t *lo, int *lo_rank, int64_t *hi, int *hi_rank,
                           const gvq_signed_payload_t *pay) {
    size_t es = pay != NULL ? gvq_dtype_size(pay->dtype) : 1;
    if (n < 1 || n > GVQ_SHM_MAX_FIELDS || es > m->slot_data) return gvqInternalError;
    size_t pieces = pay != NULL ? GVQ_DIV_UP(pay->count, m->slot_data / es) : 0;
    gvq_signed_payload_t first = pay != NULL ? piece_of(m, pay, 0) : (gvq_signed_payload_t){0};
    uint64_t k = 0;
    GVQCHECK(post_and_wait(ctx, m, mine, n, pay != NULL ? &first : NULL, &k));
    int64_t have[2 * (GVQ_SHM_MAX_FIELDS + 1)];
    all_extremes(m, k, n, have);
    *lo_rank = (int)have[0];
    *hi_rank = (int)have[n + 1];
    memcpy(lo, have + 1, (size_t)n * sizeof(int64_t));
    memcpy(hi, have + n + 2, (size_t)n * sizeof(int64_t));
    if (pieces == 0 || memcmp(lo, hi, (size_t)n * sizeof(int64_t)) != 0) return gvqSuccess;
    GVQCHECK(reduce_piece(ctx, m, k, &first));
    for (size_t p = 1; p < pieces; p++) { /* the rest, a slot's worth at a time */
        gvq_signed_payload_t piece = piece_of(m, pay, p);
        GVQCHECK(post_and_wait(ctx, m, mine, n, &piece, &k));
        GVQCHECK(reduce_piece(ctx, m, k, &piece));
    }
    return gvqSuccess;
}
