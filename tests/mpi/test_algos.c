/*
 * test_algos.c -- the plain collectives with one algorithm forced: the argument is GVQ_ALGO
 * (ring, rd, rab, tree, direct, auto), set before the library reads it. Every datatype and op at
 * odd counts against a reference computed from the inputs (a pure function of rank and index),
 * every root; allreduce outputs bitwise identical on every rank, also for float values whose sum
 * depends on the order of the additions and for max/min over +0 and -0.
 */
#include <math.h>

#include "mpitest.h"

static const char *algo = "auto";
static gvqComm_t comm;

static double input(int rank, size_t i, gvqDataType_t t, gvqRedOp_t op) {
    if (op == gvqProd) return ((rank + i) % 3 == 0) ? 2 : 1;
    int v = (int)((rank * 37 + i * 11) % 19) - 9;
    if (t == gvqUint8 || t == gvqUint32 || t == gvqUint64) v += 9;
    return (t == gvqFloat16 || t == gvqFloat32 || t == gvqFloat64 || t == gvqBfloat16) ? v / 4.0
                                                                                       : v;
}

static double reference(size_t i, gvqDataType_t t, gvqRedOp_t op) {
    double acc = input(0, i, t, op);
    for (int r = 1; r < mt.nranks; r++) {
        double x = input(r, i, t, op);
        acc = op == gvqProd  ? acc * x
              : op == gvqMax ? (x > acc ? x : acc)
              : op == gvqMin ? (x < acc ? x : acc)
                             : acc + x;
    }
    int is_float = t == gvqFloat16 || t == gvqFloat32 || t == gvqFloat64 || t == gvqBfloat16;
    if (op == gvqAvg) acc = is_float ? acc / mt.nranks : (double)(int64_t)(acc / mt.nranks);
    return acc;
}

/* Values are small integers or quarters: exact in every type, also as half (|v| <= 2^11). */
static void put(void *b, gvqDataType_t t, size_t i, double v) {
    float f = (float)v;
    uint32_t u;
    switch (t) {
    case gvqInt8:
        ((int8_t *)b)[i] = (int8_t)v;
        break;
    case gvqUint8:
        ((uint8_t *)b)[i] = (uint8_t)v;
        break;
    case gvqInt32:
        ((int32_t *)b)[i] = (int32_t)v;
        break;
    case gvqUint32:
        ((uint32_t *)b)[i] = (uint32_t)v;
        break;
    case gvqInt64:
        ((int64_t *)b)[i] = (int64_t)v;
        break;
    case gvqUint64:
        ((uint64_t *)b)[i] = (uint64_t)v;
        break;
    case gvqFloat32:
        ((float *)b)[i] = f;
        break;
    case gvqFloat64:
        ((double *)b)[i] = v;
        break;
    case gvqBfloat16:
        memcpy(&u, &f, 4);
        ((uint16_t *)b)[i] = (uint16_t)(u >> 16);
        break;
    default: /* half: the float's bits rebuilt (normal values only, as here) */
        memcpy(&u, &f, 4);
        if (f == 0.0f)
            ((uint16_t *)b)[i] = (uint16_t)((u >> 16) & 0x8000u);
        else
            ((uint16_t *)b)[i] =
                (uint16_t)(((u >> 16) & 0x8000u) | ((((u >> 23) & 0xffu) - 112u) << 10) |
                           ((u >> 13) & 0x3ffu));
        break;
    }
}

static double get(const void *b, gvqDataType_t t, size_t i) {
    uint32_t u;
    float f;
    switch (t) {
    case gvqInt8:
        return ((const int8_t *)b)[i];
    case gvqUint8:
        return ((const uint8_t *)b)[i];
    case gvqInt32:
        return ((const int32_t *)b)[i];
    case gvqUint32:
        return ((const uint32_t *)b)[i];
    case gvqInt64:
        return (double)((const int64_t *)b)[i];
    case gvqUint64:
        return (double)((const uint64_t *)b)[i];
    case gvqFloat32:
        return ((const float *)b)[i];
    case gvqFloat64:
        return ((const double *)b)[i];
    case gvqBfloat16:
        u = (uint32_t)((const uint16_t *)b)[i] << 16;
        memcpy(&f, &u, 4);
        return f;
    default: {
        uint16_t h = ((const uint16_t *)b)[i];
        double m = (h & 0x3ff) / 1024.0, e = (h >> 10) & 0x1f;
        double v = e == 0 ? ldexp(m, -14) : ldexp(1 + m, (int)e - 15);
        return (h & 0x8000) ? -v : v;
    }
    }
}

/* Every rank's hash of its output must equal rank 0's. */
static void same_everywhere(const void *buf, size_t bytes, const char *what) {
    uint64_t h = mt_fnv1a(buf, bytes), h0 = h;
    MPI_Bcast(&h0, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    MT_CHECK(h == h0, "GVQ_ALGO=%s %s: output differs from rank 0's", algo, what);
}

static void check_values(const void *d, gvqDataType_t t, size_t n, size_t base, gvqRedOp_t op,
                         const char *what) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double want = reference(base + i, t, op), got = get(d, t, i);
        double tol = t == gvqFloat16 || t == gvqBfloat16 ? 2e-2 : 1e-6;
        if (fabs(got - want) > tol * (1 + fabs(want)) && bad++ < 2)
            MT_FAIL("GVQ_ALGO=%s %s datatype %d op %d count %zu [%zu]: got %g want %g", algo, what,
                    (int)t, (int)op, n, i, got, want);
    }
    mt.checks++;
}

