/*
 * collectives.c -- the public collective and point-to-point calls: argument checks, the group
 * queue, and dispatch to src/algorithms/.
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

#include "gvq_comm_nccl.h"
#include "gvq_select.h"
#include "gvq_stream.h"

static const char *op_fn[] = {"gvqAllReduce",     "gvqBroadcast",          "gvqReduce",
                              "gvqReduceScatter", "gvqAllGather",          "gvqSend",
                              "gvqRecv",          "gvqAllReduceCompressed"};

/* Point-to-point messages larger than this travel in pieces (one MPI message holds < 2 GiB). */
#define P2P_PIECE ((size_t)1 << 30)

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

/* Bytes this rank reads from sendbuff and writes to recvbuff. */
static void op_lengths(const gvq_op_t *o, size_t *slen, size_t *rlen) {
    int n = o->comm->nranks, r = o->comm->rank;
    size_t one = o->count * gvq_dtype_size(o->dtype), all = one * (size_t)n;
    *slen = *rlen = 0;
    switch (o->kind) {
    case GVQ_OP_ALLREDUCE:
    case GVQ_OP_COMPRESSED:
        *slen = one;
        *rlen = one;
        break;
    case GVQ_OP_BROADCAST:
        *slen = r == o->root ? one : 0;
        *rlen = one;
        break;
    case GVQ_OP_REDUCE:
        *slen = one;
        *rlen = r == o->root ? one : 0;
        break;
    case GVQ_OP_REDUCE_SCATTER:
        *slen = all;
        *rlen = one;
        break;
    case GVQ_OP_ALLGATHER:
        *slen = one;
        *rlen = all;
        break;
    case GVQ_OP_SEND:
        *slen = one;
        break;
    case GVQ_OP_RECV:
        *rlen = one;
        break;
    }
}

