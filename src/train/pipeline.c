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
    float *in, *out, *din, *dout; /* nslots x in_count / out_count each */
    int nslots;                   /* micro-batch g uses slot g mod nslots: M, or 2M without flush */
    int flush;                    /* config flush */
    long long base;               /* the first micro-batch of the current step */
    long long wbase;              /* the first micro-batch of the last warm-up */
    int warm; /* forwards of the next step already made (0, or w without a flush) */
    long long pre_fwd, pre_bwd; /* the next step's first forward and backward whose input's
                                   receive the last step made (or posted); -1: none */
    struct pipe_task {
        int fwd;
        long long g;
    } * tasks; /* one step's, in order */
    /* overlapped transfers: activations on fcomm/fstream, errors on bcomm/bstream; per slot,
     * events after the group that receives its input or sends its output */
    gvqComm_t fcomm, bcomm;
    gvqStream_t fstream, bstream;
    gvqEvent_t *ev; /* 4 x nslots: in, out, dout, din */
    long long steps;
    gvqResult_t failed; /* a step that failed: later steps are refused */
    /* gvqPipePipedream: the weights (copied range list), their versions and the update */
    int nw;
    float **wptr;
    size_t *wlen, wtotal;
    int nversions;
    long long *version_at;  /* PipeDream: the update count when version slot v was taken */
    int predicted;          /* SpecTrain: a prediction is in the ranges, the weights in current */
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

/* w: the forwards stage k makes ahead of its backwards in the 1F1B family, min(S-k-1, M). */
static int warm_of(const gvqPipe_t p) {
    int w = p->nstages - p->stage - 1;
    return w < p->micro ? w : p->micro;
}

enum { R_REFUSED, R_MICRO, R_SCHEDULE, R_IN, R_OUT, R_FLUSH, R_OVERLAP, R_N };

