/*
 * inproc.c -- an in-process transport: the ranks of a communicator are threads of one process.
 * It exists so that unit tests can run the algorithms on 1..N ranks without MPI (gloo's habit);
 * it is not a fast path. A send copies the message into the receiver's mailbox and completes at
 * once; a receive completes when a message from its peer with its tag is in the mailbox
 * (first posted, first matched).
 */
#include <pthread.h>
#include <stdlib.h>

#include "gvq_transport.h"

typedef struct inproc_msg {
    struct inproc_msg *next;
    int src;
    int tag;
    size_t bytes;
    char data[];
} inproc_msg_t;

typedef struct {
    int nranks;
    pthread_mutex_t lock;
    inproc_msg_t **head; /* per destination rank, FIFO */
    inproc_msg_t **tail;
} inproc_world_t;

/* A posted receive. Receives are matched in the order they were posted (MPI's rule), so
 * matching walks the rank's posted list oldest first. */
typedef struct inproc_recv {
    struct inproc_recv *next;
    void *buf;
    size_t bytes;
    size_t got;
    int upto; /* any size up to bytes (irecv_upto) */
    int peer;
    int tag;
    int done;
    gvqResult_t res;
} inproc_recv_t;

typedef struct {
    inproc_world_t *world;
    inproc_recv_t *posted; /* oldest first */
} inproc_rank_t;

gvqResult_t gvq_inproc_world_create(int nranks, void **world) {
    inproc_world_t *w = calloc(1, sizeof *w);
    if (w == NULL) return gvqSystemError;
    w->nranks = nranks;
    w->head = calloc((size_t)nranks, sizeof *w->head);
    w->tail = calloc((size_t)nranks, sizeof *w->tail);
    if (w->head == NULL || w->tail == NULL) {
        free(w->head);
        free(w->tail);
        free(w);
        return gvqSystemError;
    }
    pthread_mutex_init(&w->lock, NULL);
    *world = w;
    return gvqSuccess;
}

void gvq_inproc_world_destroy(void *world) {
    inproc_world_t *w = world;
    if (w == NULL) return;
    for (int r = 0; r < w->nranks; r++) {
        inproc_msg_t *m = w->head[r];
        while (m != NULL) {
            inproc_msg_t *next = m->next;
            free(m);
            m = next;
        }
    }
    pthread_mutex_destroy(&w->lock);
    free(w->head);
    free(w->tail);
    free(w);
}

static gvqResult_t inproc_isend(gvq_transport_t *t, int peer, int tag, const void *buf,
                                size_t bytes, gvq_req_t *req) {
    inproc_world_t *w = ((inproc_rank_t *)t->impl)->world;
    inproc_msg_t *m = malloc(sizeof *m + bytes);
    if (m == NULL) {
        GVQ_WARN("inproc: cannot allocate a %zu-byte message", bytes);
        return gvqSystemError;
    }
    m->next = NULL;
    m->src = t->rank;
    m->tag = tag;
    m->bytes = bytes;
    if (bytes) memcpy(m->data, buf, bytes);
    pthread_mutex_lock(&w->lock);
    if (w->tail[peer] != NULL)
        w->tail[peer]->next = m;
    else
        w->head[peer] = m;
    w->tail[peer] = m;
    pthread_mutex_unlock(&w->lock);
    req->peer = peer;
    req->bytes = bytes;
    req->active = 0; /* buffered: complete */
    return gvqSuccess;
}

static gvqResult_t post_recv(gvq_transport_t *t, int peer, int tag, void *buf, size_t bytes,
                             int upto, gvq_req_t *req) {
    inproc_rank_t *me = t->impl;
    inproc_recv_t *r = calloc(1, sizeof *r);
    if (r == NULL) return gvqSystemError;
    r->upto = upto;
    r->buf = buf;
    r->bytes = bytes;
    r->peer = peer;
    r->tag = tag;
    pthread_mutex_lock(&me->world->lock); /* threads may share a rank (a served parameter server) */
    inproc_recv_t **pp = &me->posted;
    while (*pp != NULL)
        pp = &(*pp)->next;
    *pp = r;
    pthread_mutex_unlock(&me->world->lock);
    memcpy(req->handle, &r, sizeof r);
    req->peer = peer;
    req->bytes = bytes;
    req->active = 1;
    return gvqSuccess;
}

