/*
 * elastic.c -- communicators that change size: gvqCommShrink, a new communicator of the ranks
 * that remain, after a fault or to leave given ranks out (NCCL 2.27's ncclCommShrink; MPI
 * ULFM's MPIX_Comm_shrink); gvqCommGrow, one with new processes added (NCCL's ncclCommGrow).
 *
 * The parent may be broken (a peer died or stalled and a call timed out), so nothing here goes
 * through the parent's collectives. Three rounds of small messages, each bounded by the timeout:
 *
 *   hello     every caller sends its exclusion list to every rank it does not exclude and
 *             waits for theirs. A rank that does not answer within the timeout is left out
 *             (GVQ_SHRINK_ABORT) or fails the call (default: every rank not excluded must
 *             call). The members in this rank's view: itself and the ranks it heard from,
 *             less every list it received.
 *   decision  the lowest member of that view (the leader) sends its members to the others,
 *             who adopt them: views can differ only when a rank failed or came late during the
 *             hello, and one rank decides.
 *   ack       every member sends a digest of the decision to every other member and waits for
 *             all of them: a rank goes on only when each member holds the same decision, so no
 *             two ranks build communicators of different members (a member that dies after
 *             this fails the creation below on every rank, by the timeout).
 *
 * Where the rounds run: MPI, the parent's own MPI communicator (its receives post nothing
 * until a message of the exact tag and size is there, and it is never freed after a failure,
 * mpi.c), on tags of their own; UCX, the spare worker every UCX communicator opens at creation
 * (a broken communicator's worker is never progressed again, ucx.c), which then becomes the
 * shrunk communicator's. The in-process transport cannot shrink (as it cannot split).
 *
 * The new communicator is made as gvqCommSplit makes a child (MPI_Comm_create_group over the
 * members only; UCX endpoints among the members' spares), copies the host keys, and keeps
 * nothing else of the parent: compressors, zero-code state and parameter-server shards start
 * afresh on it (docs/RELIABILITY.md, "Shrinking and growing a communicator").
 *
 * Growing is a new communicator from a new unique id that the caller hands to the newcomers by
 * its own means (as NCCL asks): the members keep their ranks, the newcomers take the ranks above
 * them, and gvqCommInitRank's bootstrap checks that no two claim one rank.
 */
#define _POSIX_C_SOURCE 200809L
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gvq_comm.h"

enum {
    SHRINK_MAGIC = 0x6b6e7273, /* "srnk" */
    HELLO = 1,
    DECISION = 2,
    ACK = 3,
    /* tags on the parent's transport: above gvqCommSplit's MPI_Comm_create_group tags (1000 to
     * 30999), below 32768 (MPI's least tag bound) */
    TAG_BASE = 31000,
    CREATE_TAG_BASE = 32000
};

typedef struct {
    uint32_t magic, kind, seq;
    int32_t n, flags, result, ctag, pad;
    uint64_t digest; /* ack: a digest of the decision's members */
} msg_head_t;        /* then n bytes: hello, the sender's exclusions; decision, the members */

static int tag_of(uint32_t seq, int kind) {
    return TAG_BASE + (int)(seq % 250u) * 4 + kind;
}

static uint64_t digest_of(const uint8_t *members, int n, uint32_t seq) {
    uint64_t h = 1469598103934665603ull ^ seq; /* FNV-1a */
    for (int p = 0; p < n; p++)
        h = (h ^ members[p]) * 1099511628211ull;
    return h;
}

typedef struct {
    gvq_transport_t *t;
    const gvq_shm_t *shm; /* the parent's shared memory (one host), or NULL: tells ended peers */
    int n, me, flags;
    uint32_t seq;
    uint64_t timeout_ns;
    int *abort_flag;
    size_t msg_bytes;
    uint8_t *sendbuf, *recvbufs; /* one message out, n in */
    gvq_req_t *reqs;             /* n receives then n sends */
    int leak;                    /* a cancelled send may still read sendbuf (UCX, MPI): keep it */
} round_t;

static msg_head_t *in_msg(round_t *r, int p) {
    return (msg_head_t *)(r->recvbufs + (size_t)p * r->msg_bytes);
}

/* Send the message in sendbuf to every peer with to[p] and receive one of `kind` from every
 * peer with from[p]; got[p] = 1 for those that came, well formed, within the timeout (counted
 * from the start of this round). gvqInvalidUsage after an abort, else gvqSuccess. */
