/*
 * comm.c -- communicators: creation (bootstrap + MPI, or in-process for tests), the registry of
 * live communicators that lets argument checks refuse a destroyed one, destroy and abort.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gvq_comm.h"
#include "gvq_handles.h"
#include "gvq_stream.h"
#ifdef GVQ_WITH_NCCL
#include "gvq_nccl.h"
#endif

/* ---- registry of live communicators ------------------------------------------------------ */

static gvq_handles_t live = GVQ_HANDLES_INITIALIZER;
static uint64_t last_serial; /* under live's lock */

/* The addresses of the most recently aborted communicators (under live's lock), so that a call
 * on one is refused as misuse (gvqInvalidUsage, the README's promise) rather than as an unknown
 * handle. An address leaves the list when a new communicator is made there. */
enum { ABORTED_KEPT = 256 };
static const void *aborted[ABORTED_KEPT];
static unsigned naborted;

static int aborted_find_locked(const void *h) {
    for (unsigned i = 0; i < ABORTED_KEPT && h != NULL; i++)
        if (aborted[i] == h) return (int)i;
    return -1;
}

/* Bumped (under live's lock) whenever a communicator leaves the set, so that a thread may keep
 * the last communicator it found live without the lock while nothing left since: every call
 * asks first. */
static uint64_t live_gen;
static __thread gvqComm_t live_seen;
static __thread uint64_t live_seen_gen;

int gvq_comm_is_live(gvqComm_t comm) {
    uint64_t gen = __atomic_load_n(&live_gen, __ATOMIC_ACQUIRE); /* before the lookup */
    if (comm != NULL && comm == live_seen && gen == live_seen_gen) return 1;
    int is = gvq_handles_live(&live, comm);
    if (is) {
        live_seen = comm;
        live_seen_gen = gen;
    }
    return is;
}

/* Removes comm from the live set (under its lock); 0 if it was not there. */
static int live_remove_locked(gvqComm_t comm) {
    int i = gvq_handles_find_locked(&live, comm);
    if (i < 0) return 0;
    gvq_handles_remove_locked(&live, i);
    __atomic_add_fetch(&live_gen, 1, __ATOMIC_ACQ_REL);
    return 1;
}

int gvq_comm_is_serial(gvqComm_t comm, uint64_t serial) {
    gvq_handles_lock(&live);
    int ok = gvq_handles_find_locked(&live, comm) >= 0 && comm->serial == serial;
    gvq_handles_unlock(&live);
    return ok;
}

int gvq_comm_was_aborted(gvqComm_t comm) {
    gvq_handles_lock(&live);
    int was = aborted_find_locked(comm) >= 0;
    gvq_handles_unlock(&live);
    return was;
}

/* The refusal of a comm that is not live: misuse when it was aborted, else a bad argument. */
gvqResult_t gvq_comm_refuse_dead(gvqComm_t comm, const char *fn) {
    if (gvq_comm_was_aborted(comm)) {
        GVQ_WARN("%s: comm %p was aborted (gvqCommAbort); make a new communicator", fn,
                 (void *)comm);
        return gvqInvalidUsage;
    }
    GVQ_WARN("%s: comm %p is %s", fn, (void *)comm,
             comm == NULL ? "NULL" : "not a live communicator (destroyed?)");
    return gvqInvalidArgument;
}

/* The entry check of calls that are not queued by groups (compressed allreduce, sparse, PS):
 * comm must be live, and with no_group the caller must not be inside gvqGroupStart/End. */
gvqResult_t gvq_comm_check(gvqComm_t comm, const char *fn, int no_group) {
    if (!gvq_comm_is_live(comm)) return gvq_comm_refuse_dead(comm, fn);
    if (no_group && gvq_group_active()) {
        GVQ_WARN("%s: not allowed inside gvqGroupStart/gvqGroupEnd", fn);
        return gvqInvalidUsage;
    }
    return gvqSuccess;
}

