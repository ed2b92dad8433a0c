/*
 * test_train_layer.c -- the training layer (gvq_train.h) on 1..4 in-process ranks: the routing
 * table (compressed, bucketed, alone; bucket boundaries), sums against a closed form over
 * several steps with and without wait-free backprop (bitwise the same both ways), the
 * timeline's order (with wait-free backprop the first aggregation starts before the last
 * gradient is ready; without it, after), the negotiated schedule (gvqTrainScheduleForward, 4 KiB
 * chunks) waited variable by variable in forward order, bitwise the same sums, sufficient factors
 * against the full matrix and SACP's choice, and the refusals: ready twice, bad ids, late
 * registrations, ranks that registered different variables, a variable never made ready.
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "gvq_test.h"
#include "gvq_train.h"

/* The model, in backward order. */
enum { NV = 6 };
static const struct {
    const char *name;
    int kind;
    int shape[4];
} model[NV] = {
    {"fc.w", gvqVarFc, {10, 64, 0, 0}},       /* 640 values: bucketed */
    {"fc.b", gvqVarDense, {10, 0, 0, 0}},     /* bucketed */
    {"conv2.w", gvqVarConv, {16, 8, 3, 3}},   /* 1152: the conv compressor */
    {"conv2.b", gvqVarDense, {16, 0, 0, 0}},  /* bucketed */
    {"embed", gvqVarDense, {70000, 0, 0, 0}}, /* 280 000 B: alone */
    {"conv1.w", gvqVarConv, {8, 1, 3, 3}},    /* 72: the conv compressor */
};

static float value(int rank, int step, int v, size_t i) {
    return (float)((rank + 1) * (v + 2) + step * 3 + (int)(i % 7));
}

typedef struct {
    int inline_calls; /* the transport says it cannot run calls from two threads */
    int wait_free;
    int bucket_bytes;
    int schedule;    /* gvqTrainSchedule_t; forward: waits per variable in forward order */
    float *out[NV];  /* rank 0's results of the last step, kept for the comparison */
    int compare;     /* 1: rank 0 compares its results with out[] */
    double order_ok; /* set by rank 0: the timeline's order held */
} run_t;

/* Registers the model's variables and commits. */
static void register_model(gvqTrainer_t t, int *ids) {
    for (int v = 0; v < NV; v++) {
        gvqVariable_t var = GVQ_VARIABLE_INITIALIZER;
        var.name = model[v].name;
        var.kind = model[v].kind;
        memcpy(var.shape, model[v].shape, sizeof var.shape);
        EXPECT_RES(gvqTrainAddVariable(t, &var, &ids[v]), gvqSuccess);
        EXPECT(ids[v] == v, "id %d for variable %d", ids[v], v);
    }
    EXPECT_RES(gvqTrainCommit(t), gvqSuccess);
}

static gvqTrainer_t make_layer(gvqComm_t comm, const run_t *r, int *ids) {
    gvqCompressorConfig_t conv = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    conv.codec = gvqCodecGradiveq; /* sampling with codec none: the exact sum */
    conv.sampleIters = 1000;
    gvqTrainConfig_t cfg = GVQ_TRAIN_CONFIG_INITIALIZER;
    cfg.bucketBytes = r->bucket_bytes;
    cfg.waitFree = r->wait_free;
    cfg.schedule = r->schedule;
    cfg.chunkBytes = 4096;
    cfg.op = gvqSum;
    cfg.convCompressor = &conv;
    gvqTrainer_t t = NULL;
    if (r->inline_calls) comm->xport->concurrent = 0; /* as MPI below MPI_THREAD_MULTIPLE */
    EXPECT_RES(gvqTrainCreate(comm, &cfg, &t), gvqSuccess);
    register_model(t, ids);
    return t;
}

static size_t count_of(int v) {
    size_t n = 1;
    int dims = model[v].kind == gvqVarConv ? 4 : model[v].kind == gvqVarFc ? 2 : 1;
    for (int d = 0; d < dims; d++)
        n *= (size_t)model[v].shape[d];
    return n;
}

