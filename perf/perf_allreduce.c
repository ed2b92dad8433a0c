/*
 * perf_allreduce.c -- the plain allreduce benchmarks: codec none (gvq's ring, gvqAllReduce) and
 * codec mpi (MPI_Allreduce, the reference), every datatype and op, on data whose result has a
 * closed form. For each size, out-of-place then in-place:
 *
 *     fill buffers -> warmup calls -> MPI_Barrier -> time `iters` calls -> max over ranks
 *     -> (check) refill, poison the output, one call, count wrong elements over the ranks
 *
 * Rank r's element i is a small integer derived from (r, i), so each op's result has an exact
 * closed form that the tool computes on its own, in double, without asking any library.
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "internal/perf_values.h"
#include "perf_bench.h"
#include "perf_common.h"

/* ---- MPI's names for gvq's types and ops ---------------------------------------------------- */

/* MPI's type for a gvq type, or MPI_DATATYPE_NULL where MPI has none. */
static MPI_Datatype mpi_dtype(gvqDataType_t t) {
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

/* MPI's op for a gvq op, or MPI_OP_NULL where MPI has none. */
static MPI_Op mpi_op(gvqRedOp_t op) {
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

/* Why MPI_Allreduce cannot run this dtype/op, or NULL if it can. */
static const char *mpi_skip_reason(const opts_t *o, char *buf, size_t len) {
    if (mpi_dtype(o->dt->type) == MPI_DATATYPE_NULL) {
        snprintf(buf, len, "MPI_Allreduce has no %s type", o->dt->name);
        return buf;
    }
    if (mpi_op(o->op) == MPI_OP_NULL) {
        snprintf(buf, len, "MPI_Allreduce has no %s op", perf_op_names[o->op]);
        return buf;
    }
    return NULL;
}

/* gvqAllReduce takes every datatype and op. */
static const char *never_skipped(const opts_t *o, char *buf, size_t len) {
    (void)o;
    (void)buf;
    (void)len;
    return NULL;
}

/* ---- data pattern and its closed form ---------------------------------------------------------
 */

typedef struct {
    const dtype_info_t *dt;
    gvqRedOp_t op;
    int nranks;
} check_t;

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

/* The exact result of the allreduce at element i, computed here in double / int64. */
static double expected_value(const check_t *c, size_t i) {
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

static void fill_pattern(void *buf, size_t count, int rank, const check_t *c) {
    for (size_t i = 0; i < count; i++)
        perf_value_store(buf, c->dt->type, i, pattern_value(rank, i, c->op));
}

static int64_t count_wrong(const void *buf, size_t count, const check_t *c) {
    int64_t wrong = 0;
    for (size_t i = 0; i < count; i++) {
        double got = perf_value_load(buf, c->dt->type, i), want = expected_value(c, i);
        int ok;
        if (c->dt->is_float && c->op == gvqAvg)
            ok = fabs(got - want) <= c->dt->avg_tol * fabs(want);
        else
            ok = got == want;
        wrong += !ok;
    }
    return wrong;
}

/* ---- one case ---------------------------------------------------------------------------------
 */

/* One allreduce; in place when send == recv. */
static void run_coll(const opts_t *o, codec_t codec, const void *send, void *recv, size_t count) {
    if (codec == CODEC_NONE) {
        GVQTEST(gvqAllReduce(send, recv, count, o->dt->type, o->op, perf_comm, NULL));
        return;
    }
    /* MPI counts are int: large counts go in pieces */
    const size_t piece = (size_t)1 << 30;
    for (size_t off = 0; off < count; off += piece) {
        size_t n = count - off < piece ? count - off : piece;
        void *r = (char *)recv + off * o->dt->size;
        const void *s = send == recv ? MPI_IN_PLACE : (const char *)send + off * o->dt->size;
        MPITEST(MPI_Allreduce(s, r, (int)n, mpi_dtype(o->dt->type), mpi_op(o->op), MPI_COMM_WORLD));
    }
}

/* Wrong elements of one more call on fresh data, summed over the ranks. */
static int64_t check_case(const opts_t *o, codec_t codec, void *sendbuf, void *recvbuf,
                          size_t count, int inplace, const check_t *chk) {
    const void *send = inplace ? recvbuf : sendbuf;
    fill_pattern(inplace ? recvbuf : sendbuf, count, perf_rank, chk);
    if (!inplace) memset(recvbuf, 0xa5, count * o->dt->size); /* poison the output */
    run_coll(o, codec, send, recvbuf, count);
    int64_t wrong = count_wrong(recvbuf, count, chk), total = 0;
    MPITEST(MPI_Allreduce(&wrong, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
    return total;
}

static result_t run_case(const opts_t *o, codec_t codec, void *sendbuf, void *recvbuf, size_t count,
                         int inplace, const check_t *chk) {
    result_t res = RESULT_NONE;
    const void *send = inplace ? recvbuf : sendbuf;
    fill_pattern(inplace ? recvbuf : sendbuf, count, perf_rank, chk);
    for (int k = 0; k < o->warmup; k++)
        run_coll(o, codec, send, recvbuf, count);

    MPITEST(MPI_Barrier(MPI_COMM_WORLD));
    double t0 = MPI_Wtime();
    for (int k = 0; k < o->iters; k++)
        run_coll(o, codec, send, recvbuf, count);
    double elapsed = MPI_Wtime() - t0;
    res.time_us = perf_max_over_ranks(elapsed) / o->iters * 1e6;

    if (o->check) res.wrong = check_case(o, codec, sendbuf, recvbuf, count, inplace, chk);
    return res;
}

static void run_size(const perf_bench_t *b, const perf_run_t *run, size_t count, perf_case_t *out) {
    check_t chk = {run->o->dt, run->o->op, perf_nranks};
    for (int ip = 0; ip < 2; ip++)
        out->res[ip] = run_case(run->o, b->codec, run->sendbuf, run->recvbuf, count, ip, &chk);
}

const perf_bench_t perf_bench_none = {
    .codec = CODEC_NONE, .skip_reason = never_skipped, .run_size = run_size};
const perf_bench_t perf_bench_mpi = {
    .codec = CODEC_MPI, .skip_reason = mpi_skip_reason, .run_size = run_size};
