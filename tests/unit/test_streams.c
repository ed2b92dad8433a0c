/*
 * test_streams.c -- host streams (stream.c) on 1..4 in-process ranks: calls queued on two
 * streams and the blocking path meet in issue order and give the closed-form sums; events;
 * groups, compressed, sparse and parameter-server calls on a stream; refusals at issue time and
 * errors at the wait (with gvqGetLastError and gvqCommGetAsyncError); destroy and abort with work
 * in flight. Run under ThreadSanitizer and AddressSanitizer by .ci/run.
 */
#define _DEFAULT_SOURCE
#include <string.h>
#include <unistd.h>

#include "gvq_test.h"

enum { CALLS = 24 };

/* Call k's input on rank r: small integers, so every sum is exact in float32 and int32. */
static int32_t value(int r, int k, size_t i) {
    return (int32_t)(r * 1000 + k * 7 + (int)(i % 13));
}
static int32_t sum_of(int nranks, int k, size_t i) {
    int32_t s = 0;
    for (int r = 0; r < nranks; r++)
        s += value(r, k, i);
    return s;
}
static size_t count_of(int k) {
    static const size_t counts[] = {1, 7, 1000, 4099, 0, 65537};
    return counts[k % 6];
}

/* ---- order: two streams and the blocking path on one communicator -------------------------- */

static void rank_order(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)arg;
    gvqStream_t s[2];
    gvqEvent_t ev;
    EXPECT_RES(gvqStreamCreate(&s[0]), gvqSuccess);
    EXPECT_RES(gvqStreamCreate(&s[1]), gvqSuccess);
    EXPECT_RES(gvqEventCreate(&ev), gvqSuccess);
    EXPECT_RES(gvqEventSynchronize(ev), gvqSuccess); /* never recorded: complete */
    int32_t *buf[CALLS];
    for (int k = 0; k < CALLS; k++) {
        size_t n = count_of(k);
        buf[k] = malloc(n * sizeof(int32_t) + 1);
        for (size_t i = 0; i < n; i++)
            buf[k][i] = value(rank, k, i);
        /* every fifth call blocks; the others alternate between the streams, and the float
         * calls reinterpret the same integers (exact up to 2^24) */
        gvqStream_t st = k % 5 == 4 ? NULL : s[k % 2];
        if (k % 3 == 0) {
            float *f = (float *)buf[k];
            for (size_t i = 0; i < n; i++)
                f[i] = (float)value(rank, k, i);
            EXPECT_RES(gvqAllReduce(f, f, n, gvqFloat32, gvqSum, comm, st), gvqSuccess);
        } else {
            EXPECT_RES(gvqAllReduce(buf[k], buf[k], n, gvqInt32, gvqSum, comm, st), gvqSuccess);
        }
        if (k == 10) EXPECT_RES(gvqEventRecord(ev, s[0]), gvqSuccess);
    }
    EXPECT_RES(gvqEventSynchronize(ev), gvqSuccess);
    EXPECT_RES(gvqEventQuery(ev), gvqSuccess);
    for (int k = 0; k <= 10; k += 2) { /* stream 0's calls before the event are done */
        size_t n = count_of(k);
        if (n == 0) continue;
        double got = k % 3 == 0 ? ((float *)buf[k])[n - 1] : buf[k][n - 1];
        EXPECT(got == sum_of(nranks, k, n - 1), "rank %d call %d before the event: %g", rank, k,
               got);
    }
    EXPECT_RES(gvqStreamSynchronize(s[0]), gvqSuccess);
    EXPECT_RES(gvqStreamSynchronize(s[1]), gvqSuccess);
    EXPECT_RES(gvqStreamQuery(s[0]), gvqSuccess);
    for (int k = 0; k < CALLS; k++) {
        int bad = 0;
        for (size_t i = 0; i < count_of(k); i++) {
            double got = k % 3 == 0 ? ((float *)buf[k])[i] : buf[k][i];
            if (got != sum_of(nranks, k, i) && bad++ < 2)
                EXPECT(0, "n=%d rank %d call %d [%zu]: got %g want %d", nranks, rank, k, i, got,
                       sum_of(nranks, k, i));
        }
        free(buf[k]);
    }
    gvqResult_t async = gvqInternalError;
    EXPECT_RES(gvqCommGetAsyncError(comm, &async), gvqSuccess);
    EXPECT(async == gvqSuccess, "async error %s", gvqGetErrorString(async));
    EXPECT_RES(gvqEventDestroy(ev), gvqSuccess);
    EXPECT_RES(gvqStreamDestroy(s[0]), gvqSuccess);
    EXPECT_RES(gvqStreamDestroy(s[1]), gvqSuccess);
}