static void part_reducing(size_t count, gvqDataType_t t, gvqRedOp_t op) {
    int n = mt.nranks, r = mt.rank;
    size_t es = t == gvqInt8 || t == gvqUint8                        ? 1
                : t == gvqFloat16 || t == gvqBfloat16                ? 2
                : t == gvqInt32 || t == gvqUint32 || t == gvqFloat32 ? 4
                                                                     : 8;
    char *s = malloc(count * (size_t)n * es + 8), *d = malloc(count * (size_t)n * es + 8);
    for (size_t i = 0; i < count; i++)
        put(s, t, i, input(r, i, t, op));
    MT_OK(gvqAllReduce(s, d, count, t, op, comm, NULL));
    check_values(d, t, count, 0, op, "allreduce");
    same_everywhere(d, count * es, "allreduce");
    MT_OK(gvqAllReduce(s, s, count, t, op, comm, NULL)); /* in place */
    check_values(s, t, count, 0, op, "allreduce in place");
    for (size_t i = 0; i < count * (size_t)n; i++)
        put(s, t, i, input(r, i, t, op));
    MT_OK(gvqReduceScatter(s, d, count, t, op, comm, NULL));
    check_values(d, t, count, (size_t)r * count, op, "reduce-scatter");
    for (int root = 0; root < n; root++) {
        MT_OK(gvqReduce(s, d, count, t, op, root, comm, NULL));
        if (r == root) check_values(d, t, count, 0, op, "reduce");
    }
    free(s);
    free(d);
}

static void part_moving(size_t count) {
    int n = mt.nranks, r = mt.rank;
    int32_t *s = malloc(count * 4 + 4), *d = malloc(count * 4 * (size_t)n + 4);
    for (size_t i = 0; i < count; i++)
        s[i] = (int32_t)(r * 100003 + (int)i);
    MT_OK(gvqAllGather(s, d, count, gvqInt32, comm, NULL));
    int bad = 0;
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < count; i++)
            if (d[(size_t)p * count + i] != (int32_t)(p * 100003 + (int)i) && bad++ < 2)
                MT_FAIL("GVQ_ALGO=%s allgather count %zu block %d [%zu]: got %d", algo, count, p, i,
                        d[(size_t)p * count + i]);
    for (int root = 0; root < n; root++) {
        for (size_t i = 0; i < count; i++)
            d[i] = r == root ? (int32_t)(root * 7 + (int)i) : -1;
        MT_OK(gvqBroadcast(d, d, count, gvqInt32, root, comm, NULL));
        for (size_t i = 0; i < count; i++)
            if (d[i] != (int32_t)(root * 7 + (int)i) && bad++ < 2)
                MT_FAIL("GVQ_ALGO=%s broadcast root %d count %zu [%zu]: got %d", algo, root, count,
                        i, d[i]);
    }
    mt.checks++;
    free(s);
    free(d);
}

/* Float values whose sum rounds differently in different orders; +0/-0 for max and min. */
static void part_order(size_t count, gvqRedOp_t op) {
    float *s = malloc(count * 4), *d = malloc(count * 4);
    double *exact = malloc(count * sizeof(double)), *absum = malloc(count * sizeof(double));
    for (size_t i = 0; i < count; i++) {
        exact[i] = absum[i] = 0;
        for (int p = 0; p < mt.nranks; p++) {
            uint32_t h = (uint32_t)(p * 2654435761u) ^ (uint32_t)(i * 40503u + 977u);
            h ^= h >> 13;
            h *= 0x5bd1e995u;
            h ^= h >> 15;
            float v = ((h >> 10) & 1 ? -1.0f : 1.0f) * (1.0f + (float)(h % 1000) / 997.0f) *
                      ldexpf(1.0f, (int)((h >> 11) % 41) - 20);
            if (op != gvqSum) v = (h % 3 == 0) ? ((h & 8) ? 0.0f : -0.0f) : (h & 16 ? 1.0f : -1.0f);
            if (p == mt.rank) s[i] = v;
            exact[i] += v;
            absum[i] += fabs(v);
        }
    }
    MT_OK(gvqAllReduce(s, d, count, gvqFloat32, op, comm, NULL));
    same_everywhere(d, count * 4, op == gvqSum ? "allreduce order-sensitive sum" : "max +-0");
    for (size_t i = 0; op == gvqSum && i < count; i++)
        if (fabs(d[i] - exact[i]) > 8 * mt.nranks * 6e-8 * absum[i]) {
            MT_FAIL("GVQ_ALGO=%s order-sensitive sum [%zu]: got %g, exact %g", algo, i, d[i],
                    exact[i]);
            break;
        }
    free(s);
    free(d);
    free(exact);
    free(absum);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        algo = argv[1];
        setenv("GVQ_ALGO", algo, 1); /* before the library reads its parameters */
    }
    mt_init(&argc, &argv);
    comm = mt_new_comm();
    const size_t counts[] = {1, 3, 7, 1021, 65537};
    for (int c = 0; c < 5; c++) {
        char name[64];
        snprintf(name, sizeof name, "count %zu", counts[c]);
        mt_part(name, 120);
        for (int t = 0; t < gvqNumTypes; t++)
            for (int op = 0; op < gvqNumOps; op++)
                if (c < 4 || op == gvqSum)
                    part_reducing(counts[c], (gvqDataType_t)t, (gvqRedOp_t)op);
        part_moving(counts[c]);
        part_order(counts[c], gvqSum);
        part_order(counts[c], gvqMax);
    }
    mt_part("done", 0);
    gvqCommDestroy(comm);
    return mt_finish("test_algos");
}
