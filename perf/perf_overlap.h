/*
 * perf_overlap.h -- gvq-perf --overlap (perf_overlap.c): GradiVeQ's compute against the time of
 * the compressed allreduce and of its traffic alone.
 */
#ifndef PERF_OVERLAP_H_
#define PERF_OVERLAP_H_

#include <stddef.h>

#include "perf_args.h"
#include "perf_gradsrc.h"

/* One size's row of the overlap table; times in us. */
typedef struct {
    size_t bytes, count;
    double ratio;
    int d;
    size_t chunk, wchunk; /* the compressed ring's chunk (uncompressed bytes); wire-sized chunk */
    double total, wire, vote, wire_def, enc, dec, comp, comp_alone, hidden, hidden_alone;
    char err[160]; /* why the codec could not be timed; empty when it was */
} perf_overlap_t;

/* Measures one size: `count` floats compressed at `ratio` with d dimensions took total_us per
 * call (out-of-place). sendbuf and recvbuf hold count floats each and are overwritten.
 * Collective. */
void perf_measure_overlap(const opts_t *o, const gs_source_t *src, size_t count, double ratio,
                          int d, double total_us, float *sendbuf, float *recvbuf,
                          perf_overlap_t *ov);

/* The overlap table of n sizes, with its legend (rank 0). */
void perf_print_overlap(const perf_overlap_t *ov, int n);

#endif /* PERF_OVERLAP_H_ */
