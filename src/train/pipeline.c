/*
 * pipeline.c -- pipeline model parallelism in the training layer (include/gvq_train.h): one
 * stage per rank of the pipeline communicator, the trainer's forward and backward of one
 * micro-batch, the schedule here.
 *
 *   create: check this stage's arguments -> allgather every stage's
 *           [refused | microBatches | schedule | inCount | outCount] -> the same verdict on
 *           every stage (agree_stages) -> the micro-batches' buffers
 *
 *   gvqPipeGpipe, stage k of S, one step (4 stages, 3 micro-batches: F forward, B backward):
 *
 *     stage 0   F0 F1 F2 .. .. .. .. .. .. B2 B1 B0
 *     stage 1   .. F0 F1 F2 .. .. .. .. B2 B1 B0 ..
 *     stage 2   .. .. F0 F1 F2 .. .. B2 B1 B0 .. ..
 *     stage 3   .. .. .. F0 F1 F2 B2 B1 B0 .. .. ..      (then every stage's gradients are the
 *                                                         mini-batch's: a flush, no staleness)
 *
 * Transfers are blocking gvqSend/gvqRecv between neighbours: within a phase the data flows one
 * way along the chain, so every send meets a receive its neighbour is already waiting in.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gvq_handles.h"
#include "gvq_trainer.h"

#define PIPE_MAGIC 0x67767050u

struct gvqPipe {
    uint32_t magic;
    gvqComm_t comm;
    int stage, nstages, micro, schedule;
    size_t in_count, out_count;
    gvqPipeForwardFn_t forward;
    gvqPipeBackwardFn_t backward;
    void *user;
    float *in, *out; /* micro x in_count, micro x out_count */
    float *din, *dout;
    long long steps;
    gvqResult_t failed; /* a step that failed: later steps are refused */
    /* gvqPipePipedream: the weights (copied range list), their versions and the update */
    int nw;
    float **wptr;
    size_t *wlen, wtotal;
    int nversions;
    float *stash, *current; /* nversions x wtotal, wtotal */
    gvqResult_t (*update)(void *user, int micro);
    /* gvqPipeSpectrain: the gradient ranges, the smoothed gradient v, gamma and lr */
    float **gptr;
    float *v;
    float gamma, lr;
    int predict_distance; /* gvqPipePredictDistance_t */
    /* DualPipe and SpecTrain: tasks waiting for the weights of their target version */
    struct pipe_rec {
        long long target; /* the update count whose weights it is compared with; 0: free */
        float *stale, *pred;
    } * recs;
    int nrecs;
    float *prev; /* the weights before the last update */
    long long updates, samples, steps_rms;
    double sum_stale, sum_pred, sum_step;
};

static gvq_handles_t live = GVQ_HANDLES_INITIALIZER;

static void copy_weights(gvqPipe_t p, float *buf, int to_ranges);

enum { R_REFUSED, R_MICRO, R_SCHEDULE, R_IN, R_OUT, R_N };

