/*
 * trainer_plan.c -- the order in which the training layer issues a step's aggregations. A unit
 * is one job of the layer's stream: a variable alone, a bucket or the fused group; with
 * schedule gvqTrainScheduleForward a plain one longer than chunkBytes is cut into chunks. The
 * order must be the same on every rank (the calls on a communicator are matched in order), so
 * it never follows this rank's clock: it follows the plan, which every rank holds alike.
 *
 *   no plan     a unit's chunks are issued when its last member is ready (backward order)
 *   steps 2-5   (schedule forward) the same, measured: each unit's ready offset from the
 *               step's first, and its time on the stream
 *   step 5 end  collective: the measures' maximum over the ranks; a simulated link that, each
 *               time it is free, takes the ready chunk the next forward pass needs first (the
 *               highest variable id: registration is backward order), as priority schedulers
 *               of tensor transfers do; rank 0's plan broadcast
 *   later       chunks issued in plan order, each once its unit is ready; a chunk whose unit
 *               is not ready holds back those after it (a later tensor never overtakes)
 *
 * An event after each unit's last chunk is what gvqTrainWaitVariable waits for.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gvq_trainer.h"

#define PLAN_SKIP 2  /* steps not measured: the first ones are slow (pages, caches, fits) */
#define PLAN_STEPS 4 /* steps measured */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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
    if (t->chunk_bytes > 0 && cuttable(t, u)) {
        size_t per = t->chunk_bytes / sizeof(float);
        u->nchunks = (int)((u->count + per - 1) / per);
        if (u->nchunks < 1) u->nchunks = 1;
    }
    return t->nunits++;
}

gvqResult_t gvq_train_plan_commit(gvqTrainer_t t) {
    t->units = calloc((size_t)(t->nvars + t->nbuckets) + 1, sizeof *t->units);
    int *of_bucket = malloc(((size_t)t->nbuckets + 1) * sizeof(int));
    if (t->units == NULL || of_bucket == NULL) goto oom;
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
    for (int u = 0; u < t->nunits && !t->inline_calls; u++)
        if (gvqEventCreate(&t->units[u].done) != gvqSuccess) goto oom;
    return gvqSuccess;
oom:
    free(of_bucket);
    gvq_train_plan_free(t);
    GVQ_WARN("gvqTrainCommit: out of memory for the units of issue");
    return gvqSystemError;
}

void gvq_train_plan_free(gvqTrainer_t t) {
    for (int u = 0; u < t->nunits; u++)
        if (t->units[u].done != NULL) gvqEventDestroy(t->units[u].done);
    free(t->units);
    free(t->plan);
    t->units = NULL;
    t->plan = NULL;
    t->nunits = t->nplan = t->next = 0;
}

/* ---- a step -------------------------------------------------------------------------------- */

/* Chunk c of unit u; after its last chunk, the unit's event. */
static gvqResult_t issue_chunk(gvqTrainer_t t, int unit, int c) {
    tunit_t *u = &t->units[unit];
    gvqResult_t res = gvq_train_issue(t, unit, c);
    if (++u->issued == u->nchunks && u->done != NULL) {
        gvqResult_t ev = gvqEventRecord(u->done, t->stream);
        if (res == gvqSuccess) res = ev;
    }
    return res;
}

/* Issue the plan's chunks up to the first whose unit is not ready. */
static gvqResult_t drain(gvqTrainer_t t) {
    gvqResult_t first = gvqSuccess;
    for (; t->next < t->nplan; t->next++) {
        int u = t->plan[2 * t->next], c = t->plan[2 * t->next + 1];
        if (!t->units[u].ready) break;
        gvqResult_t res = issue_chunk(t, u, c);
        if (first == gvqSuccess) first = res;
    }
    return first;
}

gvqResult_t gvq_train_plan_ready(gvqTrainer_t t, int unit) {
    tunit_t *u = &t->units[unit];
    u->ready = 1;
    u->ready_at = now_s();
    if (t->step_first == 0) t->step_first = u->ready_at;
    if (t->plan != NULL) return drain(t);
    gvqResult_t first = gvqSuccess;
    for (int c = 0; c < u->nchunks; c++) {
        gvqResult_t res = issue_chunk(t, unit, c);
        if (first == gvqSuccess) first = res;
    }
    return first;
}

void gvq_train_plan_flush(gvqTrainer_t t) {
    (void)drain(t); /* refusals are in issue_error */
    for (; t->next < t->nplan; t->next++) { /* a unit missing on this rank: the rest in order */
        int u = t->plan[2 * t->next], c = t->plan[2 * t->next + 1];
        if (t->units[u].ready) (void)issue_chunk(t, u, c);
    }
}

/* The first member of unit u not ready in this step, for a WARN. */
static const char *first_missing(const gvqTrainer_t t, const tunit_t *u) {
    if (u->bucket < 0) return t->vars[u->var].info.name;
    const tbucket_t *b = &t->buckets[u->bucket];
    for (int m = 0; m < b->nmembers; m++)
        if (t->vars[b->members[m]].grad == NULL) return t->vars[b->members[m]].info.name;
    return "?";
}

