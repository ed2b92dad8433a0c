/*
 * test_settings_differ.c -- zero-code settings that differ between ranks are named at the first
 * call (issue 16): GVQ_CODEC is set on rank 0 only (before gvq reads its environment). Every
 * rank's first float sum allreduce must fail at once (gvqInvalidArgument, far below the
 * timeout) with a last-error text naming GVQ_CODEC=qsgd, instead of running 100 exact sampling
 * calls and timing out on call 101; calls zero-code mode does not take (int32 sums) still work.
 */
#include <stdlib.h>

#include "gvq_mpi.h"
#include "mpitest.h"

#define TIMEOUT_MS 20000

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    if (mt.rank == 0) setenv("GVQ_CODEC", "qsgd", 1); /* gvq has not read its settings yet */
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = TIMEOUT_MS;
    gvqComm_t comm = NULL;
    MT_OK(gvqCommInitMPI(&comm, MPI_COMM_WORLD, &cfg));
    if (comm == NULL || mt.nranks < 2) return mt_finish("test_settings_differ");
    const size_t n = 8192;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(mt.rank + 1);
    for (int call = 0; call < 2; call++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = mt_now();
        MT_EXPECT_RES(gvqAllReduce(x, y, n, gvqFloat32, gvqSum, comm, NULL), gvqInvalidArgument);
        double s = mt_now() - t0;
        const char *last = gvqGetLastError(NULL);
        MT_CHECK(s < 3.0, "call %d: the mismatch took %.1f s to be found", call, s);
        MT_CHECK(last != NULL && strstr(last, "GVQ_CODEC=qsgd") != NULL,
                 "call %d: the last error does not name GVQ_CODEC=qsgd: \"%s\"", call,
                 last != NULL ? last : "(NULL)");
    }
    int32_t a[16], b[16];
    for (int i = 0; i < 16; i++)
        a[i] = mt.rank + 1;
    MT_OK(gvqAllReduce(a, b, 16, gvqInt32, gvqSum, comm, NULL));
    int want = mt.nranks * (mt.nranks + 1) / 2, wrong = 0;
    for (int i = 0; i < 16; i++)
        wrong += b[i] != want;
    MT_CHECK(wrong == 0, "int32 sum after the refusals: %d wrong values", wrong);
    MT_OK(gvqCommDestroy(comm));
    free(x);
    free(y);
    return mt_finish("test_settings_differ");
}
