/*
 * sim_fifo.h -- a simulated NCCL-like transport for the unit tests: ranks as threads of one
 * process, sends and receives queued, and on a rank's first test after posting, everything
 * queued is issued as one group on that rank's "stream". Groups run strictly in order: a group
 * starts when the one before it has finished, its transfers progress together, and a transfer
 * finishes only when its peer's matching transfer (same pair, in issue order) has started too
 * (rendezvous, the strictest reading of NCCL's semantics). A ring that posts a receive ahead of
 * the send its peer can only make later blocks here exactly as it would on a GPU stream, and
 * the wait loop's timeout reports it instead of hanging.
 *
 * With device_only set, every buffer must be memory of the simulated device (sim_device.h), as
 * NCCL needs device memory.
 */
#ifndef SIM_FIFO_H_
#define SIM_FIFO_H_

#include "sim_device.h"

typedef struct fifo_op {
    int send, peer, done, error;
    char *buf;
    size_t bytes;
    struct fifo_op *next_all; /* every op of the world, freed with it */
} fifo_op_t;

typedef struct fifo_group {
    fifo_op_t **ops;
    int n, ndone;
    struct fifo_group *next;
} fifo_group_t;

typedef struct {
    fifo_group_t *head, *tail; /* issued groups, in stream order */
    fifo_op_t **pend;          /* posted, not issued yet */
    int npend, cap;
} fifo_rank_t;

typedef struct {
    pthread_mutex_t mu;
    int nranks, device_only;
    fifo_rank_t r[16];
    fifo_op_t *all;
    long groups, transfers;
} fifo_world_t;

