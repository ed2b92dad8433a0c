/*
 * ucx.c -- the UCX transport: UCX's ucp tag matching, one worker per communicator, no MPI.
 *
 * UCX picks the wire per peer (shared memory, TCP, InfiniBand/RoCE verbs, CUDA memory) from
 * what the host has and UCX_TLS / UCX_NET_DEVICES allow. gvq_ucx_open makes the worker, whose
 * address the bootstrap carries to every rank (the rank's blob); gvq_ucx_transport_create then
 * makes one endpoint per rank, this one's own included.
 *
 * Tags: (gvq tag << 32) | source rank, matched exactly, so messages of one pair and tag match
 * in the order posted (UCX keeps the order of one endpoint's tag messages). A receive is posted
 * with UCP_OP_ATTR_FLAG_NO_IMM_CMPL so its request reports the length that came.
 *
 * Progress: test and progress drive ucp_worker_progress; the worker runs in UCX's multi-thread
 * mode (host streams call from their own threads). A failed peer (UCP_ERR_HANDLING_MODE_PEER)
 * fails the requests with it; gvq's wait loop turns a stall into gvqTimeout as for MPI. A wait
 * that sleeps (GVQ_WAIT) sleeps on the worker's event fd (ucx_block).
 * A send UCX has started cannot be called back, so a cancelled send may still read its buffer
 * (cancel_keeps_buffers, as MPI).
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gvq_transport.h"

#ifdef GVQ_WITH_UCX
#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

/* one ucp context per process, shared by the communicators' workers */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static ucp_context_h ctx;
static int ctx_refs;
static int ctx_wakeup; /* the context has UCP_FEATURE_WAKEUP: workers have event fds */

#include "gvq_ucx_impl.h"

enum { K_SEND = 1, K_RECV = 2, K_UPTO = 4 };

/* Whether this host's UCX has only TCP for the network (besides shared memory and loopback):
 * no component but these has a memory domain here (an InfiniBand/RoCE device gives "ib" one,
 * a GPU "cuda_cpy"). */
static int tcp_only(void) {
    static const char *const plain[] = {"self", "tcp", "sysv", "posix", "cma", "knem", "xpmem"};
    uct_component_h *comps = NULL;
    unsigned n = 0;
    if (uct_query_components(&comps, &n) != UCS_OK) return 0;
    int only = 1;
    for (unsigned i = 0; i < n && only; i++) {
        uct_component_attr_t a;
        memset(&a, 0, sizeof a);
        a.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
        if (uct_component_query(comps[i], &a) != UCS_OK || a.md_resource_count == 0) continue;
        int known = 0;
        for (size_t k = 0; k < sizeof plain / sizeof plain[0]; k++)
            known |= strcmp(a.name, plain[k]) == 0;
        only = known;
    }
    uct_release_component_list(comps);
    return only;
}

