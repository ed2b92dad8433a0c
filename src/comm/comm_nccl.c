/*
 * comm_nccl.c -- NCCL beside a communicator (gvq_comm_nccl.h).
 *
 *   first collective on CUDA buffers        first device-resident compressed ring
 *   rank 0: ncclGetUniqueId                 (NCCL up, as on the left)
 *   chain broadcast of (ok, id)             every rank: a NCCL transport over the NCCL comm
 *   every rank: ncclCommInitRank            agree: min(ok) over the ranks
 *   agree: min(ok) over the ranks           all ok: adopted as comm's device transport
 *   all ok: NCCL runs them; else staged     else: the wire is staged over comm's transport
 *
 * The agreements run over the communicator's own transport, so every rank takes the same path.
 */
#include <string.h>

#include "gvq_comm_nccl.h"
#ifdef GVQ_WITH_NCCL
#include "gvq_nccl.h"

/* Set up NCCL beside comm, collectively (the left column above). */
static void nccl_attach(gvqComm_t c) {
    if (c->nccl_state != 0) return;
    c->nccl_state = -1;
    if (!gvq_param(GVQ_PARAM_NCCL)) return;
    gvq_coll_ctx_t ctx = gvq_comm_ctx(c, NULL);
    struct {
        int32_t ok;
        char id[GVQ_NCCL_ID_BYTES];
    } msg;
    memset(&msg, 0, sizeof msg);
    if (c->rank == 0) msg.ok = gvq_nccl_get_id(msg.id) == gvqSuccess;
    if (gvq_chain_broadcast(&ctx, &msg, &msg, sizeof msg, 0) != gvqSuccess) return;
    gvq_nccl_t *n = NULL;
    int32_t ok = msg.ok && gvq_nccl_init(msg.id, c->nranks, c->rank, &n) == gvqSuccess;
    if (gvq_agree_i32(&ctx, &ok, 1, gvqMin) == gvqSuccess && ok) {
        c->nccl = n;
        c->nccl_state = 1;
        GVQ_INFO("comm %p rank %d: collectives on CUDA buffers run on NCCL", (void *)c, c->rank);
        return;
    }
    gvq_nccl_destroy(n, 1);
    GVQ_INFO("comm %p rank %d: NCCL unavailable on some rank; CUDA buffers are staged through host "
             "memory",
             (void *)c, c->rank);
}

/* The NCCL transport for device-resident rings, made once every rank has NCCL and agreed that
 * every rank could make the transport (the right column above). */
static void nccl_transport_attach(gvqComm_t c) {
    c->dxport_state = -1;
    if (!gvq_param(GVQ_PARAM_NCCL_RING)) return;
    nccl_attach(c);
    if (c->nccl_state != 1) return;
    gvq_transport_t *t = NULL;
    int32_t ok = gvq_nccl_transport_create(c->nccl, &t) == gvqSuccess;
    gvq_coll_ctx_t ctx = gvq_comm_ctx(c, NULL);
    if (gvq_agree_i32(&ctx, &ok, 1, gvqMin) == gvqSuccess && ok) {
        gvq_comm_adopt_device_transport(c, t, &gvq_cuda_device);
        GVQ_INFO("comm %p rank %d: compressed rings on CUDA buffers run over NCCL", (void *)c,
                 c->rank);
        return;
    }
    if (t != NULL) t->ops->destroy(t);
}

int gvq_comm_nccl_ready(gvqComm_t c) {
    nccl_attach(c);
    return c->nccl_state == 1;
}

gvqResult_t gvq_comm_nccl_collective(const gvq_op_t *o) {
    static const gvq_nccl_coll_t kind[] = {[GVQ_OP_ALLREDUCE] = GVQ_NCCL_ALLREDUCE,
                                           [GVQ_OP_BROADCAST] = GVQ_NCCL_BROADCAST,
                                           [GVQ_OP_REDUCE] = GVQ_NCCL_REDUCE,
                                           [GVQ_OP_REDUCE_SCATTER] = GVQ_NCCL_REDUCE_SCATTER,
                                           [GVQ_OP_ALLGATHER] = GVQ_NCCL_ALLGATHER};
    if (o->kind > GVQ_OP_ALLGATHER) return gvqInternalError;
    return gvq_nccl_collective(o->comm->nccl, kind[o->kind], o->sendbuff, o->recvbuff, o->count,
                               o->dtype, o->op, o->root, o->stream);
}
#else
int gvq_comm_nccl_ready(gvqComm_t c) {
    (void)c;
    return 0;
}

gvqResult_t gvq_comm_nccl_collective(const gvq_op_t *o) {
    (void)o;
    return gvqInternalError;
}
#endif

gvq_transport_t *gvq_comm_device_transport(gvqComm_t c, const gvq_device_ops_t *dev) {
#ifdef GVQ_WITH_NCCL
    if (c->dxport_state == 0 && dev == &gvq_cuda_device) nccl_transport_attach(c);
#endif
    return c->dxport_state == 1 && c->dxport_dev == dev ? c->dxport : NULL;
}