static gvqResult_t round_run(round_t *r, int kind, const uint8_t *to, const uint8_t *from,
                             uint8_t *got, uint64_t timeout_ns) {
    gvq_transport_t *t = r->t;
    int n = r->n, tag = tag_of(r->seq, kind);
    gvq_req_t *rr = r->reqs, *sr = r->reqs + n;
    memset(r->reqs, 0, 2 * (size_t)n * sizeof *r->reqs);
    for (int p = 0; p < n; p++) {
        got[p] = 0;
        if (p == r->me) continue;
        if (from[p] && t->ops->irecv(t, p, tag, r->recvbufs + (size_t)p * r->msg_bytes,
                                     r->msg_bytes, &rr[p]) != gvqSuccess)
            rr[p].active = 0;
        if (to[p] && t->ops->isend(t, p, tag, r->sendbuf, r->msg_bytes, &sr[p]) != gvqSuccess)
            sr[p].active = 0;
    }
    uint64_t start = gvq_now_ns(), checked = 0;
    int64_t polls = 0;
    for (;;) {
        int recv_pending = 0;
        for (int i = 0; i < 2 * n; i++) {
            if (!r->reqs[i].active) continue;
            int done = 0;
            gvqResult_t res = t->ops->test(t, &r->reqs[i], &done);
            if (res != gvqSuccess) { /* that peer is gone: the transport warned */
                if (r->reqs[i].active) t->ops->cancel(t, &r->reqs[i]);
                continue;
            }
            if (done && i < n) {
                const msg_head_t *h = in_msg(r, i);
                got[i] = h->magic == SHRINK_MAGIC && h->kind == (uint32_t)kind &&
                         h->seq == r->seq && h->n == n;
                if (!got[i])
                    GVQ_WARN("gvqCommShrink: rank %d sent a message that is not this shrink's "
                             "(another call, or another number of shrinks before); ignored",
                             i);
            }
            recv_pending += !done && i < n;
        }
        if (recv_pending == 0) break; /* sends still out are left to the transport below */
        if (r->abort_flag != NULL && __atomic_load_n(r->abort_flag, __ATOMIC_ACQUIRE)) {
            gvq_xport_cancelall(t, r->reqs, 2 * n);
            r->leak = 1;
            GVQ_WARN("gvqCommShrink: communicator aborted during the shrink");
            return gvqInvalidUsage;
        }
        uint64_t now = gvq_now_ns();
        if (now - start > timeout_ns) break;
        if (r->shm != NULL && now - checked > 20000000ull) { /* a peer whose process ended */
            checked = now;
            for (int p = 0; p < n; p++)
                if (rr[p].active && gvq_shm_peer_gone(r->shm, p)) {
                    GVQ_WARN("gvqCommShrink: rank %d's process has ended", p);
                    t->ops->cancel(t, &rr[p]);
                    r->leak |= t->cancel_keeps_buffers;
                }
        }
        if (++polls > 64) { /* a dead peer's endpoint may take a while to say so: sleep */
            nanosleep(&(struct timespec){0, 50000}, NULL);
        } else {
            sched_yield();
        }
    }
    /* what has not come is cancelled; the sends get the rest of the timeout to leave */
    for (int p = 0; p < n; p++)
        if (rr[p].active) {
            t->ops->cancel(t, &rr[p]);
            r->leak |= t->cancel_keeps_buffers; /* UCX: a matched receive may still land */
        }
    for (uint64_t t0 = gvq_now_ns(); gvq_now_ns() - t0 < r->timeout_ns / 4;) {
        int left = 0;
        for (int p = 0; p < n; p++) {
            int done = 0;
            if (sr[p].active && (t->ops->test(t, &sr[p], &done) != gvqSuccess || !done))
                left += sr[p].active;
        }
        if (left == 0) break;
        sched_yield();
    }
    for (int p = 0; p < n; p++)
        if (sr[p].active) {
            t->ops->cancel(t, &sr[p]);
            r->leak |= t->cancel_keeps_buffers;
        }
    return gvqSuccess;
}

static void put_head(round_t *r, int kind, int result, int ctag, uint64_t digest,
                     const uint8_t *bits) {
    msg_head_t h = {SHRINK_MAGIC, (uint32_t)kind, r->seq, r->n, r->flags, result, ctag, 0, digest};
    memcpy(r->sendbuf, &h, sizeof h);
    memcpy(r->sendbuf + sizeof h, bits, (size_t)r->n);
}

/* The three rounds (above). members[p] = 1 for the new communicator's ranks; *ctag: the MPI
 * creation tag the leader chose. */