static void rank_steps(gvqComm_t comm, int rank, int nranks, void *arg) {
    run_t *r = arg;
    int ids[NV];
    gvqTrainer_t t = make_layer(comm, r, ids);
    if (t == NULL) return;
    /* the routes */
    static const int want_route[NV] = {gvqRouteBucket, gvqRouteBucket,    gvqRouteCompressed,
                                       gvqRouteBucket, gvqRouteAllReduce, gvqRouteCompressed};
    for (int v = 0; v < NV; v++) {
        gvqTrainVariableInfo_t info;
        EXPECT_RES(gvqTrainGetVariableInfo(t, v, &info), gvqSuccess);
        EXPECT(info.route == want_route[v], "%s: route %d want %d (%s)", model[v].name, info.route,
               want_route[v], info.why);
        EXPECT(info.count == count_of(v), "%s: count %zu", model[v].name, info.count);
        if (v == 2) EXPECT(info.codec == gvqCodecGradiveq, "conv2 codec %d", info.codec);
    }
    gvqTrainVariableInfo_t a, b, c;
    gvqTrainGetVariableInfo(t, 0, &a);
    gvqTrainGetVariableInfo(t, 1, &b);
    gvqTrainGetVariableInfo(t, 3, &c);
    if (r->bucket_bytes >= 4096) /* fc.w + fc.b + conv2.b = 2664 B: one bucket */
        EXPECT(a.bucket == 0 && b.bucket == 0 && c.bucket == 0, "buckets %d %d %d", a.bucket,
               b.bucket, c.bucket);
    else /* 2620 B: fc.w and fc.b (2600 B) fill the first, conv2.b opens the second */
        EXPECT(a.bucket == 0 && b.bucket == 0 && c.bucket == 1, "buckets %d %d %d", a.bucket,
               b.bucket, c.bucket);

    float *g[NV];
    for (int v = 0; v < NV; v++)
        g[v] = malloc(count_of(v) * sizeof(float));
    enum { STEPS = 3 };
    for (int step = 0; step < STEPS; step++) {
        for (int v = 0; v < NV; v++) { /* "backprop": a layer's gradient, then some compute */
            for (size_t i = 0; i < count_of(v); i++)
                g[v][i] = value(rank, step, v, i);
            EXPECT_RES(gvqTrainGradReady(t, ids[v], g[v]), gvqSuccess);
            /* time for the stream to start what is ready before the last gradient comes */
            if (step == STEPS - 1 && v == NV - 2) usleep(100000);
        }
        for (int v = NV - 1; v >= 0 && r->schedule == gvqTrainScheduleForward; v--)
            EXPECT_RES(gvqTrainWaitVariable(t, ids[v]), gvqSuccess);
        EXPECT_RES(gvqTrainWaitAll(t), gvqSuccess);
        for (int v = 0; v < NV; v++) {
            int bad = 0;
            for (size_t i = 0; i < count_of(v) && bad < 2; i++) {
                float want = 0;
                for (int q = 0; q < nranks; q++)
                    want += value(q, step, v, i);
                if (g[v][i] != want) {
                    bad++;
                    EXPECT(0, "n=%d wf=%d step %d %s[%zu]: got %g want %g", nranks, r->wait_free,
                           step, model[v].name, i, g[v][i], want);
                }
            }
        }
    }
    /* the last step's timeline: every variable ran; with wait-free backprop the first
     * aggregation started before the last gradient was ready, without it after */
    double first_start = 1e300, last_ready = 0;
    for (int v = 0; v < NV; v++) {
        gvqTrainVariableInfo_t info;
        gvqTrainGetVariableInfo(t, v, &info);
        EXPECT(info.startTime > 0 && info.endTime >= info.startTime && info.steps == STEPS,
               "%s: start %g end %g steps %lld", model[v].name, info.startTime, info.endTime,
               info.steps);
        if (info.startTime < first_start) first_start = info.startTime;
        if (info.readyTime > last_ready) last_ready = info.readyTime;
    }
    if (r->wait_free && !r->inline_calls)
        EXPECT(first_start < last_ready,
               "wait-free: the first aggregation started %.3f s after "
               "the last gradient was ready",
               first_start - last_ready);
    else if (!r->wait_free)
        EXPECT(first_start >= last_ready,
               "sequential: an aggregation started %.3f s before the "
               "last gradient was ready",
               last_ready - first_start);
    if (rank == 0) {
        for (int v = 0; v < NV; v++) {
            if (r->compare)
                EXPECT(memcmp(r->out[v], g[v], count_of(v) * sizeof(float)) == 0,
                       "%s differs between wait-free and sequential", model[v].name);
            else
                memcpy(r->out[v], g[v], count_of(v) * sizeof(float));
        }
    }
    for (int v = 0; v < NV; v++)
        free(g[v]);
    EXPECT_RES(gvqTrainDestroy(t), gvqSuccess);
}

