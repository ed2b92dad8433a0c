/*
 * test_pipeline.c -- gvqPipe (include/gvq_train.h) on real MPI ranks, one stage per rank:
 *
 *   1 gpipe       a 4-layer tanh MLP (widths 6-8-8-8-3, squared loss) cut into S = nranks
 *                 stages of consecutive layers, 4 micro-batches of 5 rows, 3 SGD steps: every
 *                 stage's weights equal bitwise those of single-process training of the whole
 *                 model, which every rank also runs here with the same layer code and the same
 *                 micro-batch order
 *   3 pipedream, dualpipe, spectrain   the same MLP, weights updated after every micro-batch:
 *                 with weight stashing, on the current (stale) weights, on SpecTrain's predicted
 *                 weights (the prediction computed by hand here); every stage's weights equal
 *                 bitwise those of an in-process reference that runs each stage's operations in
 *                 the schedule's order
 *                 gvqPipeGetStats: with GVQ_PIPE_RMSE=1 (ctest's mpi_pipeline_rmse_*) the RMSE of
 *                 each DualPipe/SpecTrain task's weights (stale, and predicted) against the
 *                 weights its stage reached s updates later equals the one computed here from
 *                 the callbacks' own record of the weights; without it, no samples
 *   2 refusals    on every stage alike: stage k's outCount not stage k+1's inCount, an input on
 *                 stage 0, microBatches differing between stages, one stage's own refusal (a
 *                 reserved schedule, a NULL config), forwardComm and backwardComm swapped on
 *                 one stage; a NULL pipe to gvqPipeStep; on one stage, a failing callback fails
 *                 its step and the pipe refuses the next
 */
#include <math.h>
#include <stddef.h>

#include "gvq_train.h"
#include "../test_hash.h"
#include "mpitest.h"

#define NL 4    /* layers */
#define MB 4    /* micro-batches */
#define ROWS 5  /* rows per micro-batch */
#define STEPS 4 /* mini-batches */
#define LR 0.05f

static const int width[NL + 1] = {6, 8, 8, 8, 3};

typedef struct {
    float *w[NL], *b[NL], *gw[NL], *gb[NL];
    float *act[2 * MB][NL + 1]; /* act[m][l]: input of layer l (act[m][NL]: the output); slots
                                   MB .. 2MB-1: a pipeline without a flush */
} mlp_t;

static void mlp_init(mlp_t *n) {
    memset(n, 0, sizeof *n);
    for (int l = 0; l < NL; l++) {
        size_t nw = (size_t)width[l + 1] * (size_t)width[l];
        n->w[l] = malloc(sizeof(float) * nw);
        n->gw[l] = calloc(nw, sizeof(float));
        n->b[l] = calloc((size_t)width[l + 1], sizeof(float));
        n->gb[l] = calloc((size_t)width[l + 1], sizeof(float));
        for (size_t i = 0; i < nw; i++)
            n->w[l][i] = 0.5f * test_hash_value(1, (uint32_t)l, (uint32_t)i);
        for (int m = 0; m < 2 * MB; m++)
            n->act[m][l + 1] = malloc(sizeof(float) * ROWS * (size_t)width[l + 1]);
    }
    for (int m = 0; m < 2 * MB; m++)
        n->act[m][0] = malloc(sizeof(float) * ROWS * (size_t)width[0]);
}

static void mlp_free(mlp_t *n) {
    for (int l = 0; l < NL; l++)
        free(n->w[l]), free(n->b[l]), free(n->gw[l]), free(n->gb[l]);
    for (int m = 0; m < 2 * MB; m++)
        for (int l = 0; l <= NL; l++)
            free(n->act[m][l]);
}

/* Layer l on micro-batch m: act[m][l+1] = f(W act[m][l] + b), f = tanh but on the last layer. */
static void layer_forward(mlp_t *n, int l, int m) {
    int in = width[l], out = width[l + 1];
    for (int r = 0; r < ROWS; r++)
        for (int o = 0; o < out; o++) {
            float s = n->b[l][o];
            for (int i = 0; i < in; i++)
                s += n->w[l][o * in + i] * n->act[m][l][r * in + i];
            n->act[m][l + 1][r * out + o] = l + 1 < NL ? tanhf(s) : s;
        }
}

/* Layer l backward on micro-batch m: dy (the error at its output) -> dx (at its input; may be
 * NULL), gradients accumulated. */
