/*
 * mpi.c -- the Open MPI transport: non-blocking point-to-point on a communicator of gvq's own
 * (a duplicate, or one made from the bootstrap's table with MPI_Comm_create_group, which only
 * the member ranks call). Errors return (MPI_ERRORS_RETURN) and become gvqRemoteError.
 *
 * gvq does not trust MPI to bound a transfer or to give a buffer back after a failure (with
 * Open MPI's shared-memory single copy, a message larger than its receive is copied past the
 * receive's end, and a send or receive pending when a call gave up still reads or writes its
 * buffer when the peer resumes). So the caller's memory is touched only while a call runs:
 *
 *   receive   irecv posts nothing. test finds the message (MPI_Improbe, receives of one peer
 *             and tag matched in the order posted) and checks its size; only an exact size is
 *             received into the caller's buffer (MPI_Imrecv), a wrong one is drained into a
 *             buffer of its own and fails the receive with gvqRemoteError, naming both sizes.
 *   send      the bytes are copied into a buffer of the transport (staged) and sent from there;
 *             a send from the library memory the communicator gave (own_mem: its scratch, which
 *             it keeps when it broke) goes without the copy, and so does every send with
 *             GVQ_SEND_COPY=0 (the user's choice: speed over the guarantee).
 *   failure   cancel forgets a receive still waiting for its message (nothing was posted), and
 *             quarantines what MPI still holds -- sends with their staged copies, drains, and a
 *             receive matched but not finished within a grace period -- until the process ends.
 *             The MPI communicator of a failed transport is never freed, so Open MPI cannot
 *             hand its context id to a new communicator, whose receives would match the late
 *             messages.
 *
 *     isend: copy -> stage ----MPI_Isend----> peer        (stage quarantined if pending at cancel)
 *     irecv: (nothing) ... test: MPI_Improbe -> size ok?  -> MPI_Imrecv into the caller's buffer
 *                                                 wrong? -> drain, gvqRemoteError
 *
 * If the program did not initialize MPI, gvq does, once (MPI_THREAD_MULTIPLE), and finalizes it
 * at exit; after a communicator failed, that finalization is bounded by the communicator's
 * timeout (a peer that never reaches MPI_Finalize would hold it forever), past which the process
 * leaves with its exit status without finalizing.
 */
#define _DEFAULT_SOURCE /* on_exit: the exit status for a bounded finalization */
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "gvq_mpi_impl.h"

/* ---- requests ------------------------------------------------------------------------------ */

static mpi_op_t *op_get(mpi_impl_t *m) {
    mpi_op_t *op = m->free_ops;
    if (op != NULL) {
        m->free_ops = op->next;
    } else if ((op = calloc(1, sizeof *op)) == NULL) {
        return NULL;
    }
    op->next = NULL;
    op->direct = 0;
    op->upto = 0;
    op->r = MPI_REQUEST_NULL;
    return op;
}

static void op_put(mpi_impl_t *m, mpi_op_t *op) {
    op->buf = NULL;
    op->next = m->free_ops;
    m->free_ops = op;
}

static void op_free_all(mpi_op_t *op) {
    while (op != NULL) {
        mpi_op_t *next = op->next;
        free(op->stage);
        free(op);
        op = next;
    }
}

static mpi_op_t *req_op(const gvq_req_t *req) {
    mpi_op_t *op;
    memcpy(&op, req->handle, sizeof op);
    return op;
}

static void req_fill(gvq_req_t *req, mpi_op_t *op, int peer, size_t bytes) {
    memset(req->handle, 0, sizeof req->handle);
    memcpy(req->handle, &op, sizeof op);
    req->peer = peer;
    req->bytes = bytes;
    req->active = 1;
}

static gvqResult_t check_size(size_t bytes) {
    if (bytes > INT_MAX) {
        GVQ_WARN("mpi transport: a %zu-byte message exceeds one MPI message", bytes);
        return gvqInternalError;
    }
    return gvqSuccess;
}

/* Whether [buf, buf + bytes) lies in the library memory the transport was given. */
static int is_own_mem(const gvq_transport_t *t, const void *buf, size_t bytes) {
    if (t->own_mem == NULL || *t->own_mem == NULL || bytes == 0) return 0;
    uintptr_t lo = (uintptr_t)*t->own_mem, p = (uintptr_t)buf;
    return p >= lo && bytes <= *t->own_mem_bytes && p - lo <= *t->own_mem_bytes - bytes;
}

