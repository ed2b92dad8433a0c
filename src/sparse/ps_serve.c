/*
 * ps_serve.c -- a parameter server that answers at any time (gvqPsConfig_t.serve;
 * docs/ALGORITHMS.md section 4): a thread of the handle serves this rank's shards, so another
 * rank's push or pull needs nothing from this rank's own calls, and a pull may see rows up to
 * `staleness` steps old (stale synchronous parallel, as Petuum's and Poseidon's key-value stores
 * offer it).
 *
 *   caller (any rank)                                   server thread (the owning rank)
 *   push:  merge, one block per owner --{PUSH t, k}+block->  kept as (step t, call k, source)
 *   apply: step t ends, c = t + 1 -------{CLOCK t}-------->  once every rank ended step t: the
 *                                                            step's pushes summed in (call,
 *                                                            rank) order, the rule run once,
 *                                                            version = t + 1
 *   pull:  need = max(c - s, 0) --------{PULL need}+idx--->  answered once version >= need:
 *          <-------------- {status, version} + rows ------
 *   destroy: ----------------------------{BYE}----------->  the thread ends once every peer's
 *                                                            BYE came (or the timeout passed)
 *
 * The order of the sums is the synchronous server's (ps_push.c sums each collective push in
 * rank order, the pushes of a step in call order), so with staleness 0 a pull returns the bits
 * the synchronous server would: the version it waits for is exactly the caller's own step
 * count, and no step past it can be applied before the caller ends it. With s > 0 a pull sees
 * between c - s and c steps; which ones depends on timing.
 *
 * Rows held here are pushed and pulled by the caller's thread directly (no message). Messages
 * travel on the handle's own communicator (a gvqCommSplit duplicate: MPI and UCX match them
 * apart from the caller's collectives), or on the in-process test transport's, under tags of
 * the handle's own. Every transport call and all the state below are under one mutex; the
 * thread polls, and sleeps GVQ_PS_IDLE_NS between polls that found nothing.
 *
 * Everything received is checked before use (an unknown op, a count past what this rank holds,
 * an index not held here, a clock out of sequence): the sender is then no longer listened to,
 * the server fails with a WARN, and every later call on this rank and every pull answered by
 * it reports gvqRemoteError.
 *
 * This file is the thread's side, start and stop; a rank's own calls are ps_serve_call.c, the
 * shared state gvq_ps_serve.h.
 */
#include <stdlib.h>
#include <time.h>

#include "gvq_ps_serve.h"
#include "gvq_ps_wire.h"

#define GVQ_PS_IDLE_NS 50000L
#define GVQ_PS_TAG_BASE 64 /* in-process: the handle's tags above the transport's own */

static int grow(void **arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 1;
    size_t n = GVQ_MAX(need, *cap * 2 + 8);
    void *p = realloc(*arr, n * elem);
    if (p == NULL) return 0;
    *arr = p;
    *cap = n;
    return 1;
}

/* Leave the core between polls that found nothing. (Naps of 10 us, and of 200 us after 1 ms
 * without requests, made gvq-train's text model slower at 2 and 4 ranks: perf/RESULTS.md
 * section 14d.) */
static void nap(void) {
    struct timespec ts = {0, GVQ_PS_IDLE_NS};
    nanosleep(&ts, NULL);
}

/* The first failure wins; a WARN says what it was. */
void gvq_ps_srv_fail(gvq_ps_srv_t *s, gvqResult_t res) {
    if (s->failed == gvqSuccess) s->failed = res;
}

void gvq_ps_srv_lose(gvq_ps_srv_t *s, void *buf) {
    if (buf == NULL) return;
    if (grow((void **)&s->lost, &s->cap_lost, s->nlost + 1, sizeof *s->lost))
        s->lost[s->nlost++] = buf;
    /* else: leaked rather than freed under a transfer that may still touch it */
}

