/*
 * test_wait.c -- a thread waiting for a late peer leaves its core (GVQ_WAIT), in a job of two
 * ranks started without mpirun (the UCX transport: the waiter sleeps on the worker's event fd).
 *
 *   test_wait block   GVQ_WAIT=block: rank 0's allreduces wait ~0.4 s for rank 1 each;
 *   test_wait auto    GVQ_WAIT=auto, with a busy thread pinned to the waiter's core: the first
 *                     yield gives the core away, after which the waiter must sleep;
 *   test_wait spin    GVQ_WAIT=spin with the busy thread, for comparison: reports, checks
 *                     only the sums (a spinning waiter uses its share of the core).
 *
 * Checked on rank 0, per call (1000 and 1 << 20 floats, and a 4-bit QSGD call): the sum is exact
 * (or QSGD's is identical on both ranks), the call ends once the peer comes (well within 3 s),
 * the waiting thread's CPU time is under a quarter of the wait (a thread that slept used next
 * to none; one that spun uses most of it on an idle core), and it slept: at least 50 voluntary
 * context switches during the wait (a sleep is one; a spinning thread's yields are not
 * voluntary switches, and beside a busy thread its yields alone keep its CPU time low, so the
 * CPU time does not tell auto's switch to sleeping). The busy thread's work is printed.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "launch_test.h"

enum { LATE_US = 400000 };

static int stop_busy;
static volatile uint64_t busy_work;

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *busy(void *p) {
    (void)p;
    while (!__atomic_load_n(&stop_busy, __ATOMIC_ACQUIRE))
        busy_work = busy_work + 1;
    return NULL;
}

/* Pin this thread and t to one core (the first this process may run on). */
static int pin_together(pthread_t t) {
    cpu_set_t all, one;
    if (sched_getaffinity(0, sizeof all, &all) != 0) return -1;
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &all))
        cpu++;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (pthread_setaffinity_np(pthread_self(), sizeof one, &one) != 0 ||
        pthread_setaffinity_np(t, sizeof one, &one) != 0)
        return -1;
    return cpu;
}

int main(int argc, char **argv) {
    if (getenv("GVQ_TEST_SKIP") != NULL) {
        printf("test_wait: skipped (gvq built without UCX: no transport outside an MPI job)\n");
        return 77;
    }
    const char *mode = argc > 1 ? argv[1] : "block";
    setenv("GVQ_WAIT", mode, 1); /* read at the first wait */
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = 20000;
    gvqComm_t comm;
    int nranks;
    GVQ(gvqCommInitFromEnv(&comm, &cfg));
    GVQ(gvqCommUserRank(comm, &rank));
    GVQ(gvqCommCount(comm, &nranks));
    if (nranks != 2) {
        fprintf(stderr, "test_wait: needs 2 ranks, has %d\n", nranks);
        return 1;
    }
    pthread_t bt;
    int pinned = -1;
    int spin = strcmp(mode, "spin") == 0;
    if (rank == 0 && (spin || strcmp(mode, "auto") == 0)) {
        pthread_create(&bt, NULL, busy, NULL);
        pinned = pin_together(bt);
        CHECK(pinned >= 0, "cannot pin the waiter and the busy thread to one core");
    }
    const size_t counts[] = {1000, (size_t)1 << 20, (size_t)1 << 20};
    float *x = malloc(counts[1] * sizeof *x), *y = malloc(counts[1] * sizeof *y);
    gvqCompressor_t q = NULL;
    gvqCompressorConfig_t qc = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    qc.codec = gvqCodecQsgd;
    GVQ(gvqCompressorCreate(comm, counts[2], &qc, &q));
    for (int k = 0; k < 3; k++) {
        size_t n = counts[k];
        for (size_t i = 0; i < n; i++)
            x[i] = val(rank, i + (size_t)k);
        GVQ(gvqAllReduce(x, y, 1, gvqFloat32, gvqSum, comm, NULL)); /* both ranks here */
        if (rank == 1) usleep(LATE_US);
        uint64_t work0 = busy_work;
        struct rusage u0, u1;
        getrusage(RUSAGE_THREAD, &u0);
        double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
        if (k < 2)
            GVQ(gvqAllReduce(x, y, n, gvqFloat32, gvqSum, comm, NULL));
        else
            GVQ(gvqAllReduceCompressed(x, y, n, gvqFloat32, gvqSum, q, comm, NULL));
        double wall = clock_s(CLOCK_MONOTONIC) - w0, cpu = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
        getrusage(RUSAGE_THREAD, &u1);
        long sleeps = u1.ru_nvcsw - u0.ru_nvcsw;
        if (k < 2) {
            size_t bad = 0;
            for (size_t i = 0; i < n; i++)
                bad += y[i] != val(0, i + (size_t)k) + val(1, i + (size_t)k);
            CHECK(bad == 0, "call %d (%zu floats): %zu wrong", k, n, bad);
        } else { /* QSGD: rank 1's output must equal rank 0's */
            float *other = malloc(n * sizeof *other);
            GVQ(gvqBroadcast(y, other, n, gvqFloat32, 1, comm, NULL));
            CHECK(memcmp(y, other, n * sizeof *y) == 0, "QSGD's outputs differ between ranks");
            free(other);
        }
        if (rank != 0) continue;
        printf("test_wait: GVQ_WAIT=%s, call %d (%zu floats%s): waited %.3f s, thread CPU %.3f s "
               "(%.1f%%), %ld voluntary switches",
               mode, k, n, k == 2 ? ", QSGD" : "", wall, cpu, 100.0 * cpu / wall, sleeps);
        if (pinned >= 0)
            printf(", busy thread on core %d: %.0f M increments", pinned,
                   (double)(busy_work - work0) / 1e6);
        printf("\n");
        CHECK(wall > 0.2 && wall < 3.0, "call %d waited %.3f s for a peer %.1f s late", k, wall,
              LATE_US / 1e6);
        CHECK(spin || cpu < 0.25 * wall, "call %d: the waiting thread used %.3f s of CPU in %.3f s",
              k, cpu, wall);
        CHECK(spin || sleeps >= 50, "call %d: the waiting thread slept %ld times in %.3f s", k,
              sleeps, wall);
    }
    if (pinned >= 0) {
        __atomic_store_n(&stop_busy, 1, __ATOMIC_RELEASE);
        pthread_join(bt, NULL);
    }
    GVQ(gvqCompressorDestroy(q));
    GVQ(gvqCommDestroy(comm));
    free(x);
    free(y);
    if (failures == 0) printf("test_wait: rank %d passed (GVQ_WAIT=%s)\n", rank, mode);
    return failures == 0 ? 0 : 1;
}