/* This stage's own arguments; a WARN names what is wrong. */
static gvqResult_t check_own(const gvqPipeConfig_t *c, gvqPipeForwardFn_t fwd,
                             gvqPipeBackwardFn_t bwd, int *micro, int *schedule) {
    const char *fn = "gvqPipeCreate";
    *micro = c->microBatches == GVQ_CONFIG_UNDEF_INT ? 1 : c->microBatches;
    *schedule = c->schedule == GVQ_CONFIG_UNDEF_INT ? gvqPipeGpipe : c->schedule;
    if (fwd == NULL || bwd == NULL) {
        GVQ_WARN("%s: forward or backward is NULL", fn);
        return gvqInvalidArgument;
    }
    if (*micro < 1) {
        GVQ_WARN("%s: microBatches %d must be at least 1", fn, *micro);
        return gvqInvalidArgument;
    }
    if (*schedule < gvqPipeGpipe || *schedule > gvqPipeSpectrain) {
        GVQ_WARN("%s: schedule %d is not a gvqPipeSchedule_t", fn, *schedule);
        return gvqInvalidArgument;
    }
    if (*schedule == gvqPipeSpectrain &&
        ((c->weightRanges > 0 && c->gradients == NULL) ||
         (c->smoothing != -1.0f && !(c->smoothing >= 0 && c->smoothing < 1)))) {
        GVQ_WARN("%s: gvqPipeSpectrain needs the gradient ranges and a smoothing in [0, 1) "
                 "(gradients %p, smoothing %g)",
                 fn, (const void *)c->gradients, (double)c->smoothing);
        return gvqInvalidArgument;
    }
    if (c->predictDistance != GVQ_CONFIG_UNDEF_INT && c->predictDistance != gvqPredictPaper &&
        c->predictDistance != gvqPredictSchedule) {
        GVQ_WARN("%s: predictDistance %d is not a gvqPipePredictDistance_t", fn,
                 c->predictDistance);
        return gvqInvalidArgument;
    }
    if (*schedule != gvqPipeGpipe &&
        (c->update == NULL || c->weightRanges < 0 ||
         (c->weightRanges > 0 && (c->weights == NULL || c->weightCounts == NULL)))) {
        GVQ_WARN("%s: gvqPipePipedream needs update and the weights (weightRanges %d, weights %p, "
                 "weightCounts %p, update %s)",
                 fn, c->weightRanges, (void *)c->weights, (const void *)c->weightCounts,
                 c->update == NULL ? "NULL" : "set");
        return gvqInvalidArgument;
    }
    size_t total = 0;
    for (int r = 0; *schedule != gvqPipeGpipe && r < c->weightRanges; r++) {
        if (c->weights[r] == NULL || c->weightCounts[r] > ((size_t)1 << 40) - total ||
            (*schedule == gvqPipeSpectrain && c->gradients[r] == NULL)) {
            GVQ_WARN("%s: weight range %d is NULL or the weights pass 2^40 floats", fn, r);
            return gvqInvalidArgument;
        }
        total += c->weightCounts[r];
    }
    size_t most = c->inCount > c->outCount ? c->inCount : c->outCount;
    if (most > ((size_t)1 << 40) / (size_t)*micro) { /* M buffers of each: no overflow */
        GVQ_WARN("%s: %d micro-batches of inCount %zu / outCount %zu floats: more than 2^40", fn,
                 *micro, c->inCount, c->outCount);
        return gvqInvalidArgument;
    }
    return gvqSuccess;
}

/* The verdict on the gathered rows, the same on every stage. */
static gvqResult_t agree_stages(const int64_t *rows, int S, int me) {
    const char *fn = "gvqPipeCreate";
    for (int k = 0; k < S; k++)
        if (rows[k * R_N + R_REFUSED] != 0) {
            if (k != me) GVQ_WARN("%s: stage %d refused its own arguments", fn, k);
            return gvqInvalidArgument;
        }
    for (int k = 1; k < S; k++)
        if (rows[k * R_N + R_MICRO] != rows[R_MICRO] ||
            rows[k * R_N + R_SCHEDULE] != rows[R_SCHEDULE]) {
            GVQ_WARN("%s: stage 0 has microBatches %lld, schedule %lld; stage %d %lld, %lld (must "
                     "be equal on every stage)",
                     fn, (long long)rows[R_MICRO], (long long)rows[R_SCHEDULE], k,
                     (long long)rows[k * R_N + R_MICRO], (long long)rows[k * R_N + R_SCHEDULE]);
            return gvqInvalidArgument;
        }
    if (rows[R_IN] != 0 || rows[(S - 1) * R_N + R_OUT] != 0) {
        GVQ_WARN("%s: stage 0 has inCount %lld and the last stage (%d) outCount %lld: both must "
                 "be 0",
                 fn, (long long)rows[R_IN], S - 1, (long long)rows[(S - 1) * R_N + R_OUT]);
        return gvqInvalidArgument;
    }
    for (int k = 0; k + 1 < S; k++) {
        int64_t out = rows[k * R_N + R_OUT], in = rows[(k + 1) * R_N + R_IN];
        if (out == 0 || out != in) {
            GVQ_WARN("%s: stage %d sends %lld floats a micro-batch (outCount) but stage %d "
                     "expects %lld (inCount)%s",
                     fn, k, (long long)out, k + 1, (long long)in,
                     out == 0 ? "; only the last stage has no output" : "");
            return gvqInvalidArgument;
        }
    }
    return gvqSuccess;
}

