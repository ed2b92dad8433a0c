/*
 * pipeline.c -- pipeline model parallelism in the training layer (include/gvq_train.h): one
 * stage per rank of the pipeline communicator, the trainer's forward and backward of one
 * micro-batch, the schedule here.
 *
 *   create: check this stage's arguments -> allgather every stage's
 *           [refused | microBatches | schedule | inCount | outCount | flush | overlapped] ->
 *           the same verdict on every stage (agree_stages) -> the slots' buffers, and with
 *           overlapped transfers two streams, the slots' events and the communicators' roles
 *           agreed (agree_roles)
 *   step:   plan this step's task list (plan_tasks) -> the first inputs' receives, unless the
 *           last step made them -> each task: (overlapped: wait for its input) -> run it ->
 *           its output with the next task's input (move)
 *
 *   gvqPipeGpipe, stage k of S, one step (4 stages, 3 micro-batches: F forward, B backward):
 *
 *     stage 0   F0 F1 F2 .. .. .. .. .. .. B2 B1 B0
 *     stage 1   .. F0 F1 F2 .. .. .. .. B2 B1 B0 ..
 *     stage 2   .. .. F0 F1 F2 .. .. B2 B1 B0 .. ..
 *     stage 3   .. .. .. F0 F1 F2 B2 B1 B0 .. .. ..      (then every stage's gradients are the
 *                                                         mini-batch's: a flush, no staleness)
 *
 * (the task lists of every schedule, and how transfers go between tasks: above plan_tasks)
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "gvq_pipeline.h"

/* ---- the schedules as task lists -------------------------------------------------------------
 *
 *   One step of stage k is a list of tasks, F(g) a forward and B(g) a backward of micro-batch g
 *   (counted since creation; the step's are base .. base+M-1; slot g mod nslots):
 *
 *     gvqPipeGpipe:  F(base) .. F(base+M-1), then B(base+M-1) .. B(base)
 *     the others (w = min(S-k-1, M) forwards ahead):
 *       warm-up    F(base) .. F(base+w-1)          unless the last step left them made
 *       units      F(base+w+i), B(base+i)          i = 0 .. M-1 without a flush (the step's
 *                                                  last w forwards are the next step's first),
 *                                                  i = 0 .. M-w-1 with one
 *       cool-down  B(base+M-w) .. B(base+M-1)      with a flush only
 *
 *   Transfers between the tasks: after a task its output leaves with the receive of the next
 *   task's input (the next step's first task's, without a flush). Blocking: both in one group on
 *   the pipe's communicator (a stage never waits in a send its neighbour can only match after
 *   its own send). Overlapped: forwards on fstream (out(g) with in(next forward)), backwards on
 *   bstream (din(g) with dout(next backward)); a task first waits for its input's event.
 *
 *   PipeDream: F(g) keeps the weights it ran on in version slot g mod V (V = w + 1, at most M
 *   within a flushed step: the micro-batches between their forward and backward here); B(g)
 *   runs on that version, then the current weights come back and update(g) changes them.
 */

static int slot_of(const gvqPipe_t p, long long g) {
    return (int)(g % p->nslots);
}

/* This step's tasks (flushed: the step starts no forward of the next one). */
static int plan_tasks(gvqPipe_t p, int flushed) {
    struct pipe_task *t = p->tasks;
    int n = 0, M = p->micro;
    long long b = p->base;
    if (p->schedule == gvqPipeGpipe) {
        for (int m = 0; m < M; m++)
            t[n++] = (struct pipe_task){1, b + m};
        for (int m = M - 1; m >= 0; m--)
            t[n++] = (struct pipe_task){0, b + m};
        return n;
    }
    int w = gvq_pipe_warm_of(p), units = flushed ? M - w : M;
    if (p->warm == 0) p->wbase = b;
    for (int m = p->warm; m < w; m++)
        t[n++] = (struct pipe_task){1, b + m};
    for (int i = 0; i < units; i++) {
        t[n++] = (struct pipe_task){1, b + w + i};
        t[n++] = (struct pipe_task){0, b + i};
    }
    for (int i = units; i < M; i++)
        t[n++] = (struct pipe_task){0, b + i};
    return n;
}

