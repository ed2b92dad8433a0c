/*
 * gvq_ps_recover.c -- what keeping a parameter server through a lost rank costs: gvqPsCommit
 * (each rank's shards copied here and sent to the next rank) and gvqPsRecover onto the
 * communicator of the survivors (gvqCommShrink leaving the last rank out: its rows come from
 * rank 0's copy, and every row whose owner changes with the rank count moves), beside a memcpy
 * of the same bytes measured in the same run.
 *
 *   mpirun -np N build/perf/gvq-ps-recover [--rows R] [--dim D] [--rule sgd|momentum|adagrad]
 *                                          [--iters I]
 *
 * Printed: the bytes a rank keeps per commit (values and rule state of its shards), the commit's
 * median time and rate against memcpy's and against writing as many bytes into memory just
 * allocated (the page faults a new server pays), the shrink's time, and the recovery's median
 * time with the bytes it sent per rank (its rows, then the new server's own commit).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gvq.h"
#include "gvq_mpi.h"
#include "perf_tool.h"

/* The slowest rank's median of t[0..n) (every rank of comm calls it). */
static double slowest_median(double *t, int n, MPI_Comm comm) {
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    double med = t[n / 2], worst = 0;
    MPI_Allreduce(&med, &worst, 1, MPI_DOUBLE, MPI_MAX, comm);
    return worst;
}

static gvqPsConfig_t config_of(int rule) {
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    cfg.rule = rule;
    cfg.init = gvqPsInitUniform;
    return cfg;
}

int main(int argc, char **argv) {
    size_t rows = 1u << 20, dim = 16;
    int iters = 7, rule = gvqPsMomentum;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rows"))
            rows = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--dim"))
            dim = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--iters"))
            iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rule"))
            rule = !strcmp(argv[i + 1], "sgd")       ? gvqPsSgd
                   : !strcmp(argv[i + 1], "adagrad") ? gvqPsAdagrad
                                                     : gvqPsMomentum;
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    int provided, rank, N;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    if (N < 2 || iters < 1 || rows < (size_t)N) {
        if (rank == 0) fprintf(stderr, "gvq-ps-recover: 2+ ranks, iters >= 1, rows >= ranks\n");
        MPI_Finalize();
        return 2;
    }
    gvqComm_t comm;
    OK(gvqCommInitMPI(&comm, MPI_COMM_WORLD, NULL));
    gvqPsConfig_t cfg = config_of(rule);
    gvqPs_t ps;
    OK(gvqPsCreate(comm, rows, dim, gvqFloat32, &cfg, &ps));
    gvqPsStats_t st;
    OK(gvqPsGetStats(ps, &st));
    size_t kept = st.localRows * dim * sizeof(float) * (rule == gvqPsSgd ? 1 : 2);
    double *t = malloc((size_t)iters * sizeof *t);
    /* memcpy of the bytes a commit copies, on this rank, as the memory's rate here */
    char *src = malloc(kept), *dst = malloc(kept);
    memset(src, 1, kept), memset(dst, 2, kept);
    for (int it = 0; it < iters; it++) {
        double t0 = now_s();
        memcpy(dst, src, kept);
        t[it] = now_s() - t0;
    }
    qsort(t, (size_t)iters, sizeof *t, cmp_d);
    double copy = t[iters / 2];
    /* writing as many bytes into memory just allocated (page faults: what a new server's rows
     * and its first commit's copies cost before any byte of them moves) */
    for (int it = 0; it < iters; it++) {
        double t0 = now_s();
        char *fresh = malloc(kept);
        if (fresh != NULL) memset(fresh, 3, kept);
        __asm__ volatile("" : : "r"(fresh) : "memory"); /* the writes happen */
        t[it] = now_s() - t0;
        free(fresh);
    }
    qsort(t, (size_t)iters, sizeof *t, cmp_d);
    double first_touch = t[iters / 2];
    for (int it = -1; it < iters; it++) { /* one warm-up */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now_s();
        OK(gvqPsCommit(ps));
        if (it >= 0) t[it] = now_s() - t0;
    }
    double commit = slowest_median(t, iters, MPI_COMM_WORLD);
    if (rank == 0)
        printf("# gvq-ps-recover: %d ranks, %zu x %zu float rows, rule %d: %.1f MB kept per rank "
               "and commit\n"
               "# commit: %.2f ms (slowest rank's median of %d), %.2f GB/s of kept bytes; memcpy "
               "of them %.2f ms, %.2f GB/s; writing them into fresh memory %.2f ms\n",
               N, rows, dim, rule, kept / 1e6, commit * 1e3, iters, kept / commit / 1e9, copy * 1e3,
               kept / copy / 1e9, first_touch * 1e3);
    /* the last rank leaves (given, so no timeout is waited out); the others recover */
    int last = N - 1;
    MPI_Comm survivors;
    MPI_Comm_split(MPI_COMM_WORLD, rank == last ? MPI_UNDEFINED : 0, rank, &survivors);
    if (rank != last) {
        gvqComm_t nc;
        double t0 = now_s();
        OK(gvqCommShrink(comm, &last, 1, &nc, NULL, GVQ_SHRINK_DEFAULT));
        double shrink = now_s() - t0;
        unsigned long long sent = 0;
        for (int it = -1; it < iters; it++) {
            gvqPs_t np;
            MPI_Barrier(survivors);
            t0 = now_s();
            OK(gvqPsRecover(ps, nc, rows, dim, gvqFloat32, &cfg, &np));
            if (it >= 0) t[it] = now_s() - t0;
            OK(gvqPsGetStats(np, &st));
            sent = st.bytesSent;
            OK(gvqPsDestroy(np));
        }
        double rec = slowest_median(t, iters, survivors);
        unsigned long long most = 0;
        MPI_Allreduce(&sent, &most, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, survivors);
        if (rank == 0)
            printf("# shrink of %d to %d: %.2f ms\n"
                   "# recover on %d ranks: %.2f ms (slowest rank's median of %d), at most %.1f MB "
                   "sent by a rank (rows moved, then the new server's commit)\n",
                   N, N - 1, shrink * 1e3, N - 1, rec * 1e3, iters, most / 1e6);
        OK(gvqCommDestroy(nc));
        MPI_Comm_free(&survivors);
    }
    OK(gvqPsDestroy(ps));
    OK(gvqCommDestroy(comm));
    free(t), free(src), free(dst);
    MPI_Finalize();
    return 0;
}
