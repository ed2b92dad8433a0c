/*
 * mpi.c -- the Open MPI transport: non-blocking point-to-point on a communicator of gvq's own
 * (a duplicate, or one made from the bootstrap's table with MPI_Comm_create_group, which only
 * the member ranks call). Errors return (MPI_ERRORS_RETURN) and become gvqRemoteError.
 *
 * If the program did not initialize MPI, gvq does (MPI_THREAD_MULTIPLE) and finalizes it at
 * exit.
 */
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>

#include "gvq_transport.h"

#define MPICHECK(call, what)                                      \
    do {                                                          \
        int mpi_rc_ = (call);                                     \
        if (mpi_rc_ != MPI_SUCCESS) {                             \
            char mpi_msg_[MPI_MAX_ERROR_STRING];                  \
            int mpi_len_ = 0;                                     \
            MPI_Error_string(mpi_rc_, mpi_msg_, &mpi_len_);       \
            GVQ_WARN("%s: %s failed: %s", what, #call, mpi_msg_); \
            return gvqRemoteError;                                \
        }                                                         \
    } while (0)

enum { REQ_SEND = 1, REQ_RECV = 2, REQ_COLL = 3 };

typedef struct {
    MPI_Comm comm;
    int *coll_counts; /* 2 x nranks ints: counts, displacements of the native allgatherv, which */
                      /* MPI reads until the request completes */
} mpi_impl_t;

static int gvq_started_mpi;

static void mpi_finalize_at_exit(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}

gvqResult_t gvq_mpi_ensure_init(int *world_rank, int *world_size) {
    int inited = 0, fin = 0;
    MPI_Finalized(&fin);
    if (fin) {
        GVQ_WARN("MPI was already finalized; gvq needs it for its transport");
        return gvqInvalidUsage;
    }
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
            GVQ_WARN("MPI_Init_thread failed");
            return gvqSystemError;
        }
        gvq_started_mpi = 1;
        atexit(mpi_finalize_at_exit);
        GVQ_INFO("gvq initialized MPI (thread level %d)", provided);
    } else {
        int level = 0;
        MPI_Query_thread(&level);
        if (level < MPI_THREAD_SERIALIZED)
            GVQ_INFO("MPI thread level %d: call gvq from the thread that initialized MPI", level);
    }
    MPICHECK(MPI_Comm_rank(MPI_COMM_WORLD, world_rank), "MPI init");
    MPICHECK(MPI_Comm_size(MPI_COMM_WORLD, world_size), "MPI init");
    return gvqSuccess;
}

/* Post one nonblocking send or receive of `bytes` raw bytes and fill req. */
static gvqResult_t mpi_post(gvq_transport_t *t, int send, int peer, int tag, void *buf,
                            size_t bytes, gvq_req_t *req) {
    mpi_impl_t *m = t->impl;
    MPI_Request r;
    if (bytes > INT_MAX) {
        GVQ_WARN("mpi transport: a %zu-byte message exceeds one MPI message", bytes);
        return gvqInternalError;
    }
    if (send)
        MPICHECK(MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, m->comm, &r), "mpi send");
    else
        MPICHECK(MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, m->comm, &r), "mpi recv");
    memcpy(req->handle, &r, sizeof r);
    req->handle[1] = send ? REQ_SEND : REQ_RECV;
    req->peer = peer;
    req->bytes = bytes;
    req->active = 1;
    return gvqSuccess;
}

static gvqResult_t mpi_isend(gvq_transport_t *t, int peer, int tag, const void *buf, size_t bytes,
                             gvq_req_t *req) {
    return mpi_post(t, 1, peer, tag, (void *)buf, bytes, req);
}

static gvqResult_t mpi_irecv(gvq_transport_t *t, int peer, int tag, void *buf, size_t bytes,
                             gvq_req_t *req) {
    return mpi_post(t, 0, peer, tag, buf, bytes, req);
}

_Static_assert(sizeof(MPI_Request) <= sizeof(uint64_t), "MPI_Request does not fit a handle");