static float *in_of(gvqPipe_t p, long long g) {
    return p->in_count ? p->in + (size_t)slot_of(p, g) * p->in_count : NULL;
}
static float *out_of(gvqPipe_t p, long long g) {
    return p->out_count ? p->out + (size_t)slot_of(p, g) * p->out_count : NULL;
}
static float *din_of(gvqPipe_t p, long long g) {
    return p->in_count ? p->din + (size_t)slot_of(p, g) * p->in_count : NULL;
}
static float *dout_of(gvqPipe_t p, long long g) {
    return p->out_count ? p->dout + (size_t)slot_of(p, g) * p->out_count : NULL;
}

/* A task's input (NULL: none on this stage) and output buffers, their counts and peers. */
static float *task_input(gvqPipe_t p, const struct pipe_task *t, size_t *count, int *peer) {
    *count = t->fwd ? p->in_count : p->out_count;
    *peer = t->fwd ? p->stage - 1 : p->stage + 1;
    return t->fwd ? in_of(p, t->g) : dout_of(p, t->g);
}
static float *task_output(gvqPipe_t p, const struct pipe_task *t, size_t *count, int *peer) {
    *count = t->fwd ? p->out_count : p->in_count;
    *peer = t->fwd ? p->stage + 1 : p->stage - 1;
    return t->fwd ? out_of(p, t->g) : din_of(p, t->g);
}

/* A send and a receive (either absent), together: one group on comm, queued on stream (NULL:
 * blocking). */
static gvqResult_t exchange(gvqComm_t comm, gvqStream_t stream, const float *send, size_t scount,
                            int speer, float *recv, size_t rcount, int rpeer) {
    if (send == NULL && recv == NULL) return gvqSuccess;
    GVQCHECK(gvqGroupStart());
    gvqResult_t a =
        send != NULL ? gvqSend(send, scount, gvqFloat32, speer, comm, stream) : gvqSuccess;
    gvqResult_t b =
        recv != NULL ? gvqRecv(recv, rcount, gvqFloat32, rpeer, comm, stream) : gvqSuccess;
    gvqResult_t c = gvqGroupEnd();
    return a != gvqSuccess ? a : b != gvqSuccess ? b : c;
}

enum { EV_IN, EV_OUT, EV_DOUT, EV_DIN };

static gvqEvent_t event_of(gvqPipe_t p, int kind, long long g) {
    return p->ev[kind * p->nslots + slot_of(p, g)];
}

/* After task `done` (NULL: before the step's first task), its output with the receive of
 * `next`'s input (NULL: none). Blocking: on the pipe's communicator. Overlapped: `next` is the
 * next task of direction fwd, the group goes on that direction's stream, and the events of the
 * slots involved mark it. */
static gvqResult_t move(gvqPipe_t p, int fwd, const struct pipe_task *done,
                        const struct pipe_task *next) {
    size_t sc = 0, rc = 0;
    int sp = 0, rp = 0;
    const float *send = done != NULL ? task_output(p, done, &sc, &sp) : NULL;
    float *recv = next != NULL ? task_input(p, next, &rc, &rp) : NULL;
    if (p->fcomm == NULL) return exchange(p->comm, NULL, send, sc, sp, recv, rc, rp);
    if (send == NULL && recv == NULL) return gvqSuccess;
    if (p->links) { /* each on its link's communicator and stream: peer 1 rightwards, 0 left */
        int si = fwd ? PIPE_F_SEND : PIPE_B_SEND, ri = fwd ? PIPE_F_RECV : PIPE_B_RECV;
        if (send != NULL) {
            GVQCHECK(gvqSend(send, sc, gvqFloat32, fwd, p->lcomm[si], p->lstream[si]));
            GVQCHECK(gvqEventRecord(event_of(p, fwd ? EV_OUT : EV_DIN, done->g), p->lstream[si]));
        }
        if (recv != NULL) {
            GVQCHECK(gvqRecv(recv, rc, gvqFloat32, !fwd, p->lcomm[ri], p->lstream[ri]));
            GVQCHECK(gvqEventRecord(event_of(p, fwd ? EV_IN : EV_DOUT, next->g), p->lstream[ri]));
        }
        return gvqSuccess;
    }
    gvqStream_t st = fwd ? p->fstream : p->bstream;
    GVQCHECK(exchange(fwd ? p->fcomm : p->bcomm, st, send, sc, sp, recv, rc, rp));
    if (send != NULL) GVQCHECK(gvqEventRecord(event_of(p, fwd ? EV_OUT : EV_DIN, done->g), st));
    if (recv != NULL) GVQCHECK(gvqEventRecord(event_of(p, fwd ? EV_IN : EV_DOUT, next->g), st));
    return gvqSuccess;
}

