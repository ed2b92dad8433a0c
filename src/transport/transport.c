/*
 * transport.c -- the one blocking loop of gvq. Every wait goes through here so that a stuck
 * peer becomes gvqTimeout and gvqCommAbort unblocks the waiter, on every transport.
 *
 * The loop polls; after GVQ_SPIN_BEFORE_YIELD fruitless polls it yields the core, which matters
 * when ranks outnumber cores (oversubscribed runs). A host stream's progress thread sleeps
 * GVQ_PROGRESS_SLEEP_US instead while no caller waits for its stream: the caller computes
 * meanwhile and needs the core. GVQ_WAIT=block (and auto, once a yield shows that another
 * thread wants the core) sleeps after GVQ_SPIN_US without progress: in the kernel until the
 * transport's next event where it can say (UCX's event fd), else GVQ_PROGRESS_SLEEP_US at a
 * time.
 */
#define _POSIX_C_SOURCE 200809L
#include <sched.h>
#include <time.h>

#include "gvq_transport.h"

gvqResult_t gvq_xport_iallgatherv_unsupported(gvq_transport_t *t, void *blocks, const size_t *displ,
                                              const size_t *blen, gvq_req_t *req) {
    (void)blocks, (void)displ, (void)blen, (void)req;
    GVQ_WARN("the %s transport has no native allgatherv", t->ops->name);
    return gvqInvalidUsage;
}

void gvq_xport_cancelall(gvq_transport_t *t, gvq_req_t *reqs, int n) {
    for (int i = 0; i < n; i++)
        if (reqs[i].active) t->ops->cancel(t, &reqs[i]);
}

/* The transport of request i: ts[i], or t for all. */
static gvq_transport_t *xport_of(gvq_transport_t *t, gvq_transport_t *const *ts, int i) {
    return ts != NULL ? ts[i] : t;
}

/* A wait failed with res: the transport of request `culprit` is broken (culprit < 0: every
 * transport with a request still pending), then every active request is cancelled by its own. */
static gvqResult_t waitall_fail(gvq_transport_t *t, gvq_transport_t *const *ts, gvq_req_t *reqs,
                                int n, gvqResult_t res, int culprit) {
    for (int i = 0; i < n; i++) /* first: a cancel may mark it broken too, less precisely */
        if (i == culprit || (culprit < 0 && reqs[i].active)) {
            gvq_transport_t *x = xport_of(t, ts, i);
            gvq_broken_set(x->broken, res);
            if (x->ops->revoke != NULL && res != gvqInvalidUsage) x->ops->revoke(x); /* not */
        } /* after a local abort */
    for (int i = 0; i < n; i++)
        if (reqs[i].active) gvq_xport_cancelall(xport_of(t, ts, i), &reqs[i], 1);
    return res;
}

/* GVQ_WAIT=auto: until when this thread counts its core as shared. A yield that took longer than
 * CONTESTED_NS gave the core to another thread that wanted it (the scheduler ran it for a slice);
 * for CONTESTED_FOR_NS after that the thread's waits sleep instead of spinning, then it tries a
 * spinning wait again. A thread alone on its core gets its yields back in a microsecond or two. */
#define CONTESTED_NS 100000ull
#define CONTESTED_FOR_NS 100000000ull
static __thread uint64_t contested_until;

/* Leave the core for one idle turn; fd: the wait is for t's own transfers (its block op may
 * sleep on them). Returns 1 when it slept (the waiter's next fruitless poll sleeps again). */
static int leave_core(gvq_transport_t *t, uint64_t start, int fd) {
    const long sleep_ns = (long)GVQ_MIN(gvq_param(GVQ_PARAM_PROGRESS_SLEEP_US), 999999) * 1000;
    if (sleep_ns > 0 && gvq_thread_may_sleep()) { /* leave the core to the compute */
        nanosleep(&(struct timespec){0, sleep_ns}, NULL);
        return 0;
    }
    const int64_t mode = gvq_param(GVQ_PARAM_WAIT); /* 0 auto, 1 spin (default), 2 block */
    uint64_t now = gvq_now_ns();
    int block = mode == 2 || (mode == 0 && now < contested_until);
    if (block && start != 0 && now - start >= (uint64_t)gvq_param(GVQ_PARAM_SPIN_US) * 1000) {
        if (fd && t->ops->block != NULL) {
            t->ops->block(t, 1000000ull); /* at most 1 ms: abort and timeout are checked */
        } else { /* no event to wake on: naps of an eighth of the wait so far (at most 1/8 */
            uint64_t nap = (now - start) / 8; /* late), GVQ_PROGRESS_SLEEP_US to 1 ms */
            nap = GVQ_MIN(GVQ_MAX(nap, (uint64_t)(sleep_ns > 0 ? sleep_ns : 50000)), 1000000ull);
            nanosleep(&(struct timespec){0, (long)nap}, NULL);
        }
        return 1;
    }
    sched_yield();
    if (mode == 0 && !block) {
        uint64_t after = gvq_now_ns();
        if (after - now > CONTESTED_NS) contested_until = after + CONTESTED_FOR_NS;
    }
    return 0;
}

