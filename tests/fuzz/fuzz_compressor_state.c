/*
 * fuzz_compressor_state.c -- libFuzzer target: gvqCompressorLoad on any bytes.
 *
 *   input: | selector | saved state ... |      (fuzz_common.h)
 *   selector % 5 picks a compressor made once per process and driven into a real state:
 *     0 GradiVeQ + error feedback, fitted (compressed phase, d > 0)
 *     1 GradiVeQ with a warm-up, in the middle of sampling
 *     2 QSGD + error feedback
 *     3 PowerSGD rank 2 + error feedback (warm-start Q, residual)
 *     4 GradiVeQ with a tracked basis (gvqBasisTrack: U, residual)
 *
 * A refused load must leave the compressor as it was; an accepted one must leave it working:
 * one compressed allreduce and a save succeed. Then the compressor's own state is loaded back,
 * so every input starts from the same state. Seeds: the five real states, as saved and with
 * the reseal bit (GVQ_FUZZ_WRITE_SEEDS).
 */
#include <math.h>
#include <stddef.h>

#include "fuzz_common.h"
#include "gvq_compressor.h"

#define NSUBJ 5
#define SL 16

typedef struct {
    const char *name;
    size_t count;
    int codec, warmup, calls, track;
} subject_cfg_t;

static const subject_cfg_t subjects[NSUBJ] = {
    {"gradiveq", SL * 8, gvqCodecGradiveq, 0, 6},
    {"gradiveq_sampling", SL * 8 + 5, gvqCodecGradiveq, 2, 4},
    {"qsgd", 100, gvqCodecQsgd, 0, 3},
    {"powersgd", 96, gvqCodecPowersgd, 0, 3},
    {"gradiveq_track", SL * 8, gvqCodecGradiveq, 0, 3, 1},
};

static gvqCompressor_t comp[NSUBJ];
static char *orig[NSUBJ];
static size_t orig_n[NSUBJ];
static float *x, *y;

/* compressor_save.c's header: the checksum is its last word (offsetof(comp_hdr_t, checksum)). */
typedef struct {
    uint64_t magic, bytes;
    gvq_comp_cfg_t cfg;
    gvq_comp_state_t st;
    uint64_t ngroups, checksum;
} comp_hdr_t;

static void call(int k, int t) {
    for (size_t i = 0; i < subjects[k].count; i++) {
        double ph = 6.283185307179586 * (double)(i % SL) / SL, s = (double)(i / SL);
        x[i] = (float)(sin(0.7 * t + s) * cos(ph) + cos(1.3 * t + 0.5 * s) * sin(ph) +
                       0.01 * sin(3.1 * (double)i + t));
    }
    FUZZ_OK(gvqAllReduceCompressed(x, y, subjects[k].count, gvqFloat32, gvqSum, comp[k],
                                   fuzz_comm(), NULL));
}

static void make_subject(int k) {
    const subject_cfg_t *s = &subjects[k];
    gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cfg.codec = s->codec;
    cfg.errorFeedback = 1;
    if (s->codec == gvqCodecGradiveq) {
        cfg.sliceSize = SL;
        cfg.warmupIters = s->warmup;
        cfg.sampleIters = 4;
        cfg.compressedIters = 50;
        cfg.voteThreshold = 1;
    }
    if (s->codec == gvqCodecPowersgd) cfg.powerRank = 2;
    if (s->track) cfg.basisUpdate = gvqBasisTrack;
    FUZZ_OK(gvqCompressorCreate(fuzz_comm(), s->count, &cfg, &comp[k]));
    for (int t = 0; t < s->calls; t++)
        call(k, t);
    FUZZ_OK(gvqCompressorSave(comp[k], NULL, &orig_n[k]));
    orig[k] = malloc(orig_n[k]);
    FUZZ_OK(gvqCompressorSave(comp[k], orig[k], &orig_n[k]));
}

static const char *subject_name(int k) {
    return subjects[k].name;
}

static gvqResult_t load(int k, const void *buf, size_t n) {
    return gvqCompressorLoad(comp[k], buf, n);
}

/* An accepted load must leave the handle working. */
static void exercise(int k) {
    call(k, 100);
    size_t m = 0;
    FUZZ_OK(gvqCompressorSave(comp[k], NULL, &m));
    char *again = malloc(m);
    FUZZ_OK(gvqCompressorSave(comp[k], again, &m));
    free(again);
}

static const fuzz_state_target_t target = {NSUBJ,
                                           offsetof(comp_hdr_t, checksum),
                                           "gvqCompressorLoad",
                                           make_subject,
                                           subject_name,
                                           load,
                                           exercise,
                                           orig,
                                           orig_n};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    x = malloc(sizeof(float) * 256), y = malloc(sizeof(float) * 256);
    fuzz_state_init(&target);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_state_one(&target, data, size);
    return 0;
}
