/*
 * compressed_call.c -- gvqAllReduceCompressed: the call checked, its signature agreed, and run
 * by its compressor's method (gvq_method.h): on host buffers, device-resident (the methods that
 * run the phase's codec on a device with codecs, phase_call.c) or staged whole through pinned
 * host memory (error feedback, mixed buffers, an integer wire, GVQ_DEVICE_CODECS=0, and the
 * methods without device kernels). Calls queued in a group run under one agreement, those of a
 * method that fuses in one call of that method (gvq_compressed_allreduce_set).
 */
#include <math.h>
#include <stdlib.h>

#include "gvq_method.h"
#include "gvq_group.h"
#include "gvq_stream.h"

gvqResult_t gvq_compressed_allreduce_entered(gvqCompressor_t c, const void *send, void *recv,
                                             gvqRedOp_t op) {
    return c->method->allreduce(c, send, recv, op);
}

typedef struct {
    gvqCompressor_t c;
    gvqRedOp_t op;
} staged_call_t;

static gvqResult_t compressed_on_host(void *arg, const void *send, void *recv) {
    const staged_call_t *s = arg;
    return gvq_compressed_allreduce_entered(s->c, send, recv, s->op);
}

/* ---- the public call ------------------------------------------------------------------------- */

static gvqResult_t check_call(const void *sendbuff, void *recvbuff, size_t count,
                              gvqDataType_t datatype, gvqRedOp_t op, gvqCompressor_t compressor,
                              gvqComm_t comm) {
    const char *fn = "gvqAllReduceCompressed";
    if (!gvq_compressor_live(compressor)) {
        GVQ_WARN("%s: compressor %p is not a live compressor", fn, (void *)compressor);
        return gvqInvalidArgument;
    }
    if (compressor->comm != comm) {
        GVQ_WARN("%s: the compressor belongs to another communicator", fn);
        return gvqInvalidArgument;
    }
    if (datatype != gvqFloat32) {
        GVQ_WARN("%s: datatype %s: compressed allreduce takes gvqFloat32", fn,
                 gvq_dtype_name(datatype));
        return gvqInvalidArgument;
    }
    if (op != gvqSum && op != gvqAvg) {
        GVQ_WARN("%s: op %d: compressed allreduce takes gvqSum or gvqAvg", fn, (int)op);
        return gvqInvalidArgument;
    }
    if (count != compressor->cfg.count) {
        GVQ_WARN("%s: count %zu, but the compressor was made for %llu", fn, count,
                 (unsigned long long)compressor->cfg.count);
        return gvqInvalidArgument;
    }
    if (sendbuff == NULL || recvbuff == NULL) {
        GVQ_WARN("%s: %s is NULL", fn, sendbuff == NULL ? "sendbuff" : "recvbuff");
        return gvqInvalidArgument;
    }
    uintptr_t sb = (uintptr_t)sendbuff, rb = (uintptr_t)recvbuff; /* distances: cannot wrap */
    if (sendbuff != recvbuff && (sb < rb ? rb - sb : sb - rb) / 4 < count) {
        GVQ_WARN("%s: recvbuff overlaps sendbuff but is not in place", fn);
        return gvqInvalidArgument;
    }
    return gvqSuccess;
}

/* The call's signature (gvq_call_agree, signature.c): what every rank must pass alike, the
 * compressor's config among it; refused: this rank's own refusal of its arguments. */
static gvq_call_sig_t call_sig(size_t count, gvqRedOp_t op, gvqCompressor_t compressor,
                               gvqResult_t refused) {
    uint64_t identity = refused == gvqSuccess ? gvq_compressor_identity(compressor) : 0;
    return (gvq_call_sig_t){.kind = GVQ_SIG_COMPRESSED,
                            .count = count,
                            .dtype = gvqFloat32,
                            .op = (int)op,
                            .root = -1,
                            .identity = identity,
                            .algo = -1, /* the codec's ring */
                            .refused = refused};
}

/* A call this rank refused takes part in the agreement when the communicator can carry it, so
 * that the other ranks fail at once instead of waiting out the timeout. */