/* Send bytes of buf (ours: freed once sent) to peer. */
gvqResult_t gvq_ps_srv_send_owned(gvq_ps_srv_t *s, int peer, int tag, void *buf, size_t bytes) {
    if (!grow((void **)&s->out, &s->cap_out, s->nout + 1, sizeof *s->out)) {
        free(buf);
        return gvqSystemError;
    }
    outgoing_t *o = &s->out[s->nout];
    gvqResult_t res = s->t->ops->isend(s->t, peer, tag, buf, bytes, &o->req);
    if (res != gvqSuccess) {
        free(buf);
        return res;
    }
    o->buf = buf;
    s->nout++;
    s->ps->stats.bytesSent += bytes;
    return gvqSuccess;
}

gvqResult_t gvq_ps_srv_send_header(gvq_ps_srv_t *s, int peer, int64_t op, int64_t a, int64_t b,
                                   int64_t c) {
    int64_t *h = malloc(HDR_WORDS * sizeof *h);
    if (h == NULL) return gvqSystemError;
    h[0] = op, h[1] = a, h[2] = b, h[3] = c;
    return gvq_ps_srv_send_owned(s, peer, s->tag_req, h, HDR_WORDS * sizeof *h);
}

/* ---- the server's state: pushes kept per step, steps applied, pulls answered ----------------- */

gvqResult_t gvq_ps_srv_keep_push(gvq_ps_srv_t *s, int src, uint64_t step, uint64_t call, size_t n,
                                 void *block) {
    if (!grow((void **)&s->pushes, &s->cap_pushes, s->npushes + 1, sizeof *s->pushes)) {
        free(block);
        return gvqSystemError;
    }
    s->pushes[s->npushes++] = (kept_push_t){step, call, src, n, block};
    return gvqSuccess;
}

static int push_order(const void *a, const void *b) {
    const kept_push_t *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    if (x->call != y->call) return x->call < y->call ? -1 : 1;
    return (x->src > y->src) - (x->src < y->src);
}

/* Apply every step that all ranks have ended: its pushes summed in (call, rank) order, then the
 * rule once (as the synchronous server's pushes and apply). */
static gvqResult_t advance(gvq_ps_srv_t *s) {
    gvqPs_t ps = s->ps;
    while (s->failed == gvqSuccess) { /* a failed server applies nothing more */
        uint64_t lowest = UINT64_MAX;
        for (int r = 0; r < s->nranks; r++)
            lowest = GVQ_MIN(lowest, s->clocked[r]);
        if (lowest <= s->version) return gvqSuccess;
        if (s->npushes > 1) qsort(s->pushes, s->npushes, sizeof *s->pushes, push_order);
        size_t done = 0;
        gvqResult_t res = gvqSuccess;
        while (done < s->npushes && s->pushes[done].step == s->version && res == gvqSuccess) {
            kept_push_t *k = &s->pushes[done++];
            res = gvq_ps_add_pending(ps, gvq_wire_block_indices(k->block),
                                     gvq_wire_block_values(k->block, k->n), k->n);
            free(k->block);
        }
        if (done > 0) {
            memmove(s->pushes, s->pushes + done, (s->npushes - done) * sizeof *s->pushes);
            s->npushes -= done;
        }
        if (res != gvqSuccess) return res; /* the caller fails the server */
        gvq_ps_apply_pending(ps, ps->cfg.average ? 1.0 / s->nranks : 1.0);
        s->version++;
    }
    return gvqSuccess;
}

/* The reply to a pull of n indices (held here, checked): {status, version} + rows. */
static gvqResult_t reply_pull(gvq_ps_srv_t *s, int src, int64_t status, const int64_t *idx,
                              size_t n) {
    gvqPs_t ps = s->ps;
    size_t bytes = REPLY_HDR_BYTES + n * ps->row_bytes; /* the size the asker expects */
    char *r = calloc(1, bytes);
    if (r == NULL) return gvqSystemError;
    int64_t head[2] = {status, (int64_t)s->version};
    memcpy(r, head, sizeof head);
    for (size_t i = 0; i < n && !status; i++) {
        int rank;
        uint64_t slot;
        gvq_part_locate(&ps->map, (uint64_t)idx[i], &rank, &slot);
        memcpy(r + REPLY_HDR_BYTES + i * ps->row_bytes, gvq_ps_row(ps, ps->values, slot),
               ps->row_bytes);
    }
    return gvq_ps_srv_send_owned(s, src, s->tag_rep, r, bytes);
}