/* ---- a group (ring exchange + broadcast), compressed and sparse calls on one stream -------- */

static void rank_kinds(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)arg;
    gvqStream_t s;
    EXPECT_RES(gvqStreamCreate(&s), gvqSuccess);
    enum { N = 300 };
    int32_t out[N], in[N], bc[N];
    for (int i = 0; i < N; i++) {
        out[i] = rank * 100 + i;
        bc[i] = rank == 0 ? 5 * i : -1;
    }
    int right = (rank + 1) % nranks, left = (rank + nranks - 1) % nranks;
    EXPECT_RES(gvqGroupStart(), gvqSuccess);
    EXPECT_RES(gvqBroadcast(bc, bc, N, gvqInt32, 0, comm, s), gvqSuccess);
    EXPECT_RES(gvqSend(out, N, gvqInt32, right, comm, s), gvqSuccess);
    EXPECT_RES(gvqRecv(in, N, gvqInt32, left, comm, s), gvqSuccess);
    EXPECT_RES(gvqGroupEnd(), gvqSuccess);

    /* GradiVeQ's sampling phase with codec none: the exact sum */
    gvqCompressorConfig_t cc = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    gvqCompressor_t cp;
    EXPECT_RES(gvqCompressorCreate(comm, 512, &cc, &cp), gvqSuccess);
    float g[512];
    for (int i = 0; i < 512; i++)
        g[i] = (float)(rank + i);
    EXPECT_RES(gvqAllReduceCompressed(g, g, 512, gvqFloat32, gvqSum, cp, comm, s), gvqSuccess);

    int64_t idx[2] = {rank, 7};
    float val[2] = {1.0f, (float)rank};
    gvqSparseRows_t rows = GVQ_SPARSE_ROWS_INITIALIZER;
    EXPECT_RES(
        gvqSparseAllGatherv(idx, val, 2, 16, 1, gvqFloat32, GVQ_SPARSE_SUMMED, &rows, comm, s),
        gvqSuccess);
    /* a parameter server on the stream: push, apply, pull (SGD, lr 1: w = -sum of pushes) */
    gvqPsConfig_t pc = GVQ_PS_CONFIG_INITIALIZER;
    pc.learningRate = 1.0;
    pc.stream = s;
    gvqPs_t ps;
    EXPECT_RES(gvqPsCreate(comm, 10, 2, gvqFloat32, &pc, &ps), gvqSuccess);
    int64_t pidx[2] = {3, (int64_t)rank % 10};
    float pg[4] = {1.0f, 2.0f, 0.5f, 0.5f}, pv[4] = {0};
    EXPECT_RES(gvqPsPush(ps, pidx, pg, 2), gvqSuccess);
    EXPECT_RES(gvqPsApply(ps), gvqSuccess);
    EXPECT_RES(gvqPsPull(ps, pidx, pv, 2), gvqSuccess);
    EXPECT_RES(gvqStreamSynchronize(s), gvqSuccess);
    /* row 3: every rank pushed (1, 2), and rank 3 (if any) also (0.5, 0.5) */
    float w3a = -(float)nranks - (nranks > 3 ? 0.5f : 0.0f);
    float w3b = -2.0f * (float)nranks - (nranks > 3 ? 0.5f : 0.0f);
    EXPECT(pv[0] == w3a && pv[1] == w3b, "rank %d PS row 3 = (%g, %g) want (%g, %g)", rank, pv[0],
           pv[1], w3a, w3b);
    EXPECT_RES(gvqPsDestroy(ps), gvqSuccess);

    for (int i = 0; i < N; i++) {
        EXPECT(in[i] == left * 100 + i, "rank %d recv[%d] = %d", rank, i, in[i]);
        EXPECT(bc[i] == 5 * i, "rank %d broadcast[%d] = %d", rank, i, bc[i]);
        if (in[i] != left * 100 + i || bc[i] != 5 * i) break;
    }
    int rsum = nranks * (nranks - 1) / 2;
    for (int i = 0; i < 512; i++)
        if (g[i] != (float)(rsum + nranks * i)) {
            EXPECT(0, "rank %d compressed[%d] = %g want %d", rank, i, g[i], rsum + nranks * i);
            break;
        }
    /* rows 0..nranks-1 once each (value 1), row 7 the sum of ranks (plus 1 if rank 7 exists) */
    size_t want_rows = (size_t)nranks + (nranks <= 7);
    EXPECT(rows.nrows == want_rows, "rank %d: %zu summed rows, want %zu", rank, rows.nrows,
           want_rows);
    for (size_t i = 0; i < rows.nrows && rows.nrows == want_rows; i++) {
        float want = rows.indices[i] == 7 ? (float)rsum + (nranks > 7) : 1.0f;
        EXPECT(((float *)rows.values)[i] == want, "rank %d row %lld = %g want %g", rank,
               (long long)rows.indices[i], ((float *)rows.values)[i], want);
    }
    gvqSparseRowsFree(&rows);
    EXPECT_RES(gvqCompressorDestroy(cp), gvqSuccess);
    EXPECT_RES(gvqStreamDestroy(s), gvqSuccess);
}