/* The next task of direction fwd (-1: either) after index i of the list (n tasks), or the next
 * step's first forward (without a flush: F(base+M+w)) in *spare; NULL when none. The next
 * step's first backward's input is not received ahead: its sender makes it only in the next
 * step, and an overlapped receive waiting across the gap between steps would count towards the
 * communicator's timeout (an evaluation or a checkpoint in between); first_inputs posts it. */
static const struct pipe_task *next_of(gvqPipe_t p, int i, int n, int fwd, int flushed,
                                       struct pipe_task *spare) {
    for (int j = i + 1; j < n; j++)
        if (p->tasks[j].fwd == fwd || fwd < 0) return &p->tasks[j];
    if (flushed || fwd == 0) return NULL;
    *spare = (struct pipe_task){1, p->base + p->micro + gvq_pipe_warm_of(p)};
    return spare;
}

/* ---- a task: the callbacks, PipeDream's versions, SpecTrain's prediction --------------------- */

static float *version_of(gvqPipe_t p, long long g) {
    return p->stash + (size_t)(g % p->nversions) * p->wtotal;
}

static void unpredict(gvqPipe_t p);

/* One pass: the weights aside (unless a prediction is already in place: then current holds
 * them) and W - s lr v in the ranges; s = 0 leaves (or puts back) the weights themselves. */
static void predict(gvqPipe_t p, int s) {
    if (s == 0) {
        unpredict(p);
        return;
    }
    size_t at = 0;
    float f = (float)s * p->lr;
    for (int r = 0; r < p->nw; r++) {
        float *w = p->wptr[r];
        if (!p->predicted) memcpy(p->current + at, w, sizeof(float) * p->wlen[r]);
        for (size_t i = 0; i < p->wlen[r]; i++)
            w[i] = p->current[at + i] - f * p->v[at + i];
        at += p->wlen[r];
    }
    p->predicted = 1;
}

/* The weights back in place of a prediction. */
static void unpredict(gvqPipe_t p) {
    if (p->predicted) gvq_pipe_copy_weights(p, p->current, 1);
    p->predicted = 0;
}

/* SpecTrain: v <- gamma v + (1 - gamma) g, g what the backward left in the gradient ranges. */
static void smooth_gradient(gvqPipe_t p) {
    size_t at = 0;
    for (int r = 0; r < p->nw; r++)
        for (size_t i = 0; i < p->wlen[r]; i++, at++)
            p->v[at] = p->gamma * p->v[at] + (1.0f - p->gamma) * p->gptr[r][i];
}

/* ---- the RMSE of stale and predicted weights (gvqPipeGetStats) ------------------------------ */

static double rms_diff(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return n ? sqrt(s / (double)n) : 0;
}

/* A task at version distance s: p->current holds the weights in place before any prediction,
 * the ranges what the task runs on. Kept until the stage has made s more updates (a task whose
 * slot is not free is not measured). */
static void record_task(gvqPipe_t p, int s) {
    for (int i = 0; i < p->nrecs && s > 0; i++) {
        struct pipe_rec *r = &p->recs[i];
        if (r->target != 0) continue;
        r->target = p->updates + s;
        memcpy(r->stale, p->current, sizeof(float) * p->wtotal);
        if (p->schedule == gvqPipeSpectrain) gvq_pipe_copy_weights(p, r->pred, 0);
        return;
    }
}

/* After an update: the tasks whose target it was, compared with the weights now. */
static void measure_tasks(gvqPipe_t p) {
    float *now = p->current; /* the ranges hold the new weights; current is free here */
    gvq_pipe_copy_weights(p, now, 0);
    p->sum_step += rms_diff(now, p->prev, p->wtotal);
    p->steps_rms++;
    memcpy(p->prev, now, sizeof(float) * p->wtotal);
    for (int i = 0; i < p->nrecs; i++) {
        struct pipe_rec *r = &p->recs[i];
        if (r->target != p->updates) continue;
        p->sum_stale += rms_diff(r->stale, now, p->wtotal);
        if (p->schedule == gvqPipeSpectrain) p->sum_pred += rms_diff(r->pred, now, p->wtotal);
        p->samples++;
        r->target = 0;
    }
}

