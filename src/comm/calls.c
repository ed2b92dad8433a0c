/*
 * calls.c -- the public collective and point-to-point calls: argument checks, the group queue,
 * host streams; collectives.c runs what is checked here.
 *
 * Outside a group a call runs at once. Inside gvqGroupStart/gvqGroupEnd it is checked and
 * queued; the outermost gvqGroupEnd runs the queued collectives in call order, then posts all
 * queued sends and receives together and waits for them, so a group may hold a send and a
 * receive that depend on each other (a ring exchange, an all-to-all).
 *
 * With a host stream (gvqStreamCreate) the call, or the group at its end, is checked here and
 * then queued as one job on the stream (stream.c), which runs it as above on its progress
 * thread; a refused collective queues its refusal instead, so the other ranks' calls fail in
 * their turn rather than wait.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gvq_group.h"
#include "gvq_stream.h"

/* ---- argument checks --------------------------------------------------------------------- */

/* Whether [a, a+alen) and [b, b+blen) share a byte; by distances, which cannot wrap. */
static int ranges_overlap(const void *a, size_t alen, const void *b, size_t blen) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    if (alen == 0 || blen == 0) return 0;
    return x <= y ? y - x < alen : x - y < blen;
}

/* A buffer of len bytes at p must fit in the address space: below its top, and within the
 * 2^56 bytes of the largest user address space of today's 64-bit CPUs (x86-64 with 5-level
 * paging), so that a count near SIZE_MAX is refused, not run. */
#define GVQ_MAX_BUFFER_BYTES ((uint64_t)1 << 56)
static int buffer_wraps(const void *p, size_t len) {
    return (uint64_t)len > GVQ_MAX_BUFFER_BYTES || (uintptr_t)p > UINTPTR_MAX - len;
}

static gvqResult_t check_op(const gvq_op_t *o) {
    const char *fn = gvq_op_fn[o->kind];
    if (!gvq_comm_is_live(o->comm)) return gvq_comm_refuse_dead(o->comm, fn);
    int n = o->comm->nranks, r = o->comm->rank;
    if (!gvq_dtype_valid((int)o->dtype)) {
        GVQ_WARN("%s: invalid datatype %d", fn, (int)o->dtype);
        return gvqInvalidArgument;
    }
    int reduces =
        o->kind == GVQ_OP_ALLREDUCE || o->kind == GVQ_OP_REDUCE || o->kind == GVQ_OP_REDUCE_SCATTER;
    if (reduces && !gvq_op_valid((int)o->op)) {
        GVQ_WARN("%s: invalid reduction op %d", fn, (int)o->op);
        return gvqInvalidArgument;
    }
    size_t esize = gvq_dtype_size(o->dtype);
    int blocks = (o->kind == GVQ_OP_REDUCE_SCATTER || o->kind == GVQ_OP_ALLGATHER) ? n : 1;
    if (o->count > SIZE_MAX / esize / (size_t)blocks) {
        GVQ_WARN("%s: count %zu of %s overflows the address space", fn, o->count,
                 gvq_dtype_name(o->dtype));
        return gvqInvalidArgument;
    }
    if ((o->kind == GVQ_OP_BROADCAST || o->kind == GVQ_OP_REDUCE) &&
        (o->root < 0 || o->root >= n)) {
        GVQ_WARN("%s: root %d is outside [0, %d)", fn, o->root, n);
        return gvqInvalidArgument;
    }
    if ((o->kind == GVQ_OP_SEND || o->kind == GVQ_OP_RECV) && (o->root < 0 || o->root >= n)) {
        GVQ_WARN("%s: peer %d is outside [0, %d)", fn, o->root, n);
        return gvqInvalidArgument;
    }
    if (o->count == 0) return gvqSuccess;
    size_t one = o->count * esize, slen, rlen;
    gvq_op_lengths(o, &slen, &rlen);
    if (slen && o->sendbuff == NULL) {
        GVQ_WARN("%s: sendbuff is NULL with count %zu", fn, o->count);
        return gvqInvalidArgument;
    }
    if (rlen && o->recvbuff == NULL) {
        GVQ_WARN("%s: recvbuff is NULL with count %zu", fn, o->count);
        return gvqInvalidArgument;
    }
    int swraps = slen && buffer_wraps(o->sendbuff, slen);
    if (swraps || (rlen && buffer_wraps(o->recvbuff, rlen))) {
        GVQ_WARN("%s: count %zu of %s: %s (%zu bytes from %p) runs past the end of the address "
                 "space",
                 fn, o->count, gvq_dtype_name(o->dtype), swraps ? "sendbuff" : "recvbuff",
                 swraps ? slen : rlen, swraps ? o->sendbuff : (const void *)o->recvbuff);
        return gvqInvalidArgument;
    }
    if (slen && rlen) {
        /* the in-place position NCCL defines for each call; any other overlap is refused */
        const char *inplace = (const char *)o->recvbuff;
        if (o->kind == GVQ_OP_REDUCE_SCATTER) inplace = (const char *)o->recvbuff - (size_t)r * one;
        if (o->kind == GVQ_OP_ALLGATHER) inplace = (const char *)o->recvbuff + (size_t)r * one;
        if (o->sendbuff != inplace && ranges_overlap(o->sendbuff, slen, o->recvbuff, rlen)) {
            GVQ_WARN("%s: recvbuff %p overlaps sendbuff %p but is not the in-place layout", fn,
                     o->recvbuff, o->sendbuff);
            return gvqInvalidArgument;
        }
    }
    return gvqSuccess;
}

