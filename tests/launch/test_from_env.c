/*
 * test_from_env.c -- a job started without mpirun (scripts/gvq-launch.sh sets what torchrun or
 * srun sets): gvqCommInitFromEnv, then the plain collectives, gvqSend/gvqRecv and a compressed
 * allreduce, each checked against values computed here from the definition; small calls of
 * every collective in several datatypes and ops (across hosts they ride along with the call
 * agreement).
 *
 * The inputs are small integers, so every float sum is exact and the expected result is known
 * without gvq. The compressed results (QSGD on the float and the 8-bit integer wire, the tracked
 * basis on the 16-bit wire) have no closed form: every rank's bytes are gathered and must be
 * identical, and the error against the exact sum within a bound. Argument:
 * "mixed" (rank 1 on GVQ_TRANSPORT=mpi, the others on UCX): gvqCommInitFromEnv must fail on
 * every rank with gvqInvalidUsage naming GVQ_TRANSPORT. "mpi-free" also checks that the process
 * never loaded an MPI transport (GVQ_TRANSPORT=auto picks UCX outside an MPI job).
 */
#include <math.h>

#include "launch_test.h"

static void test_plain(gvqComm_t comm, int n) {
    static const size_t counts[] = {1, 3, 1000, (1u << 20) + 3};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        size_t count = counts[k];
        float *x = malloc(count * sizeof *x), *y = malloc(count * sizeof *y);
        for (size_t i = 0; i < count; i++)
            x[i] = val(rank, i);
        GVQ(gvqAllReduce(x, y, count, gvqFloat32, gvqSum, comm, NULL));
        size_t bad = 0;
        for (size_t i = 0; i < count; i++) {
            float want = 0;
            for (int r = 0; r < n; r++)
                want += val(r, i);
            bad += y[i] != want;
        }
        CHECK(bad == 0, "allreduce of %zu: %zu wrong", count, bad);
        /* broadcast from the last rank */
        for (size_t i = 0; i < count; i++)
            y[i] = rank == n - 1 ? val(n - 1, i) : -99.0f;
        GVQ(gvqBroadcast(y, y, count, gvqFloat32, n - 1, comm, NULL));
        bad = 0;
        for (size_t i = 0; i < count; i++)
            bad += y[i] != val(n - 1, i);
        CHECK(bad == 0, "broadcast of %zu: %zu wrong", count, bad);
        free(x);
        free(y);
    }
    /* allgather and reduce-scatter of 1001 per rank */
    size_t per = 1001;
    float *x = malloc(per * (size_t)n * sizeof *x), *y = malloc(per * (size_t)n * sizeof *y);
    for (size_t i = 0; i < per; i++)
        x[i] = val(rank, i);
    GVQ(gvqAllGather(x, y, per, gvqFloat32, comm, NULL));
    size_t bad = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < per; i++)
            bad += y[(size_t)r * per + i] != val(r, i);
    CHECK(bad == 0, "allgather: %zu wrong", bad);
    for (size_t i = 0; i < per * (size_t)n; i++)
        x[i] = val(rank, i);
    GVQ(gvqReduceScatter(x, y, per, gvqFloat32, gvqSum, comm, NULL));
    bad = 0;
    for (size_t i = 0; i < per; i++) {
        float want = 0;
        for (int r = 0; r < n; r++)
            want += val(r, (size_t)rank * per + i);
        bad += y[i] != want;
    }
    CHECK(bad == 0, "reduce-scatter: %zu wrong", bad);
    free(x);
    free(y);
}

/* ---- small calls of every collective: across hosts (no shared memory) reduce-scatter,
 * allgather, broadcast and reduce of a few KiB ride along with the call agreement (one
 * recursive-doubling exchange of their vector, src/comm/collectives.c); larger ones do not.
 * Integer, double and float elements, every op whose results the small integers keep exact. */
static void put(gvqDataType_t dt, void *buf, size_t i, double v) {
    if (dt == gvqInt32)
        ((int32_t *)buf)[i] = (int32_t)v;
    else if (dt == gvqFloat64)
        ((double *)buf)[i] = v;
    else
        ((float *)buf)[i] = (float)v;
}

static double get(gvqDataType_t dt, const void *buf, size_t i) {
    return dt == gvqInt32     ? ((const int32_t *)buf)[i]
           : dt == gvqFloat64 ? ((const double *)buf)[i]
                              : ((const float *)buf)[i];
}

/* element i of the op over every rank's val(r, i) */
static double reduced(gvqRedOp_t op, int n, size_t i) {
    double a = val(0, i);
    for (int r = 1; r < n; r++) {
        double b = val(r, i);
        a = op == gvqSum    ? a + b
            : op == gvqProd ? a * b
            : op == gvqMax  ? (a > b ? a : b)
                            : (a < b ? a : b);
    }
    return a;
}

