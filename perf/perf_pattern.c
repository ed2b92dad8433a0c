/*
 * perf_pattern.c -- the data of gvq-perf's plain benchmarks and its closed forms (see
 * perf_pattern.h), and MPI's names for gvq's types and ops.
 */
#include "perf_pattern.h"

#include <math.h>

#include "internal/perf_values.h"

/* ---- MPI's names for gvq's types and ops ---------------------------------------------------- */

MPI_Datatype perf_mpi_dtype(gvqDataType_t t) {
    switch (t) {
    case gvqInt8:
        return MPI_INT8_T;
    case gvqUint8:
        return MPI_UINT8_T;
    case gvqInt32:
        return MPI_INT32_T;
    case gvqUint32:
        return MPI_UINT32_T;
    case gvqInt64:
        return MPI_INT64_T;
    case gvqUint64:
        return MPI_UINT64_T;
    case gvqFloat32:
        return MPI_FLOAT;
    case gvqFloat64:
        return MPI_DOUBLE;
    default:
        return MPI_DATATYPE_NULL;
    }
}

MPI_Op perf_mpi_op(gvqRedOp_t op) {
    switch (op) {
    case gvqSum:
        return MPI_SUM;
    case gvqProd:
        return MPI_PROD;
    case gvqMax:
        return MPI_MAX;
    case gvqMin:
        return MPI_MIN;
    default:
        return MPI_OP_NULL;
    }
}

/* ---- the pattern ---------------------------------------------------------------------------- */

/* An integer value as the integer type holds it after wrapping (sums of int8 wrap). */
static int64_t wrap_int(int64_t v, gvqDataType_t t) {
    uint64_t u = (uint64_t)v;
    switch (t) {
    case gvqInt8:
        u &= 0xffu;
        return u >= 0x80u ? (int64_t)u - 0x100 : (int64_t)u;
    case gvqUint8:
        return (int64_t)(u & 0xffu);
    case gvqInt32:
        u &= 0xffffffffu;
        return u >= 0x80000000u ? (int64_t)u - 0x100000000 : (int64_t)u;
    case gvqUint32:
        return (int64_t)(u & 0xffffffffu);
    default:
        return v; /* 64-bit types: our values never leave their range */
    }
}

/* A well-mixed key of (rank, index), so that data moved to a wrong offset shows. */
static unsigned pattern_key(int r, size_t i) {
    uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull ^ ((uint64_t)r + 1) * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 32;
    return (unsigned)(x % 15u);
}

/* Rank r's element i: 1..5; for prod 1 or 2, and 2 only on ranks 0..5, so that every product
 * is at most 64 and exact in every type (int8 included). */
static int pattern_value(int r, size_t i, gvqRedOp_t op) {
    unsigned k = pattern_key(r, i);
    if (op == gvqProd) return (r < 6 && k % 3u == 0) ? 2 : 1;
    return (int)(k % 5u) + 1;
}

/* The exact result of the reduction at element i, computed here in double / int64. */
static double reduced_value(const check_t *c, size_t i) {
    int64_t acc = c->op == gvqProd ? 1 : 0;
    for (int r = 0; r < c->nranks; r++) {
        int64_t v = pattern_value(r, i, c->op);
        switch (c->op) {
        case gvqSum:
        case gvqAvg:
            acc += v;
            break;
        case gvqProd:
            acc *= v;
            break;
        case gvqMax:
            acc = r == 0 || v > acc ? v : acc;
            break;
        case gvqMin:
            acc = r == 0 || v < acc ? v : acc;
            break;
        default:
            break;
        }
    }
    if (c->dt->is_float) return c->op == gvqAvg ? (double)acc / c->nranks : (double)acc;
    acc = wrap_int(acc, c->dt->type);
    if (c->op == gvqAvg) acc /= c->nranks; /* C truncation, as gvqAvg on integer types */
    return (double)acc;
}

void perf_pattern_fill(void *buf, size_t count, int rank, size_t first, const check_t *c) {
    for (size_t i = 0; i < count; i++)
        perf_value_store(buf, c->dt->type, i, pattern_value(rank, first + i, c->op));
}

int64_t perf_pattern_wrong_reduced(const void *buf, size_t count, size_t first, const check_t *c) {
    int64_t wrong = 0;
    for (size_t i = 0; i < count; i++) {
        double got = perf_value_load(buf, c->dt->type, i), want = reduced_value(c, first + i);
        int ok;
        if (c->dt->is_float && c->op == gvqAvg)
            ok = fabs(got - want) <= c->dt->avg_tol * fabs(want);
        else
            ok = got == want;
        wrong += !ok;
    }
    return wrong;
}

int64_t perf_pattern_wrong_copied(const void *buf, size_t count, int rank, size_t first,
                                  const check_t *c) {
    int64_t wrong = 0;
    for (size_t i = 0; i < count; i++)
        wrong += perf_value_load(buf, c->dt->type, i) != pattern_value(rank, first + i, c->op);
    return wrong;
}
