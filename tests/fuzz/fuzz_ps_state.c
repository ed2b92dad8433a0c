/*
 * fuzz_ps_state.c -- libFuzzer target: gvqPsLoad on any bytes.
 *
 *   input: | selector | saved state ... |      (fuzz_common.h)
 *   selector % 2 picks a parameter server made once per process, with pending gradient sums:
 *     0 Adagrad, gvqFloat32, 10 x 3, one shard
 *     1 momentum, gvqFloat64, 9 x 2, three shards (contiguous)
 *
 * A refused load must leave the shards as they were; an accepted one must leave the server
 * working: apply, push, apply, pull and save succeed. Then the server's own state is loaded
 * back, so every input starts from the same state. Seeds: the two real states, as saved and
 * with the reseal bit (GVQ_FUZZ_WRITE_SEEDS).
 */
#include <math.h>

#include "fuzz_common.h"

#define NSUBJ 2
#define CHECKSUM_AT (12 * 8) /* ps_save.c: the header's 13th word */

typedef struct {
    const char *name;
    int rule, dtype, partitions;
    size_t rows, dim;
} subject_cfg_t;

static const subject_cfg_t subjects[NSUBJ] = {
    {"adagrad", gvqPsAdagrad, gvqFloat32, 1, 10, 3},
    {"momentum", gvqPsMomentum, gvqFloat64, 3, 9, 2},
};

static gvqPs_t ps[NSUBJ];
static char *orig[NSUBJ];
static size_t orig_n[NSUBJ];

static void push(int k, const int64_t *idx, size_t n, int t) {
    double g[64];
    float gf[64];
    for (size_t i = 0; i < n * subjects[k].dim; i++)
        g[i] = sin(0.9 * (double)i + t), gf[i] = (float)g[i];
    FUZZ_OK(gvqPsPush(ps[k], idx,
                      subjects[k].dtype == gvqFloat32 ? (const void *)gf : (const void *)g, n));
}

static void make_subject(int k) {
    const subject_cfg_t *s = &subjects[k];
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    cfg.rule = s->rule;
    cfg.partitions = s->partitions;
    cfg.partitioning = gvqPsContiguous;
    cfg.init = gvqPsInitUniform;
    cfg.seed = 7;
    FUZZ_OK(gvqPsCreate(fuzz_comm(), s->rows, s->dim, s->dtype, &cfg, &ps[k]));
    int64_t a[3] = {1, 4, 7}, b[2] = {2, 4};
    push(k, a, 3, 0);
    FUZZ_OK(gvqPsApply(ps[k]));
    push(k, b, 2, 1); /* pending sums travel with the state */
    FUZZ_OK(gvqPsSave(ps[k], NULL, &orig_n[k]));
    orig[k] = malloc(orig_n[k]);
    FUZZ_OK(gvqPsSave(ps[k], orig[k], &orig_n[k]));
}

static const char *subject_name(int k) {
    return subjects[k].name;
}

static gvqResult_t load(int k, const void *buf, size_t n) {
    return gvqPsLoad(ps[k], buf, n);
}

/* An accepted load must leave the handle working. */
static void exercise(int k) {
    const subject_cfg_t *s = &subjects[k];
    int64_t all[16], a[2] = {0, 3};
    for (size_t i = 0; i < s->rows; i++)
        all[i] = (int64_t)i;
    double vals[16 * 3];
    FUZZ_OK(gvqPsApply(ps[k]));
    push(k, a, 2, 2);
    FUZZ_OK(gvqPsApply(ps[k]));
    FUZZ_OK(gvqPsPull(ps[k], all, vals, s->rows));
    size_t m = 0;
    FUZZ_OK(gvqPsSave(ps[k], NULL, &m));
}

static const fuzz_state_target_t target = {
    NSUBJ, CHECKSUM_AT, "gvqPsLoad", make_subject, subject_name, load, exercise, orig, orig_n};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_state_init(&target);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_state_one(&target, data, size);
    return 0;
}