static gvqResult_t mpi_test(gvq_transport_t *t, gvq_req_t *req, int *done) {
    (void)t;
    MPI_Request r;
    MPI_Status st;
    int flag = 0;
    memcpy(&r, req->handle, sizeof r);
    int rc = MPI_Test(&r, &flag, &st);
    memcpy(req->handle, &r, sizeof r);
    if (rc != MPI_SUCCESS) {
        req->active = 0;
        *done = 1;
        GVQ_WARN("mpi transport: %s with peer %d failed (MPI error %d)",
                 req->handle[1] == REQ_SEND ? "send" : "receive", req->peer, rc);
        return gvqRemoteError;
    }
    *done = flag;
    if (!flag) return gvqSuccess;
    req->active = 0;
    if (req->handle[1] == REQ_RECV) {
        int got = 0;
        MPI_Get_count(&st, MPI_BYTE, &got);
        if ((size_t)got != req->bytes) {
            GVQ_WARN("mpi transport: message from rank %d has %d bytes, expected %zu "
                     "(mismatched calls on the ranks?)",
                     req->peer, got, req->bytes);
            return gvqRemoteError;
        }
    }
    return gvqSuccess;
}

static void mpi_cancel(gvq_transport_t *t, gvq_req_t *req) {
    MPI_Request r;
    memcpy(&r, req->handle, sizeof r);
    if (req->handle[1] == REQ_COLL) {
        /* a non-blocking collective cannot be cancelled or freed (MPI-3.1 3.7.3): abandon it
         * with its count arrays; the communicator is broken by now */
        ((mpi_impl_t *)t->impl)->coll_counts = NULL;
    } else if (req->handle[1] == REQ_RECV) {
        /* a cancelled receive completes at once; a matched one has finished writing */
        MPI_Cancel(&r);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
    } else if (r != MPI_REQUEST_NULL) {
        MPI_Request_free(&r); /* the send may still complete in the background */
    }
    req->active = 0;
}

static void mpi_destroy(gvq_transport_t *t) {
    mpi_impl_t *m = t->impl;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Comm_free(&m->comm); /* local in Open MPI: never waits on peers */
    free(m->coll_counts);
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
    MPI_Request r;
    MPICHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, blocks, m->coll_counts,
                             m->coll_counts + n, MPI_BYTE, m->comm, &r),
             "mpi allgatherv");
    memcpy(req->handle, &r, sizeof r);
    req->handle[1] = REQ_COLL;
    req->peer = -1;
    req->bytes = 0;
    req->active = 1;
    return gvqSuccess;
}

static const gvq_transport_ops_t mpi_ops = {
    .size = sizeof(gvq_transport_ops_t),
    .name = "mpi",
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .test = mpi_test,
    .cancel = mpi_cancel,
    .destroy = mpi_destroy,
    .iallgatherv = mpi_iallgatherv,
};

static gvqResult_t mpi_wrap(MPI_Comm comm, gvq_transport_t **out) {
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
    t->ops = &mpi_ops;
    t->impl = m;
    t->cancel_keeps_buffers = 1;
    MPI_Comm_rank(comm, &t->rank);
    MPI_Comm_size(comm, &t->nranks);
    *out = t;
    return gvqSuccess;
}

gvqResult_t gvq_mpi_transport_from_world(const int *world_ranks, int nranks, int rank, int tag,
                                         gvq_transport_t **t) {
    MPI_Group world, group;
    MPI_Comm comm = MPI_COMM_NULL;
    MPICHECK(MPI_Comm_group(MPI_COMM_WORLD, &world), "gvqCommInitRank");
    int rc = MPI_Group_incl(world, nranks, world_ranks, &group);
    MPI_Group_free(&world);
    MPICHECK(rc, "gvqCommInitRank");
    /* collective over the members only, so a subset of the job can build a communicator */
    rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &comm);
    MPI_Group_free(&group);
    MPICHECK(rc, "gvqCommInitRank");
    GVQCHECK(mpi_wrap(comm, t));
    if ((*t)->rank != rank || (*t)->nranks != nranks) {
        GVQ_WARN("gvqCommInitRank: MPI placed rank %d of %d at %d of %d", rank, nranks, (*t)->rank,
                 (*t)->nranks);
        mpi_destroy(*t);
        return gvqInternalError;
    }
    return gvqSuccess;
}

gvqResult_t gvq_mpi_transport_dup(const void *mpi_comm, gvq_transport_t **t) {
    MPI_Comm dup;
    MPICHECK(MPI_Comm_dup(*(const MPI_Comm *)mpi_comm, &dup), "gvqCommInitMPI");
    return mpi_wrap(dup, t);
}