/* ---- refusals at issue, errors at the wait ------------------------------------------------ */

static void rank_errors(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)arg;
    gvqStream_t s;
    EXPECT_RES(gvqStreamCreate(&s), gvqSuccess);
    float x[64];
    for (int i = 0; i < 64; i++)
        x[i] = 1.0f;
    /* rank 0 refuses its own call at issue (NULL sendbuff); the others' calls fail at the wait */
    const float *send = rank == 0 ? NULL : x;
    EXPECT_RES(gvqAllReduce(send, x, 64, gvqFloat32, gvqSum, comm, s),
               rank == 0 ? gvqInvalidArgument : gvqSuccess);
    if (rank == 0)
        EXPECT(strstr(gvqGetLastError(comm), "sendbuff") != NULL, "WARN: %s",
               gvqGetLastError(comm));
    gvqResult_t res = gvqStreamSynchronize(s);
    if (nranks > 1 && rank != 0)
        EXPECT(res != gvqSuccess, "rank %d: the peer's refusal was not reported", rank);
    else
        EXPECT(res == gvqSuccess, "rank 0: its refusal reported twice (%s)",
               gvqGetErrorString(res));

    /* counts that differ between the ranks: every rank's wait fails, naming both sides */
    size_t n = rank == nranks - 1 ? 32 : 64;
    EXPECT_RES(gvqAllReduce(x, x, n, gvqFloat32, gvqSum, comm, s), gvqSuccess);
    gvqEvent_t ev;
    EXPECT_RES(gvqEventCreate(&ev), gvqSuccess);
    EXPECT_RES(gvqEventRecord(ev, s), gvqSuccess);
    res = gvqEventSynchronize(ev);
    if (nranks > 1) {
        EXPECT(res == gvqInvalidArgument, "rank %d: mismatch gave %s at the event", rank,
               gvqGetErrorString(res));
        EXPECT(strstr(gvqGetLastError(comm), "count") != NULL, "rank %d WARN: %s", rank,
               gvqGetLastError(comm));
        gvqResult_t async = gvqSuccess;
        EXPECT_RES(gvqCommGetAsyncError(comm, &async), gvqSuccess);
        EXPECT(async == gvqInvalidArgument, "rank %d async %s", rank, gvqGetErrorString(async));
        EXPECT_RES(gvqStreamSynchronize(s), gvqInvalidArgument); /* the event did not forget */
    }
    EXPECT_RES(gvqStreamSynchronize(s), gvqSuccess); /* reported once */

    /* the communicator is usable: nothing was left for the next call */
    for (int i = 0; i < 64; i++)
        x[i] = (float)rank;
    EXPECT_RES(gvqAllReduce(x, x, 64, gvqFloat32, gvqSum, comm, s), gvqSuccess);
    EXPECT_RES(gvqStreamSynchronize(s), gvqSuccess);
    EXPECT(x[63] == (float)(nranks * (nranks - 1) / 2), "rank %d after errors: %g", rank, x[63]);
    gvqResult_t async = gvqInternalError;
    EXPECT_RES(gvqCommGetAsyncError(comm, &async), gvqSuccess);
    EXPECT(async == gvqSuccess, "rank %d async after success %s", rank, gvqGetErrorString(async));

    /* a sparse index out of range is data: refused when the call runs, at the wait */
    int64_t idx = rank == 0 ? 99 : 0;
    gvqSparseRows_t rows = GVQ_SPARSE_ROWS_INITIALIZER;
    EXPECT_RES(gvqSparseAllGatherv(&idx, x, 1, 16, 1, gvqFloat32, 0, &rows, comm, s), gvqSuccess);
    res = gvqStreamSynchronize(s);
    EXPECT(res != gvqSuccess, "rank %d: out-of-range index not reported (%s)", rank,
           gvqGetErrorString(res));
    if (rank == 0)
        EXPECT(strstr(gvqGetLastError(comm), "outside") != NULL, "WARN: %s", gvqGetLastError(comm));
    gvqSparseRowsFree(&rows);

    /* host streams order host buffers only; bad handles */
    EXPECT_RES(gvqStreamSynchronize(NULL), gvqInvalidArgument);
    EXPECT_RES(gvqEventRecord(ev, NULL), gvqInvalidArgument);
    EXPECT_RES(gvqEventRecord(NULL, s), gvqInvalidArgument);
    EXPECT_RES(gvqStreamCreate(NULL), gvqInvalidArgument);
    EXPECT_RES(gvqEventRecord(ev, s), gvqSuccess);
    EXPECT_RES(gvqStreamDestroy(s), gvqSuccess);
    EXPECT_RES(gvqStreamSynchronize(s), gvqInvalidArgument); /* destroyed */
    EXPECT_RES(gvqStreamDestroy(s), gvqInvalidArgument);
    EXPECT_RES(gvqEventSynchronize(ev), gvqSuccess); /* its stream ran everything */
    EXPECT_RES(gvqEventDestroy(ev), gvqSuccess);
    EXPECT_RES(gvqEventDestroy(ev), gvqInvalidArgument);
}