/* ---- host streams ------------------------------------------------------------------------ */

/* A batch queued on a host stream, or the refusal of its first collective. */
typedef struct {
    gvq_op_t *ops;
    size_t n;
    gvqResult_t refused;
} batch_job_t;

static gvqResult_t batch_job_run(void *arg) {
    batch_job_t *b = arg;
    if (b->refused == gvqSuccess) return gvq_op_run_batch(b->ops, b->n);
    gvq_op_refuse_together(&b->ops[0], b->refused);
    return gvqSuccess; /* the refusal was the call's result already */
}

static void batch_job_free(void *arg) {
    batch_job_t *b = arg;
    free(b->ops);
    free(b);
}

/* Queue ops[0..n) on host stream s as one batch (refused: the refusal of ops[0]). */
static gvqResult_t enqueue_batch(const gvq_op_t *ops, size_t n, gvqResult_t refused, gvqStream_t s,
                                 const char *fn) {
    if (n > INT32_MAX) {
        GVQ_WARN("%s: a group of %zu calls is too large for a stream", fn, n);
        return gvqInvalidArgument;
    }
    batch_job_t *b = calloc(1, sizeof *b);
    gvqComm_t *comms = calloc(n, sizeof *comms);
    if (b == NULL || comms == NULL || (b->ops = malloc(n * sizeof *b->ops)) == NULL) {
        GVQ_WARN("%s: out of memory queueing %zu calls on stream %p", fn, n, s);
        free(b);
        free(comms);
        return gvqSystemError;
    }
    memcpy(b->ops, ops, n * sizeof *ops);
    b->n = n;
    b->refused = refused;
    for (size_t i = 0; i < n; i++)
        comms[i] = ops[i].comm;
    gvqResult_t res = gvq_stream_enqueue(s, fn, comms, (int)n, batch_job_run, batch_job_free, b);
    free(comms);
    return res;
}

/* Host streams order host buffers only (a cudaStream_t orders CUDA buffers). */
static gvqResult_t check_stream_buffers(const gvq_op_t *o) {
    if (gvq_op_device(o) == &gvq_host_device) return gvqSuccess;
    GVQ_WARN("%s: stream %p is a host stream (gvqStreamCreate), but the buffers are CUDA memory; "
             "pass a cudaStream_t",
             gvq_op_fn[o->kind], o->stream);
    return gvqInvalidArgument;
}

/* The host stream of a group's calls (NULL: none); refuses a group whose calls name a host
 * stream and something else. */
static gvqResult_t group_stream(const gvq_group_t *g, gvqStream_t *out) {
    *out = NULL;
    for (size_t i = 0; i < g->n; i++)
        if (gvq_stream_is_host(g->ops[i].stream)) *out = g->ops[i].stream;
    for (size_t i = 0; i < g->n && *out != NULL; i++)
        if (g->ops[i].stream != *out) {
            GVQ_WARN("gvqGroupEnd: call %zu (%s) names stream %p, another call host stream %p; "
                     "a group's calls run on one host stream",
                     i, gvq_op_fn[g->ops[i].kind], g->ops[i].stream, *out);
            return gvqInvalidUsage;
        }
    return gvqSuccess;
}

/* Check an operation, then run it, queue it on its host stream, or queue it inside a group. */
gvqResult_t gvq_op_submit(const gvq_op_t *o) {
    gvq_group_t *g = gvq_group_self();
    int streamed = gvq_stream_is_host(o->stream);
    gvqResult_t res = check_op(o);
    if (res == gvqSuccess && streamed) res = check_stream_buffers(o);
    if (res != gvqSuccess) {
        if (g->depth > 0)
            gvq_group_refuse(g, res);
        else if (streamed && gvq_op_is_collective(o) && gvq_comm_is_live(o->comm))
            (void)enqueue_batch(o, 1, res, o->stream, gvq_op_fn[o->kind]);
        else
            gvq_op_refuse_together(o, res);
        return res;
    }
    if (g->depth > 0) return gvq_group_push(g, o);
    return streamed ? enqueue_batch(o, 1, gvqSuccess, o->stream, gvq_op_fn[o->kind])
                    : gvq_op_run_batch(o, 1);
}

