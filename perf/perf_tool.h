/*
 * perf_tool.h -- what the small MPI tools of perf/ (gvq-ps-latency, gvq-ps-recover) share: a
 * monotonic clock, qsort's order of doubles, and OK(call), which aborts the job with the call
 * and its error when a gvq call fails.
 */
#ifndef GVQ_PERF_TOOL_H_
#define GVQ_PERF_TOOL_H_

#include <mpi.h>
#include <stdio.h>
#include <time.h>

#include "gvq.h"

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define OK(call)                                                              \
    do {                                                                      \
        gvqResult_t r_ = (call);                                              \
        if (r_ != gvqSuccess) {                                               \
            fprintf(stderr, "%s failed: %s\n", #call, gvqGetErrorString(r_)); \
            MPI_Abort(MPI_COMM_WORLD, 1);                                     \
        }                                                                     \
    } while (0)

#endif /* GVQ_PERF_TOOL_H_ */