/* Answer the kept pulls whose version has come; a failed server refuses every one at once. */
static gvqResult_t answer_pulls(gvq_ps_srv_t *s) {
    size_t kept = 0;
    gvqResult_t res = gvqSuccess;
    for (size_t i = 0; i < s->npulls; i++) {
        kept_pull_t *p = &s->pulls[i];
        if ((p->need > s->version && s->failed == gvqSuccess) || res != gvqSuccess) {
            s->pulls[kept++] = *p;
            continue;
        }
        res = reply_pull(s, p->src, s->failed != gvqSuccess, p->block, p->n);
        free(p->block);
    }
    s->npulls = kept;
    return res;
}

/* ---- what comes from the peers ------------------------------------------------------------- */

static void deafen(gvq_ps_srv_t *s, int p, gvqResult_t res, const char *why) {
    GVQ_WARN("parameter server (served): rank %d: %s; it is no longer answered, and this rank's "
             "calls on the handle fail",
             p, why);
    s->in[p].deaf = 1;
    gvq_ps_srv_fail(s, res);
}

static void post_header(gvq_ps_srv_t *s, int p) {
    inbox_t *b = &s->in[p];
    if (b->bye || b->deaf) return;
    b->in_body = 0;
    gvqResult_t res = s->t->ops->irecv(s->t, p, s->tag_req, b->hdr, sizeof b->hdr, &b->req);
    if (res != gvqSuccess) deafen(s, p, res, "cannot post a receive");
}

/* A header came from p: the rows a body may carry are bounded by what this rank holds. */
static void take_header(gvq_ps_srv_t *s, int p) {
    inbox_t *b = &s->in[p];
    int64_t op = b->hdr[0], a = b->hdr[1], n = b->hdr[2];
    size_t row_bytes = op == OP_PUSH ? s->ps->row_bytes : 0;
    s->ps->stats.bytesReceived += sizeof b->hdr;
    if (op == OP_CLOCK) {
        if (a < 0 || (uint64_t)a != s->clocked[p])
            return deafen(s, p, gvqRemoteError, "a step ended out of sequence");
        s->clocked[p]++;
    } else if (op == OP_BYE) {
        b->bye = 1;
        s->byes++;
        return;
    } else if (op == OP_PUSH || op == OP_PULL) {
        /* a push belongs to its sender's current step; a pull asks for no step its sender has
         * not ended (its step ends came before it, on the same tag) */
        if (n < 1 || (uint64_t)n > s->ps->nlocal || a < 0 || b->hdr[3] < 0 ||
            (op == OP_PUSH && (uint64_t)a != s->clocked[p]) ||
            (op == OP_PULL && (uint64_t)a > s->clocked[p]))
            return deafen(s, p, gvqRemoteError, "a request of a malformed size or step");
        b->body_bytes = gvq_wire_block_bytes((size_t)n, row_bytes);
        b->body = malloc(b->body_bytes);
        gvqResult_t res = b->body == NULL ? gvqSystemError
                                          : s->t->ops->irecv(s->t, p, s->tag_body, b->body,
                                                             b->body_bytes, &b->req);
        if (res != gvqSuccess) {
            free(b->body);
            b->body = NULL;
            return deafen(s, p, res, "cannot receive a request's rows");
        }
        b->in_body = 1;
        return;
    } else {
        return deafen(s, p, gvqRemoteError, "an unknown request");
    }
    post_header(s, p);
}

