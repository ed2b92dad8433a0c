/*
 * test_timeout.c -- a peer that never answers must not hang anyone. One program, three
 * scenarios (argv[1]):
 *
 *   collective  The communicator has timeoutMs = 1500. The last rank never calls gvqAllReduce
 *               (it sleeps, then destroys its communicator); the others' gvqAllReduce returns
 *               gvqTimeout after about 1.5 s, gvqCommGetAsyncError then says gvqTimeout, the
 *               next call is refused with it, gvqCommDestroy succeeds, and every rank leaves
 *               through MPI_Finalize.
 *   init        The last rank never calls gvqCommInitRankConfig; the others' (timeoutMs 1500)
 *               returns gvqTimeout and leaves *comm alone.
 *   init-root   The same with rank 0 silent, the rank whose gvqGetUniqueId serves the
 *               bootstrap.
 *   abort       Rank 0 runs gvqAllReduce on a thread while no other rank joins; its main
 *               thread calls gvqCommAbort after 300 ms, which must make the allreduce return
 *               gvqInvalidUsage promptly.
 *
 * Every scenario ends with an MPI_Barrier on MPI_COMM_WORLD and MPI_Finalize: the ctest
 * timeout (120 s) turns a hang into a failure.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gvq.h"
#include "mpitest.h"

#define TIMEOUT_MS 1500
#define MIN_ELAPSED 1.4  /* s: gvqTimeout must not come early */
#define MAX_ELAPSED 10.0 /* s: nor late */
/* 4 MiB of floats: large enough that MPI moves it by rendezvous, so sends to the silent rank
 * are still pending when the others time out. */
#define COUNT ((size_t)1 << 20)

