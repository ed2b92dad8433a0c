/*
 * test_mismatch.c -- calls whose arguments differ between the ranks (issue 13, class 2).
 *
 * Each part makes rank 0 (or rank 1) call a collective differently from the others: another
 * count, a datatype of the same width, another op, another root, or a call the rank refused
 * itself (alone, and inside a group). Every rank must fail the call well before the timeout,
 * with a last-error text naming both sides, and the next correct call must give every rank the
 * same correct result (no leftover message pairs with it).
 */
#include "gvq_mpi.h"
#include "mpitest.h"

#define TIMEOUT_MS 6000
#define FAST_S 3.0 /* a mismatch is found in one agreement, far below TIMEOUT_MS */
#define BIG 8192
#define BAD_OP ((gvqRedOp_t)42)

static gvqComm_t comm;
static float *sbuf, *rbuf; /* BIG * nranks floats each: no part writes past them */

static int mentions(const char *text, const char *word) {
    return text != NULL && strstr(text, word) != NULL;
}

/* The call returned got after `secs`; it must be want, fast, and the last error must name
 * both words (the two sides). */
static void failed_at(int line, const char *part, gvqResult_t got, gvqResult_t want, double secs,
                      const char *word_a, const char *word_b) {
    const char *last = gvqGetLastError(NULL);
    mt.checks += 3;
    if (got != want) {
        mt_report_at(__FILE__, line, "%s: expected %s, got %s; last error \"%s\"", part,
                     gvqGetErrorString(want), gvqGetErrorString(got), last ? last : "(NULL)");
        mt.failures++;
    }
    if (secs > FAST_S) {
        mt_report_at(__FILE__, line, "%s: took %.1f s (a mismatch must fail at once)", part, secs);
        mt.failures++;
    }
    if (!mentions(last, word_a) || !mentions(last, word_b)) {
        mt_report_at(__FILE__, line, "%s: last error \"%s\" does not name both \"%s\" and \"%s\"",
                     part, last ? last : "(NULL)", word_a, word_b);
        mt.failures++;
    }
}

#define FAILED(part, call, want, a, b)                                 \
    do {                                                               \
        MPI_Barrier(MPI_COMM_WORLD);                                   \
        double t0_ = mt_now();                                         \
        gvqResult_t r_ = (call);                                       \
        failed_at(__LINE__, part, r_, want, mt_now() - t0_, (a), (b)); \
    } while (0)

/* The next correct call: an allreduce of rank+1 (sum) must give N(N+1)/2 everywhere, bitwise
 * the same on every rank. */
static void next_call_works(const char *after) {
    int n = mt.nranks;
    for (int i = 0; i < 1000; i++)
        sbuf[i] = (float)(mt.rank + 1);
    memset(rbuf, 0, 1000 * sizeof *rbuf);
    gvqResult_t res = gvqAllReduce(sbuf, rbuf, 1000, gvqFloat32, gvqSum, comm, NULL);
    MT_CHECK(res == gvqSuccess, "after %s: the next allreduce returned %s (%s)", after,
             gvqGetErrorString(res), gvqGetLastError(NULL));
    int wrong = 0;
    for (int i = 0; i < 1000; i++)
        wrong += rbuf[i] != (float)(n * (n + 1) / 2);
    MT_CHECK(wrong == 0, "after %s: the next allreduce has %d wrong values (rbuf[0] = %g)", after,
             wrong, rbuf[0]);
    MT_CHECK(mt_identical(rbuf, 1000 * sizeof *rbuf), "after %s: ranks differ", after);
}

static void fill(void);
static const char *only; /* argv[1]: run only the parts whose name contains it */

static int part(const char *name) {
    if (only != NULL && strstr(name, only) == NULL) return 0;
    mt_part(name, 60);
    fill();
    return 1;
}

