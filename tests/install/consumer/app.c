/* A program built against an installed gvq (through find_package(gvq), or gcc with
 * `pkg-config --cflags --libs gvq`). It calls MPI itself and gvq_mpi.h's gvqCommInitMPI, so it
 * links only when the package's link flags carry MPI's. Run it under mpirun. */
#include <mpi.h>
#include <stdio.h>

#include "gvq.h"
#include "gvq_mpi.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int v = 0, rank = 0, nranks = 0, fail = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (gvqGetVersion(&v) != gvqSuccess || v != GVQ_VERSION) {
        fprintf(stderr, "installed gvq reports version %d, header says %d\n", v, GVQ_VERSION);
        fail = 1;
    }
    gvqComm_t comm = NULL;
    float x = (float)(rank + 1), sum = 0.0f;
    if (!fail && (gvqCommInitMPI(&comm, MPI_COMM_WORLD, NULL) != gvqSuccess ||
                  gvqAllReduce(&x, &sum, 1, gvqFloat32, gvqSum, comm, NULL) != gvqSuccess ||
                  sum != (float)(nranks * (nranks + 1) / 2))) {
        fprintf(stderr, "rank %d: allreduce through the installed gvq failed (sum %g)\n", rank,
                (double)sum);
        fail = 1;
    }
    if (comm != NULL) gvqCommDestroy(comm);
    if (rank == 0 && !fail)
        printf("installed gvq %d found, linked and ran on %d ranks\n", v, nranks);
    MPI_Finalize();
    return fail;
}
