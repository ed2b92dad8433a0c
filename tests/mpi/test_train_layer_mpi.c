/*
 * test_train_layer_mpi.c -- the training layer (gvq_train.h) over Open MPI: a model of conv, fc
 * and dense variables (QSGD on the convs, PowerSGD on the fc, the rest plain in buckets) for a
 * few steps with and without wait-free backprop. The plain variables must equal MPI_Allreduce's
 * average; every variable must be bitwise identical on every rank and bitwise the same with and
 * without wait-free backprop (the same calls in the same order). The negotiated schedule
 * (gvqTrainScheduleForward, plain ones cut into 4 KiB chunks), waited variable by variable in
 * forward order: the compressed ones bitwise those of the ready schedule, the plain ones
 * MPI_Allreduce's average; a step in which rank 0 leaves a variable out fails on every rank
 * without a hang, and the next step is whole again. Then two conv variables with
 * GradiVeQ's tracked basis (16-bit wire) beside a plain one: the layer aggregates them in one
 * fused group (GVQ_TRAIN_FUSE_COMPRESSED, default 1), whose results must be bitwise those of the
 * same two calls made by hand inside gvqGroupStart/gvqGroupEnd on compressors of the same config.
 */
#include <math.h>

#include "gvq_train.h"
#include "mpitest.h"

enum { NV = 7, STEPS = 4 };
static const struct {
    const char *name;
    int kind;
    int shape[4];
    int codec; /* gvqCodec_t of the variable (gvqCodecNone: plain) */
} model[NV] = {
    {"fc2.w", gvqVarFc, {10, 128, 0, 0}, gvqCodecPowersgd},
    {"fc2.b", gvqVarDense, {10, 0, 0, 0}, gvqCodecNone},
    {"fc1.w", gvqVarFc, {128, 576, 0, 0}, gvqCodecNone}, /* 295 KB: alone */
    {"fc1.b", gvqVarDense, {128, 0, 0, 0}, gvqCodecNone},
    {"conv2.w", gvqVarConv, {64, 32, 3, 3}, gvqCodecQsgd},
    {"conv2.b", gvqVarDense, {64, 0, 0, 0}, gvqCodecNone},
    {"conv1.w", gvqVarConv, {32, 1, 3, 3}, gvqCodecNone}, /* 1 KB: bucketed */
};

static size_t count_of(int v) {
    size_t n = 1;
    int dims = model[v].kind == gvqVarConv ? 4 : model[v].kind == gvqVarFc ? 2 : 1;
    for (int d = 0; d < dims; d++)
        n *= (size_t)model[v].shape[d];
    return n;
}

static float value(int step, int v, size_t i) {
    uint32_t h =
        (uint32_t)(mt.rank * 7919 + step * 104729 + v * 1299709) ^ (uint32_t)i * 2654435761u;
    h ^= h >> 15;
    return (float)(h % 2001) / 1000.0f - 1.0f;
}

/* A committed layer of the model's variables (ids), with their codecs or all plain. */
static gvqTrainer_t make_layer(gvqComm_t comm, const gvqTrainConfig_t *cfg, int codecs, int *ids) {
    gvqCompressorConfig_t cc[NV];
    gvqTrainer_t t = NULL;
    MT_OK(gvqTrainCreate(comm, cfg, &t));
    for (int v = 0; v < NV; v++) {
        gvqVariable_t var = GVQ_VARIABLE_INITIALIZER;
        var.name = model[v].name;
        var.kind = model[v].kind;
        memcpy(var.shape, model[v].shape, sizeof var.shape);
        gvqCompressorConfig_t init = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
        cc[v] = init;
        cc[v].codec = model[v].codec;
        cc[v].powerRank = 2;
        if (codecs && model[v].codec != gvqCodecNone) var.compressor = &cc[v];
        MT_OK(gvqTrainAddVariable(t, &var, &ids[v]));
    }
    MT_OK(gvqTrainCommit(t));
    return t;
}

/* The negotiated schedule, plain variables: gvqTrainWaitVariable's refusals; a step in which
 * rank 0 leaves variable 3 out (a bucket's member) fails on every rank, and the next step is
 * whole (the sum of ones: nranks). */