static gvqResult_t ctx_get(void) {
    pthread_mutex_lock(&ctx_lock);
    gvqResult_t res = gvqSuccess;
    if (ctx_refs == 0) {
        ucp_config_t *cfg = NULL;
        /* TCP connects without blocking unless the user says otherwise: UCX's default connect
         * (UCX_TCP_CONN_NB=n) blocks ucp_ep_create until the kernel gives up, and a peer behind
         * a link that is down (SYN resent at 1, 3, 7, 15, 31 s ...) held a survivor there for
         * ~31 s, past the shrink's first round, so the others left without it (RELIABILITY,
         * "Link faults"). A connection that fails now fails the endpoint, as a dead peer's does
         * (ep_failed). The transport's options are read from the environment when a worker opens
         * its interfaces (ucp_config_modify's key is not applied to them in UCX 1.13), so the
         * default is set there, once, before UCX starts (overwrite 0: a user's value stays).
         * setenv is not safe against a getenv running in another thread at that moment: it runs
         * once a process, under ctx_lock, when the first UCX communicator is made. */
        setenv("UCX_TCP_CONN_NB", "y", 0);
        /* One socket event per poll of a TCP interface (UCX's default takes up to 16 from one
         * epoll_wait and handles them in turn). UCX 1.13 can close an endpoint while handling
         * one event of such a batch and then meet that endpoint's own event, stale, later in
         * the same batch: it aborts the process (tcp_iface.c, "Assertion `ep->conn_state !=
         * UCT_TCP_EP_CONN_STATE_CLOSED' failed"). It struck a rank that resumed after SIGSTOP
         * and connected to three peers' closed spare workers at once (mpi_shrink_stall_ucx_np4:
         * 3 aborts in 40 runs with the default, 0 in 80 with 1; perf/RESULTS.md section 13 has
         * the TCP cost: within the runs' noise at 2 ranks). */
        setenv("UCX_TCP_MAX_POLL", "1", 0);
        ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
        /* Over TCP a large message goes eagerly (no rendezvous), unless the user chose: a
         * rendezvous's handshake crosses the link behind the data already queued on it, once
         * per ring chunk, and on 2 hosts at 1 Gbit/s gvq's 64 MiB allreduce ran at 0.64 of the
         * link (0.95 eagerly; perf/RESULTS.md section 13). With RDMA or GPU memory domains the
         * rendezvous (zero copy) stays. gvq posts its receives before the matching sends, so
         * eager data lands in them; only this context is changed (not Open MPI's). */
        if (st == UCS_OK && getenv("UCX_RNDV_THRESH") == NULL && tcp_only() &&
            ucp_config_modify(cfg, "RNDV_THRESH", "inf") == UCS_OK)
            GVQ_INFO("UCX transport: TCP only here: large messages eager (UCX_RNDV_THRESH=inf)");
        if (st == UCS_OK) {
            ucp_params_t p;
            memset(&p, 0, sizeof p);
            p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
            p.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP; /* GVQ_WAIT=block sleeps on */
            p.mt_workers_shared = 1;                           /* the worker's event fd */
            st = ucp_init(&p, cfg, &ctx);
            ctx_wakeup = st == UCS_OK;
            if (st != UCS_OK) { /* a UCX without wakeup support: waits sleep instead */
                p.features = UCP_FEATURE_TAG;
                st = ucp_init(&p, cfg, &ctx);
            }
            ucp_config_release(cfg);
        }
        if (st != UCS_OK) {
            GVQ_WARN("UCX transport: ucp_init failed: %s", ucs_status_string(st));
            res = gvqSystemError;
        }
    }
    if (res == gvqSuccess) ctx_refs++;
    pthread_mutex_unlock(&ctx_lock);
    return res;
}

static void ctx_put(void) {
    pthread_mutex_lock(&ctx_lock);
    if (--ctx_refs == 0) {
        ucp_cleanup(ctx);
        ctx = NULL;
    }
    pthread_mutex_unlock(&ctx_lock);
}

int gvq_ucx_available(void) {
    return 1;
}

gvqResult_t gvq_ucx_open(gvq_ucx_t **out, const void **addr, size_t *addr_len) {
    *out = NULL;
    GVQCHECK(ctx_get());
    gvq_ucx_t *u = calloc(1, sizeof *u);
    if (u == NULL) {
        ctx_put();
        GVQ_WARN("UCX transport: out of memory");
        return gvqSystemError;
    }
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_MULTI;
    ucs_status_t st = ucp_worker_create(ctx, &wp, &u->worker);
    if (st == UCS_OK) {
        ucp_worker_attr_t wa;
        memset(&wa, 0, sizeof wa);
        wa.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
        if (ucp_worker_query(u->worker, &wa) == UCS_OK && wa.thread_mode != UCS_THREAD_MODE_MULTI)
            GVQ_WARN("UCX transport: this UCX gives no multi-thread workers; host streams and "
                     "calls from several threads are not safe on it");
        u->efd = -1;
        if (ctx_wakeup && ucp_worker_get_efd(u->worker, &u->efd) != UCS_OK) u->efd = -1;
        st = ucp_worker_get_address(u->worker, &u->addr, &u->addr_len);
        if (st != UCS_OK) ucp_worker_destroy(u->worker);
    }
    if (st != UCS_OK) {
        GVQ_WARN("UCX transport: cannot make a worker: %s", ucs_status_string(st));
        free(u);
        ctx_put();
        return gvqSystemError;
    }
    *out = u;
    *addr = u->addr;
    *addr_len = u->addr_len;
    return gvqSuccess;
}