static void refuse_together(gvqComm_t comm, const char *fn, size_t count, gvqRedOp_t op,
                            gvqResult_t res) {
    if (!gvq_comm_is_live(comm) || gvq_group_active()) return;
    if (gvq_comm_enter(comm, fn) != gvqSuccess) return;
    gvq_call_sig_t sig = call_sig(count, op, NULL, res);
    (void)gvq_call_agree(comm, fn, &sig);
    gvq_comm_leave(comm);
}

/* The call once its arguments passed: agree on the signature, then run (on the caller's thread,
 * or on a host stream's progress thread). */
typedef struct {
    const void *sendbuff;
    void *recvbuff;
    size_t count;
    gvqRedOp_t op;
    gvqCompressor_t compressor;
    gvqComm_t comm;
    gvqStream_t stream; /* a cudaStream_t, or NULL */
    gvqResult_t refused;
} compressed_args_t;

static gvqResult_t compressed_run(const compressed_args_t *a) {
    const char *fn = "gvqAllReduceCompressed";
    gvqComm_t comm = a->comm;
    GVQCHECK(gvq_comm_enter(comm, fn));
    gvq_call_sig_t sig = call_sig(a->count, a->op, a->compressor, gvqSuccess);
    gvqResult_t agreed = gvq_call_agree(comm, fn, &sig);
    if (agreed != gvqSuccess) {
        gvq_comm_leave(comm);
        return agreed;
    }
    const gvq_device_ops_t *sdev = gvq_device_of(a->sendbuff), *rdev = gvq_device_of(a->recvbuff);
    const gvq_device_ops_t *dev = sdev != &gvq_host_device ? sdev : rdev;
    gvqCompressor_t c = a->compressor;
    staged_call_t sc = {c, a->op};
    size_t bytes = a->count * sizeof(float);
    gvqResult_t res;
    if (dev == &gvq_host_device)
        res = gvq_compressed_allreduce_entered(c, a->sendbuff, a->recvbuff, a->op);
    else if (sdev == rdev && gvq_device_has_codecs(dev) && !c->cfg.error_feedback &&
             c->method->device_resident && !c->cfg.int_bits && gvq_param(GVQ_PARAM_DEVICE_CODECS))
        res = gvq_compressed_run_device(c, dev, a->sendbuff, a->recvbuff, a->op, a->stream);
    else
        res = gvq_device_staged(dev, a->stream, fn, &comm->pinned, a->sendbuff, bytes, a->recvbuff,
                                bytes, compressed_on_host, &sc);
    gvq_comm_leave(comm);
    return res;
}

/* ---- groups: gvqAllReduceCompressed between gvqGroupStart and gvqGroupEnd ------------------ */

static gvq_call_sig_t compressed_signature(const gvq_op_t *o, gvqResult_t refused) {
    return call_sig(o->count, o->op, o->compressor, refused);
}

/* The signature of n > 1 compressed calls run as one: their counts summed, their compressors'
 * identities and counts mixed in call order, root the number of calls. A rank that groups the
 * calls differently (or not at all) fails the agreement on every rank. */
static gvq_call_sig_t group_sig(const gvq_op_t *ops, size_t n) {
    gvq_call_sig_t sig = call_sig(0, ops[0].op, ops[0].compressor, gvqSuccess);
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n; i++) {
        sig.count += ops[i].count;
        h = (h ^ gvq_compressor_identity(ops[i].compressor)) * 0x100000001B3ull;
        h = (h ^ (uint64_t)ops[i].count ^ ((uint64_t)ops[i].op << 40)) * 0x100000001B3ull;
    }
    sig.identity = h;
    sig.root = (int)GVQ_MIN(n, (size_t)INT32_MAX);
    return sig;
}

int gvq_compressor_fuses(gvqCompressor_t c) {
    const gvq_method_t *m = c->method;
    return m->fusable != NULL && m->fusable(c, c);
}

/* The fused calls of one set: per method that fuses (methods.c's order), its calls. */
typedef struct {
    const gvq_method_t *m;
    gvqCompressor_t lead; /* the first call of the set that fuses with itself */
    gvqCompressor_t *c;
    const float **send;
    float **recv;
    size_t k;
} fused_t;

