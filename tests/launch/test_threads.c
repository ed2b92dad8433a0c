/*
 * test_threads.c -- gvq from several threads of each process, in a job started without mpirun
 * (scripts/gvq-launch.sh; the UCX transport, so no Open MPI is loaded and ThreadSanitizer sees
 * every shared access of gvq's own: .ci/run runs this under GVQ_SANITIZE=thread).
 *
 * What the MPI tests mpi_host_streams and mpi_peer_faults_threads do, over UCX:
 *   1. two threads of every rank create a communicator each (gvqCommInitRank on unique ids made
 *      by rank 0 and broadcast over the first one) at the same moment, while the main thread
 *      runs allreduces on the first: three communicators in use at once, each checked against
 *      sums computed here;
 *   2. every thread queues calls on a host stream of its communicator beside blocking calls of
 *      its own, and a 4-bit QSGD call on a stream equals the same call made blocking;
 *   3. gvqCommAbort from another thread ends rank 0's receive that no rank answers;
 *   4. a peer fault met by threads: the last rank leaves (_exit) while every other rank's two
 *      threads are in calls; each thread's call fails (within the timeout, not a hang), and the
 *      communicators are aborted and destroyed.
 * Passes when every check passes on every rank (the leaving rank exits 0).
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "launch_test.h"

enum { THREADS = 2, CALLS = 12, TIMEOUT_MS = 5000 };

/* malloc or a clear exit: a test that ran out of memory says so instead of crashing later */
static void *must_alloc(size_t bytes) {
    void *p = malloc(bytes);
    if (p == NULL) {
        fprintf(stderr, "test_threads: out of memory for %zu bytes\n", bytes);
        exit(1);
    }
    return p;
}

static int nranks;
static gvqUniqueId ids[THREADS];
static int leaving; /* set (atomically) once the peer-fault part starts */
static int ready;   /* threads done with parts 1 and 2 (atomic) */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t count_of(int k) {
    static const size_t counts[] = {1, 1000, 65537, 17, 300000, 4099};
    return counts[k % 6];
}

/* rank r's input of call k, thread t: small integers, exact sums */
static float in(int r, int t, int k, size_t i) {
    return val(r, i + (size_t)(k * 3 + t * 11));
}

static size_t wrong(const float *y, size_t count, int t, int k) {
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        float s = 0;
        for (int r = 0; r < nranks; r++)
            s += in(r, t, k, i);
        bad += y[i] != s;
    }
    return bad;
}

typedef struct {
    int t;
    gvqComm_t comm;
    gvqResult_t init, fault;
    int bad;
    double fault_s;
} job_t;