static gvqResult_t mpi_isend(gvq_transport_t *t, int peer, int tag, const void *buf, size_t bytes,
                             gvq_req_t *req) {
    mpi_impl_t *m = t->impl;
    GVQCHECK(check_size(bytes));
    mpi_op_t *op = op_get(m);
    if (op == NULL) return gvqSystemError;
    op->kind = OP_SEND;
    op->direct = !m->send_copy || is_own_mem(t, buf, bytes);
    if (op->direct) { /* library memory, kept after a failure, or GVQ_SEND_COPY=0: no copy */
        int rc = MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, m->comm, &op->r);
        if (rc != MPI_SUCCESS) {
            op_put(m, op);
            MPICHECK(rc, "mpi send");
        }
        req_fill(req, op, peer, bytes);
        return gvqSuccess;
    }
    if (op->cap < bytes) { /* the staged copy: the caller's buffer is free once the call returns */
        void *grown = realloc(op->stage, bytes);
        if (grown == NULL) {
            op_put(m, op);
            GVQ_WARN("mpi transport: cannot stage a %zu-byte send", bytes);
            return gvqSystemError;
        }
        op->stage = grown;
        op->cap = bytes;
    }
    if (bytes) memcpy(op->stage, buf, bytes);
    int rc = MPI_Isend(op->stage, (int)bytes, MPI_BYTE, peer, tag, m->comm, &op->r);
    if (rc != MPI_SUCCESS) {
        op_put(m, op);
        MPICHECK(rc, "mpi send");
    }
    req_fill(req, op, peer, bytes);
    return gvqSuccess;
}

static gvqResult_t post_recv(gvq_transport_t *t, int peer, int tag, void *buf, size_t bytes,
                             int upto, gvq_req_t *req) {
    mpi_impl_t *m = t->impl;
    GVQCHECK(check_size(bytes));
    mpi_op_t *op = op_get(m);
    if (op == NULL) return gvqSystemError;
    op->kind = OP_RECV_WAIT;
    op->upto = upto;
    op->peer = peer;
    op->tag = tag;
    op->buf = buf;
    op->bytes = bytes;
    mpi_op_t **pp = &m->waiting; /* MPI's order: receives match in the order posted */
    while (*pp != NULL)
        pp = &(*pp)->next;
    *pp = op;
    req_fill(req, op, peer, bytes);
    return gvqSuccess;
}

static gvqResult_t mpi_irecv(gvq_transport_t *t, int peer, int tag, void *buf, size_t bytes,
                             gvq_req_t *req) {
    return post_recv(t, peer, tag, buf, bytes, 0, req);
}

static gvqResult_t mpi_irecv_upto(gvq_transport_t *t, int peer, int tag, void *buf, size_t bytes,
                                  gvq_req_t *req) {
    return post_recv(t, peer, tag, buf, bytes, 1, req);
}

static void unlink_waiting(mpi_impl_t *m, mpi_op_t *op) {
    for (mpi_op_t **pp = &m->waiting; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == op) {
            *pp = op->next;
            op->next = NULL;
            return;
        }
    }
}

/* Match the oldest waiting receive `op` to the next message of its peer and tag, if one has
 * come: an exact size is received into the caller's buffer, another is drained. 1 when
 * matched. */
static gvqResult_t match_one(gvq_transport_t *t, mpi_op_t *op, int *matched) {
    mpi_impl_t *m = t->impl;
    MPI_Message msg;
    MPI_Status st;
    int flag = 0, got = 0;
    *matched = 0;
    MPICHECK(MPI_Improbe(op->peer, op->tag, m->comm, &flag, &msg, &st), "mpi receive");
    if (!flag) return gvqSuccess;
    *matched = 1;
    unlink_waiting(m, op);
    MPI_Get_count(&st, MPI_BYTE, &got);
    if (got >= 0 && ((size_t)got == op->bytes || (op->upto && (size_t)got < op->bytes))) {
        op->kind = OP_RECV_DATA;
        op->got = got;
        MPICHECK(MPI_Imrecv(op->buf, got, MPI_BYTE, &msg, &op->r), "mpi receive");
        return gvqSuccess;
    }
    /* the wrong size: take the message off the queue (so that no later receive pairs with it)
     * into a buffer of its own, never into the caller's */
    op->kind = OP_RECV_BAD;
    op->got = got;
    mpi_op_t *drain = calloc(1, sizeof *drain);
    void *sink = malloc(got > 0 ? (size_t)got : 1);
    if (drain == NULL || sink == NULL ||
        MPI_Imrecv(sink, got, MPI_BYTE, &msg, &drain->r) != MPI_SUCCESS) {
        free(drain); /* the message stays matched and unreceived: harmless, the comm is failing */
        free(sink);
        return gvqSuccess;
    }
    drain->kind = OP_DRAIN;
    drain->stage = sink;
    drain->cap = got > 0 ? (size_t)got : 1;
    gvq_mpi_quarantine_add(t, drain);
    return gvqSuccess;
}

/* Bring `op` (waiting) up to date: the receives posted before it for the same peer and tag
 * take their messages first. */