static void layer_backward(mlp_t *n, int l, int m, const float *dy, float *dx) {
    int in = width[l], out = width[l + 1];
    float dz[ROWS * 8];
    for (int r = 0; r < ROWS; r++)
        for (int o = 0; o < out; o++) {
            float y = n->act[m][l + 1][r * out + o];
            dz[r * out + o] = l + 1 < NL ? dy[r * out + o] * (1 - y * y) : dy[r * out + o];
        }
    for (int o = 0; o < out; o++)
        for (int r = 0; r < ROWS; r++) {
            n->gb[l][o] += dz[r * out + o];
            for (int i = 0; i < in; i++)
                n->gw[l][o * in + i] += dz[r * out + o] * n->act[m][l][r * in + i];
        }
    if (dx != NULL)
        for (int r = 0; r < ROWS; r++)
            for (int i = 0; i < in; i++) {
                float s = 0;
                for (int o = 0; o < out; o++)
                    s += n->w[l][o * in + i] * dz[r * out + o];
                dx[r * in + i] = s;
            }
}

static void input_of(int step, int m, float *x) {
    for (int i = 0; i < ROWS * width[0]; i++)
        x[i] = test_hash_value(2, (uint32_t)(step * MB + m), (uint32_t)i);
}

/* d(loss)/d(output) of the squared loss against the micro-batch's targets. */
static void loss_grad(int step, int m, const float *y, float *dy) {
    for (int i = 0; i < ROWS * width[NL]; i++)
        dy[i] = 2.0f * (y[i] - test_hash_value(3, (uint32_t)(step * MB + m), (uint32_t)i)) /
                (ROWS * MB);
}

static void sgd(mlp_t *n, int l0, int l1) {
    for (int l = l0; l < l1; l++) {
        size_t nw = (size_t)width[l + 1] * (size_t)width[l];
        for (size_t i = 0; i < nw; i++) {
            n->w[l][i] -= LR * n->gw[l][i];
            n->gw[l][i] = 0;
        }
        for (int o = 0; o < width[l + 1]; o++) {
            n->b[l][o] -= LR * n->gb[l][o];
            n->gb[l][o] = 0;
        }
    }
}

/* The whole model on one process, micro-batches in the pipeline's order. */
static void reference_step(mlp_t *n, int step) {
    float dy[ROWS * 8], dx[ROWS * 8];
    for (int m = 0; m < MB; m++) {
        input_of(step, m, n->act[m][0]);
        for (int l = 0; l < NL; l++)
            layer_forward(n, l, m);
    }
    for (int m = MB - 1; m >= 0; m--) {
        loss_grad(step, m, n->act[m][NL], dy);
        for (int l = NL - 1; l >= 0; l--) {
            layer_backward(n, l, m, dy, l > 0 ? dx : NULL);
            if (l > 0) memcpy(dy, dx, sizeof dx);
        }
    }
    sgd(n, 0, NL);
}

/* ---- a stage: layers [l0, l1) of the same model ---------------------------------------------- */

typedef struct {
    mlp_t net;
    int l0, l1, step;
    int track;  /* part 3: record the tasks' weights (rt) */
    int nflush; /* a pipeline without a flush: slot m is micro-batch m mod MB of the step of
                   parity m / MB, this one or the next (gvq_train.h) */
    int wbase;  /* ... the first micro-batch since the last flush (SpecTrain's distances) */
    const float *in_at[2 * MB]; /* the input gvqPipe gave forward(m), checked at backward(m) */
} stage_t;

/* Slot m's micro-batch: its step and index; *since: the updates' count SpecTrain's schedule
 * distance starts from (the step's first micro-batch, or the first of all without a flush). */
static int micro_of(const stage_t *s, int m, int *index, int *since) {
    int step = s->step;
    if (s->nflush && (step & 1) != m / MB) step++;
    *index = m % MB;
    *since = s->nflush ? step * MB + *index - s->wbase : *index;
    return step;
}

/* Part 3's record for the RMSE check: the weights after every update, and every task's weights
 * (in place when it ran) with its version distance s and the update count it ran at. */
enum { RT_W = 8 * 8 * NL + 8 * NL, RT_TASKS = 2 * STEPS * MB };
static struct {
    int k, S, mode; /* the stage, the stage count, gvqPipePredictDistance_t */
    long long updates;
    float hist[STEPS * MB + 1][RT_W];
    struct {
        long long at;
        int s;
        float w[RT_W];
    } task[RT_TASKS];
    int ntask;
} rt;

/* The stage's weights in the order of its weight ranges (each layer's w, then b). */
static void stage_weights(const stage_t *s, float *buf) {
    size_t at = 0;
    for (int l = s->l0; l < s->l1; l++) {
        size_t nw = (size_t)width[l + 1] * (size_t)width[l];
        memcpy(buf + at, s->net.w[l], sizeof(float) * nw);
        memcpy(buf + at + nw, s->net.b[l], sizeof(float) * (size_t)width[l + 1]);
        at += nw + (size_t)width[l + 1];
    }
}

