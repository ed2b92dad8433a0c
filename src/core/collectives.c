/*
 * collectives.c -- the public collective and point-to-point calls: argument checks, the group
 * queue, and dispatch to algorithms/.
 *
 * Outside a group a call runs at once. Inside gvqGroupStart/gvqGroupEnd it is checked and
 * queued; the outermost gvqGroupEnd runs the queued collectives in call order, then posts all
 * queued sends and receives together and waits for them, so a group may hold a send and a
 * receive that depend on each other (a ring exchange, an all-to-all).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "gvq_comm.h"
#ifdef GVQ_WITH_NCCL
#include "gvq_nccl.h"
#endif

typedef enum { OP_ALLREDUCE, OP_BROADCAST, OP_REDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_SEND, OP_RECV } op_kind_t;

static const char *op_fn[] = {"gvqAllReduce", "gvqBroadcast", "gvqReduce", "gvqReduceScatter",
                              "gvqAllGather", "gvqSend", "gvqRecv"};

typedef struct {
    op_kind_t kind;
    const void *sendbuff;
    void *recvbuff;
    size_t count;
    gvqDataType_t dtype;
    gvqRedOp_t op;
    int root; /* root, or peer for send/recv */
    gvqComm_t comm;
    gvqStream_t stream; /* for CUDA buffers */
} coll_op_t;

static __thread int group_depth;
static __thread coll_op_t *group_ops;
static __thread size_t group_n, group_cap;
static __thread gvqResult_t group_error;
static __thread char group_error_text[256]; /* the WARN of the first refused call */

int gvq_group_active(void) { return group_depth > 0; }

/* Point-to-point messages larger than this travel in pieces (one MPI message holds < 2 GiB). */
#define P2P_PIECE ((size_t)1 << 30)

/* ---- argument checks --------------------------------------------------------------------- */

static int ranges_overlap(const void *a, size_t alen, const void *b, size_t blen) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return alen && blen && x < y + blen && y < x + alen;
}

/* Bytes this rank reads from sendbuff and writes to recvbuff. */
static void op_lengths(const coll_op_t *o, size_t *slen, size_t *rlen) {
    int n = o->comm->nranks, r = o->comm->rank;
    size_t one = o->count * gvq_dtype_size(o->dtype), all = one * (size_t)n;
    *slen = *rlen = 0;
    switch (o->kind) {
    case OP_ALLREDUCE: *slen = one; *rlen = one; break;
    case OP_BROADCAST: *slen = r == o->root ? one : 0; *rlen = one; break;
    case OP_REDUCE: *slen = one; *rlen = r == o->root ? one : 0; break;
    case OP_REDUCE_SCATTER: *slen = all; *rlen = one; break;
    case OP_ALLGATHER: *slen = one; *rlen = all; break;
    case OP_SEND: *slen = one; break;
    case OP_RECV: *rlen = one; break;
    }
}