static gvqResult_t agree(round_t *r, const uint8_t *excl, uint8_t *members, int *ctag) {
    int n = r->n, me = r->me;
    uint8_t *cand = calloc((size_t)n, 1), *got = calloc((size_t)n, 1), *none = calloc((size_t)n, 1);
    gvqResult_t res = cand && got && none ? gvqSuccess : gvqSystemError;
    for (int p = 0; res == gvqSuccess && p < n; p++)
        cand[p] = !excl[p];
    /* hello */
    if (res == gvqSuccess) {
        put_head(r, HELLO, 0, 0, 0, excl);
        /* twice the timeout: the survivors of a fault see it at times up to a timeout apart */
        res = round_run(r, HELLO, cand, cand, got, 2 * r->timeout_ns);
    }
    int missing = -1;
    for (int p = 0; res == gvqSuccess && p < n; p++) {
        members[p] = p == me || (cand[p] && got[p]);
        if (cand[p] && !members[p] && missing < 0) missing = p;
        if (got[p] && in_msg(r, p)->flags != r->flags) {
            GVQ_WARN("gvqCommShrink: rank %d shrinks with flags %d, this rank with %d", p,
                     in_msg(r, p)->flags, r->flags);
            res = gvqInvalidUsage;
        }
    }
    if (res == gvqSuccess && missing >= 0 && !(r->flags & GVQ_SHRINK_ABORT)) {
        GVQ_WARN("gvqCommShrink: rank %d did not take part within %llu ms (GVQ_SHRINK_ABORT "
                 "leaves out the ranks that do not answer)",
                 missing, (unsigned long long)(r->timeout_ns / 1000000ull));
        res = gvqTimeout;
    }
    for (int p = 0; res == gvqSuccess && p < n; p++) /* less everyone's exclusions */
        if (got[p])
            for (int q = 0; q < n; q++)
                if (((const uint8_t *)(in_msg(r, p) + 1))[q]) members[q] = 0;
    if (res == gvqSuccess && !members[me]) {
        GVQ_WARN("gvqCommShrink: another rank's list leaves this rank out");
        res = gvqInvalidUsage;
    }
    int leader = 0, m = 0, ncand = 0;
    while (res == gvqSuccess && !members[leader])
        leader++;
    for (int p = 0; p < n; p++) {
        m += members[p];
        ncand += cand[p];
    }
    /* decision: the leader's view is everyone's */
    if (res == gvqSuccess && me == leader) {
        gvqResult_t verdict = gvqSuccess;
        if ((r->flags & GVQ_SHRINK_ABORT) && !(r->flags & GVQ_SHRINK_NO_QUORUM) && 2 * m <= ncand) {
            GVQ_WARN("gvqCommShrink: %d of the %d ranks not excluded answered: not a majority, "
                     "so these may be the ones cut off (GVQ_SHRINK_NO_QUORUM goes on anyway)",
                     m, ncand);
            verdict = gvqRemoteError;
        }
        *ctag = CREATE_TAG_BASE + (int)(r->seq % 700u);
        put_head(r, DECISION, verdict, *ctag, 0, members);
        res = round_run(r, DECISION, members, none, got, r->timeout_ns);
        if (res == gvqSuccess) res = verdict;
    } else if (res == gvqSuccess) {
        memset(cand, 0, (size_t)n);
        cand[leader] = 1;
        res = round_run(r, DECISION, none, cand, got, r->timeout_ns);
        if (res == gvqSuccess && !got[leader]) {
            GVQ_WARN("gvqCommShrink: no decision from rank %d (the lowest rank this one heard "
                     "from) within the timeout",
                     leader);
            res = gvqTimeout;
        }
        if (res == gvqSuccess && in_msg(r, leader)->result != gvqSuccess) {
            GVQ_WARN("gvqCommShrink: rank %d (the leader) decided to make no communicator", leader);
            res = (gvqResult_t)in_msg(r, leader)->result;
        }
        if (res == gvqSuccess) {
            memcpy(members, in_msg(r, leader) + 1, (size_t)n);
            *ctag = in_msg(r, leader)->ctag;
            if (!members[me]) {
                GVQ_WARN("gvqCommShrink: rank %d decided without this rank (it did not hear from "
                         "it in time)",
                         leader);
                res = gvqRemoteError;
            }
        }
    }
    /* ack: every member holds the decision */
    uint64_t digest = digest_of(members, n, r->seq);
    if (res == gvqSuccess) {
        put_head(r, ACK, 0, 0, digest, members);
        res = round_run(r, ACK, members, members, got, r->timeout_ns);
    }
    for (int p = 0; res == gvqSuccess && p < n; p++)
        if (p != me && members[p] && (!got[p] || in_msg(r, p)->digest != digest)) {
            GVQ_WARN("gvqCommShrink: member rank %d %s", p,
                     got[p] ? "holds another decision" : "did not confirm the decision in time");
            res = got[p] ? gvqRemoteError : gvqTimeout;
        }
    free(cand);
    free(got);
    free(none);
    return res;
}

