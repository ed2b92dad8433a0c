/*
 * perf_fitbench.h -- gvq-perf --fit-bench (perf_fitbench.c): GradiVeQ's PCA fit timed alone.
 */
#ifndef PERF_FITBENCH_H_
#define PERF_FITBENCH_H_

#include "perf_args.h"

/* Times gvq_pca_fit on rank 0 for L = 256, 512, 1024, 2304 (T = 100 samples of the synthetic
 * source), --fit-reps times each, and prints the table; the other ranks sleep meanwhile. Returns
 * the exit status on every rank (0, or 1). Collective. */
int perf_fit_bench(const opts_t *o);

#endif /* PERF_FITBENCH_H_ */