static inline fifo_world_t *fifo_world_create(int nranks, int device_only) {
    fifo_world_t *w = calloc(1, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    w->nranks = nranks;
    w->device_only = device_only;
    return w;
}

static inline void fifo_world_destroy(fifo_world_t *w) {
    for (int i = 0; i < w->nranks; i++) {
        for (fifo_group_t *g = w->r[i].head, *n; g != NULL; g = n) {
            n = g->next;
            free(g->ops);
            free(g);
        }
        free(w->r[i].pend);
    }
    for (fifo_op_t *o = w->all, *n; o != NULL; o = n) {
        n = o->next_all;
        free(o);
    }
    pthread_mutex_destroy(&w->mu);
    free(w);
}

static inline gvqResult_t fifo_post(gvq_transport_t *t, int send, int peer, void *buf, size_t bytes,
                                    gvq_req_t *req) {
    fifo_world_t *w = t->impl;
    if (w->device_only && bytes) SIM_DEV(send ? "fifo isend" : "fifo irecv", buf);
    fifo_op_t *o = calloc(1, sizeof *o);
    if (o == NULL) return gvqSystemError;
    o->send = send, o->peer = peer, o->buf = buf, o->bytes = bytes;
    pthread_mutex_lock(&w->mu);
    o->next_all = w->all;
    w->all = o;
    fifo_rank_t *me = &w->r[t->rank];
    if (me->npend == me->cap) {
        me->cap = me->cap ? 2 * me->cap : 64;
        me->pend = realloc(me->pend, sizeof *me->pend * (size_t)me->cap);
    }
    me->pend[me->npend++] = o;
    pthread_mutex_unlock(&w->mu);
    memset(req, 0, sizeof *req);
    req->handle[0] = (uint64_t)(uintptr_t)o;
    req->bytes = bytes;
    req->peer = peer;
    req->active = 1;
    return gvqSuccess;
}

static inline gvqResult_t fifo_isend(gvq_transport_t *t, int peer, int tag, const void *buf,
                                     size_t bytes, gvq_req_t *req) {
    (void)tag;
    return fifo_post(t, 1, peer, (void *)buf, bytes, req);
}

static inline gvqResult_t fifo_irecv(gvq_transport_t *t, int peer, int tag, void *buf, size_t bytes,
                                     gvq_req_t *req) {
    (void)tag;
    return fifo_post(t, 0, peer, buf, bytes, req);
}

/* The first unfinished op of rank a's queue with (send, peer); *running: its group is the
 * first unfinished one (the one the stream is running). */
static inline fifo_op_t *fifo_first(fifo_world_t *w, int a, int send, int peer, int *running) {
    int seen_unfinished = 0;
    for (fifo_group_t *g = w->r[a].head; g != NULL; g = g->next) {
        if (g->ndone == g->n) continue;
        for (int i = 0; i < g->n; i++) {
            fifo_op_t *o = g->ops[i];
            if (!o->done && o->send == send && o->peer == peer) {
                *running = !seen_unfinished;
                return o;
            }
        }
        seen_unfinished = 1;
    }
    return NULL;
}

static inline void fifo_finish(fifo_world_t *w, int a, fifo_op_t *o) {
    o->done = 1;
    for (fifo_group_t *g = w->r[a].head; g != NULL; g = g->next)
        for (int i = 0; i < g->n; i++)
            if (g->ops[i] == o) {
                g->ndone++;
                return;
            }
}

/* Match what the running groups allow until nothing moves. */
static inline void fifo_progress(fifo_world_t *w) {
    for (int moved = 1; moved;) {
        moved = 0;
        for (int a = 0; a < w->nranks; a++) {
            fifo_group_t *g = w->r[a].head;
            while (g != NULL && g->ndone == g->n)
                g = g->next;
            if (g == NULL) continue;
            for (int i = 0; i < g->n; i++) {
                fifo_op_t *s = g->ops[i];
                if (!s->send || s->done) continue;
                int b = s->peer, sh = 0, rh = 0;
                if (fifo_first(w, a, 1, b, &sh) != s || !sh) continue; /* an earlier send first */
                fifo_op_t *r = fifo_first(w, b, 0, a, &rh);
                if (r == NULL || !rh) continue; /* the receive has not started */
                if (r->bytes != s->bytes)
                    r->error = s->error = 1;
                else if (s->bytes)
                    memcpy(r->buf, s->buf, s->bytes);
                fifo_finish(w, a, s);
                fifo_finish(w, b, r);
                w->transfers++;
                moved = 1;
            }
        }
    }
}

static inline gvqResult_t fifo_test(gvq_transport_t *t, gvq_req_t *req, int *done) {
    fifo_world_t *w = t->impl;
    *done = 0;
    if (!req->active) {
        *done = 1;
        return gvqSuccess;
    }
    fifo_op_t *o = (fifo_op_t *)(uintptr_t)req->handle[0];
    pthread_mutex_lock(&w->mu);
    fifo_rank_t *me = &w->r[t->rank];
    if (me->npend > 0) { /* issue everything queued as one group */
        fifo_group_t *g = calloc(1, sizeof *g);
        g->ops = malloc(sizeof *g->ops * (size_t)me->npend);
        memcpy(g->ops, me->pend, sizeof *g->ops * (size_t)me->npend);
        g->n = me->npend;
        me->npend = 0;
        if (me->tail != NULL)
            me->tail->next = g;
        else
            me->head = g;
        me->tail = g;
        w->groups++;
    }
    fifo_progress(w);
    /* drop finished groups from the front */
    while (me->head != NULL && me->head->ndone == me->head->n) {
        fifo_group_t *g = me->head;
        me->head = g->next;
        if (me->head == NULL) me->tail = NULL;
        free(g->ops);
        free(g);
    }
    int fin = o->done, err = o->error;
    pthread_mutex_unlock(&w->mu);
    if (fin) {
        req->active = 0;
        *done = 1;
        if (err) {
            GVQ_WARN("fifo transport: message size mismatch with peer %d", req->peer);
            return gvqRemoteError;
        }
    }
    return gvqSuccess;
}

static inline void fifo_cancel(gvq_transport_t *t, gvq_req_t *req) {
    (void)t;
    req->active = 0; /* the op stays queued: a test world is torn down after an error */
}

typedef struct {
    gvq_transport_t t;
    int abort_flag;
    gvqResult_t broken;
} fifo_xport_t;

static inline void fifo_destroy(gvq_transport_t *t) {
    free(t);
} /* t is the first member */

__attribute__((unused)) static const gvq_transport_ops_t fifo_ops = {
    .size = sizeof(gvq_transport_ops_t),
    .name = "sim-fifo",
    .isend = fifo_isend,
    .irecv = fifo_irecv,
    .test = fifo_test,
    .cancel = fifo_cancel,
    .destroy = fifo_destroy,
    .iallgatherv = gvq_xport_iallgatherv_unsupported,
};

static inline gvq_transport_t *fifo_transport(fifo_world_t *w, int rank, int fifo) {
    fifo_xport_t *x = calloc(1, sizeof *x);
    gvq_transport_t *t = &x->t;
    t->abort_flag = &x->abort_flag; /* until a communicator adopts it */
    t->broken = &x->broken;
    t->timeout_ns = 20ull * 1000000000ull;
    t->ops = &fifo_ops;
    t->rank = rank;
    t->nranks = w->nranks;
    t->impl = w;
    t->fifo = fifo; /* 0: the ring is told nothing, and pre-posts as for MPI */
    return t;
}

#endif /* SIM_FIFO_H_ */