static void small_case(gvqComm_t comm, int n, gvqDataType_t dt, gvqRedOp_t op, size_t per) {
    size_t es = dt == gvqFloat64 ? 8 : 4, all = per * (size_t)n;
    char *x = malloc(all * es), *y = malloc(all * es);
    CHECK(x != NULL && y != NULL, "out of memory");
    size_t bad = 0;
    /* reduce-scatter: block `rank` of the op over every rank's whole vector */
    for (size_t i = 0; i < all; i++)
        put(dt, x, i, val(rank, i));
    GVQ(gvqReduceScatter(x, y, per, dt, op, comm, NULL));
    for (size_t i = 0; i < per; i++)
        bad += get(dt, y, i) != reduced(op, n, (size_t)rank * per + i);
    CHECK(bad == 0, "reducescatter dtype %d op %d of %zu: %zu wrong", dt, op, per, bad);
    /* allgather: every rank's block in rank order */
    GVQ(gvqAllGather(x, y, per, dt, comm, NULL));
    bad = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < per; i++)
            bad += get(dt, y, (size_t)r * per + i) != val(r, i);
    CHECK(bad == 0, "allgather dtype %d of %zu: %zu wrong", dt, per, bad);
    /* reduce to the middle rank, broadcast from rank 0 (the whole vector of per * n) */
    int root = (n - 1) / 2;
    for (size_t i = 0; i < all; i++)
        put(dt, y, i, -99);
    GVQ(gvqReduce(x, rank == root ? y : NULL, all, dt, op, root, comm, NULL));
    bad = 0;
    for (size_t i = 0; rank == root && i < all; i++)
        bad += get(dt, y, i) != reduced(op, n, i);
    CHECK(bad == 0, "reduce dtype %d op %d of %zu to %d: %zu wrong", dt, op, all, root, bad);
    for (size_t i = 0; i < all; i++)
        put(dt, y, i, rank == 0 ? val(0, i) : -99);
    GVQ(gvqBroadcast(y, y, all, dt, 0, comm, NULL));
    bad = 0;
    for (size_t i = 0; i < all; i++)
        bad += get(dt, y, i) != val(0, i);
    CHECK(bad == 0, "broadcast dtype %d of %zu: %zu wrong", dt, all, bad);
    free(x);
    free(y);
}

static void test_small(gvqComm_t comm, int n) {
    static const struct {
        gvqDataType_t dt;
        gvqRedOp_t op;
    } cases[] = {{gvqInt32, gvqSum},   {gvqInt32, gvqProd},  {gvqInt32, gvqMax},
                 {gvqInt32, gvqMin},   {gvqFloat64, gvqSum}, {gvqFloat64, gvqMax},
                 {gvqFloat32, gvqMin}, {gvqFloat32, gvqProd}};
    static const size_t pers[] = {1, 3, 37, 300}; /* 300 float64s per rank: too large to ride */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t k = 0; k < sizeof pers / sizeof pers[0]; k++)
            small_case(comm, n, cases[c].dt, cases[c].op, pers[k]);
}

static void test_p2p(gvqComm_t comm, int n) {
    size_t count = 300001;
    float *x = malloc(count * sizeof *x), *y = malloc(count * sizeof *y);
    for (size_t i = 0; i < count; i++)
        x[i] = val(rank, i);
    int to = (rank + 1) % n, from = (rank + n - 1) % n;
    GVQ(gvqGroupStart());
    GVQ(gvqSend(x, count, gvqFloat32, to, comm, NULL));
    GVQ(gvqRecv(y, count, gvqFloat32, from, comm, NULL));
    GVQ(gvqGroupEnd());
    size_t bad = 0;
    for (size_t i = 0; i < count; i++)
        bad += y[i] != val(from, i);
    CHECK(bad == 0, "send/recv ring: %zu wrong", bad);
    free(x);
    free(y);
}

/* `calls` calls of one compressor on the same input: every rank's last output gathered must be
 * identical, and its relative error against the exact sum below `bound`. */