/* Close the endpoints made so far: flushed (bounded by timeout_ns) while healthy, else forced. */
static void close_eps(gvq_ucx_t *u, int n, int force, uint64_t timeout_ns) {
    void **reqs = calloc((size_t)n, sizeof *reqs);
    for (int p = 0; p < n; p++) {
        if (u->eps[p] == NULL) continue;
        ucp_request_param_t rp;
        memset(&rp, 0, sizeof rp);
        rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        rp.flags = force || __atomic_load_n(&u->peers[p].failed, __ATOMIC_ACQUIRE) != UCS_OK
                       ? UCP_EP_CLOSE_FLAG_FORCE
                       : 0;
        void *r = ucp_ep_close_nbx(u->eps[p], &rp);
        if (UCS_PTR_IS_PTR(r)) {
            if (reqs != NULL)
                reqs[p] = r;
            else
                ucp_request_free(r);
        }
        u->eps[p] = NULL;
    }
    if (force && reqs != NULL) {
        /* a broken communicator's worker is never progressed again: a receive cancelled after
         * a timeout may already be matched to a rendezvous, and progress would still land its
         * data in a buffer the caller has since freed (UCX cannot cancel it then). The close
         * requests are left to UCX, which frees them with the worker. */
        for (int p = 0; p < n; p++)
            if (reqs[p] != NULL) ucp_request_free(reqs[p]);
        free(reqs);
        return;
    }
    uint64_t start = gvq_now_ns();
    for (int left = 1; left && reqs != NULL;) {
        ucp_worker_progress(u->worker);
        left = 0;
        for (int p = 0; p < n; p++) {
            if (reqs[p] == NULL) continue;
            if (ucp_request_check_status(reqs[p]) != UCS_INPROGRESS) {
                ucp_request_free(reqs[p]);
                reqs[p] = NULL;
            } else {
                left = 1;
            }
        }
        if (left && timeout_ns != 0 && gvq_now_ns() - start > timeout_ns) {
            GVQ_WARN("UCX transport: endpoints not closed within the timeout; left to UCX");
            for (int p = 0; p < n; p++)
                if (reqs[p] != NULL) ucp_request_free(reqs[p]);
            break;
        }
    }
    free(reqs);
}

void gvq_ucx_close(gvq_ucx_t *u) {
    if (u == NULL) return;
    if (u->eps != NULL) close_eps(u, u->neps, 1, 0);
    if (u->spare_t != NULL) u->spare_t->ops->destroy(u->spare_t);
    gvq_ucx_close(u->spare);
    free(u->eps);
    free(u->peers);
    free(u->map);
    free(u->spare_addrs);
    free(u->spare_lens);
    ucp_worker_release_address(u->worker, u->addr);
    ucp_worker_destroy(u->worker);
    free(u);
    ctx_put();
}

