/*
 * test_train_layer_mpi.c -- the training layer (gvq_train.h) over Open MPI: a model of conv, fc
 * and dense variables (QSGD on the convs, PowerSGD on the fc, the rest plain in buckets) for a
 * few steps with and without wait-free backprop. The plain variables must equal MPI_Allreduce's
 * average; every variable must be bitwise identical on every rank and bitwise the same with and
 * without wait-free backprop (the same calls in the same order).
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

/* Runs STEPS steps; out[v] receives the last step's results. */
static void run(gvqComm_t comm, int wait_free, float **out) {
    gvqCompressorConfig_t cc[NV];
    gvqTrainConfig_t cfg = GVQ_TRAIN_CONFIG_INITIALIZER;
    cfg.waitFree = wait_free;
    gvqTrainer_t t = NULL;
    MT_OK(gvqTrainCreate(comm, &cfg, &t));
    int ids[NV];
    for (int v = 0; v < NV; v++) {
        gvqVariable_t var = GVQ_VARIABLE_INITIALIZER;
        var.name = model[v].name;
        var.kind = model[v].kind;
        memcpy(var.shape, model[v].shape, sizeof var.shape);
        gvqCompressorConfig_t init = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
        cc[v] = init;
        cc[v].codec = model[v].codec;
        cc[v].powerRank = 2;
        if (model[v].codec != gvqCodecNone) var.compressor = &cc[v];
        MT_OK(gvqTrainAddVariable(t, &var, &ids[v]));
    }
    MT_OK(gvqTrainCommit(t));
    for (int step = 0; step < STEPS; step++) {
        for (int v = 0; v < NV; v++) {
            for (size_t i = 0; i < count_of(v); i++)
                out[v][i] = value(step, v, i);
            MT_OK(gvqTrainGradReady(t, ids[v], out[v]));
        }
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

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    gvqComm_t comm = mt_new_comm();
    float *wf[NV], *seq[NV], *ref[NV];
    for (int v = 0; v < NV; v++) {
        wf[v] = malloc(count_of(v) * sizeof(float));
        seq[v] = malloc(count_of(v) * sizeof(float));
        ref[v] = malloc(count_of(v) * sizeof(float));
    }
    mt_part("wait-free backprop", 120);
    run(comm, 1, wf);
    mt_part("aggregation after backprop", 120);
    run(comm, 0, seq);
    mt_part("checks", 60);
    for (int v = 0; v < NV; v++) {
        size_t n = count_of(v);
        MT_CHECK(mt_identical(wf[v], n * sizeof(float)), "%s differs between ranks", model[v].name);
        MT_CHECK(memcmp(wf[v], seq[v], n * sizeof(float)) == 0,
                 "%s: wait-free and after-backprop results differ", model[v].name);
        if (model[v].codec != gvqCodecNone) continue;
        for (size_t i = 0; i < n; i++)
            ref[v][i] = value(STEPS - 1, v, i);
        MPI_Allreduce(MPI_IN_PLACE, ref[v], (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += fabsf(wf[v][i] - ref[v][i] / (float)mt.nranks) > 1e-5f;
        MT_CHECK(bad == 0, "%s: %zu values differ from MPI_Allreduce's average", model[v].name,
                 bad);
    }
    for (int v = 0; v < NV; v++) {
        free(wf[v]);
        free(seq[v]);
        free(ref[v]);
    }
    MT_OK(gvqCommDestroy(comm));
    return mt_finish("test_train_layer_mpi");
}