static void pipe_free(gvqPipe_t p) {
    if (p == NULL) return;
    p->magic = 0;
    free(p->in), free(p->out), free(p->din), free(p->dout);
    free(p->wptr), free(p->wlen), free(p->stash), free(p->current);
    free(p->gptr), free(p->v);
    for (int i = 0; p->recs != NULL && i < p->nrecs; i++)
        free(p->recs[i].stale);
    free(p->recs), free(p->prev);
    free(p);
}

/* GVQ_PIPE_RMSE=1 with DualPipe or SpecTrain: room for the tasks in flight between a version and
 * its target (at most two a micro-batch over 2S updates), each with its weights (and prediction),
 * and the weights before the last update. */
static gvqResult_t alloc_records(gvqPipe_t p) {
    if ((p->schedule != gvqPipeDualpipe && p->schedule != gvqPipeSpectrain) ||
        !gvq_param(GVQ_PARAM_PIPE_RMSE))
        return gvqSuccess;
    p->nrecs = 4 * p->nstages + 4;
    size_t per = p->schedule == gvqPipeSpectrain ? 2 : 1;
    p->recs = calloc((size_t)p->nrecs, sizeof *p->recs);
    p->prev = malloc(sizeof(float) * (p->wtotal + 1));
    if (p->recs == NULL || p->prev == NULL) goto oom;
    for (int i = 0; i < p->nrecs; i++) {
        if ((p->recs[i].stale = malloc(sizeof(float) * (p->wtotal * per + 1))) == NULL) goto oom;
        p->recs[i].pred = p->recs[i].stale + p->wtotal;
    }
    copy_weights(p, p->prev, 0);
    return gvqSuccess;
oom:
    GVQ_WARN("gvqPipeCreate: GVQ_PIPE_RMSE: cannot keep %d weight copies of %zu floats", p->nrecs,
             p->wtotal);
    return gvqSystemError;
}

/* PipeDream's weights: the range list (the caller's arrays may be temporaries) and room for
 * the versions in flight at this stage, min(S - k, M), and the current weights. */
static gvqResult_t alloc_versions(gvqPipe_t p, const gvqPipeConfig_t *c) {
    p->update = c->update;
    p->nw = c->weightRanges;
    int warm = p->nstages - p->stage - 1 < p->micro ? p->nstages - p->stage - 1 : p->micro;
    p->nversions = warm + 1 < p->micro ? warm + 1 : p->micro;
    p->wptr = calloc((size_t)p->nw + 1, sizeof *p->wptr);
    p->wlen = calloc((size_t)p->nw + 1, sizeof *p->wlen);
    if (p->wptr == NULL || p->wlen == NULL) return gvqSystemError;
    for (int r = 0; r < p->nw; r++) {
        p->wptr[r] = c->weights[r];
        p->wlen[r] = c->weightCounts[r];
        p->wtotal += c->weightCounts[r];
    }
    if (p->wtotal > ((size_t)1 << 40) / (size_t)p->nversions) {
        GVQ_WARN("gvqPipeCreate: %d weight versions of %zu floats: more than 2^40", p->nversions,
                 p->wtotal);
        return gvqInvalidArgument;
    }
    p->predict_distance = /* SpecTrain's, and DualPipe's measured distances (GVQ_PIPE_RMSE) */
        c->predictDistance == GVQ_CONFIG_UNDEF_INT ? gvqPredictPaper : c->predictDistance;
    if (p->schedule == gvqPipeSpectrain) {
        p->gamma = c->smoothing == -1.0f ? 0.9f : c->smoothing;
        p->gptr = calloc((size_t)p->nw + 1, sizeof *p->gptr);
        p->v = calloc(p->wtotal + 1, sizeof(float));
        if (p->gptr == NULL || p->v == NULL) return gvqSystemError;
        for (int r = 0; r < p->nw; r++)
            p->gptr[r] = c->gradients[r];
    }
    size_t versions = p->schedule == gvqPipePipedream ? (size_t)p->nversions : 0;
    p->stash = malloc(sizeof(float) * (p->wtotal * versions + 1));
    p->current = malloc(sizeof(float) * (p->wtotal + 1));
    if (p->stash == NULL || p->current == NULL) {
        GVQ_WARN("gvqPipeCreate: cannot allocate %d weight versions of %zu floats", p->nversions,
                 p->wtotal);
        return gvqSystemError;
    }
    return alloc_records(p);
}

