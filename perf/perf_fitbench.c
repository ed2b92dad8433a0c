/*
 * perf_fitbench.c -- gvq-perf --fit-bench: gvq_pca_fit on the host device for a few slice sizes,
 * on rank 0 while the other ranks sleep, with the covariance route's two heavy steps (the L x L
 * sgemm and the L x L eigen-solve) timed on their own beside it (perf_codecbench.c). Each fit
 * runs --fit-reps times; the table shows the median (min, max).
 */
#include "perf_fitbench.h"

#include <stdio.h>
#include <stdlib.h>

#include "internal/perf_codecbench.h"
#include "perf_common.h"
#include "perf_gradsrc.h"

enum { FIT_SAMPLES = 100 };

/* Seconds of each repetition of one slice size. */
typedef struct {
    double *fit, *cov, *eig;
} fit_times_t;

static void print_fit_header(const opts_t *o) {
    const char *nt = getenv("OPENBLAS_NUM_THREADS");
    printf("# fit bench: gvq_pca_fit on the host device (Gram route when T < L: T x T sgemm +\n"
           "#   LAPACKE ssyevd, eigenvectors mapped back and re-orthonormalised),\n"
           "#   T=%d samples (one slice of the synthetic source over T iterations), eps %g,\n"
           "#   no cap on d; median (min, max) of %d fits; cov(ms) and ssyevd(ms): the\n"
           "#   covariance route's L x L sgemm and L x L eigen-solve, timed on their own;\n"
           "#   OPENBLAS_NUM_THREADS=%s\n",
           FIT_SAMPLES, o->eps, o->fit_reps, nt ? nt : "(unset)");
    printf("#%5s%5s%6s%9s%11s%11s%11s%11s%11s\n", "L", "T", "d", "kept", "fit(ms)", "min", "max",
           "cov(ms)", "ssyevd(ms)");
}

static void print_fit_row(const opts_t *o, size_t L, size_t T, size_t d, double kept,
                          fit_times_t *tm) {
    double mn = tm->fit[0], mx = tm->fit[0];
    for (int rep = 1; rep < o->fit_reps; rep++) {
        mn = tm->fit[rep] < mn ? tm->fit[rep] : mn;
        mx = tm->fit[rep] > mx ? tm->fit[rep] : mx;
    }
    printf("%6zu%5zu%6zu%9.4f%11.2f%11.2f%11.2f%11.2f%11.2f\n", L, T, d, kept,
           perf_median(tm->fit, o->fit_reps) * 1e3, mn * 1e3, mx * 1e3,
           perf_median(tm->cov, o->fit_reps) * 1e3, perf_median(tm->eig, o->fit_reps) * 1e3);
    fflush(stdout);
}

/* --fit-reps fits of T samples of slice L; 0, or 1 after reporting the failure. */
static int time_fits(const opts_t *o, size_t L, size_t T, const float *samples, fit_times_t *tm) {
    size_t d = 0;
    double kept = 0;
    char err[200];
    for (int rep = 0; rep < o->fit_reps; rep++)
        if (cb_fit_time(L, T, samples, o->eps, L, &d, &kept, &tm->fit[rep], &tm->cov[rep],
                        &tm->eig[rep], err, sizeof err) != 0) {
            fprintf(stderr, "gvq-perf: %s\n", err);
            return 1;
        }
    print_fit_row(o, L, T, d, kept, tm);
    return 0;
}

/* One row of the table: slice size L, T samples; 0, or 1 on a failure. */
static int fit_bench_one(const opts_t *o, size_t L, size_t T) {
    int r = (int)(L / 8 < T - 4 ? L / 8 : T - 4);
    gs_source_t *src = gs_synthetic(o->seed, L, r, o->noise, o->variation);
    float *samples = malloc(sizeof(float) * L * T);
    fit_times_t tm = {malloc(sizeof(double) * (size_t)o->fit_reps),
                      malloc(sizeof(double) * (size_t)o->fit_reps),
                      malloc(sizeof(double) * (size_t)o->fit_reps)};
    int rc = 0;
    if (src == NULL || samples == NULL || tm.fit == NULL || tm.cov == NULL || tm.eig == NULL) {
        fprintf(stderr, "gvq-perf: out of memory\n");
        rc = 1;
    }
    for (size_t t = 0; rc == 0 && t < T; t++)
        gs_fill(src, 0, (long long)t, 0, L, samples + t * L);
    if (rc == 0) rc = time_fits(o, L, T, samples, &tm);
    gs_free(src);
    free(samples);
    free(tm.fit);
    free(tm.cov);
    free(tm.eig);
    return rc;
}

int perf_fit_bench(const opts_t *o) {
    static const size_t Ls[] = {256, 512, 1024, 2304};
    int rc = 0;
    perf_sleepy_barrier();
    if (perf_rank == 0) {
        print_fit_header(o);
        for (size_t k = 0; k < sizeof Ls / sizeof Ls[0] && rc == 0; k++)
            rc = fit_bench_one(o, Ls[k], FIT_SAMPLES);
        printf("#\n");
        fflush(stdout);
    }
    perf_sleepy_barrier();
    MPITEST(MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD));
    return rc;
}