/* SpecTrain's version distance of micro-batch m's forward (fwd) or backward at stage k of S
 * (include/gvq_train.h's gvqPipePredictDistance_t). */
static int ref_distance(int mode, int k, int S, int since, int fwd) {
    if (mode == gvqPredictPaper) return fwd ? 2 * S - k - 2 : k;
    int w = S - k - 1 < MB ? S - k - 1 : MB;
    return fwd ? (since < w ? since : w) : 0;
}

static void rt_task(const stage_t *s, int dist) {
    if (!s->track || rt.ntask >= RT_TASKS) return;
    rt.task[rt.ntask].at = rt.updates;
    rt.task[rt.ntask].s = dist;
    stage_weights(s, rt.task[rt.ntask++].w);
}

static gvqResult_t stage_forward(void *user, int m, const float *in, float *out) {
    stage_t *s = user;
    int index = 0, since = 0, step = micro_of(s, m, &index, &since);
    rt_task(s, ref_distance(rt.mode, rt.k, rt.S, since, 1));
    if (in == NULL)
        input_of(step, index, s->net.act[m][0]);
    else
        memcpy(s->net.act[m][s->l0], in, sizeof(float) * ROWS * (size_t)width[s->l0]);
    s->in_at[m] = in;
    for (int l = s->l0; l < s->l1; l++)
        layer_forward(&s->net, l, m);
    if (out != NULL) memcpy(out, s->net.act[m][s->l1], sizeof(float) * ROWS * (size_t)width[s->l1]);
    return gvqSuccess;
}

static gvqResult_t stage_backward(void *user, int m, const float *dout, float *din) {
    stage_t *s = user;
    int index = 0, since = 0, step = micro_of(s, m, &index, &since);
    rt_task(s, ref_distance(rt.mode, rt.k, rt.S, since, 0));
    float dy[ROWS * 8], dx[ROWS * 8];
    /* the contract: forward's input stays valid and unchanged until this backward returns */
    if (s->in_at[m] != NULL)
        MT_CHECK(memcmp(s->in_at[m], s->net.act[m][s->l0],
                        sizeof(float) * ROWS * (size_t)width[s->l0]) == 0,
                 "stage %d: the input of micro-batch slot %d changed before its backward", s->l0,
                 m);
    if (dout == NULL)
        loss_grad(step, index, s->net.act[m][NL], dy);
    else
        memcpy(dy, dout, sizeof(float) * ROWS * (size_t)width[s->l1]);
    for (int l = s->l1 - 1; l >= s->l0; l--) {
        layer_backward(&s->net, l, m, dy, l > 0 ? dx : NULL);
        if (l > 0) memcpy(dy, dx, sizeof dx);
    }
    if (din != NULL) memcpy(din, dy, sizeof(float) * ROWS * (size_t)width[s->l0]);
    return gvqSuccess;
}

static gvqPipeConfig_t stage_config(int l0, int l1) {
    gvqPipeConfig_t c = GVQ_PIPE_CONFIG_INITIALIZER;
    c.microBatches = MB;
    c.inCount = l0 == 0 ? 0 : (size_t)ROWS * (size_t)width[l0];
    c.outCount = l1 == NL ? 0 : (size_t)ROWS * (size_t)width[l1];
    return c;
}

static void part_gpipe(int overlap) {
    if (mt.rank == 0)
        printf("-- 1 gpipe on %d stages%s reproduces single-process training\n", mt.nranks,
               overlap ? ", overlapped transfers," : "");
    gvqComm_t comm = mt_new_comm(), xc[2] = {NULL, NULL};
    if (overlap) xc[0] = mt_new_comm(), xc[1] = mt_new_comm();
    int S = mt.nranks, k = mt.rank;
    MT_CHECK(S <= NL, "this test cuts %d layers into at most %d stages", NL, NL);
    stage_t st = {0};
    mlp_init(&st.net);
    st.l0 = k * NL / S;
    st.l1 = (k + 1) * NL / S;
    gvqPipeConfig_t cfg = stage_config(st.l0, st.l1);
    cfg.forwardComm = xc[0];
    cfg.backwardComm = xc[1];
    gvqPipe_t p = NULL;
    MT_OK(gvqPipeCreate(comm, &cfg, stage_forward, stage_backward, &st, &p));
    mlp_t ref;
    mlp_init(&ref);
    for (int step = 0; step < STEPS; step++) {
        st.step = step;
        MT_OK(gvqPipeStep(p));
        sgd(&st.net, st.l0, st.l1);
        reference_step(&ref, step);
        for (int l = st.l0; l < st.l1; l++) {
            size_t nw = (size_t)width[l + 1] * (size_t)width[l];
            MT_CHECK(memcmp(st.net.w[l], ref.w[l], sizeof(float) * nw) == 0 &&
                         memcmp(st.net.b[l], ref.b[l], sizeof(float) * (size_t)width[l + 1]) == 0,
                     "step %d: stage %d's layer %d differs from single-process training", step, k,
                     l);
        }
    }
    /* the reference moved: the test is not comparing unchanged weights */
    mlp_t init;
    mlp_init(&init);
    MT_CHECK(memcmp(init.w[0], ref.w[0], sizeof(float) * 48) != 0, "the weights did not move");
    mlp_free(&init);
    MT_OK(gvqPipeDestroy(p));
    MT_EXPECT_RES(gvqPipeDestroy(p), gvqInvalidArgument);
    mlp_free(&ref);
    mlp_free(&st.net);
    MT_OK(gvqCommDestroy(comm));
    for (int i = 0; overlap && i < 2; i++)
        MT_OK(gvqCommDestroy(xc[i]));
}