static void rank_misuse(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)arg;
    run_t r = {0, 1, 4096, gvqTrainScheduleReady, {NULL}, 0, 0};
    int ids[NV];
    gvqTrainer_t t = make_layer(comm, &r, ids);
    if (t == NULL) return;
    gvqVariable_t late = GVQ_VARIABLE_INITIALIZER;
    late.name = "late";
    late.kind = gvqVarDense;
    late.shape[0] = 4;
    int id;
    EXPECT_RES(gvqTrainAddVariable(t, &late, &id), gvqInvalidUsage);
    EXPECT_RES(gvqTrainCommit(t), gvqInvalidUsage);
    float *g[NV];
    for (int v = 0; v < NV; v++)
        g[v] = calloc(count_of(v), sizeof(float));
    EXPECT_RES(gvqTrainGradReady(t, NV, g[0]), gvqInvalidArgument);
    EXPECT_RES(gvqTrainGradReady(t, 0, NULL), gvqInvalidArgument);
    EXPECT_RES(gvqTrainGradReady(t, 0, g[0]), gvqSuccess);
    EXPECT_RES(gvqTrainGradReady(t, 0, g[0]), gvqInvalidUsage); /* twice */
    EXPECT(strstr(gvqGetLastError(comm), "fc.w") != NULL, "WARN: %s", gvqGetLastError(comm));
    /* every rank leaves out conv1.w (the last): reported, nothing hangs */
    for (int v = 1; v < NV - 1; v++)
        EXPECT_RES(gvqTrainGradReady(t, v, g[v]), gvqSuccess);
    EXPECT_RES(gvqTrainWaitAll(t), gvqInvalidUsage);
    EXPECT(strstr(gvqGetLastError(comm), "conv1.w") != NULL, "WARN: %s", gvqGetLastError(comm));
    /* the next step is whole again */
    for (int v = 0; v < NV; v++) {
        for (size_t i = 0; i < count_of(v); i++)
            g[v][i] = (float)rank;
        EXPECT_RES(gvqTrainGradReady(t, v, g[v]), gvqSuccess);
    }
    EXPECT_RES(gvqTrainWaitAll(t), gvqSuccess);
    EXPECT(g[NV - 1][0] == (float)(nranks * (nranks - 1) / 2), "after a bad step: %g",
           g[NV - 1][0]);
    for (int v = 0; v < NV; v++)
        free(g[v]);
    EXPECT_RES(gvqTrainDestroy(t), gvqSuccess);
    EXPECT_RES(gvqTrainDestroy(t), gvqInvalidArgument);

    /* bad variables and configs */
    gvqTrainer_t u;
    gvqTrainConfig_t cfg = GVQ_TRAIN_CONFIG_INITIALIZER;
    cfg.waitFree = 2;
    EXPECT_RES(gvqTrainCreate(comm, &cfg, &u), gvqInvalidArgument);
    EXPECT_RES(gvqTrainCreate(NULL, NULL, &u), gvqInvalidArgument);
    EXPECT_RES(gvqTrainCreate(comm, NULL, &u), gvqSuccess);
    gvqVariable_t bad = GVQ_VARIABLE_INITIALIZER;
    bad.name = "bad";
    bad.kind = gvqVarConv;
    bad.shape[0] = 4; /* D, H, W missing */
    EXPECT_RES(gvqTrainAddVariable(u, &bad, &id), gvqInvalidArgument);
    bad.kind = 7;
    EXPECT_RES(gvqTrainAddVariable(u, &bad, &id), gvqInvalidArgument);
    EXPECT_RES(gvqTrainGradReady(u, 0, g[0]), gvqInvalidUsage); /* before commit */
    /* ranks that register different variables: commit fails on every rank */
    gvqVariable_t w = GVQ_VARIABLE_INITIALIZER;
    w.kind = gvqVarDense;
    w.name = "same";
    w.shape[0] = 8;
    EXPECT_RES(gvqTrainAddVariable(u, &w, &id), gvqSuccess);
    w.name = "differs";
    w.shape[0] = rank == nranks - 1 ? 9 : 8;
    EXPECT_RES(gvqTrainAddVariable(u, &w, &id), gvqSuccess);
    EXPECT_RES(gvqTrainCommit(u), nranks > 1 ? gvqInvalidArgument : gvqSuccess);
    if (nranks > 1)
        EXPECT(strstr(gvqGetLastError(comm), "number 1") != NULL, "WARN: %s",
               gvqGetLastError(comm));
    EXPECT_RES(gvqTrainDestroy(u), gvqSuccess);

    /* the same variables with different settings on one rank: commit fails on every rank */
    gvqTrainConfig_t differs = GVQ_TRAIN_CONFIG_INITIALIZER;
    differs.bucketBytes = rank == nranks - 1 ? 1024 : 2048;
    EXPECT_RES(gvqTrainCreate(comm, &differs, &u), gvqSuccess);
    w.shape[0] = 8;
    EXPECT_RES(gvqTrainAddVariable(u, &w, &id), gvqSuccess);
    EXPECT_RES(gvqTrainCommit(u), nranks > 1 ? gvqInvalidArgument : gvqSuccess);
    if (nranks > 1)
        EXPECT(strstr(gvqGetLastError(comm), "settings") != NULL, "WARN: %s",
               gvqGetLastError(comm));
    EXPECT_RES(gvqTrainDestroy(u), gvqSuccess);

    /* inside a user's group the layer refuses (its own calls would join the group) */
    EXPECT_RES(gvqTrainCreate(comm, NULL, &u), gvqSuccess);
    EXPECT_RES(gvqTrainAddVariable(u, &w, &id), gvqSuccess);
    EXPECT_RES(gvqGroupStart(), gvqSuccess);
    EXPECT_RES(gvqTrainCommit(u), gvqInvalidUsage);
    EXPECT_RES(gvqGroupEnd(), gvqSuccess);
    EXPECT_RES(gvqTrainCommit(u), gvqSuccess);
    float wb[8] = {0};
    EXPECT_RES(gvqGroupStart(), gvqSuccess);
    EXPECT_RES(gvqTrainGradReady(u, id, wb), gvqInvalidUsage);
    EXPECT_RES(gvqGroupEnd(), gvqSuccess);
    EXPECT_RES(gvqTrainDestroy(u), gvqSuccess);

    /* a compressor config the shape does not allow is refused at commit, naming the variable */
    gvqCompressorConfig_t cc = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cc.codec = gvqCodecGradiveq;
    cc.sliceSize = 7; /* not a multiple of K = 4 */
    EXPECT_RES(gvqTrainCreate(comm, NULL, &u), gvqSuccess);
    gvqVariable_t cv = GVQ_VARIABLE_INITIALIZER;
    cv.name = "conv.bad";
    cv.kind = gvqVarConv;
    cv.shape[0] = 4;
    cv.shape[1] = 2;
    cv.shape[2] = cv.shape[3] = 3;
    cv.compressor = &cc;
    EXPECT_RES(gvqTrainAddVariable(u, &cv, &id), gvqSuccess);
    EXPECT_RES(gvqTrainCommit(u), gvqInvalidArgument);
    EXPECT(strstr(gvqGetLastError(comm), "conv.bad") != NULL, "WARN: %s", gvqGetLastError(comm));
    EXPECT_RES(gvqTrainDestroy(u), gvqSuccess);
}

/* ---- sufficient factors ------------------------------------------------------------------ */

static float factor(int rank, int j, int i, int which) {
    return (float)(((rank + 1) * 31 + j * 7 + i * 3 + which * 11) % 17 - 8) / 8.0f;
}

/* An fc variable of M x N given as factors of batch b: every sfb setting (always, never, SACP)
 * must give the double-precision sum over ranks and samples, bitwise alike on every rank, and
 * SACP must pick SFB exactly when it sends fewer bytes. */
typedef struct {
    int M, N, b;
    float *out[3][16]; /* per sfb setting, per rank */
} sfb_run_t;

