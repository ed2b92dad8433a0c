/*
 * perf_compressed.h -- gvq-perf's compressed allreduce benchmarks (perf_compressed.c: the
 * perf_bench_gradiveq and perf_bench_qsgd tables of perf_bench.h) and their gradient source.
 */
#ifndef PERF_COMPRESSED_H_
#define PERF_COMPRESSED_H_

#include <stddef.h>

#include "perf_args.h"
#include "perf_bench.h"
#include "perf_gradsrc.h"

/* The gradient source of o (--replay, or the synthetic one); every rank opens it. NULL on every
 * rank when one failed (reported there). Collective. */
gs_source_t *perf_source_open(const opts_t *o);

/* Elements [off, off+len) of rank's gradient at iteration t; a replay read error ends the run
 * (exit 3). */
void perf_source_fill(const gs_source_t *src, int rank, long long t, size_t off, size_t len,
                      float *out);

/* --write-replay: rank 0 writes the synthetic source (-e bytes, --replay-iters iterations) as a
 * replay file; every rank returns the exit status (0, or 3). Collective. */
int perf_write_replay(const opts_t *o);

#endif /* PERF_COMPRESSED_H_ */
