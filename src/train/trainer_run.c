/*
 * trainer_run.c -- running the training layer's aggregations, below trainer.c (when) and
 * trainer_plan.c (in which order): a unit's job on the layer's stream, or its pieces for the
 * negotiated schedule.
 *
 *   job (unit, chunk):  fused group -> its compressed calls inside one group
 *                       plain bucket -> a chunk of its buffer allreduced; after the last, the
 *                                       members unpacked
 *                       variable     -> its factors (SFB), its compressor, or a plain chunk
 *                       then its start and end times
 */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "gvq_trainer.h"

typedef struct {
    gvqTrainer_t t;
    int unit, chunk;
    size_t off, count; /* the chunk's floats in the unit */
} train_job_t;

/* Bytes a plain ring sends per rank for n floats. */
static unsigned long long ring_bytes(const gvqTrainer_t t, size_t n) {
    return t->nranks > 1 ? (unsigned long long)(2.0 * (t->nranks - 1) * (double)n * 4.0 / t->nranks)
                         : 0ull;
}

/* Sufficient-factor broadcasting of x: every rank's factors gathered, then
 * grad (M x N, row-major) = sum over ranks and samples of u_j v_j^T, one gemm on every rank (the
 * same inputs in the same order: the same bits everywhere). Column-major, grad is the N x M
 * matrix V^T U with V^T (N x Pb) the gathered v rows and U^T (M x Pb) the gathered u rows. */
static gvqResult_t sfb_run(gvqTrainer_t t, tvar_t *x) {
    int M = x->shape[0], N = x->shape[1], pb = t->nranks * x->fbatch;
    size_t nu = (size_t)x->fbatch * (size_t)M, nv = (size_t)x->fbatch * (size_t)N;
    GVQCHECK(gvqAllGather(x->fu, x->all_u, nu, gvqFloat32, t->comm, NULL));
    GVQCHECK(gvqAllGather(x->fv, x->all_v, nv, gvqFloat32, t->comm, NULL));
    float alpha = t->op == gvqAvg ? 1.0f / (float)t->nranks : 1.0f;
    return gvq_host_sgemm(0, 1, N, M, pb, alpha, x->all_v, N, x->all_u, M, 0.0f, x->grad, N);
}

/* The bytes this rank sent for job j of unit u (0 for compressed ones: their compressors
 * count). */
static unsigned long long job_bytes(const gvqTrainer_t t, const tunit_t *u, const train_job_t *j) {
    if (u->bucket >= 0) return 0; /* a bucket's members are counted after its last chunk */
    const tvar_t *x = &t->vars[u->var];
    if (x->sfb_now)
        return (unsigned long long)(t->nranks - 1) * (size_t)x->fbatch *
               (size_t)(x->shape[0] + x->shape[1]) * sizeof(float);
    return x->comp != NULL ? 0 : ring_bytes(t, j->count);
}

/* A plain bucket's members copied into its buffer (every member is ready), or back. */
static void pack_bucket(const gvqTrainer_t t, tbucket_t *b) {
    for (int m = 0; m < b->nmembers; m++) {
        const tvar_t *x = &t->vars[b->members[m]];
        memcpy(b->buf + x->bucket_off, x->grad, x->info.count * sizeof(float));
    }
}

static void unpack_bucket(const gvqTrainer_t t, const tbucket_t *b) {
    for (int m = 0; m < b->nmembers; m++) {
        const tvar_t *x = &t->vars[b->members[m]];
        memcpy(x->grad, b->buf + x->bucket_off, x->info.count * sizeof(float));
    }
}

/* A fused group: its members' compressed calls inside one group. */
static gvqResult_t run_fused(gvqTrainer_t t, const tbucket_t *b) {
    (void)gvqGroupStart();
    for (int m = 0; m < b->nmembers; m++) {
        tvar_t *x = &t->vars[b->members[m]];
        (void)gvqAllReduceCompressed(x->grad, x->grad, x->info.count, gvqFloat32, t->op, x->comp,
                                     t->comm, NULL); /* checked: the group's end */
    }
    return gvqGroupEnd();
}

/* A chunk of a plain bucket; after its last, the members unpacked. */
static gvqResult_t run_bucket(gvqTrainer_t t, tbucket_t *b, const train_job_t *j, int last) {
    gvqResult_t res =
        gvqAllReduce(b->buf + j->off, b->buf + j->off, j->count, gvqFloat32, t->op, t->comm, NULL);
    if (res == gvqSuccess && last) unpack_bucket(t, b);
    return res;
}

/* A variable alone: by its factors, through its compressor, or a plain chunk of it. */
static gvqResult_t run_var(gvqTrainer_t t, tvar_t *x, const train_job_t *j) {
    if (x->sfb_now) return sfb_run(t, x);
    if (x->comp != NULL)
        return gvqAllReduceCompressed(x->grad, x->grad, x->info.count, gvqFloat32, t->op, x->comp,
                                      t->comm, NULL);
    return gvqAllReduce(x->grad + j->off, x->grad + j->off, j->count, gvqFloat32, t->op, t->comm,
                        NULL);
}

