/*
 * shm.c -- the call agreement and the plain collectives through memory that every rank maps
 * (ranks on one host; the core makes the memory, src/comm/shm_setup.c).
 *
 *   rank r, call k (slots of parity k mod 2):
 *
 *     slot[r]:  row, length, vector          <- written, then call number k (release)
 *     slot[q]:  wait until its call number is k (acquire), for every rank q
 *     every rank reads every row: the same extremes everywhere
 *     rows equal: each rank takes its output from the slots
 *
 *   what a rank posts / takes          (v_q: rank q's vector in its slot)
 *     allreduce      its vector       / ((v0 op v1) op v2) ... op v(N-1), every rank the same
 *     reduce         its vector       / the same, on the root only
 *     reducescatter  every block      / block r of that reduction
 *     allgather      its vector       / v0 v1 ... v(N-1)
 *     broadcast      root: its vector / v_root
 *
 * Reductions above 64 KiB run in segments: each rank reduces its segment of every vector (into
 * its own slot, whose segment no one else reads) and, once each rank's `reduced` number says so,
 * the ranks with output copy the others' reduced segments. A vector longer than a slot goes a
 * slot's worth (a piece) at a time, each piece an exchange of its own (the row checked on the
 * first); a reducescatter's piece holds a part of every block.
 *
 * One write and one read of each vector, no message: on one host the exchange is as fast as the
 * cores see each other's cache lines. Why two slots suffice: a rank posts call k+2 into the slot
 * of call k only after it saw every rank post call k+1, and a rank posts k+1 only after it read
 * everything of call k it needs. A rank that never posts is waited for up to the transport's
 * timeout (gvqTimeout, the communicator broken), and gvqCommAbort stops the wait. While it waits,
 * the transport's progress runs: a peer still finishing the previous call's transfers (an MPI
 * rendezvous send waits for this rank's acknowledgement) must not wait on this rank in turn.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gvq_algo.h"

typedef struct {
    uint64_t call; /* the call number of what the slot holds (written last, release) */
    uint64_t len;  /* the vector's bytes; 0: the signature alone */
    int64_t row[GVQ_SHM_MAX_FIELDS]; /* a call's packed signature (5 words) shares call's line */
    uint64_t reduced;   /* large vectors: the call whose segment this rank has reduced in place */
    int64_t pid, pidns; /* slot 0: the rank's process and pid namespace (gvq_shm_announce) */
} shm_slot_t;

_Static_assert(sizeof(shm_slot_t) <= GVQ_SHM_HEADER, "a slot's header fits GVQ_SHM_HEADER");

static shm_slot_t *slot(const gvq_shm_t *m, int rank, uint64_t call) {
    size_t bytes = (size_t)GVQ_SHM_HEADER + m->slot_data;
    return (shm_slot_t *)(m->base + ((size_t)rank * 2 + (call & 1)) * bytes);
}

static char *slot_vector(shm_slot_t *s) {
    return (char *)s + GVQ_SHM_HEADER;
}

enum { PROGRESS_EVERY = 16 }; /* polls of a flag per turn of the transport's progress */