/* in/out for every micro-batch, and one din/dout reused by the backward pass. */
static gvqResult_t alloc_buffers(gvqPipe_t p) {
    size_t M = (size_t)p->micro;
    p->in = p->in_count ? malloc(sizeof(float) * M * p->in_count) : NULL;
    p->din = p->in_count ? malloc(sizeof(float) * p->in_count) : NULL;
    p->out = p->out_count ? malloc(sizeof(float) * M * p->out_count) : NULL;
    p->dout = p->out_count ? malloc(sizeof(float) * p->out_count) : NULL;
    if ((p->in_count && (p->in == NULL || p->din == NULL)) ||
        (p->out_count && (p->out == NULL || p->dout == NULL))) {
        GVQ_WARN("gvqPipeCreate: cannot allocate %d micro-batches of %zu + %zu floats", p->micro,
                 p->in_count, p->out_count);
        return gvqSystemError;
    }
    return gvqSuccess;
}

static const char *schedule_name(int s) {
    static const char *const names[] = {"gpipe", "pipedream", "dualpipe", "spectrain"};
    return s >= 0 && s <= gvqPipeSpectrain ? names[s] : "?";
}

/* This stage, made and registered before the agreement (so that a failure here is this stage's
 * refusal, which every stage learns), or NULL with *res set. */
static gvqPipe_t make_stage(gvqComm_t comm, const gvqPipeConfig_t *config, int micro, int schedule,
                            int me, int S, gvqPipeForwardFn_t forward, gvqPipeBackwardFn_t backward,
                            void *user, gvqResult_t *res) {
    gvqPipe_t p = calloc(1, sizeof *p);
    if (p == NULL) {
        *res = gvqSystemError;
        return NULL;
    }
    *p = (struct gvqPipe){.magic = PIPE_MAGIC,
                          .comm = comm,
                          .stage = me,
                          .nstages = S,
                          .micro = micro,
                          .schedule = schedule,
                          .in_count = config->inCount,
                          .out_count = config->outCount,
                          .forward = forward,
                          .backward = backward,
                          .user = user};
    *res = alloc_buffers(p);
    if (*res == gvqSuccess && schedule != gvqPipeGpipe) *res = alloc_versions(p, config);
    if (*res == gvqSuccess) *res = gvq_handles_add(&live, p);
    if (*res == gvqSuccess) return p;
    pipe_free(p);
    return NULL;
}