/* 1 and 2: blocking calls and calls on a host stream, then (4) calls until the peer fault */
static void *thread_main(void *p) {
    job_t *j = p;
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = TIMEOUT_MS;
    j->init = gvqCommInitRankConfig(&j->comm, nranks, ids[j->t], rank, &cfg);
    if (j->init != gvqSuccess) { /* counted as ready: the main thread reports it, not a hang */
        __atomic_add_fetch(&ready, 1, __ATOMIC_RELEASE);
        return NULL;
    }
    float *x[CALLS], *y[CALLS];
    for (int k = 0; k < CALLS; k++) {
        size_t c = count_of(k);
        x[k] = must_alloc(c * sizeof(float));
        y[k] = must_alloc(c * sizeof(float));
        for (size_t i = 0; i < c; i++)
            x[k][i] = in(rank, j->t, k, i);
    }
    gvqStream_t s = NULL;
    gvqResult_t r = gvqStreamCreate(&s);
    /* even calls queued on the stream, odd ones blocking: the same order on every rank */
    for (int k = 0; r == gvqSuccess && k < CALLS; k++) {
        r = gvqAllReduce(x[k], y[k], count_of(k), gvqFloat32, gvqSum, j->comm,
                         k % 2 == 0 ? s : NULL);
        if (r == gvqSuccess && k % 2 == 1) j->bad += wrong(y[k], count_of(k), j->t, k) != 0;
    }
    if (r == gvqSuccess) r = gvqStreamSynchronize(s);
    for (int k = 0; r == gvqSuccess && k < CALLS; k += 2)
        j->bad += wrong(y[k], count_of(k), j->t, k) != 0;
    if (r != gvqSuccess) {
        fprintf(stderr, "rank %d thread %d: a call failed: %s (%s)\n", rank, j->t,
                gvqGetErrorString(r), gvqGetLastError(NULL));
        j->bad++;
    }
    /* a compressed call on the stream equals the same call made blocking */
    size_t cc = 65536;
    gvqCompressorConfig_t ccfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    ccfg.codec = gvqCodecQsgd;
    ccfg.qsgdBits = 4;
    gvqCompressor_t cp = NULL, cp2 = NULL;
    if (r == gvqSuccess) r = gvqCompressorCreate(j->comm, cc, &ccfg, &cp);
    if (r == gvqSuccess) r = gvqCompressorCreate(j->comm, cc, &ccfg, &cp2);
    float *a = must_alloc(cc * sizeof *a), *b = must_alloc(cc * sizeof *b);
    for (size_t i = 0; i < cc; i++)
        a[i] = in(rank, j->t, 5, i) / 7.0f;
    if (r == gvqSuccess) r = gvqAllReduceCompressed(a, b, cc, gvqFloat32, gvqSum, cp, j->comm, s);
    if (r == gvqSuccess) r = gvqStreamSynchronize(s);
    float *c2 = must_alloc(cc * sizeof *c2);
    if (r == gvqSuccess)
        r = gvqAllReduceCompressed(a, c2, cc, gvqFloat32, gvqSum, cp2, j->comm, NULL);
    if (r == gvqSuccess && memcmp(b, c2, cc * sizeof *b) != 0) {
        fprintf(stderr, "rank %d thread %d: QSGD on a stream differs from the same call blocking\n",
                rank, j->t);
        j->bad++;
    }
    if (r == gvqSuccess) { /* and near the exact sum: 4-bit QSGD's error is about 0.2 here */
        double e2 = 0, s2 = 0;
        for (size_t i = 0; i < cc; i++) {
            double want = 0;
            for (int q = 0; q < nranks; q++)
                want += in(q, j->t, 5, i) / 7.0f;
            e2 += (b[i] - want) * (b[i] - want), s2 += want * want;
        }
        if (!(e2 <= 0.25 * s2)) { /* relative error above 0.5, or NaN */
            fprintf(stderr, "rank %d thread %d: QSGD's relative error %.3f (at most 0.5)\n", rank,
                    j->t, s2 > 0 ? sqrt(e2 / s2) : -1.0);
            j->bad++;
        }
    }
    if (r != gvqSuccess) {
        fprintf(stderr, "rank %d thread %d: the compressed part failed: %s\n", rank, j->t,
                gvqGetErrorString(r));
        j->bad++;
    }
    /* 4: calls until the last rank leaves: they must fail, not hang (90 s at most) */
    __atomic_add_fetch(&ready, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&leaving, __ATOMIC_ACQUIRE))
        usleep(1000);
    double t0 = now_s();
    gvqResult_t f = gvqSuccess;
    for (int k = 0; r == gvqSuccess && nranks > 1 && f == gvqSuccess && now_s() - t0 < 90.0; k++)
        f = gvqAllReduce(x[k % CALLS], y[k % CALLS], count_of(k % CALLS), gvqFloat32, gvqSum,
                         j->comm, NULL);
    j->fault = f;
    j->fault_s = now_s() - t0;
    (void)gvqCompressorDestroy(cp);
    (void)gvqCompressorDestroy(cp2);
    (void)gvqStreamDestroy(s);
    for (int k = 0; k < CALLS; k++) {
        free(x[k]);
        free(y[k]);
    }
    free(a);
    free(b);
    free(c2);
    return NULL;
}

typedef struct {
    gvqComm_t comm;
    gvqResult_t res;
    int receiving; /* set (atomically) by the main thread right before its receive */
} abort_t;

/* gvqCommAbort frees the communicator: it must come after the receive has started (200 ms
 * after the main thread says it is about to call), not before */
static void *aborter(void *p) {
    abort_t *a = p;
    while (!__atomic_load_n(&a->receiving, __ATOMIC_ACQUIRE))
        usleep(1000);
    usleep(200000);
    a->res = gvqCommAbort(a->comm);
    return NULL;
}

