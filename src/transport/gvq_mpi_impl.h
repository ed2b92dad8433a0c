/*
 * gvq_mpi_impl.h -- what the Open MPI transport's files share (mpi.c the requests and the
 * communicators, mpi_process.c MPI's start and end in the process and the quarantine).
 */
#ifndef GVQ_MPI_IMPL_H_
#define GVQ_MPI_IMPL_H_

#include <mpi.h>

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

/* What one request is doing. */
typedef enum {
    OP_SEND,      /* MPI_Isend from buf, the staged copy */
    OP_RECV_WAIT, /* waiting for its message: nothing posted in MPI, in the probe queue */
    OP_RECV_DATA, /* matched, MPI_Imrecv into the caller's buffer */
    OP_RECV_BAD,  /* matched a message of the wrong size (drained): fails when tested */
    OP_DRAIN,     /* quarantined: MPI_Imrecv of a wrong-size message into buf, its own */
    OP_COLL       /* the native allgatherv */
} op_kind_t;

/* The transport's state of one request (gvq_req_t.handle[0] points at it). */
typedef struct mpi_op {
    struct mpi_op *next; /* probe queue, free list or quarantine */
    op_kind_t kind;
    int peer, tag;
    void *buf;   /* receive: the caller's buffer */
    void *stage; /* send: the staged copy; drain: the message (cap bytes, owned by the op) */
    size_t cap;
    size_t bytes; /* expected (receive) or sent */
    int got;      /* OP_RECV_BAD, upto: the message's size */
    int upto;     /* receive: any size up to `bytes` (irecv_upto) */
    int direct;   /* OP_SEND from the transport's own_mem, not staged */
    MPI_Request r;
} mpi_op_t;

typedef struct {
    MPI_Comm comm;
    int *coll_counts;   /* 2 x nranks ints: counts, displacements of the native allgatherv, */
                        /* which MPI reads until the request completes */
    mpi_op_t *waiting;  /* receives waiting for their message, oldest first */
    mpi_op_t *free_ops; /* recycled ops, with their staged copies */
    int failed;         /* a request was given up: the communicator is quarantined */
    int send_copy;      /* GVQ_SEND_COPY: stage sends from the caller's memory */
} mpi_impl_t;

/* mpi.c: the transport on comm (taken over; freed on failure). */
gvqResult_t gvq_mpi_wrap(MPI_Comm comm, gvq_transport_t **out);

/* mpi_process.c: keep op (and what MPI may still write into) until the process ends, and mark
 * t failed; note that t gave up on a transfer (the bound of the finalization at exit). */
void gvq_mpi_quarantine_add(gvq_transport_t *t, mpi_op_t *op);
void gvq_mpi_note_failure(gvq_transport_t *t);
/* A communicator gave up after timeout_ns: MPI_Finalize at exit waits at most that long. */
void gvq_mpi_bound_exit(uint64_t timeout_ns);
/* The MPI transports alive (on: made, off: destroyed): at exit, one whose communicator broke
 * bounds MPI_Finalize as a failure does, even when it was never destroyed. */
void gvq_mpi_track(gvq_transport_t *t, int on);

#endif /* GVQ_MPI_IMPL_H_ */
