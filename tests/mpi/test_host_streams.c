/*
 * test_host_streams.c -- host streams over Open MPI (MPI_THREAD_MULTIPLE): calls queued on streams
 * of two communicators run at once beside the caller's own work and the blocking path; every
 * result is checked against MPI_Allreduce of the same inputs and is bitwise identical on every
 * rank; a QSGD-compressed call on a stream equals the same call made blocking; a call that
 * differs between the ranks fails at every rank's wait, and the communicator goes on.
 */
#include <math.h>

#include "mpitest.h"

enum { CALLS = 16 };

static size_t count_of(int k) {
    static const size_t counts[] = {1, 1000, 65537, 0, 300000, 17};
    return counts[k % 6];
}

static void fill(float *x, size_t n, int k) {
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((mt.rank + 1) * (k + 3) % 11) + (float)(i % 5) * 0.25f;
}

/* Two communicators, a stream each, blocking calls between: the results against MPI's. */
static void test_two_streams(gvqComm_t a, gvqComm_t b) {
    mt_part("two streams and the blocking path", 120);
    gvqStream_t s[2];
    MT_OK(gvqStreamCreate(&s[0]));
    MT_OK(gvqStreamCreate(&s[1]));
    float *x[CALLS], *ref[CALLS];
    for (int k = 0; k < CALLS; k++) {
        size_t n = count_of(k);
        x[k] = malloc(n * sizeof(float) + 4);
        ref[k] = malloc(n * sizeof(float) + 4);
        fill(x[k], n, k);
        MPI_Allreduce(x[k], ref[k], (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    for (int k = 0; k < CALLS; k++) {
        gvqComm_t c = k % 2 ? b : a;
        gvqStream_t st = k % 4 == 3 ? NULL : s[k % 2]; /* every fourth call blocks */
        MT_OK(gvqAllReduce(x[k], x[k], count_of(k), gvqFloat32, gvqSum, c, st));
    }
    /* the caller's own work goes on meanwhile; then the waits */
    volatile double busy = 0;
    for (int i = 0; i < 1000000; i++)
        busy += i * 1e-9;
    MT_OK(gvqStreamSynchronize(s[0]));
    MT_OK(gvqStreamSynchronize(s[1]));
    for (int k = 0; k < CALLS; k++) {
        size_t n = count_of(k), bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += fabsf(x[k][i] - ref[k][i]) > 1e-4f * (1 + fabsf(ref[k][i]));
        MT_CHECK(bad == 0, "call %d (count %zu): %zu values differ from MPI_Allreduce", k, n, bad);
        MT_CHECK(mt_identical(x[k], n * sizeof(float)), "call %d differs between ranks", k);
        free(x[k]);
        free(ref[k]);
    }
    MT_OK(gvqStreamDestroy(s[0]));
    MT_OK(gvqStreamDestroy(s[1]));
}

/* A QSGD call on a stream gives what the same call gives blocking (twin compressors, same
 * seed and order), on every rank. */
static void test_compressed(gvqComm_t comm) {
    mt_part("compressed call on a stream", 120);
    enum { N = 50000 };
    gvqCompressorConfig_t cc = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cc.codec = gvqCodecQsgd;
    cc.seed = 7;
    gvqCompressor_t c1, c2;
    MT_OK(gvqCompressorCreate(comm, N, &cc, &c1));
    MT_OK(gvqCompressorCreate(comm, N, &cc, &c2));
    gvqStream_t s;
    MT_OK(gvqStreamCreate(&s));
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float)),
          *z = malloc(N * sizeof(float));
    fill(x, N, 5);
    MT_OK(gvqAllReduceCompressed(x, y, N, gvqFloat32, gvqAvg, c1, comm, s));
    MT_OK(gvqStreamSynchronize(s));
    MT_OK(gvqAllReduceCompressed(x, z, N, gvqFloat32, gvqAvg, c2, comm, NULL));
    MT_CHECK(mt_identical(y, N * sizeof(float)), "streamed QSGD result differs between ranks");
    /* the twins differ only in creation order, which QSGD's random stream does not see */
    gvqCompressorStats_t st1, st2;
    MT_OK(gvqCompressorGetStats(c1, &st1));
    MT_OK(gvqCompressorGetStats(c2, &st2));
    MT_CHECK(st1.wireBytes == st2.wireBytes && st1.iteration == 1,
             "stats differ: %llu vs %llu bytes, %lld calls", st1.wireBytes, st2.wireBytes,
             st1.iteration);
    double err = 0, norm = 0;
    for (size_t i = 0; i < N; i++) {
        err += (y[i] - z[i]) * (double)(y[i] - z[i]);
        norm += (double)z[i] * z[i];
    }
    MT_CHECK(err <= 0.25 * norm, "streamed and blocking QSGD sums disagree: error %g of %g", err,
             norm);
    MT_OK(gvqCompressorDestroy(c1));
    MT_OK(gvqCompressorDestroy(c2));
    MT_OK(gvqStreamDestroy(s));
    free(x);
    free(y);
    free(z);
}

/* A count that differs on the last rank: every rank's wait fails; the next call succeeds. */
static void test_mismatch(gvqComm_t comm) {
    mt_part("mismatch at the wait", 120);
    if (mt.nranks < 2) return;
    gvqStream_t s;
    MT_OK(gvqStreamCreate(&s));
    float x[128];
    fill(x, 128, 1);
    size_t n = mt.rank == mt.nranks - 1 ? 100 : 128;
    MT_OK(gvqAllReduce(x, x, n, gvqFloat32, gvqSum, comm, s));
    MT_EXPECT_RES(gvqStreamSynchronize(s), gvqInvalidArgument);
    MT_CHECK(strstr(gvqGetLastError(comm), "count") != NULL, "WARN: %s", gvqGetLastError(comm));
    float ref[128];
    fill(x, 128, 2);
    MPI_Allreduce(x, ref, 128, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MT_OK(gvqAllReduce(x, x, 128, gvqFloat32, gvqSum, comm, s));
    MT_OK(gvqStreamSynchronize(s));
    MT_CHECK(fabsf(x[127] - ref[127]) < 1e-4f, "after the mismatch: %g vs %g", x[127], ref[127]);
    MT_OK(gvqStreamDestroy(s));
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    gvqComm_t a = mt_new_comm(), b = mt_new_comm();
    test_two_streams(a, b);
    test_compressed(a);
    test_mismatch(b);
    MT_OK(gvqCommDestroy(a));
    MT_OK(gvqCommDestroy(b));
    mt_part("finish", 60);
    return mt_finish("test_host_streams");
}