static gvqResult_t match_in_order(gvq_transport_t *t, mpi_op_t *op) {
    mpi_op_t *e = ((mpi_impl_t *)t->impl)->waiting;
    while (e != NULL) {
        mpi_op_t *next = e->next; /* read first: matching unlinks e */
        if (e == op || (e->peer == op->peer && e->tag == op->tag)) {
            int matched = 0;
            GVQCHECK(match_one(t, e, &matched));
            if (!matched || e == op) break;
        }
        e = next;
    }
    return gvqSuccess;
}

/* While the caller waits on something else (a send), the waiting receives take the messages
 * that came, oldest first per peer and tag: a receive is matched only when tested, and a
 * rendezvous send of the peer's can finish only once it is (without this, a send waited on
 * before its receive would hold both ranks). One probe per peer and tag. */
static gvqResult_t progress_waiting(gvq_transport_t *t) {
    enum { MAX_PAIRS = 8 };
    int dry_peer[MAX_PAIRS], dry_tag[MAX_PAIRS], ndry = 0;
    mpi_op_t *e = ((mpi_impl_t *)t->impl)->waiting;
    while (e != NULL && ndry < MAX_PAIRS) {
        mpi_op_t *next = e->next;
        int dry = 0;
        for (int i = 0; i < ndry && !dry; i++)
            dry = dry_peer[i] == e->peer && dry_tag[i] == e->tag;
        if (!dry) {
            int matched = 0;
            GVQCHECK(match_one(t, e, &matched));
            if (!matched) {
                dry_peer[ndry] = e->peer;
                dry_tag[ndry++] = e->tag;
            }
        }
        e = next;
    }
    return gvqSuccess;
}

_Static_assert(sizeof(mpi_op_t *) <= sizeof(((gvq_req_t *)0)->handle), "an op fits a handle");

static gvqResult_t mpi_test(gvq_transport_t *t, gvq_req_t *req, int *done) {
    mpi_impl_t *m = t->impl;
    mpi_op_t *op = req_op(req);
    *done = 0;
    if (op->kind == OP_RECV_WAIT) {
        GVQCHECK(match_in_order(t, op));
        if (op->kind == OP_RECV_WAIT) return gvqSuccess;
    }
    if (op->kind == OP_RECV_BAD) {
        GVQ_WARN("mpi transport: the message from peer %d has %d bytes, this rank's receive "
                 "expects %s%zu (mismatched calls on the ranks?); it was discarded",
                 op->peer, op->got, op->upto ? "at most " : "", op->bytes);
        req->active = 0;
        *done = 1;
        op_put(m, op);
        return gvqRemoteError;
    }
    int flag = 0;
    int rc = MPI_Test(&op->r, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
        GVQ_WARN("mpi transport: %s with peer %d failed (MPI error %d)",
                 op->kind == OP_SEND   ? "send"
                 : op->kind == OP_COLL ? "allgatherv"
                                       : "receive",
                 req->peer, rc);
        req->active = 0;
        *done = 1;
        gvq_mpi_note_failure(t);
        gvq_mpi_quarantine_add(t, op); /* MPI may still hold it */
        return gvqRemoteError;
    }
    if (!flag) return op->kind == OP_RECV_DATA ? gvqSuccess : progress_waiting(t);
    if (op->kind == OP_RECV_DATA) req->bytes = (size_t)op->got;
    req->active = 0;
    *done = 1;
    op_put(m, op);
    return gvqSuccess;
}

/* How long a receive that already matched its message may take to finish when its call gives
 * up: with a single-copy transport it finishes without the sender. */
#define MATCHED_GRACE_NS 200000000ull

