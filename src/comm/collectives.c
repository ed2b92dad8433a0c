/*
 * collectives.c -- running the plain collective and point-to-point calls that calls.c checked
 * and queued: each collective's agreement on its signature (signature.c), the algorithm the
 * selection picks (select.c) from src/algorithms/, CUDA buffers on NCCL or staged through pinned
 * host memory, and a batch's sends and receives posted together.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gvq_comm_nccl.h"
#include "gvq_select.h"
#include "gvq_stream.h"

const char *const gvq_op_fn[] = {"gvqAllReduce",     "gvqBroadcast",          "gvqReduce",
                                 "gvqReduceScatter", "gvqAllGather",          "gvqSend",
                                 "gvqRecv",          "gvqAllReduceCompressed"};

/* Point-to-point messages larger than this travel in pieces (one MPI message holds < 2 GiB). */
#define P2P_PIECE ((size_t)1 << 30)

/* Bytes this rank reads from sendbuff and writes to recvbuff. */
void gvq_op_lengths(const gvq_op_t *o, size_t *slen, size_t *rlen) {
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

/* ---- signatures ------------------------------------------------------------------------------
 * Before a collective moves data, the ranks agree on its signature (signature.c): a call whose
 * arguments differ between the ranks fails on every rank, naming both sides. A rank that refuses
 * its own arguments still takes part (with its refusal), so the others fail at once. */

static gvq_algo_t op_algo(const gvq_op_t *o);

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
                            .device = gvq_op_device(o) != &gvq_host_device,
                            .refused = refused};
}

int gvq_op_is_collective(const gvq_op_t *o) {
    return o->kind != GVQ_OP_SEND && o->kind != GVQ_OP_RECV;
}

/* A collective this rank refused (res) takes part in the agreement when its communicator can
 * carry it (live, not aborted, not broken), so that the other ranks' calls fail at once. */
void gvq_op_refuse_together(const gvq_op_t *o, gvqResult_t res) {
    if (!gvq_op_is_collective(o) || !gvq_comm_is_live(o->comm)) return;
    if (gvq_comm_enter(o->comm, gvq_op_fn[o->kind]) != gvqSuccess) return;
    gvq_call_sig_t sig = op_signature(o, res);
    (void)gvq_call_agree(o->comm, gvq_op_fn[o->kind], &sig);
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
                           o->comm->xport->stages_sends, hosts, o->comm->hier != NULL);
}

