/*
 * gvq_mpi.h -- interop with MPI programs. Optional: include it only where mpi.h is available.
 */
#ifndef GVQ_MPI_H_
#define GVQ_MPI_H_

#include <mpi.h>

#include "gvq.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates a gvq communicator over the ranks of `mpiComm`, keeping their ranks. Collective over
 * mpiComm (it duplicates it, so gvq's traffic never mixes with the program's). MPI must be
 * initialized. config may be NULL. Errors: gvqInvalidArgument (NULL comm, MPI_COMM_NULL, a bad
 * config), gvqInvalidUsage (MPI not initialized), gvqRemoteError (MPI failed). */
GVQ_API gvqResult_t gvqCommInitMPI(gvqComm_t *comm, MPI_Comm mpiComm, const gvqConfig_t *config);

#ifdef __cplusplus
}
#endif

#endif /* GVQ_MPI_H_ */
