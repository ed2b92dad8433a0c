/*
 * mpi_process.c -- the Open MPI transport's process-wide state (mpi.c has the design): MPI
 * initialized once by gvq when the program did not, finalized at exit with a bound after a
 * failure, and the quarantine of what MPI may still touch after a transfer was given up.
 */
#define _DEFAULT_SOURCE /* on_exit: the exit status for a bounded finalization */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "gvq_mpi_impl.h"

/* ---- process state: MPI start and end, the quarantine -------------------------------------- */

static pthread_mutex_t mpi_lock = PTHREAD_MUTEX_INITIALIZER;
static int gvq_started_mpi;    /* under mpi_lock */
static mpi_op_t *quarantine;   /* under mpi_lock: what MPI may still touch, never freed */
static int any_failed;         /* under mpi_lock: a gvq communicator gave up on transfers */
static uint64_t exit_bound_ns; /* under mpi_lock: the longest timeout of those communicators */

void gvq_mpi_quarantine_add(gvq_transport_t *t, mpi_op_t *op) {
    pthread_mutex_lock(&mpi_lock);
    op->next = quarantine;
    quarantine = op;
    pthread_mutex_unlock(&mpi_lock);
    ((mpi_impl_t *)t->impl)->failed = 1;
}

void gvq_mpi_bound_exit(uint64_t timeout_ns) {
    pthread_mutex_lock(&mpi_lock);
    any_failed = 1;
    if (timeout_ns > exit_bound_ns) exit_bound_ns = timeout_ns;
    pthread_mutex_unlock(&mpi_lock);
}

void gvq_mpi_note_failure(gvq_transport_t *t) {
    gvq_mpi_bound_exit(t->timeout_ns);
    ((mpi_impl_t *)t->impl)->failed = 1;
}

static gvq_transport_t **live; /* under mpi_lock: the MPI transports not yet destroyed */
static int nlive, caplive;

void gvq_mpi_track(gvq_transport_t *t, int on) {
    pthread_mutex_lock(&mpi_lock);
    if (on && nlive == caplive) {
        int cap = caplive ? 2 * caplive : 16;
        gvq_transport_t **grown = realloc(live, sizeof *grown * (size_t)cap);
        if (grown != NULL) {
            live = grown;
            caplive = cap;
        }
    }
    if (on && nlive < caplive) {
        live[nlive++] = t;
    } else if (!on) {
        for (int i = 0; i < nlive; i++)
            if (live[i] == t) {
                live[i] = live[--nlive];
                break;
            }
    }
    pthread_mutex_unlock(&mpi_lock);
}

/* The exit watchdog's orders: set before its thread starts, read only by it. */
static struct {
    uint64_t ns;
    int status;
} exit_orders;

static void *exit_watchdog(void *arg) {
    (void)arg;
    uint64_t ns = exit_orders.ns;
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0) {
    }
    GVQ_WARN("MPI_Finalize at exit did not return within %llu ms after a communicator failed "
             "(a peer is gone or stuck); leaving without it",
             (unsigned long long)(ns / 1000000ull));
    _exit(exit_orders.status);
}

/* At exit, gvq finalizes the MPI it started. After a failure a peer may never come to
 * MPI_Finalize (it synchronizes the job), so then the wait is bounded by the longest timeout of
 * the failed communicators (none when that is 0: wait forever, as the user asked). */
static void mpi_finalize_at_exit(int status, void *arg) {
    (void)arg;
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return;
    pthread_mutex_lock(&mpi_lock);  /* another thread may still be failing a communicator */
    for (int i = 0; i < nlive; i++) /* broken and never destroyed: as a failure */
        if (gvq_broken_get(live[i]->broken) != gvqSuccess) {
            any_failed = 1;
            if (live[i]->timeout_ns > exit_bound_ns) exit_bound_ns = live[i]->timeout_ns;
        }
    uint64_t bound = any_failed ? exit_bound_ns : 0;
    pthread_mutex_unlock(&mpi_lock);
    if (bound > 0) {
        pthread_t th;
        GVQ_INFO("finalizing MPI after a communicator failed (bounded: %llu ms)",
                 (unsigned long long)(bound / 1000000ull));
        exit_orders.ns = bound;
        exit_orders.status = status;
        if (pthread_create(&th, NULL, exit_watchdog, NULL) == 0) pthread_detach(th);
    }
    MPI_Finalize();
}

gvqResult_t gvq_mpi_ensure_init(int *world_rank, int *world_size) {
    int inited = 0, fin = 0;
    /* once per process: two threads may get here at once before MPI is initialized */
    pthread_mutex_lock(&mpi_lock);
    MPI_Finalized(&fin);
    if (fin) {
        pthread_mutex_unlock(&mpi_lock);
        GVQ_WARN("MPI was already finalized; gvq needs it for its transport");
        return gvqInvalidUsage;
    }
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
            pthread_mutex_unlock(&mpi_lock);
            GVQ_WARN("MPI_Init_thread failed");
            return gvqSystemError;
        }
        gvq_started_mpi = 1;
        on_exit(mpi_finalize_at_exit, NULL);
        GVQ_INFO("gvq initialized MPI (thread level %d)", provided);
    } else if (!gvq_started_mpi) {
        int level = 0;
        MPI_Query_thread(&level);
        if (level < MPI_THREAD_SERIALIZED)
            GVQ_INFO("MPI thread level %d: call gvq from the thread that initialized MPI", level);
    }
    pthread_mutex_unlock(&mpi_lock);
    MPICHECK(MPI_Comm_rank(MPI_COMM_WORLD, world_rank), "MPI init");
    MPICHECK(MPI_Comm_size(MPI_COMM_WORLD, world_size), "MPI init");
    return gvqSuccess;
}

int gvq_mpi_in_job(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v != NULL && v[0] != '\0') return 1;
    }
    int inited = 0, fin = 0;
    MPI_Initialized(&inited); /* both may be called at any time, before MPI_Init too */
    MPI_Finalized(&fin);
    return inited && !fin;
}
