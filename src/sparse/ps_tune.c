/*
 * ps_tune.c -- gvqPsTunePartitions: the partition tuner's driver (its math is
 * src/algorithms/sparse_tune.c, docs/ALGORITHMS.md section 4).
 *
 *   tune config -> start P (default: the number of hosts) -> search (gvq_ptune_t):
 *       sample P: a fresh server with P partitions, `itersPerSample` calls of the user's step,
 *                 the first `skipIters` not timed; each rank's median step, the slowest rank's
 *       double from the start while the time falls, then halve, then refine around the fit's
 *       minimum and the fastest sample (candidates: multiples of the rank count)
 *   -> result: every sample, the fit, the fastest sample (the choice)
 */
#include <stdlib.h>

#include "gvq_group.h"
#include "gvq_ps.h"

/* A resolved gvqPsTuneConfig_t. */
typedef struct {
    int iters, skip, max_partitions, start_partitions;
} tune_cfg_t;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of dt[0..n) (sorts it). */
static double median(double *dt, int n) {
    qsort(dt, (size_t)n, sizeof *dt, cmp_double);
    return n % 2 ? dt[n / 2] : 0.5 * (dt[n / 2 - 1] + dt[n / 2]);
}

/* Seconds per iteration of `step` on a fresh server with P partitions: each rank's median over
 * the timed iterations (robust to the odd descheduled step on a busy host), the slowest rank's. */
static gvqResult_t tune_sample(gvqComm_t comm, size_t rows, size_t dim, gvqDataType_t dtype,
                               const gvqPsConfig_t *config, int P, const tune_cfg_t *tc,
                               gvqPsStepFn_t step, void *user, double *seconds) {
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    if (config != NULL) cfg = *config;
    cfg.partitions = P;
    double *dt = malloc((size_t)tc->iters * sizeof *dt);
    if (dt == NULL) {
        GVQ_WARN("gvqPsTunePartitions: out of memory for %d sample times", tc->iters);
        return gvqSystemError;
    }
    gvqPs_t ps = NULL;
    gvqResult_t res = gvqPsCreate(comm, rows, dim, dtype, &cfg, &ps);
    for (int it = 0; it < tc->iters && res == gvqSuccess; it++) {
        uint64_t t0 = gvq_now_ns();
        res = step(ps, it, user);
        dt[it] = (double)(gvq_now_ns() - t0) * 1e-9;
    }
    if (ps != NULL) gvqPsDestroy(ps);
    double mine = res == gvqSuccess ? median(dt + tc->skip, tc->iters - tc->skip) : 0.0;
    free(dt);
    GVQCHECK(res);
    return gvq_allreduce_plain(&mine, seconds, 1, gvqFloat64, gvqMax, comm, NULL);
}

/* The tune config (NULL: defaults) checked and resolved; the default start is the number of
 * hosts (collective then). */
static gvqResult_t resolve_tune(const char *fn, gvqComm_t comm, size_t rows,
                                const gvqPsTuneConfig_t *tune, tune_cfg_t *out) {
    gvqPsTuneConfig_t def = GVQ_PS_TUNE_CONFIG_INITIALIZER;
    if (tune == NULL) tune = &def;
    GVQCHECK(gvq_config_header_check(fn, "tune", tune->size, tune->magic, tune->version,
                                     GVQ_PS_TUNE_CONFIG_MAGIC, sizeof(gvqPsTuneConfig_t),
                                     sizeof(gvqPsTuneConfig_t), "GVQ_PS_TUNE_CONFIG_INITIALIZER"));
    int iters = tune->itersPerSample == GVQ_CONFIG_UNDEF_INT ? 100 : tune->itersPerSample;
    int skip = tune->skipIters == GVQ_CONFIG_UNDEF_INT ? iters / 2 : tune->skipIters;
    long dmax = GVQ_MIN((long)GVQ_MIN(rows, (size_t)GVQ_PS_MAX_PARTITIONS), 64L * comm->nranks);
    int maxp = tune->maxPartitions == GVQ_CONFIG_UNDEF_INT ? (int)dmax : tune->maxPartitions;
    if (iters < 1 || skip < 0 || skip >= iters) {
        GVQ_WARN("%s: itersPerSample %d and skipIters %d: need 0 <= skip < iters", fn, iters, skip);
        return gvqInvalidArgument;
    }
    if (maxp < 1 || maxp > GVQ_PS_MAX_PARTITIONS) {
        GVQ_WARN("%s: maxPartitions %d is outside [1, %d]", fn, maxp, GVQ_PS_MAX_PARTITIONS);
        return gvqInvalidArgument;
    }
    int start = tune->startPartitions;
    if (start == GVQ_CONFIG_UNDEF_INT) {
        int leader = 0;
        GVQCHECK(gvq_comm_enter(comm, fn));
        gvqResult_t res = gvq_comm_hosts(comm, &start, &leader, NULL);
        gvq_comm_leave(comm);
        GVQCHECK(res);
    }
    if (start < 1) {
        GVQ_WARN("%s: startPartitions %d is not >= 1", fn, start);
        return gvqInvalidArgument;
    }
    *out = (tune_cfg_t){iters, skip, maxp, start};
    return gvqSuccess;
}

/* Every sample, the fastest one and the fit. */
static gvqPsTuneResult_t result_of(const gvq_ptune_t *s) {
    gvqPsTuneResult_t out;
    memset(&out, 0, sizeof out);
    out.nsamples = s->n;
    for (int i = 0; i < s->n; i++) {
        out.partitions[i] = s->Ps[i];
        out.seconds[i] = s->ts[i];
        if (out.bestSampledPartitions == 0 || s->ts[i] < out.bestSampledSeconds)
            out.bestSampledPartitions = s->Ps[i], out.bestSampledSeconds = s->ts[i];
    }
    out.bestPartitions = gvq_ptune_choose(s, &out.fitOk, out.theta, &out.predictedSeconds);
    return out;
}

GVQ_API gvqResult_t gvqPsTunePartitions(gvqComm_t comm, size_t rows, size_t dim,
                                        gvqDataType_t datatype, const gvqPsConfig_t *config,
                                        const gvqPsTuneConfig_t *tune, gvqPsStepFn_t step,
                                        void *userData, gvqPsTuneResult_t *result) {
    const char *fn = "gvqPsTunePartitions";
    if (step == NULL || result == NULL) {
        GVQ_WARN("%s: %s is NULL", fn, step == NULL ? "step" : "result");
        return gvqInvalidArgument;
    }
    GVQCHECK(gvq_comm_check(comm, fn, 0));
    tune_cfg_t tc;
    GVQCHECK(resolve_tune(fn, comm, rows, tune, &tc));
    gvq_ptune_t s;
    /* shards live on rank s mod N: multiples of N keep the ranks' loads equal */
    gvq_ptune_init(&s, tc.start_partitions, tc.max_partitions, comm->nranks);
    for (int P; (P = gvq_ptune_next(&s)) != 0;) {
        double t = 0.0;
        GVQCHECK(tune_sample(comm, rows, dim, datatype, config, P, &tc, step, userData, &t));
        GVQ_INFO("%s: P %d: %.6f s per iteration", fn, P, t);
        gvq_ptune_record(&s, t);
    }
    *result = result_of(&s);
    return gvqSuccess;
}
