/*
 * trainer_plan.c -- the order in which the training layer aggregates a step's units: a unit is a
 * variable alone, a bucket or the fused group. The calls on a communicator are matched in order,
 * so every rank must run the same units in the same order, whatever its own clock says.
 *
 * gvqTrainScheduleReady: a unit is queued on the layer's stream when its last member is ready
 * (backward order), one job each, an event after it for gvqTrainWaitVariable.
 *
 * gvqTrainScheduleForward (waitFree, calls on a progress thread): one job per step negotiates
 * the order with the other ranks as it goes, as Horovod's coordinator does, and sends first what
 * the next forward pass needs first, as priority schedulers of tensor transfers do:
 *
 *   first: the ranks' step numbers compared (a rank a step behind fails the step everywhere)
 *   agreed = {}
 *   loop until every unit is done:
 *     u = the agreed unit with chunks left whose variables the forward pass needs first
 *         (the highest id: registration is backward order)
 *     none: wait until this rank has a ready unit not agreed yet (or the step is closed),
 *           then allreduce the ready flags alone
 *     else: allreduce [u's next chunk | this rank's ready flags] in one call; after u's last
 *           chunk, u is complete (gvqTrainWaitVariable returns)
 *     agreed = the units whose flag averaged 1: ready on every rank when they sent
 *     dead   = the units some rank closed its step without (gvqTrainWaitAll, destroy)
 *     nothing agreed left and a unit dead: the step fails on every rank (a WARN names it)
 *   (a compressed, fused or factored unit runs whole, through its own calls, when picked)
 *
 * Every rank picks from the same allreduced flags, so the order is the same everywhere. Every
 * rank runs one job per step: queued at its first ready unit, or at the close. While it runs,
 * the layer's communicator is the job's until gvqTrainWaitAll: a blocking call on it in between
 * waits for the whole step (give the layer a communicator of its own). A layer with sparse
 * variables keeps the ready schedule (their route is decided by a blocking call mid-step).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "gvq_trainer.h"

/* ---- units, at commit ---------------------------------------------------------------------- */

/* Whether a unit is one plain allreduce that may be cut (a plain bucket, a plain variable whose
 * gradient never comes as factors). */
static int cuttable(const gvqTrainer_t t, const tunit_t *u) {
    if (u->bucket >= 0) return !t->buckets[u->bucket].fused;
    const tvar_t *x = &t->vars[u->var];
    return x->comp == NULL && !x->factors;
}

static int new_unit(gvqTrainer_t t, int var, int bucket) {
    tunit_t *u = &t->units[t->nunits];
    memset(u, 0, sizeof *u);
    u->var = var;
    u->bucket = bucket;
    u->count = bucket >= 0 ? t->buckets[bucket].count : t->vars[var].info.count;
    u->nchunks = 1;
    if (t->negotiate && cuttable(t, u)) {
        size_t per = t->chunk_bytes / sizeof(float);
        u->nchunks = (int)((u->count + per - 1) / per);
        if (u->nchunks < 1) u->nchunks = 1;
    }
    return t->nunits++;
}