static void compressed_case(gvqComm_t comm, int n, const gvqCompressorConfig_t *cfg,
                            float (*in)(int r, size_t i), const char *name, int calls,
                            double bound) {
    size_t count = 100000;
    gvqCompressor_t cp;
    GVQ(gvqCompressorCreate(comm, count, cfg, &cp));
    float *x = malloc(count * sizeof *x), *y = malloc(count * sizeof *y);
    float *all = malloc(count * (size_t)n * sizeof *all);
    CHECK(x != NULL && y != NULL && all != NULL, "%s: out of memory", name);
    for (size_t i = 0; i < count; i++)
        x[i] = in(rank, i);
    for (int c = 0; c < calls; c++)
        GVQ(gvqAllReduceCompressed(x, y, count, gvqFloat32, gvqSum, cp, comm, NULL));
    GVQ(gvqAllGather(y, all, count, gvqFloat32, comm, NULL));
    size_t differ = 0;
    for (int r = 0; r < n; r++)
        differ += memcmp(all + (size_t)r * count, y, count * sizeof *y) != 0;
    CHECK(differ == 0, "%s: %zu rank(s) got other bits", name, differ);
    double err = 0, ref = 0;
    for (size_t i = 0; i < count; i++) {
        double want = 0;
        for (int r = 0; r < n; r++)
            want += in(r, i);
        err += (y[i] - want) * (y[i] - want);
        ref += want * want;
    }
    double rel = ref > 0 ? sqrt(err / ref) : 0;
    CHECK(rel < bound, "%s: relative error %.3f (bound %.2f)", name, rel, bound);
    if (rank == 0) printf("  %s over %d ranks: relative error %.4f\n", name, n, rel);
    GVQ(gvqCompressorDestroy(cp));
    free(x);
    free(y);
    free(all);
}

static float small_ints(int r, size_t i) {
    return val(r, i) / 30.0f;
}

/* Slices of 250 values that are all multiples of one pattern (a slice matrix of rank 1). */
static float rank_one(int r, size_t i) {
    return (1.0f + 0.25f * (float)r) * sinf(0.1f * (float)(i % 250) + 0.3f) *
           cosf(0.05f * (float)(i / 250));
}

/* QSGD 4-bit on the float wire and on the 8-bit integer wire, the tracked basis on the 16-bit
 * wire (its factor rings; with GVQ_ALGO=hier all three run through the hierarchy, the integer
 * wires agreeing on their scales across the hosts). The tracked basis (d 4) on slices of rank
 * 1, the same input each call: after 6 calls only the wire's rounding is left. */
static void test_compressed(gvqComm_t comm, int n) {
    gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cfg.codec = gvqCodecQsgd;
    cfg.qsgdBits = 4;
    compressed_case(comm, n, &cfg, small_ints, "QSGD 4-bit", 1, 0.5);
    cfg.integerBits = 8;
    compressed_case(comm, n, &cfg, small_ints, "QSGD 4-bit, 8-bit integer wire", 1, 0.5);
    gvqCompressorConfig_t track = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    track.codec = gvqCodecGradiveq;
    track.basisUpdate = gvqBasisTrack;
    track.sliceSize = 250;
    track.integerBits = 16;
    compressed_case(comm, n, &track, rank_one, "tracked basis d 4, 16-bit integer wire", 6, 0.01);
}

int main(int argc, char **argv) {
    if (getenv("GVQ_TEST_SKIP") != NULL) {
        printf("test_from_env: skipped (gvq built without UCX: no transport outside an MPI job)\n");
        return 77;
    }
    gvqComm_t comm;
    if (argc > 1 && strcmp(argv[1], "mixed") == 0) { /* ranks on different transports */
        gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
        cfg.timeoutMs = 20000;
        gvqResult_t res = gvqCommInitFromEnv(&comm, &cfg);
        const char *why = gvqGetLastError(NULL);
        int ok = res == gvqInvalidUsage && strstr(why, "GVQ_TRANSPORT") != NULL;
        printf("test_from_env mixed: %s (%s: \"%s\")\n", ok ? "PASS" : "FAIL",
               gvqGetErrorString(res), why);
        return ok ? 0 : 1;
    }
    GVQ(gvqCommInitFromEnv(&comm, NULL));
    int n = 0;
    GVQ(gvqCommUserRank(comm, &rank));
    GVQ(gvqCommCount(comm, &n));
    test_plain(comm, n);
    test_small(comm, n);
    test_p2p(comm, n);
    test_compressed(comm, n);
    GVQ(gvqCommDestroy(comm));
    if (argc > 1 && strcmp(argv[1], "mpi-free") == 0) {
        /* /proc/self/maps: no Open MPI transport component was loaded (the library is linked,
         * MPI_Init was never called, so mca_pml_* never appears) */
        FILE *f = fopen("/proc/self/maps", "r");
        char line[512];
        int mpi_loaded = 0;
        while (f != NULL && fgets(line, sizeof line, f) != NULL)
            mpi_loaded |= strstr(line, "mca_pml_") != NULL || strstr(line, "mca_btl_") != NULL;
        if (f != NULL) fclose(f);
        CHECK(!mpi_loaded, "an MPI transport was loaded: MPI was initialized");
    }
    printf("test_from_env: rank %d of %d: %s (%d failure(s))\n", rank, n,
           failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