static gvqResult_t check_op(const coll_op_t *o) {
    const char *fn = op_fn[o->kind];
    if (!gvq_comm_is_live(o->comm)) {
        GVQ_WARN("%s: comm %p is %s", fn, (void *)o->comm,
                 o->comm == NULL ? "NULL" : "not a live communicator (destroyed?)");
        return gvqInvalidArgument;
    }
    int n = o->comm->nranks, r = o->comm->rank;
    if (!gvq_dtype_valid((int)o->dtype)) {
        GVQ_WARN("%s: invalid datatype %d", fn, (int)o->dtype);
        return gvqInvalidArgument;
    }
    int reduces = o->kind == OP_ALLREDUCE || o->kind == OP_REDUCE || o->kind == OP_REDUCE_SCATTER;
    if (reduces && !gvq_op_valid((int)o->op)) {
        GVQ_WARN("%s: invalid reduction op %d", fn, (int)o->op);
        return gvqInvalidArgument;
    }
    size_t esize = gvq_dtype_size(o->dtype);
    int blocks = (o->kind == OP_REDUCE_SCATTER || o->kind == OP_ALLGATHER) ? n : 1;
    if (o->count > SIZE_MAX / esize / (size_t)blocks) {
        GVQ_WARN("%s: count %zu of %s overflows the address space", fn, o->count,
                 gvq_dtype_name(o->dtype));
        return gvqInvalidArgument;
    }
    if ((o->kind == OP_BROADCAST || o->kind == OP_REDUCE) && (o->root < 0 || o->root >= n)) {
        GVQ_WARN("%s: root %d is outside [0, %d)", fn, o->root, n);
        return gvqInvalidArgument;
    }
    if ((o->kind == OP_SEND || o->kind == OP_RECV) && (o->root < 0 || o->root >= n)) {
        GVQ_WARN("%s: peer %d is outside [0, %d)", fn, o->root, n);
        return gvqInvalidArgument;
    }
    if (o->count == 0) return gvqSuccess;
    size_t one = o->count * esize, slen, rlen;
    op_lengths(o, &slen, &rlen);
    if (slen && o->sendbuff == NULL) {
        GVQ_WARN("%s: sendbuff is NULL with count %zu", fn, o->count);
        return gvqInvalidArgument;
    }
    if (rlen && o->recvbuff == NULL) {
        GVQ_WARN("%s: recvbuff is NULL with count %zu", fn, o->count);
        return gvqInvalidArgument;
    }
    if (slen && rlen) {
        /* the in-place position NCCL defines for each call; any other overlap is refused */
        const char *inplace = (const char *)o->recvbuff;
        if (o->kind == OP_REDUCE_SCATTER) inplace = (const char *)o->recvbuff - (size_t)r * one;
        if (o->kind == OP_ALLGATHER) inplace = (const char *)o->recvbuff + (size_t)r * one;
        if (o->sendbuff != inplace && ranges_overlap(o->sendbuff, slen, o->recvbuff, rlen)) {
            GVQ_WARN("%s: recvbuff %p overlaps sendbuff %p but is not the in-place layout", fn,
                     o->recvbuff, o->sendbuff);
            return gvqInvalidArgument;
        }
    }
    return gvqSuccess;
}

/* ---- execution --------------------------------------------------------------------------- */

static gvqResult_t run_collective(const coll_op_t *o, int allow_auto) {
    gvqComm_t c = o->comm;
    gvq_coll_ctx_t ctx = {c->xport, c->dev, c->chunk_bytes, &c->scratch, &c->scratch_bytes, NULL};
    size_t esize = gvq_dtype_size(o->dtype);
    switch (o->kind) {
    case OP_ALLREDUCE: {
        int handled = 0; /* zero-code mode (GVQ_CODEC) */
        if (allow_auto)
            GVQCHECK(gvq_auto_allreduce(c, o->sendbuff, o->recvbuff, o->count, o->dtype, o->op, &handled));
        if (handled) return gvqSuccess;
        gvq_codec_t codec;
        gvq_codec_identity_init(&codec, c->dev, o->dtype, o->op);
        return gvq_ring_allreduce(&ctx, &codec, o->sendbuff, o->recvbuff, o->count, o->op);
    }
    case OP_BROADCAST:
        return gvq_chain_broadcast(&ctx, o->sendbuff, o->recvbuff, o->count * esize, o->root);
    case OP_REDUCE:
        return gvq_chain_reduce(&ctx, o->sendbuff, o->recvbuff, o->count, o->dtype, o->op, o->root);
    case OP_REDUCE_SCATTER:
        return gvq_ring_reduce_scatter(&ctx, o->sendbuff, o->recvbuff, o->count, o->dtype, o->op);
    case OP_ALLGATHER:
        return gvq_ring_allgather(&ctx, o->sendbuff, o->recvbuff, o->count, o->dtype);
    default:
        return gvqInternalError;
    }
}

/* ---- CUDA buffers ----------------------------------------------------------------------------
 * Where the buffers live picks the path (gvq_device_of; always the host in builds without CUDA,
 * where a device pointer cannot be told from a host one). Collectives on CUDA buffers run on
 * NCCL when it is built in and every rank could set it up (GVQ_NCCL=1), otherwise they are
 * staged: the buffers are copied to pinned host memory behind the caller's stream, the host
 * collective runs, the result is copied back, and the call returns when it is in place. Staged
 * calls skip zero-code compression (its compressors are keyed by the buffer's address). */

/* The device holding the op's buffers (the non-host one when they differ). */
static const gvq_device_ops_t *op_device(const coll_op_t *o) {
    if (o->count == 0) return &gvq_host_device;
    const gvq_device_ops_t *d = gvq_device_of(o->sendbuff);
    return d != &gvq_host_device ? d : gvq_device_of(o->recvbuff);
}

