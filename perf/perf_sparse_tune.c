/*
 * perf_sparse_tune.c -- gvq-perf -C ps --ps-tune: gvqPsTunePartitions picks the number of
 * parameter-server partitions P from a few timed samples and a fitted model
 * t(P) = a + b/P + c*P; a sweep then times every P from 1 to --sweep-max the way the tuner times
 * a sample (back-to-back steps, the first half left out, each rank's median step, the slowest
 * rank's), SWEEP_REPS passes over all P with the fastest pass of each P kept, so that noise does
 * not pick the winner. The tuner meets its target when its P is within 5% of the sweep's best.
 */
#include "perf_sparse_tune.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "perf_common.h"

#define SWEEP_REPS 3

typedef struct {
    const sp_work_t *wk;
    float *pulled;
} tune_ctx_t;

static gvqResult_t tune_step(gvqPs_t ps, int it, void *arg) {
    tune_ctx_t *t = arg;
    return sp_ps_step(ps, t->wk, it, t->pulled);
}

/* The tuner's result; *seconds: how long it took. */
static void tune_partitions(tune_ctx_t *tc, gvqPsTuneResult_t *res, double *seconds) {
    const sp_opts_t *o = tc->wk->o;
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    cfg.partitioning = o->partitioning;
    cfg.learningRate = o->lr;
    cfg.localAggregation = o->local_agg;
    gvqPsTuneConfig_t tune = GVQ_PS_TUNE_CONFIG_INITIALIZER;
    tune.itersPerSample = o->tune_iters;
    tune.skipIters = o->tune_iters / 2;
    tune.maxPartitions = o->sweep_max;
    double t0 = MPI_Wtime();
    GVQTEST(gvqPsTunePartitions(perf_comm, o->rows, o->dim, gvqFloat32, &cfg, &tune, tune_step, tc,
                                res));
    *seconds = MPI_Wtime() - t0;
}

/* One point of the sweep: the slowest rank's median step with P partitions. */
static double sweep_point(const sp_work_t *wk, int P, float *pulled, double *dt) {
    const sp_opts_t *o = wk->o;
    int warm = o->tune_iters / 2;
    gvqPs_t ps = sp_make_ps(o, P);
    MPI_Barrier(MPI_COMM_WORLD);
    for (int it = 0; it < o->tune_iters; it++) {
        double t0 = MPI_Wtime();
        GVQTEST(sp_ps_step(ps, wk, it, pulled));
        dt[it] = MPI_Wtime() - t0;
    }
    double mine = perf_median(dt + warm, o->tune_iters - warm), t = 0;
    MPI_Allreduce(&mine, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    gvqPsDestroy(ps);
    return t;
}

/* sw[P] for P = 1 .. --sweep-max: the best of SWEEP_REPS passes. */
static void sweep_partitions(const sp_work_t *wk, float *pulled, double *sw) {
    const sp_opts_t *o = wk->o;
    double *dt = calloc((size_t)o->tune_iters, sizeof *dt);
    for (int rep = 0; rep < SWEEP_REPS; rep++)
        for (int P = 1; P <= o->sweep_max; P++) {
            double t = sweep_point(wk, P, pulled, dt);
            if (rep == 0 || t < sw[P]) sw[P] = t;
        }
    free(dt);
}

static void print_tuner(const sp_opts_t *o, const gvqPsTuneResult_t *res, double tune_s) {
    printf("#\n# partition tuner (gvqPsTunePartitions: %d steps per sample, first %d left out, "
           "median step; %.1f s)\n",
           o->tune_iters, o->tune_iters / 2, tune_s);
    printf("#   samples (in the order taken):");
    for (int i = 0; i < res->nsamples; i++)
        printf(" P=%d %.3f ms;", res->partitions[i], 1e3 * res->seconds[i]);
    printf("\n#   fit: t(P) = %.4g + %.4g/P + %.4g*P s (%s)\n", res->theta[0], res->theta[1],
           res->theta[2], res->fitOk ? "least squares" : "no fit: best sample");
    printf("#   chosen P = %d (predicted %.3f ms); best sample P = %d (%.3f ms)\n",
           res->bestPartitions, 1e3 * res->predictedSeconds, res->bestSampledPartitions,
           1e3 * res->bestSampledSeconds);
}

static void print_sweep(const sp_opts_t *o, const gvqPsTuneResult_t *res, const double *sw) {
    int np = o->sweep_max, best = 1, chosen = res->bestPartitions;
    for (int P = 1; P <= np; P++)
        if (sw[P] < sw[best]) best = P;
    printf("# sweep (%d steps per P, first %d left out, median step, best of %d passes): P  "
           "ms/step\n",
           o->tune_iters, o->tune_iters / 2, SWEEP_REPS);
    for (int P = 1; P <= np; P++)
        printf("#   %3d %9.3f%s%s\n", P, 1e3 * sw[P], P == best ? "  <- best of the sweep" : "",
               P == chosen ? "  <- tuner's choice" : "");
    double ratio = chosen <= np ? sw[chosen] / sw[best] : NAN;
    printf("# tuner vs sweep: chosen P = %d at %.3f ms, best P = %d at %.3f ms: %.1f%% %s "
           "(target: within 5%%)\n",
           chosen, 1e3 * (chosen <= np ? sw[chosen] : NAN), best, 1e3 * sw[best],
           100.0 * (ratio - 1.0), ratio <= 1.05 ? "MET" : "MISSED");
}

void sp_run_tune(const sp_work_t *wk) {
    const sp_opts_t *o = wk->o;
    tune_ctx_t tc = {wk, malloc((wk->k > 1 ? wk->k : 1) * o->dim * sizeof(float))};
    gvqPsTuneResult_t res;
    double tune_s = 0;
    tune_partitions(&tc, &res, &tune_s);
    double *sw = calloc((size_t)o->sweep_max + 1, sizeof *sw);
    sweep_partitions(wk, tc.pulled, sw);
    if (perf_rank == 0) {
        print_tuner(o, &res, tune_s);
        print_sweep(o, &res, sw);
        fflush(stdout);
    }
    free(sw);
    free(tc.pulled);
}