static void rank_sfb(gvqComm_t comm, int rank, int nranks, void *arg) {
    sfb_run_t *r = arg;
    const int M = r->M, N = r->N, b = r->b;
    float *u = malloc((size_t)b * M * sizeof(float)), *v = malloc((size_t)b * N * sizeof(float));
    for (int j = 0; j < b; j++) {
        for (int i = 0; i < M; i++)
            u[j * M + i] = factor(rank, j, i, 0);
        for (int i = 0; i < N; i++)
            v[j * N + i] = factor(rank, j, i, 1);
    }
    static const int settings[3] = {1, 0, GVQ_CONFIG_UNDEF_INT};
    for (int k = 0; k < 3; k++) {
        gvqTrainConfig_t cfg = GVQ_TRAIN_CONFIG_INITIALIZER;
        cfg.sfb = settings[k];
        cfg.op = gvqSum;
        gvqTrainer_t t;
        EXPECT_RES(gvqTrainCreate(comm, &cfg, &t), gvqSuccess);
        gvqVariable_t var = GVQ_VARIABLE_INITIALIZER;
        var.name = "fc.w";
        var.kind = gvqVarFc;
        var.shape[0] = M;
        var.shape[1] = N;
        var.factors = 1;
        int id, bid;
        EXPECT_RES(gvqTrainAddVariable(t, &var, &id), gvqSuccess);
        gvqVariable_t bias = GVQ_VARIABLE_INITIALIZER;
        bias.name = "fc.b";
        bias.kind = gvqVarDense;
        bias.shape[0] = M;
        EXPECT_RES(gvqTrainAddVariable(t, &bias, &bid), gvqSuccess);
        EXPECT_RES(gvqTrainCommit(t), gvqSuccess);
        float *g = r->out[k][rank], *gb = calloc((size_t)M, sizeof(float));
        EXPECT_RES(gvqTrainFactorsReady(t, bid, u, v, b, g), gvqInvalidArgument); /* not fc */
        EXPECT_RES(gvqTrainFactorsReady(t, id, u, v, 0, g), gvqInvalidArgument);
        EXPECT_RES(gvqTrainFactorsReady(t, id, u, v, b, g), gvqSuccess);
        EXPECT_RES(gvqTrainGradReady(t, bid, gb), gvqSuccess);
        EXPECT_RES(gvqTrainWaitAll(t), gvqSuccess);
        gvqTrainVariableInfo_t info;
        EXPECT_RES(gvqTrainGetVariableInfo(t, id, &info), gvqSuccess);
        double sfb_bytes = (nranks - 1.0) * b * (M + N) * 4,
               full_bytes = 2.0 * (nranks - 1) / nranks * M * N * 4;
        int want = settings[k] == 1 ? 1 : settings[k] == 0 ? 0 : sfb_bytes < full_bytes;
        EXPECT((info.route == gvqRouteSfb) == want, "n=%d M=%d N=%d b=%d sfb=%d: route %d (%s)",
               nranks, M, N, b, settings[k], info.route, info.why);
        int bad = 0;
        for (int i = 0; i < M && bad < 2; i++)
            for (int c = 0; c < N && bad < 2; c++) {
                double want_v = 0;
                for (int q = 0; q < nranks; q++)
                    for (int j = 0; j < b; j++)
                        want_v += (double)factor(q, j, i, 0) * factor(q, j, c, 1);
                if (fabs(g[i * N + c] - want_v) > 1e-4 * (1 + fabs(want_v)) && bad++ < 2)
                    EXPECT(0, "n=%d sfb=%d grad[%d][%d] = %g want %g", nranks, settings[k], i, c,
                           g[i * N + c], want_v);
            }
        free(gb);
        EXPECT_RES(gvqTrainDestroy(t), gvqSuccess);
    }
    free(u);
    free(v);
}

static void test_sfb(int nranks, int M, int N, int b) {
    sfb_run_t r = {M, N, b, {{NULL}}};
    for (int k = 0; k < 3; k++)
        for (int q = 0; q < nranks; q++)
            r.out[k][q] = malloc((size_t)M * N * sizeof(float));
    gvq_test_run(nranks, NULL, rank_sfb, &r);
    for (int k = 0; k < 3; k++)
        for (int q = 1; q < nranks; q++)
            EXPECT(memcmp(r.out[k][0], r.out[k][q], (size_t)M * N * sizeof(float)) == 0,
                   "sfb setting %d: rank %d's gradient differs from rank 0's", k, q);
    for (int k = 0; k < 3; k++)
        for (int q = 0; q < nranks; q++)
            free(r.out[k][q]);
}

/* ---- saved state: a run stopped after 6 steps and resumed ends as one that was not --------- */

typedef struct {
    int resume;     /* 0: run 12 steps, saving after 6; 1: load, run steps 7..12 */
    void *state[8]; /* per rank, saved by the first run */
    size_t state_bytes[8];
    float *out[8][NV]; /* per rank, the last step's results */
} resume_t;

static gvqTrainer_t resumable_layer(gvqComm_t comm, int *ids, int conv_d) {
    gvqCompressorConfig_t gq = GVQ_COMPRESSOR_CONFIG_INITIALIZER, qs = gq;
    gq.codec = gvqCodecGradiveq;
    gq.sampleIters = 3;
    gq.compressedIters = 4;
    gq.sampleSlices = 0;
    gq.voteThreshold = 1.0f;
    gq.maxDims = conv_d;
    qs.codec = gvqCodecQsgd;
    gvqTrainConfig_t cfg = GVQ_TRAIN_CONFIG_INITIALIZER;
    cfg.convCompressor = &gq;
    cfg.fcCompressor = &qs;
    gvqTrainer_t t = NULL;
    EXPECT_RES(gvqTrainCreate(comm, &cfg, &t), gvqSuccess);
    register_model(t, ids);
    return t;
}

static void steps(gvqTrainer_t t, const int *ids, int rank, int from, int to, float **g) {
    for (int step = from; step < to; step++) {
        for (int v = 0; v < NV; v++) {
            for (size_t i = 0; i < count_of(v); i++) { /* noise: no codec is exact on it */
                uint32_t h = (uint32_t)(rank * 7919 + step * 104729 + v * 1299709) ^
                             (uint32_t)i * 2654435761u;
                h ^= h >> 13;
                h *= 0x5bd1e995u;
                h ^= h >> 15;
                g[v][i] = (float)(h % 20001u) / 10000.0f - 1.0f;
            }
            EXPECT_RES(gvqTrainGradReady(t, ids[v], g[v]), gvqSuccess);
        }
        EXPECT_RES(gvqTrainWaitAll(t), gvqSuccess);
    }
}

