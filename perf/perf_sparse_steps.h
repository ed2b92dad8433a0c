/*
 * perf_sparse_steps.h -- the steps of gvq-perf's sparse benchmark (perf_sparse_steps.c): its
 * options, each rank's access pattern, and one timed run of each aggregation method.
 */
#ifndef PERF_SPARSE_STEPS_H_
#define PERF_SPARSE_STEPS_H_

#include <stddef.h>
#include <stdint.h>

#include "gvq.h"

enum { M_AG, M_PS, M_DENSE, NUM_MODES };
extern const char *const sp_mode_names[NUM_MODES]; /* "sparse-ag", "ps", "dense" */

typedef struct {
    int modes[NUM_MODES], nmodes;
    size_t rows, dim;
    double alpha, zipf, lr;
    int iters, warmup, partitions, partitioning, local_agg;
    unsigned long long seed;
    int tune, tune_iters, sweep_max;
} sp_opts_t;

/* One method's timing and traffic. */
typedef struct {
    double step_s;             /* slowest rank's mean step */
    double sent, recv;         /* bytes per step, this rank */
    double sent_avg, recv_avg; /* averaged over the ranks */
    double sent_max, recv_max; /* the busiest rank */
    int algorithm;             /* sparse-ag: 0 ring, 1 native */
    int ran;
} sp_result_t;

/* The rows this rank touches at each step and its gradient buffer. */
typedef struct {
    const sp_opts_t *o;
    size_t k;       /* rows per rank and step: alpha x rows */
    int nsteps;     /* row sets drawn; step s uses set s % nsteps */
    int64_t **rows; /* per step: this rank's k rows, sorted */
    float *grad;    /* k x dim, rebuilt per step */
} sp_work_t;

/* Draws this rank's row sets (Zipf-skewed, see perf_sparse_steps.c); ends the run when out of
 * memory. */
void sp_work_init(sp_work_t *wk, const sp_opts_t *o);
void sp_work_free(sp_work_t *wk);

/* Rows of the union of the ranks' first step over N k (1: the ranks share no row). Collective. */
double sp_union_share(const sp_work_t *wk);

/* warmup + iters steps of each method, the first `warmup` untimed; dense and sparse-ag update the
 * replica w (rows x dim floats), ps the server's variable. Collective. */
sp_result_t sp_run_dense(const sp_work_t *wk, float *w);
sp_result_t sp_run_ag(const sp_work_t *wk, float *w);
sp_result_t sp_run_ps(const sp_work_t *wk, gvqPs_t ps, int iters, int warmup);

/* A parameter server of P partitions for the options' variable. Collective. */
gvqPs_t sp_make_ps(const sp_opts_t *o, int P);

/* One PS step s: pull the rows, push their gradients, apply; `pulled` holds k x dim floats. */
gvqResult_t sp_ps_step(gvqPs_t ps, const sp_work_t *wk, int s, float *pulled);

#endif /* PERF_SPARSE_STEPS_H_ */