static void mpi_cancel(gvq_transport_t *t, gvq_req_t *req) {
    mpi_impl_t *m = t->impl;
    mpi_op_t *op = req_op(req);
    req->active = 0;
    gvq_mpi_note_failure(t);
    switch (op->kind) {
    case OP_RECV_WAIT: /* nothing was posted */
        unlink_waiting(m, op);
        op_put(m, op);
        return;
    case OP_RECV_BAD:
        op_put(m, op);
        return;
    case OP_RECV_DATA: {
        uint64_t t0 = gvq_now_ns();
        int flag = 0;
        while (MPI_Test(&op->r, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag &&
               gvq_now_ns() - t0 < MATCHED_GRACE_NS)
            sched_yield();
        if (flag) {
            op_put(m, op);
            return;
        }
        GVQ_WARN("mpi transport: a %zu-byte receive from rank %d had matched its message but "
                 "did not finish within %llu ms of the failure; MPI may still write it",
                 op->bytes, op->peer, (unsigned long long)(MATCHED_GRACE_NS / 1000000ull));
        gvq_mpi_quarantine_add(t, op);
        return;
    }
    case OP_COLL:
        /* a non-blocking collective cannot be cancelled or freed (MPI-3.1 3.7.3): abandon it
         * with its count arrays */
        m->coll_counts = NULL;
        gvq_mpi_quarantine_add(t, op);
        return;
    case OP_SEND: {
        int flag = 0;
        if (MPI_Test(&op->r, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
            op_put(m, op);
            return;
        }
        /* sends cannot be cancelled: a staged one keeps its copy; a direct one reads own_mem,
         * which the communicator keeps once it is marked broken (or, with GVQ_SEND_COPY=0,
         * the caller's buffer, which the caller was told to keep) */
        if (op->direct) gvq_broken_set(t->broken, gvqRemoteError);
        gvq_mpi_quarantine_add(t, op);
        return;
    }
    case OP_DRAIN:
        break;
    }
}

static void mpi_destroy(gvq_transport_t *t) {
    mpi_impl_t *m = t->impl;
    int fin = 0;
    MPI_Finalized(&fin);
    int failed = m->failed || gvq_broken_get(t->broken) != gvqSuccess;
    /* broken by anything (a transfer here, or the shared-memory agreement, which never touched
     * MPI): a peer may be stuck, so MPI_Finalize at exit must be bounded */
    if (failed) gvq_mpi_note_failure(t);
    gvq_mpi_track(t, 0);
    /* a failed communicator stays: freeing it would let MPI give its context id to a new
     * communicator, whose receives would then match the late messages of this one */
    if (!fin && !failed) MPI_Comm_free(&m->comm); /* local in Open MPI: never waits on peers */
    op_free_all(m->waiting);
    op_free_all(m->free_ops);
    if (!failed) free(m->coll_counts);
    free(m);
    free(t);
}

static gvqResult_t mpi_iallgatherv(gvq_transport_t *t, void *blocks, const size_t *displ,
                                   const size_t *blen, gvq_req_t *req) {
    mpi_impl_t *m = t->impl;
    int n = t->nranks;
    if (m->coll_counts == NULL) m->coll_counts = malloc(2 * (size_t)n * sizeof(int));
    if (m->coll_counts == NULL) return gvqSystemError;
    for (int p = 0; p < n; p++) {
        if (blen[p] > INT_MAX || displ[p] > INT_MAX) {
            GVQ_WARN("mpi transport: allgatherv block %d of %zu bytes at %zu exceeds MPI's int "
                     "counts",
                     p, blen[p], displ[p]);
            return gvqInternalError;
        }
        m->coll_counts[p] = (int)blen[p];
        m->coll_counts[n + p] = (int)displ[p];
    }
    mpi_op_t *op = op_get(m);
    if (op == NULL) return gvqSystemError;
    op->kind = OP_COLL;
    int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, blocks, m->coll_counts,
                             m->coll_counts + n, MPI_BYTE, m->comm, &op->r);
    if (rc != MPI_SUCCESS) {
        op_put(m, op);
        MPICHECK(rc, "mpi allgatherv");
    }
    req_fill(req, op, -1, 0);
    return gvqSuccess;
}

static void mpi_progress(gvq_transport_t *t) {
    int flag = 0; /* any MPI call drives Open MPI's progress engine; a probe changes nothing */
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, ((mpi_impl_t *)t->impl)->comm, &flag,
               MPI_STATUS_IGNORE);
}

static const gvq_transport_ops_t mpi_ops = {
    .size = sizeof(gvq_transport_ops_t),
    .name = "mpi",
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .irecv_upto = mpi_irecv_upto,
    .progress = mpi_progress,
    .test = mpi_test,
    .cancel = mpi_cancel,
    .destroy = mpi_destroy,
    .iallgatherv = mpi_iallgatherv,
};

gvqResult_t gvq_mpi_wrap(MPI_Comm comm, gvq_transport_t **out) {
    gvq_transport_t *t = calloc(1, sizeof *t);
    mpi_impl_t *m = calloc(1, sizeof *m);
    if (t == NULL || m == NULL) {
        free(t);
        free(m);
        MPI_Comm_free(&comm);
        return gvqSystemError;
    }
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    m->comm = comm;
    m->send_copy = gvq_param(GVQ_PARAM_SEND_COPY) != 0;
    t->stages_sends = m->send_copy;
    t->ops = &mpi_ops;
    t->impl = m;
    t->cancel_keeps_buffers = 1;
    int level = 0;
    MPI_Query_thread(&level);
    t->concurrent = level == MPI_THREAD_MULTIPLE;
    MPI_Comm_rank(comm, &t->rank);
    MPI_Comm_size(comm, &t->nranks);
    gvq_mpi_track(t, 1);
    *out = t;
    return gvqSuccess;
}