/* ---- part 2 ------------------------------------------------------------------------------------
 */

static gvqResult_t no_forward(void *u, int m, const float *in, float *out) {
    (void)u, (void)m, (void)in, (void)out;
    return gvqSuccess;
}
static gvqResult_t no_backward(void *u, int m, const float *dout, float *din) {
    (void)u, (void)m, (void)dout, (void)din;
    return gvqSuccess;
}

static gvqResult_t no_update(void *u, int m) {
    (void)u, (void)m;
    return gvqSuccess;
}

static gvqResult_t failing_forward(void *u, int m, const float *in, float *out) {
    (void)u, (void)m, (void)in, (void)out;
    return gvqInternalError;
}

/* Every stage's create must fail with gvqInvalidArgument (none of them may hang). */
static void expect_refused(gvqComm_t comm, const gvqPipeConfig_t *cfg, const char *what) {
    gvqPipe_t p = NULL;
    gvqResult_t r = gvqPipeCreate(comm, cfg, no_forward, no_backward, NULL, &p);
    MT_CHECK(r == gvqInvalidArgument && p == NULL, "%s: stage %d got %s, want invalid argument",
             what, mt.rank, gvqGetErrorString(r));
}

static void part_refusals(void) {
    if (mt.rank == 0) printf("-- 2 refusals on every stage\n");
    gvqComm_t comm = mt_new_comm();
    int S = mt.nranks, k = mt.rank;
    gvqPipeConfig_t c = GVQ_PIPE_CONFIG_INITIALIZER;
    c.inCount = k == 0 ? 0 : 10;
    c.outCount = k == S - 1 ? 0 : 10;
    if (S > 1) {
        gvqPipeConfig_t bad = c;
        if (k == 0) bad.outCount = 11; /* stage 1 expects 10 */
        expect_refused(comm, &bad, "outCount 11 into inCount 10");
        bad = c;
        if (k == 1) bad.microBatches = 3;
        expect_refused(comm, &bad, "microBatches differing");
    }
    gvqPipeConfig_t bad = c;
    if (k == 0) bad.inCount = 4;
    expect_refused(comm, &bad, "an input on stage 0");
    bad = c;
    if (k == S - 1) bad.schedule = 7; /* not a schedule: this stage refuses */
    expect_refused(comm, &bad, "an unknown schedule on the last stage");
    bad = c;
    bad.flush = 0; /* GPipe always flushes */
    expect_refused(comm, &bad, "gpipe without a flush");
    bad = c;
    bad.forwardComm = mt_new_comm(); /* without backwardComm */
    expect_refused(comm, &bad, "forwardComm without backwardComm");
    bad.backwardComm = comm; /* the pipe's own */
    expect_refused(comm, &bad, "backwardComm the pipe's communicator");
    MT_OK(gvqCommDestroy(bad.forwardComm));
    bad = c; /* 1F1B without a flush needs M >= S - 1 */
    bad.schedule = gvqPipeDualpipe;
    bad.update = no_update;
    bad.weightRanges = 0;
    bad.flush = 0;
    if (S > 2) {
        bad.microBatches = S - 2;
        expect_refused(comm, &bad, "no flush with M < S - 1");
    }
    bad.microBatches = S > 1 ? S - 1 : 1; /* and M = S - 1 is accepted */
    gvqPipe_t ok = NULL;
    MT_OK(gvqPipeCreate(comm, &bad, no_forward, no_backward, NULL, &ok));
    MT_OK(gvqPipeStep(ok));
    MT_OK(gvqPipeStepFlush(ok));
    MT_OK(gvqPipeDestroy(ok));
    if (S > 1) {
        gvqComm_t f = mt_new_comm(), b = mt_new_comm();
        bad = c;
        if (k == 0) bad.forwardComm = f, bad.backwardComm = b;
        expect_refused(comm, &bad, "overlapped transfers on stage 0 only");
        bad = c; /* the same two communicators, swapped on stage 0 */
        bad.forwardComm = k == 0 ? b : f;
        bad.backwardComm = k == 0 ? f : b;
        expect_refused(comm, &bad, "forwardComm and backwardComm swapped on stage 0");
        bad.forwardComm = f; /* and in the same roles everywhere they are taken */
        bad.backwardComm = b;
        gvqPipe_t q = NULL;
        MT_OK(gvqPipeCreate(comm, &bad, no_forward, no_backward, NULL, &q));
        MT_OK(gvqPipeDestroy(q));
        MT_OK(gvqCommDestroy(f));
        MT_OK(gvqCommDestroy(b));
    }
    { /* the last stage passes no config: it still takes part, every stage refuses */
        gvqPipe_t q = NULL;
        gvqResult_t r =
            gvqPipeCreate(comm, k == S - 1 ? NULL : &c, no_forward, no_backward, NULL, &q);
        MT_CHECK(r == gvqInvalidArgument && q == NULL,
                 "a NULL config on the last stage: stage "
                 "%d got %s",
                 k, gvqGetErrorString(r));
    }
    if (S == 1) { /* a failing callback fails the step; later steps are refused */
        gvqPipe_t q = NULL;
        MT_OK(gvqPipeCreate(comm, &c, failing_forward, no_backward, NULL, &q));
        MT_EXPECT_RES(gvqPipeStep(q), gvqInternalError);
        MT_EXPECT_RES(gvqPipeStep(q), gvqInvalidUsage);
        MT_OK(gvqPipeDestroy(q));
    }
    { /* a config of the older layout (before flush and the transfer communicators) is taken at
       * its size, its tail padding never read: 0x07 there would ask for no flush otherwise */
        const size_t fields = offsetof(gvqPipeConfig_t, flush), al = _Alignof(gvqPipeConfig_t);
        gvqPipeConfig_t old;
        memset(&old, 0x07, sizeof old);
        memcpy(&old, &c, fields);
        old.size = (fields + al - 1) / al * al;
        gvqPipe_t q = NULL;
        MT_OK(gvqPipeCreate(comm, &old, no_forward, no_backward, NULL, &q));
        MT_OK(gvqPipeStep(q));
        MT_OK(gvqPipeDestroy(q));
        old.size = fields + 1; /* neither layout */
        expect_refused(comm, &old, "a config size of neither layout");
    }
    gvqPipe_t p = NULL; /* and the right configs still work on the same communicator */
    MT_OK(gvqPipeCreate(comm, &c, no_forward, no_backward, NULL, &p));
    MT_OK(gvqPipeStep(p));
    MT_OK(gvqPipeDestroy(p));
    MT_EXPECT_RES(gvqPipeStep(NULL), gvqInvalidArgument);
    MT_OK(gvqCommDestroy(comm));
}

