/*
 * test_peer_faults.c -- faults between peers must never corrupt a rank's memory or keep it
 * from exiting. One program, one scenario per argv[1]:
 *
 *   mismatch    Ranks call with different sizes (256 against 8192 floats): gvqAllReduce
 *               (out of place and in place) and gvqSend/gvqRecv both ways. Every buffer sits
 *               between guard zones of 64 KiB that are checked after the call: a byte written
 *               outside a buffer fails the test (the MPI tests do not run under ASan, so the
 *               guards do that work). The receiver of a message of the wrong size must
 *               get gvqRemoteError; no rank may get gvqSuccess from a mismatched allreduce.
 *   late        A peer that resumes after the others gave up: the last rank sleeps past the
 *               timeout, then runs its allreduce. The others time out, free their buffers,
 *               destroy the communicator, fill fresh buffers (canaries, which malloc may place
 *               where the freed ones were) and run allreduces on a new communicator while the
 *               late rank's transfers arrive. The canaries and results must stay intact.
 *   sigstop     The same with a peer stopped (SIGSTOP) in the middle of its allreduces and
 *               continued (SIGCONT, from rank 0) once the others moved on.
 *   exit-stopped  as exit, but the silent rank is stopped (SIGSTOP) and resumed only 30 s
 *               later: the survivors must leave within 12 s of their failed call (issue 39:
 *               on one host the shared-memory agreement's timeout did not bound MPI_Finalize)
 *   exit        gvq initializes MPI (the program never calls MPI_Init) and a peer never joins
 *               an allreduce; after the timeout every process must still exit (gvq's MPI
 *               finalization at exit must not hang on the broken communicator).
 *   threads     Two threads of every process call gvqCommInitRank at once before MPI is
 *               initialized (gvq initializes it once); both communicators must work.
 *
 * The last two scenarios run without MPI_Init by the program: the unique ids travel through a
 * file named after the job, and the ranks come from Open MPI's environment.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "gvq.h"
#include "mpitest.h"

#define TIMEOUT_MS 1000
#define GUARD_BYTES ((size_t)64 << 10)
#define GUARD_BYTE 0xA5
#define SMALL 256
#define LARGE 8192

/* ---- guarded buffers ------------------------------------------------------------------------ */

typedef struct {
    unsigned char *base;
    float *p;
    size_t count;
} guarded_t;

static guarded_t guarded_alloc(size_t count, float fill) {
    guarded_t g = {malloc(count * sizeof(float) + 2 * GUARD_BYTES), NULL, count};
    if (g.base == NULL) MPI_Abort(MPI_COMM_WORLD, 2);
    memset(g.base, GUARD_BYTE, GUARD_BYTES);
    memset(g.base + GUARD_BYTES + count * sizeof(float), GUARD_BYTE, GUARD_BYTES);
    g.p = (float *)(g.base + GUARD_BYTES);
    for (size_t i = 0; i < count; i++)
        g.p[i] = fill;
    return g;
}

/* Number of guard bytes that changed. */
static size_t guard_damage(const guarded_t *g) {
    size_t bad = 0;
    const unsigned char *after = g->base + GUARD_BYTES + g->count * sizeof(float);
    for (size_t i = 0; i < GUARD_BYTES; i++)
        bad += (g->base[i] != GUARD_BYTE) + (after[i] != GUARD_BYTE);
    return bad;
}

static void guarded_free(guarded_t *g) {
    free(g->base);
    g->base = NULL;
}