GVQ_API gvqResult_t gvqPipeCreate(gvqComm_t comm, const gvqPipeConfig_t *config,
                                  gvqPipeForwardFn_t forward, gvqPipeBackwardFn_t backward,
                                  void *user, gvqPipe_t *pipe) {
    const char *fn = "gvqPipeCreate";
    GVQCHECK(gvq_comm_check(comm, fn, 1)); /* without a communicator nobody can be told */
    int micro = 0, schedule = 0, S = 0, me = 0;
    GVQCHECK(gvqCommCount(comm, &S));
    GVQCHECK(gvqCommUserRank(comm, &me));
    /* this stage's own refusal still takes part in the agreement, so the others fail too */
    gvqResult_t own = gvqSuccess;
    if (pipe == NULL || config == NULL) {
        GVQ_WARN("%s: %s is NULL", fn, pipe == NULL ? "pipe" : "config");
        own = gvqInvalidArgument;
    } else {
        *pipe = NULL;
        own = gvq_config_header_check(fn, "config", config->size, config->magic, config->version,
                                      GVQ_PIPE_CONFIG_MAGIC, sizeof *config, sizeof *config,
                                      "GVQ_PIPE_CONFIG_INITIALIZER");
    }
    if (own == gvqSuccess) own = check_own(config, forward, backward, &micro, &schedule);
    gvqPipe_t p = NULL;
    if (own == gvqSuccess)
        p = make_stage(comm, config, micro, schedule, me, S, forward, backward, user, &own);
    int64_t row[R_N] = {own != gvqSuccess, micro, schedule,
                        own == gvqSuccess ? (int64_t)config->inCount : 0,
                        own == gvqSuccess ? (int64_t)config->outCount : 0};
    int64_t *rows = malloc(sizeof(int64_t) * R_N * (size_t)S); /* S rows of 40 bytes */
    gvqResult_t res = rows == NULL ? gvqSystemError : gvqSuccess;
    if (rows != NULL) res = gvqAllGather(row, rows, R_N, gvqInt64, comm, NULL);
    if (res == gvqSuccess) res = agree_stages(rows, S, me);
    free(rows);
    if (own != gvqSuccess || res != gvqSuccess) {
        if (p != NULL) {
            gvq_handles_remove(&live, p);
            pipe_free(p);
        }
        return own != gvqSuccess ? own : res;
    }
    GVQ_INFO("%s: stage %d of %d, %d micro-batches, schedule %s, in %zu out %zu floats", fn, me, S,
             micro, schedule_name(schedule), config->inCount, config->outCount);
    *pipe = p;
    return gvqSuccess;
}

static gvqResult_t pipe_check(const char *fn, gvqPipe_t p) {
    if (!gvq_handles_live(&live, p)) {
        GVQ_WARN("%s: pipe %p is %s", fn, (void *)p,
                 p == NULL ? "NULL" : "not a live pipeline stage (destroyed?)");
        return gvqInvalidArgument;
    }
    return gvq_comm_check(p->comm, fn, 1);
}

/* ---- gvqPipeGpipe: all forwards, then all backwards --------------------------------------- */

static gvqResult_t gpipe_forward(gvqPipe_t p, int m) {
    float *in = p->in_count ? p->in + (size_t)m * p->in_count : NULL;
    float *out = p->out_count ? p->out + (size_t)m * p->out_count : NULL;
    if (in != NULL) GVQCHECK(gvqRecv(in, p->in_count, gvqFloat32, p->stage - 1, p->comm, NULL));
    GVQCHECK(p->forward(p->user, m, in, out));
    if (out != NULL) GVQCHECK(gvqSend(out, p->out_count, gvqFloat32, p->stage + 1, p->comm, NULL));
    return gvqSuccess;
}

static gvqResult_t gpipe_backward(gvqPipe_t p, int m) {
    if (p->dout != NULL)
        GVQCHECK(gvqRecv(p->dout, p->out_count, gvqFloat32, p->stage + 1, p->comm, NULL));
    GVQCHECK(p->backward(p->user, m, p->dout, p->din));
    if (p->din != NULL)
        GVQCHECK(gvqSend(p->din, p->in_count, gvqFloat32, p->stage - 1, p->comm, NULL));
    return gvqSuccess;
}

/* ---- gvqPipePipedream: one forward, one backward, weight stashing ---------------------------
 *
 *   stage k, w = min(S - k - 1, M):   F(0) .. F(w-1)        each: receive, forward, send
 *                                     F(w+i), B(i)          i = 0 .. M-w-1: the forward's send
 *                                                           goes with the backward's receive, the
 *                                                           backward's send with the next
 *                                                           forward's receive (one group each)
 *                                     B(M-w) .. B(M-1)      each: receive, backward, send
 *   F(m) keeps the weights it ran on in version slot m mod V (V = min(w + 1, M): at most w + 1
 *   micro-batches are between their forward and backward here); B(m) runs on that version, then
 *   the current weights come back and update(m) changes them.
 */