/* ---- part 3: PipeDream with weight stashing ------------------------------------------------
 * Every stage updates its weights after each micro-batch's backward, which runs on the weights
 * its forward saw. The reference runs the S stages in one process with their own copies of the
 * model, each stage's operations in the schedule's order (gvq_train.h), an operation as soon as
 * its input exists (so in an order the pipeline could also have taken: the results cannot
 * depend on it), keeping a copy of the weights per micro-batch from its forward to its
 * backward. */

static gvqResult_t stage_update(void *user, int m) {
    stage_t *s = user;
    (void)m;
    sgd(&s->net, s->l0, s->l1);
    if (s->track && rt.updates < STEPS * MB) stage_weights(s, rt.hist[++rt.updates]);
    return gvqSuccess;
}

static double rt_rms(const float *a, const float *b, size_t n) {
    double e = 0;
    for (size_t i = 0; i < n; i++)
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(e / (double)n);
}

/* gvqPipeGetStats against the record: the tasks with s > 0 whose target was reached. */
static void rt_check(gvqPipe_t p, const stage_t *st, int schedule) {
    gvqPipeStats_t ps;
    MT_OK(gvqPipeGetStats(p, &ps));
    MT_EXPECT_RES(gvqPipeGetStats(p, NULL), gvqInvalidArgument);
    MT_CHECK(ps.steps == STEPS && ps.updates == STEPS * MB, "steps %lld updates %lld", ps.steps,
             ps.updates);
    const char *env = getenv("GVQ_PIPE_RMSE");
    if (env == NULL || strcmp(env, "1") != 0 || schedule == gvqPipePipedream) {
        MT_CHECK(ps.samples == 0 && ps.rmseStale == 0, "no measurement asked, but %lld samples",
                 ps.samples);
        return;
    }
    size_t n = 0;
    for (int l = st->l0; l < st->l1; l++)
        n += (size_t)width[l + 1] * (size_t)width[l] + (size_t)width[l + 1];
    long long cnt = 0;
    double stale = 0, pred = 0;
    for (int i = 0; i < rt.ntask; i++) {
        long long to = rt.task[i].at + rt.task[i].s;
        if (rt.task[i].s <= 0 || to > rt.updates) continue;
        stale += rt_rms(rt.hist[rt.task[i].at], rt.hist[to], n);
        pred += rt_rms(rt.task[i].w, rt.hist[to], n);
        cnt++;
    }
    if (cnt > 0) stale /= (double)cnt, pred /= (double)cnt;
    if (schedule != gvqPipeSpectrain) pred = 0;
    MT_CHECK(ps.samples == cnt && fabs(ps.rmseStale - stale) <= 1e-6 * stale + 1e-12 &&
                 fabs(ps.rmsePredicted - pred) <= 1e-6 * pred + 1e-12,
             "stage %d: stats %lld samples, RMSE stale %.9g predicted %.9g; recorded %lld, %.9g, "
             "%.9g",
             mt.rank, ps.samples, ps.rmseStale, ps.rmsePredicted, cnt, stale, pred);
    int some = rt.mode == gvqPredictPaper ? mt.nranks > 1 : rt.k < rt.S - 1; /* a distance > 0 */
    MT_CHECK(cnt > 0 || !some, "stage %d: no task measured", mt.rank);
}

