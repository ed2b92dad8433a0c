/*
 * launch_test.h -- what the tests of jobs started without mpirun share: a failure counter and
 * CHECK (reports and counts, goes on), GVQ (a gvq call that must succeed, else exit 1), the
 * rank for their messages, and the values whose sums are exact.
 */
#ifndef GVQ_LAUNCH_TEST_H_
#define GVQ_LAUNCH_TEST_H_

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gvq.h"

static int failures;
static int rank = -1;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            failures++;                                                         \
            fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, "\n");                                              \
        }                                                                       \
    } while (0)
#define GVQ(call)                                                                                \
    do {                                                                                         \
        gvqResult_t r_ = (call);                                                                 \
        if (r_ != gvqSuccess) {                                                                  \
            fprintf(stderr, "rank %d: %s failed: %s (%s)\n", rank, #call, gvqGetErrorString(r_), \
                    gvqGetLastError(NULL));                                                      \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

/* rank r's value i: a small integer, so sums of up to 64 ranks are exact in float */
static inline float val(int r, size_t i) {
    return (float)((int)((i * 7 + (size_t)r * 13) % 61) - 30);
}

#endif /* GVQ_LAUNCH_TEST_H_ */