/* The method's fused call that c joins, NULL when c runs alone. */
static fused_t *fused_of(fused_t *f, size_t nf, gvqCompressor_t c) {
    for (size_t j = 0; j < nf; j++)
        if (f[j].m == c->method && f[j].lead != NULL && f[j].m->fusable(c, f[j].lead)) return &f[j];
    return NULL;
}

gvqResult_t gvq_compressed_allreduce_set(gvqCompressor_t const *c, const float *const *send,
                                         float *const *recv, const gvqRedOp_t *ops, gvqRedOp_t op,
                                         size_t n) {
    size_t nf = 0;
    while (gvq_methods[nf] != NULL)
        nf++;
    fused_t *f = calloc(nf, sizeof *f);
    gvqCompressor_t *cs = calloc(nf * n + 1, sizeof *cs);
    const float **s = calloc(nf * n + 1, sizeof *s);
    float **r = calloc(nf * n + 1, sizeof *r);
    gvqResult_t res = gvqSuccess;
    if (f == NULL || cs == NULL || s == NULL || r == NULL) {
        GVQ_WARN("gvqAllReduceCompressed: out of memory for a set of %zu compressed calls", n);
        res = gvqSystemError;
    }
    for (size_t j = 0; j < nf && res == gvqSuccess; j++) {
        f[j] = (fused_t){gvq_methods[j], NULL, cs + j * n, s + j * n, r + j * n, 0};
        for (size_t i = 0; i < n && f[j].m->fusable != NULL && f[j].lead == NULL; i++)
            if ((ops == NULL || ops[i] == op) && c[i]->method == f[j].m &&
                f[j].m->fusable(c[i], c[i]))
                f[j].lead = c[i];
    }
    /* the calls that run alone first, in call order; then each method's fused call */
    for (size_t i = 0; i < n && res == gvqSuccess; i++) {
        gvqRedOp_t o = ops != NULL ? ops[i] : op;
        fused_t *g = o == op ? fused_of(f, nf, c[i]) : NULL;
        if (g == NULL) {
            res = gvq_compressed_allreduce_entered(c[i], send[i], recv[i], o);
            continue;
        }
        g->c[g->k] = c[i];
        g->send[g->k] = send[i];
        g->recv[g->k++] = recv[i];
    }
    for (size_t j = 0; j < nf && res == gvqSuccess; j++)
        if (f[j].k > 0) res = f[j].m->allreduce_many(f[j].c, f[j].send, f[j].recv, f[j].k, op);
    free(f);
    free(cs);
    free(s);
    free(r);
    return res;
}

/* The group's calls under one agreement (all on host buffers), as one set fused by ops[0]'s op. */
static gvqResult_t group_entered(const gvq_op_t *ops, size_t n) {
    gvqCompressor_t *c = calloc(n, sizeof *c);
    const float **send = calloc(n, sizeof *send);
    float **recv = calloc(n, sizeof *recv);
    gvqRedOp_t *op = calloc(n, sizeof *op);
    gvqResult_t res = gvqSystemError;
    if (c == NULL || send == NULL || recv == NULL || op == NULL) {
        GVQ_WARN("gvqGroupEnd: out of memory for a group of %zu compressed calls", n);
    } else {
        for (size_t i = 0; i < n; i++)
            c[i] = ops[i].compressor, send[i] = ops[i].sendbuff, recv[i] = ops[i].recvbuff,
            op[i] = ops[i].op;
        res = gvq_compressed_allreduce_set(c, send, recv, op, ops[0].op, n);
    }
    free(c), free(send), free(recv), free(op);
    return res;
}

/* The consecutive compressed calls ops[0..n) of one communicator run under one agreement, the
 * QSGD and tracked-basis ones on host buffers fused. */