int main(void) {
    if (getenv("GVQ_TEST_SKIP") != NULL) {
        printf("test_threads: skipped (gvq built without UCX: no transport outside an MPI job)\n");
        return 77;
    }
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = TIMEOUT_MS;
    gvqComm_t comm, lone;
    int lone_aborted = 0;
    GVQ(gvqCommInitFromEnv(&comm, &cfg));
    GVQ(gvqCommUserRank(comm, &rank));
    GVQ(gvqCommCount(comm, &nranks));
    if (rank == 0)
        for (int t = 0; t < THREADS; t++)
            GVQ(gvqGetUniqueId(&ids[t]));
    GVQ(gvqBroadcast(ids, ids, sizeof ids, gvqUint8, 0, comm, NULL));
    /* a communicator of this rank alone would not wait on anyone: part 3 uses a second one */
    gvqUniqueId lid;
    if (rank == 0) GVQ(gvqGetUniqueId(&lid));
    GVQ(gvqBroadcast(&lid, &lid, sizeof lid, gvqUint8, 0, comm, NULL));
    GVQ(gvqCommInitRankConfig(&lone, nranks, lid, rank, &cfg));

    /* 1 and 2: the threads' communicators are made while this thread uses the first one */
    job_t jobs[THREADS];
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) {
        jobs[t] = (job_t){t, NULL, gvqInternalError, gvqSuccess, 0, 0.0};
        pthread_create(&th[t], NULL, thread_main, &jobs[t]);
    }
    size_t mc = 100000;
    float *x = must_alloc(mc * sizeof *x), *y = must_alloc(mc * sizeof *y);
    for (size_t i = 0; i < mc; i++)
        x[i] = val(rank, i);
    for (int k = 0; k < 8; k++) {
        GVQ(gvqAllReduce(x, y, mc, gvqFloat32, gvqSum, comm, NULL));
        size_t bad = 0;
        for (size_t i = 0; i < mc; i++) {
            float s = 0;
            for (int r = 0; r < nranks; r++)
                s += val(r, i);
            bad += y[i] != s;
        }
        CHECK(bad == 0, "main thread's allreduce %d: %zu wrong", k, bad);
    }

    /* 3: rank 0 receives from rank 1 what it never sends; another thread aborts */
    if (rank == 0 && nranks > 1) {
        abort_t a = {lone, gvqInternalError, 0};
        pthread_t ta;
        if (pthread_create(&ta, NULL, aborter, &a) != 0) {
            fprintf(stderr, "rank 0: cannot start the aborting thread\n");
            exit(1);
        }
        double t0 = now_s();
        __atomic_store_n(&a.receiving, 1, __ATOMIC_RELEASE);
        gvqResult_t r = gvqRecv(y, 16, gvqFloat32, 1, lone, NULL);
        double took = now_s() - t0;
        pthread_join(ta, NULL);
        lone_aborted = a.res == gvqSuccess;
        CHECK(r == gvqInvalidUsage && a.res == gvqSuccess && took >= 0.15 &&
                  took < TIMEOUT_MS / 1000.0,
              "a receive aborted from another thread: %s after %.2f s (abort: %s)",
              gvqGetErrorString(r), took, gvqGetErrorString(a.res));
    }
    /* every rank past part 3, and its threads past 1 and 2, before the last one leaves */
    while (__atomic_load_n(&ready, __ATOMIC_ACQUIRE) < THREADS)
        usleep(1000);
    GVQ(gvqAllReduce(x, y, 1, gvqFloat32, gvqSum, comm, NULL)); /* a barrier */

    /* 4: the last rank leaves while the others' threads are in calls */
    if (nranks > 1 && rank == nranks - 1) {
        /* its threads' parts 1 and 2 are done (ready, acquired above): judged before it leaves */
        for (int t = 0; t < THREADS; t++) {
            CHECK(jobs[t].init == gvqSuccess, "thread %d: gvqCommInitRank: %s", t,
                  gvqGetErrorString(jobs[t].init));
            CHECK(jobs[t].bad == 0, "thread %d: %d wrong result(s) or failed call(s)", t,
                  jobs[t].bad);
        }
        __atomic_store_n(&leaving, 1, __ATOMIC_RELEASE);
        usleep(300000);
        printf("test_threads: rank %d of %d leaves now (_exit) while the others' threads call%s\n",
               rank, nranks, failures ? " (after failures)" : "");
        fflush(stdout);
        _exit(failures ? 1 : 0);
    }
    __atomic_store_n(&leaving, 1, __ATOMIC_RELEASE);
    for (int t = 0; t < THREADS; t++) {
        pthread_join(th[t], NULL);
        CHECK(jobs[t].init == gvqSuccess, "thread %d: gvqCommInitRank: %s", t,
              gvqGetErrorString(jobs[t].init));
        CHECK(jobs[t].bad == 0, "thread %d: %d wrong result(s) or failed call(s)", t, jobs[t].bad);
        if (nranks > 1)
            CHECK(jobs[t].fault != gvqSuccess && jobs[t].fault_s < 3.0 * TIMEOUT_MS / 1000.0,
                  "thread %d: after the last rank left: %s after %.2f s (want an error within "
                  "three timeouts)",
                  t, gvqGetErrorString(jobs[t].fault), jobs[t].fault_s);
        if (jobs[t].comm != NULL) {
            if (nranks > 1)
                (void)gvqCommAbort(jobs[t].comm);
            else
                GVQ(gvqCommDestroy(jobs[t].comm));
        }
    }
    if (nranks > 1) {
        (void)gvqCommAbort(comm);
        if (!lone_aborted) (void)gvqCommAbort(lone);
    } else {
        GVQ(gvqCommDestroy(comm));
        GVQ(gvqCommDestroy(lone));
    }
    printf("test_threads: rank %d of %d: %d threads, their faults %s/%s after %.2f/%.2f s; %s "
           "(%d failure(s))\n",
           rank, nranks, THREADS, gvqGetErrorString(jobs[0].fault),
           gvqGetErrorString(jobs[1].fault), jobs[0].fault_s, jobs[1].fault_s,
           failures ? "FAIL" : "PASS", failures);
    free(x);
    free(y);
    return failures ? 1 : 0;
}