/* This stage's own arguments; a WARN names what is wrong. */
static gvqResult_t check_own(const gvqPipeConfig_t *c, gvqComm_t comm, int S, int me,
                             gvqPipeForwardFn_t fwd, gvqPipeBackwardFn_t bwd, int *micro,
                             int *schedule, int *flush) {
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
    *flush = c->flush == GVQ_CONFIG_UNDEF_INT ? 1 : c->flush;
    if (*flush != 0 && *flush != 1) {
        GVQ_WARN("%s: flush %d must be 0 or 1", fn, *flush);
        return gvqInvalidArgument;
    }
    if (*flush == 0 && (*schedule == gvqPipeGpipe || *micro < S - 1)) {
        GVQ_WARN("%s: flush 0 (the pipeline running on across steps) needs PipeDream, DualPipe or "
                 "SpecTrain and microBatches >= stages - 1 (schedule %s, %d micro-batches, %d "
                 "stages)",
                 fn, *schedule == gvqPipeGpipe ? "gpipe" : "1F1B", *micro, S);
        return gvqInvalidArgument;
    }
    if ((c->forwardComm == NULL) != (c->backwardComm == NULL)) {
        GVQ_WARN("%s: forwardComm %p and backwardComm %p: give both (overlapped transfers) or "
                 "neither",
                 fn, (void *)c->forwardComm, (void *)c->backwardComm);
        return gvqInvalidArgument;
    }
    for (int i = 0; c->forwardComm != NULL && i < 2; i++) {
        gvqComm_t x = i ? c->backwardComm : c->forwardComm;
        int n = 0, r = -1;
        if (gvq_comm_check(x, fn, 1) != gvqSuccess || gvqCommCount(x, &n) != gvqSuccess ||
            gvqCommUserRank(x, &r) != gvqSuccess || n != S || r != me || x == comm ||
            (i && x == c->forwardComm)) {
            GVQ_WARN("%s: %s must be a live communicator of its own over the pipe's ranks in the "
                     "same order (it has %d ranks, this one rank %d; the pipe %d, rank %d)",
                     fn, i ? "backwardComm" : "forwardComm", n, r, S, me);
            return gvqInvalidArgument;
        }
    }
    size_t most = c->inCount > c->outCount ? c->inCount : c->outCount;
    if (most > ((size_t)1 << 40) / (size_t)(2 * *micro)) { /* 2M buffers of each: no overflow */
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
            rows[k * R_N + R_SCHEDULE] != rows[R_SCHEDULE] ||
            rows[k * R_N + R_FLUSH] != rows[R_FLUSH] ||
            rows[k * R_N + R_OVERLAP] != rows[R_OVERLAP]) {
            GVQ_WARN("%s: stage 0 has microBatches %lld, schedule %lld, flush %lld, overlapped "
                     "transfers %lld; stage %d %lld, %lld, %lld, %lld (must be equal on every "
                     "stage)",
                     fn, (long long)rows[R_MICRO], (long long)rows[R_SCHEDULE],
                     (long long)rows[R_FLUSH], (long long)rows[R_OVERLAP], k,
                     (long long)rows[k * R_N + R_MICRO], (long long)rows[k * R_N + R_SCHEDULE],
                     (long long)rows[k * R_N + R_FLUSH], (long long)rows[k * R_N + R_OVERLAP]);
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

/* Overlapped transfers: every stage gives the same two communicators in the same roles. Each
 * allreduces its role (1 forward, 2 backward; max of r and -r) on its own stream, so a stage that
 * swapped them still meets the others: a blocking call on each, one after the other, would then
 * wait in a circle. */
static gvqResult_t agree_roles(gvqPipe_t p) {
    const char *fn = "gvqPipeCreate";
    int32_t mine[2][2] = {{1, -1}, {2, -2}}, seen[2][2] = {{0, 0}, {0, 0}};
    gvqResult_t f = gvqAllReduce(mine[0], seen[0], 2, gvqInt32, gvqMax, p->fcomm, p->fstream);
    gvqResult_t b = gvqAllReduce(mine[1], seen[1], 2, gvqInt32, gvqMax, p->bcomm, p->bstream);
    gvqResult_t fs = gvqStreamSynchronize(p->fstream); /* the buffers are this frame's */
    gvqResult_t bs = gvqStreamSynchronize(p->bstream);
    GVQCHECK(f != gvqSuccess ? f : b != gvqSuccess ? b : fs != gvqSuccess ? fs : bs);
    for (int i = 0; i < 2; i++)
        if (seen[i][0] != i + 1 || -seen[i][1] != i + 1) {
            GVQ_WARN("%s: this stage's %s is forwardComm on some stages and backwardComm on "
                     "others: give every stage the same two in the same roles",
                     fn, i ? "backwardComm" : "forwardComm");
            return gvqInvalidArgument;
        }
    return gvqSuccess;
}

/* Returns the first unreported error of the streams' transfers. */
static gvqResult_t pipe_free(gvqPipe_t p) {
    if (p == NULL) return gvqSuccess;
    p->magic = 0;
    gvqResult_t a = p->fstream != NULL ? gvqStreamDestroy(p->fstream) : gvqSuccess;
    gvqResult_t b = p->bstream != NULL ? gvqStreamDestroy(p->bstream) : gvqSuccess;
    for (int i = 0; p->ev != NULL && i < 4 * p->nslots; i++)
        if (p->ev[i] != NULL) gvqEventDestroy(p->ev[i]);
    free(p->ev), free(p->tasks);
    free(p->in), free(p->out), free(p->din), free(p->dout);
    free(p->wptr), free(p->wlen), free(p->stash), free(p->current), free(p->version_at);
    free(p->gptr), free(p->v);
    for (int i = 0; p->recs != NULL && i < p->nrecs; i++)
        free(p->recs[i].stale);
    free(p->recs), free(p->prev);
    free(p);
    return a != gvqSuccess ? a : b;
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
    int warm = warm_of(p);
    /* in flight between a forward and its backward: w + 1, at most M within a flushed step */
    p->nversions = warm + 1 < p->micro || !p->flush ? warm + 1 : p->micro;
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
    p->version_at = calloc((size_t)p->nversions, sizeof *p->version_at);
    if (p->stash == NULL || p->current == NULL || p->version_at == NULL) {
        GVQ_WARN("gvqPipeCreate: cannot allocate %d weight versions of %zu floats", p->nversions,
                 p->wtotal);
        return gvqSystemError;
    }
    return alloc_records(p);
}

/* in, out, din and dout for every slot; the task list; with overlapped transfers the streams
 * and the slots' events. */
static gvqResult_t alloc_buffers(gvqPipe_t p, const gvqPipeConfig_t *c) {
    size_t n = (size_t)p->nslots;
    p->in = p->in_count ? malloc(sizeof(float) * n * p->in_count) : NULL;
    p->din = p->in_count ? malloc(sizeof(float) * n * p->in_count) : NULL;
    p->out = p->out_count ? malloc(sizeof(float) * n * p->out_count) : NULL;
    p->dout = p->out_count ? malloc(sizeof(float) * n * p->out_count) : NULL;
    p->tasks = malloc(sizeof *p->tasks * (size_t)(2 * p->micro + p->nstages + 2));
    if ((p->in_count && (p->in == NULL || p->din == NULL)) ||
        (p->out_count && (p->out == NULL || p->dout == NULL)) || p->tasks == NULL) {
        GVQ_WARN("gvqPipeCreate: cannot allocate %d slots of %zu + %zu floats", p->nslots,
                 p->in_count, p->out_count);
        return gvqSystemError;
    }
    if (c->forwardComm == NULL) return gvqSuccess;
    p->fcomm = c->forwardComm;
    p->bcomm = c->backwardComm;
    if ((p->ev = calloc(4 * n, sizeof *p->ev)) == NULL) return gvqSystemError;
    for (size_t i = 0; i < 4 * n; i++)
        GVQCHECK(gvqEventCreate(&p->ev[i]));
    GVQCHECK(gvqStreamCreate(&p->fstream));
    return gvqStreamCreate(&p->bstream);
}

static const char *schedule_name(int s) {
    static const char *const names[] = {"gpipe", "pipedream", "dualpipe", "spectrain"};
    return s >= 0 && s <= gvqPipeSpectrain ? names[s] : "?";
}

/* This stage, made and registered before the agreement (so that a failure here is this stage's
 * refusal, which every stage learns), or NULL with *res set. */
static gvqPipe_t make_stage(gvqComm_t comm, const gvqPipeConfig_t *config, int micro, int schedule,
                            int flush, int me, int S, gvqPipeForwardFn_t forward,
                            gvqPipeBackwardFn_t backward, void *user, gvqResult_t *res) {
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
                          .flush = flush,
                          .pre_fwd = -1,
                          .pre_bwd = -1,
                          .nslots = flush ? micro : 2 * micro,
                          .in_count = config->inCount,
                          .out_count = config->outCount,
                          .forward = forward,
                          .backward = backward,
                          .user = user};
    *res = alloc_buffers(p, config);
    if (*res == gvqSuccess && schedule != gvqPipeGpipe) *res = alloc_versions(p, config);
    if (*res == gvqSuccess) *res = gvq_handles_add(&live, p);
    if (*res == gvqSuccess) return p;
    pipe_free(p);
    return NULL;
}

/* The caller's config in this library's layout: one of the layout before flush and the
 * transfer communicators (stop 30's, without them) gets their defaults, never its padding. */
static gvqResult_t resolve_config(const gvqPipeConfig_t *in, gvqPipeConfig_t *out) {
    return gvq_config_layouts("gvqPipeCreate", "config", in, out, offsetof(gvqPipeConfig_t, flush),
                              _Alignof(gvqPipeConfig_t), sizeof *out, GVQ_PIPE_CONFIG_MAGIC,
                              "GVQ_PIPE_CONFIG_INITIALIZER");
}

GVQ_API gvqResult_t gvqPipeCreate(gvqComm_t comm, const gvqPipeConfig_t *config,
                                  gvqPipeForwardFn_t forward, gvqPipeBackwardFn_t backward,
                                  void *user, gvqPipe_t *pipe) {
    const char *fn = "gvqPipeCreate";
    gvqPipeConfig_t full = GVQ_PIPE_CONFIG_INITIALIZER;
    GVQCHECK(gvq_comm_check(comm, fn, 1)); /* without a communicator nobody can be told */
    int micro = 0, schedule = 0, flush = 1, S = 0, me = 0;
    GVQCHECK(gvqCommCount(comm, &S));
    GVQCHECK(gvqCommUserRank(comm, &me));
    /* this stage's own refusal still takes part in the agreement, so the others fail too */
    gvqResult_t own = gvqSuccess;
    if (pipe == NULL || config == NULL) {
        GVQ_WARN("%s: %s is NULL", fn, pipe == NULL ? "pipe" : "config");
        own = gvqInvalidArgument;
    } else {
        *pipe = NULL;
        own = resolve_config(config, &full);
        if (own == gvqSuccess) config = &full;
    }
    if (own == gvqSuccess)
        own = check_own(config, comm, S, me, forward, backward, &micro, &schedule, &flush);
    gvqPipe_t p = NULL;
    if (own == gvqSuccess)
        p = make_stage(comm, config, micro, schedule, flush, me, S, forward, backward, user, &own);
    int64_t row[R_N] = {own != gvqSuccess,
                        micro,
                        schedule,
                        own == gvqSuccess ? (int64_t)config->inCount : 0,
                        own == gvqSuccess ? (int64_t)config->outCount : 0,
                        p != NULL ? p->flush : 1,
                        p != NULL && p->fcomm != NULL};
    /* up to 64 stages on the stack: a stage without memory would leave the others waiting */
    int64_t rows_s[64 * R_N];
    int64_t *rows = S <= 64 ? rows_s : malloc(sizeof(int64_t) * R_N * (size_t)S);
    gvqResult_t res = rows == NULL ? gvqSystemError : gvqSuccess;
    if (rows != NULL) res = gvqAllGather(row, rows, R_N, gvqInt64, comm, NULL);
    if (res == gvqSuccess) res = agree_stages(rows, S, me);
    if (rows != rows_s) free(rows);
    if (own == gvqSuccess && res == gvqSuccess && p->fcomm != NULL) res = agree_roles(p);
    if (own != gvqSuccess || res != gvqSuccess) {
        if (p != NULL) {
            gvq_handles_remove(&live, p);
            pipe_free(p);
        }
        return own != gvqSuccess ? own : res;
    }
    GVQ_INFO("%s: stage %d of %d, %d micro-batches, schedule %s%s, in %zu out %zu floats%s", fn, me,
             S, micro, schedule_name(schedule), p->flush ? "" : " without a flush", config->inCount,
             config->outCount, p->fcomm != NULL ? ", overlapped transfers" : "");
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
    int w = warm_of(p), units = flushed ? M - w : M;
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
    *spare = (struct pipe_task){1, p->base + p->micro + warm_of(p)};
    return spare;
}

/* ---- a task: the callbacks, PipeDream's versions, SpecTrain's prediction --------------------- */

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
    if (p->predicted) copy_weights(p, p->current, 1);
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

/* SpecTrain's version distance of micro-batch g's forward (fwd) or backward at this stage. */
static int distance(const gvqPipe_t p, long long g, int fwd) {
    int S = p->nstages, k = p->stage, w = warm_of(p);
    if (p->predict_distance == gvqPredictPaper) return fwd ? 2 * S - k - 2 : k;
    long long since = g - p->wbase; /* the updates between F(g) and B(g) */
    return fwd ? (int)(since < w ? since : w) : 0;
}

/* The weights in place before any prediction, in p->current (the RMSE's stale weights). */
static void keep_current(gvqPipe_t p) {
    if (!p->predicted) copy_weights(p, p->current, 0);
}

/* A SpecTrain prediction stays in place from a forward to the next task (a backward's own, or
 * the next forward's, replaces it in one pass); the weights come back before every update. */
static gvqResult_t pd_forward(gvqPipe_t p, long long g) {
    int v = (int)(g % p->nversions);
    if (p->schedule == gvqPipePipedream) { /* this version, and when it was taken */
        copy_weights(p, version_of(p, g), 0);
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
        copy_weights(p, p->current, 0); /* the current weights aside, g's version in */
        copy_weights(p, version_of(p, g), 1);
        swapped = 1;
    }
    int s = distance(p, g, 0);
    if (p->schedule == gvqPipeSpectrain) predict(p, s);
    if (p->recs != NULL && s > 0) keep_current(p), record_task(p, s);
    gvqResult_t res = p->backward(p->user, slot_of(p, g), dout_of(p, g), din_of(p, g));
    if (swapped) copy_weights(p, p->current, 1);
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
    }
    p->base += p->micro;
    p->warm = flushed ? 0 : warm_of(p);
    return gvqSuccess;
}

/* A step that fails leaves transfers half done between the stages: the pipe refuses later
 * steps (destroy it; gvqCommAbort frees neighbours still waiting). */
static gvqResult_t pipe_step(const char *fn, gvqPipe_t p, int flushed) {
    GVQCHECK(pipe_check(fn, p));
    if (p->failed != gvqSuccess) {
        GVQ_WARN("%s: an earlier step failed (%s); destroy this pipe", fn,
                 gvqGetErrorString(p->failed));
        return gvqInvalidUsage;
    }
    gvqResult_t res = run_step(p, flushed);
    if (res != gvqSuccess) {
        unpredict(p); /* the caller's weights are its own again (a checkpoint after the error) */
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
    gvqResult_t failed = p->failed, res = pipe_free(p);
    if (res == gvqSuccess || failed != gvqSuccess) return gvqSuccess; /* reported by its step */
    GVQ_WARN("gvqPipeDestroy: a transfer of the pipe's last step failed: %s",
             gvqGetErrorString(res));
    return res;
}