static gvqResult_t compressed_run_group(const gvq_op_t *ops, size_t n) {
    int host = 1;
    for (size_t i = 0; i < n; i++)
        host &= gvq_device_of(ops[i].sendbuff) == &gvq_host_device &&
                gvq_device_of(ops[i].recvbuff) == &gvq_host_device;
    if (n == 1 || !host) { /* one by one, each with its own agreement */
        for (size_t i = 0; i < n; i++) {
            compressed_args_t a = {ops[i].sendbuff,   ops[i].recvbuff, ops[i].count,  ops[i].op,
                                   ops[i].compressor, ops[i].comm,     ops[i].stream, gvqSuccess};
            if (gvq_stream_is_host(a.stream)) a.stream = NULL;
            GVQCHECK(compressed_run(&a));
        }
        return gvqSuccess;
    }
    const char *fn = "gvqAllReduceCompressed";
    gvqComm_t comm = ops[0].comm;
    GVQCHECK(gvq_comm_enter(comm, fn));
    gvq_call_sig_t sig = group_sig(ops, n);
    gvqResult_t res = gvq_call_agree(comm, fn, &sig);
    if (res == gvqSuccess) res = group_entered(ops, n);
    gvq_comm_leave(comm);
    return res;
}

/* what comm's group machinery calls for a queued compressed call (gvq_group.h) */
static const gvq_upper_ops_t compressed_upper = {.signature = compressed_signature,
                                                 .run_group = compressed_run_group};

/* The job of a call queued on a host stream (stream.c): the call, or its refusal. */
static gvqResult_t compressed_job(void *arg) {
    const compressed_args_t *a = arg;
    if (a->refused == gvqSuccess) return compressed_run(a);
    refuse_together(a->comm, "gvqAllReduceCompressed", a->count, a->op, a->refused);
    return gvqSuccess; /* the refusal was the call's result already */
}

static gvqResult_t enqueue_compressed(const compressed_args_t *a, gvqStream_t stream) {
    compressed_args_t *copy = malloc(sizeof *copy);
    if (copy == NULL) {
        GVQ_WARN("gvqAllReduceCompressed: out of memory queueing the call on stream %p", stream);
        return gvqSystemError;
    }
    *copy = *a;
    copy->stream = NULL; /* host buffers */
    return gvq_stream_enqueue(stream, "gvqAllReduceCompressed", &a->comm, 1, compressed_job, free,
                              copy);
}

GVQ_API gvqResult_t gvqAllReduceCompressed(const void *sendbuff, void *recvbuff, size_t count,
                                           gvqDataType_t datatype, gvqRedOp_t op,
                                           gvqCompressor_t compressor, gvqComm_t comm,
                                           gvqStream_t stream) {
    const char *fn = "gvqAllReduceCompressed";
    compressed_args_t a = {sendbuff, recvbuff, count, op, compressor, comm, stream, gvqSuccess};
    int streamed = gvq_stream_is_host(stream);
    gvqResult_t bad = check_call(sendbuff, recvbuff, count, datatype, op, compressor, comm);
    if (bad == gvqSuccess && streamed &&
        (gvq_device_of(sendbuff) != &gvq_host_device ||
         gvq_device_of(recvbuff) != &gvq_host_device)) {
        GVQ_WARN("%s: stream %p is a host stream (gvqStreamCreate), but a buffer is CUDA memory; "
                 "pass a cudaStream_t",
                 fn, stream);
        bad = gvqInvalidArgument;
    }
    if (gvq_group_active()) { /* queued; gvqGroupEnd runs it, fused where it can */
        gvq_group_t *g = gvq_group_self();
        if (bad != gvqSuccess) {
            gvq_group_refuse(g, bad);
            return bad;
        }
        gvq_op_t o = {.kind = GVQ_OP_COMPRESSED,
                      .sendbuff = sendbuff,
                      .recvbuff = recvbuff,
                      .count = count,
                      .dtype = gvqFloat32,
                      .op = op,
                      .comm = comm,
                      .stream = stream,
                      .compressor = compressor,
                      .upper = &compressed_upper};
        return gvq_group_push(g, &o);
    }
    if (bad != gvqSuccess) {
        a.refused = bad;
        if (streamed && gvq_comm_is_live(comm) && !gvq_group_active())
            (void)enqueue_compressed(&a, stream);
        else
            refuse_together(comm, fn, count, op, bad);
        return bad;
    }
    GVQCHECK(gvq_comm_check(comm, fn, 1)); /* live, and not inside a group */
    return streamed ? enqueue_compressed(&a, stream) : compressed_run(&a);
}
