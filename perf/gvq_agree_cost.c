/*
 * gvq_agree_cost.c -- what the call-signature agreement costs (issue 13: under 2% from 1 MiB).
 *
 * Every collective first agrees on its signature with the other ranks (docs/RELIABILITY.md). A
 * gvqAllReduce of count 0 is that agreement and nothing else, so its latency is the agreement's
 * price per call; this program measures it beside MPI_Barrier (one synchronization of the same
 * ranks) and beside gvqAllReduce of float sums at a few sizes, in one run:
 *
 *     round:  2000 x count-0 allreduce | 2000 x MPI_Barrier | per size: k x allreduce
 *     report: the medians over the rounds, and agreement / allreduce per size
 *
 * Small allreduces that run recursive doubling carry their data in the agreement's own messages
 * (recursive.c), so for them the share below is an upper bound.
 *
 * Usage: mpirun -np N gvq-agree-cost [-r ROUNDS] [-s BYTES[,BYTES..]]   (default -r 7 -s 1M,16M)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gvq_mpi.h"
#include "perf_common.h"

enum { MAX_SIZES = 8, MAX_ROUNDS = 64, SMALL_CALLS = 2000 };

static size_t parse_bytes(const char *s) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (end != NULL && (*end == 'K' || *end == 'k')) v *= 1024;
    if (end != NULL && (*end == 'M' || *end == 'm')) v *= 1024 * 1024;
    if (end != NULL && (*end == 'G' || *end == 'g')) v *= 1024.0 * 1024 * 1024;
    return (size_t)v;
}

/* Seconds per call of `calls` calls, the slowest rank's (every rank waits for it anyway). */
static double per_call(gvqComm_t comm, int calls, size_t count, float *s, float *d) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < calls; i++) {
        gvqResult_t res = gvqAllReduce(count > 0 ? s : NULL, count > 0 ? d : NULL, count,
                                       gvqFloat32, gvqSum, comm, NULL);
        if (res != gvqSuccess) {
            fprintf(stderr, "gvqAllReduce(count %zu) failed: %s\n", count, gvqGetLastError(NULL));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    double t = (MPI_Wtime() - t0) / calls, worst = 0;
    MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return worst;
}

static double barrier_per_call(int calls) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < calls; i++)
        MPI_Barrier(MPI_COMM_WORLD);
    double t = (MPI_Wtime() - t0) / calls, worst = 0;
    MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return worst;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int rounds = 7, nsizes = 0;
    size_t sizes[MAX_SIZES];
    char list[256] = "1M,16M";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-r") == 0) rounds = atoi(argv[i + 1]);
        if (strcmp(argv[i], "-s") == 0) snprintf(list, sizeof list, "%s", argv[i + 1]);
    }
    if (rounds < 1 || rounds > MAX_ROUNDS) rounds = 7;
    for (char *tok = strtok(list, ","); tok != NULL && nsizes < MAX_SIZES; tok = strtok(NULL, ","))
        if (parse_bytes(tok) >= sizeof(float)) sizes[nsizes++] = parse_bytes(tok);
    size_t maxcount = 1;
    for (int k = 0; k < nsizes; k++)
        if (sizes[k] / sizeof(float) > maxcount) maxcount = sizes[k] / sizeof(float);
    float *s = calloc(maxcount, sizeof *s), *d = calloc(maxcount, sizeof *d);
    gvqComm_t comm = NULL;
    if (s == NULL || d == NULL || gvqCommInitMPI(&comm, MPI_COMM_WORLD, NULL) != gvqSuccess) {
        fprintf(stderr, "gvq-agree-cost: setup failed\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double agree[MAX_ROUNDS], barrier[MAX_ROUNDS], coll[MAX_SIZES][MAX_ROUNDS];
    per_call(comm, 200, 0, s, d); /* warm-up */
    for (int k = 0; k < nsizes; k++)
        per_call(comm, 3, sizes[k] / sizeof(float), s, d);
    for (int r = 0; r < rounds; r++) {
        agree[r] = per_call(comm, SMALL_CALLS, 0, s, d);
        barrier[r] = barrier_per_call(SMALL_CALLS);
        for (int k = 0; k < nsizes; k++) {
            size_t count = sizes[k] / sizeof(float);
            int calls = sizes[k] <= (1u << 20) ? 100 : sizes[k] <= (16u << 20) ? 20 : 5;
            coll[k][r] = per_call(comm, calls, count, s, d);
        }
    }
    double a = perf_median(agree, rounds), b = perf_median(barrier, rounds);
    if (rank == 0) {
        printf("# gvq-agree-cost: %d ranks, medians of %d rounds\n", n, rounds);
        printf("agreement (count-0 gvqAllReduce)  %9.2f us\n", a * 1e6);
        printf("MPI_Barrier                       %9.2f us\n", b * 1e6);
    }
    for (int k = 0; k < nsizes; k++) {
        double c = perf_median(coll[k], rounds);
        if (rank == 0)
            printf("allreduce %10zu bytes          %9.2f us   agreement share %5.2f%%\n", sizes[k],
                   c * 1e6, 100.0 * a / c);
    }
    gvqCommDestroy(comm);
    free(s);
    free(d);
    MPI_Finalize();
    return 0;
}