static void run_faults(gvqComm_t comm, float **out) {
    gvqTrainConfig_t cfg = GVQ_TRAIN_CONFIG_INITIALIZER;
    cfg.schedule = gvqTrainScheduleForward;
    cfg.chunkBytes = 4096;
    cfg.op = gvqSum;
    int ids[NV];
    gvqTrainer_t t = make_layer(comm, &cfg, 0, ids);
    MT_CHECK(gvqTrainWaitVariable(t, NV + 3) == gvqInvalidArgument, "a bad id is refused");
    MT_CHECK(gvqTrainWaitVariable(t, ids[0]) == gvqInvalidUsage,
             "a variable not ready in this step is refused");
    for (int v = 0; v < NV; v++)
        if (v != 3 || mt.rank != 0 || mt.nranks == 1) MT_OK(gvqTrainGradReady(t, ids[v], out[v]));
    gvqResult_t res = gvqTrainWaitAll(t);
    MT_CHECK(mt.nranks == 1 ? res == gvqSuccess : res == gvqInvalidUsage,
             "a step without variable 3 on rank 0: %s", gvqGetErrorString(res));
    for (int v = 0; v < NV; v++) {
        for (size_t i = 0; i < count_of(v); i++)
            out[v][i] = 1.0f;
        MT_OK(gvqTrainGradReady(t, ids[v], out[v]));
    }
    MT_OK(gvqTrainWaitAll(t));
    for (int v = 0; v < NV; v++) {
        size_t bad = 0;
        for (size_t i = 0; i < count_of(v); i++)
            bad += out[v][i] != (float)mt.nranks;
        MT_CHECK(bad == 0, "%s: %zu sums of ones differ from %d in the step after", model[v].name,
                 bad, mt.nranks);
    }
    MT_OK(gvqTrainDestroy(t));
}

/* Runs STEPS steps; out[v] receives the last step's results. With schedule forward: waits
 * variable by variable from the last registered. */
static void run(gvqComm_t comm, int wait_free, int schedule, float **out) {
    gvqTrainConfig_t cfg = GVQ_TRAIN_CONFIG_INITIALIZER;
    cfg.waitFree = wait_free;
    cfg.schedule = schedule;
    cfg.chunkBytes = 4096;
    int ids[NV];
    gvqTrainer_t t = make_layer(comm, &cfg, 1, ids);
    for (int step = 0; step < STEPS; step++) {
        for (int v = 0; v < NV; v++) {
            for (size_t i = 0; i < count_of(v); i++)
                out[v][i] = value(step, v, i);
            MT_OK(gvqTrainGradReady(t, ids[v], out[v]));
        }
        for (int v = NV - 1; v >= 0 && schedule == gvqTrainScheduleForward; v--)
            MT_OK(gvqTrainWaitVariable(t, ids[v]));
        MT_OK(gvqTrainWaitAll(t));
    }
    for (int v = 0; v < NV; v++) {
        gvqTrainVariableInfo_t info;
        MT_OK(gvqTrainGetVariableInfo(t, ids[v], &info));
        int want = model[v].codec != gvqCodecNone ? gvqRouteCompressed
                   : count_of(v) * 4 < 262144     ? gvqRouteBucket
                                                  : gvqRouteAllReduce;
        MT_CHECK(info.route == want && info.steps == STEPS,
                 "%s: route %d (want %d: %s), %lld steps", model[v].name, info.route, want,
                 info.why, info.steps);
    }
    MT_OK(gvqTrainDestroy(t));
}

/* ---- tracked-basis variables, fused ------------------------------------------------------- */

enum { NT = 3 };
static const int track_shape[NT][4] = {{16, 8, 3, 3}, {32, 16, 3, 3}, {40, 0, 0, 0}};

static size_t track_count(int v) {
    return v == 2 ? 40 : (size_t)track_shape[v][0] * (size_t)track_shape[v][1] * 9;
}

static gvqCompressorConfig_t track_config(int v) {
    gvqCompressorConfig_t cc = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cc.codec = gvqCodecGradiveq;
    cc.basisUpdate = gvqBasisTrack;
    cc.maxDims = 2;
    cc.integerBits = 16;
    cc.filters = track_shape[v][0];
    cc.depth = track_shape[v][1];
    cc.height = cc.width = 3;
    return cc;
}