gvqResult_t gvq_train_plan_wait(const char *fn, gvqTrainer_t t, int unit) {
    const tunit_t *u = &t->units[unit];
    if (!u->ready) {
        GVQ_WARN("%s: its bucket waits for variable '%s', not ready in this step", fn,
                 first_missing(t, u));
        return gvqInvalidUsage;
    }
    if (u->issued < u->nchunks) { /* the plan holds it behind a unit not ready */
        const tunit_t *head = &t->units[t->plan[2 * t->next]];
        GVQ_WARN("%s: the layer's plan issues it after variable '%s', not ready in this step "
                 "(gvqTrainWaitAll issues the rest)",
                 fn, first_missing(t, head));
        return gvqInvalidUsage;
    }
    return u->done != NULL ? gvqEventSynchronize(u->done) : gvqSuccess;
}

/* ---- the plan ------------------------------------------------------------------------------ */

/* Simulate the link over one step: ready[u] offsets, busy[u] a unit's time (its chunks share it
 * evenly); whenever the link is free it takes the next chunk of the ready unit of the highest
 * priority, else waits for the next unit to become ready. Writes (unit, chunk) pairs. */
static void simulate(const gvqTrainer_t t, const double *ready, const double *busy, int *left,
                     int *plan) {
    double clock = 0;
    int n = 0;
    for (int u = 0; u < t->nunits; u++)
        left[u] = t->units[u].nchunks;
    for (;;) {
        int best = -1;
        double next_ready = -1;
        for (int u = 0; u < t->nunits; u++) {
            if (left[u] == 0) continue;
            if (ready[u] <= clock) {
                if (best < 0 || t->units[u].prio > t->units[best].prio) best = u;
            } else if (next_ready < 0 || ready[u] < next_ready) {
                next_ready = ready[u];
            }
        }
        if (best < 0 && next_ready < 0) return; /* every chunk placed */
        if (best < 0) {
            clock = next_ready;
            continue;
        }
        const tunit_t *u = &t->units[best];
        plan[2 * n] = best;
        plan[2 * n + 1] = u->nchunks - left[best]--;
        n++;
        clock += busy[best] / u->nchunks;
    }
}

/* Whether plan (from rank 0) places every chunk once, each unit's in order. */
static int plan_valid(const gvqTrainer_t t, const int *plan, int total, int *next) {
    memset(next, 0, (size_t)t->nunits * sizeof(int));
    for (int k = 0; k < total; k++) {
        int u = plan[2 * k], c = plan[2 * k + 1];
        if (u < 0 || u >= t->nunits || c != next[u]) return 0;
        next[u]++;
    }
    for (int u = 0; u < t->nunits; u++)
        if (next[u] != t->units[u].nchunks) return 0;
    return 1;
}

static gvqResult_t make_plan(gvqTrainer_t t) {
    int n = t->nunits, total = 0;
    for (int u = 0; u < n; u++)
        total += t->units[u].nchunks;
    double *m = malloc(2 * (size_t)n * sizeof *m + 1);
    int *plan = malloc(2 * (size_t)total * sizeof *plan + 1);
    int *left = malloc((size_t)n * sizeof *left + 1);
    gvqResult_t res = gvqSystemError;
    if (m == NULL || plan == NULL || left == NULL) {
        GVQ_WARN("gvqTrainWaitAll: out of memory for the layer's plan of issue");
        goto out; /* the other ranks' collectives below fail by the timeout */
    }
    double k = t->measured > 0 ? (double)t->measured : 1.0;
    for (int u = 0; u < n; u++) {
        m[u] = t->units[u].sum_ready / k;
        m[n + u] = t->units[u].sum_busy / k;
    }
    if ((res = gvqAllReduce(m, m, 2 * (size_t)n, gvqFloat64, gvqMax, t->comm, NULL)) != gvqSuccess)
        goto out;
    simulate(t, m, m + n, left, plan);
    if ((res = gvqBroadcast(plan, plan, 2 * (size_t)total, gvqInt32, 0, t->comm, NULL)) !=
        gvqSuccess)
        goto out;
    if (!plan_valid(t, plan, total, left)) {
        GVQ_WARN("gvqTrainWaitAll: rank 0's plan of issue does not fit this rank's units "
                 "(different builds?)");
        res = gvqInternalError;
        goto out;
    }
    t->plan = plan;
    t->nplan = total;
    plan = NULL;
    if (t->rank == 0)
        GVQ_INFO("training layer: plan of issue made from %d measured steps: %d units in %d "
                 "chunks, what the forward pass needs first sent first",
                 t->measured, n, total);
out:
    free(m);
    free(plan);
    free(left);
    return res;
}

gvqResult_t gvq_train_plan_end_step(gvqTrainer_t t, gvqResult_t step_result) {
    int measuring = t->steps >= PLAN_SKIP && t->steps < PLAN_SKIP + PLAN_STEPS;
    if (measuring && step_result == gvqSuccess) {
        for (int u = 0; u < t->nunits; u++) {
            tunit_t *x = &t->units[u];
            x->sum_ready += x->ready ? x->ready_at - t->step_first : 0;
            x->sum_busy += x->end > x->start ? x->end - x->start : 0;
        }
        t->measured++;
    }
    for (int u = 0; u < t->nunits; u++) {
        tunit_t *x = &t->units[u];
        x->ready = x->issued = 0;
        x->ready_at = x->start = x->end = 0;
    }
    t->next = 0;
    t->step_first = 0;
    t->steps++;
    if (t->chunk_bytes == 0 || t->plan != NULL || t->steps != PLAN_SKIP + PLAN_STEPS)
        return gvqSuccess;
    return make_plan(t);
}