static void rank_resume(gvqComm_t comm, int rank, int nranks, void *arg) {
    resume_t *r = arg;
    int ids[NV];
    gvqTrainer_t t = resumable_layer(comm, ids, 4);
    float *g[NV];
    for (int v = 0; v < NV; v++)
        g[v] = malloc(count_of(v) * sizeof(float));
    if (!r->resume) {
        steps(t, ids, rank, 0, 6, g);
        size_t n = 0;
        EXPECT_RES(gvqTrainSave(t, NULL, &n), gvqSuccess);
        r->state[rank] = malloc(n);
        r->state_bytes[rank] = n;
        size_t small = n - 1;
        EXPECT_RES(gvqTrainSave(t, r->state[rank], &small), gvqInvalidArgument);
        EXPECT_RES(gvqTrainSave(t, r->state[rank], &n), gvqSuccess);
        steps(t, ids, rank, 6, 12, g);
    } else {
        char *bad = malloc(r->state_bytes[rank]);
        memcpy(bad, r->state[rank], r->state_bytes[rank]);
        bad[r->state_bytes[rank] / 2] ^= 0x10; /* a flipped bit */
        EXPECT_RES(gvqTrainLoad(t, bad, r->state_bytes[rank]), gvqInvalidArgument);
        EXPECT_RES(gvqTrainLoad(t, r->state[rank], r->state_bytes[rank] - 8), gvqInvalidArgument);
        EXPECT_RES(gvqTrainLoadShared(t, bad, r->state_bytes[rank]), gvqInvalidArgument);
        free(bad);
        /* a newcomer's load of another rank's state; the rank's own load below replaces it */
        int from = (rank + 1) % nranks;
        EXPECT_RES(gvqTrainLoadShared(t, r->state[from], r->state_bytes[from]), gvqSuccess);
        /* a layer whose GradiVeQ keeps fewer dimensions refuses the state: nothing changes */
        int ids2[NV];
        gvqTrainer_t other = resumable_layer(comm, ids2, 2);
        EXPECT_RES(gvqTrainLoad(other, r->state[rank], r->state_bytes[rank]), gvqInvalidArgument);
        EXPECT_RES(gvqTrainDestroy(other), gvqSuccess);
        EXPECT_RES(gvqTrainLoad(t, r->state[rank], r->state_bytes[rank]), gvqSuccess);
        gvqTrainVariableInfo_t info;
        EXPECT_RES(gvqTrainGetVariableInfo(t, ids[2], &info), gvqSuccess);
        EXPECT(info.steps == 6, "restored steps %lld", info.steps);
        steps(t, ids, rank, 6, 12, g);
    }
    for (int v = 0; v < NV; v++) {
        if (!r->resume)
            r->out[rank][v] = g[v];
        else {
            EXPECT(memcmp(r->out[rank][v], g[v], count_of(v) * sizeof(float)) == 0,
                   "rank %d %s: the resumed run ends differently", rank, model[v].name);
            free(g[v]);
        }
    }
    EXPECT_RES(gvqTrainDestroy(t), gvqSuccess);
}

static void test_resume(int nranks) {
    resume_t r;
    memset(&r, 0, sizeof r);
    gvq_test_run(nranks, NULL, rank_resume, &r);
    r.resume = 1;
    gvq_test_run(nranks, NULL, rank_resume, &r);
    for (int q = 0; q < nranks; q++) {
        free(r.state[q]);
        for (int v = 0; v < NV; v++)
            free(r.out[q][v]);
    }
}

/* ---- sparse variables: every route gives the same table ---------------------------------- */

enum { ROWS = 50, DIM = 3, SSTEPS = 3 };

typedef struct {
    int route;                  /* config sparseRoute (GVQ_CONFIG_UNDEF_INT: the rule) */
    float table[8][ROWS * DIM]; /* per rank, after the steps */
} sparse_run_t;

static void sparse_rows(int rank, int step, int64_t *idx, float *g) {
    idx[0] = rank;
    idx[1] = (rank * 7 + step) % ROWS;
    idx[2] = 10; /* every rank: a shared row */
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < DIM; j++)
            g[i * DIM + j] = (float)(1 + rank + step + i * 2 + j);
}

/* A layer with a dense variable b and a sparse one emb (SGD, lr 1/2: exact updates). */
static gvqTrainer_t sparse_layer(gvqComm_t comm, int route, int *ide, int *idb) {
    gvqTrainConfig_t cfg = GVQ_TRAIN_CONFIG_INITIALIZER;
    cfg.sparseRoute = route;
    gvqTrainer_t t = NULL;
    EXPECT_RES(gvqTrainCreate(comm, &cfg, &t), gvqSuccess);
    gvqPsConfig_t pc = GVQ_PS_CONFIG_INITIALIZER;
    pc.learningRate = 0.5; /* exact: every update is a multiple of 1/2 */
    gvqVariable_t emb = GVQ_VARIABLE_INITIALIZER, b = GVQ_VARIABLE_INITIALIZER;
    emb.name = "emb";
    emb.kind = gvqVarSparse;
    emb.shape[0] = ROWS;
    emb.shape[1] = DIM;
    emb.sparse = &pc;
    b.name = "b";
    b.kind = gvqVarDense;
    b.shape[0] = 5;
    EXPECT_RES(gvqTrainAddVariable(t, &b, idb), gvqSuccess);
    EXPECT_RES(gvqTrainAddVariable(t, &emb, ide), gvqSuccess);
    EXPECT_RES(gvqTrainCommit(t), gvqSuccess);
    return t;
}

static void sparse_steps(gvqTrainer_t t, int ide, int idb, int rank, int from, int to) {
    float gb[5], g[3 * DIM];
    int64_t idx[3];
    for (int step = from; step < to; step++) {
        sparse_rows(rank, step, idx, g);
        for (int i = 0; i < 5; i++)
            gb[i] = 1.0f;
        EXPECT_RES(gvqTrainGradReady(t, idb, gb), gvqSuccess);
        EXPECT_RES(gvqTrainSparseReady(t, ide, idx, g, 3), gvqSuccess);
        EXPECT_RES(gvqTrainWaitAll(t), gvqSuccess);
    }
}

