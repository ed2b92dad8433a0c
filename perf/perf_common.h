/*
 * perf_common.h -- what every gvq-perf benchmark shares (perf_common.c): the rank and the
 * communicator, check macros that end the run on a failed call, MPI helpers for timing across
 * ranks, the median, buffers, and the option-table parser behind both command lines.
 */
#ifndef PERF_COMMON_H_
#define PERF_COMMON_H_

#include <mpi.h>
#include <stddef.h>
#include <stdio.h>

#include "gvq.h"

extern int perf_rank, perf_nranks; /* in MPI_COMM_WORLD */
extern gvqComm_t perf_comm;        /* the benchmark's communicator; NULL before it exists */

/* Ends the run (MPI_Abort) when a gvq call fails, with the call and the library's last error. */
#define GVQTEST(call)                                                                              \
    do {                                                                                           \
        gvqResult_t res_ = (call);                                                                 \
        if (res_ != gvqSuccess) {                                                                  \
            fprintf(stderr, "gvq-perf: rank %d: %s:%d: %s failed: %s (%s)\n", perf_rank, __FILE__, \
                    __LINE__, #call, gvqGetErrorString(res_), gvqGetLastError(perf_comm));         \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
        }                                                                                          \
    } while (0)

/* Ends the run (MPI_Abort) when an MPI call fails, with MPI's error string. */
#define MPITEST(call)                                                                         \
    do {                                                                                      \
        int err_ = (call);                                                                    \
        if (err_ != MPI_SUCCESS) {                                                            \
            char msg_[MPI_MAX_ERROR_STRING];                                                  \
            int len_ = 0;                                                                     \
            MPI_Error_string(err_, msg_, &len_);                                              \
            fprintf(stderr, "gvq-perf: rank %d: %s:%d: %s failed: %s\n", perf_rank, __FILE__, \
                    __LINE__, #call, msg_);                                                   \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                     \
        }                                                                                     \
    } while (0)

/* ---- MPI ---------------------------------------------------------------------------------- */

/* MPI_Init, then perf_rank and perf_nranks. */
void perf_mpi_init(int *argc, char ***argv);

/* A communicator over every rank, made the NCCL way: rank 0 makes the id, MPI carries it to
 * everyone. cfg may be NULL (defaults). Collective. */
gvqComm_t perf_comm_create(gvqConfig_t *cfg);

/* The largest x over the ranks. Collective. */
double perf_max_over_ranks(double x);

/* 1 when ok is nonzero on every rank. Collective. */
int perf_all_ok(int ok);

/* A barrier in which waiting ranks sleep instead of spinning, so that the one rank that works
 * meanwhile has a core to itself (ranks may outnumber cores). Collective. */
void perf_sleepy_barrier(void);

/* ---- numbers and memory ------------------------------------------------------------------- */

/* Median of v[0..n), n >= 1 (reorders v). */
double perf_median(double *v, int n);

/* `bytes` (at least 64) of zeroes, 64-byte aligned, every page touched before timing; ends the
 * run when out of memory. */
void *perf_alloc_buffer(size_t bytes);

/* ---- command lines ------------------------------------------------------------------------ */

/* One option of a command line: getopt_long's name and key, and how its value lands in the
 * options struct. parse writes the value at `field` (an offset into that struct) and returns 0,
 * or -1 for a bad value, with a message in msg or msg left empty ("bad value" then names `what`,
 * or "see -h" when what is NULL). */
typedef struct perf_opt perf_opt_t;
struct perf_opt {
    const char *name; /* --name */
    int has_arg;      /* getopt_long's no_argument, required_argument */
    int key;          /* the short option's letter, or a number >= 256 for long-only ones */
    int (*parse)(const perf_opt_t *opt, const char *arg, void *field, char *msg, size_t len);
    size_t field;        /* offsetof(options struct, the value) */
    double lo, hi;       /* range of a number; perf_opt_flag stores lo */
    const void *choices; /* perf_choice_t list of perf_opt_choice, NULL-terminated */
    const char *what;    /* the option in "bad value 'X' for WHAT" */
};

/* A word an option accepts and the int it stands for (perf_opt_choice). */
typedef struct {
    const char *word;
    int value;
} perf_choice_t;

/* An option without a value: the int at field becomes (int)opt->lo. */
int perf_opt_flag(const perf_opt_t *opt, const char *arg, void *field, char *msg, size_t len);
/* A string: the const char * at field points at the argument. */
int perf_opt_string(const perf_opt_t *opt, const char *arg, void *field, char *msg, size_t len);
/* One of opt->choices' words: the int at field becomes its value. */
int perf_opt_choice(const perf_opt_t *opt, const char *arg, void *field, char *msg, size_t len);

typedef void perf_usage_fn(FILE *f, const char *prog);

/* Parses argv over the n options of `table` into the struct at `out`. -h (key 'h') prints the
 * usage on stdout and returns 1; an unknown option or a missing value prints it on stderr and
 * returns 2, a bad value its message (returns 2); 0 when every option parsed. Only `verbose`
 * prints: every rank parses the same argv and reaches the same answer. */
int perf_parse_options(int argc, char **argv, const perf_opt_t *table, size_t n, void *out,
                       perf_usage_fn *usage, int verbose);

#endif /* PERF_COMMON_H_ */