/* The body of p's push or pull came. */
static void take_body(gvq_ps_srv_t *s, int p) {
    inbox_t *b = &s->in[p];
    size_t n = (size_t)b->hdr[2];
    void *body = b->body;
    b->body = NULL;
    s->ps->stats.bytesReceived += b->body_bytes;
    size_t bad = gvq_ps_check_block(s->ps, gvq_wire_block_indices(body), n, 1);
    if (bad < n) {
        free(body);
        return deafen(s, p, gvqRemoteError,
                      "a request with an index out of range, not ascending or not held here");
    }
    gvqResult_t res;
    if (b->hdr[0] == OP_PUSH) {
        res = gvq_ps_srv_keep_push(s, p, (uint64_t)b->hdr[1], (uint64_t)b->hdr[3], n, body);
    } else if (grow((void **)&s->pulls, &s->cap_pulls, s->npulls + 1, sizeof *s->pulls)) {
        s->pulls[s->npulls++] = (kept_pull_t){p, (uint64_t)b->hdr[1], n, body};
        res = gvqSuccess;
    } else {
        free(body);
        res = gvqSystemError;
    }
    if (res != gvqSuccess) return deafen(s, p, res, "out of memory keeping a request");
    post_header(s, p);
}

/* One poll of everything in flight; returns how many transfers finished. Under the lock. */
int gvq_ps_srv_progress(gvq_ps_srv_t *s) {
    int events = 0;
    for (int p = 0; p < s->nranks; p++) {
        inbox_t *b = &s->in[p];
        if (p == s->rank || b->deaf || !b->req.active) continue;
        int done = 0;
        gvqResult_t res = s->t->ops->test(s->t, &b->req, &done);
        if (res != gvqSuccess) {
            deafen(s, p, res, "a receive failed");
            continue;
        }
        if (!done) continue;
        events++;
        if (b->in_body)
            take_body(s, p);
        else
            take_header(s, p);
    }
    size_t kept = 0;
    for (size_t i = 0; i < s->nout; i++) {
        int done = !s->out[i].req.active; /* a buffered send completes when posted */
        gvqResult_t res = done ? gvqSuccess : s->t->ops->test(s->t, &s->out[i].req, &done);
        if (res != gvqSuccess) {
            GVQ_WARN("parameter server (served): a send to rank %d failed (%s)", s->out[i].req.peer,
                     gvqGetErrorString(res));
            gvq_ps_srv_fail(s, res);
            done = 1;
        }
        if (done) {
            free(s->out[i].buf);
            events++;
        } else {
            s->out[kept++] = s->out[i];
        }
    }
    s->nout = kept;
    uint64_t version = s->version;
    gvqResult_t res = advance(s); /* also the caller's own steps, which need no message */
    if (res == gvqSuccess) res = answer_pulls(s);
    if (res != gvqSuccess) {
        GVQ_WARN("parameter server (served): %s applying a step or answering a pull",
                 gvqGetErrorString(res));
        gvq_ps_srv_fail(s, res);
    }
    events += s->version != version;
    s->progress += (uint64_t)events; /* the waits' "no progress" clock restarts on it */
    return events;
}

static void *serve_main(void *arg) {
    gvq_ps_srv_t *s = arg;
    gvq_log_set_rank(s->rank);
    while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&s->lock);
        int events = gvq_ps_srv_progress(s);
        pthread_mutex_unlock(&s->lock);
        if (!events) nap();
    }
    return NULL;
}

/* ---- the caller's side ----------------------------------------------------------------------- */

/* Wait (the caller's thread, helping the server along) until done(s, arg) holds, bounded by the
 * timeout without progress and by the communicator's abort; the core is left between polls as
 * every wait of the transport's leaves it (GVQ_WAIT; gvq_xport_idle). Under the lock on
 * return. */
gvqResult_t gvq_ps_srv_wait(gvq_ps_srv_t *s, const char *fn, int (*done)(gvq_ps_srv_t *, void *),
                            void *arg, const char *what) {
    uint64_t start = 0, seen = s->progress;
    for (;;) {
        gvq_ps_srv_progress(s);
        if (s->progress != seen) { /* this poll's or the thread's: either restarts the clock */
            seen = s->progress;
            start = 0;
        }
        if (done(s, arg)) return gvqSuccess;
        gvqComm_t comm = s->ps->comm;
        if (comm != NULL && __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
            GVQ_WARN("%s: the communicator was aborted while waiting for %s", fn, what);
            return gvqInvalidUsage;
        }
        pthread_mutex_unlock(&s->lock);
        int slept = 0;
        gvqResult_t res = gvq_xport_idle_slept(s->t, &start, &slept);
        pthread_mutex_lock(&s->lock);
        if (res == gvqTimeout)
            GVQ_WARN("%s: no progress for %.1f s waiting for %s", fn, s->timeout_ns / 1e9, what);
        if (res != gvqSuccess) return res;
    }
}