static void copy_weights(gvqPipe_t p, float *buf, int to_ranges) {
    size_t at = 0;
    for (int r = 0; r < p->nw; r++) {
        if (to_ranges)
            memcpy(p->wptr[r], buf + at, sizeof(float) * p->wlen[r]);
        else
            memcpy(buf + at, p->wptr[r], sizeof(float) * p->wlen[r]);
        at += p->wlen[r];
    }
}

static float *version_of(gvqPipe_t p, int m) {
    return p->stash + (size_t)(m % p->nversions) * p->wtotal;
}

static float *in_of(gvqPipe_t p, int m) {
    return p->in_count ? p->in + (size_t)m * p->in_count : NULL;
}

static float *out_of(gvqPipe_t p, int m) {
    return p->out_count ? p->out + (size_t)m * p->out_count : NULL;
}

/* The transfers of one time unit, posted together; either may be absent (an end stage). */
static gvqResult_t exchange(gvqPipe_t p, const float *send, size_t scount, int speer, float *recv,
                            size_t rcount, int rpeer) {
    if (send == NULL && recv == NULL) return gvqSuccess;
    if (send == NULL) return gvqRecv(recv, rcount, gvqFloat32, rpeer, p->comm, NULL);
    if (recv == NULL) return gvqSend(send, scount, gvqFloat32, speer, p->comm, NULL);
    GVQCHECK(gvqGroupStart());
    gvqResult_t a = gvqSend(send, scount, gvqFloat32, speer, p->comm, NULL);
    gvqResult_t b = gvqRecv(recv, rcount, gvqFloat32, rpeer, p->comm, NULL);
    gvqResult_t c = gvqGroupEnd();
    return a != gvqSuccess ? a : b != gvqSuccess ? b : c;
}

/* SpecTrain: the current weights aside, then W - s lr v in their place. */
static void predict(gvqPipe_t p, int s) {
    copy_weights(p, p->current, 0);
    size_t at = 0;
    float f = (float)s * p->lr;
    for (int r = 0; r < p->nw; r++)
        for (size_t i = 0; i < p->wlen[r]; i++, at++)
            p->wptr[r][i] = p->current[at] - f * p->v[at];
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
        if (p->schedule == gvqPipeSpectrain) copy_weights(p, r->pred, 0);
        return;
    }
}