/* Enter a call on comm: it must be live, not aborted and not broken. A call from the caller's
 * thread first lets the calls queued on host streams for comm run (they were issued earlier),
 * outside the lock, holding the call's inflight count already so that a destroy or abort from
 * another thread meanwhile cannot free comm under it. One lock when nothing is queued: every
 * small collective passes here. */
gvqResult_t gvq_comm_enter(gvqComm_t comm, const char *fn) {
    gvqResult_t res = gvqSuccess;
    int held = 0; /* the inflight count, taken before the lock was let go to settle */
    for (;;) {
        gvq_handles_lock(&live);
        if (gvq_handles_find_locked(&live, comm) < 0) { /* destroyed, maybe by another thread */
            if (held) gvq_comm_leave(comm);
            gvq_handles_unlock(&live);
            return gvq_comm_refuse_dead(comm, fn);
        }
        if (held || gvq_stream_comm_settled(comm))
            break; /* settled once: later jobs are not
                    * this call's elders */
        __atomic_add_fetch(&comm->inflight, 1, __ATOMIC_ACQ_REL);
        held = 1;
        gvq_handles_unlock(&live);
        gvq_stream_comm_settle(comm);
    }
    if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
        GVQ_WARN("%s: the communicator was aborted", fn);
        res = gvqInvalidUsage;
    } else if ((res = gvq_broken_get(&comm->broken)) != gvqSuccess) {
        GVQ_WARN("%s: the communicator is broken by an earlier error (%s); destroy or abort it", fn,
                 gvqGetErrorString(res));
    } else {
        if (!held) __atomic_add_fetch(&comm->inflight, 1, __ATOMIC_ACQ_REL);
        held = 0;
        gvq_log_set_rank(comm->rank);
    }
    if (held) gvq_comm_leave(comm);
    gvq_handles_unlock(&live);
    return res;
}

int gvq_comm_hold(gvqComm_t comm) {
    gvq_handles_lock(&live);
    int found = gvq_handles_find_locked(&live, comm) >= 0;
    if (found) __atomic_add_fetch(&comm->inflight, 1, __ATOMIC_ACQ_REL);
    gvq_handles_unlock(&live);
    return found;
}

void gvq_comm_leave(gvqComm_t comm) {
    __atomic_sub_fetch(&comm->inflight, 1, __ATOMIC_ACQ_REL);
}

/* ---- configuration ----------------------------------------------------------------------- */

gvqResult_t gvq_config_resolve(const gvqConfig_t *config, const char *caller, int64_t *timeout_ms,
                               size_t *chunk_bytes) {
    *timeout_ms = gvq_param(GVQ_PARAM_TIMEOUT_MS);
    *chunk_bytes = (size_t)gvq_param(GVQ_PARAM_CHUNK_BYTES);
    if (*chunk_bytes < 64 || *chunk_bytes > (1u << 30)) {
        GVQ_WARN("GVQ_CHUNK_BYTES=%zu is outside [64, 2^30]; using 1 MiB", *chunk_bytes);
        *chunk_bytes = 1 << 20;
    }
    if (config == NULL) return gvqSuccess;
    GVQCHECK(gvq_config_header_check(caller, "config", config->size, config->magic, config->version,
                                     GVQ_CONFIG_MAGIC,
                                     offsetof(gvqConfig_t, chunkBytes) + sizeof(int),
                                     sizeof(gvqConfig_t), "GVQ_CONFIG_INITIALIZER"));
    if (config->blocking != GVQ_CONFIG_UNDEF_INT && config->blocking != 1) {
        GVQ_WARN("%s: config->blocking=%d: the host backend only runs blocking communicators",
                 caller, config->blocking);
        return gvqInvalidArgument;
    }
    if (config->timeoutMs != GVQ_CONFIG_UNDEF_INT) {
        if (config->timeoutMs < 0) {
            GVQ_WARN("%s: config->timeoutMs=%d is negative", caller, config->timeoutMs);
            return gvqInvalidArgument;
        }
        *timeout_ms = config->timeoutMs;
    }
    if (config->chunkBytes != GVQ_CONFIG_UNDEF_INT) {
        if (config->chunkBytes < 64 || config->chunkBytes > (1 << 30)) {
            GVQ_WARN("%s: config->chunkBytes=%d is outside [64, 2^30]", caller, config->chunkBytes);
            return gvqInvalidArgument;
        }
        *chunk_bytes = (size_t)config->chunkBytes;
    }
    return gvqSuccess;
}