static void ep_failed(void *arg, ucp_ep_h ep, ucs_status_t status) {
    (void)ep;
    struct ucx_peer *p = arg;
    ucs_status_t ok = UCS_OK;
    if (__atomic_compare_exchange_n(&p->failed, &ok, status, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        GVQ_WARN("UCX transport: the connection with rank %d failed: %s", p->rank,
                 ucs_status_string(status));
}

static gvq_ucx_t *impl(gvq_transport_t *t) {
    return t->impl;
}
static int slot(const gvq_ucx_t *u, int peer) {
    return u->map != NULL ? u->map[peer] : peer;
}

static uint64_t tag_of(int tag, int src) {
    return ((uint64_t)(uint32_t)tag << 32) | (uint32_t)src;
}

static gvqResult_t post_failed(gvq_transport_t *t, const char *what, int peer, ucs_status_t st) {
    GVQ_WARN("UCX transport: %s with rank %d failed: %s", what, peer, ucs_status_string(st));
    (void)t;
    return gvqRemoteError;
}

/* Cancel request r (a receive: recv) and give it back to UCX, which frees it once it
 * completes. A receive not yet matched completes at once (cancelled); one matched to a
 * rendezvous, or a send under way, goes on inside UCX and may still touch its buffer at the
 * worker's next progress: then the communicator is broken (no later call runs on it) and its
 * endpoints are closed by force, without the flush that progresses the worker (CI saw the stalled
 * rank of mpi_peer_faults_sigstop crash in ucp_rndv_data_handler when gvqCommDestroy flushed its
 * endpoints after the failed call had returned and the caller had freed its output). */
static void cancel_request(gvq_transport_t *t, void *r, int recv, int peer) {
    gvq_ucx_t *u = impl(t);
    if (recv) ucp_request_cancel(u->worker, r);
    /* a shrink's transport (no communicator yet: broken NULL) keeps its buffers (elastic.c)
     * and goes on to serve the shrunk communicator, whose close may then flush */
    if (t->broken != NULL && ucp_request_check_status(r) == UCS_INPROGRESS) {
        if (__atomic_fetch_add(&u->orphans, 1, __ATOMIC_ACQ_REL) == 0)
            GVQ_INFO("UCX transport: a cancelled %s with rank %d is still under way inside UCX; "
                     "its endpoints will be closed unflushed",
                     recv ? "receive" : "send", peer);
        gvq_broken_set(t->broken, gvqRemoteError);
    }
    ucp_request_free(r);
}

/* The endpoints close unflushed (close_eps: the worker is not progressed again): the
 * communicator broke (also when UCX holds a request it could not call back: cancel_request
 * breaks it) or was aborted. */
static int quarantined(gvq_transport_t *t) {
    return gvq_broken_get(t->broken) != gvqSuccess ||
           (t->abort_flag != NULL && __atomic_load_n(t->abort_flag, __ATOMIC_ACQUIRE));
}

static gvqResult_t ucx_isend(gvq_transport_t *t, int peer, int tag, const void *buf, size_t bytes,
                             gvq_req_t *req) {
    gvq_ucx_t *u = impl(t);
    ucs_status_t failed = __atomic_load_n(&u->peers[slot(u, peer)].failed, __ATOMIC_ACQUIRE);
    if (u->eps[slot(u, peer)] == NULL) failed = UCS_ERR_UNREACHABLE;
    if (failed != UCS_OK) return post_failed(t, "a send", peer, failed);
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof rp);
    void *r = ucp_tag_send_nbx(u->eps[slot(u, peer)], buf, bytes, tag_of(tag, u->rank), &rp);
    if (UCS_PTR_IS_ERR(r)) return post_failed(t, "a send", peer, UCS_PTR_STATUS(r));
    req->handle[0] = (uint64_t)(uintptr_t)r; /* NULL: done already */
    req->handle[1] = K_SEND;
    req->bytes = bytes;
    req->peer = peer;
    req->active = 1;
    return gvqSuccess;
}

static gvqResult_t post_recv(gvq_transport_t *t, int peer, int tag, void *buf, size_t bytes,
                             gvq_req_t *req, int kind) {
    gvq_ucx_t *u = impl(t);
    ucs_status_t failed = __atomic_load_n(&u->peers[slot(u, peer)].failed, __ATOMIC_ACQUIRE);
    if (failed != UCS_OK) return post_failed(t, "a receive", peer, failed);
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof rp);
    rp.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    void *r = ucp_tag_recv_nbx(u->worker, buf, bytes, tag_of(tag, peer), UINT64_MAX, &rp);
    if (UCS_PTR_IS_ERR(r)) return post_failed(t, "a receive", peer, UCS_PTR_STATUS(r));
    req->handle[0] = (uint64_t)(uintptr_t)r;
    req->handle[1] = (uint64_t)kind;
    req->bytes = bytes;
    req->peer = peer;
    req->active = 1;
    return gvqSuccess;
}

