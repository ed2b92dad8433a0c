/*
 * ps_serve_call.c -- a rank's own calls on a served parameter server (gvq_ps_serve.h; the protocol
 * is in ps_serve.c): push (merge, a block to each owner, its own rows kept at once), apply (this
 * rank's step ends: a clock to every rank) and pull (the indices to their owners, its own rows
 * read once its own shards reached the step asked for, the replies checked). Each runs inside
 * the communicator (ps_push.c and ps_pull.c enter it), so that its destroy or abort, which stops
 * the thread and frees this state, waits until the call is out.
 */
#include <stdlib.h>

#include "gvq_ps_serve.h"
#include "gvq_ps_wire.h"

gvqResult_t gvq_ps_serve_push(gvqPs_t ps, const int64_t *idx, const void *grads, size_t n) {
    const char *fn = "gvqPsPush";
    gvq_ps_srv_t *s = ps->srv;
    int N = s->nranks;
    size_t rb = ps->row_bytes;
    int64_t *midx = malloc(GVQ_MAX(n, (size_t)1) * sizeof *midx);
    char *mval = malloc(GVQ_MAX(n, (size_t)1) * rb);
    int *owner = malloc(GVQ_MAX(n, (size_t)1) * sizeof *owner);
    size_t *count = calloc((size_t)N, sizeof *count), *at = calloc((size_t)N, sizeof *at);
    void **block = calloc((size_t)N, sizeof *block);
    size_t m = 0;
    gvqResult_t res = midx && mval && owner && count && at && block ? gvqSuccess : gvqSystemError;
    if (res == gvqSuccess && n > 0)
        res = gvq_sparse_merge(ps->comm->dev, ps->dtype, ps->dim, idx, grads, n, midx, mval, &m);
    for (size_t i = 0; i < m && res == gvqSuccess; i++) {
        uint64_t slot;
        gvq_part_locate(&ps->map, (uint64_t)midx[i], &owner[i], &slot);
        count[owner[i]]++;
    }
    for (int p = 0; p < N && res == gvqSuccess; p++)
        if (count[p] > 0 && (block[p] = malloc(gvq_wire_block_bytes(count[p], rb))) == NULL)
            res = gvqSystemError;
    for (size_t i = 0; i < m && res == gvqSuccess; i++) {
        int p = owner[i];
        gvq_wire_block_put(block[p], count[p], at[p]++, midx[i], mval + i * rb, rb);
    }
    if (res == gvqSuccess) {
        pthread_mutex_lock(&s->lock);
        res = gvq_ps_srv_refuse_failed(s, fn);
        uint64_t step = s->clocked[s->rank], call = s->calls;
        for (int p = 0; p < N && res == gvqSuccess; p++) {
            if (count[p] == 0) continue;
            void *b = block[p];
            block[p] = NULL; /* handed over */
            if (p == s->rank) {
                res = gvq_ps_srv_keep_push(s, p, step, call, count[p], b);
            } else if ((res = gvq_ps_srv_send_header(s, p, OP_PUSH, (int64_t)step,
                                                     (int64_t)count[p], (int64_t)call)) ==
                       gvqSuccess) {
                res =
                    gvq_ps_srv_send_owned(s, p, s->tag_body, b, gvq_wire_block_bytes(count[p], rb));
            } else {
                free(b);
            }
        }
        if (res != gvqSuccess && res != s->failed) {
            GVQ_WARN("%s: %s sending the rows; the handle is failed", fn, gvqGetErrorString(res));
            gvq_ps_srv_fail(s, res); /* some shards may have the rows, others not */
        }
        s->calls++;
        ps->stats.pushes += res == gvqSuccess;
        gvq_ps_srv_progress(s);
        pthread_mutex_unlock(&s->lock);
    }
    for (int p = 0; p < N && block != NULL; p++)
        free(block[p]);
    free(midx), free(mval), free(owner), free(count), free(at), free(block);
    return res;
}

gvqResult_t gvq_ps_serve_apply(gvqPs_t ps) {
    const char *fn = "gvqPsApply";
    gvq_ps_srv_t *s = ps->srv;
    pthread_mutex_lock(&s->lock);
    gvqResult_t res = gvq_ps_srv_refuse_failed(s, fn);
    uint64_t step = s->clocked[s->rank];
    for (int p = 0; p < s->nranks && res == gvqSuccess; p++)
        if (p != s->rank) res = gvq_ps_srv_send_header(s, p, OP_CLOCK, (int64_t)step, 0, 0);
    if (res == gvqSuccess) {
        s->clocked[s->rank]++;
        s->calls = 0;
        ps->stats.applies++;
        gvq_ps_srv_progress(s);
    } else if (res != s->failed) {
        GVQ_WARN("%s: %s telling the shards; the handle is failed", fn, gvqGetErrorString(res));
        gvq_ps_srv_fail(s, res);
    }
    pthread_mutex_unlock(&s->lock);
    return res;
}

