/*
 * mpitest.h -- the little harness shared by the MPI tests: failure reports that say what, where,
 * expected and got; a check counter; MPI start-up and the one-line summary printed by rank 0.
 *
 * Every failure prints one line "FAIL [rank r] file:line: ..." at once (flushed), so a test that
 * later hangs or crashes still shows what went wrong. mt_finish() sums failures over all ranks,
 * prints the summary, finalizes MPI and returns the exit code (0 pass, 1 fail).
 */
#ifndef GVQ_MPITEST_H_
#define GVQ_MPITEST_H_

#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gvq.h"

typedef struct {
    int rank;      /* MPI_COMM_WORLD rank */
    int nranks;    /* MPI_COMM_WORLD size */
    long checks;   /* assertions evaluated on this rank */
    long failures; /* assertions that failed on this rank */
    double t0;     /* MPI_Wtime at mt_init */
} mt_state_t;

static mt_state_t mt = {-1, 0, 0, 0, 0.0};

static inline void mt_report_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Print one failure line (does not count it; MT_FAIL does). */
static inline void mt_report_at(const char *file, int line, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/');
    fprintf(stdout, "FAIL [rank %d] %s:%d: %s\n", mt.rank, base ? base + 1 : file, line, msg);
    fflush(stdout);
}

#define MT_REPORT(...) mt_report_at(__FILE__, __LINE__, __VA_ARGS__)
#define MT_FAIL(...)                                   \
    do {                                               \
        mt_report_at(__FILE__, __LINE__, __VA_ARGS__); \
        mt.failures++;                                 \
    } while (0)

/* Count a check; report it when cond is false. */
#define MT_CHECK(cond, ...)                \
    do {                                   \
        mt.checks++;                       \
        if (!(cond)) MT_FAIL(__VA_ARGS__); \
    } while (0)

/* A gvq call must return `want`; on mismatch print the call, both codes and gvqGetLastError. */
#define MT_EXPECT_RES(call, want)                                                        \
    do {                                                                                 \
        gvqResult_t mt_got_ = (call), mt_want_ = (want);                                 \
        mt.checks++;                                                                     \
        if (mt_got_ != mt_want_)                                                         \
            MT_FAIL("%s: expected %d (%s), got %d (%s); gvqGetLastError: \"%s\"", #call, \
                    (int)mt_want_, gvqGetErrorString(mt_want_), (int)mt_got_,            \
                    gvqGetErrorString(mt_got_), gvqGetLastError(NULL));                  \
    } while (0)

#define MT_OK(call) MT_EXPECT_RES(call, gvqSuccess)

static inline double mt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void mt_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* MPI_Init_thread with MPI_THREAD_MULTIPLE (gvqCommAbort may run on another thread). */
static inline void mt_init(int *argc, char ***argv) {
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &mt.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mt.nranks);
    mt.t0 = MPI_Wtime();
    if (provided < MPI_THREAD_MULTIPLE && mt.rank == 0)
        printf("note: MPI provides thread level %d < MPI_THREAD_MULTIPLE\n", provided);
}

/* ---- parts, the watchdog, the communicator, identical outputs -------------------------------- */

static const char *mt_part_name = "start";

static void mt_watchdog(int sig) {
    (void)sig;
    char msg[200];
    int n = snprintf(msg, sizeof msg, "FAIL [rank %d] watchdog: no progress in part '%s' (hang?)\n",
                     mt.rank, mt_part_name);
    if (n > 0) (void)!write(1, msg, (size_t)n);
    _exit(3);
}

/* Starts a named part: (re)arms a watchdog of `seconds` that turns a hang into a FAIL line
 * naming the part (0 disarms it); rank 0 prints the name and the time since mt_init. Local: no
 * barrier, so a part may run on some ranks only. */
static inline void mt_part(const char *name, unsigned seconds) {
    mt_part_name = name;
    signal(SIGALRM, mt_watchdog);
    alarm(seconds);
    if (mt.rank == 0) {
        printf("-- %s (%.1f s)\n", name, MPI_Wtime() - mt.t0);
        fflush(stdout);
    }
}

/* A communicator over MPI_COMM_WORLD by the NCCL bootstrap (gvqGetUniqueId on rank 0,
 * MPI_Bcast, gvqCommInitRank); aborts the job when there is none. */
static inline gvqComm_t mt_new_comm(void) {
    gvqUniqueId id;
    memset(&id, 0, sizeof id);
    if (mt.rank == 0) MT_OK(gvqGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    gvqComm_t comm = NULL;
    MT_OK(gvqCommInitRank(&comm, mt.nranks, id, mt.rank));
    if (comm == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
    return comm;
}

static inline uint64_t mt_fnv1a(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* 1 when every rank's buffer is bitwise identical (FNV-1a hashes: min == max). Collective. */
static inline int mt_identical(const void *buf, size_t bytes) {
    uint64_t h = mt_fnv1a(buf, bytes), lo, hi;
    MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

/* Sum the failures of all ranks, print the summary on rank 0, finalize MPI; the exit code. */
static inline int mt_finish(const char *name) {
    long mine[2] = {mt.failures, mt.checks}, all[2] = {0, 0};
    MPI_Allreduce(mine, all, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (mt.rank == 0) {
        printf("%s: %s -- %d rank(s), %ld checks, %ld failure(s), %.1f s\n", name,
               all[0] == 0 ? "PASS" : "FAIL", mt.nranks, all[1], all[0], MPI_Wtime() - mt.t0);
        fflush(stdout);
    }
    MPI_Finalize();
    return all[0] == 0 ? 0 : 1;
}

#endif /* GVQ_MPITEST_H_ */