/* ---- destroy with work in flight ---------------------------------------------------------- */

typedef struct {
    int destroy_comm; /* 1: gvqCommDestroy right after issuing; 0: gvqStreamDestroy */
    gvqComm_t *comms;
} inflight_t;

static void rank_inflight(gvqComm_t comm, int rank, int nranks, void *arg) {
    inflight_t *a = arg;
    gvqStream_t s;
    EXPECT_RES(gvqStreamCreate(&s), gvqSuccess);
    enum { K = 6, N = 20000 };
    int32_t *b = malloc(K * N * sizeof *b);
    for (int k = 0; k < K; k++)
        for (int i = 0; i < N; i++)
            b[k * N + i] = value(rank, k, (size_t)i);
    for (int k = 0; k < K; k++)
        EXPECT_RES(gvqAllReduce(b + k * N, b + k * N, N, gvqInt32, gvqSum, comm, s), gvqSuccess);
    if (a->destroy_comm) {
        EXPECT_RES(gvqCommDestroy(comm), gvqSuccess); /* waits for the queued calls */
        a->comms[rank] = NULL;
        EXPECT_RES(gvqStreamSynchronize(s), gvqSuccess);
        EXPECT_RES(gvqStreamDestroy(s), gvqSuccess);
    } else {
        EXPECT_RES(gvqStreamDestroy(s), gvqSuccess); /* waits, then frees */
    }
    for (int k = 0; k < K; k++)
        for (int i = 0; i < N; i += 997)
            EXPECT(b[k * N + i] == sum_of(nranks, k, (size_t)i), "rank %d call %d [%d]: %d", rank,
                   k, i, b[k * N + i]);
    free(b);
}