/* ---- creation ---------------------------------------------------------------------------- */

gvqResult_t gvq_comm_create(gvq_transport_t *xport, const gvqConfig_t *config, const char *caller,
                            gvqComm_t *out) {
    int64_t timeout_ms;
    size_t chunk;
    gvqResult_t res = gvq_config_resolve(config, caller, &timeout_ms, &chunk);
    if (res != gvqSuccess) {
        xport->ops->destroy(xport);
        return res;
    }
    gvqComm_t c = calloc(1, sizeof *c);
    if (c == NULL) {
        xport->ops->destroy(xport);
        return gvqSystemError;
    }
    c->magic = GVQ_COMM_MAGIC;
    c->rank = xport->rank;
    c->nranks = xport->nranks;
    c->xport = xport;
    c->p2p = xport; /* until the shared-memory channels are made (shm_setup.c) */
    c->dev = &gvq_host_device;
    c->broken = gvqSuccess;
    c->chunk_bytes = chunk;
    xport->timeout_ns = (uint64_t)timeout_ms * 1000000ull;
    xport->abort_flag = &c->abort_flag;
    xport->broken = &c->broken;
    xport->own_mem = &c->scratch; /* comm_free keeps it when the communicator broke */
    xport->own_mem_bytes = &c->scratch_bytes;
    gvq_handles_lock(&live);
    c->serial = ++last_serial;
    int was = aborted_find_locked(c); /* a new communicator at an aborted one's address */
    if (was >= 0) aborted[was] = NULL;
    gvq_handles_unlock(&live);
    if ((res = gvq_handles_add(&live, c)) != gvqSuccess) {
        xport->ops->destroy(xport);
        free(c);
        return res;
    }
    gvq_log_set_rank(c->rank);
    GVQ_INFO("%s: comm %p rank %d nranks %d transport %s device %s timeout %lld ms chunk %zu B",
             caller, (void *)c, c->rank, c->nranks, xport->ops->name, c->dev->name,
             (long long)timeout_ms, chunk);
    if (c->rank == 0) gvq_param_dump();
    *out = c;
    return gvqSuccess;
}

/* ---- state attached by the layers above ---------------------------------------------------- */

struct gvq_comm_attachment {
    struct gvq_comm_attachment *next;
    const void *key;
    void *state;
    gvq_comm_detach_fn detach;
};

gvqResult_t gvq_comm_attach(gvqComm_t c, const void *key, void *state, gvq_comm_detach_fn detach) {
    struct gvq_comm_attachment *a = calloc(1, sizeof *a);
    if (a == NULL) return gvqSystemError;
    *a = (struct gvq_comm_attachment){c->attached, key, state, detach};
    c->attached = a;
    return gvqSuccess;
}

void gvq_comm_detach(gvqComm_t c, const void *key) {
    for (struct gvq_comm_attachment **p = &c->attached; *p != NULL; p = &(*p)->next)
        if ((*p)->key == key) {
            struct gvq_comm_attachment *a = *p;
            *p = a->next;
            free(a);
            return;
        }
}

void *gvq_comm_attached(gvqComm_t c, const void *key) {
    for (struct gvq_comm_attachment *a = c->attached; a != NULL; a = a->next)
        if (a->key == key) return a->state;
    return NULL;
}

/* Newest first, so a later attachment that uses an earlier one is detached before it. */
static void detach_all(gvqComm_t c) {
    while (c->attached != NULL) {
        struct gvq_comm_attachment *a = c->attached;
        c->attached = a->next;
        a->detach(a->state);
        free(a);
    }
}

