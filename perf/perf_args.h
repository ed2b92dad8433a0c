/*
 * perf_args.h -- the command line of gvq-perf's allreduce benchmarks (perf_args.c): the codecs,
 * datatypes and ops it names, and the options every benchmark file reads.
 */
#ifndef PERF_ARGS_H_
#define PERF_ARGS_H_

#include <stddef.h>

#include "gvq.h"

typedef enum { CODEC_NONE, CODEC_MPI, CODEC_GRADIVEQ, CODEC_QSGD, NUM_CODECS } codec_t;

extern const char *const perf_codec_names[NUM_CODECS]; /* "none", "mpi", "gradiveq", "qsgd" */
extern const char *const perf_op_names[gvqNumOps];     /* "sum", "prod", "max", "min", "avg" */

/* Codecs that go through gvqAllReduceCompressed (float32 gradients, lossy). */
static inline int codec_is_lossy(codec_t c) {
    return c == CODEC_GRADIVEQ || c == CODEC_QSGD;
}

typedef struct {
    const char *name;
    gvqDataType_t type;
    size_t size;
    int is_float;
    double avg_tol; /* relative tolerance of the avg check: 1e-3, or the type's own rounding */
} dtype_info_t;

/* The codecs of -C, each once, in the order given. */
typedef struct {
    int n;
    codec_t list[NUM_CODECS];
} codec_list_t;

typedef struct {
    size_t minbytes, maxbytes;
    int factor;
    int iters, warmup, check;
    const dtype_info_t *dt;
    gvqRedOp_t op;
    codec_list_t codecs;
    const char *csv;
    /* compressed codecs (gvqCompressorConfig_t); S and W: GVQ_CONFIG_UNDEF_INT = library default */
    int L, dmax, T, S, W;
    double eps;
    int qbits, qbucket, sample_qsgd, sample_slices;
    double vote; /* -1: library default */
    int wire;    /* --wire: 0 fp32, 1 fp16 (GradiVeQ), 8 or 16: integer-summed (both codecs) */
    /* gradient source */
    unsigned long long seed;
    int grad_rank;
    double noise, variation;
    const char *replay, *write_replay, *state_dir;
    int replay_iters;
    /* extra reports */
    int overlap, fit_bench, fit_reps;
} opts_t;

/* Parses gvq-perf's options (gvq-perf -h) into o, defaults filled in. Returns 0 to run, 1 to
 * exit with success (help), 2 to exit with an argument error. Every rank parses the same argv
 * and so reaches the same answer; only `verbose` prints. */
int perf_parse_args(int argc, char **argv, opts_t *o, int verbose);

/* The largest number of directions r <= dmax whose T-sample fit keeps them all at loss threshold
 * eps (the synthetic source's default --grad-rank). */
int perf_grad_rank_auto(int T, int dmax, double eps);

#endif /* PERF_ARGS_H_ */
