/*
 * mpi_create.c -- the MPI transport's communicators: from MPI_COMM_WORLD's members
 * (gvqCommInitRank), a duplicate (gvqCommInitMPI), a subset of a communicator (gvqCommSplit).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "gvq_mpi_impl.h"

/* MPI_Comm_create_group blocks until every member calls it, and MPI has no non-blocking form.
 * With MPI_THREAD_MULTIPLE it runs on a thread of its own and the caller waits at most the
 * timeout: a member that stopped between the bootstrap and here gives gvqTimeout, and the thread
 * is left behind (if the member comes after all, it frees the communicator). Below that thread
 * level it runs inline, unbounded. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    MPI_Comm parent; /* MPI_COMM_WORLD, or a split's parent communicator */
    MPI_Group group;
    int tag, rc, done, abandoned;
    MPI_Comm comm;
} create_job_t;

static void *create_group_thread(void *arg) {
    create_job_t *j = arg;
    MPI_Comm comm = MPI_COMM_NULL;
    int rc = MPI_Comm_create_group(j->parent, j->group, j->tag, &comm);
    pthread_mutex_lock(&j->lock);
    int abandoned = j->abandoned;
    j->rc = rc;
    j->comm = comm;
    j->done = 1;
    pthread_cond_signal(&j->cond);
    pthread_mutex_unlock(&j->lock);
    if (abandoned) { /* the caller gave up: the job is this thread's */
        if (rc == MPI_SUCCESS && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
        MPI_Group_free(&j->group);
        free(j);
    }
    return NULL;
}

static gvqResult_t create_group_bounded(MPI_Comm parent, MPI_Group group, int tag,
                                        uint64_t timeout_ns, MPI_Comm *out) {
    int level = 0;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE || timeout_ns == 0) {
        int rc = MPI_Comm_create_group(parent, group, tag, out);
        MPI_Group_free(&group);
        MPICHECK(rc, "gvqCommInitRank");
        return gvqSuccess;
    }
    create_job_t *j = calloc(1, sizeof *j);
    if (j == NULL) {
        MPI_Group_free(&group);
        return gvqSystemError;
    }
    pthread_mutex_init(&j->lock, NULL);
    pthread_cond_init(&j->cond, NULL);
    j->parent = parent;
    j->group = group;
    j->tag = tag;
    pthread_t th;
    if (pthread_create(&th, NULL, create_group_thread, j) != 0) {
        MPI_Group_free(&group);
        free(j);
        GVQ_WARN("gvqCommInitRank: cannot start the thread that creates the MPI communicator");
        return gvqSystemError;
    }
    pthread_detach(th);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    uint64_t ns = (uint64_t)dl.tv_nsec + timeout_ns;
    dl.tv_sec += (time_t)(ns / 1000000000ull);
    dl.tv_nsec = (long)(ns % 1000000000ull);
    pthread_mutex_lock(&j->lock);
    while (!j->done)
        if (pthread_cond_timedwait(&j->cond, &j->lock, &dl) != 0) break;
    if (!j->done) {
        j->abandoned = 1;
        pthread_mutex_unlock(&j->lock);
        gvq_mpi_bound_exit(timeout_ns); /* a thread stays inside MPI: bound the finalization */
        GVQ_WARN("gvqCommInitRank: MPI_Comm_create_group did not complete within %llu ms (a "
                 "member stopped after the bootstrap?)",
                 (unsigned long long)(timeout_ns / 1000000ull));
        return gvqTimeout;
    }
    pthread_mutex_unlock(&j->lock);
    int rc = j->rc;
    *out = j->comm;
    MPI_Group_free(&j->group);
    pthread_mutex_destroy(&j->lock);
    pthread_cond_destroy(&j->cond);
    free(j);
    MPICHECK(rc, "gvqCommInitRank");
    return gvqSuccess;
}

gvqResult_t gvq_mpi_transport_from_world_timed(const int *world_ranks, int nranks, int rank,
                                               int tag, uint64_t timeout_ns, gvq_transport_t **t) {
    MPI_Group world, group;
    MPI_Comm comm = MPI_COMM_NULL;
    MPICHECK(MPI_Comm_group(MPI_COMM_WORLD, &world), "gvqCommInitRank");
    int rc = MPI_Group_incl(world, nranks, world_ranks, &group);
    MPI_Group_free(&world);
    MPICHECK(rc, "gvqCommInitRank");
    /* collective over the members only, so a subset of the job can build a communicator */
    GVQCHECK(create_group_bounded(MPI_COMM_WORLD, group, tag, timeout_ns, &comm));
    GVQCHECK(gvq_mpi_wrap(comm, t));
    if ((*t)->rank != rank || (*t)->nranks != nranks) {
        GVQ_WARN("gvqCommInitRank: MPI placed rank %d of %d at %d of %d", rank, nranks, (*t)->rank,
                 (*t)->nranks);
        (*t)->ops->destroy(*t);
        return gvqInternalError;
    }
    return gvqSuccess;
}

gvqResult_t gvq_mpi_transport_from_world(const int *world_ranks, int nranks, int rank, int tag,
                                         gvq_transport_t **t) {
    uint64_t ns = (uint64_t)gvq_param(GVQ_PARAM_TIMEOUT_MS) * 1000000ull;
    return gvq_mpi_transport_from_world_timed(world_ranks, nranks, rank, tag, ns, t);
}

gvqResult_t gvq_mpi_transport_dup(const void *mpi_comm, gvq_transport_t **t) {
    MPI_Comm dup;
    MPICHECK(MPI_Comm_dup(*(const MPI_Comm *)mpi_comm, &dup), "gvqCommInitMPI");
    GVQCHECK(gvq_mpi_wrap(dup, t));
    /* one host: the shared-memory part of the communicator is all of it (the same answer on
     * every rank; collective like the dup) */
    MPI_Comm node;
    int local = 0;
    if (MPI_Comm_split_type(dup, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_size(node, &local);
        MPI_Comm_free(&node);
    }
    (*t)->one_host = local == (*t)->nranks;
    return gvqSuccess;
}

gvqResult_t gvq_mpi_transport_subset(const gvq_transport_t *parent, const int *ranks, int n,
                                     int rank, int tag, gvq_transport_t **t) {
    const mpi_impl_t *pm = parent->impl;
    MPI_Group all, group;
    MPI_Comm comm = MPI_COMM_NULL;
    MPICHECK(MPI_Comm_group(pm->comm, &all), "gvqCommSplit");
    int rc = MPI_Group_incl(all, n, ranks, &group);
    MPI_Group_free(&all);
    MPICHECK(rc, "gvqCommSplit");
    /* collective over the members only: the other colors make theirs at the same time */
    GVQCHECK(create_group_bounded(pm->comm, group, tag, parent->timeout_ns, &comm));
    GVQCHECK(gvq_mpi_wrap(comm, t));
    if ((*t)->rank != rank || (*t)->nranks != n) {
        GVQ_WARN("gvqCommSplit: MPI placed rank %d of %d at %d of %d", rank, n, (*t)->rank,
                 (*t)->nranks);
        (*t)->ops->destroy(*t);
        *t = NULL;
        return gvqInternalError;
    }
    (*t)->timeout_ns = parent->timeout_ns;
    return gvqSuccess;
}