/* ---- hosts --------------------------------------------------------------------------------- */

/* The host key of every rank (gvq_host_key): from the bootstrap, or exchanged on first use. */
static gvqResult_t host_keys(gvqComm_t c, const uint64_t **keys) {
    if (c->host_keys == NULL) {
        uint64_t mine = gvq_host_key(), *all = calloc((size_t)c->nranks, sizeof *all);
        if (all == NULL) return gvqSystemError;
        gvq_coll_ctx_t ctx = gvq_comm_ctx(c, NULL);
        gvqResult_t res = gvq_ring_allgather(&ctx, &mine, all, 1, gvqUint64);
        if (res != gvqSuccess) {
            free(all);
            return res;
        }
        c->host_keys = all;
    }
    *keys = c->host_keys;
    return gvqSuccess;
}

gvqResult_t gvq_comm_hosts(gvqComm_t c, int *nhosts, int *leader, uint8_t *same_host) {
    const uint64_t *all;
    GVQCHECK(host_keys(c, &all));
    uint64_t mine = all[c->rank];
    *nhosts = 0;
    *leader = -1;
    for (int p = 0; p < c->nranks; p++) {
        int first = 1;
        for (int q = 0; q < p; q++)
            first &= all[q] != all[p];
        *nhosts += first;
        if (same_host != NULL) same_host[p] = all[p] == mine;
        if (all[p] == mine && *leader < 0) *leader = p;
    }
    /* the keys are the same on every rank, so is the order; GVQ_RING_ORDER=rank keeps rank
     * order (it must then be set on every rank, as GVQ_CHUNK_BYTES) */
    if (c->ring_order == NULL && *nhosts > 1 && gvq_param(GVQ_PARAM_RING_ORDER) == 0) {
        int *order = malloc(sizeof(int) * (size_t)c->nranks);
        if (order != NULL && gvq_ring_order_hosts(all, c->nranks, order)) {
            c->ring_order = order;
            GVQ_INFO("comm %p rank %d: the allreduce ring follows the hosts (%d hosts)", (void *)c,
                     c->rank, *nhosts);
        } else {
            free(order);
        }
    }
    if (c->hier == NULL && *nhosts > 1) {
        (void)gvq_hier_of_hosts(all, c->nranks, c->rank, &c->hier); /* NULL if out of memory */
        if (c->hier != NULL)
            GVQ_INFO("comm %p rank %d: hosts of %d ranks each on %d hosts (GVQ_ALGO=hier can "
                     "run)",
                     (void *)c, c->rank, c->hier->per_host, c->hier->nhosts);
    }
    return gvqSuccess;
}

gvqResult_t gvq_comm_pretend_hosts(gvqComm_t c, const uint64_t *keys) {
    uint64_t *copy = malloc(sizeof(uint64_t) * (size_t)c->nranks);
    if (copy == NULL) return gvqSystemError;
    memcpy(copy, keys, sizeof(uint64_t) * (size_t)c->nranks);
    free(c->host_keys);
    free(c->ring_order);
    gvq_hier_free(c->hier);
    c->host_keys = copy;
    c->ring_order = NULL;
    c->hier = NULL;
    int nhosts, leader;
    GVQCHECK(gvq_comm_hosts(c, &nhosts, &leader, NULL)); /* no transfer: the keys are known */
    c->xport->one_host = nhosts == 1;
    return gvqSuccess;
}

const gvq_device_ops_t *gvq_comm_pinned_host(gvqComm_t c, const gvq_device_ops_t *dev) {
    if (c->pinned_ops_for != dev) {
        if (c->pscratch != NULL) c->pinned_ops.free(c->pscratch);
        c->pscratch = NULL;
        c->pscratch_bytes = 0;
        c->pinned_ops = gvq_host_device;
        c->pinned_ops.alloc = dev->host_alloc;
        c->pinned_ops.free = dev->host_free;
        c->pinned_ops_for = dev;
    }
    return &c->pinned_ops;
}