/* Stage k's operations on nmb micro-batches in a row (one step, or every step of a pipeline
 * without a flush): +j+1 a forward of the j-th, -(j+1) its backward. */
static void pipedream_order(int k, int S, int nmb, int *ops) {
    int w = S - k - 1 < MB ? S - k - 1 : MB, n = 0;
    for (int m = 0; m < w; m++)
        ops[n++] = m + 1;
    for (int i = 0; i < nmb - w; i++) {
        ops[n++] = w + i + 1;
        ops[n++] = -(i + 1);
    }
    for (int i = nmb - w; i < nmb; i++)
        ops[n++] = -(i + 1);
}

static void weights_copy(mlp_t *n, int l0, int l1, float *buf, int restore) {
    size_t at = 0;
    for (int l = l0; l < l1; l++) {
        size_t nw = (size_t)width[l + 1] * (size_t)width[l], nb = (size_t)width[l + 1];
        memcpy(restore ? n->w[l] : buf + at, restore ? buf + at : n->w[l], sizeof(float) * nw);
        at += nw;
        memcpy(restore ? n->b[l] : buf + at, restore ? buf + at : n->b[l], sizeof(float) * nb);
        at += nb;
    }
}

/* SpecTrain's prediction by hand: W <- W - s lr v over the stage's weights (v in weights_copy's
 * order), s = 2S - k - 2 for a forward at stage k, k for a backward (docs/ALGORITHMS.md section 6).
 */
static void predict_by_hand(mlp_t *n, int l0, int l1, const float *v, int s) {
    size_t at = 0;
    float f = (float)s * LR;
    for (int l = l0; l < l1; l++) {
        for (int i = 0; i < width[l + 1] * width[l]; i++, at++)
            n->w[l][i] = n->w[l][i] - f * v[at];
        for (int i = 0; i < width[l + 1]; i++, at++)
            n->b[l][i] = n->b[l][i] - f * v[at];
    }
}

/* v <- gamma v + (1 - gamma) g, g the stage's accumulated gradients. */
static void smooth_by_hand(mlp_t *n, int l0, int l1, float *v) {
    size_t at = 0;
    const float gamma = 0.9f;
    for (int l = l0; l < l1; l++) {
        for (int i = 0; i < width[l + 1] * width[l]; i++, at++)
            v[at] = gamma * v[at] + (1.0f - gamma) * n->gw[l][i];
        for (int i = 0; i < width[l + 1]; i++, at++)
            v[at] = gamma * v[at] + (1.0f - gamma) * n->gb[l][i];
    }
}

enum { MAXW = 8 * 8 * NL + 8 * NL };
static float ref_v[NL][MAXW]; /* SpecTrain's smoothed gradients of the reference's stages */