static gvqComm_t init_comm(int timeout_ms, gvqResult_t *res_out, double *elapsed) {
    gvqUniqueId id;
    memset(&id, 0, sizeof id);
    if (mt.rank == 0) MT_OK(gvqGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    if (timeout_ms >= 0) cfg.timeoutMs = timeout_ms;
    gvqComm_t comm = NULL;
    double t0 = mt_now();
    *res_out = gvqCommInitRankConfig(&comm, mt.nranks, id, mt.rank, &cfg);
    *elapsed = mt_now() - t0;
    return comm;
}

static void scenario_collective(void) {
    int n = mt.nranks, silent = n - 1;
    gvqResult_t res;
    double el;
    gvqComm_t comm = init_comm(TIMEOUT_MS, &res, &el);
    MT_CHECK(res == gvqSuccess && comm != NULL, "gvqCommInitRankConfig: returned %d (%s): %s",
             (int)res, gvqGetErrorString(res), gvqGetLastError(NULL));
    if (comm == NULL) return;
    float *a = calloc(COUNT, sizeof(float)), *b = calloc(COUNT, sizeof(float));
    for (size_t i = 0; i < COUNT; i++)
        a[i] = (float)(i % 1000);
    if (mt.rank != silent) {
        double t0 = mt_now();
        res = gvqAllReduce(a, b, COUNT, gvqFloat32, gvqSum, comm, NULL);
        el = mt_now() - t0;
        MT_CHECK(res == gvqTimeout,
                 "gvqAllReduce with rank %d silent: expected gvqTimeout, got "
                 "%d (%s) after %.2f s",
                 silent, (int)res, gvqGetErrorString(res), el);
        MT_CHECK(el >= MIN_ELAPSED && el < MAX_ELAPSED,
                 "gvqAllReduce timed out after %.2f s; "
                 "expected %.1f..%.1f s (timeoutMs %d)",
                 el, MIN_ELAPSED, MAX_ELAPSED, TIMEOUT_MS);
        const char *last = gvqGetLastError(NULL);
        MT_CHECK(last != NULL && last[0] != '\0', "gvqGetLastError is empty after gvqTimeout");
        if (mt.rank == 0)
            printf("  rank 0: gvqAllReduce -> %s after %.2f s: \"%s\"\n", gvqGetErrorString(res),
                   el, last ? last : "");

        gvqResult_t async = gvqSuccess;
        MT_OK(gvqCommGetAsyncError(comm, &async));
        MT_CHECK(async == gvqTimeout,
                 "gvqCommGetAsyncError after the timeout: expected "
                 "gvqTimeout, got %d (%s)",
                 (int)async, gvqGetErrorString(async));

        t0 = mt_now();
        res = gvqAllReduce(a, b, 16, gvqFloat32, gvqSum, comm, NULL);
        el = mt_now() - t0;
        MT_CHECK(res == gvqTimeout,
                 "gvqAllReduce on the broken comm: expected gvqTimeout "
                 "(refused with the comm's error), got %d (%s)",
                 (int)res, gvqGetErrorString(res));
        MT_CHECK(el < 1.0, "gvqAllReduce on the broken comm took %.2f s to refuse", el);
        res = gvqBroadcast(a, b, 16, gvqFloat32, 0, comm, NULL);
        MT_CHECK(res == gvqTimeout,
                 "gvqBroadcast on the broken comm: expected gvqTimeout, got "
                 "%d (%s)",
                 (int)res, gvqGetErrorString(res));
    } else {
        mt_sleep_ms(5000); /* never joins the allreduce */
        gvqResult_t async = gvqInternalError;
        MT_OK(gvqCommGetAsyncError(comm, &async));
        MT_CHECK(async == gvqSuccess, "the silent rank's comm: expected gvqSuccess, got %d (%s)",
                 (int)async, gvqGetErrorString(async));
    }
    double t0 = mt_now();
    MT_OK(gvqCommDestroy(comm));
    el = mt_now() - t0;
    MT_CHECK(el < 5.0, "gvqCommDestroy took %.2f s", el);
    free(a);
    free(b);
}

static void scenario_init(int silent) {
    int n = mt.nranks;
    gvqUniqueId id;
    memset(&id, 0, sizeof id);
    if (mt.rank == 0) MT_OK(gvqGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (mt.rank == silent) {
        mt_sleep_ms(TIMEOUT_MS + 500); /* never joins */
        return;
    }
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = TIMEOUT_MS;
    gvqComm_t sentinel = (gvqComm_t)(uintptr_t)0x1234, comm = sentinel;
    double t0 = mt_now();
    gvqResult_t res = gvqCommInitRankConfig(&comm, n, id, mt.rank, &cfg);
    double el = mt_now() - t0;
    MT_CHECK(res == gvqTimeout,
             "gvqCommInitRankConfig with rank %d missing: expected gvqTimeout, "
             "got %d (%s) after %.2f s: %s",
             silent, (int)res, gvqGetErrorString(res), el, gvqGetLastError(NULL));
    MT_CHECK(el >= MIN_ELAPSED && el < MAX_ELAPSED,
             "gvqCommInitRankConfig gave up after %.2f s; "
             "expected %.1f..%.1f s (timeoutMs %d)",
             el, MIN_ELAPSED, MAX_ELAPSED, TIMEOUT_MS);
    MT_CHECK(comm == sentinel, "the failed gvqCommInitRankConfig wrote *comm");
    if (res == gvqSuccess && comm != sentinel) gvqCommDestroy(comm);
    if (mt.rank == (silent + 1) % n)
        printf("  rank %d: gvqCommInitRankConfig -> %s after %.2f s: \"%s\"\n", mt.rank,
               gvqGetErrorString(res), el, gvqGetLastError(NULL));
}

typedef struct {
    gvqComm_t comm;
    float *a, *b;
    gvqResult_t res;
    double elapsed;
} abort_job_t;

static void *abort_victim(void *arg) {
    abort_job_t *j = arg;
    double t0 = mt_now();
    j->res = gvqAllReduce(j->a, j->b, COUNT, gvqFloat32, gvqSum, j->comm, NULL);
    j->elapsed = mt_now() - t0;
    return NULL;
}

static void scenario_abort(void) {
    gvqResult_t res;
    double el;
    gvqComm_t comm = init_comm(-1, &res, &el); /* default timeout: only the abort can help */
    MT_CHECK(res == gvqSuccess && comm != NULL, "gvqCommInitRank: returned %d (%s): %s", (int)res,
             gvqGetErrorString(res), gvqGetLastError(NULL));
    if (comm == NULL) return;
    if (mt.rank != 0) {
        MPI_Barrier(MPI_COMM_WORLD); /* rank 0 gets here once its allreduce was aborted */
        MT_OK(gvqCommDestroy(comm));
        return;
    }
    abort_job_t j = {comm, calloc(COUNT, sizeof(float)), calloc(COUNT, sizeof(float)), gvqSuccess,
                     -1.0};
    pthread_t th;
    if (pthread_create(&th, NULL, abort_victim, &j) != 0) {
        MT_FAIL("pthread_create failed");
        MPI_Barrier(MPI_COMM_WORLD);
        return;
    }
    mt_sleep_ms(300);
    double t0 = mt_now();
    MT_OK(gvqCommAbort(comm));
    double abort_s = mt_now() - t0;
    pthread_join(th, NULL);
    double joined_s = mt_now() - t0;
    if (mt.nranks > 1) {
        MT_CHECK(j.res == gvqInvalidUsage,
                 "the aborted gvqAllReduce: expected gvqInvalidUsage, "
                 "got %d (%s)",
                 (int)j.res, gvqGetErrorString(j.res));
    } else { /* one rank: nothing to wait for, the allreduce finished before the abort */
        MT_CHECK(j.res == gvqSuccess, "gvqAllReduce on 1 rank: got %d (%s)", (int)j.res,
                 gvqGetErrorString(j.res));
    }
    MT_CHECK(abort_s < 5.0 && joined_s < 5.0,
             "gvqCommAbort took %.2f s, the aborted call "
             "returned %.2f s after it",
             abort_s, joined_s);
    printf("  rank 0: aborted gvqAllReduce -> %s after %.2f s (abort took %.3f s)\n",
           gvqGetErrorString(j.res), j.elapsed, abort_s);
    float x = 1, y = 0;
    res = gvqAllReduce(&x, &y, 1, gvqFloat32, gvqSum, comm, NULL);
    MT_CHECK(res == gvqInvalidUsage,
             "gvqAllReduce on the aborted (freed) comm: expected "
             "gvqInvalidUsage (README: calls after an abort are misuse), got %d (%s)",
             (int)res, gvqGetErrorString(res));
    res = gvqCommDestroy(comm);
    MT_CHECK(res == gvqInvalidArgument,
             "gvqCommDestroy after gvqCommAbort: expected "
             "gvqInvalidArgument, got %d (%s)",
             (int)res, gvqGetErrorString(res));
    free(j.a);
    free(j.b);
    MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    const char *mode = argc > 1 ? argv[1] : "";
    char name[64];
    snprintf(name, sizeof name, "test_timeout %s", mode);
    if (strcmp(mode, "collective") == 0 && mt.nranks >= 2) {
        scenario_collective();
    } else if (strcmp(mode, "init") == 0 && mt.nranks >= 2) {
        scenario_init(mt.nranks - 1);
    } else if (strcmp(mode, "init-root") == 0 && mt.nranks >= 2) {
        scenario_init(0); /* the rank that made the id (and serves the bootstrap) never joins */
    } else if (strcmp(mode, "abort") == 0) {
        scenario_abort();
    } else {
        if (mt.rank == 0)
            printf("usage: test_timeout collective|init|init-root|abort (collective and init need "
                   ">= 2 "
                   "ranks)\n");
        MT_FAIL("bad mode '%s' for %d rank(s)", mode, mt.nranks);
    }
    if (mt.rank == 0) printf("  all ranks reach MPI_Barrier and MPI_Finalize\n");
    MPI_Barrier(MPI_COMM_WORLD);
    return mt_finish(name);
}