static inline void cpu_pause(void) { /* a spinning core's hint to its sibling */
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t pid_namespace(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (int64_t)st.st_ino : -1;
}

void gvq_shm_announce(const gvq_shm_t *m) {
    shm_slot_t *s = slot(m, m->rank, 0);
    s->pidns = pid_namespace();
    __atomic_store_n(&s->pid, (int64_t)getpid(), __ATOMIC_RELEASE);
}

int gvq_shm_peer_gone(const gvq_shm_t *m, int q) {
    const shm_slot_t *s = slot(m, q, 0);
    int64_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
    if (pid <= 0 || s->pidns != pid_namespace() || s->pidns < 0) return 0;
    if (kill((pid_t)pid, 0) != 0) return errno == ESRCH;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) return 0;
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = 0;
    const char *close = strrchr(buf, ')'); /* "pid (comm) S ...": the state after the name */
    return close != NULL && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

/* Wait until rank q's slot of call k holds k in its call (reduced: its reduced) number;
 * bounded as gvq_xport_waitall is. */
static gvqResult_t wait_posted(gvq_coll_ctx_t *ctx, const gvq_shm_t *m, int q, uint64_t k,
                               int reduced) {
    gvq_transport_t *t = ctx->xport;
    const shm_slot_t *s = slot(m, q, k);
    const uint64_t *field = reduced ? &s->reduced : &s->call;
    const int64_t spin = gvq_param(GVQ_PARAM_SPIN_BEFORE_YIELD);
    uint64_t start = 0, checked = 0;
    for (int64_t idle = 0; __atomic_load_n(field, __ATOMIC_ACQUIRE) != k;) {
        /* a turn: polls of the flag (a load each), then the transport's progress (~100 ns on
         * MPI: the peer may wait on our acks); `spin` turns before the core is yielded */
        for (int i = 1; i < PROGRESS_EVERY && __atomic_load_n(field, __ATOMIC_ACQUIRE) != k; i++)
            cpu_pause();
        if (t->ops->progress != NULL) t->ops->progress(t);
        if (++idle < spin) continue;
        int slept = 0;
        gvqResult_t res = gvq_xport_idle_slept(t, &start, &slept);
        idle = slept ? spin - 1 : 0;
        if (res == gvqInvalidUsage) {
            GVQ_WARN("call agreement: communicator aborted while waiting for rank %d", q);
            gvq_broken_set(t->broken, gvqInvalidUsage);
            return gvqInvalidUsage;
        }
        uint64_t now = gvq_now_ns();
        if (res == gvqSuccess && now - checked > 20000000ull) { /* 50 times a second */
            checked = now;
            for (int p = 0; p < m->nranks; p++) /* any ended rank dooms the call, not only q */
                if (p != m->rank && gvq_shm_peer_gone(m, p)) {
                    GVQ_WARN("call agreement: rank %d's process (pid %lld) has ended; collective "
                             "call %llu cannot complete",
                             p, (long long)slot(m, p, 0)->pid, (unsigned long long)k);
                    gvq_broken_set(t->broken, gvqRemoteError);
                    if (t->ops->revoke != NULL) t->ops->revoke(t); /* ranks of other hosts */
                    return gvqRemoteError;
                }
        }
        if (res != gvqSuccess && res != gvqTimeout) return res; /* revoked: idle warned */
        if (res == gvqTimeout) {
            GVQ_WARN("call agreement: rank %d did not reach collective call %llu within %llu ms "
                     "(shared memory); the peer is gone or stuck (GVQ_TIMEOUT_MS)",
                     q, (unsigned long long)k, (unsigned long long)(t->timeout_ns / 1000000ull));
            gvq_broken_set(t->broken, gvqTimeout);
            if (t->ops->revoke != NULL) t->ops->revoke(t);
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
    const char *v0 = slot_vector(slot(m, 0, k)) + at;
    if (m->nranks == 1) GVQCHECK(dev->copy(out, v0, n * es));
    for (int q = 1; q < m->nranks; q++) /* v0 op v1 in one pass, then the others */
        GVQCHECK(dev->reduce(out, q == 1 ? v0 : out, slot_vector(slot(m, q, k)) + at, n, pay->dtype,
                             op));
    if (pay->op == gvqAvg) GVQCHECK(dev->divide(out, n, pay->dtype, m->nranks));
    return gvqSuccess;
}

/* Elements [first, first + n) of every rank's block: what one exchange carries. */
typedef struct {
    size_t first, n;
} piece_t;

/* Elements of a block per piece: a slot's worth (reducescatter: a part of every block). */
static size_t piece_elems(const gvq_shm_t *m, const gvq_signed_payload_t *pay) {
    size_t per = m->slot_data / gvq_dtype_size(pay->dtype);
    return pay->kind == GVQ_PAY_REDUCE_SCATTER ? per / (size_t)m->nranks : per;
}

static piece_t piece_of(const gvq_shm_t *m, const gvq_signed_payload_t *pay, size_t p) {
    size_t per = piece_elems(m, pay), first = p * per;
    return (piece_t){first, GVQ_MIN(per, pay->count - first)};
}

/* The bytes rank q posts for a piece (pay NULL: the signature alone). */
static size_t posted_bytes(const gvq_shm_t *m, const gvq_signed_payload_t *pay, const piece_t *pc,
                           int q) {
    if (pay == NULL) return 0;
    size_t b = pc->n * gvq_dtype_size(pay->dtype);
    if (pay->kind == GVQ_PAY_BROADCAST) return q == pay->root ? b : 0;
    return pay->kind == GVQ_PAY_REDUCE_SCATTER ? b * (size_t)m->nranks : b;
}

/* This rank's part of the piece into its slot's vector: a reducescatter's part of every block,
 * packed; nothing from a broadcast's non-root. */
static gvqResult_t post_piece(gvq_coll_ctx_t *ctx, const gvq_shm_t *m,
                              const gvq_signed_payload_t *pay, const piece_t *pc, char *to) {
    size_t es = gvq_dtype_size(pay->dtype), b = pc->n * es;
    const char *src = pay->src;
    if (pay->kind != GVQ_PAY_REDUCE_SCATTER)
        return posted_bytes(m, pay, pc, m->rank) > 0 ? ctx->dev->copy(to, src + pc->first * es, b)
                                                     : gvqSuccess;
    for (int q = 0; q < m->nranks; q++)
        GVQCHECK(
            ctx->dev->copy(to + (size_t)q * b, src + ((size_t)q * pay->count + pc->first) * es, b));
    return gvqSuccess;
}

/* Post this rank's row and its part of the piece (pay NULL: none) as the next call, wait until
 * every rank has posted it; *k is its number. */
static gvqResult_t post_and_wait(gvq_coll_ctx_t *ctx, gvq_shm_t *m, const int64_t *mine, int n,
                                 const gvq_signed_payload_t *pay, const piece_t *pc, uint64_t *k) {
    *k = ++m->calls;
    shm_slot_t *me = slot(m, m->rank, *k);
    me->len = posted_bytes(m, pay, pc, m->rank);
    memcpy(me->row, mine, (size_t)n * sizeof(int64_t));
    if (pay != NULL) GVQCHECK(post_piece(ctx, m, pay, pc, slot_vector(me)));
    __atomic_store_n(&me->call, *k, __ATOMIC_RELEASE);
    for (int q = 0; q < m->nranks; q++)
        if (q != m->rank) GVQCHECK(wait_posted(ctx, m, q, *k, 0));
    return gvqSuccess;
}

/* Element offset of rank q's segment of count elements (the first count % N get one more). */
static size_t seg_off(const gvq_shm_t *m, size_t count, int q) {
    size_t base = count / (size_t)m->nranks, extra = count % (size_t)m->nranks;
    return (size_t)q * base + GVQ_MIN((size_t)q, extra);
}

enum { TMP_BYTES = 16 * 1024 }; /* a reduce's segment on a rank without output, in steps */

/* This rank's segment of the piece reduced into its own slot (which only this rank reads there)
 * and, when out is not NULL, into out (the output at the piece's first element). */
static gvqResult_t reduce_own_segment(gvq_coll_ctx_t *ctx, const gvq_shm_t *m, uint64_t k,
                                      const gvq_signed_payload_t *pay, const piece_t *pc,
                                      char *out) {
    size_t es = gvq_dtype_size(pay->dtype);
    size_t off = seg_off(m, pc->n, m->rank), n = seg_off(m, pc->n, m->rank + 1) - off;
    char *mine = slot_vector(slot(m, m->rank, k)) + off * es;
    if (out != NULL) { /* the others read it from the slot, but for a reduce's root */
        GVQCHECK(reduce_range(ctx, m, k, pay, out + off * es, off, n));
        int read = pay->kind == GVQ_PAY_ALLREDUCE;
        return n > 0 && read ? ctx->dev->copy(mine, out + off * es, n * es) : gvqSuccess;
    }
    _Alignas(64) char tmp[TMP_BYTES]; /* this rank's own values are still an operand */
    for (size_t at = 0, step = TMP_BYTES / es; at < n; at += step) {
        size_t len = GVQ_MIN(step, n - at);
        GVQCHECK(reduce_range(ctx, m, k, pay, tmp, off + at, len));
        GVQCHECK(ctx->dev->copy(mine + at * es, tmp, len * es));
    }
    return gvqSuccess;
}

/* Large reductions: every rank reduces its segment of the piece (reduce_own_segment), then the
 * ranks with output (all for an allreduce, the root for a reduce) copy every other rank's reduced
 * segment once that rank's `reduced` says it is there. */
static gvqResult_t reduce_scattered(gvq_coll_ctx_t *ctx, gvq_shm_t *m, uint64_t k,
                                    const gvq_signed_payload_t *pay, const piece_t *pc) {
    size_t es = gvq_dtype_size(pay->dtype);
    int gathers = pay->kind == GVQ_PAY_ALLREDUCE || m->rank == pay->root;
    char *out = gathers ? (char *)pay->dst + pc->first * es : NULL;
    GVQCHECK(reduce_own_segment(ctx, m, k, pay, pc, out));
    __atomic_store_n(&slot(m, m->rank, k)->reduced, k, __ATOMIC_RELEASE);
    for (int q = 0; gathers && q < m->nranks; q++) {
        if (q == m->rank) continue;
        GVQCHECK(wait_posted(ctx, m, q, k, 1));
        size_t qo = seg_off(m, pc->n, q), qn = seg_off(m, pc->n, q + 1) - qo;
        if (qn > 0)
            GVQCHECK(ctx->dev->copy(out + qo * es, slot_vector(slot(m, q, k)) + qo * es, qn * es));
    }
    return gvqSuccess;
}

static gvqResult_t copy_unless_same(gvq_coll_ctx_t *ctx, char *to, const char *from, size_t b) {
    return to != from ? ctx->dev->copy(to, from, b) : gvqSuccess;
}

/* Every rank posted what its part of the piece is (equal rows define equal lengths), then this
 * rank's output of the piece. */
static gvqResult_t take_piece(gvq_coll_ctx_t *ctx, gvq_shm_t *m, uint64_t k,
                              const gvq_signed_payload_t *pay, const piece_t *pc) {
    for (int q = 0; q < m->nranks; q++) {
        if (slot(m, q, k)->len != posted_bytes(m, pay, pc, q)) {
            GVQ_WARN("call agreement: every rank's signature agrees but the data of rank %d has "
                     "%llu bytes, not %zu; the output is not valid",
                     q, (unsigned long long)slot(m, q, k)->len, posted_bytes(m, pay, pc, q));
            return gvqInternalError;
        }
    }
    size_t es = gvq_dtype_size(pay->dtype), b = pc->n * es;
    char *dst = pay->dst != NULL ? (char *)pay->dst + pc->first * es : NULL; /* a reduce's non-root:
                                                                              * none */
    switch (pay->kind) {
    case GVQ_PAY_ALLREDUCE:
    case GVQ_PAY_REDUCE:
        if (b > GVQ_SHM_SMALL_BYTES) return reduce_scattered(ctx, m, k, pay, pc);
        if (pay->kind == GVQ_PAY_REDUCE && m->rank != pay->root) return gvqSuccess;
        return reduce_range(ctx, m, k, pay, dst, 0, pc->n);
    case GVQ_PAY_REDUCE_SCATTER:
        return reduce_range(ctx, m, k, pay, dst, (size_t)m->rank * pc->n, pc->n);
    case GVQ_PAY_ALLGATHER:
        for (int q = 0; q < m->nranks; q++) {
            char *to = (char *)pay->dst + ((size_t)q * pay->count + pc->first) * es;
            if (q == m->rank) /* its own block from its input, none in place */
                GVQCHECK(copy_unless_same(ctx, to, (const char *)pay->src + pc->first * es, b));
            else
                GVQCHECK(ctx->dev->copy(to, slot_vector(slot(m, q, k)), b));
        }
        return gvqSuccess;
    case GVQ_PAY_BROADCAST:
        if (m->rank != pay->root) return ctx->dev->copy(dst, slot_vector(slot(m, pay->root, k)), b);
        return copy_unless_same(ctx, dst, (const char *)pay->src + pc->first * es, b);
    }
    return gvqInternalError;
}

gvqResult_t gvq_shm_signed(gvq_coll_ctx_t *ctx, gvq_shm_t *m, const int64_t *mine, int n,
                           int64_t *lo, int *lo_rank, int64_t *hi, int *hi_rank,
                           const gvq_signed_payload_t *pay) {
    if (n < 1 || n > GVQ_SHM_MAX_FIELDS || (pay != NULL && piece_elems(m, pay) == 0))
        return gvqInternalError;
    size_t pieces = pay != NULL ? GVQ_DIV_UP(pay->count, piece_elems(m, pay)) : 0;
    piece_t pc = pieces > 0 ? piece_of(m, pay, 0) : (piece_t){0, 0};
    uint64_t k = 0;
    GVQCHECK(post_and_wait(ctx, m, mine, n, pieces > 0 ? pay : NULL, &pc, &k));
    int64_t have[2 * (GVQ_SHM_MAX_FIELDS + 1)];
    all_extremes(m, k, n, have);
    *lo_rank = (int)have[0];
    *hi_rank = (int)have[n + 1];
    memcpy(lo, have + 1, (size_t)n * sizeof(int64_t));
    memcpy(hi, have + n + 2, (size_t)n * sizeof(int64_t));
    if (pieces == 0 || memcmp(lo, hi, (size_t)n * sizeof(int64_t)) != 0) return gvqSuccess;
    GVQCHECK(take_piece(ctx, m, k, pay, &pc));
    for (size_t p = 1; p < pieces; p++) { /* the rest, a slot's worth at a time */
        pc = piece_of(m, pay, p);
        GVQCHECK(post_and_wait(ctx, m, mine, n, pay, &pc, &k));
        GVQCHECK(take_piece(ctx, m, k, pay, &pc));
    }
    return gvqSuccess;
}