void gvq_comm_adopt_device_transport(gvqComm_t c, gvq_transport_t *t, const gvq_device_ops_t *dev) {
    t->timeout_ns = c->xport->timeout_ns;
    t->abort_flag = &c->abort_flag;
    t->broken = &c->broken;
    c->dxport = t;
    c->dxport_dev = dev;
    c->dxport_state = 1;
}

/* ---- in-process communicators (unit tests) ------------------------------------------------ */

typedef struct {
    int refs;
    void *world;
} inproc_owner_t;

gvqResult_t gvq_comm_init_inproc(int nranks, const gvqConfig_t *config, gvqComm_t *comms) {
    if (nranks < 1 || comms == NULL) return gvqInvalidArgument;
    inproc_owner_t *own = calloc(1, sizeof *own);
    if (own == NULL) return gvqSystemError;
    GVQCHECK(gvq_inproc_world_create(nranks, &own->world));
    for (int r = 0; r < nranks; r++) {
        gvq_transport_t *t = NULL;
        gvqResult_t res = gvq_inproc_transport_create(own->world, r, &t);
        if (res == gvqSuccess) res = gvq_comm_create(t, config, "inproc", &comms[r]);
        if (res != gvqSuccess) {
            for (int q = 0; q < r; q++)
                gvqCommDestroy(comms[q]);
            if (own->refs == 0) {
                gvq_inproc_world_destroy(own->world);
                free(own);
            }
            return res;
        }
        comms[r]->owned_world = own;
        own->refs++;
    }
    return gvqSuccess;
}

/* ---- destruction ------------------------------------------------------------------------- */

static void comm_free(gvqComm_t c) {
    /* calls queued on host streams run first (after an abort, each fails at once) */
    gvq_stream_comm_drain(c);
    /* calls still inside (another thread, after an abort) leave promptly */
    while (__atomic_load_n(&c->inflight, __ATOMIC_ACQUIRE) > 0)
        usleep(1000);
    detach_all(c);
    if (c->host_comm != NULL && gvq_comm_is_live(c->host_comm)) (void)gvqCommDestroy(c->host_comm);
    /* a broken communicator may have sends from scratch still in the transport's hands; the
     * scratch is then left allocated rather than freed under them */
    int broken = gvq_broken_get(&c->broken) != gvqSuccess;
    int keep = broken && c->xport->cancel_keeps_buffers;
    if (c->p2p != c->xport) c->p2p->ops->destroy(c->p2p); /* the channels: the peers' later */
                                                          /* transfers with this rank fail */
    c->xport->ops->destroy(c->xport);
    if (c->shm_state == 1) munmap(c->shm.base, c->shm_bytes);  /* shm.c */
    if (c->dxport != NULL) c->dxport->ops->destroy(c->dxport); /* before the NCCL comm it uses */
    if (!keep) gvq_pinned_free(&c->pinned); /* a broken MPI transport may still read from it */
    if (!keep && c->pscratch != NULL) c->pinned_ops.free(c->pscratch);
    if (c->dscratch != NULL && !(broken && c->dxport != NULL && c->dxport->cancel_keeps_buffers))
        c->dxport_dev->free(c->dscratch);
#ifdef GVQ_WITH_NCCL
    gvq_nccl_destroy(c->nccl, broken);
#endif
    if (!keep && c->scratch != NULL) c->dev->free(c->scratch);
    if (c->owned_world != NULL) {
        inproc_owner_t *own = c->owned_world;
        if (__atomic_sub_fetch(&own->refs, 1, __ATOMIC_ACQ_REL) == 0) {
            gvq_inproc_world_destroy(own->world);
            free(own);
        }
    }
    free(c->host_keys);
    free(c->ring_order);
    gvq_hier_free(c->hier);
    c->magic = 0;
    free(c);
}