gvqResult_t gvq_train_plan_commit(gvqTrainer_t t) {
    int sparse = 0;
    for (int i = 0; i < t->nvars; i++)
        sparse |= t->vars[i].sp != NULL;
    t->negotiate =
        t->schedule == gvqTrainScheduleForward && t->wait_free && !t->inline_calls && !sparse;
    if (t->schedule == gvqTrainScheduleForward && !t->negotiate && t->rank == 0)
        GVQ_INFO("training layer: schedule forward falls back to the ready schedule (%s)",
                 sparse          ? "sparse variables"
                 : !t->wait_free ? "no waitFree"
                                 : "calls inline");
    t->units = calloc((size_t)(t->nvars + t->nbuckets) + 1, sizeof *t->units);
    int *of_bucket = malloc(((size_t)t->nbuckets + 1) * sizeof(int));
    if (t->units == NULL || of_bucket == NULL) goto oom;
    if (pthread_mutex_init(&t->lock, NULL) != 0) goto oom;
    if (pthread_cond_init(&t->cond, NULL) != 0) {
        pthread_mutex_destroy(&t->lock);
        goto oom;
    }
    for (int k = 0; k < t->nbuckets; k++)
        of_bucket[k] = -1;
    for (int i = 0; i < t->nvars; i++) {
        tvar_t *x = &t->vars[i];
        int b = x->fused >= 0 ? x->fused : x->info.route == gvqRouteBucket ? x->info.bucket : -1;
        if (x->sp != NULL) {
            x->unit = -1;
            continue;
        }
        if (b < 0)
            x->unit = new_unit(t, i, -1);
        else if ((x->unit = of_bucket[b]) < 0)
            x->unit = of_bucket[b] = new_unit(t, -1, b);
        t->units[x->unit].prio = i; /* ids grow: the last member's */
    }
    free(of_bucket);
    of_bucket = NULL;
    size_t most = 0; /* the longest chunk: every unit's first */
    for (int u = 0; u < t->nunits; u++) {
        size_t off, per;
        gvq_train_chunk_span(&t->units[u], 0, &off, &per);
        if (cuttable(t, &t->units[u]) && per > most) most = per;
    }
    if (t->negotiate &&
        (t->stage = malloc((most + 2 * (size_t)t->nunits + 1) * sizeof(float))) == NULL)
        goto oom_sync;
    for (int u = 0; u < t->nunits && !t->inline_calls && !t->negotiate; u++)
        if (gvqEventCreate(&t->units[u].done) != gvqSuccess) goto oom_sync;
    return gvqSuccess;
oom_sync:
    pthread_cond_destroy(&t->cond);
    pthread_mutex_destroy(&t->lock);
oom:
    free(of_bucket);
    for (int u = 0; t->units != NULL && u < t->nunits; u++)
        if (t->units[u].done != NULL) gvqEventDestroy(t->units[u].done);
    free(t->units);
    free(t->stage);
    t->units = NULL;
    t->stage = NULL;
    t->nunits = 0;
    GVQ_WARN("gvqTrainCommit: out of memory for the units of issue");
    return gvqSystemError;
}

void gvq_train_plan_free(gvqTrainer_t t) {
    if (t->units == NULL) return;
    for (int u = 0; u < t->nunits; u++)
        if (t->units[u].done != NULL) gvqEventDestroy(t->units[u].done);
    pthread_cond_destroy(&t->cond);
    pthread_mutex_destroy(&t->lock);
    free(t->units);
    free(t->stage);
    t->units = NULL;
    t->stage = NULL;
    t->nunits = 0;
}

/* The first member of unit u not ready in this step, for a WARN. */
static const char *first_missing(const gvqTrainer_t t, const tunit_t *u) {
    if (u->bucket < 0) return t->vars[u->var].info.name;
    const tbucket_t *b = &t->buckets[u->bucket];
    for (int m = 0; m < b->nmembers; m++)
        if (t->vars[b->members[m]].grad == NULL) return t->vars[b->members[m]].info.name;
    return "?";
}

/* ---- the negotiated schedule: one job per step, on the progress thread ---------------------- */

static void no_release(void *arg) {
    (void)arg;
}

/* Unit u is done: its waiters return. */
static void complete(gvqTrainer_t t, tunit_t *u) {
    pthread_mutex_lock(&t->lock);
    u->completed = 1;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
}

/* The agreed unit with chunks left that the forward pass needs first, or -1. */
static int pick(const gvqTrainer_t t) {
    int best = -1;
    for (int u = 0; u < t->nunits; u++) {
        const tunit_t *x = &t->units[u];
        if (x->agreed && x->left > 0 && (best < 0 || x->prio > t->units[best].prio)) best = u;
    }
    return best;
}

/* Wait until this rank has a ready unit that is not agreed yet, or its step is closed (then
 * every rank's next exchange is due: a rank whose news another lacks blocks in it). */
static gvqResult_t wait_news(gvqTrainer_t t) {
    uint64_t since = 0;
    for (;;) {
        if (__atomic_load_n(&t->closed, __ATOMIC_ACQUIRE)) return gvqSuccess;
        for (int u = 0; u < t->nunits; u++)
            if (!t->units[u].agreed && __atomic_load_n(&t->units[u].ready, __ATOMIC_ACQUIRE))
                return gvqSuccess;
        gvqResult_t res = gvq_comm_idle(t->comm, &since); /* abort, timeout */
        if (res != gvqSuccess) {
            GVQ_WARN("gvqTrainGradReady: %s while the layer waited for the step's next gradient",
                     res == gvqTimeout ? "timed out (GVQ_TIMEOUT_MS)" : "communicator aborted");
            return res;
        }
    }
}

/* This rank's flags after n floats of the stage, allreduced with them: per unit 1 when ready,
 * per unit 1 when this rank closed its step without it, and 1 when closed. Then the agreed
 * units (every rank sent 1), the dead ones (any rank did) and whether every rank has closed. */
