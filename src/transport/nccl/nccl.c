/*
 * nccl.c -- the NCCL backend: a NCCL communicator beside a gvq one, its native collectives for
 * CUDA buffers, and a transport whose sends and receives are grouped ncclSend/ncclRecv.
 *
 *   ring (src/algorithms/ring.c)        transport (this file)                    GPU
 *   irecv / isend ... (queued)  ->  pending list
 *   test (first after posting)  ->  event on compute stream, comm stream waits on it,
 *                                   ncclGroupStart; ncclRecv/ncclSend...; ncclGroupEnd;
 *                                   event behind the group on the comm stream       -> kernels
 *   test / wait loop            ->  cudaEventQuery on that event; ncclCommGetAsyncError
 *
 * Grouping is what keeps a ring exchange from deadlocking: every rank's send to its right and
 * receive from its left are one NCCL group. A request cannot be cancelled once issued; cancel
 * forgets it, and a broken communicator aborts the NCCL communicator at destroy.
 */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "gvq_cuda_check.h" /* CUDACHECK */
#include "gvq_device.h"
#include "gvq_nccl.h"

_Static_assert(sizeof(ncclUniqueId) == GVQ_NCCL_ID_BYTES, "NCCL unique id size");

/* A failed NCCL call: logged with NCCL's own text, mapped to gvq's result. */
static gvqResult_t nccl_fail(ncclResult_t r, const char *what) {
    GVQ_WARN("NCCL: %s failed: %s (%s)", what, ncclGetErrorString(r), ncclGetLastError(NULL));
    return r == ncclUnhandledCudaError ? gvqUnhandledCudaError
           : r == ncclRemoteError      ? gvqRemoteError
           : r == ncclSystemError      ? gvqSystemError
           : r == ncclInvalidArgument  ? gvqInvalidArgument
           : r == ncclInvalidUsage     ? gvqInvalidUsage
                                       : gvqInternalError;
}