typedef struct {
    uint64_t need;
    gvq_req_t *reqs;
    int n;
} pull_wait_t;

/* Both waits end when the handle failed meanwhile (the pull then reports it). */
static int version_reached(gvq_ps_srv_t *s, void *arg) {
    return s->version >= ((pull_wait_t *)arg)->need || s->failed != gvqSuccess;
}

static int replies_in(gvq_ps_srv_t *s, void *arg) {
    pull_wait_t *w = arg;
    if (s->failed != gvqSuccess) return 1;
    for (int p = 0; p < w->n; p++) {
        if (!w->reqs[p].active) continue;
        int done = 0;
        gvqResult_t res = s->t->ops->test(s->t, &w->reqs[p], &done);
        if (res != gvqSuccess) {
            GVQ_WARN("gvqPsPull: the reply of rank %d failed (%s)", p, gvqGetErrorString(res));
            gvq_ps_srv_fail(s, res);
            return 1;
        }
        if (!done) return 0;
        s->ps->stats.bytesReceived += w->reqs[p].bytes;
    }
    return 1;
}

typedef struct {
    size_t m;       /* unique indices */
    int64_t *uniq;  /* ascending */
    int *owner;     /* per unique index */
    size_t *pos;    /* its place in its owner's request (or its slot, held here) */
    size_t *count;  /* per rank */
    void **request; /* per rank: its indices */
    char **reply;   /* per rank: {status, version} + rows */
    gvq_req_t *reqs;
    char *own; /* the rows held here, by pos */
} pull_plan_t;

static void plan_free(pull_plan_t *x, int N) {
    for (int p = 0; p < N && x->request != NULL; p++)
        free(x->request[p]);
    for (int p = 0; p < N && x->reply != NULL; p++)
        free(x->reply[p]);
    free(x->uniq), free(x->owner), free(x->pos), free(x->count), free(x->request);
    free(x->reply), free(x->reqs), free(x->own);
}

static gvqResult_t plan_pull(gvqPs_t ps, const int64_t *idx, size_t n, pull_plan_t *x) {
    int N = ps->srv->nranks;
    size_t k = GVQ_MAX(n, (size_t)1);
    x->uniq = malloc(k * sizeof *x->uniq);
    x->owner = malloc(k * sizeof *x->owner);
    x->pos = malloc(k * sizeof *x->pos);
    x->count = calloc((size_t)N, sizeof *x->count);
    x->request = calloc((size_t)N, sizeof *x->request);
    x->reply = calloc((size_t)N, sizeof *x->reply);
    x->reqs = calloc((size_t)N, sizeof *x->reqs);
    if (!x->uniq || !x->owner || !x->pos || !x->count || !x->request || !x->reply || !x->reqs)
        return gvqSystemError;
    if (n > 0) memcpy(x->uniq, idx, n * sizeof *idx);
    qsort(x->uniq, n, sizeof *x->uniq, gvq_ps_i64_cmp);
    for (size_t i = 0; i < n; i++)
        if (x->m == 0 || x->uniq[x->m - 1] != x->uniq[i]) x->uniq[x->m++] = x->uniq[i];
    for (size_t i = 0; i < x->m; i++) {
        uint64_t slot;
        gvq_part_locate(&ps->map, (uint64_t)x->uniq[i], &x->owner[i], &slot);
        x->pos[i] = x->count[x->owner[i]]++;
    }
    for (int p = 0; p < N; p++) {
        if (x->count[p] == 0) continue;
        x->request[p] = malloc(x->count[p] * sizeof(int64_t));
        x->reply[p] = malloc(REPLY_HDR_BYTES + x->count[p] * ps->row_bytes);
        if (x->request[p] == NULL || x->reply[p] == NULL) return gvqSystemError;
    }
    for (size_t i = 0; i < x->m; i++)
        ((int64_t *)x->request[x->owner[i]])[x->pos[i]] = x->uniq[i];
    return gvqSuccess;
}

/* Post the replies' receives and send the requests. Under the lock. */
static gvqResult_t ask_owners(gvq_ps_srv_t *s, pull_plan_t *x, uint64_t need) {
    size_t rb = s->ps->row_bytes;
    for (int p = 0; p < s->nranks; p++) {
        if (p == s->rank || x->count[p] == 0) continue;
        GVQCHECK(s->t->ops->irecv(s->t, p, s->tag_rep, x->reply[p],
                                  REPLY_HDR_BYTES + x->count[p] * rb, &x->reqs[p]));
        GVQCHECK(gvq_ps_srv_send_header(s, p, OP_PULL, (int64_t)need, (int64_t)x->count[p], 0));
        void *b = x->request[p];
        x->request[p] = NULL; /* handed over */
        GVQCHECK(gvq_ps_srv_send_owned(s, p, s->tag_body, b, x->count[p] * sizeof(int64_t)));
    }
    return gvqSuccess;
}

