/*
 * train.h -- one data-parallel training run of gvq-train's network (the cnn or the Fixup resnet
 * of net.h) over gvq (see train.c).
 *
 * Every rank of `comm` calls train_run with the same options. Each takes its shard of every
 * global batch, computes gradients, and aggregates them through gvq: every conv layer's weight
 * gradient (those inside residual blocks too, net_t.conv) through its own compressor built with
 * the layer's shape (or plain gvqAllReduce with codec none), everything else in one more call
 * (three with --rest-codec powersgd: the last fc's weights get a compressor of their own); or, in
 * zero-code mode, the whole gradient as one flat buffer through plain gvqAllReduce (so GVQ_CODEC
 * decides the codec).
 */
#ifndef GVQ_TRAIN_TRAIN_H_
#define GVQ_TRAIN_TRAIN_H_

#include <mpi.h>
#include <stdio.h>

#include "mnist.h"
#include "net.h"

typedef enum {
    TRAIN_CODEC_NONE = 0,
    TRAIN_CODEC_GRADIVEQ = 1,
    TRAIN_CODEC_QSGD = 2,
    TRAIN_CODEC_POWERSGD = 3
} train_codec_t;

#define TRAIN_UNSET (-1) /* a gvq knob left to the library's default */

typedef struct {
    /* data */
    const char *data_dir;
    int train_subset, test_subset; /* 0: all */
    /* model and optimizer */
    net_arch_t arch;
    int batch;      /* global batch, a multiple of the number of ranks (0: 32 per rank) */
    int epochs;     /* used when iters is 0 */
    long iters;     /* total steps (0: epochs x steps per epoch) */
    long stop_step; /* end after this step, the schedule still spanning all steps (0: never) */
    double lr, momentum, weight_decay;
    int cosine; /* 1: lr x (1 + cos(pi step / steps)) / 2 */
    unsigned long long seed;
    /* aggregation */
    int codec;           /* train_codec_t of the conv layers */
    int rest_codec;      /* the fc weights: TRAIN_CODEC_NONE, TRAIN_CODEC_QSGD, or
                            TRAIN_CODEC_POWERSGD (an outputs x inputs matrix); biases and the
                            blocks' scalars always plain (fused into buckets) */
    int zero_code;       /* 1: one flat gvqAllReduce of the whole gradient */
    int no_wait_free;    /* 1: the training layer aggregates after backprop, not during it */
    int overlap_forward; /* 1: a step's update made layer by layer inside the next forward pass,
                            each layer's after its aggregation (gvqTrainWaitVariable) */
    int comm_order;      /* the layer's schedule (TRAIN_UNSET: forward with overlap_forward) */
    int chunk_bytes;     /* the layer's chunkBytes (TRAIN_UNSET: the library's) */
    /* --model text (text.c): its corpus, sparse route, vocabulary and embedding width */
    int text;
    const char *text_data;
    int sparse_route;  /* the layer's sparseRoute (GVQ_CONFIG_UNDEF_INT: the rule) */
    int ps_staleness;  /* the parameter server served at any time with this SSP bound; -1: the
                          synchronous server */
    int ps_partitions; /* the parameter server's partitions, untuned; 0: the layer's tuner */
    int vocab, embed_dim;
    int sfb; /* fc weights as sufficient factors: TRAIN_UNSET no (their gradient), 0 factors
                but always the full matrix, 1 always SFB, 2 SACP's choice per step */
    int bucket_bytes;          /* the training layer's bucketBytes (TRAIN_UNSET: the library's) */
    const char *timeline_path; /* CSV of one step's per-layer compute and aggregation times */
    long timeline_step;        /* the step it records (1-based) */
    int slice, reuse, warmup, sample, compressed, sample_codec, qsgd_bits, qsgd_bucket;
    int wire_fp16, error_feedback, max_dims;
    int sample_slices; /* TRAIN_UNSET: the library default */
    double eps;
    double vote;          /* GradiVeQ early-exit threshold (0: the library's, = eps) */
    int power_rank;       /* PowerSGD's r (TRAIN_UNSET: the library's) */
    int basis_track;      /* GradiVeQ's basis: 1 tracked (gvqBasisTrack), 0 fitted (the paper) */
    int stages;           /* pipeline stages (0: data parallel; S: R x S ranks, pipe.c) */
    int micro_batches;    /* micro-batches per step of the pipeline (0: 4) */
    int pipe_schedule;    /* gvqPipeSchedule_t: 0 gpipe, 1 pipedream, 2 dualpipe, 3 spectrain */
    int predict_distance; /* gvqPipePredictDistance_t */
    int pipe_no_flush;    /* the pipeline runs on across steps (gvqPipeConfig_t.flush 0) */
    int pipe_overlap;     /* transfers on two more communicators' streams */
    int integer_bits;     /* integer-summed wire, 0, 8 or 16 (TRAIN_UNSET: the library's) */
    double ef_bound;      /* error-feedback residual clip (< 0: the library's) */
    /* what the user sees */
    int print_every; /* progress line every N steps (and a CSV row) */
    int eval_every;  /* test accuracy every N steps (a multiple of print_every; 0: at the end) */
    int check_every; /* compare weight checksums across ranks every N steps (0: at prints) */
    double stop_at;  /* stop once test accuracy reaches this (0: never) */
    const char *log_path;
    const char *dump_path;
    int dump_layer; /* conv layer (1-based, over net_t.conv) whose gradients --dump-grads records */
    long dump_iters; /* iterations to record (0: all) */
    int quiet;       /* no progress lines (tests) */
    /* --elastic K: commit every K steps; a failed call shrinks the ranks to the survivors, which
     * roll back to the last commit (train.c, "Elastic runs"). 0: a failed call ends the job. */
    int elastic;
    int replace; /* --replace: rank 0 starts a replacement per rank lost, joining at a commit */
    const char *commit_dir; /* --commit-dir: rank 0 writes every commit there (commit.h) */
    const char *resume_dir; /* --resume: start from the commit written there */
    const char *join_hex;   /* a replacement's (internal options): the grown set's unique id, */
    int join_rank, join_size, join_first; /* its rank and size, the first rank it reports */
    int argc;                             /* the command line, for the replacements */
    char **argv;
    int ndie; /* --die R:S (tests): the process first ranked R leaves at step S */
    int die_rank[8];
    long die_step[8];
    int progress; /* 1: rank 0 keeps a line with the time left on stderr (a terminal) */
    FILE *out;    /* progress lines (rank 0) */
} train_opts_t;