static void *inflight_thread(void *p) {
    gvq_test_thread_t *t = p;
    t->fn(t->comm, t->rank, t->nranks, t->arg);
    return NULL;
}

static void test_inflight(int nranks, int destroy_comm) {
    gvqComm_t comms[8];
    EXPECT_RES(gvq_comm_init_inproc(nranks, NULL, comms), gvqSuccess);
    inflight_t a = {destroy_comm, comms};
    gvq_test_thread_t th[8];
    pthread_t tid[8];
    for (int r = 0; r < nranks; r++) {
        th[r] = (gvq_test_thread_t){rank_inflight, comms[r], r, nranks, &a};
        pthread_create(&tid[r], NULL, inflight_thread, &th[r]);
    }
    for (int r = 0; r < nranks; r++)
        pthread_join(tid[r], NULL);
    for (int r = 0; r < nranks; r++)
        if (comms[r] != NULL) EXPECT_RES(gvqCommDestroy(comms[r]), gvqSuccess);
}

/* ---- abort with work in flight: the peer never joins ------------------------------------ */

static void test_abort_inflight(void) {
    gvqComm_t comms[2];
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = 600000; /* only the abort can end the wait */
    EXPECT_RES(gvq_comm_init_inproc(2, &cfg, comms), gvqSuccess);
    gvqStream_t s;
    EXPECT_RES(gvqStreamCreate(&s), gvqSuccess);
    float x[3][100] = {{0}};
    for (int k = 0; k < 3; k++)
        EXPECT_RES(gvqAllReduce(x[k], x[k], 100, gvqFloat32, gvqSum, comms[0], s), gvqSuccess);
    EXPECT_RES(gvqStreamQuery(s), gvqInProgress);
    usleep(100000);
    uint64_t t0 = gvq_now_ns();
    EXPECT_RES(gvqCommAbort(comms[0]), gvqSuccess); /* waits until its queued calls failed */
    EXPECT_RES(gvqStreamSynchronize(s), gvqInvalidUsage);
    EXPECT(strstr(gvqGetLastError(NULL), "abort") != NULL, "WARN: %s", gvqGetLastError(NULL));
    EXPECT((gvq_now_ns() - t0) / 1e9 < 5, "abort with queued calls took too long");
    EXPECT_RES(gvqAllReduce(x[0], x[0], 100, gvqFloat32, gvqSum, comms[0], s), gvqInvalidUsage);
    EXPECT_RES(gvqStreamDestroy(s), gvqSuccess);
    EXPECT_RES(gvqCommDestroy(comms[1]), gvqSuccess);
}

int main(void) {
    for (int n = 1; n <= 4; n++) {
        gvq_test_run(n, NULL, rank_order, NULL);
        gvq_test_run(n, NULL, rank_kinds, NULL);
        gvq_test_run(n, NULL, rank_errors, NULL);
    }
    for (int n = 1; n <= 3; n++) {
        test_inflight(n, 1);
        test_inflight(n, 0);
    }
    test_abort_inflight();
    return gvq_test_finish("test_streams");
}