static void rank_sparse(gvqComm_t comm, int rank, int nranks, void *arg) {
    sparse_run_t *r = arg;
    int ide, idb;
    gvqTrainer_t t = sparse_layer(comm, r->route, &ide, &idb);
    float gb[5] = {1, 1, 1, 1, 1}, g[3 * DIM];
    int64_t idx[3];
    sparse_steps(t, ide, idb, rank, 0, SSTEPS);
    gvqTrainVariableInfo_t info;
    EXPECT_RES(gvqTrainGetVariableInfo(t, ide, &info), gvqSuccess);
    int want = r->route != GVQ_CONFIG_UNDEF_INT ? r->route
               : nranks == 1                    ? gvqRouteAllReduce  /* nothing to send */
               : nranks == 2                    ? gvqRouteAllGatherv /* a tie with the PS */
                                                : gvqRoutePs;
    EXPECT(info.route == want, "n=%d sparseRoute %d: route %d want %d (%s)", nranks, r->route,
           info.route, want, info.why);
    EXPECT(nranks == 1 || info.wireBytes > 0, "no bytes counted (%s)", info.why);
    if (info.route == gvqRoutePs) /* Parallax's partition tuner ran at the first step */
        EXPECT(strstr(info.why, "tuned") != NULL, "no tuning: %s", info.why);
    /* a step with an out-of-range row on rank 0 fails on every rank and changes nothing */
    int64_t all[ROWS];
    for (int i = 0; i < ROWS; i++)
        all[i] = i;
    float before[ROWS * DIM];
    EXPECT_RES(gvqTrainSparseLookup(t, ide, all, ROWS, before), gvqSuccess);
    sparse_rows(rank, 0, idx, g);
    if (rank == 0) idx[1] = ROWS + 3;
    EXPECT_RES(gvqTrainGradReady(t, idb, gb), gvqSuccess);
    gvqResult_t res = gvqTrainSparseReady(t, ide, idx, g, 3);
    gvqResult_t waited = gvqTrainWaitAll(t);
    EXPECT(res != gvqSuccess || waited != gvqSuccess, "n=%d route %d: a bad row was accepted",
           nranks, info.route);
    EXPECT_RES(gvqTrainSparseLookup(t, ide, all, ROWS, r->table[rank]), gvqSuccess);
    EXPECT(memcmp(before, r->table[rank], sizeof before) == 0,
           "n=%d route %d rank %d: the refused step changed rows", nranks, info.route, rank);
    EXPECT_RES(gvqTrainDestroy(t), gvqSuccess);
}

static void test_sparse(int nranks) {
    static const int routes[4] = {gvqRoutePs, gvqRouteAllGatherv, gvqRouteAllReduce,
                                  GVQ_CONFIG_UNDEF_INT};
    float want[ROWS * DIM] = {0};
    for (int q = 0; q < nranks; q++)
        for (int step = 0; step < SSTEPS; step++) {
            int64_t idx[3];
            float g[3 * DIM];
            sparse_rows(q, step, idx, g);
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < DIM; j++)
                    want[idx[i] * DIM + j] -= 0.5f * g[i * DIM + j];
        }
    for (int k = 0; k < 4; k++) {
        sparse_run_t r;
        memset(&r, 0, sizeof r);
        r.route = routes[k];
        gvq_test_run(nranks, NULL, rank_sparse, &r);
        for (int q = 0; q < nranks; q++)
            EXPECT(memcmp(r.table[q], want, sizeof want) == 0,
                   "n=%d sparseRoute %d rank %d: the table is not the closed form", nranks,
                   routes[k], q);
    }
}

/* A run with a sparse variable stopped after 2 steps and resumed from its saved state ends
 * with the table of a run that was not stopped, on every route. */
typedef struct {
    int route, resume;
    void *state[8];
    size_t bytes[8];
    float table[8][ROWS * DIM];
} sparse_resume_t;

static void rank_sparse_resume(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)nranks;
    sparse_resume_t *r = arg;
    int ide, idb;
    gvqTrainer_t t = sparse_layer(comm, r->route, &ide, &idb);
    if (!r->resume) {
        sparse_steps(t, ide, idb, rank, 0, 2);
        EXPECT_RES(gvqTrainSave(t, NULL, &r->bytes[rank]), gvqSuccess);
        r->state[rank] = malloc(r->bytes[rank]);
        EXPECT_RES(gvqTrainSave(t, r->state[rank], &r->bytes[rank]), gvqSuccess);
    } else { /* a sparse variable's table or shards are not another rank's to take */
        EXPECT_RES(gvqTrainLoadShared(t, r->state[rank], r->bytes[rank]), gvqInvalidUsage);
        EXPECT_RES(gvqTrainLoad(t, r->state[rank], r->bytes[rank]), gvqSuccess);
    }
    sparse_steps(t, ide, idb, rank, 2, 4);
    int64_t all[ROWS];
    for (int i = 0; i < ROWS; i++)
        all[i] = i;
    float table[ROWS * DIM];
    EXPECT_RES(gvqTrainSparseLookup(t, ide, all, ROWS, table), gvqSuccess);
    if (!r->resume)
        memcpy(r->table[rank], table, sizeof table);
    else
        EXPECT(memcmp(r->table[rank], table, sizeof table) == 0,
               "route %d rank %d: the resumed table differs", r->route, rank);
    EXPECT_RES(gvqTrainDestroy(t), gvqSuccess);
}

static void test_sparse_resume(int nranks) {
    static const int routes[4] = {gvqRoutePs, gvqRouteAllGatherv, gvqRouteAllReduce,
                                  GVQ_CONFIG_UNDEF_INT};
    for (int k = 0; k < 4; k++) {
        sparse_resume_t *r = calloc(1, sizeof *r);
        r->route = routes[k];
        gvq_test_run(nranks, NULL, rank_sparse_resume, r);
        r->resume = 1;
        gvq_test_run(nranks, NULL, rank_sparse_resume, r);
        for (int q = 0; q < nranks; q++)
            free(r->state[q]);
        free(r);
    }
}

/* The negotiated schedule destroyed in the middle of a step (every rank handed over only
 * variable 4 of 6, alone in 69 chunks): the negotiation ends, every rank's destroy returns without
 * a hang and reports the step's failure. */
