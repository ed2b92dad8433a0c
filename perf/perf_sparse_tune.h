/*
 * perf_sparse_tune.h -- gvq-perf -C ps --ps-tune (perf_sparse_tune.c): the parameter server's
 * partition tuner against a sweep over the number of partitions.
 */
#ifndef PERF_SPARSE_TUNE_H_
#define PERF_SPARSE_TUNE_H_

#include "perf_sparse_steps.h"

/* Runs gvqPsTunePartitions on wk's steps, then times every P of 1 .. --sweep-max and prints the
 * tuner's choice next to the sweep's best (rank 0). Collective. */
void sp_run_tune(const sp_work_t *wk);

#endif /* PERF_SPARSE_TUNE_H_ */
