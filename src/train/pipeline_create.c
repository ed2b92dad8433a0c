/*
 * pipeline_create.c -- a pipeline stage made (gvqPipeCreate: every stage's arguments checked
 * and agreed, buffers, streams and events), checked and freed (gvqPipeDestroy); pipeline.c has
 * the design and runs the steps.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "gvq_handles.h"
#include "gvq_pipeline.h"

static gvq_handles_t live = GVQ_HANDLES_INITIALIZER;

/* w: the forwards stage k makes ahead of its backwards in the 1F1B family, min(S-k-1, M). */
int gvq_pipe_warm_of(const gvqPipe_t p) {
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
                     "transfers %lld (2: on link communicators, GVQ_PIPE_LINKS); stage %d %lld, "
                     "%lld, %lld, %lld (must be equal on every stage)",
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

/* A communicator per link and direction (GVQ_PIPE_LINKS): two splits of each of fcomm and
 * bcomm, the first pairing the stages of links 0, 2, 4 .., the second of links 1, 3 ..; in link
 * l's communicator stage l is rank 0 and stage l + 1 rank 1. Collective over every stage (after
 * the agreement, so that all of them call it); each gets a stream. */
static gvqResult_t make_links(gvqPipe_t p) {
    int k = p->stage, S = p->nstages;
    for (int dir = 0; dir < 2; dir++)
        for (int pass = 0; pass < 2; pass++) {
            int l = k % 2 == pass ? k : k - 1; /* this pass's link of stage k */
            int valid = l >= 0 && l + 1 < S;
            gvqComm_t c = NULL;
            GVQCHECK(gvqCommSplit(dir ? p->bcomm : p->fcomm, valid ? l : GVQ_SPLIT_NOCOLOR, k, &c,
                                  NULL));
            if (!valid) continue;
            int right = l == k; /* the link to stage k + 1 */
            int i = dir ? (right ? PIPE_B_RECV : PIPE_B_SEND) : (right ? PIPE_F_SEND : PIPE_F_RECV);
            p->lcomm[i] = c;
            GVQCHECK(gvqStreamCreate(&p->lstream[i]));
        }
    return gvqSuccess;
}

/* Returns the first unreported error of the streams' transfers. */
static gvqResult_t pipe_free(gvqPipe_t p) {
    if (p == NULL) return gvqSuccess;
    p->magic = 0;
    gvqResult_t a = p->fstream != NULL ? gvqStreamDestroy(p->fstream) : gvqSuccess;
    gvqResult_t b = p->bstream != NULL ? gvqStreamDestroy(p->bstream) : gvqSuccess;
    for (int i = 0; i < 4; i++) {
        gvqResult_t r = p->lstream[i] != NULL ? gvqStreamDestroy(p->lstream[i]) : gvqSuccess;
        if (a == gvqSuccess) a = r;
        if (p->lcomm[i] != NULL) gvqCommDestroy(p->lcomm[i]);
    }
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
    gvq_pipe_copy_weights(p, p->prev, 0);
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
    int warm = gvq_pipe_warm_of(p);
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
    p->links = gvq_param(GVQ_PARAM_PIPE_LINKS) != 0 && gvq_comm_can_split(p->fcomm) &&
               gvq_comm_can_split(p->bcomm); /* not the in-process test transport */
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
                        p != NULL && p->fcomm != NULL ? 1 + p->links : 0};
    /* up to 64 stages on the stack: a stage without memory would leave the others waiting */
    int64_t rows_s[64 * R_N];
    int64_t *rows = S <= 64 ? rows_s : malloc(sizeof(int64_t) * R_N * (size_t)S);
    gvqResult_t res = rows == NULL ? gvqSystemError : gvqSuccess;
    if (rows != NULL) res = gvqAllGather(row, rows, R_N, gvqInt64, comm, NULL);
    if (res == gvqSuccess) res = agree_stages(rows, S, me);
    if (rows != rows_s) free(rows);
    if (own == gvqSuccess && res == gvqSuccess && p->fcomm != NULL) res = agree_roles(p);
    if (own == gvqSuccess && res == gvqSuccess && p->fcomm != NULL && p->links) res = make_links(p);
    if (own != gvqSuccess || res != gvqSuccess) {
        if (p != NULL) {
            gvq_handles_remove(&live, p);
            pipe_free(p);
        }
        return own != gvqSuccess ? own : res;
    }
    GVQ_INFO("%s: stage %d of %d, %d micro-batches, schedule %s%s, in %zu out %zu floats%s", fn, me,
             S, micro, schedule_name(schedule), p->flush ? "" : " without a flush", config->inCount,
             config->outCount,
             p->fcomm == NULL ? ""
             : p->links       ? ", overlapped transfers on a communicator per link and direction"
                              : ", overlapped transfers");
    *pipe = p;
    return gvqSuccess;
}

gvqResult_t gvq_pipe_check(const char *fn, gvqPipe_t p) {
    if (!gvq_handles_live(&live, p)) {
        GVQ_WARN("%s: pipe %p is %s", fn, (void *)p,
                 p == NULL ? "NULL" : "not a live pipeline stage (destroyed?)");
        return gvqInvalidArgument;
    }
    return gvq_comm_check(p->comm, fn, 1);
}

void gvq_pipe_copy_weights(gvqPipe_t p, float *buf, int to_ranges) {
    size_t at = 0;
    for (int r = 0; r < p->nw; r++) {
        if (to_ranges)
            memcpy(p->wptr[r], buf + at, sizeof(float) * p->wlen[r]);
        else
            memcpy(buf + at, p->wptr[r], sizeof(float) * p->wlen[r]);
        at += p->wlen[r];
    }
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
