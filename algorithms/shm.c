/*
 * shm.c -- the call agreement and small allreduces through memory that every rank maps (ranks
 * on one host; the core makes the memory, src/core/shm.c).
 *
 *   rank r, call k (slots of parity k mod 2):
 *
 *     slot[r]:  row, length, vector          <- written, then call number k (release)
 *     slot[q]:  wait until its call number is k (acquire), for every rank q
 *     every rank reads every row: the same extremes everywhere
 *     rows equal: dst = ((v0 op v1) op v2) ... op v(N-1)     (every rank: the same operations)
 *
 * One write and one read of each vector, no message: on one host the exchange is as fast as the
 * cores see each other's cache lines. Why two slots suffice: a rank posts call k+2 into the slot
 * of call k only after it saw every rank post call k+1, and a rank posts k+1 only after it read
 * everything of call k. A rank that never posts is waited for up to the transport's timeout
 * (gvqTimeout, the communicator broken), and gvqCommAbort stops the wait. While it waits, the
 * transport's progress runs: a peer still finishing the previous call's transfers (an MPI
 * rendezvous send waits for this rank's acknowledgement) must not wait on this rank in turn.
 */
#include <sched.h>
#include <string.h>

#include "gvq_algo.h"

typedef struct {
    uint64_t call; /* the call number of what the slot holds (written last, release) */
    uint64_t len;  /* the vector's bytes; 0: the signature alone */
    int64_t row[GVQ_SHM_MAX_FIELDS];
} shm_slot_t;

_Static_assert(sizeof(shm_slot_t) <= GVQ_SHM_HEADER, "a slot's header fits GVQ_SHM_HEADER");

static shm_slot_t *slot(const gvq_shm_t *m, int rank, uint64_t call) {
    size_t bytes = (size_t)GVQ_SHM_HEADER + GVQ_SHM_MAX_BYTES;
    return (shm_slot_t *)(m->base + ((size_t)rank * 2 + (call & 1)) * bytes);
}

static char *slot_vector(shm_slot_t *s) {
    return (char *)s + GVQ_SHM_HEADER;
}

/* Wait until rank q has posted call k; bounded as gvq_xport_waitall is. */
static gvqResult_t wait_posted(gvq_coll_ctx_t *ctx, const gvq_shm_t *m, int q, uint64_t k) {
    gvq_transport_t *t = ctx->xport;
    const shm_slot_t *s = slot(m, q, k);
    const int64_t spin = gvq_param(GVQ_PARAM_SPIN_BEFORE_YIELD);
    uint64_t start = 0;
    for (int64_t idle = 0; __atomic_load_n(&s->call, __ATOMIC_ACQUIRE) != k;) {
        if (t->ops->progress != NULL) t->ops->progress(t); /* the peer may wait on our acks */
        if (++idle < spin) continue;
        idle = 0;
        if (t->abort_flag != NULL && __atomic_load_n(t->abort_flag, __ATOMIC_ACQUIRE)) {
            GVQ_WARN("call agreement: communicator aborted while waiting for rank %d", q);
            gvq_broken_set(t->broken, gvqInvalidUsage);
            return gvqInvalidUsage;
        }
        sched_yield();
        uint64_t now = gvq_now_ns();
        if (start == 0) start = now;
        if (t->timeout_ns != 0 && now - start > t->timeout_ns) {
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

/* dst = v0 op v1 op ... in rank order (the vectors of call k, each len bytes). */
static gvqResult_t reduce_in_order(gvq_coll_ctx_t *ctx, const gvq_shm_t *m, uint64_t k,
                                   const gvq_signed_payload_t *pay, size_t len) {
    const gvq_device_ops_t *dev = ctx->dev;
    gvqRedOp_t op = pay->op == gvqAvg ? gvqSum : pay->op;
    GVQCHECK(dev->copy(pay->dst, slot_vector(slot(m, 0, k)), len));
    for (int q = 1; q < m->nranks; q++)
        GVQCHECK(dev->reduce(pay->dst, pay->dst, slot_vector(slot(m, q, k)), pay->count, pay->dtype,
                             op));
    if (pay->op == gvqAvg) GVQCHECK(dev->divide(pay->dst, pay->count, pay->dtype, m->nranks));
    return gvqSuccess;
}

gvqResult_t gvq_shm_signed(gvq_coll_ctx_t *ctx, gvq_shm_t *m, const int64_t *mine, int n,
                           int64_t *lo, int *lo_rank, int64_t *hi, int *hi_rank,
                           const gvq_signed_payload_t *pay) {
    size_t len = pay != NULL ? pay->count * gvq_dtype_size(pay->dtype) : 0;
    if (n < 1 || n > GVQ_SHM_MAX_FIELDS || len > GVQ_SHM_MAX_BYTES) return gvqInternalError;
    uint64_t k = ++m->calls;
    shm_slot_t *me = slot(m, m->rank, k);
    me->len = len;
    memcpy(me->row, mine, (size_t)n * sizeof(int64_t));
    if (len > 0) GVQCHECK(ctx->dev->copy(slot_vector(me), pay->src, len));
    __atomic_store_n(&me->call, k, __ATOMIC_RELEASE);
    for (int q = 0; q < m->nranks; q++)
        if (q != m->rank) GVQCHECK(wait_posted(ctx, m, q, k));
    int64_t have[2 * (GVQ_SHM_MAX_FIELDS + 1)];
    all_extremes(m, k, n, have);
    *lo_rank = (int)have[0];
    *hi_rank = (int)have[n + 1];
    memcpy(lo, have + 1, (size_t)n * sizeof(int64_t));
    memcpy(hi, have + n + 2, (size_t)n * sizeof(int64_t));
    if (len == 0 || memcmp(lo, hi, (size_t)n * sizeof(int64_t)) != 0) return gvqSuccess;
    for (int q = 0; q < m->nranks; q++) {
        if (slot(m, q, k)->len != len) { /* equal rows should define equal lengths */
            GVQ_WARN("call agreement: every rank's signature agrees but the data of rank %d has "
                     "%llu bytes, this rank's %zu; nothing was written",
                     q, (unsigned long long)slot(m, q, k)->len, len);
            return gvqInternalError;
        }
    }
    return reduce_in_order(ctx, m, k, pay, len);
}