static void fill(void) {
    for (size_t i = 0; i < (size_t)BIG * (size_t)mt.nranks; i++)
        sbuf[i] = (float)(mt.rank + 1);
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    int r = mt.rank, N = mt.nranks;
    only = argc > 1 ? argv[1] : NULL;
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = TIMEOUT_MS;
    const char *tr = getenv("GVQ_TRANSPORT");
    if (tr != NULL && strcmp(tr, "ucx") == 0) { /* the UCX transport: through the bootstrap */
        gvqUniqueId id;
        memset(&id, 0, sizeof id);
        if (r == 0) MT_OK(gvqGetUniqueId(&id));
        MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
        MT_OK(gvqCommInitRankConfig(&comm, N, id, r, &cfg));
    } else {
        MT_OK(gvqCommInitMPI(&comm, MPI_COMM_WORLD, &cfg));
    }
    size_t cap = (size_t)BIG * (size_t)N;
    sbuf = calloc(cap, sizeof *sbuf);
    rbuf = calloc(cap, sizeof *rbuf);
    if (comm == NULL || sbuf == NULL || rbuf == NULL || N < 2) {
        if (N < 2 && r == 0) printf("needs 2 or more ranks\n");
        return mt_finish("test_mismatch");
    }
    fill();
    next_call_works("start");

    if (part("count")) {
        FAILED("allreduce count",
               gvqAllReduce(sbuf, rbuf, r == 0 ? BIG : 256, gvqFloat32, gvqSum, comm, NULL),
               gvqInvalidArgument, "count 8192", "count 256");
        next_call_works("a count mismatch");
    }
    if (part("small counts")) {
        /* both small enough for the vector to ride along with the signature (recursive.c): the
         * messages differ in length, every rank still reads them, and nothing is written */
        for (int i = 0; i < 512; i++)
            rbuf[i] = -7.0f;
        FAILED("allreduce small counts",
               gvqAllReduce(sbuf, rbuf, r == 0 ? 512 : 256, gvqFloat32, gvqSum, comm, NULL),
               gvqInvalidArgument, "count 512", "count 256");
        int written = 0;
        for (int i = 0; i < 512; i++)
            written += rbuf[i] != -7.0f;
        MT_CHECK(written == 0, "a failed small allreduce wrote %d values of its output", written);
        next_call_works("a small count mismatch");
        /* 8 KiB does not ride along on one host (its signature alone) against 1 KiB riding */
        FAILED("allreduce counts, one riding",
               gvqAllReduce(sbuf, rbuf, r == 0 ? 2048 : 256, gvqFloat32, gvqSum, comm, NULL),
               gvqInvalidArgument, "count 2048", "count 256");
        next_call_works("a count mismatch, one riding");
    }
    if (part("same-width datatype")) {
        for (int i = 0; i < 256; i++)
            rbuf[i] = -7.0f;
        FAILED("allreduce dtype",
               gvqAllReduce(sbuf, rbuf, 256, r == 0 ? gvqFloat32 : gvqInt32, gvqSum, comm, NULL),
               gvqInvalidArgument, "float", "int32");
        int written = 0; /* equal lengths: the vectors were exchanged, but none was written */
        for (int i = 0; i < 256; i++)
            written += rbuf[i] != -7.0f;
        MT_CHECK(written == 0, "a failed allreduce wrote %d values of its output", written);
        next_call_works("a datatype mismatch");
    }
    if (part("op")) {
        FAILED("allreduce op",
               gvqAllReduce(sbuf, rbuf, 256, gvqFloat32, r == 0 ? gvqSum : gvqMax, comm, NULL),
               gvqInvalidArgument, "sum", "max");
        next_call_works("an op mismatch");
    }
    if (part("broadcast root")) {
        FAILED("broadcast root",
               gvqBroadcast(sbuf, rbuf, 256, gvqFloat32, r == 0 ? 0 : 1, comm, NULL),
               gvqInvalidArgument, "root 0", "root 1");
        next_call_works("a broadcast root mismatch");
    }
    if (part("reduce root")) {
        FAILED("reduce root",
               gvqReduce(sbuf, rbuf, 256, gvqFloat32, gvqSum, r == 0 ? 0 : 1, comm, NULL),
               gvqInvalidArgument, "root 0", "root 1");
        next_call_works("a reduce root mismatch");
    }
    if (part("allgather count")) {
        FAILED("allgather count",
               gvqAllGather(sbuf, rbuf, r == 0 ? 512 : 256, gvqFloat32, comm, NULL),
               gvqInvalidArgument, "count 512", "count 256");
        next_call_works("an allgather count mismatch");
    }
    if (part("reduce-scatter count")) {
        FAILED("reduce-scatter count",
               gvqReduceScatter(sbuf, rbuf, r == 0 ? 512 : 256, gvqFloat32, gvqSum, comm, NULL),
               gvqInvalidArgument, "count 512", "count 256");
        next_call_works("a reduce-scatter count mismatch");
    }
    if (part("compressed config")) {
        /* compressors of different configs on the ranks (QSGD 8 bits on rank 0, 4 elsewhere) */
        gvqCompressorConfig_t qc = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
        qc.codec = gvqCodecQsgd;
        qc.qsgdBits = r == 0 ? 8 : 4;
        gvqCompressor_t qz = NULL;
        MT_OK(gvqCompressorCreate(comm, 1024, &qc, &qz));
        FAILED("compressed config",
               gvqAllReduceCompressed(sbuf, rbuf, 1024, gvqFloat32, gvqSum, qz, comm, NULL),
               gvqInvalidArgument, "gvqAllReduceCompressed", "compressor");
        next_call_works("a compressed call with another config");
        /* rank 1 passes a wrong count: it refuses, the others fail at once */
        FAILED("compressed refused",
               gvqAllReduceCompressed(sbuf, rbuf, r == 1 ? 512 : 1024, gvqFloat32, gvqSum, qz, comm,
                                      NULL),
               r == 1 ? gvqInvalidArgument : gvqRemoteError, r == 1 ? "count 512" : "rank 1",
               r == 1 ? "1024" : "refused");
        next_call_works("a compressed call one rank refused");
        MT_OK(gvqCompressorDestroy(qz));
    }
    if (part("one rank refused its call")) {
        /* rank 1 passes a bad op: it refuses (invalid argument), the others must fail at once */
        FAILED("refused",
               gvqAllReduce(sbuf, rbuf, 256, gvqFloat32, r == 1 ? BAD_OP : gvqSum, comm, NULL),
               r == 1 ? gvqInvalidArgument : gvqRemoteError,
               r == 1 ? "invalid reduction op" : "rank 1", r == 1 ? "42" : "refused");
        next_call_works("a call one rank refused");
    }
    if (part("one rank refused its call in a group")) {
        MPI_Barrier(MPI_COMM_WORLD);
        {
            double t0 = mt_now();
            gvqGroupStart();
            gvqAllReduce(sbuf, rbuf, 256, gvqFloat32, r == 1 ? BAD_OP : gvqSum, comm, NULL);
            gvqAllReduce(sbuf + 256, rbuf + 256, 256, gvqFloat32, gvqSum, comm, NULL);
            gvqResult_t res = gvqGroupEnd();
            failed_at(__LINE__, "refused in a group", res,
                      r == 1 ? gvqInvalidArgument : gvqRemoteError, mt_now() - t0,
                      r == 1 ? "invalid reduction op" : "rank 1", r == 1 ? "42" : "refused");
        }
        next_call_works("a group one rank refused");
    }
    mt_part("done", 0);
    MT_OK(gvqCommDestroy(comm));
    free(sbuf);
    free(rbuf);
    return mt_finish("test_mismatch");
}