/* After an update: the tasks whose target it was, compared with the weights now. */
static void measure_tasks(gvqPipe_t p) {
    float *now = p->current; /* the ranges hold the new weights; current is free here */
    copy_weights(p, now, 0);
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

/* SpecTrain's version distance of micro-batch m's forward (fwd) or backward at this stage. */
static int distance(const gvqPipe_t p, int m, int fwd) {
    int S = p->nstages, k = p->stage;
    if (p->predict_distance == gvqPredictPaper) return fwd ? 2 * S - k - 2 : k;
    int w = S - k - 1 < p->micro ? S - k - 1 : p->micro;
    return fwd ? (m < w ? m : w) : 0;
}

static gvqResult_t pd_forward(gvqPipe_t p, int m) {
    if (p->schedule == gvqPipePipedream) copy_weights(p, version_of(p, m), 0);
    if (p->schedule == gvqPipeSpectrain) predict(p, distance(p, m, 1));
    if (p->schedule == gvqPipeDualpipe && p->recs != NULL) copy_weights(p, p->current, 0);
    if (p->recs != NULL) record_task(p, distance(p, m, 1));
    gvqResult_t res = p->forward(p->user, m, in_of(p, m), out_of(p, m));
    if (p->schedule == gvqPipeSpectrain) copy_weights(p, p->current, 1);
    return res;
}

static gvqResult_t pd_backward(gvqPipe_t p, int m) {
    if (p->schedule == gvqPipePipedream) { /* the current weights aside, m's version in */
        copy_weights(p, p->current, 0);
        copy_weights(p, version_of(p, m), 1);
    }
    if (p->schedule == gvqPipeSpectrain) predict(p, distance(p, m, 0));
    if (p->schedule == gvqPipeDualpipe && p->recs != NULL) copy_weights(p, p->current, 0);
    if (p->recs != NULL) record_task(p, distance(p, m, 0));
    gvqResult_t res = p->backward(p->user, m, p->dout, p->din);
    if (p->schedule != gvqPipeDualpipe) copy_weights(p, p->current, 1);
    if (res != gvqSuccess) return res;
    if (p->schedule == gvqPipeSpectrain) smooth_gradient(p);
    return pd_update(p, m);
}

static gvqResult_t pipedream_step(gvqPipe_t p) {
    int k = p->stage, S = p->nstages, M = p->micro, prev = k - 1, next = k + 1;
    int w = S - k - 1 < M ? S - k - 1 : M;
    for (int m = 0; m < w; m++) {
        GVQCHECK(exchange(p, NULL, 0, 0, in_of(p, m), p->in_count, prev));
        GVQCHECK(pd_forward(p, m));
        GVQCHECK(exchange(p, out_of(p, m), p->out_count, next, NULL, 0, 0));
    }
    if (w < M) GVQCHECK(exchange(p, NULL, 0, 0, in_of(p, w), p->in_count, prev));
    for (int i = 0; i < M - w; i++) {
        int m = w + i, last = i + 1 == M - w;
        GVQCHECK(pd_forward(p, m));
        GVQCHECK(exchange(p, out_of(p, m), p->out_count, next, p->dout, p->out_count, next));
        GVQCHECK(pd_backward(p, i));
        GVQCHECK(exchange(p, p->din, p->in_count, prev, last ? NULL : in_of(p, m + 1), p->in_count,
                          prev));
    }
    for (int i = M - w; i < M; i++) {
        GVQCHECK(exchange(p, NULL, 0, 0, p->dout, p->out_count, next));
        GVQCHECK(pd_backward(p, i));
        GVQCHECK(exchange(p, p->din, p->in_count, prev, NULL, 0, 0));
    }
    return gvqSuccess;
}

/* A step that fails leaves transfers half done between the stages: the pipe refuses later
 * steps (destroy it; gvqCommAbort frees neighbours still waiting). */
GVQ_API gvqResult_t gvqPipeStep(gvqPipe_t p) {
    GVQCHECK(pipe_check("gvqPipeStep", p));
    if (p->failed != gvqSuccess) {
        GVQ_WARN("gvqPipeStep: an earlier step failed (%s); destroy this pipe",
                 gvqGetErrorString(p->failed));
        return gvqInvalidUsage;
    }
    gvqResult_t res = gvqSuccess;
    if (p->schedule != gvqPipeGpipe) res = pipedream_step(p);
    for (int m = 0; p->schedule == gvqPipeGpipe && m < p->micro && res == gvqSuccess; m++)
        res = gpipe_forward(p, m);
    for (int m = p->micro - 1; p->schedule == gvqPipeGpipe && m >= 0 && res == gvqSuccess; m--)
        res = gpipe_backward(p, m);
    if (res != gvqSuccess) {
        p->failed = res;
        return res;
    }
    p->steps++;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqPipeSetLearningRate(gvqPipe_t p, float lr) {
    GVQCHECK(pipe_check("gvqPipeSetLearningRate", p));
    if (!isfinite(lr)) {
        GVQ_WARN("gvqPipeSetLearningRate: lr %g is not finite", (double)lr);
        return gvqInvalidArgument;
    }
    p->lr = lr;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqPipeGetStats(gvqPipe_t p, gvqPipeStats_t *stats) {
    GVQCHECK(pipe_check("gvqPipeGetStats", p));
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

GVQ_API gvqResult_t gvqPipeDestroy(gvqPipe_t p) {
    if (!gvq_handles_remove(&live, p)) {
        GVQ_WARN("gvqPipeDestroy: pipe %p is %s", (void *)p,
                 p == NULL ? "NULL" : "not a live pipeline stage (destroyed?)");
        return gvqInvalidArgument;
    }
    pipe_free(p);
    return gvqSuccess;
}
