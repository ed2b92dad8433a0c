/*
 * test_reference.h -- the inputs of the collective unit tests and their double-precision
 * reference: input(rank, i) is a pure function, so every rank can compute what any reduction of
 * the ranks' inputs must give. Also the tolerance per datatype and a hash of a rank's output
 * (bitwise identity across ranks).
 */
#ifndef GVQ_TEST_REFERENCE_H_
#define GVQ_TEST_REFERENCE_H_

#include <math.h>
#include <stdint.h>

static inline double input(int rank, size_t i, gvqDataType_t t, gvqRedOp_t op) {
    if (op == gvqProd) return ((rank + i) % 3 == 0) ? 2 : 1; /* products stay small */
    int v = (int)((rank * 37 + i * 11) % 19) - 9;
    if (t == gvqUint8 || t == gvqUint32 || t == gvqUint64) v += 9;
    return gvq_dtype_is_float(t) ? v / 4.0 : v;
}

/* op over the inputs of ranks 0..nranks-1 at index i (gvqAvg: integer types truncate). */
static inline double expect_reduce(int nranks, size_t i, gvqDataType_t t, gvqRedOp_t op) {
    double acc = input(0, i, t, op);
    for (int r = 1; r < nranks; r++) {
        double x = input(r, i, t, op);
        if (op == gvqProd)
            acc *= x;
        else if (op == gvqMax)
            acc = x > acc ? x : acc;
        else if (op == gvqMin)
            acc = x < acc ? x : acc;
        else
            acc += x;
    }
    if (op == gvqAvg) acc = gvq_dtype_is_float(t) ? acc / nranks : (double)(int64_t)(acc / nranks);
    return acc;
}

static inline int close_enough(double got, double want, gvqDataType_t t) {
    double tol = t == gvqFloat16 ? 1e-2 : t == gvqBfloat16 ? 2e-2 : t == gvqFloat32 ? 1e-5 : 1e-12;
    if (!gvq_dtype_is_float(t)) return got == want;
    return fabs(got - want) <= tol * (1 + fabs(want));
}

/* FNV-1a of n bytes: equal outputs on every rank hash alike. */
static inline uint64_t fnv(const void *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ull;
    return h;
}

#endif /* GVQ_TEST_REFERENCE_H_ */