GVQ_API gvqResult_t gvqGroupStart(void) {
    gvq_group_t *g = gvq_group_self();
    if (g->depth == 0) gvq_group_clear(g);
    g->depth++;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqGroupEnd(void) {
    gvq_group_t *g = gvq_group_self();
    if (g->depth == 0) {
        GVQ_WARN("gvqGroupEnd: no group is open (gvqGroupStart was not called)");
        return gvqInvalidUsage;
    }
    if (--g->depth > 0) return gvqSuccess;
    gvqStream_t hs = NULL;
    gvqResult_t res = g->error, mixed = group_stream(g, &hs);
    if (res == gvqSuccess && mixed != gvqSuccess) {
        gvq_group_refuse(g, mixed);
        res = mixed;
    }
    if (res != gvqSuccess) { /* repeat the refused call's facts: they are the reason */
        /* the other ranks stop at the group's first collective when this rank refuses it */
        for (size_t i = 0; i < g->n; i++)
            if (gvq_op_is_collective(&g->ops[i])) {
                if (hs != NULL && gvq_comm_is_live(g->ops[i].comm))
                    (void)enqueue_batch(&g->ops[i], 1, res, hs, "gvqGroupEnd");
                else
                    gvq_op_refuse_together(&g->ops[i], res);
                break;
            }
        GVQ_WARN("gvqGroupEnd: nothing of the group ran; a call was refused: %s", g->error_text);
    } else if (hs != NULL && g->n > 0)
        res = enqueue_batch(g->ops, g->n, gvqSuccess, hs, "gvqGroupEnd");
    else
        res = gvq_op_run_batch(g->ops, g->n);
    gvq_group_clear(g); /* thread-local: nothing else would free it when the thread ends */
    return res;
}

/* ---- public calls ------------------------------------------------------------------------ */

/* gvqAllReduce is src/compress/zero_code.c's: it may take the call (zero-code mode). */
gvqResult_t gvq_allreduce_plain(const void *sendbuff, void *recvbuff, size_t count,
                                gvqDataType_t datatype, gvqRedOp_t op, gvqComm_t comm,
                                gvqStream_t stream) {
    gvq_op_t o = {GVQ_OP_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm,
                  stream,           NULL,     NULL};
    return gvq_op_submit(&o);
}

GVQ_API gvqResult_t gvqBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                 gvqDataType_t datatype, int root, gvqComm_t comm,
                                 gvqStream_t stream) {
    gvq_op_t o = {GVQ_OP_BROADCAST, sendbuff, recvbuff, count, datatype, gvqSum, root, comm,
                  stream,           NULL,     NULL};
    return gvq_op_submit(&o);
}

GVQ_API gvqResult_t gvqBcast(void *buff, size_t count, gvqDataType_t datatype, int root,
                             gvqComm_t comm, gvqStream_t stream) {
    return gvqBroadcast(buff, buff, count, datatype, root, comm, stream);
}

GVQ_API gvqResult_t gvqReduce(const void *sendbuff, void *recvbuff, size_t count,
                              gvqDataType_t datatype, gvqRedOp_t op, int root, gvqComm_t comm,
                              gvqStream_t stream) {
    gvq_op_t o = {GVQ_OP_REDUCE, sendbuff, recvbuff, count, datatype, op,
                  root,          comm,     stream,   NULL,  NULL};
    return gvq_op_submit(&o);
}

GVQ_API gvqResult_t gvqReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                     gvqDataType_t datatype, gvqRedOp_t op, gvqComm_t comm,
                                     gvqStream_t stream) {
    gvq_op_t o = {GVQ_OP_REDUCE_SCATTER,
                  sendbuff,
                  recvbuff,
                  recvcount,
                  datatype,
                  op,
                  0,
                  comm,
                  stream,
                  NULL,
                  NULL};
    return gvq_op_submit(&o);
}

GVQ_API gvqResult_t gvqAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                 gvqDataType_t datatype, gvqComm_t comm, gvqStream_t stream) {
    gvq_op_t o = {GVQ_OP_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, gvqSum, 0, comm,
                  stream,           NULL,     NULL};
    return gvq_op_submit(&o);
}

GVQ_API gvqResult_t gvqSend(const void *sendbuff, size_t count, gvqDataType_t datatype, int peer,
                            gvqComm_t comm, gvqStream_t stream) {
    gvq_op_t o = {GVQ_OP_SEND, sendbuff, NULL,   count, datatype, gvqSum,
                  peer,        comm,     stream, NULL,  NULL};
    return gvq_op_submit(&o);
}

GVQ_API gvqResult_t gvqRecv(void *recvbuff, size_t count, gvqDataType_t datatype, int peer,
                            gvqComm_t comm, gvqStream_t stream) {
    gvq_op_t o = {GVQ_OP_RECV, NULL, recvbuff, count, datatype, gvqSum,
                  peer,        comm, stream,   NULL,  NULL};
    return gvq_op_submit(&o);
}