/* config with what it leaves undefined taken from comm, not the environment; *timeout_ms then
 * holds the timeout it gives. */
static gvqConfig_t inherit(gvqComm_t comm, const gvqConfig_t *config, int64_t *timeout_ms) {
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    if (config != NULL) {
        cfg.blocking = config->blocking;
        cfg.timeoutMs = config->timeoutMs;
        cfg.chunkBytes = config->chunkBytes;
    }
    if (cfg.timeoutMs == GVQ_CONFIG_UNDEF_INT) {
        *timeout_ms = (int64_t)(comm->xport->timeout_ns / 1000000ull);
        cfg.timeoutMs = (int)GVQ_MIN(*timeout_ms, (int64_t)INT32_MAX);
    }
    if (cfg.chunkBytes == GVQ_CONFIG_UNDEF_INT)
        cfg.chunkBytes = (int)GVQ_MIN(comm->chunk_bytes, (size_t)INT32_MAX);
    return cfg;
}

/* The transport of the new communicator: the members ranks[0..m), this rank at me. */
static gvqResult_t child_transport(gvqComm_t comm, int ucx, const int *ranks, int m, int me,
                                   int ctag, uint64_t timeout_ns, gvq_transport_t **t) {
    if (ucx)
        GVQCHECK(gvq_ucx_spare_take(comm->xport, ranks, m, me, t));
    else {
        uint64_t was = comm->xport->timeout_ns; /* the parent's, for the creation's bound */
        comm->xport->timeout_ns = timeout_ns;
        gvqResult_t res = gvq_mpi_transport_subset(comm->xport, ranks, m, me, ctag, t);
        comm->xport->timeout_ns = was;
        GVQCHECK(res);
    }
    (*t)->timeout_ns = timeout_ns;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqCommShrink(gvqComm_t comm, const int *excludeRanks, int excludeCount,
                                  gvqComm_t *newcomm, gvqConfig_t *config, int shrinkFlags) {
    if (newcomm != NULL) *newcomm = NULL;
    GVQCHECK(gvq_comm_check(comm, "gvqCommShrink", 1));
    int n = comm->nranks;
    if (newcomm == NULL || excludeCount < 0 || excludeCount > n ||
        (excludeCount > 0 && excludeRanks == NULL) ||
        (shrinkFlags & ~(int)(GVQ_SHRINK_ABORT | GVQ_SHRINK_NO_QUORUM)) != 0) {
        GVQ_WARN("gvqCommShrink: %s",
                 newcomm == NULL                        ? "newcomm is NULL"
                 : excludeCount < 0 || excludeCount > n ? "excludeCount is outside [0, nranks]"
                 : (shrinkFlags & ~(int)(GVQ_SHRINK_ABORT | GVQ_SHRINK_NO_QUORUM)) != 0
                     ? "unknown shrinkFlags"
                     : "excludeRanks is NULL with excludeCount > 0");
        return gvqInvalidArgument;
    }
    int64_t timeout_ms;
    size_t chunk;
    GVQCHECK(gvq_config_resolve(config, "gvqCommShrink", &timeout_ms, &chunk));
    gvqConfig_t cfg = inherit(comm, config, &timeout_ms);
    if (timeout_ms <= 0) {
        GVQ_WARN("gvqCommShrink: needs a timeout (config->timeoutMs, or the parent's, > 0): it "
                 "waits that long for the ranks that remain");
        return gvqInvalidArgument;
    }
    const char *kind = comm->xport->ops->name;
    int ucx = strcmp(kind, "ucx") == 0;
    if (!ucx && strcmp(kind, "mpi") != 0) {
        GVQ_WARN("gvqCommShrink: the %s transport cannot make new communicators (mpi and ucx can)",
                 kind);
        return gvqInvalidUsage;
    }
    uint8_t *excl = calloc((size_t)n, 1), *members = calloc((size_t)n, 1);
    int *ranks = calloc((size_t)n, sizeof *ranks);
    round_t r = {.n = n,
                 .me = comm->rank,
                 .flags = shrinkFlags,
                 .abort_flag = &comm->abort_flag,
                 .seq = comm->shrinks++,
                 .timeout_ns = (uint64_t)timeout_ms * 1000000ull};
    r.msg_bytes = (sizeof(msg_head_t) + (size_t)n + 7) & ~(size_t)7; /* aligned in recvbufs */
    r.sendbuf = malloc(r.msg_bytes);
    r.recvbufs = calloc((size_t)n, r.msg_bytes);
    r.reqs = calloc(2 * (size_t)n, sizeof *r.reqs);
    gvqResult_t res =
        excl && members && ranks && r.sendbuf && r.recvbufs && r.reqs ? gvqSuccess : gvqSystemError;
    for (int i = 0; res == gvqSuccess && i < excludeCount; i++) {
        int p = excludeRanks[i];
        if (p < 0 || p >= n || p == comm->rank) {
            GVQ_WARN("gvqCommShrink: excludeRanks[%d] = %d is %s", i, p,
                     p == comm->rank ? "this rank (an excluded rank does not call)"
                                     : "outside [0, nranks)");
            res = gvqInvalidArgument;
        } else {
            excl[p] = 1;
        }
    }
    if (res == gvqSuccess) {
        for (int p = 0; p < n; p++) /* the ranks to reach: those not excluded */
            members[p] = !excl[p];
        r.t = comm->xport;
        if (ucx) res = gvq_ucx_spare_transport(comm->xport, members, &r.t);
        if (comm->shm_state == 1) r.shm = &comm->shm;
    }
    int ctag = 0, m = 0, me = -1;
    if (res == gvqSuccess) res = agree(&r, excl, members, &ctag);
    for (int p = 0; res == gvqSuccess && p < n; p++)
        if (members[p]) {
            if (p == comm->rank) me = m;
            ranks[m++] = p;
        }
    gvq_transport_t *t = NULL;
    if (res == gvqSuccess) res = child_transport(comm, ucx, ranks, m, me, ctag, r.timeout_ns, &t);
    if (res == gvqSuccess) res = gvq_comm_create(t, &cfg, "gvqCommShrink", newcomm);
    if (res == gvqSuccess) {
        res = gvq_comm_child_finish(comm, ranks, m, *newcomm, 1);
        if (res != gvqSuccess) {
            (void)gvqCommDestroy(*newcomm);
            *newcomm = NULL;
        }
    }
    if (res == gvqSuccess)
        GVQ_INFO("gvqCommShrink: rank %d of %d becomes rank %d of %d (%d left out)", comm->rank, n,
                 me, m, n - m);
    else
        GVQ_WARN("gvqCommShrink: no communicator made (%s)", gvqGetErrorString(res));
    free(excl);
    free(members);
    free(ranks);
    if (!r.leak) { /* else a cancelled transfer may still use them: left allocated */
        free(r.sendbuf);
        free(r.recvbufs);
    }
    free(r.reqs);
    return res;
}

GVQ_API gvqResult_t gvqCommGrow(gvqComm_t comm, int nranks, const gvqUniqueId *commId, int rank,
                                gvqComm_t *newcomm, gvqConfig_t *config) {
    if (newcomm != NULL) *newcomm = NULL;
    if (comm != NULL) GVQCHECK(gvq_comm_check(comm, "gvqCommGrow", 1));
    if (newcomm == NULL || commId == NULL) {
        GVQ_WARN("gvqCommGrow: %s is NULL", newcomm == NULL ? "newcomm" : "commId");
        return gvqInvalidArgument;
    }
    if (comm != NULL && (rank != -1 || nranks < comm->nranks)) {
        GVQ_WARN("gvqCommGrow: a member passes rank -1 (it keeps its rank) and nranks >= its "
                 "communicator's %d (got rank %d, nranks %d)",
                 comm->nranks, rank, nranks);
        return gvqInvalidArgument;
    }
    if (comm == NULL && (rank < 0 || rank >= nranks)) {
        GVQ_WARN("gvqCommGrow: a newcomer's rank %d is outside [0, %d)", rank, nranks);
        return gvqInvalidArgument;
    }
    int64_t timeout_ms = 0;
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    if (comm != NULL)
        cfg = inherit(comm, config, &timeout_ms);
    else if (config != NULL)
        cfg = *config;
    gvqResult_t res =
        gvqCommInitRankConfig(newcomm, nranks, *commId, comm != NULL ? comm->rank : rank, &cfg);
    if (res == gvqSuccess)
        GVQ_INFO("gvqCommGrow: %s rank %d of %d", comm != NULL ? "member" : "newcomer",
                 comm != NULL ? comm->rank : rank, nranks);
    else
        GVQ_WARN("gvqCommGrow: no communicator made (%s)", gvqGetErrorString(res));
    return res;
}
