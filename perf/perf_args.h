/*
 * perf_args.h -- the command line of gvq-perf's allreduce benchmarks (perf_args.c): the codecs,
 * datatypes and ops it names, and the options every benchmark file reads.
 */
#ifndef PERF_ARGS_H_
#define PERF_ARGS_H_

#include <stddef.h>

#include "gvq.h"

typedef enum {
    CODEC_NONE,
    CODEC_MPI,
    CODEC_GRADIVEQ,
    CODEC_QSGD,
    CODEC_POWERSGD,
    NUM_CODECS
} codec_t;

extern const char *const perf_codec_names[NUM_CODECS]; /* "none", "mpi", "gradiveq", "qsgd",
                                                         "powersgd" */

/* The collectives of -k, as nccl-tests has one benchmark each: gvq's call (codec none) against
 * its MPI counterpart (codec mpi); the compressed codecs run in allreduce only. */
typedef enum {
    COLL_ALLREDUCE,     /* gvqAllReduce      MPI_Allreduce */
    COLL_REDUCESCATTER, /* gvqReduceScatter  MPI_Reduce_scatter_block */
    COLL_ALLGATHER,     /* gvqAllGather      MPI_Allgather */
    COLL_BROADCAST,     /* gvqBroadcast      MPI_Bcast */
    COLL_REDUCE,        /* gvqReduce         MPI_Reduce */
    COLL_SENDRECV,      /* gvqSend+gvqRecv   MPI_Sendrecv, each rank to the next in a ring */
    NUM_COLLS
} coll_t;

extern const char *const perf_coll_names[NUM_COLLS];     /* "allreduce", "reducescatter", ... */
extern const char *const perf_coll_mpi_names[NUM_COLLS]; /* "MPI_Allreduce", ... */

/* The collective reduces (takes -o); the others only move data. */
static inline int coll_reduces(coll_t c) {
    return c == COLL_ALLREDUCE || c == COLL_REDUCESCATTER || c == COLL_REDUCE;
}

/* The collective takes a root (-r). */
static inline int coll_rooted(coll_t c) {
    return c == COLL_BROADCAST || c == COLL_REDUCE;
}
extern const char *const perf_op_names[gvqNumOps]; /* "sum", "prod", "max", "min", "avg" */

/* Codecs that go through gvqAllReduceCompressed (float32 gradients, lossy). */
static inline int codec_is_lossy(codec_t c) {
    return c == CODEC_GRADIVEQ || c == CODEC_QSGD || c == CODEC_POWERSGD;
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

/* The collectives of -k, each once, in the order given. */
typedef struct {
    int n;
    coll_t list[NUM_COLLS];
} coll_list_t;

typedef struct {
    size_t minbytes, maxbytes;
    int factor;
    int iters, warmup, check;
    const dtype_info_t *dt;
    gvqRedOp_t op;
    codec_list_t codecs;
    coll_list_t colls;
    coll_t coll;  /* the collective that runs now (the driver sets it from colls) */
    int root;     /* broadcast, reduce */
    int progress; /* 1: the progress line on stderr (when it is a terminal); --no-progress: 0 */
    const char *csv;
    /* compressed codecs (gvqCompressorConfig_t); S and W: GVQ_CONFIG_UNDEF_INT = library default */
    int L, dmax, T, S, W;
    double eps;
    int qbits, qbucket, sample_qsgd, sample_slices;
    int prank;   /* --power-rank: PowerSGD's r */
    double vote; /* -1: library default */
    int wire;    /* --wire: 0 fp32, 1 fp16 (GradiVeQ), 8 or 16: integer-summed (both codecs) */
    int basis;   /* --basis: 0 fit (the paper's phases), 1 track (gvqBasisTrack) */
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
