/*
 * gvq_ps_latency.c -- a parameter-server pull while the owning rank computes: the synchronous
 * server (a pull is collective: it waits for the owner's own pull) against the served one
 * (gvqPsConfig_t.serve: the owner's thread answers), side by side in one run.
 *
 * Each round: a barrier; rank 0 (which holds every row: contiguous partitioning, P = 1) computes
 * for C ms (a spin on the clock, no gvq call), then pulls k rows itself; every other rank pulls
 * k rows at once and times its pull. Printed per compute time C: the median and 90th percentile
 * pull latency of ranks 1..N-1, synchronous and served.
 *
 *   mpirun -np 2 build/perf/gvq-ps-latency [--rows R] [--dim D] [--k K] [--iters I]
 *                                          [--compute-ms 0,1,10,50]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gvq.h"
#include "gvq_mpi.h"
#include "perf_tool.h"

static void spin(double ms) {
    double end = now_s() + ms * 1e-3;
    volatile double x = 0;
    while (now_s() < end)
        for (int i = 0; i < 1000; i++)
            x += 1e-9 * i;
}

int main(int argc, char **argv) {
    size_t rows = 65536, dim = 32, k = 256;
    int iters = 40;
    char computes[256] = "0,1,10,50";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rows"))
            rows = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--dim"))
            dim = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--k"))
            k = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--iters"))
            iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--compute-ms"))
            snprintf(computes, sizeof computes, "%s", argv[i + 1]);
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    int provided, rank, N;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    if (N < 2 || k > rows || iters < 1) {
        if (rank == 0) fprintf(stderr, "gvq-ps-latency: 2+ ranks, k <= rows, iters >= 1\n");
        MPI_Finalize();
        return 2;
    }
    gvqComm_t comm;
    OK(gvqCommInitMPI(&comm, MPI_COMM_WORLD, NULL));
    gvqPs_t ps[2];
    for (int serve = 0; serve < 2; serve++) {
        gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
        cfg.partitions = 1; /* every row on rank 0 */
        cfg.partitioning = gvqPsContiguous;
        cfg.init = gvqPsInitUniform;
        cfg.serve = serve;
        OK(gvqPsCreate(comm, rows, dim, gvqFloat32, &cfg, &ps[serve]));
    }
    int64_t *idx = malloc(k * sizeof *idx);
    float *vals = malloc(k * dim * sizeof *vals);
    double *lat = malloc((size_t)iters * sizeof *lat),
           *all = malloc((size_t)iters * N * sizeof *all);
    if (rank == 0)
        printf("# gvq-ps-latency: %d ranks, %zu x %zu float rows on rank 0, pulls of %zu rows "
               "(%zu B), %d rounds per point; latency of ranks 1..%d's pulls in us\n"
               "# compute_ms  sync_p50  sync_p90  served_p50  served_p90\n",
               N, rows, dim, k, k * dim * sizeof(float), iters, N - 1);
    for (char *tok = strtok(computes, ","); tok != NULL; tok = strtok(NULL, ",")) {
        double C = atof(tok), p50[2], p90[2];
        for (int serve = 0; serve < 2; serve++) {
            for (int it = -2; it < iters; it++) { /* two rounds of warm-up */
                for (size_t i = 0; i < k; i++)
                    idx[i] = (int64_t)(((size_t)it * 7919u + i * 104729u) % rows);
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = now_s();
                if (rank == 0) spin(C);
                OK(gvqPsPull(ps[serve], idx, vals, k));
                if (it >= 0) lat[it] = (now_s() - t0) * 1e6;
            }
            MPI_Gather(lat, iters, MPI_DOUBLE, all, iters, MPI_DOUBLE, 0, MPI_COMM_WORLD);
            if (rank == 0) {
                size_t n = (size_t)iters * (size_t)(N - 1);
                qsort(all + iters, n, sizeof *all, cmp_d);
                p50[serve] = all[iters + n / 2];
                p90[serve] = all[iters + (n * 9) / 10];
            }
        }
        if (rank == 0)
            printf("%12g  %8.0f  %8.0f  %10.0f  %10.0f\n", C, p50[0], p90[0], p50[1], p90[1]);
    }
    OK(gvqPsDestroy(ps[1]));
    OK(gvqPsDestroy(ps[0]));
    OK(gvqCommDestroy(comm));
    free(idx), free(vals), free(lat), free(all);
    MPI_Finalize();
    return 0;
}