static gvqResult_t staged_body(void *arg, const void *send, void *recv) {
    coll_op_t h = *(const coll_op_t *)arg;
    h.sendbuff = send;
    h.recvbuff = recv;
    return run_collective(&h, 0);
}

static gvqResult_t run_staged(const coll_op_t *o, const gvq_device_ops_t *dev) {
    size_t slen, rlen;
    op_lengths(o, &slen, &rlen);
    return gvq_device_staged(dev, o->stream, op_fn[o->kind], &o->comm->pinned, o->sendbuff, slen,
                             o->recvbuff, rlen, staged_body, (void *)o);
}

#ifdef GVQ_WITH_NCCL
/* Set up NCCL beside comm, collectively: rank 0 makes the id, the communicator's own transport
 * carries it, every rank initializes, and an allreduce of the outcome makes every rank agree
 * to use NCCL or to stage. */
static void nccl_attach(gvqComm_t c) {
    if (c->nccl_state != 0) return;
    c->nccl_state = -1;
    if (!gvq_param(GVQ_PARAM_NCCL)) return;
    gvq_coll_ctx_t ctx = {c->xport, c->dev, c->chunk_bytes, &c->scratch, &c->scratch_bytes, NULL};
    struct {
        int32_t ok;
        char id[GVQ_NCCL_ID_BYTES];
    } msg;
    memset(&msg, 0, sizeof msg);
    if (c->rank == 0) msg.ok = gvq_nccl_get_id(msg.id) == gvqSuccess;
    if (gvq_chain_broadcast(&ctx, &msg, &msg, sizeof msg, 0) != gvqSuccess) return;
    gvq_nccl_t *n = NULL;
    int32_t ok = msg.ok && gvq_nccl_init(msg.id, c->nranks, c->rank, &n) == gvqSuccess;
    gvq_codec_t codec;
    gvq_codec_identity_init(&codec, c->dev, gvqInt32, gvqMin);
    gvqResult_t res = gvq_ring_allreduce(&ctx, &codec, &ok, &ok, 1, gvqMin);
    if (res == gvqSuccess && ok) {
        c->nccl = n;
        c->nccl_state = 1;
        GVQ_INFO("comm %p rank %d: collectives on CUDA buffers run on NCCL", (void *)c, c->rank);
        return;
    }
    gvq_nccl_destroy(n, 1);
    GVQ_INFO("comm %p rank %d: NCCL unavailable on some rank; CUDA buffers are staged through host "
             "memory", (void *)c, c->rank);
}

/* The NCCL transport for device-resident rings, made once every rank has NCCL and agreed that
 * every rank could make the transport. */
static void nccl_transport_attach(gvqComm_t c) {
    c->dxport_state = -1;
    if (!gvq_param(GVQ_PARAM_NCCL_RING)) return;
    nccl_attach(c);
    if (c->nccl_state != 1) return;
    gvq_transport_t *t = NULL;
    int32_t ok = gvq_nccl_transport_create(c->nccl, &t) == gvqSuccess;
    gvq_coll_ctx_t ctx = {c->xport, c->dev, c->chunk_bytes, &c->scratch, &c->scratch_bytes, NULL};
    gvq_codec_t codec;
    gvq_codec_identity_init(&codec, c->dev, gvqInt32, gvqMin);
    gvqResult_t res = gvq_ring_allreduce(&ctx, &codec, &ok, &ok, 1, gvqMin);
    if (res == gvqSuccess && ok) {
        gvq_comm_adopt_device_transport(c, t, &gvq_cuda_device);
        GVQ_INFO("comm %p rank %d: compressed rings on CUDA buffers run over NCCL", (void *)c,
                 c->rank);
        return;
    }
    if (t != NULL) t->ops->destroy(t);
}

static gvqResult_t run_nccl(const coll_op_t *o) {
    static const gvq_nccl_coll_t kind[] = {GVQ_NCCL_ALLREDUCE, GVQ_NCCL_BROADCAST, GVQ_NCCL_REDUCE,
                                           GVQ_NCCL_REDUCE_SCATTER, GVQ_NCCL_ALLGATHER};
    return gvq_nccl_collective(o->comm->nccl, kind[o->kind], o->sendbuff, o->recvbuff, o->count,
                               o->dtype, o->op, o->root, o->stream);
}
#endif

gvq_transport_t *gvq_comm_device_transport(gvqComm_t c, const gvq_device_ops_t *dev) {
#ifdef GVQ_WITH_NCCL
    if (c->dxport_state == 0 && dev == &gvq_cuda_device) nccl_transport_attach(c);
#endif
    return c->dxport_state == 1 && c->dxport_dev == dev ? c->dxport : NULL;
}