static gvqComm_t comm_with_timeout(MPI_Comm over, int timeout_ms) {
    int r = 0, n = 0;
    MPI_Comm_rank(over, &r);
    MPI_Comm_size(over, &n);
    gvqUniqueId id;
    memset(&id, 0, sizeof id);
    if (r == 0) MT_OK(gvqGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, over);
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = timeout_ms;
    gvqComm_t comm = NULL;
    MT_OK(gvqCommInitRankConfig(&comm, n, id, r, &cfg));
    if (comm == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
    return comm;
}

static int any_rank(int flag) {
    int all = 0;
    MPI_Allreduce(&flag, &all, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    return all;
}

/* ---- mismatch ------------------------------------------------------------------------------- */

static void mismatch_allreduce(int in_place) {
    size_t count = mt.rank == 0 ? SMALL : LARGE;
    gvqComm_t comm = comm_with_timeout(MPI_COMM_WORLD, TIMEOUT_MS);
    guarded_t s = guarded_alloc(count, 1.0f), d = guarded_alloc(count, 0.0f);
    gvqResult_t res =
        gvqAllReduce(in_place ? d.p : s.p, d.p, count, gvqFloat32, gvqSum, comm, NULL);
    MT_CHECK(res != gvqSuccess, "gvqAllReduce of %zu floats (%s) against %d on rank 0: gvqSuccess",
             count, in_place ? "in place" : "out of place", SMALL);
    MT_CHECK(!any_rank(res == gvqSuccess), "mismatched gvqAllReduce: gvqSuccess on some rank");
    size_t bad = guard_damage(&s) + guard_damage(&d);
    MT_CHECK(bad == 0, "mismatched gvqAllReduce (%s) wrote %zu byte(s) outside its buffers",
             in_place ? "in place" : "out of place", bad);
    if (mt.rank == 0)
        printf("  allreduce %s: rank 0 -> %s: \"%s\"\n", in_place ? "in place" : "out of place",
               gvqGetErrorString(res), gvqGetLastError(NULL));
    MT_OK(gvqCommDestroy(comm));
    guarded_free(&s);
    guarded_free(&d);
}

/* Rank 0 sends `scount` floats to rank 1, which receives `rcount`. */
static void mismatch_p2p(size_t scount, size_t rcount) {
    gvqComm_t comm = comm_with_timeout(MPI_COMM_WORLD, TIMEOUT_MS);
    if (mt.rank == 0) {
        guarded_t s = guarded_alloc(scount, 2.0f);
        gvqResult_t res = gvqSend(s.p, scount, gvqFloat32, 1, comm, NULL);
        MT_CHECK(res == gvqSuccess || res == gvqTimeout,
                 "gvqSend of %zu floats to a gvqRecv of %zu: got %d (%s)", scount, rcount, (int)res,
                 gvqGetErrorString(res));
        MT_CHECK(guard_damage(&s) == 0, "gvqSend wrote outside its buffer");
        guarded_free(&s);
    } else if (mt.rank == 1) {
        guarded_t d = guarded_alloc(rcount, 0.0f);
        gvqResult_t res = gvqRecv(d.p, rcount, gvqFloat32, 0, comm, NULL);
        MT_CHECK(res == gvqRemoteError,
                 "gvqRecv of %zu floats from a gvqSend of %zu: expected gvqRemoteError, got %d "
                 "(%s)",
                 rcount, scount, (int)res, gvqGetErrorString(res));
        size_t bad = guard_damage(&d);
        MT_CHECK(bad == 0,
                 "gvqRecv of %zu floats from a gvqSend of %zu wrote %zu byte(s) outside "
                 "the receive buffer",
                 rcount, scount, bad);
        printf("  gvqRecv %zu <- gvqSend %zu: %s: \"%s\"\n", rcount, scount, gvqGetErrorString(res),
               gvqGetLastError(NULL));
        guarded_free(&d);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MT_OK(gvqCommDestroy(comm));
}

static void scenario_mismatch(void) {
    mt_part("allreduce out of place 256 vs 8192", 60);
    mismatch_allreduce(0);
    mt_part("allreduce in place 256 vs 8192", 60);
    mismatch_allreduce(1);
    mt_part("send 8192 recv 256", 60);
    mismatch_p2p(LARGE, SMALL);
    mt_part("send 256 recv 8192", 60);
    mismatch_p2p(SMALL, LARGE);
    mt_part("send 1M floats recv 256", 60);
    mismatch_p2p((size_t)1 << 20, SMALL);
}

/* ---- a peer that resumes after the others gave up ------------------------------------------ */

#define BIG ((size_t)4 << 20) /* floats: 16 MiB, rendezvous and mmap-backed */
#define AFTER_S 4.0           /* seconds the survivors keep working on the new communicator */

static volatile sig_atomic_t stop_armed;

static void *stop_self(void *arg) {
    (void)arg;
    mt_sleep_ms(300);
    stop_armed = 1;
    kill(getpid(), SIGSTOP); /* the whole process, in the middle of its allreduces */
    return NULL;
}

/* The survivors' life after the failure: canaries where the freed buffers were, a new
 * communicator, correct allreduces for AFTER_S seconds. */
static void survivors_go_on(MPI_Comm survivors, pid_t staller_pid, int sigstop) {
    float *canary = malloc(BIG * sizeof(float));
    float *c2 = malloc(BIG * sizeof(float));
    for (size_t i = 0; i < BIG; i++)
        canary[i] = c2[i] = (float)(i % 977);
    gvqComm_t comm = comm_with_timeout(survivors, 30000);
    int sr = 0, sn = 0;
    MPI_Comm_rank(survivors, &sr);
    MPI_Comm_size(survivors, &sn);
    if (sigstop && sr == 0) kill(staller_pid, SIGCONT);
    size_t count = (size_t)1 << 18;
    float *a = malloc(count * sizeof(float)), *b = malloc(count * sizeof(float));
    double t0 = mt_now();
    int calls = 0, wrong = 0, go = 1;
    while (go) {
        for (size_t i = 0; i < count; i++)
            a[i] = (float)(i % 31);
        gvqResult_t res = gvqAllReduce(a, b, count, gvqFloat32, gvqSum, comm, NULL);
        if (res != gvqSuccess)
            MT_FAIL("allreduce %d on the new communicator: %s", calls, gvqGetErrorString(res));
        for (size_t i = 0; i < count && res == gvqSuccess; i++)
            wrong += b[i] != (float)(i % 31) * (float)sn;
        calls++;
        /* the survivors stop after the same call: each rank's own clock would let one make a
         * call more than the other, which waits for it in vain */
        int mine = res == gvqSuccess && mt_now() - t0 < AFTER_S;
        MPI_Allreduce(&mine, &go, 1, MPI_INT, MPI_LAND, survivors);
    }
    MT_CHECK(wrong == 0, "%d wrong value(s) in %d allreduces on the new communicator", wrong,
             calls);
    size_t bad = 0;
    for (size_t i = 0; i < BIG; i++)
        bad += (canary[i] != (float)(i % 977)) + (c2[i] != (float)(i % 977));
    MT_CHECK(bad == 0, "%zu float(s) of memory allocated after the failure were overwritten", bad);
    if (mt.rank == 0)
        printf("  survivors: %d allreduces on the new communicator, canaries %s\n", calls,
               bad ? "damaged" : "intact");
    MT_OK(gvqCommDestroy(comm));
    free(a);
    free(b);
    free(canary);
    free(c2);
}

static void scenario_stalled_peer(int sigstop) {
    int n = mt.nranks, staller = n - 1;
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    pid_t me = getpid();
    MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, pids, (int)sizeof me, MPI_BYTE, MPI_COMM_WORLD);
    MPI_Comm survivors;
    MPI_Comm_split(MPI_COMM_WORLD, mt.rank == staller, mt.rank, &survivors);
    mt_part(sigstop ? "sigstop: the failing allreduce" : "late: the failing allreduce", 60);
    gvqComm_t comm = comm_with_timeout(MPI_COMM_WORLD, TIMEOUT_MS);
    float *a = malloc(BIG * sizeof(float)), *b = malloc(BIG * sizeof(float));
    for (size_t i = 0; i < BIG; i++)
        a[i] = 1.0f;
    gvqResult_t res = gvqSuccess;
    if (mt.rank != staller) {
        int calls = 0;
        while ((res = gvqAllReduce(a, b, BIG, gvqFloat32, gvqSum, comm, NULL)) == gvqSuccess)
            calls++;
        MT_CHECK(res == gvqTimeout, "survivor: expected gvqTimeout after %d calls, got %s", calls,
                 gvqGetErrorString(res));
        free(a);
        free(b);
        MT_OK(gvqCommDestroy(comm));
        mt_part("survivors on a new communicator", 60);
        survivors_go_on(survivors, pids[staller], sigstop);
    } else {
        pthread_t th;
        if (sigstop) {
            pthread_create(&th, NULL, stop_self, NULL);
            while ((res = gvqAllReduce(a, b, BIG, gvqFloat32, gvqSum, comm, NULL)) == gvqSuccess)
                ;
            pthread_join(th, NULL);
        } else {
            mt_sleep_ms(TIMEOUT_MS + 1500);
            res = gvqAllReduce(a, b, BIG, gvqFloat32, gvqSum, comm, NULL);
        }
        MT_CHECK(res != gvqSuccess, "the stalled rank's allreduce succeeded without its peers");
        printf("  rank %d (stalled): allreduce -> %s\n", mt.rank, gvqGetErrorString(res));
        free(a);
        free(b);
        gvqCommDestroy(comm);
    }
    mt_part("everyone at the barrier", 60);
    MPI_Comm_free(&survivors);
    free(pids);
}

/* ---- without MPI_Init by the program: exit and threads -------------------------------------- */

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v != NULL ? atoi(v) : dflt;
}

/* A path that every process of this job computes alike. */
static void id_path(char *buf, size_t cap, const char *what) {
    const char *ns = getenv("PMIX_NAMESPACE");
    snprintf(buf, cap, "%s/gvq_peer_faults_%s_%d_%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             ns ? ns : "none", (int)getppid(), what);
}

/* Rank 0 makes `k` ids and publishes them; the others wait for the file. */
static int share_ids(int rank, gvqUniqueId *ids, int k, const char *what) {
    char path[512], tmp[600];
    id_path(path, sizeof path, what);
    if (rank == 0) {
        for (int i = 0; i < k; i++)
            if (gvqGetUniqueId(&ids[i]) != gvqSuccess) return -1;
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = fopen(tmp, "wb");
        if (f == NULL || fwrite(ids, sizeof *ids, (size_t)k, f) != (size_t)k) return -1;
        fclose(f);
        return rename(tmp, path);
    }
    for (int tries = 0; tries < 3000; tries++) {
        FILE *f = fopen(path, "rb");
        if (f != NULL) {
            size_t got = fread(ids, sizeof *ids, (size_t)k, f);
            fclose(f);
            if (got == (size_t)k) return 0;
        }
        mt_sleep_ms(10);
    }
    return -1;
}

static void unshare_ids(int rank, const char *what) {
    char path[512];
    id_path(path, sizeof path, what);
    if (rank == 0) unlink(path);
}

static int exit_watchdog_s = 40;

static void exit_watchdog(int sig) {
    (void)sig;
    char msg[160];
    int k = snprintf(msg, sizeof msg,
                     "FAIL [rank %d] watchdog: the process did not exit within "
                     "%d s (MPI finalization at exit hangs?)\n",
                     mt.rank, exit_watchdog_s);
    if (k > 0) (void)!write(1, msg, (size_t)k);
    _exit(3);
}

/* Sum the failures over MPI_COMM_WORLD (MPI was started by gvq), print, return the code; the
 * process then leaves through exit(), where gvq finalizes MPI. */
static int finish_without_finalize(const char *name) {
    long mine[2] = {mt.failures, mt.checks}, all[2] = {0, 0};
    MPI_Allreduce(mine, all, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (mt.rank == 0)
        printf("%s: %s -- %d rank(s), %ld checks, %ld failure(s)\n", name,
               all[0] == 0 ? "PASS" : "FAIL", mt.nranks, all[1], all[0]);
    fflush(stdout);
    signal(SIGALRM, exit_watchdog);
    alarm((unsigned)exit_watchdog_s);
    return all[0] == 0 ? 0 : 1;
}

/* A communicator of every process with TIMEOUT_MS, its id passed through the file `what`
 * (MPI is not initialized yet: gvq starts it); NULL after a failure it reported. */
static gvqComm_t comm_from_file(const char *what) {
    gvqUniqueId id;
    if (share_ids(mt.rank, &id, 1, what) != 0) {
        MT_FAIL("cannot share the unique id");
        return NULL;
    }
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = TIMEOUT_MS;
    gvqComm_t comm = NULL;
    MT_OK(gvqCommInitRankConfig(&comm, mt.nranks, id, mt.rank, &cfg));
    return comm;
}

static int scenario_exit(void) {
    int rank = mt.rank, n = mt.nranks;
    gvqComm_t comm = comm_from_file("exit");
    if (comm == NULL) return 1;
    unshare_ids(rank, "exit");
    size_t count = (size_t)1 << 20;
    float *a = calloc(count, sizeof(float)), *b = calloc(count, sizeof(float));
    if (rank != n - 1) {
        gvqResult_t res = gvqAllReduce(a, b, count, gvqFloat32, gvqSum, comm, NULL);
        MT_CHECK(res == gvqTimeout, "allreduce with rank %d silent: expected gvqTimeout, got %s",
                 n - 1, gvqGetErrorString(res));
    } else {
        mt_sleep_ms(TIMEOUT_MS + 1000); /* joins after the others gave up */
        gvqResult_t res = gvqAllReduce(a, b, count, gvqFloat32, gvqSum, comm, NULL);
        MT_CHECK(res != gvqSuccess, "the late rank's allreduce succeeded without its peers");
    }
    MT_OK(gvqCommDestroy(comm));
    free(a);
    free(b);
    return finish_without_finalize("test_peer_faults exit");
}

/* A peer stopped (SIGSTOP) for good, as far as the others know: the survivors' call times out
 * (on one host through the shared-memory agreement, which never touches MPI) and they must still
 * leave through gvq's MPI finalization at exit, bounded, long before the stopped rank is resumed
 * (a helper sends SIGCONT after STOPPED_S). Each rank prints its own line: the job's MPI_Finalize
 * cannot complete, so mpirun's exit status says nothing; the survivors' watchdog prints FAIL if
 * a process is still there EXIT_STOPPED_S after its call returned. */
#define STOPPED_S 30
#define EXIT_STOPPED_S 12
static int scenario_exit_stopped(void) {
    int rank = mt.rank, n = mt.nranks;
    gvqComm_t comm = comm_from_file("exitstop");
    if (comm == NULL) return 1;
    MPI_Barrier(MPI_COMM_WORLD); /* every rank has the id: the file can go */
    unshare_ids(rank, "exitstop");
    float a[1024] = {0}, b[1024];
    if (rank == n - 1) {
        char cmd[96];
        snprintf(cmd, sizeof cmd, "sleep %d; kill -CONT %d", STOPPED_S, (int)getpid());
        pid_t helper;
        char *args[] = {"sh", "-c", cmd, NULL};
        extern char **environ;
        if (posix_spawn(&helper, "/bin/sh", NULL, NULL, args, environ) != 0) {
            MT_FAIL("cannot start the helper that resumes this rank");
            return 1;
        }
        alarm(STOPPED_S + 60);
        raise(SIGSTOP);
        /* mpirun resumes and ends it once a survivor left without finalizing; what this call
         * returns then depends on how far the survivor got (not what is tested here) */
        (void)gvqAllReduce(a, b, 1024, gvqFloat32, gvqSum, comm, NULL);
    } else {
        gvqResult_t res = gvqAllReduce(a, b, 1024, gvqFloat32, gvqSum, comm, NULL);
        MT_CHECK(res == gvqTimeout, "allreduce with rank %d stopped: expected gvqTimeout, got %s",
                 n - 1, gvqGetErrorString(res));
        exit_watchdog_s = EXIT_STOPPED_S;
        alarm(EXIT_STOPPED_S);
    }
    MT_OK(gvqCommDestroy(comm));
    printf("test_peer_faults exit-stopped: rank %d %s, leaving through gvq's MPI finalization\n",
           rank, mt.failures == 0 ? "PASS" : "FAIL");
    fflush(stdout);
    return mt.failures == 0 ? 0 : 1;
}

typedef struct {
    gvqUniqueId id;
    int rank, n, k;
    gvqResult_t init, call;
    int wrong;
} init_job_t;

static void *init_thread(void *arg) {
    init_job_t *j = arg;
    gvqComm_t comm = NULL;
    j->init = gvqCommInitRank(&comm, j->n, j->id, j->rank);
    if (j->init != gvqSuccess) return NULL;
    float x[64], y[64];
    for (int i = 0; i < 64; i++)
        x[i] = (float)(i + j->k);
    j->call = gvqAllReduce(x, y, 64, gvqFloat32, gvqSum, comm, NULL);
    for (int i = 0; i < 64; i++)
        j->wrong += y[i] != (float)((i + j->k) * j->n);
    gvqCommDestroy(comm);
    return NULL;
}

static int scenario_threads(void) {
    int rank = mt.rank, n = mt.nranks;
    gvqUniqueId ids[2];
    if (share_ids(rank, ids, 2, "threads") != 0) {
        MT_FAIL("cannot share the unique ids");
        return 1;
    }
    int inited = 1;
    MPI_Initialized(&inited);
    MT_CHECK(!inited, "MPI is initialized before the threads start");
    init_job_t jobs[2];
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        jobs[k] = (init_job_t){ids[k], rank, n, k, gvqInternalError, gvqInternalError, 0};
        pthread_create(&th[k], NULL, init_thread, &jobs[k]);
    }
    for (int k = 0; k < 2; k++) {
        pthread_join(th[k], NULL);
        MT_CHECK(jobs[k].init == gvqSuccess, "thread %d: gvqCommInitRank: %s", k,
                 gvqGetErrorString(jobs[k].init));
        MT_CHECK(jobs[k].call == gvqSuccess && jobs[k].wrong == 0,
                 "thread %d: allreduce %s, %d wrong value(s)", k, gvqGetErrorString(jobs[k].call),
                 jobs[k].wrong);
    }
    MPI_Initialized(&inited);
    if (!inited) { /* every init failed: nothing to sum over */
        MT_FAIL("MPI is not initialized after gvqCommInitRank");
        return 1;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    unshare_ids(rank, "threads");
    return finish_without_finalize("test_peer_faults threads");
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "exit") == 0 || strcmp(mode, "threads") == 0 ||
        strcmp(mode, "exit-stopped") == 0) {
        mt.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
        mt.nranks = env_int("OMPI_COMM_WORLD_SIZE", 1);
        signal(SIGALRM, exit_watchdog);
        alarm((unsigned)exit_watchdog_s);
        if (strcmp(mode, "exit-stopped") == 0) return scenario_exit_stopped();
        return strcmp(mode, "exit") == 0 ? scenario_exit() : scenario_threads();
    }
    mt_init(&argc, &argv);
    char name[64];
    snprintf(name, sizeof name, "test_peer_faults %s", mode);
    if (strcmp(mode, "mismatch") == 0 && mt.nranks >= 2) {
        scenario_mismatch();
    } else if (strcmp(mode, "late") == 0 && mt.nranks >= 2) {
        scenario_stalled_peer(0);
    } else if (strcmp(mode, "sigstop") == 0 && mt.nranks >= 2) {
        scenario_stalled_peer(1);
    } else {
        if (mt.rank == 0)
            printf("usage: test_peer_faults mismatch|late|sigstop|exit|threads (>= 2 ranks but "
                   "for threads)\n");
        MT_FAIL("bad mode '%s' for %d rank(s)", mode, mt.nranks);
    }
    mt_part("finish", 60);
    MPI_Barrier(MPI_COMM_WORLD);
    return mt_finish(name);
}