static gvqResult_t exchange(gvqTrainer_t t, size_t n, int *all_closed) {
    float *ready = t->stage + n, *dead = ready + t->nunits, *closed = dead + t->nunits;
    /* closed first: a step closes after its last hand-over, so every unit ready before the
     * close is seen ready here */
    int is_closed = __atomic_load_n(&t->closed, __ATOMIC_ACQUIRE);
    for (int u = 0; u < t->nunits; u++) {
        int r = __atomic_load_n(&t->units[u].ready, __ATOMIC_ACQUIRE);
        ready[u] = r ? 1.0f : 0.0f;
        dead[u] = is_closed && !r ? 1.0f : 0.0f;
    }
    *closed = is_closed ? 1.0f : 0.0f;
    GVQCHECK(gvqAllReduce(t->stage, t->stage, n + 2 * (size_t)t->nunits + 1, gvqFloat32, t->op,
                          t->comm, NULL));
    /* a sum of 0s and 1s is exact; an average is 1 only where every rank sent 1 */
    const float all = t->op == gvqAvg ? 1.0f - 0.5f / (float)t->nranks : (float)t->nranks - 0.5f;
    for (int u = 0; u < t->nunits; u++) {
        t->units[u].agreed |= ready[u] > all;
        t->units[u].seen |= ready[u] > 0.0f;
        t->units[u].dead |= dead[u] > 0.0f;
    }
    *all_closed = *closed > all;
    return gvqSuccess;
}

/* Every rank at the same step, or the step fails everywhere (a rank whose last step failed on
 * its own must not pair its flags with another's older step). */
static gvqResult_t same_step(gvqTrainer_t t) {
    int32_t mine = (int32_t)(t->steps & 0x3fffffff), s[2] = {mine, -mine};
    GVQCHECK(gvqAllReduce(s, s, 2, gvqInt32, gvqMax, t->comm, NULL));
    if (s[0] == mine && -s[1] == mine) return gvqSuccess;
    GVQ_WARN("gvqTrainWaitAll: the ranks are at different steps of the layer (here %d, others "
             "from %d to %d): an earlier step failed on some rank only; this step fails on "
             "every rank, the next ones count from the latest",
             (int)mine, (int)-s[1], (int)s[0]);
    t->steps = s[0]; /* every rank the same from here (read after the stream's wait) */
    return gvqRemoteError;
}

/* Whether any rank had any unit ready in this step. */
static int any_seen(const gvqTrainer_t t) {
    for (int u = 0; u < t->nunits; u++)
        if (t->units[u].seen) return 1;
    return 0;
}

/* The first unit with chunks left that some rank closed its step without, or -1. */
static int first_dead(const gvqTrainer_t t) {
    for (int u = 0; u < t->nunits; u++)
        if (t->units[u].dead && t->units[u].left > 0) return u;
    return -1;
}

/* The next chunk of plain unit u with the flags; after its last chunk, u is done. */
static gvqResult_t run_chunk(gvqTrainer_t t, int unit, int *all_closed) {
    tunit_t *u = &t->units[unit];
    int c = u->nchunks - u->left;
    size_t off, n;
    gvq_train_chunk_span(u, c, &off, &n);
    double start = gvq_train_now();
    float *data = c == 0 ? gvq_train_unit_data(t, unit) /* packs a bucket */
                         : (u->bucket >= 0 ? t->buckets[u->bucket].buf : t->vars[u->var].grad);
    memcpy(t->stage, data + off, n * sizeof(float));
    GVQCHECK(exchange(t, n, all_closed));
    memcpy(data + off, t->stage, n * sizeof(float));
    if (c == 0) u->start = start;
    if (--u->left > 0) return gvqSuccess;
    u->end = gvq_train_now();
    gvq_train_unit_finish(t, unit);
    complete(t, u);
    return gvqSuccess;
}

static gvqResult_t negotiate_job(void *arg) {
    gvqTrainer_t t = arg;
    int left = 0, all_closed = 0;
    for (int u = 0; u < t->nunits; u++) {
        t->units[u].left = t->units[u].nchunks;
        t->units[u].agreed = t->units[u].dead = t->units[u].seen = 0;
        left += t->units[u].nchunks;
    }
    gvqResult_t res = same_step(t);
    while (left > 0 && res == gvqSuccess) {
        int u = pick(t);
        if (u >= 0 && !cuttable(t, &t->units[u])) {
            res = gvq_train_unit_run(t, u);
            t->units[u].left = 0;
            left--;
            if (res == gvqSuccess) complete(t, &t->units[u]);
        } else if (u >= 0) {
            res = run_chunk(t, u, &all_closed);
            left--;
        } else if (all_closed && !any_seen(t)) {
            break; /* an empty step: every rank closed with nothing (a destroy between steps) */
        } else if (all_closed || first_dead(t) >= 0) {
            int d = first_dead(t);
            GVQ_WARN("gvqTrainWaitAll: a rank ended its step without the gradient of '%s'; the "
                     "step's aggregations stop on every rank",
                     d >= 0 ? first_missing(t, &t->units[d]) : "?");
            res = gvqInvalidUsage;
        } else if ((res = wait_news(t)) == gvqSuccess) {
            res = exchange(t, 0, &all_closed);
        }
    }
    pthread_mutex_lock(&t->lock);
    t->job_over = 1;
    t->job_res = res;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
    return res;
}