static gvqResult_t pd_update(gvqPipe_t p, int m) {
    GVQCHECK(p->update(p->user, m));
    p->updates++;
    if (p->recs != NULL) measure_tasks(p);
    return gvqSuccess;
}

/* SpecTrain's version distance of micro-batch g's forward (fwd) or backward at this stage. */
static int distance(const gvqPipe_t p, long long g, int fwd) {
    int S = p->nstages, k = p->stage, w = gvq_pipe_warm_of(p);
    if (p->predict_distance == gvqPredictPaper) return fwd ? 2 * S - k - 2 : k;
    long long since = g - p->wbase; /* the updates between F(g) and B(g) */
    return fwd ? (int)(since < w ? since : w) : 0;
}

/* The weights in place before any prediction, in p->current (the RMSE's stale weights). */
static void keep_current(gvqPipe_t p) {
    if (!p->predicted) gvq_pipe_copy_weights(p, p->current, 0);
}

/* A SpecTrain prediction stays in place from a forward to the next task (a backward's own, or
 * the next forward's, replaces it in one pass); the weights come back before every update. */
static gvqResult_t pd_forward(gvqPipe_t p, long long g) {
    int v = (int)(g % p->nversions);
    if (p->schedule == gvqPipePipedream) { /* this version, and when it was taken */
        gvq_pipe_copy_weights(p, version_of(p, g), 0);
        p->version_at[v] = p->updates;
    }
    int s = distance(p, g, 1);
    if (p->schedule == gvqPipeSpectrain) predict(p, s);
    if (p->recs != NULL && s > 0) keep_current(p), record_task(p, s);
    return p->forward(p->user, slot_of(p, g), in_of(p, g), out_of(p, g));
}

static gvqResult_t pd_backward(gvqPipe_t p, long long g) {
    int v = (int)(g % p->nversions), swapped = 0;
    if (p->schedule == gvqPipePipedream && p->version_at[v] != p->updates) {
        gvq_pipe_copy_weights(p, p->current, 0); /* the current weights aside, g's version in */
        gvq_pipe_copy_weights(p, version_of(p, g), 1);
        swapped = 1;
    }
    int s = distance(p, g, 0);
    if (p->schedule == gvqPipeSpectrain) predict(p, s);
    if (p->recs != NULL && s > 0) keep_current(p), record_task(p, s);
    gvqResult_t res = p->backward(p->user, slot_of(p, g), dout_of(p, g), din_of(p, g));
    if (swapped) gvq_pipe_copy_weights(p, p->current, 1);
    unpredict(p);
    if (res != gvqSuccess) return res;
    if (p->schedule == gvqPipeSpectrain) smooth_gradient(p);
    return pd_update(p, slot_of(p, g));
}

static gvqResult_t run_task(gvqPipe_t p, const struct pipe_task *t) {
    int s = slot_of(p, t->g);
    if (p->schedule == gvqPipeGpipe)
        return t->fwd ? p->forward(p->user, s, in_of(p, t->g), out_of(p, t->g))
                      : p->backward(p->user, s, dout_of(p, t->g), din_of(p, t->g));
    return t->fwd ? pd_forward(p, t->g) : pd_backward(p, t->g);
}

/* Overlapped: a task's input has arrived and its output slot's last send has left. */
static gvqResult_t wait_slots(gvqPipe_t p, const struct pipe_task *t) {
    size_t c = 0;
    int peer = 0;
    if (task_input(p, t, &c, &peer) != NULL)
        GVQCHECK(gvqEventSynchronize(event_of(p, t->fwd ? EV_IN : EV_DOUT, t->g)));
    if (task_output(p, t, &c, &peer) != NULL)
        GVQCHECK(gvqEventSynchronize(event_of(p, t->fwd ? EV_OUT : EV_DIN, t->g)));
    return gvqSuccess;
}

/* The receive of the step's first task's input (blocking), or of its first forward's and first
 * backward's (overlapped), unless the last step already made it. */