static gvqResult_t inproc_irecv(gvq_transport_t *t, int peer, int tag, void *buf, size_t bytes,
                                gvq_req_t *req) {
    return post_recv(t, peer, tag, buf, bytes, 0, req);
}

static gvqResult_t inproc_irecv_upto(gvq_transport_t *t, int peer, int tag, void *buf, size_t bytes,
                                     gvq_req_t *req) {
    return post_recv(t, peer, tag, buf, bytes, 1, req);
}

/* Deliver mailbox messages to posted receives, oldest receive first. */
static void inproc_progress(gvq_transport_t *t) {
    inproc_rank_t *me = t->impl;
    inproc_world_t *w = me->world;
    pthread_mutex_lock(&w->lock);
    for (inproc_recv_t *r = me->posted; r != NULL; r = r->next) {
        if (r->done) continue;
        inproc_msg_t *prev = NULL, *m = w->head[t->rank];
        while (m != NULL && !(m->src == r->peer && m->tag == r->tag)) {
            prev = m;
            m = m->next;
        }
        if (m == NULL) continue;
        if (prev != NULL)
            prev->next = m->next;
        else
            w->head[t->rank] = m->next;
        if (w->tail[t->rank] == m) w->tail[t->rank] = prev;
        r->done = 1;
        r->got = m->bytes;
        if (m->bytes != r->bytes && !(r->upto && m->bytes < r->bytes)) {
            GVQ_WARN("inproc: message from rank %d has %zu bytes, receiver expected %zu", m->src,
                     m->bytes, r->bytes);
            r->res = gvqRemoteError;
        } else if (m->bytes) {
            memcpy(r->buf, m->data, m->bytes);
        }
        free(m);
    }
    pthread_mutex_unlock(&w->lock);
}

static void inproc_unlink(inproc_rank_t *me, inproc_recv_t *r) {
    for (inproc_recv_t **pp = &me->posted; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    }
    free(r);
}

static gvqResult_t inproc_test(gvq_transport_t *t, gvq_req_t *req, int *done) {
    inproc_rank_t *me = t->impl;
    inproc_recv_t *r;
    memcpy(&r, req->handle, sizeof r);
    *done = 0;
    inproc_progress(t);
    pthread_mutex_lock(&me->world->lock);
    if (!r->done) {
        pthread_mutex_unlock(&me->world->lock);
        return gvqSuccess;
    }
    gvqResult_t res = r->res;
    if (res == gvqSuccess) req->bytes = r->got;
    inproc_unlink(me, r);
    pthread_mutex_unlock(&me->world->lock);
    req->active = 0;
    *done = 1;
    return res;
}

static void inproc_cancel(gvq_transport_t *t, gvq_req_t *req) {
    inproc_recv_t *r;
    memcpy(&r, req->handle, sizeof r);
    inproc_rank_t *me = t->impl;
    pthread_mutex_lock(&me->world->lock);
    inproc_unlink(me, r);
    pthread_mutex_unlock(&me->world->lock);
    req->active = 0;
}

static void inproc_destroy(gvq_transport_t *t) {
    inproc_rank_t *me = t->impl;
    while (me->posted != NULL)
        inproc_unlink(me, me->posted);
    free(me);
    free(t);
}

static const gvq_transport_ops_t inproc_ops = {
    .size = sizeof(gvq_transport_ops_t),
    .name = "inproc",
    .isend = inproc_isend,
    .irecv = inproc_irecv,
    .irecv_upto = inproc_irecv_upto,
    .test = inproc_test,
    .cancel = inproc_cancel,
    .destroy = inproc_destroy,
    .iallgatherv = gvq_xport_iallgatherv_unsupported,
};

gvqResult_t gvq_inproc_transport_create(void *world, int rank, gvq_transport_t **out) {
    inproc_world_t *w = world;
    gvq_transport_t *t = calloc(1, sizeof *t);
    inproc_rank_t *me = calloc(1, sizeof *me);
    if (t == NULL || me == NULL) {
        free(t);
        free(me);
        return gvqSystemError;
    }
    me->world = w;
    t->ops = &inproc_ops;
    t->rank = rank;
    t->nranks = w->nranks;
    t->concurrent = 1; /* the world's queues and each rank's posted receives are under its lock */
    t->one_host = 1;
    t->impl = me;
    *out = t;
    return gvqSuccess;
}