/* schedule: gvqPipePipedream (stashed versions), Dualpipe (current weights) or Spectrain
 * (predicted weights); the micro-batches of steps [step, step + nsteps) in a row. */
static void reference_pipedream(stage_t *st, int S, int step, int nsteps, int schedule, int mode) {
    enum { N = STEPS * MB };
    static float stash[NL][N][MAXW], cur[MAXW], fwd[NL][N][ROWS * 8], bwd[NL][N][ROWS * 8];
    const int nmb = nsteps * MB;
    int ops[NL][2 * N], pos[NL] = {0}, fdone[NL][N] = {{0}}, bdone[NL][N] = {{0}},
                        left = 2 * nmb * S;
    for (int k = 0; k < S; k++) {
        pipedream_order(k, S, nmb, ops[k]);
        st[k].wbase = step * MB;
    }
    while (left > 0) {
        int moved = 0;
        for (int k = 0; k < S; k++)
            while (pos[k] < 2 * nmb) {
                stage_t *s = &st[k];
                int op = ops[k][pos[k]], j = (op > 0 ? op : -op) - 1;
                if (op > 0 ? (k > 0 && !fdone[k - 1][j]) : (k < S - 1 && !bdone[k + 1][j])) break;
                /* the callbacks' slot of the j-th: step + j / MB, index j mod MB */
                s->step = step + j / MB;
                int m = s->nflush ? (s->step % 2) * MB + j % MB : j % MB, since = 0, index = 0;
                micro_of(s, m, &index, &since);
                if (op > 0) {
                    weights_copy(&s->net, s->l0, s->l1,
                                 schedule == gvqPipeSpectrain ? cur : stash[k][j], 0);
                    if (schedule == gvqPipeSpectrain)
                        predict_by_hand(&s->net, s->l0, s->l1, ref_v[k],
                                        ref_distance(mode, k, S, since, 1));
                    stage_forward(s, m, k > 0 ? fwd[k - 1][j] : NULL, k < S - 1 ? fwd[k][j] : NULL);
                    if (schedule == gvqPipeSpectrain) weights_copy(&s->net, s->l0, s->l1, cur, 1);
                    fdone[k][j] = 1;
                } else {
                    weights_copy(&s->net, s->l0, s->l1, cur, 0);
                    if (schedule == gvqPipePipedream)
                        weights_copy(&s->net, s->l0, s->l1, stash[k][j], 1);
                    if (schedule == gvqPipeSpectrain)
                        predict_by_hand(&s->net, s->l0, s->l1, ref_v[k],
                                        ref_distance(mode, k, S, since, 0));
                    stage_backward(s, m, k < S - 1 ? bwd[k + 1][j] : NULL,
                                   k > 0 ? bwd[k][j] : NULL);
                    weights_copy(&s->net, s->l0, s->l1, cur, 1);
                    if (schedule == gvqPipeSpectrain)
                        smooth_by_hand(&s->net, s->l0, s->l1, ref_v[k]);
                    sgd(&s->net, s->l0, s->l1);
                    bdone[k][j] = 1;
                }
                pos[k]++;
                left--;
                moved = 1;
            }
        if (!moved) {
            MT_FAIL("the PipeDream reference cannot proceed (a test bug)");
            return;
        }
    }
}

/* flush 0: the pipeline runs on across steps (the last step gvqPipeStepFlush), compared with
 * the reference at the end; overlap: transfers on two more communicators' streams. */