static gvqResult_t check_op(const gvq_op_t *o) {
    const char *fn = op_fn[o->kind];
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
    op_lengths(o, &slen, &rlen);
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

/* ---- signatures ------------------------------------------------------------------------------
 * Before a collective moves data, the ranks agree on its signature (signature.c): a call whose
 * arguments differ between the ranks fails on every rank, naming both sides. A rank that refuses
 * its own arguments still takes part (with its refusal), so the others fail at once. */

static gvq_algo_t op_algo(const gvq_op_t *o);
static const gvq_device_ops_t *op_device(const gvq_op_t *o);

static gvq_call_sig_t op_signature(const gvq_op_t *o, gvqResult_t refused) {
    if (o->kind == GVQ_OP_COMPRESSED) return o->upper->signature(o, refused);
    int reduces =
        o->kind == GVQ_OP_ALLREDUCE || o->kind == GVQ_OP_REDUCE || o->kind == GVQ_OP_REDUCE_SCATTER;
    int rooted = o->kind == GVQ_OP_BROADCAST || o->kind == GVQ_OP_REDUCE;
    return (gvq_call_sig_t){.kind = (gvq_sig_kind_t)o->kind, /* the same order */
                            .count = o->count,
                            .dtype = (int)o->dtype,
                            .op = reduces ? (int)o->op : -1,
                            .root = rooted ? o->root : -1,
                            .identity = o->kind == GVQ_OP_ALLREDUCE && o->upper != NULL
                                            ? o->upper->identity(o->dtype, o->op)
                                            : 0, /* GVQ_CODEC alike on every rank */
                            .algo = refused == gvqSuccess ? (int)op_algo(o) : -1,
                            .device = op_device(o) != &gvq_host_device,
                            .refused = refused};
}

static int is_collective(const gvq_op_t *o) {
    return o->kind != GVQ_OP_SEND && o->kind != GVQ_OP_RECV;
}

/* A collective this rank refused (res) takes part in the agreement when its communicator can
 * carry it (live, not aborted, not broken), so that the other ranks' calls fail at once. */
static void refuse_together(const gvq_op_t *o, gvqResult_t res) {
    if (!is_collective(o) || !gvq_comm_is_live(o->comm)) return;
    if (gvq_comm_enter(o->comm, op_fn[o->kind]) != gvqSuccess) return;
    gvq_call_sig_t sig = op_signature(o, res);
    (void)gvq_call_agree(o->comm, op_fn[o->kind], &sig);
    gvq_comm_leave(o->comm);
}

/* ---- execution --------------------------------------------------------------------------- */

/* The algorithm for a plain collective (select.c): by its size as nccl-tests counts it (all
 * blocks for reduce-scatter and allgather), rank count and datatype, or GVQ_ALGO. */
static gvq_algo_t op_algo(const gvq_op_t *o) {
    size_t bytes = o->count * gvq_dtype_size(o->dtype);
    if (o->kind == GVQ_OP_REDUCE_SCATTER || o->kind == GVQ_OP_ALLGATHER)
        bytes *= (size_t)o->comm->nranks;
    int hosts = !o->comm->xport->one_host ? 0 : o->comm->shm_state == 1 ? 2 : 1;
    return gvq_select_algo(o->kind, o->comm->nranks, bytes, o->dtype, o->comm->xport->fifo,
                           o->comm->xport->stages_sends, hosts);
}

/* o's data as the signed exchanges carry it (gvq_op_kind_t and gvq_pay_kind_t: the same order). */
_Static_assert((int)GVQ_OP_BROADCAST == (int)GVQ_PAY_BROADCAST &&
                   (int)GVQ_OP_REDUCE == (int)GVQ_PAY_REDUCE &&
                   (int)GVQ_OP_REDUCE_SCATTER == (int)GVQ_PAY_REDUCE_SCATTER &&
                   (int)GVQ_OP_ALLGATHER == (int)GVQ_PAY_ALLGATHER,
               "collective kinds and payload kinds in the same order");
static gvq_signed_payload_t op_payload(const gvq_op_t *o) {
    return (gvq_signed_payload_t){
        o->sendbuff, o->recvbuff, o->count, o->dtype, o->op, (gvq_pay_kind_t)o->kind, o->root};
}

/* A collective whose data did not ride along with its agreement on shared memory (CUDA buffers
 * staged, the agreement made before): one more exchange, with the data. */
static gvqResult_t run_shm(const gvq_op_t *o, gvq_coll_ctx_t *ctx) {
    if (o->count == 0) return gvqSuccess;
    if (o->comm->shm_state != 1) return gvqInternalError;
    int64_t row = (int64_t)o->kind, lo, hi; /* agreed already: the same on every rank */
    int lo_rank, hi_rank;
    gvq_signed_payload_t pay = op_payload(o);
    return gvq_shm_signed(ctx, &o->comm->shm, &row, 1, &lo, &lo_rank, &hi, &hi_rank, &pay);
}

static gvqResult_t run_allreduce(const gvq_op_t *o, gvq_coll_ctx_t *ctx, gvq_algo_t algo) {
    if (algo == GVQ_ALGO_RD)
        return gvq_rd_allreduce(ctx, o->sendbuff, o->recvbuff, o->count, o->dtype, o->op);
    if (algo == GVQ_ALGO_RAB)
        return gvq_rab_allreduce(ctx, o->sendbuff, o->recvbuff, o->count, o->dtype, o->op);
    if (algo == GVQ_ALGO_DIRECT)
        return gvq_direct_allreduce(ctx, o->sendbuff, o->recvbuff, o->count, o->dtype, o->op);
    gvq_codec_t codec;
    gvq_codec_identity_init(&codec, ctx->dev, o->dtype, o->op);
    return gvq_ring_allreduce(ctx, &codec, o->sendbuff, o->recvbuff, o->count, o->op);
}

static gvqResult_t run_collective(const gvq_op_t *o, int allow_auto) {
    gvqComm_t c = o->comm;
    gvq_coll_ctx_t ctx = gvq_comm_ctx(c, NULL);
    size_t esize = gvq_dtype_size(o->dtype);
    int handled = 0; /* zero-code mode (GVQ_CODEC) */
    if (o->kind == GVQ_OP_ALLREDUCE && allow_auto && o->upper != NULL)
        GVQCHECK(
            o->upper->allreduce(c, o->sendbuff, o->recvbuff, o->count, o->dtype, o->op, &handled));
    if (handled) return gvqSuccess;
    gvq_algo_t algo = op_algo(o);
    if (algo == GVQ_ALGO_SHM) return run_shm(o, &ctx);
    switch (o->kind) {
    case GVQ_OP_ALLREDUCE:
        return run_allreduce(o, &ctx, algo);
    case GVQ_OP_BROADCAST:
        if (algo == GVQ_ALGO_TREE)
            return gvq_tree_broadcast(&ctx, o->sendbuff, o->recvbuff, o->count * esize, o->root);
        return gvq_chain_broadcast(&ctx, o->sendbuff, o->recvbuff, o->count * esize, o->root);
    case GVQ_OP_REDUCE:
        if (algo == GVQ_ALGO_TREE)
            return gvq_tree_reduce(&ctx, o->sendbuff, o->recvbuff, o->count, o->dtype, o->op,
                                   o->root);
        return gvq_chain_reduce(&ctx, o->sendbuff, o->recvbuff, o->count, o->dtype, o->op, o->root);
    case GVQ_OP_REDUCE_SCATTER:
        if (algo == GVQ_ALGO_RAB)
            return gvq_rab_reduce_scatter(&ctx, o->sendbuff, o->recvbuff, o->count, o->dtype,
                                          o->op);
        return gvq_ring_reduce_scatter(&ctx, o->sendbuff, o->recvbuff, o->count, o->dtype, o->op);
    case GVQ_OP_ALLGATHER:
        if (algo == GVQ_ALGO_RD)
            return gvq_bruck_allgather(&ctx, o->sendbuff, o->recvbuff, o->count, o->dtype);
        if (algo == GVQ_ALGO_DIRECT)
            return gvq_direct_allgather(&ctx, o->sendbuff, o->recvbuff, o->count, o->dtype);
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
static const gvq_device_ops_t *op_device(const gvq_op_t *o) {
    if (o->count == 0) return &gvq_host_device;
    const gvq_device_ops_t *d = gvq_device_of(o->sendbuff);
    return d != &gvq_host_device ? d : gvq_device_of(o->recvbuff);
}

static gvqResult_t staged_body(void *arg, const void *send, void *recv) {
    gvq_op_t h = *(const gvq_op_t *)arg;
    h.sendbuff = send;
    h.recvbuff = recv;
    return run_collective(&h, 0);
}

static gvqResult_t run_staged(const gvq_op_t *o, const gvq_device_ops_t *dev) {
    size_t slen, rlen;
    op_lengths(o, &slen, &rlen);
    return gvq_device_staged(dev, o->stream, op_fn[o->kind], &o->comm->pinned, o->sendbuff, slen,
                             o->recvbuff, rlen, staged_body, (void *)o);
}

static gvqResult_t run_collective_any(const gvq_op_t *o) {
    const gvq_device_ops_t *dev = op_device(o);
    if (dev == &gvq_host_device) return run_collective(o, 1);
    size_t slen, rlen;
    op_lengths(o, &slen, &rlen);
    int all_dev = (!slen || gvq_device_of(o->sendbuff) == dev) &&
                  (!rlen || gvq_device_of(o->recvbuff) == dev);
    if (all_dev && gvq_comm_nccl_ready(o->comm)) return gvq_comm_nccl_collective(o);
    return run_staged(o, dev);
}

static size_t p2p_pieces(const gvq_op_t *o) {
    return GVQ_DIV_UP(o->count * gvq_dtype_size(o->dtype), P2P_PIECE);
}

/* Post the pieces of a send or receive into reqs. */
static gvqResult_t p2p_post(const gvq_op_t *o, gvq_req_t *reqs) {
    gvq_transport_t *t = o->comm->xport;
    size_t bytes = o->count * gvq_dtype_size(o->dtype), np = p2p_pieces(o);
    for (size_t i = 0; i < np; i++) {
        size_t len = GVQ_MIN(P2P_PIECE, bytes - i * P2P_PIECE);
        int send = o->kind == GVQ_OP_SEND;
        const char *sb = send ? (const char *)o->sendbuff + i * P2P_PIECE : NULL;
        char *rb = send ? NULL : (char *)o->recvbuff + i * P2P_PIECE;
        if (t->chan != NULL) /* ranks on one host: the shared-memory channels (chan.c) */
            GVQCHECK(send ? gvq_chan_isend(t->chan, o->root, sb, len, &reqs[i])
                          : gvq_chan_irecv(t->chan, o->root, rb, len, &reqs[i]));
        else if (send)
            GVQCHECK(t->ops->isend(t, o->root, GVQ_TAG_P2P, sb, len, &reqs[i]));
        else
            GVQCHECK(t->ops->irecv(t, o->root, GVQ_TAG_P2P, rb, len, &reqs[i]));
    }
    return gvqSuccess;
}

/* On one host a message that outgrows Open MPI's shared-memory eager limit (4 KiB) takes a
 * rendezvous, which costs more than the agreement's own round: the vector rides along only
 * while vector and signature (176 bytes) fit in one eager message. Across hosts (TCP: 64 KiB
 * eager) every size that recursive doubling runs rides along. On shared memory every size and
 * every plain collective rides along. */
enum { SIGNED_ONE_HOST_BYTES = 3840 };

/* Whether o, a collective with signature sig, is one whose data can ride along with its
 * signature (gvq_call_agree_allreduce): the shm algorithm, or a small allreduce by recursive
 * doubling over a transport that reads messages of any length; host buffers, no zero-code
 * compression. Decided from what sig
 * holds and the transport (the same on every rank), so that ranks with equal signatures choose
 * alike; ranks that choose differently have different signatures and still read each other. */
static int rides_along(const gvq_op_t *o, const gvq_call_sig_t *sig, gvq_signed_payload_t *pay) {
    size_t bytes = o->count * gvq_dtype_size(o->dtype);
    size_t max = sig->algo == GVQ_ALGO_SHM  ? SIZE_MAX /* a slot's worth at a time */
                 : o->comm->xport->one_host ? SIGNED_ONE_HOST_BYTES
                                            : GVQ_SIGNED_MAX_BYTES;
    int rd = sig->algo == GVQ_ALGO_RD && o->kind == GVQ_OP_ALLREDUCE &&
             o->comm->xport->ops->irecv_upto != NULL;
    if ((!rd && sig->algo != GVQ_ALGO_SHM) || sig->identity != 0 || o->comm->nranks < 2 ||
        o->count == 0 || bytes > max || sig->device)
        return 0;
    *pay = op_payload(o);
    return 1;
}

/* ---- point-to-point on CUDA buffers: staged through pinned host memory ----------------------
 * A send's bytes are copied into pinned memory behind its stream before anything is posted; a
 * receive lands in pinned memory and is copied into its buffer once every transfer of the batch
 * completed, so the call returns with the data in place (as the staged collectives do). The
 * block comes from the communicator of the batch's first such call. After a failed transfer the
 * transport may still touch it: it is then abandoned, never reused or freed. */

static int p2p_on_device(const gvq_op_t *o) {
    return (o->kind == GVQ_OP_SEND || o->kind == GVQ_OP_RECV) && op_device(o) != &gvq_host_device;
}

/* posted[i] = ops[i], with a CUDA buffer replaced by its place in the pinned block (a send's
 * bytes copied there); *pin: the block's owner, NULL when no call needs one. */
static gvqResult_t p2p_stage_in(const gvq_op_t *ops, size_t n, gvq_op_t *posted,
                                gvq_pinned_t **pin) {
    const gvq_op_t *lead = NULL;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        posted[i] = ops[i];
        if (!p2p_on_device(&ops[i])) continue;
        if (lead == NULL) lead = &ops[i];
        total += GVQ_DIV_UP(ops[i].count * gvq_dtype_size(ops[i].dtype), 64) * 64;
    }
    if (lead == NULL) return gvqSuccess;
    const gvq_device_ops_t *dev = op_device(lead);
    char *h = gvq_pinned_reserve(&lead->comm->pinned, dev, total);
    if (h == NULL) {
        GVQ_WARN("%s: cannot allocate %zu bytes of pinned host memory to stage CUDA buffers",
                 op_fn[lead->kind], total);
        return gvqSystemError;
    }
    *pin = &lead->comm->pinned;
    for (size_t i = 0; i < n; i++) {
        if (!p2p_on_device(&ops[i])) continue;
        size_t bytes = ops[i].count * gvq_dtype_size(ops[i].dtype);
        if (ops[i].kind == GVQ_OP_SEND) {
            GVQCHECK(gvq_device_copy_behind(op_device(&ops[i]), ops[i].stream, h, ops[i].sendbuff,
                                            bytes, 1));
            posted[i].sendbuff = h;
        } else {
            posted[i].recvbuff = h;
        }
        h += GVQ_DIV_UP(bytes, 64) * 64;
    }
    return gvqSuccess;
}

/* After every transfer completed: the receives' bytes into their CUDA buffers. */
static gvqResult_t p2p_stage_out(const gvq_op_t *ops, const gvq_op_t *posted, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (ops[i].kind == GVQ_OP_RECV && p2p_on_device(&ops[i]))
            GVQCHECK(gvq_device_copy_behind(op_device(&ops[i]), ops[i].stream, ops[i].recvbuff,
                                            posted[i].recvbuff,
                                            ops[i].count * gvq_dtype_size(ops[i].dtype), 0));
    return gvqSuccess;
}

/* A failed batch's block: the transport may still read or write it. */
static void p2p_stage_abandon(gvq_pinned_t *pin) {
    pin->p = NULL;
    pin->bytes = 0;
    pin->dev = NULL;
}

/* Run a batch of operations: collectives in order, then all point-to-point together. */
enum { SMALL_BATCH = 8 }; /* sends and receives of a batch whose bookkeeping fits the stack */

static gvqResult_t run_batch(const gvq_op_t *ops, size_t n) {
    gvqResult_t res = gvqSuccess;
    size_t nreq = 0;
    for (size_t i = 0; i < n; i++) {
        if (ops[i].kind == GVQ_OP_SEND || ops[i].kind == GVQ_OP_RECV) {
            nreq += p2p_pieces(&ops[i]);
            continue;
        }
        if (ops[i].kind == GVQ_OP_COMPRESSED) { /* with the compressed calls right after it */
            size_t m = 1;
            while (i + m < n && ops[i + m].kind == GVQ_OP_COMPRESSED &&
                   ops[i + m].comm == ops[i].comm && ops[i + m].upper == ops[i].upper)
                m++;
            GVQCHECK(ops[i].upper->run_group(&ops[i], m));
            i += m - 1;
            continue;
        }
        GVQCHECK(gvq_comm_enter(ops[i].comm, op_fn[ops[i].kind]));
        gvq_shm_t *shm = NULL; /* made at the first collective: the algorithm depends on it */
        res = gvq_comm_shm(ops[i].comm, &shm);
        if (res != gvqSuccess) {
            gvq_comm_leave(ops[i].comm);
            return res;
        }
        gvq_call_sig_t sig = op_signature(&ops[i], gvqSuccess);
        gvq_signed_payload_t pay;
        if (rides_along(&ops[i], &sig, &pay)) { /* the agreement and the data in one exchange */
            res = gvq_call_agree_allreduce(ops[i].comm, op_fn[ops[i].kind], &sig, &pay);
        } else {
            res = gvq_call_agree(ops[i].comm, op_fn[ops[i].kind], &sig);
            if (res == gvqSuccess) res = run_collective_any(&ops[i]);
        }
        gvq_comm_leave(ops[i].comm);
        GVQCHECK(res);
    }
    if (nreq == 0) return gvqSuccess;
    /* a small batch (a sendrecv's pair) on the stack: the heap costs a small message's time */
    gvq_req_t reqs_s[SMALL_BATCH] = {0};
    gvq_transport_t *xports_s[SMALL_BATCH];
    size_t first_s[SMALL_BATCH + 1] = {0};
    gvq_op_t posted_s[SMALL_BATCH];
    int small = nreq <= SMALL_BATCH && n <= SMALL_BATCH;
    gvq_req_t *reqs = small ? reqs_s : calloc(nreq, sizeof *reqs);
    gvq_transport_t **xports = small ? xports_s : malloc(nreq * sizeof *xports); /* per request */
    size_t *first = small ? first_s : calloc(n + 1, sizeof *first);
    gvq_op_t *posted = small ? posted_s : malloc(n * sizeof *posted); /* CUDA buffers staged */
    gvq_pinned_t *pin = NULL;
    size_t entered = 0;
    const char *what = NULL;
    if (reqs == NULL || xports == NULL || first == NULL || posted == NULL) {
        res = gvqSystemError;
        goto out_free;
    }
    for (size_t i = 0, q = 0; i <= n; i++) {
        first[i] = q;
        if (i == n || (ops[i].kind != GVQ_OP_SEND && ops[i].kind != GVQ_OP_RECV)) continue;
        for (size_t k = p2p_pieces(&ops[i]); k > 0; k--)
            xports[q++] = ops[i].comm->xport;
        if (what == NULL) what = op_fn[ops[i].kind]; /* the WARNs name the first */
    }
    GVQCHECKGOTO(p2p_stage_in(ops, n, posted, &pin), res, out_free);
    for (size_t i = 0; i < n; i++) {
        if (ops[i].kind != GVQ_OP_SEND && ops[i].kind != GVQ_OP_RECV) continue;
        GVQCHECKGOTO(gvq_comm_enter(ops[i].comm, op_fn[ops[i].kind]), res, out_leave);
        entered = i + 1;
        GVQCHECKGOTO(p2p_post(&posted[i], reqs + first[i]), res, out_leave);
    }
    /* all at once: a group's sends and receives on several communicators may wait on each other
     * across them (a send on one that its peer receives after its own send on the other) */
    GVQCHECKGOTO(gvq_xport_waitall_many(xports, reqs, (int)nreq, what), res, out_leave);
    res = p2p_stage_out(ops, posted, n);
out_leave:
    for (size_t i = 0; i < entered; i++) {
        if (ops[i].kind != GVQ_OP_SEND && ops[i].kind != GVQ_OP_RECV) continue;
        if (res != gvqSuccess)
            gvq_xport_cancelall(ops[i].comm->xport, reqs + first[i],
                                (int)(first[i + 1] - first[i]));
        gvq_comm_leave(ops[i].comm);
    }
    if (res != gvqSuccess && entered > 0 && pin != NULL) p2p_stage_abandon(pin);
out_free:
    if (!small) {
        free(reqs);
        free(xports);
        free(first);
        free(posted);
    }
    return res;
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
    if (b->refused == gvqSuccess) return run_batch(b->ops, b->n);
    refuse_together(&b->ops[0], b->refused);
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
    if (op_device(o) == &gvq_host_device) return gvqSuccess;
    GVQ_WARN("%s: stream %p is a host stream (gvqStreamCreate), but the buffers are CUDA memory; "
             "pass a cudaStream_t",
             op_fn[o->kind], o->stream);
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
                     i, op_fn[g->ops[i].kind], g->ops[i].stream, *out);
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
        else if (streamed && is_collective(o) && gvq_comm_is_live(o->comm))
            (void)enqueue_batch(o, 1, res, o->stream, op_fn[o->kind]);
        else
            refuse_together(o, res);
        return res;
    }
    if (g->depth > 0) return gvq_group_push(g, o);
    return streamed ? enqueue_batch(o, 1, gvqSuccess, o->stream, op_fn[o->kind]) : run_batch(o, 1);
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
            if (is_collective(&g->ops[i])) {
                if (hs != NULL && gvq_comm_is_live(g->ops[i].comm))
                    (void)enqueue_batch(&g->ops[i], 1, res, hs, "gvqGroupEnd");
                else
                    refuse_together(&g->ops[i], res);
                break;
            }
        GVQ_WARN("gvqGroupEnd: nothing of the group ran; a call was refused: %s", g->error_text);
    } else if (hs != NULL && g->n > 0)
        res = enqueue_batch(g->ops, g->n, gvqSuccess, hs, "gvqGroupEnd");
    else
        res = run_batch(g->ops, g->n);
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