static void run_tracked(gvqComm_t comm) {
    gvqTrainer_t t = NULL;
    MT_OK(gvqTrainCreate(comm, NULL, &t));
    gvqCompressorConfig_t cc[2] = {track_config(0), track_config(1)};
    gvqCompressor_t hand[2];
    int ids[NT];
    for (int v = 0; v < NT; v++) {
        gvqVariable_t var = GVQ_VARIABLE_INITIALIZER;
        var.name = v == 0 ? "conv1.w" : v == 1 ? "conv2.w" : "conv2.b";
        var.kind = v < 2 ? gvqVarConv : gvqVarDense;
        memcpy(var.shape, track_shape[v], sizeof var.shape);
        if (v < 2) {
            var.compressor = &cc[v];
            gvqCompressorConfig_t hc = cc[v]; /* the layer's rule for a variable's own config */
            hc.seed = v;                      /* without a seed: its registration index */
            MT_OK(gvqCompressorCreate(comm, track_count(v), &hc, &hand[v]));
        }
        MT_OK(gvqTrainAddVariable(t, &var, &ids[v]));
    }
    MT_OK(gvqTrainCommit(t));
    float *g[NT], *h[2];
    for (int v = 0; v < NT; v++)
        g[v] = malloc(track_count(v) * sizeof(float));
    for (int v = 0; v < 2; v++)
        h[v] = malloc(track_count(v) * sizeof(float));
    for (int step = 0; step < STEPS; step++) {
        for (int v = NT - 1; v >= 0; v--) { /* backward order: the bias first */
            for (size_t i = 0; i < track_count(v); i++)
                g[v][i] = value(step, v + NV, i);
            if (v < 2) memcpy(h[v], g[v], track_count(v) * sizeof(float));
            MT_OK(gvqTrainGradReady(t, ids[v], g[v]));
        }
        MT_OK(gvqTrainWaitAll(t));
        MT_OK(gvqGroupStart());
        for (int v = 0; v < 2; v++) /* the layer's group: registration order */
            MT_OK(gvqAllReduceCompressed(h[v], h[v], track_count(v), gvqFloat32, gvqAvg, hand[v],
                                         comm, NULL));
        MT_OK(gvqGroupEnd());
        for (int v = 0; v < 2; v++) {
            size_t n = track_count(v);
            MT_CHECK(mt_identical(g[v], n * sizeof(float)),
                     "step %d: tracked %d differs between "
                     "ranks",
                     step, v);
            MT_CHECK(memcmp(g[v], h[v], n * sizeof(float)) == 0,
                     "step %d: the layer's fused "
                     "result of tracked variable %d is not the hand-made group's",
                     step, v);
        }
    }
    for (int v = 0; v < 2; v++) {
        gvqTrainVariableInfo_t info;
        MT_OK(gvqTrainGetVariableInfo(t, ids[v], &info));
        MT_CHECK(info.route == gvqRouteCompressed && info.steps == STEPS,
                 "tracked %d: route %d (%s), %lld steps", v, info.route, info.why, info.steps);
        MT_OK(gvqCompressorDestroy(hand[v]));
        free(h[v]);
    }
    for (int v = 0; v < NT; v++)
        free(g[v]);
    MT_OK(gvqTrainDestroy(t));
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    gvqComm_t comm = mt_new_comm();
    float *wf[NV], *seq[NV], *ref[NV], *fw[NV];
    for (int v = 0; v < NV; v++) {
        wf[v] = malloc(count_of(v) * sizeof(float));
        seq[v] = malloc(count_of(v) * sizeof(float));
        ref[v] = malloc(count_of(v) * sizeof(float));
        fw[v] = malloc(count_of(v) * sizeof(float));
    }
    mt_part("wait-free backprop", 120);
    run(comm, 1, gvqTrainScheduleReady, wf);
    mt_part("aggregation after backprop", 120);
    run(comm, 0, gvqTrainScheduleReady, seq);
    mt_part("negotiated schedule, waits in forward order", 120);
    run(comm, 1, gvqTrainScheduleForward, fw);
    mt_part("negotiated schedule: refusals, a variable left out", 120);
    run_faults(comm, ref);
    mt_part("checks", 60);
    for (int v = 0; v < NV; v++) {
        size_t n = count_of(v);
        MT_CHECK(mt_identical(wf[v], n * sizeof(float)), "%s differs between ranks", model[v].name);
        MT_CHECK(memcmp(wf[v], seq[v], n * sizeof(float)) == 0,
                 "%s: wait-free and after-backprop results differ", model[v].name);
        MT_CHECK(mt_identical(fw[v], n * sizeof(float)), "%s (negotiated) differs between ranks",
                 model[v].name);
        if (model[v].codec != gvqCodecNone) {
            MT_CHECK(memcmp(wf[v], fw[v], n * sizeof(float)) == 0,
                     "%s: the negotiated schedule's result differs from the ready one's",
                     model[v].name);
            continue;
        }
        for (size_t i = 0; i < n; i++)
            ref[v][i] = value(STEPS - 1, v, i);
        MPI_Allreduce(MPI_IN_PLACE, ref[v], (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += fabsf(wf[v][i] - ref[v][i] / (float)mt.nranks) > 1e-5f;
        MT_CHECK(bad == 0, "%s: %zu values differ from MPI_Allreduce's average", model[v].name,
                 bad);
        bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += fabsf(fw[v][i] - ref[v][i] / (float)mt.nranks) > 1e-5f;
        MT_CHECK(bad == 0, "%s (negotiated): %zu values differ from MPI_Allreduce's average",
                 model[v].name, bad);
    }
    for (int v = 0; v < NV; v++) {
        free(wf[v]);
        free(seq[v]);
        free(ref[v]);
        free(fw[v]);
    }
    mt_part("tracked basis, fused", 120);
    run_tracked(comm);
    MT_OK(gvqCommDestroy(comm));
    return mt_finish("test_train_layer_mpi");
}
