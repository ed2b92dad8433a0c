/*
 * test_settings_differ.c -- settings that differ between ranks are named at the first call.
 *
 *   codec (default)  GVQ_CODEC=qsgd on rank 0 only (issue 16): every rank's first float sum
 *                    allreduce must fail at once (gvqInvalidArgument, far below the timeout)
 *                    with a last-error text naming GVQ_CODEC=qsgd, instead of running 100 exact
 *                    sampling calls and timing out on call 101;
 *   algo             GVQ_ALGO=allreduce=rab on rank 0 only: the ranks would run different
 *                    algorithms whose messages cannot pair; the text names algorithm rab.
 *   sendcopy         GVQ_SEND_COPY=0 on rank 0 only: at 8 MiB the staging ranks run direct,
 *                    rank 0 the ring; the text names GVQ_SEND_COPY. Needs 3+ ranks on one
 *                    host (direct's conditions, select.c) and GVQ_SHM=0 (set here: with
 *                    shared memory every rank runs shm, whatever GVQ_SEND_COPY says).
 *   shm              GVQ_SHM=0 on rank 0 only: no rank maps the shared memory (the choice is
 *                    agreed at the first collective), every call works over messages.
 * Set before gvq reads its environment. Calls the setting does not touch still work after.
 */
#include <stdlib.h>

#include "gvq_mpi.h"
#include "mpitest.h"

#define TIMEOUT_MS 20000

/* GVQ_SHM=0 on rank 0 only: allreduces of 1 KiB and 32 KiB and a broadcast give every rank the
 * right values (no rank uses the shared memory). */
static int shm_differs(void) {
    if (mt.rank == 0) setenv("GVQ_SHM", "0", 1);
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = TIMEOUT_MS;
    gvqComm_t comm = NULL;
    MT_OK(gvqCommInitMPI(&comm, MPI_COMM_WORLD, &cfg));
    if (comm == NULL) return mt_finish("test_settings_differ");
    const size_t counts[] = {256, 8192};
    float *x = malloc(sizeof(float) * 8192), *y = malloc(sizeof(float) * 8192);
    for (int c = 0; c < 2; c++) {
        for (size_t i = 0; i < counts[c]; i++)
            x[i] = (float)(mt.rank + 1);
        MT_OK(gvqAllReduce(x, y, counts[c], gvqFloat32, gvqSum, comm, NULL));
        int wrong = 0;
        for (size_t i = 0; i < counts[c]; i++)
            wrong += y[i] != (float)(mt.nranks * (mt.nranks + 1) / 2);
        MT_CHECK(wrong == 0, "GVQ_SHM=0 on rank 0, count %zu: %d wrong values", counts[c], wrong);
    }
    MT_OK(gvqBroadcast(x, y, 64, gvqFloat32, 1 % mt.nranks, comm, NULL));
    MT_CHECK(y[0] == (float)(1 % mt.nranks + 1), "GVQ_SHM=0 on rank 0: broadcast gave %g", y[0]);
    MT_OK(gvqCommDestroy(comm));
    free(x);
    free(y);
    return mt_finish("test_settings_differ");
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    const char *mode = argc > 1 ? argv[1] : "codec";
    if (strcmp(mode, "shm") == 0) return shm_differs();
    int sendcopy = strcmp(mode, "sendcopy") == 0;
    int algo = sendcopy || strcmp(mode, "algo") == 0; /* both differ in the algorithm */
    const char *want = sendcopy ? "GVQ_SEND_COPY" : algo ? "algorithm rab" : "GVQ_CODEC=qsgd";
    if (mt.rank == 0 && sendcopy) setenv("GVQ_SEND_COPY", "0", 1);
    if (sendcopy) setenv("GVQ_SHM", "0", 1); /* with shared memory every rank runs shm */
    if (mt.rank == 0 && !sendcopy)
        setenv(algo ? "GVQ_ALGO" : "GVQ_CODEC", algo ? "allreduce=rab" : "qsgd", 1);
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = TIMEOUT_MS;
    gvqComm_t comm = NULL;
    MT_OK(gvqCommInitMPI(&comm, MPI_COMM_WORLD, &cfg));
    if (comm == NULL || mt.nranks < 2) return mt_finish("test_settings_differ");
    const size_t n = sendcopy ? (size_t)2 << 20 : 8192;
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
        MT_CHECK(last != NULL && strstr(last, want) != NULL,
                 "call %d: the last error does not name %s: \"%s\"", call, want,
                 last != NULL ? last : "(NULL)");
    }
    if (algo) { /* broadcast keeps its algorithm on every rank */
        float v[64];
        for (int i = 0; i < 64; i++)
            v[i] = mt.rank == 0 ? (float)i : -1.0f;
        MT_OK(gvqBroadcast(v, v, 64, gvqFloat32, 0, comm, NULL));
        int bad = 0;
        for (int i = 0; i < 64; i++)
            bad += v[i] != (float)i;
        MT_CHECK(bad == 0, "broadcast after the refusals: %d wrong values", bad);
        MT_OK(gvqCommDestroy(comm));
        free(x);
        free(y);
        return mt_finish("test_settings_differ");
    }
    int32_t a[16], b[16];
    for (int i = 0; i < 16; i++)
        a[i] = mt.rank + 1;
    MT_OK(gvqAllReduce(a, b, 16, gvqInt32, gvqSum, comm, NULL));
    int sum = mt.nranks * (mt.nranks + 1) / 2, wrong = 0;
    for (int i = 0; i < 16; i++)
        wrong += b[i] != sum;
    MT_CHECK(wrong == 0, "int32 sum after the refusals: %d wrong values", wrong);
    MT_OK(gvqCommDestroy(comm));
    free(x);
    free(y);
    return mt_finish("test_settings_differ");
}