int gvq_comm_hier_compressed(gvqComm_t c) {
    return c->hier != NULL && !c->xport->fifo &&
           gvq_select_forced(GVQ_OP_ALLREDUCE) == GVQ_ALGO_HIER;
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

/* The hierarchical allreduce of whole vectors by recursive doubling up to this size, by pieces
 * on rings above (measured on the emulated 1 Gbit/s cluster, perf/RESULTS.md section 14). */
#define GVQ_HIER_SMALL_BYTES ((size_t)16 << 10)

static gvqResult_t run_allreduce(const gvq_op_t *o, gvq_coll_ctx_t *ctx, gvq_algo_t algo) {
    size_t bytes = o->count * gvq_dtype_size(o->dtype);
    if (algo == GVQ_ALGO_RD)
        return gvq_rd_allreduce(ctx, o->sendbuff, o->recvbuff, o->count, o->dtype, o->op);
    if (algo == GVQ_ALGO_RAB)
        return gvq_rab_allreduce(ctx, o->sendbuff, o->recvbuff, o->count, o->dtype, o->op);
    if (algo == GVQ_ALGO_DIRECT)
        return gvq_direct_allreduce(ctx, o->sendbuff, o->recvbuff, o->count, o->dtype, o->op);
    gvq_codec_t codec;
    gvq_codec_identity_init(&codec, ctx->dev, o->dtype, o->op);
    if (algo == GVQ_ALGO_HIER && ctx->hier != NULL && bytes <= GVQ_HIER_SMALL_BYTES)
        return gvq_hier_allreduce_small(ctx, o->sendbuff, o->recvbuff, o->count, o->dtype, o->op);
    if (algo == GVQ_ALGO_HIER && ctx->hier != NULL)
        return gvq_hier_allreduce(ctx, &codec, o->sendbuff, o->recvbuff, o->count, o->op);
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
        if (algo == GVQ_ALGO_HIER && ctx.hier != NULL)
            return gvq_hier_reduce_scatter(&ctx, o->sendbuff, o->recvbuff, o->count, o->dtype,
                                           o->op);
        if (algo == GVQ_ALGO_RAB)
            return gvq_rab_reduce_scatter(&ctx, o->sendbuff, o->recvbuff, o->count, o->dtype,
                                          o->op);
        return gvq_ring_reduce_scatter(&ctx, o->sendbuff, o->recvbuff, o->count, o->dtype, o->op);
    case GVQ_OP_ALLGATHER:
        if (algo == GVQ_ALGO_HIER && ctx.hier != NULL)
            return gvq_hier_allgather(&ctx, o->sendbuff, o->recvbuff, o->count, o->dtype);
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
const gvq_device_ops_t *gvq_op_device(const gvq_op_t *o) {
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
    gvq_op_lengths(o, &slen, &rlen);
    return gvq_device_staged(dev, o->stream, gvq_op_fn[o->kind], &o->comm->pinned, o->sendbuff,
                             slen, o->recvbuff, rlen, staged_body, (void *)o);
}

static gvqResult_t run_collective_any(const gvq_op_t *o) {
    const gvq_device_ops_t *dev = gvq_op_device(o);
    if (dev == &gvq_host_device) return run_collective(o, 1);
    size_t slen, rlen;
    gvq_op_lengths(o, &slen, &rlen);
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
    gvq_transport_t *t = o->comm->p2p;
    size_t bytes = o->count * gvq_dtype_size(o->dtype), np = p2p_pieces(o);
    for (size_t i = 0; i < np; i++) {
        size_t len = GVQ_MIN(P2P_PIECE, bytes - i * P2P_PIECE);
        int send = o->kind == GVQ_OP_SEND;
        const char *sb = send ? (const char *)o->sendbuff + i * P2P_PIECE : NULL;
        char *rb = send ? NULL : (char *)o->recvbuff + i * P2P_PIECE;
        if (send)
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
enum { SIGNED_ONE_HOST_BYTES = 3840, SIGNED_WHOLE_BYTES = 2048 };

/* Whether o, a collective with signature sig, is one whose data can ride along with its
 * signature (gvq_call_agree_allreduce): the shm algorithm, a small allreduce by recursive
 * doubling, or another collective whose exchanged vector is small (reducescatter, allgather,
 * broadcast, reduce: one recursive-doubling allreduce of it, recursive.c; not through shared
 * memory, nor when GVQ_ALGO names an algorithm), over a transport that reads messages of any
 * length; host buffers, no zero-code compression. Decided from what sig
 * holds and the transport (the same on every rank), so that ranks with equal signatures choose
 * alike; ranks that choose differently have different signatures and still read each other. */
static int rides_along(const gvq_op_t *o, const gvq_call_sig_t *sig, gvq_signed_payload_t *pay) {
    size_t bytes = o->count * gvq_dtype_size(o->dtype);
    size_t max = sig->algo == GVQ_ALGO_SHM  ? SIZE_MAX /* a slot's worth at a time */
                 : o->comm->xport->one_host ? SIGNED_ONE_HOST_BYTES
                                            : GVQ_SIGNED_MAX_BYTES;
    int upto = o->comm->xport->ops->irecv_upto != NULL;
    int rd = sig->algo == GVQ_ALGO_RD && o->kind == GVQ_OP_ALLREDUCE && upto;
    if (sig->identity != 0 || o->comm->nranks < 2 || o->count == 0 || sig->device) return 0;
    *pay = op_payload(o);
    if (sig->algo == GVQ_ALGO_SHM || rd) return bytes <= max;
    /* the others ride along as one recursive-doubling allreduce of their whole vector: log2 N
     * rounds of it, whose bytes together stay within a limit. A broadcast's and a reduce's
     * vector is what they move anyway: the signed exchange's 64 KiB (2 ranks; 21 KiB at 8). A
     * reducescatter's and an allgather's is N blocks where their own algorithms send each block
     * once: 2 KiB (1 KiB at 4 ranks), while those extra bytes cost less than the round the
     * agreement saves (2 hosts at 1 Gbit/s: ahead at 1 KiB, behind from 4 KiB; perf/
     * RESULTS.md section 13) */
    if (!upto || o->kind == GVQ_OP_ALLREDUCE || o->comm->shm_state == 1 ||
        gvq_select_forced(o->kind) != GVQ_ALGO_AUTO) /* GVQ_ALGO: the algorithm it names */
        return 0;
    int rounds = 0;
    while ((1 << rounds) < o->comm->nranks)
        rounds++;
    size_t x = gvq_rd_signed_bytes(pay, o->comm->nranks) * (size_t)rounds;
    int whole = o->kind == GVQ_OP_REDUCE_SCATTER || o->kind == GVQ_OP_ALLGATHER;
    int ride = x <= max && x <= (whole ? (size_t)SIGNED_WHOLE_BYTES : (size_t)GVQ_SIGNED_MAX_BYTES);
    if (ride) gvq_select_report_ride(o->kind, bytes, o->comm->nranks);
    return ride;
}

/* ---- point-to-point on CUDA buffers: staged through pinned host memory ----------------------
 * A send's bytes are copied into pinned memory behind its stream before anything is posted; a
 * receive lands in pinned memory and is copied into its buffer once every transfer of the batch
 * completed, so the call returns with the data in place (as the staged collectives do). The
 * block comes from the communicator of the batch's first such call. After a failed transfer the
 * transport may still touch it: it is then abandoned, never reused or freed. */

static int p2p_on_device(const gvq_op_t *o) {
    return (o->kind == GVQ_OP_SEND || o->kind == GVQ_OP_RECV) &&
           gvq_op_device(o) != &gvq_host_device;
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
    const gvq_device_ops_t *dev = gvq_op_device(lead);
    char *h = gvq_pinned_reserve(&lead->comm->pinned, dev, total);
    if (h == NULL) {
        GVQ_WARN("%s: cannot allocate %zu bytes of pinned host memory to stage CUDA buffers",
                 gvq_op_fn[lead->kind], total);
        return gvqSystemError;
    }
    *pin = &lead->comm->pinned;
    for (size_t i = 0; i < n; i++) {
        if (!p2p_on_device(&ops[i])) continue;
        size_t bytes = ops[i].count * gvq_dtype_size(ops[i].dtype);
        if (ops[i].kind == GVQ_OP_SEND) {
            GVQCHECK(gvq_device_copy_behind(gvq_op_device(&ops[i]), ops[i].stream, h,
                                            ops[i].sendbuff, bytes, 1));
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
            GVQCHECK(gvq_device_copy_behind(gvq_op_device(&ops[i]), ops[i].stream, ops[i].recvbuff,
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

gvqResult_t gvq_op_run_batch(const gvq_op_t *ops, size_t n) {
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
        GVQCHECK(gvq_comm_enter(ops[i].comm, gvq_op_fn[ops[i].kind]));
        gvq_shm_t *shm = NULL; /* made at the first collective: the algorithm depends on it */
        res = gvq_comm_shm(ops[i].comm, &shm);
        if (res != gvqSuccess) {
            gvq_comm_leave(ops[i].comm);
            return res;
        }
        gvq_call_sig_t sig = op_signature(&ops[i], gvqSuccess);
        gvq_signed_payload_t pay;
        if (rides_along(&ops[i], &sig, &pay)) { /* the agreement and the data in one exchange */
            res = gvq_call_agree_allreduce(ops[i].comm, gvq_op_fn[ops[i].kind], &sig, &pay);
        } else {
            res = gvq_call_agree(ops[i].comm, gvq_op_fn[ops[i].kind], &sig);
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
            xports[q++] = ops[i].comm->p2p;
        if (what == NULL) what = gvq_op_fn[ops[i].kind]; /* the WARNs name the first */
    }
    GVQCHECKGOTO(p2p_stage_in(ops, n, posted, &pin), res, out_free);
    for (size_t i = 0; i < n; i++) {
        if (ops[i].kind != GVQ_OP_SEND && ops[i].kind != GVQ_OP_RECV) continue;
        GVQCHECKGOTO(gvq_comm_enter(ops[i].comm, gvq_op_fn[ops[i].kind]), res, out_leave);
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
            gvq_xport_cancelall(ops[i].comm->p2p, reqs + first[i], (int)(first[i + 1] - first[i]));
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