/* Fills defaults: the cnn with 3 convs (16, 32, 64 channels, 3x3; for the resnet the same widths
 * are its stages', 1 block per stage), global batch 64, 2 epochs, lr 0.05, momentum 0.9, codec
 * GradiVeQ with the library's schedule defaults, progress every 50 steps. */
void train_opts_default(train_opts_t *o);

typedef struct {
    long iters;               /* steps done */
    double first_loss;        /* mean loss (over ranks) of the first print window */
    double last_loss;         /* ... of the last one */
    double test_acc;          /* final test accuracy, percent */
    double train_s;           /* wall time of the steps (evaluation excluded) */
    double compute_s, comm_s; /* per rank, averaged over ranks */
    double conv_ratio;        /* raw / wire bytes of the conv layers over the whole run */
    double total_ratio;       /* raw / wire bytes of the whole gradient */
    long long fits;           /* GradiVeQ fits over the conv compressors */
    long long early_exits;    /* compressed phases the loss vote ended early */
    double time_to_stop;      /* train_s when test accuracy first reached stop_at (or -1) */
    long sync_checks;         /* weight checksum comparisons made */
    long sync_mismatches;     /* ... that found ranks holding different weights */
    double *loss_hist;        /* this rank's local loss per step (iters values; caller frees) */
} train_result_t;

/* The epoch's order of the training images (a permutation of n from seed), and the test accuracy
 * in percent with each rank evaluating its share of the test set (collective over comm; images,
 * labels and idx hold net->capacity images). Shared by the data-parallel and pipeline runs. */
void train_shuffle(int *perm, int n, uint64_t seed);
double train_evaluate(net_t *net, const mnist_set_t *test, int rank, int nranks, MPI_Comm comm,
                      float *images, uint8_t *labels, int *idx);
/* This rank's share of train_evaluate: the images of its part of the test set it classifies
 * right. */
long train_count_correct(net_t *net, const mnist_set_t *test, int rank, int nranks, float *images,
                         uint8_t *labels, int *idx);

/* Runs the training; returns 0, or -1 after printing why (bad options, data missing, a gvq
 * error). Collective over comm; with comm MPI_COMM_NULL (a process started without mpirun) the
 * ranks meet through the launcher's environment (gvqCommInitFromEnv) and MPI is not used. */
int train_run(const train_opts_t *o, MPI_Comm comm, train_result_t *res);

#endif /* GVQ_TRAIN_TRAIN_H_ */
