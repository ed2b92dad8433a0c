/*
 * ucx_spare.c -- the spare worker of a UCX communicator, for gvqCommShrink (docs/ARCHITECTURE.md,
 * "gvqCommShrink and gvqCommGrow"): opened at creation, every rank's spare address kept, the
 * shrink's rounds run on endpoints to the spares, and the shrunk communicator keeps the spare's
 * worker (gvq_transport.h has the functions' contracts).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "gvq_transport.h"

#ifdef GVQ_WITH_UCX
#include <ucp/api/ucp.h>

#include "gvq_ucx_impl.h"

static gvq_ucx_t *impl(gvq_transport_t *t) {
    return t->impl;
}

/* ---- the spare worker: gvqCommShrink's ----------------------------------------------------
 * A broken communicator's worker is never progressed again (close_eps), so the survivors of a
 * failure cannot talk over it. Each UCX communicator therefore opens a second worker at
 * creation and exchanges its address (the communicator layer's gvq_comm_ucx_spare); a shrink
 * talks over endpoints to those spares and the shrunk communicator keeps the spare's worker. */

gvqResult_t gvq_ucx_spare_open(gvq_transport_t *t, const void **addr, size_t *len) {
    *addr = NULL;
    *len = 0;
    if (strcmp(t->ops->name, "ucx") != 0) return gvqInvalidUsage;
    gvq_ucx_t *u = impl(t);
    if (u->spare == NULL) GVQCHECK(gvq_ucx_open(&u->spare, addr, len));
    *addr = u->spare->addr;
    *len = u->spare->addr_len;
    return gvqSuccess;
}

gvqResult_t gvq_ucx_spare_peers(gvq_transport_t *t, const uint8_t *addrs, const int32_t *lens) {
    gvq_ucx_t *u = impl(t);
    size_t total = 0;
    for (int p = 0; p < u->nranks; p++)
        total += (size_t)GVQ_MAX(lens[p], 0);
    free(u->spare_addrs);
    free(u->spare_lens);
    u->spare_addrs = malloc(total > 0 ? total : 1);
    u->spare_lens = malloc((size_t)u->nranks * sizeof *lens);
    if (u->spare_addrs == NULL || u->spare_lens == NULL) {
        free(u->spare_addrs);
        free(u->spare_lens);
        u->spare_addrs = NULL;
        u->spare_lens = NULL;
        GVQ_WARN("UCX transport: out of memory for %d spare addresses", u->nranks);
        return gvqSystemError;
    }
    memcpy(u->spare_addrs, addrs, total);
    memcpy(u->spare_lens, lens, (size_t)u->nranks * sizeof *lens);
    return gvqSuccess;
}

gvqResult_t gvq_ucx_spare_transport(gvq_transport_t *t, const uint8_t *reach,
                                    gvq_transport_t **out) {
    *out = NULL;
    if (strcmp(t->ops->name, "ucx") != 0) return gvqInvalidUsage;
    gvq_ucx_t *u = impl(t);
    if (u->spare_t == NULL && (u->spare == NULL || u->spare_addrs == NULL)) {
        GVQ_WARN("UCX transport: this communicator has no spare worker (GVQ_UCX_SPARE=0, a "
                 "communicator of gvq's own, or one shrink of it already used it)");
        return gvqInvalidUsage;
    }
    if (u->spare_t == NULL) {
        GVQCHECK(gvq_ucx_make_transport(u->spare, u->spare_addrs, u->spare_lens, u->nranks, u->rank,
                                        reach, &u->spare_t));
        u->spare = NULL; /* spare_t's now */
        u->spare_t->timeout_ns = t->timeout_ns;
        u->spare_t->abort_flag = t->abort_flag;
    }
    *out = u->spare_t;
    return gvqSuccess;
}

gvqResult_t gvq_ucx_spare_take(gvq_transport_t *t, const int *ranks, int m, int me,
                               gvq_transport_t **out) {
    gvq_ucx_t *u = impl(t);
    *out = NULL;
    gvq_transport_t *s = u->spare_t;
    gvq_ucx_t *su = s != NULL ? impl(s) : NULL;
    int *map = su != NULL ? malloc((size_t)m * sizeof *map) : NULL;
    if (map == NULL) return su != NULL ? gvqSystemError : gvqInvalidUsage;
    uint8_t *member = calloc((size_t)su->neps, 1);
    if (member == NULL) {
        free(map);
        return gvqSystemError;
    }
    for (int i = 0; i < m; i++) {
        map[i] = ranks[i];
        member[ranks[i]] = 1;
        su->peers[ranks[i]].rank = i; /* as its WARNs name it */
    }
    /* the others' endpoints go: the shrink's last messages to them need not arrive */
    for (int p = 0; p < su->neps; p++)
        if (!member[p] && su->eps[p] != NULL) {
            ucp_request_param_t rp;
            memset(&rp, 0, sizeof rp);
            rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
            rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
            void *r = ucp_ep_close_nbx(su->eps[p], &rp);
            if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
            su->eps[p] = NULL;
        }
    free(member);
    su->map = map;
    su->nranks = m;
    su->rank = me;
    s->rank = me;
    s->nranks = m;
    s->abort_flag = NULL;
    u->spare_t = NULL;
    *out = s;
    return gvqSuccess;
}

#else /* !GVQ_WITH_UCX */

gvqResult_t gvq_ucx_spare_open(gvq_transport_t *t, const void **addr, size_t *len) {
    (void)t;
    *addr = NULL;
    *len = 0;
    return gvqInvalidUsage;
}
gvqResult_t gvq_ucx_spare_peers(gvq_transport_t *t, const uint8_t *addrs, const int32_t *lens) {
    (void)t, (void)addrs, (void)lens;
    return gvqInvalidUsage;
}
gvqResult_t gvq_ucx_spare_transport(gvq_transport_t *t, const uint8_t *reach,
                                    gvq_transport_t **out) {
    (void)t, (void)reach;
    *out = NULL;
    return gvqInvalidUsage;
}
gvqResult_t gvq_ucx_spare_take(gvq_transport_t *t, const int *ranks, int m, int me,
                               gvq_transport_t **out) {
    (void)t, (void)ranks, (void)m, (void)me;
    *out = NULL;
    return gvqInvalidUsage;
}

#endif
