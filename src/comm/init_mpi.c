/*
 * init_mpi.c -- gvqCommInitMPI: a communicator over an existing MPI communicator.
 */
#include "gvq_comm.h"
#include "gvq_mpi.h"

GVQ_API gvqResult_t gvqCommInitMPI(gvqComm_t *comm, MPI_Comm mpiComm, const gvqConfig_t *config) {
    if (comm == NULL) {
        GVQ_WARN("gvqCommInitMPI: comm is NULL");
        return gvqInvalidArgument;
    }
    if (mpiComm == MPI_COMM_NULL) {
        GVQ_WARN("gvqCommInitMPI: mpiComm is MPI_COMM_NULL");
        return gvqInvalidArgument;
    }
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (!inited || fin) {
        GVQ_WARN("gvqCommInitMPI: MPI is %s", fin ? "already finalized" : "not initialized");
        return gvqInvalidUsage;
    }
    int64_t tmo;
    size_t chunk;
    GVQCHECK(gvq_config_resolve(config, "gvqCommInitMPI", &tmo, &chunk));
    gvq_transport_t *t = NULL;
    GVQCHECK(gvq_mpi_transport_dup(&mpiComm, &t));
    GVQCHECK(gvq_comm_create(t, config, "gvqCommInitMPI", comm));
    gvqResult_t res = gvqSuccess;
    if (!(*comm)->xport->one_host) { /* the hosts now (an allgather of their keys), so the */
        int nhosts = 0, leader = 0;  /* allreduce ring can follow them from the first call */
        res = gvq_comm_hosts(*comm, &nhosts, &leader, NULL);
    }
    if (res == gvqSuccess) res = gvq_comm_shm_at_init(*comm);
    if (res == gvqSuccess) res = gvq_comm_hier_local(*comm);
    if (res != gvqSuccess) {
        (void)gvqCommDestroy(*comm);
        *comm = NULL;
    }
    return res;
}