/* The rows held here (once the version came), by their place in the plan. Under the lock. */
static gvqResult_t read_own(gvq_ps_srv_t *s, pull_plan_t *x) {
    gvqPs_t ps = s->ps;
    size_t k = x->count[s->rank];
    if (k == 0) return gvqSuccess;
    x->own = malloc(k * ps->row_bytes);
    if (x->own == NULL) return gvqSystemError;
    for (size_t i = 0; i < x->m; i++) {
        if (x->owner[i] != s->rank) continue;
        int rank;
        uint64_t slot;
        gvq_part_locate(&ps->map, (uint64_t)x->uniq[i], &rank, &slot);
        memcpy(x->own + x->pos[i] * ps->row_bytes, gvq_ps_row(ps, ps->values, slot), ps->row_bytes);
    }
    return gvqSuccess;
}

/* Give up on the replies still under way (their buffers wait for the transport's end); returns
 * how many. */
static int abandon_replies(gvq_ps_srv_t *s, pull_plan_t *x) {
    int n = 0;
    for (int p = 0; p < s->nranks; p++) {
        if (!x->reqs[p].active) continue;
        s->t->ops->cancel(s->t, &x->reqs[p]);
        gvq_ps_srv_lose(s, x->reply[p]);
        x->reply[p] = NULL;
        n++;
    }
    return n;
}

static gvqResult_t check_replies(gvq_ps_srv_t *s, const pull_plan_t *x, uint64_t need) {
    for (int p = 0; p < s->nranks; p++) {
        if (p == s->rank || x->count[p] == 0) continue;
        int64_t head[2];
        memcpy(head, x->reply[p], sizeof head);
        if (head[0] != 0) {
            GVQ_WARN("gvqPsPull: rank %d's server failed (see its log); values not written", p);
            return gvqRemoteError;
        }
        if (head[1] < 0 || (uint64_t)head[1] < need) {
            GVQ_WARN("gvqPsPull: rank %d answered with version %lld, %llu asked; values not "
                     "written",
                     p, (long long)head[1], (unsigned long long)need);
            return gvqRemoteError;
        }
    }
    return gvqSuccess;
}

gvqResult_t gvq_ps_serve_pull(gvqPs_t ps, const int64_t *idx, void *values, size_t n) {
    const char *fn = "gvqPsPull";
    gvq_ps_srv_t *s = ps->srv;
    pull_plan_t x = {0};
    gvqResult_t res = plan_pull(ps, idx, n, &x);
    if (res != gvqSuccess) {
        plan_free(&x, s->nranks);
        return res;
    }
    pthread_mutex_lock(&s->lock);
    uint64_t c = s->clocked[s->rank], st = (uint64_t)ps->cfg.staleness;
    uint64_t need = c > st ? c - st : 0;
    res = gvq_ps_srv_refuse_failed(s, fn);
    if (res == gvqSuccess) res = ask_owners(s, &x, need);
    pull_wait_t w = {need, x.reqs, s->nranks};
    if (res == gvqSuccess && x.count[s->rank] > 0)
        res = gvq_ps_srv_wait(s, fn, version_reached, &w, "this rank's own shards' step");
    if (res == gvqSuccess) res = read_own(s, &x);
    if (res == gvqSuccess) res = gvq_ps_srv_wait(s, fn, replies_in, &w, "the owners' replies");
    if (res == gvqSuccess) res = gvq_ps_srv_refuse_failed(s, fn);
    if (res == gvqSuccess) res = check_replies(s, &x, need);
    /* a refusal (every reply in) fails the call; replies given up on, a timeout or an abort
     * fail the handle */
    if (res != gvqSuccess && (abandon_replies(s, &x) > 0 || res != gvqRemoteError))
        gvq_ps_srv_fail(s, res == gvqInvalidArgument ? gvqRemoteError : res);
    if (res == gvqSuccess) ps->stats.pulls++;
    pthread_mutex_unlock(&s->lock);
    for (size_t i = 0; i < n && res == gvqSuccess; i++) {
        size_t j = gvq_ps_find_sorted(x.uniq, x.m, idx[i]);
        int p = x.owner[j];
        const char *src = p == s->rank ? x.own + x.pos[j] * ps->row_bytes
                                       : x.reply[p] + REPLY_HDR_BYTES + x.pos[j] * ps->row_bytes;
        memcpy((char *)values + i * ps->row_bytes, src, ps->row_bytes);
    }
    plan_free(&x, s->nranks);
    return res;
}

/* ---- start / stop -------------------------------------------------------------------------- */