/* slept (NULL: not asked): whether the turn slept */
static gvqResult_t idle_turn(gvq_transport_t *t, uint64_t *start, int fd, int *slept) {
    if (t->abort_flag != NULL && __atomic_load_n(t->abort_flag, __ATOMIC_ACQUIRE))
        return gvqInvalidUsage;
    gvqResult_t cause = gvqRemoteError;
    int by = t->ops->revoked != NULL ? t->ops->revoked(t, &cause) : -1;
    if (by >= 0) {
        GVQ_WARN("rank %d's call on this communicator failed (%s) and it revoked the "
                 "communicator; this rank's call fails alike (rank %d's WARN names the cause)",
                 by, gvqGetErrorString(cause), by);
        gvq_broken_set(t->broken, cause);
        return cause;
    }
    int s = leave_core(t, *start, fd);
    if (slept != NULL) *slept = s;
    uint64_t now = gvq_now_ns();
    if (*start == 0) *start = now;
    return t->timeout_ns != 0 && now - *start > t->timeout_ns ? gvqTimeout : gvqSuccess;
}

gvqResult_t gvq_xport_idle(gvq_transport_t *t, uint64_t *start) {
    return idle_turn(t, start, 0, NULL);
}

gvqResult_t gvq_xport_idle_slept(gvq_transport_t *t, uint64_t *start, int *slept) {
    return idle_turn(t, start, 0, slept);
}

/* Every request tested in turn, each by its own transport, so that transfers of several
 * communicators (a group's) all move while any is waited for; bounded by the transport of the
 * first request still pending (its abort, its timeout). */
static gvqResult_t wait_loop(gvq_transport_t *t, gvq_transport_t *const *ts, gvq_req_t *reqs, int n,
                             const char *what) {
    const int64_t spin = gvq_param(GVQ_PARAM_SPIN_BEFORE_YIELD);
    uint64_t start = 0;
    int64_t idle = 0;
    int pending = 0;
    for (int i = 0; i < n; i++)
        pending += reqs[i].active;
    while (pending > 0) {
        int progressed = 0, first = -1;
        for (int i = 0; i < n; i++) {
            if (!reqs[i].active) continue;
            gvq_transport_t *x = xport_of(t, ts, i);
            int done = 0;
            gvqResult_t res = x->ops->test(x, &reqs[i], &done);
            if (res != gvqSuccess) { /* the transport warned with the facts */
                GVQ_TRACE("%s: transfer with peer %d failed (%s)", what, reqs[i].peer,
                          gvqGetErrorString(res));
                return waitall_fail(t, ts, reqs, n, res, i);
            }
            if (done) {
                pending--;
                progressed = 1;
            } else if (first < 0) {
                first = i;
            }
        }
        if (pending == 0) break;
        if (progressed) {
            idle = 0;
            start = 0;
            continue;
        }
        for (int i = 0; i < n; i++) {
            gvq_transport_t *x = xport_of(t, ts, i);
            if (reqs[i].active && x->abort_flag != NULL &&
                __atomic_load_n(x->abort_flag, __ATOMIC_ACQUIRE)) {
                GVQ_WARN("%s: communicator aborted while waiting for %d transfer(s)", what,
                         pending);
                return waitall_fail(t, ts, reqs, n, gvqInvalidUsage, -1);
            }
        }
        if (++idle >= spin) {
            gvq_transport_t *x = xport_of(t, ts, first);
            /* one transport for every request: it may sleep until its own next event; after a
             * sleep one round of polls, then the next sleep */
            int slept = 0;
            gvqResult_t ir = idle_turn(x, &start, ts == NULL, &slept);
            idle = slept ? spin - 1 : 0;
            if (ir == gvqTimeout) {
                GVQ_WARN("%s: no progress for %llu ms with %d transfer(s) pending (first peer %d); "
                         "the peer is gone or stuck (GVQ_TIMEOUT_MS)",
                         what, (unsigned long long)(x->timeout_ns / 1000000ull), pending,
                         reqs[first].peer);
                return waitall_fail(t, ts, reqs, n, gvqTimeout, -1);
            }
            if (ir != gvqSuccess) return waitall_fail(t, ts, reqs, n, ir, -1); /* revoked */
        }
    }
    return gvqSuccess;
}

gvqResult_t gvq_xport_waitall(gvq_transport_t *t, gvq_req_t *reqs, int n, const char *what) {
    return wait_loop(t, NULL, reqs, n, what);
}

gvqResult_t gvq_xport_waitall_many(gvq_transport_t *const *ts, gvq_req_t *reqs, int n,
                                   const char *what) {
    return wait_loop(NULL, ts, reqs, n, what);
}