static void rank_destroy_mid_step(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)rank, (void)nranks, (void)arg;
    run_t r = {0, 1, 4096, gvqTrainScheduleForward, {NULL}, 0, 0};
    int ids[NV];
    gvqTrainer_t t = make_layer(comm, &r, ids);
    if (t == NULL) return;
    float *g = calloc(count_of(4), sizeof(float));
    EXPECT_RES(gvqTrainGradReady(t, ids[4], g), gvqSuccess);
    EXPECT_RES(gvqTrainWaitVariable(t, ids[4]), gvqSuccess); /* it alone is agreed */
    EXPECT_RES(gvqTrainDestroy(t), gvqInvalidUsage);
    free(g);
}

/* A committed layer of two plain dense variables of 64 floats, v0 and v1 (ids), or NULL. */
static gvqTrainer_t two_variables(gvqComm_t comm, const gvqTrainConfig_t *cfg, int *ids) {
    gvqTrainer_t t = NULL;
    EXPECT_RES(gvqTrainCreate(comm, cfg, &t), gvqSuccess);
    if (t == NULL) return NULL;
    for (int v = 0; v < 2; v++) {
        gvqVariable_t var = GVQ_VARIABLE_INITIALIZER;
        var.name = v ? "v1" : "v0";
        var.kind = gvqVarDense;
        var.shape[0] = 64;
        EXPECT_RES(gvqTrainAddVariable(t, &var, &ids[v]), gvqSuccess);
    }
    EXPECT_RES(gvqTrainCommit(t), gvqSuccess);
    return t;
}

/* The negotiated schedule when the last rank leaves a variable out of step 0, two plain dense
 * variables (bucketed: one unit; or alone: two units). bucketed: the step fails on every rank
 * (the other ranks' job must not pair with the last rank's next step), and step 1 sums right.
 * alone, variable 0 left out: rank 0 waits for it with gvqTrainWaitVariable, which must fail,
 * not hang (the last rank closed its step without it). */
static void rank_left_out(gvqComm_t comm, int rank, int nranks, void *arg) {
    const int alone = *(const int *)arg, skip = alone ? 0 : 1, last = nranks - 1;
    gvqTrainConfig_t cfg = GVQ_TRAIN_CONFIG_INITIALIZER;
    cfg.schedule = gvqTrainScheduleForward;
    cfg.op = gvqSum;
    cfg.bucketBytes = alone ? 0 : 1 << 20;
    int ids[2];
    gvqTrainer_t t = two_variables(comm, &cfg, ids);
    if (t == NULL) return;
    float g[2][64];
    for (int step = 0; step < 2; step++) {
        for (int i = 0; i < 128; i++)
            g[i / 64][i % 64] = (float)(100 * step + rank + 1);
        for (int v = 0; v < 2; v++)
            if (!(step == 0 && rank == last && v == skip))
                EXPECT_RES(gvqTrainGradReady(t, ids[v], g[v]), gvqSuccess);
        if (step == 0 && alone && rank == 0 && nranks > 1)
            EXPECT(gvqTrainWaitVariable(t, ids[0]) != gvqSuccess,
                   "waiting for a variable another rank left out succeeded");
        gvqResult_t res = gvqTrainWaitAll(t);
        if (step == 0) {
            EXPECT(res != gvqSuccess, "rank %d: step 0 without '%s' on rank %d succeeded", rank,
                   skip ? "v1" : "v0", last);
            continue;
        }
        EXPECT_RES(res, gvqSuccess);
        float want = 0;
        for (int q = 0; q < nranks; q++)
            want += (float)(100 * step + q + 1);
        int bad = 0;
        for (int i = 0; i < 128; i++)
            bad += g[i / 64][i % 64] != want;
        EXPECT(bad == 0, "rank %d step %d: %d sums differ from %g", rank, step, bad, want);
    }
    EXPECT_RES(gvqTrainDestroy(t), gvqSuccess);
}

static void test_left_out(int nranks) {
    gvqConfig_t c = GVQ_CONFIG_INITIALIZER;
    c.timeoutMs = 5000; /* a hang would show as this timeout's failure, not pass */
    for (int alone = 0; alone < 2; alone++)
        gvq_test_run(nranks, &c, rank_left_out, &alone);
}

/* The negotiated schedule, rank 0's communicator aborted in the middle of a step (its job
 * waits for the step's next gradient): rank 0's gvqTrainWaitAll fails at once, the other ranks'
 * by the communicator's timeout; none hangs, and every destroy returns. */
static void rank_abort_mid_step(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)nranks, (void)arg;
    gvqTrainConfig_t cfg = GVQ_TRAIN_CONFIG_INITIALIZER;
    cfg.schedule = gvqTrainScheduleForward;
    cfg.bucketBytes = 0;
    int ids[2];
    gvqTrainer_t t = two_variables(comm, &cfg, ids);
    if (t == NULL) return;
    float g[64] = {0};
    EXPECT_RES(gvqTrainGradReady(t, ids[0], g), gvqSuccess);
    EXPECT_RES(gvqTrainWaitVariable(t, ids[0]), gvqSuccess);
    if (rank == 0) {
        usleep(20000); /* the job is waiting for v1 */
        EXPECT_RES(gvqCommAbort(comm), gvqSuccess);
    }
    EXPECT(gvqTrainWaitAll(t) != gvqSuccess, "rank %d: the aborted step succeeded", rank);
    (void)gvqTrainDestroy(t);
}

/* A config of the layout before `schedule` (callers built against the older header): its size,
 * tail padding in, is accepted; the padding's bytes never become the new fields; other sizes are
 * refused. */
typedef struct {
    size_t size;
    unsigned int magic, version;
    int bucketBytes, waitFree, op;
    const gvqCompressorConfig_t *convCompressor, *fcCompressor;
    int sfb, sparseRoute, tunePartitions;
} old_train_config_t;