#define NCCLCHECK(call)                                     \
    do {                                                    \
        ncclResult_t r_ = (call);                           \
        if (r_ != ncclSuccess) return nccl_fail(r_, #call); \
    } while (0)

struct gvq_nccl {
    ncclComm_t comm;
    int rank, nranks;
};

gvqResult_t gvq_nccl_get_id(void *id) {
    ncclUniqueId u;
    NCCLCHECK(ncclGetUniqueId(&u));
    memcpy(id, &u, sizeof u);
    return gvqSuccess;
}

gvqResult_t gvq_nccl_init(const void *id, int nranks, int rank, gvq_nccl_t **out) {
    gvq_nccl_t *n = calloc(1, sizeof *n);
    if (n == NULL) return gvqSystemError;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclResult_t r = ncclCommInitRank(&n->comm, nranks, u, rank);
    if (r != ncclSuccess) {
        GVQ_WARN("NCCL: ncclCommInitRank(nranks=%d, rank=%d) failed: %s (%s)", nranks, rank,
                 ncclGetErrorString(r), ncclGetLastError(NULL));
        free(n);
        return r == ncclInvalidUsage ? gvqInvalidUsage : gvqUnhandledCudaError;
    }
    n->rank = rank;
    n->nranks = nranks;
    *out = n;
    return gvqSuccess;
}

void gvq_nccl_destroy(gvq_nccl_t *n, int abort) {
    if (n == NULL) return;
    if (abort)
        ncclCommAbort(n->comm);
    else
        ncclCommDestroy(n->comm);
    free(n);
}

static ncclDataType_t nccl_type(gvqDataType_t t) {
    static const ncclDataType_t map[gvqNumTypes] = {
        [gvqInt8] = ncclInt8,         [gvqUint8] = ncclUint8,     [gvqInt32] = ncclInt32,
        [gvqUint32] = ncclUint32,     [gvqInt64] = ncclInt64,     [gvqUint64] = ncclUint64,
        [gvqFloat16] = ncclFloat16,   [gvqFloat32] = ncclFloat32, [gvqFloat64] = ncclFloat64,
        [gvqBfloat16] = ncclBfloat16,
    };
    return map[t];
}

static ncclRedOp_t nccl_op(gvqRedOp_t op) {
    static const ncclRedOp_t map[gvqNumOps] = {
        [gvqSum] = ncclSum, [gvqProd] = ncclProd, [gvqMax] = ncclMax,
        [gvqMin] = ncclMin, [gvqAvg] = ncclAvg,
    };
    return map[op];
}

gvqResult_t gvq_nccl_collective(gvq_nccl_t *n, gvq_nccl_coll_t kind, const void *send, void *recv,
                                size_t count, gvqDataType_t dtype, gvqRedOp_t op, int root,
                                void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    ncclDataType_t t = nccl_type(dtype);
    /* gvqAvg sums, then divides once (gvq.h). ncclAvg does that for integers but pre-multiplies
     * each input by 1/N for float types, in the element type (fp16 subnormals lose bits), so
     * float averages are a sum followed by gvq's own divide on the same stream. */
    int post_divide = op == gvqAvg && (dtype == gvqFloat16 || dtype == gvqBfloat16 ||
                                       dtype == gvqFloat32 || dtype == gvqFloat64);
    ncclRedOp_t o = post_divide ? ncclSum : nccl_op(op);
    size_t divided = 0;
    switch (kind) {
    case GVQ_NCCL_ALLREDUCE:
        NCCLCHECK(ncclAllReduce(send, recv, count, t, o, n->comm, s));
        divided = count;
        break;
    case GVQ_NCCL_BROADCAST:
        NCCLCHECK(ncclBroadcast(send, recv, count, t, root, n->comm, s));
        break;
    case GVQ_NCCL_REDUCE:
        NCCLCHECK(ncclReduce(send, recv, count, t, o, root, n->comm, s));
        divided = n->rank == root ? count : 0;
        break;
    case GVQ_NCCL_REDUCE_SCATTER:
        NCCLCHECK(ncclReduceScatter(send, recv, count, t, o, n->comm, s));
        divided = count;
        break;
    case GVQ_NCCL_ALLGATHER:
        NCCLCHECK(ncclAllGather(send, recv, count, t, n->comm, s));
        break;
    default:
        return gvqInternalError;
    }
    if (post_divide && divided > 0)
        return gvq_cuda_divide_on(recv, divided, dtype, n->nranks, stream);
    return gvqSuccess;
}

/* ---- the transport ------------------------------------------------------------------------- */

typedef struct {
    cudaEvent_t done;
    int refs; /* requests still holding the batch */
} batch_t;

typedef struct {
    int send;
    int peer;
    void *buf;
    size_t bytes;
    gvq_req_t *req;
} pending_t;

typedef struct {
    gvq_nccl_t *n;
    cudaStream_t stream; /* communication stream */
    cudaEvent_t compute_ready;
    pending_t *pend;
    size_t npend, cap;
    int abort_flag; /* used until a communicator adopts the transport */
    gvqResult_t broken;
} nccl_xport_t;

static gvqResult_t nx_post(gvq_transport_t *t, int send, int peer, void *buf, size_t bytes,
                           gvq_req_t *req) {
    nccl_xport_t *x = t->impl;
    if (x->npend == x->cap) {
        size_t cap = x->cap ? 2 * x->cap : 16;
        pending_t *p = realloc(x->pend, cap * sizeof *p);
        if (p == NULL) return gvqSystemError;
        x->pend = p;
        x->cap = cap;
    }
    x->pend[x->npend++] = (pending_t){send, peer, buf, bytes, req};
    memset(req, 0, sizeof *req);
    req->bytes = bytes;
    req->peer = peer;
    req->active = 1;
    return gvqSuccess;
}

static gvqResult_t nx_isend(gvq_transport_t *t, int peer, int tag, const void *buf, size_t bytes,
                            gvq_req_t *req) {
    (void)tag;
    return nx_post(t, 1, peer, (void *)buf, bytes, req);
}

static gvqResult_t nx_irecv(gvq_transport_t *t, int peer, int tag, void *buf, size_t bytes,
                            gvq_req_t *req) {
    (void)tag;
    return nx_post(t, 0, peer, buf, bytes, req);
}

/* The pending transfers as one group on the communication stream, behind the compute stream,
 * and `done` recorded after them. The group is closed even when a call in it fails: an open
 * group would defer every later NCCL call of this thread. */
static gvqResult_t issue_group(nccl_xport_t *x, cudaEvent_t done) {
    CUDACHECK(cudaEventRecord(x->compute_ready, (cudaStream_t)gvq_cuda_current_stream()));
    CUDACHECK(cudaStreamWaitEvent(x->stream, x->compute_ready, 0));
    NCCLCHECK(ncclGroupStart());
    ncclResult_t r = ncclSuccess;
    for (size_t i = 0; r == ncclSuccess && i < x->npend; i++) {
        pending_t *p = &x->pend[i];
        r = p->send ? ncclSend(p->buf, p->bytes, ncclUint8, p->peer, x->n->comm, x->stream)
                    : ncclRecv(p->buf, p->bytes, ncclUint8, p->peer, x->n->comm, x->stream);
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r != ncclSuccess || r2 != ncclSuccess)
        return nccl_fail(r != ncclSuccess ? r : r2, "grouped ncclSend/ncclRecv");
    CUDACHECK(cudaEventRecord(done, x->stream));
    return gvqSuccess;
}

static gvqResult_t event_new(cudaEvent_t *e) {
    CUDACHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    return gvqSuccess;
}

/* Issue everything pending as one batch. On failure the batch is freed and the pending list
 * dropped, so nothing is issued twice (nx_test reports the dropped requests). */
static gvqResult_t nx_flush(nccl_xport_t *x) {
    if (x->npend == 0) return gvqSuccess;
    batch_t *b = calloc(1, sizeof *b);
    gvqResult_t res = b != NULL ? event_new(&b->done) : gvqSystemError;
    if (res == gvqSuccess) {
        res = issue_group(x, b->done);
        if (res != gvqSuccess) cudaEventDestroy(b->done);
    }
    if (res != gvqSuccess) {
        free(b);
        x->npend = 0;
        return res;
    }
    for (size_t i = 0; i < x->npend; i++) {
        x->pend[i].req->handle[0] = (uint64_t)(uintptr_t)b;
        b->refs++;
    }
    x->npend = 0;
    return gvqSuccess;
}

static void batch_release(batch_t *b) {
    if (b != NULL && --b->refs == 0) {
        cudaEventDestroy(b->done);
        free(b);
    }
}

static gvqResult_t nx_test(gvq_transport_t *t, gvq_req_t *req, int *done) {
    nccl_xport_t *x = t->impl;
    *done = 0;
    if (!req->active) {
        *done = 1;
        return gvqSuccess;
    }
    GVQCHECK(nx_flush(x));
    batch_t *b = (batch_t *)(uintptr_t)req->handle[0];
    if (b == NULL) { /* dropped by a flush that failed */
        req->active = 0;
        GVQ_WARN("NCCL transport: transfer with peer %d was dropped by an earlier failure",
                 req->peer);
        return gvqInternalError;
    }
    cudaError_t e = cudaEventQuery(b->done);
    if (e == cudaSuccess) {
        req->active = 0;
        req->handle[0] = 0;
        batch_release(b);
        *done = 1;
        return gvqSuccess;
    }
    if (e != cudaErrorNotReady) {
        GVQ_WARN("NCCL transport: transfer with peer %d failed: %s", req->peer,
                 cudaGetErrorString(e));
        return gvqUnhandledCudaError;
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(x->n->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
        GVQ_WARN("NCCL transport: transfer with peer %d failed: %s", req->peer,
                 ncclGetErrorString(async));
        return gvqRemoteError;
    }
    return gvqSuccess;
}

static void nx_cancel(gvq_transport_t *t, gvq_req_t *req) {
    nccl_xport_t *x = t->impl;
    if (!req->active) return;
    req->active = 0;
    if (req->handle[0] == 0) { /* still pending: never issue it (the caller may free req) */
        for (size_t i = 0; i < x->npend; i++)
            if (x->pend[i].req == req) {
                memmove(&x->pend[i], &x->pend[i + 1], (x->npend - i - 1) * sizeof *x->pend);
                x->npend--;
                break;
            }
        return;
    }
    batch_release((batch_t *)(uintptr_t)req->handle[0]);
    req->handle[0] = 0;
}

static void nx_destroy(gvq_transport_t *t) {
    nccl_xport_t *x = t->impl;
    if (x != NULL) {
        if (gvq_broken_get(t->broken) == gvqSuccess) cudaStreamSynchronize(x->stream);
        cudaEventDestroy(x->compute_ready);
        cudaStreamDestroy(x->stream);
        free(x->pend);
        free(x);
    }
    free(t);
}

static const gvq_transport_ops_t nccl_transport_ops = {
    .size = sizeof(gvq_transport_ops_t),
    .name = "nccl",
    .isend = nx_isend,
    .irecv = nx_irecv,
    .test = nx_test,
    .cancel = nx_cancel,
    .destroy = nx_destroy,
    .iallgatherv = gvq_xport_iallgatherv_unsupported,
};

gvqResult_t gvq_nccl_transport_create(gvq_nccl_t *n, gvq_transport_t **out) {
    gvq_transport_t *t = calloc(1, sizeof *t);
    nccl_xport_t *x = calloc(1, sizeof *x);
    if (t == NULL || x == NULL) {
        free(t);
        free(x);
        return gvqSystemError;
    }
    x->n = n;
    if (cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&x->compute_ready, cudaEventDisableTiming) != cudaSuccess) {
        GVQ_WARN("NCCL transport: cannot create the communication stream: %s",
                 cudaGetErrorString(cudaGetLastError()));
        if (x->stream) cudaStreamDestroy(x->stream);
        free(t);
        free(x);
        return gvqUnhandledCudaError;
    }
    t->ops = &nccl_transport_ops;
    t->fifo = 1; /* one communication stream: the ring posts receives with their sends */
    t->rank = n->rank;
    t->nranks = n->nranks;
    t->abort_flag = &x->abort_flag; /* a communicator adopting the transport points these at */
    t->broken = &x->broken;         /* its own (gvq_comm_create) */
    t->impl = x;
    *out = t;
    return gvqSuccess;
}
