/*
 * gvq_ucx_impl.h -- the UCX transport's state, shared by ucx.c (the transport) and ucx_spare.c
 * (the spare worker of gvqCommShrink). Only with GVQ_WITH_UCX, after <ucp/api/ucp.h>.
 */
#ifndef GVQ_UCX_IMPL_H_
#define GVQ_UCX_IMPL_H_

#include "gvq_transport.h"

struct gvq_ucx {
    ucp_worker_h worker;
    int efd; /* the worker's event fd (UCP_FEATURE_WAKEUP), -1 without: the block op sleeps */
    ucp_address_t *addr;
    size_t addr_len;
    ucp_ep_h *eps; /* neps of them, like peers; rank r's is eps[map[r]] (map NULL: eps[r]) */
    int nranks, rank, neps;
    int *map;
    struct ucx_peer {
        struct gvq_ucx *u;
        int rank;
        ucs_status_t failed; /* UCS_OK while healthy (atomic) */
    } * peers;
    /* The spare worker (gvqCommShrink, below): opened at the communicator's creation, its
     * address and every rank's spare address exchanged by the communicator; once a shrink
     * starts, spare_t is the transport on it with endpoints to every rank. */
    struct gvq_ucx *spare;
    uint8_t *spare_addrs;
    int32_t *spare_lens;
    gvq_transport_t *spare_t;
    /* revoke (gvq_transport.h): a receive from any rank on GVQ_TAG_REVOKE, posted at creation;
     * revoked_by the rank whose notice came (-1: none); the notice this rank sends, once */
    void *revoke_req;
    int32_t revoke_in[2], revoke_out[2];
    int revoked_by, revoke_sent;
    gvqResult_t revoke_cause; /* the notice's error, once revoked_by >= 0 */
    /* Requests cancelled while UCX still had them (a receive matched to a rendezvous, a send
     * under way): UCX cannot call them back, so any later progress of the worker may still
     * write into (or read) a buffer its caller has freed since. The first breaks the
     * communicator (so its endpoints close unflushed and the close does not progress the
     * worker) and is reported once at INFO; this counts them. Atomic. */
    int orphans;
};

/* The transport on u with an endpoint to each of the n addresses (packed, lens[p] bytes each).
 * reach (NULL: every rank, and an endpoint that cannot be made fails the call) names the ranks
 * to reach; an endpoint to one of them that cannot be made marks that peer failed instead. */
gvqResult_t gvq_ucx_make_transport(gvq_ucx_t *u, const uint8_t *addrs, const int32_t *lens, int n,
                                   int rank, const uint8_t *reach, gvq_transport_t **out);

#endif /* GVQ_UCX_IMPL_H_ */