static gvqResult_t run_collective_any(const coll_op_t *o) {
    const gvq_device_ops_t *dev = op_device(o);
    if (dev == &gvq_host_device) return run_collective(o, 1);
#ifdef GVQ_WITH_NCCL
    size_t slen, rlen;
    op_lengths(o, &slen, &rlen);
    int all_dev = (!slen || gvq_device_of(o->sendbuff) == dev) && (!rlen || gvq_device_of(o->recvbuff) == dev);
    if (all_dev) {
        nccl_attach(o->comm);
        if (o->comm->nccl_state == 1) return run_nccl(o);
    }
#endif
    return run_staged(o, dev);
}

static size_t p2p_pieces(const coll_op_t *o) {
    return GVQ_DIV_UP(o->count * gvq_dtype_size(o->dtype), P2P_PIECE);
}

/* Post the pieces of a send or receive into reqs. */
static gvqResult_t p2p_post(const coll_op_t *o, gvq_req_t *reqs) {
    gvq_transport_t *t = o->comm->xport;
    size_t bytes = o->count * gvq_dtype_size(o->dtype), np = p2p_pieces(o);
    for (size_t i = 0; i < np; i++) {
        size_t len = GVQ_MIN(P2P_PIECE, bytes - i * P2P_PIECE);
        if (o->kind == OP_SEND)
            GVQCHECK(t->ops->isend(t, o->root, GVQ_TAG_P2P, (const char *)o->sendbuff + i * P2P_PIECE,
                                   len, &reqs[i]));
        else
            GVQCHECK(t->ops->irecv(t, o->root, GVQ_TAG_P2P, (char *)o->recvbuff + i * P2P_PIECE, len,
                                   &reqs[i]));
    }
    return gvqSuccess;
}

/* Run a batch of operations: collectives in order, then all point-to-point together. */
static gvqResult_t run_batch(const coll_op_t *ops, size_t n) {
    gvqResult_t res = gvqSuccess;
    size_t nreq = 0;
    for (size_t i = 0; i < n; i++) {
        if (ops[i].kind == OP_SEND || ops[i].kind == OP_RECV) {
            nreq += p2p_pieces(&ops[i]);
            continue;
        }
        GVQCHECK(gvq_comm_enter(ops[i].comm, op_fn[ops[i].kind]));
        res = run_collective_any(&ops[i]);
        gvq_comm_leave(ops[i].comm);
        GVQCHECK(res);
    }
    if (nreq == 0) return gvqSuccess;
    gvq_req_t *reqs = calloc(nreq, sizeof *reqs);
    size_t *first = calloc(n + 1, sizeof *first);
    size_t entered = 0;
    if (reqs == NULL || first == NULL) {
        res = gvqSystemError;
        goto out_free;
    }
    for (size_t i = 0, q = 0; i <= n; i++) {
        first[i] = q;
        if (i < n && (ops[i].kind == OP_SEND || ops[i].kind == OP_RECV)) q += p2p_pieces(&ops[i]);
    }
    for (size_t i = 0; i < n; i++) {
        if (ops[i].kind != OP_SEND && ops[i].kind != OP_RECV) continue;
        if (op_device(&ops[i]) != &gvq_host_device) {
            GVQ_WARN("%s: point-to-point on CUDA buffers is not supported yet (peer %d)",
                     op_fn[ops[i].kind], ops[i].root);
            res = gvqInvalidUsage;
            goto out_leave;
        }
        GVQCHECKGOTO(gvq_comm_enter(ops[i].comm, op_fn[ops[i].kind]), res, out_leave);
        entered = i + 1;
        GVQCHECKGOTO(p2p_post(&ops[i], reqs + first[i]), res, out_leave);
    }
    for (size_t i = 0; i < n; i++) {
        if (ops[i].kind != OP_SEND && ops[i].kind != OP_RECV) continue;
        GVQCHECKGOTO(gvq_xport_waitall(ops[i].comm->xport, reqs + first[i],
                                       (int)(first[i + 1] - first[i]), op_fn[ops[i].kind]),
                     res, out_leave);
    }
out_leave:
    for (size_t i = 0; i < entered; i++) {
        if (ops[i].kind != OP_SEND && ops[i].kind != OP_RECV) continue;
        if (res != gvqSuccess)
            gvq_xport_cancelall(ops[i].comm->xport, reqs + first[i], (int)(first[i + 1] - first[i]));
        gvq_comm_leave(ops[i].comm);
    }
out_free:
    free(reqs);
    free(first);
    return res;
}