/* On the progress thread: one chunk of a unit's aggregation, timed. */
static gvqResult_t train_job_run(void *arg) {
    const train_job_t *j = arg;
    gvqTrainer_t t = j->t;
    tunit_t *u = &t->units[j->unit];
    int first = j->chunk == 0, last = j->chunk == u->nchunks - 1;
    double start = gvq_train_now();
    gvqResult_t res;
    if (u->bucket >= 0 && t->buckets[u->bucket].fused)
        res = run_fused(t, &t->buckets[u->bucket]);
    else if (u->bucket >= 0)
        res = run_bucket(t, &t->buckets[u->bucket], j, last);
    else
        res = run_var(t, &t->vars[u->var], j);
    double end = gvq_train_now();
    pthread_mutex_lock(&t->lock); /* gvqTrainGetVariableInfo may read beside this */
    if (first) u->start = start;
    if (last) u->end = end;
    if (u->bucket >= 0) {
        tbucket_t *b = &t->buckets[u->bucket];
        if (first) b->start = start;
        if (last) b->end = end;
        for (int m = 0; m < b->nmembers && last; m++) {
            tvar_t *x = &t->vars[b->members[m]];
            x->info.startTime = b->start;
            x->info.endTime = end;
            if (res == gvqSuccess && !b->fused) x->info.wireBytes += ring_bytes(t, x->info.count);
        }
    } else {
        tvar_t *x = &t->vars[u->var];
        if (first) x->info.startTime = start;
        if (last) x->info.endTime = end;
        if (res == gvqSuccess) x->info.wireBytes += job_bytes(t, u, j);
    }
    pthread_mutex_unlock(&t->lock);
    return res;
}

/* ---- the pieces of a unit, for the negotiated schedule (trainer_plan.c) ---- */

/* The floats unit u's plain allreduce works on: its variable's gradient, or its bucket's buffer,
 * packed here (every member is ready). */
float *gvq_train_unit_data(gvqTrainer_t t, int unit) {
    const tunit_t *u = &t->units[unit];
    if (u->bucket < 0) return t->vars[u->var].grad;
    tbucket_t *b = &t->buckets[u->bucket];
    pack_bucket(t, b);
    return b->buf;
}

/* Unit u's plain allreduce is done: a bucket unpacked, bytes and times kept. */
void gvq_train_unit_finish(gvqTrainer_t t, int unit) {
    tunit_t *u = &t->units[unit];
    if (u->bucket >= 0) unpack_bucket(t, &t->buckets[u->bucket]);
    pthread_mutex_lock(&t->lock); /* gvqTrainGetVariableInfo may read beside this */
    if (u->bucket < 0) {
        tvar_t *x = &t->vars[u->var];
        x->info.wireBytes += ring_bytes(t, x->info.count);
        x->info.startTime = u->start;
        x->info.endTime = u->end;
    } else {
        tbucket_t *b = &t->buckets[u->bucket];
        b->start = u->start;
        b->end = u->end;
        for (int m = 0; m < b->nmembers; m++) {
            tvar_t *x = &t->vars[b->members[m]];
            x->info.wireBytes += ring_bytes(t, x->info.count);
            x->info.startTime = u->start;
            x->info.endTime = u->end;
        }
    }
    pthread_mutex_unlock(&t->lock);
}

/* Unit u whole, as one job of the ready schedule would run it (a compressed variable, the fused
 * group, factors). */
gvqResult_t gvq_train_unit_run(gvqTrainer_t t, int unit) {
    train_job_t j = {t, unit, 0, 0, t->units[unit].count};
    return train_job_run(&j);
}

/* Queue chunk c of unit u (or run it here when calls run inline). */
gvqResult_t gvq_train_issue(gvqTrainer_t t, int unit, int c) {
    const tunit_t *u = &t->units[unit];
    train_job_t *j = malloc(sizeof *j);
    if (j == NULL) {
        GVQ_WARN("gvqTrainGradReady: out of memory");
        if (t->issue_error == gvqSuccess) t->issue_error = gvqSystemError;
        return gvqSystemError;
    }
    *j = (train_job_t){t, unit, c, 0, 0};
    gvq_train_chunk_span(u, c, &j->off, &j->count);
    if (c == 0 && u->bucket >= 0 && !t->buckets[u->bucket].fused)
        pack_bucket(t, &t->buckets[u->bucket]); /* all its members are ready */
    gvqResult_t res;
    if (t->inline_calls) {
        res = train_job_run(j);
        free(j);
    } else {
        res =
            gvq_stream_enqueue(t->stream, "gvqTrainGradReady", &t->comm, 1, train_job_run, free, j);
    }
    if (res != gvqSuccess && t->issue_error == gvqSuccess) t->issue_error = res;
    return res;
}