static gvqResult_t first_inputs(gvqPipe_t p, int n) {
    for (int fwd = 1; fwd >= 0; fwd--) {
        const struct pipe_task *t = NULL;
        for (int j = 0; j < n && t == NULL; j++)
            if (p->tasks[j].fwd == fwd) t = &p->tasks[j];
        if (p->fcomm == NULL && t != &p->tasks[0]) continue;
        if (t == NULL || t->g == (fwd ? p->pre_fwd : p->pre_bwd)) continue;
        GVQCHECK(move(p, fwd, NULL, t));
    }
    return gvqSuccess;
}

static gvqResult_t run_step(gvqPipe_t p, int flushed) {
    flushed |= p->flush || p->schedule == gvqPipeGpipe;
    int n = plan_tasks(p, flushed), overlap = p->fcomm != NULL;
    GVQCHECK(first_inputs(p, n));
    p->pre_fwd = p->pre_bwd = -1;
    for (int i = 0; i < n; i++) {
        const struct pipe_task *t = &p->tasks[i];
        if (overlap) GVQCHECK(wait_slots(p, t));
        GVQCHECK(run_task(p, t));
        struct pipe_task spare;
        const struct pipe_task *next = next_of(p, i, n, overlap ? t->fwd : -1, flushed, &spare);
        GVQCHECK(move(p, t->fwd, t, next));
        if (next == &spare) *(spare.fwd ? &p->pre_fwd : &p->pre_bwd) = spare.g;
    }
    if (overlap && flushed) { /* the step's last sends */
        GVQCHECK(gvqStreamSynchronize(p->fstream));
        GVQCHECK(gvqStreamSynchronize(p->bstream));
        for (int l = 0; l < 4; l++)
            if (p->lstream[l] != NULL) GVQCHECK(gvqStreamSynchronize(p->lstream[l]));
    }
    p->base += p->micro;
    p->warm = flushed ? 0 : gvq_pipe_warm_of(p);
    return gvqSuccess;
}

/* A step that fails leaves transfers half done between the stages: the pipe refuses later
 * steps (destroy it; gvqCommAbort frees neighbours still waiting). */
static gvqResult_t pipe_step(const char *fn, gvqPipe_t p, int flushed) {
    GVQCHECK(gvq_pipe_check(fn, p));
    if (p->failed != gvqSuccess) {
        GVQ_WARN("%s: an earlier step failed (%s); destroy this pipe", fn,
                 gvqGetErrorString(p->failed));
        return gvqInvalidUsage;
    }
    gvqResult_t res = run_step(p, flushed);
    if (res != gvqSuccess) {
        unpredict(p); /* the caller's weights are its own again (a checkpoint after the error) */
        for (int l = 0; l < 4; l++) /* the link communicators are the pipe's: their neighbours
                                       learn of the failure now, not at their timeout */
            if (p->lcomm[l] != NULL) (void)gvqCommAbort(p->lcomm[l]);
        p->failed = res;
        return res;
    }
    p->steps++;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqPipeStep(gvqPipe_t p) {
    return pipe_step("gvqPipeStep", p, 0);
}

GVQ_API gvqResult_t gvqPipeStepFlush(gvqPipe_t p) {
    return pipe_step("gvqPipeStepFlush", p, 1);
}

GVQ_API gvqResult_t gvqPipeSetLearningRate(gvqPipe_t p, float lr) {
    GVQCHECK(gvq_pipe_check("gvqPipeSetLearningRate", p));
    if (!isfinite(lr)) {
        GVQ_WARN("gvqPipeSetLearningRate: lr %g is not finite", (double)lr);
        return gvqInvalidArgument;
    }
    p->lr = lr;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqPipeGetStats(gvqPipe_t p, gvqPipeStats_t *stats) {
    GVQCHECK(gvq_pipe_check("gvqPipeGetStats", p));
    if (stats == NULL) {
        GVQ_WARN("gvqPipeGetStats: stats is NULL");
        return gvqInvalidArgument;
    }
    double n = p->samples ? (double)p->samples : 1;
    *stats = (gvqPipeStats_t){
        p->steps,         p->updates,      p->samples,
        p->sum_stale / n, p->sum_pred / n, p->steps_rms ? p->sum_step / (double)p->steps_rms : 0};
    return gvqSuccess;
}