static gvqResult_t ucx_irecv(gvq_transport_t *t, int peer, int tag, void *buf, size_t bytes,
                             gvq_req_t *req) {
    return post_recv(t, peer, tag, buf, bytes, req, K_RECV);
}

static gvqResult_t ucx_irecv_upto(gvq_transport_t *t, int peer, int tag, void *buf, size_t bytes,
                                  gvq_req_t *req) {
    return post_recv(t, peer, tag, buf, bytes, req, K_RECV | K_UPTO);
}

static gvqResult_t ucx_test(gvq_transport_t *t, gvq_req_t *req, int *done) {
    gvq_ucx_t *u = impl(t);
    void *r = (void *)(uintptr_t)req->handle[0];
    *done = 0;
    if (r == NULL) { /* a send UCX finished when it was posted */
        req->active = 0;
        *done = 1;
        return gvqSuccess;
    }
    ucp_worker_progress(u->worker);
    ucp_tag_recv_info_t info = {0, 0};
    int recv = (req->handle[1] & K_RECV) != 0;
    ucs_status_t st = recv ? ucp_tag_recv_request_test(r, &info) : ucp_request_check_status(r);
    if (st == UCS_INPROGRESS && recv) { /* a receive is the worker's, not the endpoint's: it */
        ucs_status_t failed =           /* does not fail with its peer unless told so here */
            __atomic_load_n(&u->peers[slot(u, req->peer)].failed, __ATOMIC_ACQUIRE);
        if (failed == UCS_OK) return gvqSuccess;
        cancel_request(t, r, 1, req->peer);
        req->handle[0] = 0;
        req->active = 0;
        *done = 1;
        return post_failed(t, "a receive", req->peer, failed);
    }
    if (st == UCS_INPROGRESS) return gvqSuccess;
    ucp_request_free(r);
    req->handle[0] = 0;
    req->active = 0;
    *done = 1;
    if (st == UCS_ERR_MESSAGE_TRUNCATED) {
        GVQ_WARN("UCX transport: rank %d sent a message longer than the %zu bytes expected; the "
                 "ranks' calls differ",
                 req->peer, req->bytes);
        return gvqRemoteError;
    }
    if (st != UCS_OK) return post_failed(t, recv ? "a receive" : "a send", req->peer, st);
    if (recv && !(req->handle[1] & K_UPTO) && info.length != req->bytes) {
        GVQ_WARN("UCX transport: rank %d sent %zu bytes where %zu were expected; the ranks' calls "
                 "differ",
                 req->peer, info.length, req->bytes);
        return gvqRemoteError;
    }
    if (recv) req->bytes = info.length;
    return gvqSuccess;
}

static void ucx_progress(gvq_transport_t *t) {
    ucp_worker_progress(impl(t)->worker);
}

/* Sleep until the worker has an event or max_ns pass (ucp_worker_arm: UCS_ERR_BUSY when events
 * are waiting already). A broken communicator's worker is left alone (close_eps). */
static void ucx_block(gvq_transport_t *t, uint64_t max_ns) {
    gvq_ucx_t *u = impl(t);
    struct timespec ts = {(time_t)(max_ns / 1000000000ull), (long)(max_ns % 1000000000ull)};
    if (u->efd < 0 || gvq_broken_get(t->broken) != gvqSuccess) {
        struct timespec nap = {0, 50000};
        nanosleep(&nap, NULL);
        return;
    }
    ucs_status_t st = ucp_worker_arm(u->worker);
    if (st == UCS_ERR_BUSY) return; /* progress them */
    if (st != UCS_OK) {
        nanosleep(&ts, NULL);
        return;
    }
    struct pollfd pfd = {u->efd, POLLIN, 0};
    ppoll(&pfd, 1, &ts, NULL);
}