static void part_pipedream(int schedule, int mode, int flush, int overlap) {
    static const char *const name[] = {"gpipe", "pipedream", "dualpipe", "spectrain"};
    if (mt.rank == 0)
        printf("-- 3 %s on %d stages (%s distances)%s%s, against an in-process reference\n",
               name[schedule], mt.nranks, mode == gvqPredictPaper ? "paper" : "schedule",
               flush ? "" : ", no flush between steps", overlap ? ", overlapped transfers" : "");
    memset(ref_v, 0, sizeof ref_v);
    gvqComm_t comm = mt_new_comm(), xc[2] = {NULL, NULL};
    if (overlap) xc[0] = mt_new_comm(), xc[1] = mt_new_comm();
    int S = mt.nranks, k = mt.rank;
    stage_t st = {0}, ref[NL] = {0};
    mlp_init(&st.net);
    st.l0 = k * NL / S;
    st.l1 = (k + 1) * NL / S;
    float *wp[2 * NL], *gp[2 * NL];
    size_t wc[2 * NL];
    int nr = 0;
    for (int l = st.l0; l < st.l1; l++) {
        gp[nr] = st.net.gw[l], wp[nr] = st.net.w[l],
        wc[nr++] = (size_t)width[l + 1] * (size_t)width[l];
        gp[nr] = st.net.gb[l], wp[nr] = st.net.b[l], wc[nr++] = (size_t)width[l + 1];
    }
    gvqPipeConfig_t cfg = stage_config(st.l0, st.l1);
    memset(&rt, 0, sizeof rt);
    st.track = 1;
    rt.k = k, rt.S = S, rt.mode = mode;
    stage_weights(&st, rt.hist[0]);
    cfg.schedule = schedule;
    cfg.predictDistance = mode;
    cfg.gradients = gp;
    cfg.weightRanges = nr;
    cfg.weights = wp;
    cfg.weightCounts = wc;
    cfg.update = stage_update;
    cfg.flush = flush;
    cfg.forwardComm = xc[0];
    cfg.backwardComm = xc[1];
    st.nflush = !flush;
    gvqPipe_t p = NULL;
    MT_OK(gvqPipeCreate(comm, &cfg, stage_forward, stage_backward, &st, &p));
    MT_OK(gvqPipeSetLearningRate(p, LR));
    MT_EXPECT_RES(gvqPipeSetLearningRate(p, NAN), gvqInvalidArgument);
    for (int j = 0; j < S; j++) {
        mlp_init(&ref[j].net);
        ref[j].l0 = j * NL / S;
        ref[j].l1 = (j + 1) * NL / S;
        ref[j].nflush = !flush;
    }
    for (int step = 0; step < STEPS; step++) {
        /* without a flush: steps 0-1 in a row, the second flushed, then 2-3 (a refill) */
        int last_of_row = flush || step % 2 == 1;
        st.step = step;
        if (!flush && step % 2 == 0) st.wbase = step * MB;
        MT_OK(!flush && last_of_row ? gvqPipeStepFlush(p) : gvqPipeStep(p));
        if (flush)
            reference_pipedream(ref, S, step, 1, schedule, mode);
        else if (last_of_row) /* in a row, then compared */
            reference_pipedream(ref, S, step - 1, 2, schedule, mode);
        else
            continue;
        for (int l = st.l0; l < st.l1; l++) {
            size_t nw = (size_t)width[l + 1] * (size_t)width[l];
            MT_CHECK(
                memcmp(st.net.w[l], ref[k].net.w[l], sizeof(float) * nw) == 0 &&
                    memcmp(st.net.b[l], ref[k].net.b[l], sizeof(float) * (size_t)width[l + 1]) == 0,
                "%s step %d: stage %d's layer %d differs from the reference", name[schedule], step,
                k, l);
        }
    }
    rt_check(p, &st, schedule);
    MT_OK(gvqPipeDestroy(p));
    cfg.update = NULL; /* refused: these schedules need the update */
    expect_refused(comm, &cfg, "a schedule with updates, without update");
    if (schedule == gvqPipeSpectrain) {
        cfg.update = stage_update;
        cfg.smoothing = 1.0f; /* outside [0, 1) */
        expect_refused(comm, &cfg, "spectrain with smoothing 1");
        cfg.smoothing = 0.9f;
        cfg.predictDistance = 2;
        expect_refused(comm, &cfg, "spectrain with predictDistance 2");
    }
    for (int j = 0; j < S; j++)
        mlp_free(&ref[j].net);
    mlp_free(&st.net);
    MT_OK(gvqCommDestroy(comm));
    for (int i = 0; overlap && i < 2; i++)
        MT_OK(gvqCommDestroy(xc[i]));
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    part_gpipe(0);
    part_gpipe(1);
    part_refusals();
    part_pipedream(gvqPipePipedream, gvqPredictPaper, 1, 0);
    part_pipedream(gvqPipeDualpipe, gvqPredictPaper, 1, 0);
    part_pipedream(gvqPipeSpectrain, gvqPredictPaper, 1, 0);
    part_pipedream(gvqPipeDualpipe, gvqPredictSchedule, 1, 0);
    part_pipedream(gvqPipeSpectrain, gvqPredictSchedule, 1, 0);
    for (int overlap = 0; overlap < 2; overlap++) { /* without a flush; overlapped transfers */
        part_pipedream(gvqPipePipedream, gvqPredictPaper, 0, overlap);
        part_pipedream(gvqPipeDualpipe, gvqPredictSchedule, 0, overlap);
        part_pipedream(gvqPipeSpectrain, gvqPredictPaper, 0, overlap);
        part_pipedream(gvqPipeSpectrain, gvqPredictSchedule, 0, overlap);
    }
    part_pipedream(gvqPipeSpectrain, gvqPredictSchedule, 1, 1);
    return mt_finish("test_pipeline");
}
