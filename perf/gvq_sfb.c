/*
 * gvq_sfb.c -- gvq-sfb: sufficient-factor broadcasting against the full matrix for one wide
 * fully connected layer (M x N), per-rank batch b, through the training layer
 * (gvqTrainFactorsReady with sfb 1 and sfb 0), side by side in one run; and what SACP picks.
 *
 *   mpirun -np P gvq-sfb [-m M] [-n N] [-b B1,B2,...] [-r REPS]
 *
 * Prints one row per batch: bytes per rank and median time per step of each route, the ratio,
 * SACP's choice, and the flip points by gvq's rule (ring: 2(P-1)/P MN against (P-1) b (M+N),
 * b* = 2MN / (P (M+N))) and by Poseidon's (a parameter server: 2MN against (P-1) b (M+N),
 * b* = 2MN / ((P-1)(M+N))). The factors are random; both routes' results are compared.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gvq.h"
#include "gvq_mpi.h"
#include "gvq_train.h"

#define CHECK(call)                                                                 \
    do {                                                                            \
        gvqResult_t r_ = (call);                                                    \
        if (r_ != gvqSuccess) {                                                     \
            fprintf(stderr, "gvq-sfb: %s: %s (%s)\n", #call, gvqGetErrorString(r_), \
                    gvqGetLastError(NULL));                                         \
            MPI_Abort(MPI_COMM_WORLD, 1);                                           \
        }                                                                           \
    } while (0)

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds per step of `reps` steps with sfb (1 or 0); the last step's gradient in g and
 * the bytes this rank sent per step in *bytes; *route: the route of the last step. */
static double run(gvqComm_t comm, int sfb, int M, int N, int b, int reps, const float *u,
                  const float *v, float *g, double *bytes, int *route) {
    gvqTrainConfig_t cfg = GVQ_TRAIN_CONFIG_INITIALIZER;
    cfg.sfb = sfb;
    gvqTrainer_t t;
    CHECK(gvqTrainCreate(comm, &cfg, &t));
    gvqVariable_t var = GVQ_VARIABLE_INITIALIZER;
    var.name = "fc";
    var.kind = gvqVarFc;
    var.shape[0] = M;
    var.shape[1] = N;
    var.factors = 1;
    int id;
    CHECK(gvqTrainAddVariable(t, &var, &id));
    CHECK(gvqTrainCommit(t));
    double *times = malloc(sizeof(double) * (size_t)reps);
    for (int r = -1; r < reps; r++) { /* one warm-up step */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        CHECK(gvqTrainFactorsReady(t, id, u, v, b, g));
        CHECK(gvqTrainWaitAll(t));
        if (r >= 0) times[r] = MPI_Wtime() - t0;
    }
    MPI_Allreduce(MPI_IN_PLACE, times, reps, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    qsort(times, (size_t)reps, sizeof(double), cmp_double);
    double med = times[reps / 2];
    gvqTrainVariableInfo_t info;
    CHECK(gvqTrainGetVariableInfo(t, id, &info));
    *bytes = (double)info.wireBytes / (double)(reps + 1);
    *route = info.route;
    free(times);
    CHECK(gvqTrainDestroy(t));
    return med;
}

int main(int argc, char **argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int rank, P;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    int M = 1024, N = 1024, reps = 10;
    char batches[256] = "16,64,256,1024";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m"))
            M = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-n"))
            N = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r"))
            reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-b"))
            snprintf(batches, sizeof batches, "%s", argv[i + 1]);
    }
    if (M < 1 || N < 1 || reps < 1) {
        if (rank == 0) fprintf(stderr, "usage: gvq-sfb [-m M] [-n N] [-b B1,B2,...] [-r REPS]\n");
        MPI_Finalize();
        return 2;
    }
    gvqComm_t comm;
    CHECK(gvqCommInitMPI(&comm, MPI_COMM_WORLD, NULL));
    double flip_ring = 2.0 * M * N / ((double)P * (M + N));
    double flip_ps = P > 1 ? 2.0 * M * N / ((double)(P - 1) * (M + N)) : INFINITY;
    if (rank == 0)
        printf("# gvq-sfb: fc %d x %d, %d ranks, median of %d steps; SACP flips at b = %.0f "
               "(ring rule), Poseidon's PS rule at b = %.0f\n"
               "%8s %14s %14s %10s %10s %8s %6s %10s\n",
               M, N, P, reps, flip_ring, flip_ps, "batch", "sfb_bytes", "full_bytes", "sfb_ms",
               "full_ms", "full/sfb", "SACP", "max_diff");
    char *save = NULL;
    int failed = 0;
    for (char *tok = strtok_r(batches, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int b = atoi(tok);
        if (b < 1) continue;
        float *u = malloc(sizeof(float) * (size_t)b * M),
              *v = malloc(sizeof(float) * (size_t)b * N);
        float *g1 = malloc(sizeof(float) * (size_t)M * N),
              *g0 = malloc(sizeof(float) * (size_t)M * N);
        unsigned s = 12345u + 7919u * (unsigned)rank;
        for (size_t i = 0; i < (size_t)b * M; i++)
            u[i] = (float)((s = s * 1103515245u + 12345u) >> 8) / 16777216.0f - 0.5f;
        for (size_t i = 0; i < (size_t)b * N; i++)
            v[i] = (float)((s = s * 1103515245u + 12345u) >> 8) / 16777216.0f - 0.5f;
        double by1, by0;
        int route1, route0, route_auto;
        double t1 = run(comm, 1, M, N, b, reps, u, v, g1, &by1, &route1);
        double t0 = run(comm, 0, M, N, b, reps, u, v, g0, &by0, &route0);
        double dummy;
        float *ga = malloc(sizeof(float) * (size_t)M * N);
        (void)run(comm, GVQ_CONFIG_UNDEF_INT, M, N, b, 1, u, v, ga, &dummy, &route_auto);
        double diff = 0;
        for (size_t i = 0; i < (size_t)M * N; i++)
            diff = fmax(diff, fabs((double)g1[i] - g0[i]));
        MPI_Allreduce(MPI_IN_PLACE, &diff, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (rank == 0)
            printf("%8d %14.0f %14.0f %10.2f %10.2f %8.2f %6s %10.2e\n", b, by1, by0, 1e3 * t1,
                   1e3 * t0, t0 / t1, route_auto == gvqRouteSfb ? "sfb" : "full", diff);
        /* the two routes sum the same P b products in another order */
        if (diff > 1e-5 * P * b + 1e-6) {
            if (rank == 0) printf("FAIL: the routes differ by %g at batch %d\n", diff, b);
            failed = 1;
        }
        free(u);
        free(v);
        free(g1);
        free(g0);
        free(ga);
    }
    CHECK(gvqCommDestroy(comm));
    MPI_Finalize();
    return failed;
}