/* ---- a step -------------------------------------------------------------------------------- */

/* Ready schedule: chunk c of unit u queued; after its last chunk, the unit's event. */
static gvqResult_t issue_chunk(gvqTrainer_t t, int unit, int c) {
    tunit_t *u = &t->units[unit];
    gvqResult_t res = gvq_train_issue(t, unit, c);
    if (++u->issued == u->nchunks && u->done != NULL) {
        gvqResult_t ev = gvqEventRecord(u->done, t->stream);
        if (res == gvqSuccess) res = ev;
    }
    return res;
}

/* Queue the step's negotiating job (once per step). */
static gvqResult_t queue_job(gvqTrainer_t t) {
    if (t->job_queued) return gvqSuccess;
    t->job_queued = 1;
    gvqResult_t res = gvq_stream_enqueue(t->stream, "gvqTrainGradReady", &t->comm, 1, negotiate_job,
                                         no_release, t);
    if (res != gvqSuccess && t->issue_error == gvqSuccess) t->issue_error = res;
    if (res != gvqSuccess) { /* nothing runs this step: waiters return the refusal */
        pthread_mutex_lock(&t->lock);
        t->job_over = 1;
        t->job_res = res;
        pthread_mutex_unlock(&t->lock);
    }
    return res;
}

gvqResult_t gvq_train_plan_ready(gvqTrainer_t t, int unit) {
    tunit_t *u = &t->units[unit];
    __atomic_store_n(&u->ready, 1, __ATOMIC_RELEASE);
    if (!t->negotiate) {
        gvqResult_t first = gvqSuccess;
        for (int c = 0; c < u->nchunks; c++) {
            gvqResult_t res = issue_chunk(t, unit, c);
            if (first == gvqSuccess) first = res;
        }
        return first;
    }
    return queue_job(t);
}

void gvq_train_plan_close(gvqTrainer_t t) {
    __atomic_store_n(&t->closed, 1, __ATOMIC_RELEASE);
    if (t->negotiate && t->nunits > 0) (void)queue_job(t); /* every rank runs one per step */
}

void gvq_train_plan_end_step(gvqTrainer_t t) {
    for (int u = 0; u < t->nunits; u++) {
        tunit_t *x = &t->units[u];
        __atomic_store_n(&x->ready, 0, __ATOMIC_RELAXED);
        x->issued = x->completed = 0;
        x->start = x->end = 0;
    }
    t->job_queued = t->job_over = 0;
    t->steps++;
    t->job_res = gvqSuccess;
    __atomic_store_n(&t->closed, 0, __ATOMIC_RELEASE);
}

gvqResult_t gvq_train_plan_wait(const char *fn, gvqTrainer_t t, int unit) {
    tunit_t *u = &t->units[unit];
    if (!u->ready) {
        GVQ_WARN("%s: its bucket waits for variable '%s', not ready in this step", fn,
                 first_missing(t, u));
        return gvqInvalidUsage;
    }
    if (!t->negotiate) {
        gvqResult_t res = u->done != NULL ? gvqEventSynchronize(u->done) : gvqSuccess;
        return res != gvqSuccess ? res : t->issue_error; /* a unit refused at issue */
    }
    gvq_thread_caller_blocked(1); /* the progress thread polls without sleeping meanwhile */
    pthread_mutex_lock(&t->lock);
    while (!u->completed && !t->job_over)
        pthread_cond_wait(&t->cond, &t->lock);
    gvqResult_t res = u->completed ? gvqSuccess : t->job_res;
    pthread_mutex_unlock(&t->lock);
    gvq_thread_caller_blocked(-1);
    if (res == gvqSuccess && !u->completed) {
        GVQ_WARN("%s: the step's negotiation ended without the unit", fn);
        res = gvqInternalError;
    }
    return res;
}