GVQ_API gvqResult_t gvqCommDestroy(gvqComm_t comm) {
    /* the calls queued on host streams complete first, as NCCL's destroy lets its work finish */
    if (gvq_comm_is_live(comm)) gvq_stream_comm_drain(comm);
    gvq_handles_lock(&live);
    int was_live = live_remove_locked(comm);
    gvq_handles_unlock(&live);
    if (!was_live) {
        GVQ_WARN("gvqCommDestroy: comm %p is %s", (void *)comm,
                 comm == NULL ? "NULL" : "not a live communicator (destroyed or aborted already?)");
        return gvqInvalidArgument;
    }
    comm_free(comm);
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqCommAbort(gvqComm_t comm) {
    gvq_handles_lock(&live);
    int i = gvq_handles_find_locked(&live, comm);
    if (i >= 0) {
        __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_RELEASE);
        (void)live_remove_locked(comm);
        aborted[naborted++ % ABORTED_KEPT] = comm;
    }
    gvq_handles_unlock(&live);
    if (i < 0) {
        GVQ_WARN("gvqCommAbort: comm %p is %s", (void *)comm,
                 comm == NULL ? "NULL" : "not a live communicator (destroyed or aborted?)");
        return gvqInvalidArgument;
    }
    GVQ_INFO("gvqCommAbort: comm %p rank %d aborted", (void *)comm, comm->rank);
    /* a call waiting inside the host's stages of the hierarchy (on host_comm's transport)
     * returns too; host_comm itself is freed with comm, once no call is inside */
    if (comm->host_comm != NULL)
        __atomic_store_n(&comm->host_comm->abort_flag, 1, __ATOMIC_RELEASE);
    gvq_broken_set(&comm->broken, gvqInvalidUsage); /* a call may be setting it too */
    comm_free(comm);
    return gvqSuccess;
}

/* ---- queries ----------------------------------------------------------------------------- */

GVQ_API gvqResult_t gvqCommCount(const gvqComm_t comm, int *count) {
    if (gvq_comm_was_aborted(comm)) return gvq_comm_refuse_dead(comm, "gvqCommCount");
    if (!gvq_comm_is_live(comm) || count == NULL) {
        GVQ_WARN("gvqCommCount: %s",
                 count == NULL ? "count is NULL" : "comm is not a live communicator");
        return gvqInvalidArgument;
    }
    *count = comm->nranks;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqCommUserRank(const gvqComm_t comm, int *rank) {
    if (gvq_comm_was_aborted(comm)) return gvq_comm_refuse_dead(comm, "gvqCommUserRank");
    if (!gvq_comm_is_live(comm) || rank == NULL) {
        GVQ_WARN("gvqCommUserRank: %s",
                 rank == NULL ? "rank is NULL" : "comm is not a live communicator");
        return gvqInvalidArgument;
    }
    *rank = comm->rank;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqCommGetAsyncError(gvqComm_t comm, gvqResult_t *asyncError) {
    if (gvq_comm_was_aborted(comm)) return gvq_comm_refuse_dead(comm, "gvqCommGetAsyncError");
    if (!gvq_comm_is_live(comm) || asyncError == NULL) {
        GVQ_WARN("gvqCommGetAsyncError: %s",
                 asyncError == NULL ? "asyncError is NULL" : "comm is not a live communicator");
        return gvqInvalidArgument;
    }
    gvqResult_t res = gvq_broken_get(&comm->broken);
    if (res == gvqSuccess) res = __atomic_load_n(&comm->stream_error, __ATOMIC_ACQUIRE);
    *asyncError = res;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqGetVersion(int *version) {
    if (version == NULL) {
        GVQ_WARN("gvqGetVersion: version is NULL");
        return gvqInvalidArgument;
    }
    *version = GVQ_VERSION;
    return gvqSuccess;
}

GVQ_API const char *gvqGetLastError(gvqComm_t comm) {
    (void)comm;
    return gvq_log_last_warn();
}

int gvq_comm_concurrent(gvqComm_t comm) {
    return comm->xport->concurrent;
}

gvqResult_t gvq_comm_idle(gvqComm_t comm, uint64_t *since) {
    return gvq_xport_idle(comm->xport, since);
}