gvqResult_t gvq_ps_srv_refuse_failed(gvq_ps_srv_t *s, const char *fn) {
    if (s->failed == gvqSuccess) return gvqSuccess;
    GVQ_WARN("%s: this rank's parameter server failed earlier (%s); destroy it", fn,
             gvqGetErrorString(s->failed));
    return s->failed;
}

static void srv_free(gvq_ps_srv_t *s) {
    for (size_t i = 0; i < s->npushes; i++)
        free(s->pushes[i].block);
    for (size_t i = 0; i < s->npulls; i++)
        free(s->pulls[i].block);
    for (size_t i = 0; i < s->nlost; i++)
        free(s->lost[i]);
    free(s->pushes), free(s->pulls), free(s->out), free(s->lost), free(s->in), free(s->clocked);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* The handle's own transport: a duplicate of the communicator (MPI, UCX), or, in-process,
 * the communicator's own with tags of the handle's. */
static gvqResult_t own_transport(gvq_ps_srv_t *s, gvqComm_t comm, const char *fn) {
    if (strcmp(comm->xport->ops->name, "inproc") == 0) {
        int base = GVQ_PS_TAG_BASE + 3 * comm->ps_serial;
        s->t = comm->xport, s->tag_req = base, s->tag_body = base + 1, s->tag_rep = base + 2;
        return gvqSuccess;
    }
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    uint64_t ms = comm->xport->timeout_ns / 1000000u;
    cfg.timeoutMs = ms > INT32_MAX ? INT32_MAX : (int)ms;
    gvqResult_t res = gvqCommSplit(comm, 0, comm->rank, &s->dup, &cfg);
    if (res != gvqSuccess) {
        GVQ_WARN("%s: serve: cannot make the handle's own communicator (%s)", fn,
                 gvqGetErrorString(res));
        return res;
    }
    s->t = s->dup->xport, s->tag_req = 1, s->tag_body = 2, s->tag_rep = 3;
    if (!s->t->concurrent) {
        GVQ_WARN("%s: serve needs a transport that threads may share (MPI_THREAD_MULTIPLE; "
                 "transport %s does not offer it)",
                 fn, s->t->ops->name);
        return gvqInvalidUsage;
    }
    return gvqSuccess;
}

gvqResult_t gvq_ps_serve_start(gvqPs_t ps, const char *fn) {
    gvqComm_t comm = ps->comm;
    gvq_ps_srv_t *s = calloc(1, sizeof *s);
    if (s == NULL) return gvqSystemError;
    pthread_mutex_init(&s->lock, NULL);
    s->ps = ps;
    s->nranks = comm->nranks;
    s->rank = comm->rank;
    s->timeout_ns = comm->xport->timeout_ns;
    s->in = calloc((size_t)s->nranks, sizeof *s->in);
    s->clocked = calloc((size_t)s->nranks, sizeof *s->clocked);
    ps->srv = s; /* stop frees it from here on */
    if (s->in == NULL || s->clocked == NULL) return gvqSystemError;
    GVQCHECK(own_transport(s, comm, fn));
    comm->ps_serial++; /* every rank alike: creation is collective */
    for (int p = 0; p < s->nranks; p++)
        if (p != s->rank) post_header(s, p);
    if (s->failed != gvqSuccess) return s->failed;
    if (pthread_create(&s->thread, NULL, serve_main, s) != 0) {
        GVQ_WARN("%s: cannot start the server thread", fn);
        return gvqSystemError;
    }
    s->started = 1;
    return gvqSuccess;
}

static int all_said_bye(gvq_ps_srv_t *s, void *arg) {
    (void)arg;
    int deaf = 0;
    for (int p = 0; p < s->nranks; p++)
        deaf += p != s->rank && s->in[p].deaf && !s->in[p].bye;
    return s->byes + deaf == s->nranks - 1 && s->nout == 0;
}

void gvq_ps_serve_stop(gvqPs_t ps, int orphaned) {
    gvq_ps_srv_t *s = __atomic_exchange_n(&ps->srv, NULL, __ATOMIC_ACQ_REL); /* stops once */
    if (s == NULL) return;
    int clean = 0; /* every rank said goodbye: the duplicate may close as usual */
    if (s->started) {
        pthread_mutex_lock(&s->lock);
        /* a failed server still says goodbye, and answers (with refusals) until the others
         * did: their pulls end with gvqRemoteError rather than at the timeout */
        int healthy = !orphaned && !__atomic_load_n(&ps->comm->abort_flag, __ATOMIC_ACQUIRE);
        gvqResult_t res = healthy ? gvqSuccess : gvqInvalidUsage;
        for (int p = 0; p < s->nranks && healthy && res == gvqSuccess; p++)
            if (p != s->rank) res = gvq_ps_srv_send_header(s, p, OP_BYE, 0, 0, 0);
        if (healthy && res == gvqSuccess)
            res = gvq_ps_srv_wait(s, "gvqPsDestroy", all_said_bye, NULL, "every rank's destroy");
        clean = res == gvqSuccess;
        if (healthy && !clean)
            GVQ_WARN("gvqPsDestroy: served handle closed before every rank's goodbye (%s)",
                     gvqGetErrorString(res));
        pthread_mutex_unlock(&s->lock);
        __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
        pthread_join(s->thread, NULL);
    }
    /* after every goodbye no peer sends again: the receives still posted wait for nothing. Else
     * a transport that may still finish a matched receive after its cancel (MPI) keeps its
     * buffers: left to the process's end, never freed under it. */
    int keep_recv = !clean && s->t != NULL && s->t->cancel_keeps_buffers;
    for (int p = 0; p < s->nranks && s->in != NULL && s->t != NULL; p++) {
        inbox_t *b = &s->in[p];
        if (b->req.active) s->t->ops->cancel(s->t, &b->req);
        if (!keep_recv) gvq_ps_srv_lose(s, b->body);
    }
    if (keep_recv) {
        s->in = NULL; /* the headers' buffers */
        s->nlost = 0; /* the abandoned replies' */
    }
    for (size_t i = 0; i < s->nout && s->t != NULL; i++) {
        if (s->out[i].req.active) s->t->ops->cancel(s->t, &s->out[i].req);
        if (s->t->cancel_keeps_buffers)
            s->out[i].buf = NULL; /* MPI may still read it: left to the process's end */
        gvq_ps_srv_lose(s, s->out[i].buf);
    }
    s->nout = 0;
    if (s->dup != NULL) {
        if (!clean)
            gvqCommAbort(s->dup); /* peers may still send: never freed under them (it frees) */
        else
            gvqCommDestroy(s->dup);
    }
    srv_free(s);
}

gvqResult_t gvq_ps_pin(gvqPs_t ps, const char *fn, gvq_ps_pin_t *pin) {
    gvqComm_t comm = ps->comm;
    if (comm == NULL || !gvq_comm_hold(comm)) {
        GVQ_WARN("%s: the parameter server's communicator was destroyed or aborted", fn);
        return gvqInvalidArgument;
    }
    pin->comm = comm;
    pin->srv = ps->srv; /* fixed while the communicator is held: only its destroy stops it */
    if (pin->srv != NULL) pthread_mutex_lock(&pin->srv->lock);
    return gvqSuccess;
}

void gvq_ps_unpin(gvq_ps_pin_t *pin) {
    if (pin->srv != NULL) pthread_mutex_unlock(&pin->srv->lock);
    gvq_comm_leave(pin->comm);
}