static void ucx_cancel(gvq_transport_t *t, gvq_req_t *req) {
    void *r = (void *)(uintptr_t)req->handle[0];
    if (r != NULL) cancel_request(t, r, (req->handle[1] & K_RECV) != 0, req->peer);
    req->handle[0] = 0;
    req->active = 0;
}

static void ucx_destroy(gvq_transport_t *t) {
    gvq_ucx_t *u = impl(t);
    if (u->revoke_req != NULL) { /* UCX frees it once the cancel is through */
        ucp_request_cancel(u->worker, u->revoke_req);
        ucp_request_free(u->revoke_req);
        u->revoke_req = NULL;
    }
    close_eps(u, u->neps, quarantined(t), t->timeout_ns);
    u->neps = 0;
    gvq_ucx_close(u);
    free(t);
}

static void ucx_revoke(gvq_transport_t *t) {
    gvq_ucx_t *u = impl(t);
    if (__atomic_exchange_n(&u->revoke_sent, 1, __ATOMIC_ACQ_REL)) return;
    gvqResult_t why = gvq_broken_get(t->broken);
    u->revoke_out[0] = u->rank;
    u->revoke_out[1] = why != gvqSuccess ? (int32_t)why : (int32_t)gvqRemoteError;
    for (int p = 0; p < u->nranks; p++) {
        ucp_ep_h ep = u->eps[slot(u, p)];
        if (p == u->rank || ep == NULL ||
            __atomic_load_n(&u->peers[slot(u, p)].failed, __ATOMIC_ACQUIRE) != UCS_OK)
            continue;
        ucp_request_param_t rp;
        memset(&rp, 0, sizeof rp);
        void *r = ucp_tag_send_nbx(ep, u->revoke_out, sizeof u->revoke_out,
                                   tag_of(GVQ_TAG_REVOKE, u->rank), &rp);
        if (UCS_PTR_IS_PTR(r)) ucp_request_free(r); /* fire and forget: UCX frees it */
    }
}

static int ucx_revoked(gvq_transport_t *t, gvqResult_t *cause) {
    gvq_ucx_t *u = impl(t);
    int by = __atomic_load_n(&u->revoked_by, __ATOMIC_ACQUIRE);
    if (by < 0 && u->revoke_req != NULL) {
        ucp_tag_recv_info_t info = {0, 0};
        ucs_status_t st = ucp_tag_recv_request_test(u->revoke_req, &info);
        if (st == UCS_INPROGRESS) return -1;
        int from = st == UCS_OK && info.length == sizeof u->revoke_in ? u->revoke_in[0] : -1;
        if (from < 0 || from >= u->nranks || from == u->rank) return -1; /* not a notice */
        u->revoke_cause = u->revoke_in[1] == gvqTimeout ? gvqTimeout : gvqRemoteError;
        __atomic_store_n(&u->revoked_by, by = from, __ATOMIC_RELEASE);
    }
    if (by >= 0) *cause = u->revoke_cause;
    return by;
}

static const gvq_transport_ops_t ucx_ops = {
    .size = sizeof(gvq_transport_ops_t),
    .name = "ucx",
    .isend = ucx_isend,
    .irecv = ucx_irecv,
    .irecv_upto = ucx_irecv_upto,
    .test = ucx_test,
    .progress = ucx_progress,
    .cancel = ucx_cancel,
    .destroy = ucx_destroy,
    .iallgatherv = gvq_xport_iallgatherv_unsupported,
    .revoke = ucx_revoke,
    .revoked = ucx_revoked,
    .block = ucx_block,
};