static void test_old_config(void) {
    gvqComm_t comm;
    EXPECT_RES(gvq_comm_init_inproc(1, NULL, &comm), gvqSuccess);
    for (int pad = 0; pad < 3; pad++) {
        unsigned char raw[sizeof(gvqTrainConfig_t)];
        memset(raw, pad == 0 ? 0 : pad == 1 ? 0x01 : 0x07, sizeof raw); /* the padding's bytes */
        old_train_config_t c = {sizeof(old_train_config_t),
                                GVQ_TRAIN_CONFIG_MAGIC,
                                GVQ_VERSION,
                                GVQ_CONFIG_UNDEF_INT,
                                GVQ_CONFIG_UNDEF_INT,
                                GVQ_CONFIG_UNDEF_INT,
                                NULL,
                                NULL,
                                GVQ_CONFIG_UNDEF_INT,
                                GVQ_CONFIG_UNDEF_INT,
                                GVQ_CONFIG_UNDEF_INT};
        memcpy(raw, &c, offsetof(old_train_config_t, tunePartitions) + sizeof(int));
        gvqTrainer_t t = NULL;
        EXPECT_RES(gvqTrainCreate(comm, (const gvqTrainConfig_t *)raw, &t), gvqSuccess);
        if (t == NULL) continue;
        /* the ready schedule, whatever the padding held: a compressed variable's info is
         * answered in the middle of a step (the negotiated schedule refuses it) */
        gvqCompressorConfig_t cc = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
        cc.codec = gvqCodecQsgd;
        gvqVariable_t v = GVQ_VARIABLE_INITIALIZER;
        int ids[2];
        v.name = "plain";
        v.kind = gvqVarDense;
        v.shape[0] = 16;
        EXPECT_RES(gvqTrainAddVariable(t, &v, &ids[0]), gvqSuccess);
        v.name = "conv";
        v.kind = gvqVarConv;
        v.shape[0] = 4, v.shape[1] = 2, v.shape[2] = v.shape[3] = 3;
        v.compressor = &cc;
        EXPECT_RES(gvqTrainAddVariable(t, &v, &ids[1]), gvqSuccess);
        EXPECT_RES(gvqTrainCommit(t), gvqSuccess);
        float g[72] = {0};
        gvqTrainVariableInfo_t info;
        EXPECT_RES(gvqTrainGradReady(t, ids[0], g), gvqSuccess);
        EXPECT_RES(gvqTrainGetVariableInfo(t, ids[1], &info), gvqSuccess);
        EXPECT_RES(gvqTrainGradReady(t, ids[1], g), gvqSuccess);
        EXPECT_RES(gvqTrainWaitAll(t), gvqSuccess);
        EXPECT_RES(gvqTrainDestroy(t), gvqSuccess);
    }
    gvqTrainConfig_t odd = GVQ_TRAIN_CONFIG_INITIALIZER;
    odd.size = sizeof(old_train_config_t) + 4;
    gvqTrainer_t t = NULL;
    EXPECT_RES(gvqTrainCreate(comm, &odd, &t), gvqInvalidArgument);
    EXPECT_RES(gvqCommDestroy(comm), gvqSuccess);
}

/* A layer whose communicator was aborted refuses its calls (never touches the freed
 * communicator, as ASan checks) and is destroyed cleanly. */
static void test_after_abort(void) {
    gvqComm_t comm;
    EXPECT_RES(gvq_comm_init_inproc(1, NULL, &comm), gvqSuccess);
    gvqTrainer_t t;
    EXPECT_RES(gvqTrainCreate(comm, NULL, &t), gvqSuccess);
    gvqVariable_t w = GVQ_VARIABLE_INITIALIZER;
    w.name = "w";
    w.kind = gvqVarDense;
    w.shape[0] = 16;
    int id;
    float g[16] = {0};
    EXPECT_RES(gvqTrainAddVariable(t, &w, &id), gvqSuccess);
    EXPECT_RES(gvqTrainCommit(t), gvqSuccess);
    EXPECT_RES(gvqTrainGradReady(t, id, g), gvqSuccess);
    EXPECT_RES(gvqTrainWaitAll(t), gvqSuccess);
    EXPECT_RES(gvqCommAbort(comm), gvqSuccess);
    EXPECT_RES(gvqTrainGradReady(t, id, g), gvqInvalidUsage);
    EXPECT_RES(gvqTrainWaitAll(t), gvqInvalidUsage);
    EXPECT_RES(gvqTrainDestroy(t), gvqSuccess);
}

int main(void) {
    for (int n = 1; n <= 4; n++) {
        for (int bb = 0; bb < 2; bb++) {
            run_t r = {0, 1, bb ? 4096 : 2620, gvqTrainScheduleReady, {NULL}, 0, 0};
            for (int v = 0; v < NV; v++)
                r.out[v] = malloc(count_of(v) * sizeof(float));
            gvq_test_run(n, NULL, rank_steps, &r);
            r.wait_free = 0;
            r.compare = 1;
            gvq_test_run(n, NULL, rank_steps, &r);
            r.wait_free = 1; /* negotiated, cut into chunks, waited in forward order */
            r.schedule = gvqTrainScheduleForward;
            gvq_test_run(n, NULL, rank_steps, &r);
            r.inline_calls = 1; /* no stream: at once on the caller's thread, the same sums */
            gvq_test_run(n, NULL, rank_steps, &r);
            r.schedule = gvqTrainScheduleReady;
            gvq_test_run(n, NULL, rank_steps, &r);
            for (int v = 0; v < NV; v++)
                free(r.out[v]);
        }
        gvq_test_run(n, NULL, rank_misuse, NULL);
        gvq_test_run(n, NULL, rank_destroy_mid_step, NULL);
        test_left_out(n);
        test_sfb(n, 20, 30, 3);  /* SACP: SFB from 2 ranks */
        test_sfb(n, 20, 30, 40); /* SACP: the full matrix */
        test_resume(n);
        test_sparse(n);
        test_sparse_resume(n);
    }
    test_after_abort();
    test_old_config();
    gvqConfig_t c = GVQ_CONFIG_INITIALIZER;
    c.timeoutMs = 2000; /* the other ranks' bound */
    for (int n = 1; n <= 3; n++)
        gvq_test_run(n, &c, rank_abort_mid_step, NULL);
    return gvq_test_finish("test_train_layer");
}