/* Check an operation, then run it, or queue it inside a group. */
static gvqResult_t submit(const coll_op_t *o) {
    gvqResult_t res = check_op(o);
    if (res != gvqSuccess) {
        if (group_depth > 0 && group_error == gvqSuccess) {
            group_error = res;
            snprintf(group_error_text, sizeof group_error_text, "%s", gvq_log_last_warn());
        }
        return res;
    }
    if (group_depth == 0) return run_batch(o, 1);
    if (group_n == group_cap) {
        size_t cap = group_cap ? 2 * group_cap : 16;
        coll_op_t *n = realloc(group_ops, cap * sizeof *n);
        if (n == NULL) {
            if (group_error == gvqSuccess) group_error = gvqSystemError;
            return gvqSystemError;
        }
        group_ops = n;
        group_cap = cap;
    }
    group_ops[group_n++] = *o;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqGroupStart(void) {
    if (group_depth == 0) {
        group_n = 0;
        group_error = gvqSuccess;
    }
    group_depth++;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqGroupEnd(void) {
    if (group_depth == 0) {
        GVQ_WARN("gvqGroupEnd: no group is open (gvqGroupStart was not called)");
        return gvqInvalidUsage;
    }
    if (--group_depth > 0) return gvqSuccess;
    gvqResult_t res = group_error;
    if (res != gvqSuccess) /* repeat the refused call's facts: they are the reason */
        GVQ_WARN("gvqGroupEnd: nothing of the group ran; a call was refused: %s", group_error_text);
    else
        res = run_batch(group_ops, group_n);
    free(group_ops); /* thread-local: nothing else would free it when the thread ends */
    group_ops = NULL;
    group_n = group_cap = 0;
    group_error = gvqSuccess;
    return res;
}

/* ---- public calls ------------------------------------------------------------------------ */

GVQ_API gvqResult_t gvqAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                 gvqDataType_t datatype, gvqRedOp_t op, gvqComm_t comm,
                                 gvqStream_t stream) {
    coll_op_t o = {OP_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream};
    return submit(&o);
}

GVQ_API gvqResult_t gvqBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                 gvqDataType_t datatype, int root, gvqComm_t comm,
                                 gvqStream_t stream) {
    coll_op_t o = {OP_BROADCAST, sendbuff, recvbuff, count, datatype, gvqSum, root, comm, stream};
    return submit(&o);
}

GVQ_API gvqResult_t gvqBcast(void *buff, size_t count, gvqDataType_t datatype, int root,
                             gvqComm_t comm, gvqStream_t stream) {
    return gvqBroadcast(buff, buff, count, datatype, root, comm, stream);
}

GVQ_API gvqResult_t gvqReduce(const void *sendbuff, void *recvbuff, size_t count,
                              gvqDataType_t datatype, gvqRedOp_t op, int root, gvqComm_t comm,
                              gvqStream_t stream) {
    coll_op_t o = {OP_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream};
    return submit(&o);
}

GVQ_API gvqResult_t gvqReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                     gvqDataType_t datatype, gvqRedOp_t op, gvqComm_t comm,
                                     gvqStream_t stream) {
    coll_op_t o = {OP_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream};
    return submit(&o);
}

GVQ_API gvqResult_t gvqAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                 gvqDataType_t datatype, gvqComm_t comm, gvqStream_t stream) {
    coll_op_t o = {OP_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, gvqSum, 0, comm, stream};
    return submit(&o);
}

GVQ_API gvqResult_t gvqSend(const void *sendbuff, size_t count, gvqDataType_t datatype, int peer,
                            gvqComm_t comm, gvqStream_t stream) {
    coll_op_t o = {OP_SEND, sendbuff, NULL, count, datatype, gvqSum, peer, comm, stream};
    return submit(&o);
}

GVQ_API gvqResult_t gvqRecv(void *recvbuff, size_t count, gvqDataType_t datatype, int peer,
                            gvqComm_t comm, gvqStream_t stream) {
    coll_op_t o = {OP_RECV, NULL, recvbuff, count, datatype, gvqSum, peer, comm, stream};
    return submit(&o);
}