/* The receive of a revoke notice from any rank (its rank travels in the notice). */
static void post_revoke(gvq_ucx_t *u) {
    ucp_request_param_t rp;
    memset(&rp, 0, sizeof rp);
    rp.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    void *r =
        ucp_tag_recv_nbx(u->worker, u->revoke_in, sizeof u->revoke_in,
                         (uint64_t)(uint32_t)GVQ_TAG_REVOKE << 32, 0xffffffff00000000ull, &rp);
    u->revoke_req = UCS_PTR_IS_PTR(r) ? r : NULL;
}

gvqResult_t gvq_ucx_make_transport(gvq_ucx_t *u, const uint8_t *addrs, const int32_t *lens, int n,
                                   int rank, const uint8_t *reach, gvq_transport_t **out) {
    *out = NULL;
    gvq_transport_t *t = calloc(1, sizeof *t);
    u->eps = calloc((size_t)n, sizeof *u->eps);
    u->peers = calloc((size_t)n, sizeof *u->peers);
    u->nranks = u->neps = n;
    u->rank = rank;
    if (t == NULL || u->eps == NULL || u->peers == NULL) {
        GVQ_WARN("UCX transport: out of memory for %d endpoints", n);
        free(t);
        return gvqSystemError;
    }
    /* every address first: a rank on another transport is the cause to name, on every rank,
     * before any endpoint reaches a rank that already gave up */
    for (int p = 0; p < n; p++)
        if (lens[p] <= 0 && (reach == NULL || reach[p])) {
            GVQ_WARN("UCX transport: rank %d sent no UCX address (its transport is not UCX: set "
                     "GVQ_TRANSPORT alike on every rank)",
                     p);
            free(t);
            return gvqInvalidUsage;
        }
    size_t at = 0;
    for (int p = 0; p < n; at += (size_t)GVQ_MAX(lens[p], 0), p++) {
        u->peers[p] = (struct ucx_peer){u, p, UCS_OK};
        if (reach != NULL && !reach[p]) {
            u->peers[p].failed = UCS_ERR_UNREACHABLE;
            continue;
        }
        ucp_ep_params_t ep;
        memset(&ep, 0, sizeof ep);
        ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.address = (const ucp_address_t *)(addrs + at);
        ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        ep.err_handler.cb = ep_failed;
        ep.err_handler.arg = &u->peers[p];
        ucs_status_t st = ucp_ep_create(u->worker, &ep, &u->eps[p]);
        if (st != UCS_OK) {
            GVQ_WARN("UCX transport: cannot reach rank %d: %s", p, ucs_status_string(st));
            u->eps[p] = NULL;
            u->peers[p].failed = st;
            if (reach == NULL) {
                free(t);
                return gvqRemoteError;
            }
        }
    }
    t->ops = &ucx_ops;
    t->rank = rank;
    t->nranks = n;
    u->revoked_by = -1;
    post_revoke(u);
    t->cancel_keeps_buffers = 1;
    t->concurrent = 1;
    t->impl = u;
    *out = t;
    return gvqSuccess;
}

gvqResult_t gvq_ucx_transport_create(gvq_ucx_t *u, const uint8_t *addrs, const int32_t *lens,
                                     int nranks, int rank, gvq_transport_t **out) {
    return gvq_ucx_make_transport(u, addrs, lens, nranks, rank, NULL, out);
}

#else /* !GVQ_WITH_UCX */

int gvq_ucx_available(void) {
    return 0;
}

gvqResult_t gvq_ucx_open(gvq_ucx_t **out, const void **addr, size_t *addr_len) {
    *out = NULL;
    *addr = NULL;
    *addr_len = 0;
    GVQ_WARN("UCX transport: this gvq was built without UCX (install libucx-dev and rebuild)");
    return gvqInvalidUsage;
}

void gvq_ucx_close(gvq_ucx_t *u) {
    (void)u;
}

gvqResult_t gvq_ucx_transport_create(gvq_ucx_t *u, const uint8_t *addrs, const int32_t *lens,
                                     int nranks, int rank, gvq_transport_t **out) {
    (void)u, (void)addrs, (void)lens, (void)nranks, (void)rank;
    *out = NULL;
    return gvqInvalidUsage;
}
#endif
