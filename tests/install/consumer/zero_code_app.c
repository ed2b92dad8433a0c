/* A zero-code trainer's aggregation as docs/PORTING.md and docs/ZERO_CODE.md tell a new user to
 * write it, built by PORTING.md's own compile lines against the installed gvq (the install test
 * extracts them) and started without LD_LIBRARY_PATH: one flat gradient buffer, its layout built
 * from the tensors' shapes with gvqLayoutAppend, GVQ_CODEC=auto from the environment, plain
 * gvqAllReduce calls. Checks that the layout was used (per-layer statistics) and compressed. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "gvq.h"
#include "gvq_mpi.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, fail = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    gvqLayer_t l[4];
    int n = 0;
    size_t at = 0;
    gvqLayoutAppend(l, 4, &n, &at, gvqLayerConv, (const int[]){64, 32, 3, 3}, 0);
    gvqLayoutAppend(l, 4, &n, &at, gvqLayerOther, NULL, 64);
    gvqLayoutAppend(l, 4, &n, &at, gvqLayerFc, (const int[]){256, 512}, 0);
    gvqLayoutAppend(l, 4, &n, &at, gvqLayerOther, NULL, 256);
    const size_t nparams = 18432 + 64 + 131072 + 256;
    if (n != 4 || at != nparams) {
        fprintf(stderr, "the layout's tensors add up to %zu floats in %d layers, want %zu\n", at, n,
                nparams);
        fail = 1;
    }
    gvqComm_t comm = NULL;
    float *grad = malloc(sizeof(float) * nparams);
    if (!fail && (gvqCommInitMPI(&comm, MPI_COMM_WORLD, NULL) != gvqSuccess ||
                  gvqCommSetLayout(comm, nparams, l, n) != gvqSuccess))
        fail = 1;
    for (int step = 0; step < 5 && !fail; step++) {
        for (size_t i = 0; i < nparams; i++) /* low-rank-ish gradients, different per rank */
            grad[i] = (float)((double)((i * 7 + (size_t)step) % 13) - 6.0) * (rank + 1) * 1e-3f;
        if (gvqAllReduce(grad, grad, nparams, gvqFloat32, gvqAvg, comm, NULL) != gvqSuccess) {
            fprintf(stderr, "rank %d step %d: %s\n", rank, step, gvqGetLastError(comm));
            fail = 1;
        }
    }
    gvqCompressorStats_t fc, all;
    if (!fail && (gvqCommGetCompressionStats(comm, 2, &fc) != gvqSuccess ||
                  gvqCommGetCompressionStats(comm, GVQ_STATS_TOTAL, &all) != gvqSuccess ||
                  fc.codec != gvqCodecPowersgd || !(all.ratio > 1.5))) {
        fprintf(stderr, "rank %d: the layout was not used: fc codec %d, ratio %.2f\n", rank,
                fc.codec, all.ratio);
        fail = 1;
    }
    if (rank == 0 && !fail)
        printf("zero-code with a gvqLayoutAppend layout: fc through PowerSGD, ratio %.2fx\n",
               all.ratio);
    if (comm != NULL) gvqCommDestroy(comm);
    free(grad);
    MPI_Finalize();
    return fail;
}
