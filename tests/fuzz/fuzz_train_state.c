/*
 * fuzz_train_state.c -- libFuzzer target: gvqTrainLoad (the training layer's saved state) on any
 * bytes.
 *
 *   input: | selector | saved state ... |      (fuzz_common.h)
 *   selector % 3 picks a training layer made once per process and stepped into a real state:
 *     0 a GradiVeQ conv, a QSGD fc and a bucketed bias (compressor states inside)
 *     1 a sparse table on the allgatherv route (the table inside)
 *     2 a sparse table on the parameter-server route (this rank's shards inside)
 *
 * A refused load must leave the layer as it was; an accepted one must leave it working: one step
 * and a save succeed. Then the layer's own state is loaded back, so every input starts from the
 * same state. Seeds: the three real states, as saved and with the reseal bit.
 */
#include <stddef.h>

#include "fuzz_common.h"
#include "gvq_train.h"

#define NSUBJ 3
#define CHECKSUM_AT 8 /* trainer_save.c's header: magic, version, then the checksum */

static gvqTrainer_t layer[NSUBJ];
static int ids[NSUBJ][3];
static char *orig[NSUBJ];
static size_t orig_n[NSUBJ];
static float conv[8 * 2 * 3 * 3], fc[4 * 16], bias[4], rows[3 * 4];
static const int64_t idx[3] = {1, 7, 30};

static void step(int k, int t) {
    for (size_t i = 0; i < sizeof conv / sizeof *conv; i++)
        conv[i] = (float)((i * 7 + (size_t)t) % 11) - 5.0f;
    for (size_t i = 0; i < sizeof fc / sizeof *fc; i++)
        fc[i] = (float)((i * 3 + (size_t)t) % 5) - 2.0f;
    for (size_t i = 0; i < 4; i++)
        bias[i] = 1.0f;
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        rows[i] = (float)(i % 4) + 0.5f * (float)t;
    if (k == 0) {
        FUZZ_OK(gvqTrainGradReady(layer[k], ids[k][0], fc));
        FUZZ_OK(gvqTrainGradReady(layer[k], ids[k][1], bias));
        FUZZ_OK(gvqTrainGradReady(layer[k], ids[k][2], conv));
    } else {
        FUZZ_OK(gvqTrainGradReady(layer[k], ids[k][1], bias));
        FUZZ_OK(gvqTrainSparseReady(layer[k], ids[k][0], idx, rows, 3));
    }
    FUZZ_OK(gvqTrainWaitAll(layer[k]));
}

static void add(int k, int slot, const char *name, int kind, int a, int b, int c, int d,
                const gvqCompressorConfig_t *cc) {
    gvqVariable_t v = GVQ_VARIABLE_INITIALIZER;
    v.name = name;
    v.kind = kind;
    v.shape[0] = a;
    v.shape[1] = b;
    v.shape[2] = c;
    v.shape[3] = d;
    v.compressor = cc;
    FUZZ_OK(gvqTrainAddVariable(layer[k], &v, &ids[k][slot]));
}

static void make_subject(int k) {
    gvqTrainConfig_t cfg = GVQ_TRAIN_CONFIG_INITIALIZER;
    cfg.sparseRoute = k == 2 ? gvqRoutePs : gvqRouteAllGatherv;
    FUZZ_OK(gvqTrainCreate(fuzz_comm(), &cfg, &layer[k]));
    if (k == 0) {
        gvqCompressorConfig_t gq = GVQ_COMPRESSOR_CONFIG_INITIALIZER, qs = gq;
        gq.codec = gvqCodecGradiveq;
        gq.sampleIters = 2;
        gq.compressedIters = 50;
        gq.sampleSlices = 0;
        gq.voteThreshold = 1.0f;
        qs.codec = gvqCodecQsgd;
        qs.errorFeedback = 1;
        add(k, 0, "fc", gvqVarFc, 4, 16, 0, 0, &qs);
        add(k, 1, "bias", gvqVarDense, 4, 0, 0, 0, NULL);
        add(k, 2, "conv", gvqVarConv, 8, 2, 3, 3, &gq);
    } else {
        gvqVariable_t v = GVQ_VARIABLE_INITIALIZER;
        gvqPsConfig_t pc = GVQ_PS_CONFIG_INITIALIZER;
        pc.rule = gvqPsMomentum;
        v.name = "emb";
        v.kind = gvqVarSparse;
        v.shape[0] = 40;
        v.shape[1] = 4;
        v.sparse = &pc;
        FUZZ_OK(gvqTrainAddVariable(layer[k], &v, &ids[k][0]));
        add(k, 1, "bias", gvqVarDense, 4, 0, 0, 0, NULL);
    }
    FUZZ_OK(gvqTrainCommit(layer[k]));
    for (int t = 0; t < 4; t++)
        step(k, t);
    FUZZ_OK(gvqTrainSave(layer[k], NULL, &orig_n[k]));
    orig[k] = malloc(orig_n[k]);
    FUZZ_OK(gvqTrainSave(layer[k], orig[k], &orig_n[k]));
}

static const char *subject_name(int k) {
    static const char *names[NSUBJ] = {"dense", "sparse_allgatherv", "sparse_ps"};
    return names[k];
}

static gvqResult_t load(int k, const void *buf, size_t n) {
    return gvqTrainLoad(layer[k], buf, n);
}

/* An accepted load must leave the handle working. */
static void exercise(int k) {
    step(k, 100);
    size_t m = 0;
    FUZZ_OK(gvqTrainSave(layer[k], NULL, &m));
    char *again = malloc(m);
    FUZZ_OK(gvqTrainSave(layer[k], again, &m));
    free(again);
}

static const fuzz_state_target_t target = {
    NSUBJ, CHECKSUM_AT, "gvqTrainLoad", make_subject, subject_name, load, exercise, orig, orig_n};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_state_init(&target);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_state_one(&target, data, size);
    return 0;
}
