/*
 * perf_progress.h -- gvq-perf's progress line (perf_progress.c): on rank 0's stderr, rewritten
 * in place, with the share of the run done and an estimate of the time left, once the run has
 * lasted a few seconds. Only when stderr is a terminal (see perf_progress_start); off with
 * --no-progress. The estimate weighs each case by its calls and bytes (perf_progress_weight).
 */
#ifndef PERF_PROGRESS_H_
#define PERF_PROGRESS_H_

#include <stddef.h>

/* Starts the clock of a run whose cases weigh `total` together (the sum of their
 * perf_progress_weight). The line shows only when `enabled`, on rank 0, and when stderr is a
 * terminal: the process's own, or, under mpirun (which hands the ranks a pipe), mpirun's. */
void perf_progress_start(int enabled, double total);

/* The weight of one case: `calls` calls of `bytes` each, counting a call's latency as 64 KiB. */
double perf_progress_weight(long long calls, size_t bytes);

/* A case of `weight` is done; redraws the line (at most 4 times a second, after the first 3 s)
 * naming `what` (the case that just ran). */
void perf_progress_step(double weight, const char *what);

/* Erases the line if it is shown (before printing on stdout); the next step draws it again. */
void perf_progress_clear(void);

/* Erases the line for good. */
void perf_progress_end(void);

#endif /* PERF_PROGRESS_H_ */
