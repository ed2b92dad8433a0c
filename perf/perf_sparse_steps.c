/*
 * perf_sparse_steps.c -- the steps of gvq-perf's sparse benchmark: each rank's access pattern and
 * one timed run of each way to aggregate the sparse variable.
 *
 * Each rank touches k = alpha x rows distinct rows per step, drawn without replacement with
 * weights 1/(1+row)^s (Zipf, --zipf s; hot rows are the low indices, as in a frequency-sorted
 * vocabulary; ranks overlap on them). The row sets of every step are drawn before timing. A step:
 *   dense:     gvqAllReduce of the full rows x dim gradient (in place), then SGD on every row
 *   sparse-ag: gvqSparseAllGatherv of the k rows (merged), then SGD on the union's rows of the
 *              rank's replica
 *   ps:        gvqPsPull of the k rows, gvqPsPush of their gradients, gvqPsApply
 * time = the slowest rank's mean step; bytes = what gvq counted this rank sending and receiving
 * (indices and headers included; dense: the ring's 2(N-1)/N w each way).
 */
#include "perf_sparse_steps.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf_common.h"
#include "perf_gradsrc.h"

#define SP_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SP_MAX(a, b) ((a) > (b) ? (a) : (b))

const char *const sp_mode_names[NUM_MODES] = {"sparse-ag", "ps", "dense"};

/* ---- the access pattern ------------------------------------------------------------------- */

typedef struct {
    double key;
    int64_t row;
} keyed_row_t;

static int key_desc(const void *a, const void *b) {
    double x = ((const keyed_row_t *)a)->key, y = ((const keyed_row_t *)b)->key;
    return x > y ? -1 : x < y;
}

static int i64_asc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* k distinct rows drawn with weights 1/(1+j)^s without replacement (Efraimidis-Spirakis: the k
 * largest u^(1/w), i.e. log(u)/w), a pure function of (seed, rank, step); sorted. */
static void draw_rows(const sp_opts_t *o, int rank, int step, size_t k, int64_t *out,
                      keyed_row_t *tmp) {
    uint64_t base = gs_mix64(o->seed * 0x9e3779b97f4a7c15ull + (uint64_t)rank * 1000003u +
                             (uint64_t)step * 7919u + 17);
    for (size_t j = 0; j < o->rows; j++) {
        uint64_t x = gs_mix64(base ^ (j * 0xd1b54a32d192ed03ull));
        double u = ((double)(x >> 11) + 0.5) / 9007199254740992.0;
        double w = pow(1.0 + (double)j, -o->zipf);
        tmp[j].key = log(u) / w;
        tmp[j].row = (int64_t)j;
    }
    /* the k largest keys: a partial selection is enough, but sorting the lot keeps this short */
    qsort(tmp, o->rows, sizeof *tmp, key_desc);
    for (size_t i = 0; i < k; i++)
        out[i] = tmp[i].row;
    qsort(out, k, sizeof *out, i64_asc);
}

/* Gradient value of (rank, step, row, col): small, varied, exact in float sums. */
static float grad_of(int rank, int step, int64_t row, size_t col) {
    uint64_t x = gs_mix64(((uint64_t)row << 20) ^ (col << 8) ^ ((uint64_t)step << 40) ^
                          (uint64_t)rank * 0x9e37ull);
    return (float)((int)(x % 9) - 4) * 0.125f;
}

void sp_work_init(sp_work_t *wk, const sp_opts_t *o) {
    memset(wk, 0, sizeof *wk);
    wk->o = o;
    wk->k = (size_t)llround(o->alpha * (double)o->rows);
    if (wk->k < 1) wk->k = 1;
    if (wk->k > o->rows) wk->k = o->rows;
    wk->nsteps = SP_MIN(o->warmup + o->iters, 8); /* row sets cycle after 8 steps */
    wk->rows = calloc((size_t)wk->nsteps, sizeof *wk->rows);
    wk->grad = malloc(wk->k * o->dim * sizeof *wk->grad);
    keyed_row_t *tmp = malloc(o->rows * sizeof *tmp);
    if (wk->rows == NULL || wk->grad == NULL || tmp == NULL) {
        fprintf(stderr, "gvq-perf: rank %d: out of memory\n", perf_rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int s = 0; s < wk->nsteps; s++) {
        wk->rows[s] = malloc(wk->k * sizeof **wk->rows);
        draw_rows(o, perf_rank, s, wk->k, wk->rows[s], tmp);
    }
    free(tmp);
}

void sp_work_free(sp_work_t *wk) {
    for (int s = 0; s < wk->nsteps; s++)
        free(wk->rows[s]);
    free(wk->rows);
    free(wk->grad);
}

double sp_union_share(const sp_work_t *wk) {
    const sp_opts_t *o = wk->o;
    gvqSparseRows_t u = GVQ_SPARSE_ROWS_INITIALIZER;
    float *z = calloc(wk->k * o->dim, sizeof *z);
    GVQTEST(gvqSparseAllGatherv(wk->rows[0], z, wk->k, o->rows, o->dim, gvqFloat32, 0, &u,
                                perf_comm, NULL));
    double share = (double)u.nrows / ((double)wk->k * perf_nranks);
    gvqSparseRowsFree(&u);
    free(z);
    return share;
}

/* ---- the methods -------------------------------------------------------------------------- */

static void fill_grad(const sp_work_t *wk, int step) {
    const int64_t *r = wk->rows[step % wk->nsteps];
    for (size_t i = 0; i < wk->k; i++)
        for (size_t j = 0; j < wk->o->dim; j++)
            wk->grad[i * wk->o->dim + j] = grad_of(perf_rank, step % wk->nsteps, r[i], j);
}

static void finish_result(sp_result_t *r, double mine_s, int steps) {
    double t = mine_s / steps, all[4], mine[4] = {r->sent / steps, r->recv / steps, 0, 0};
    MPI_Allreduce(&t, &r->step_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(mine, all, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    r->sent_avg = all[0] / perf_nranks;
    r->recv_avg = all[1] / perf_nranks;
    MPI_Allreduce(mine, all + 2, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    r->sent_max = all[2];
    r->recv_max = all[3];
    r->sent = mine[0];
    r->recv = mine[1];
    r->ran = 1;
}

static void sgd_rows(float *w, size_t dim, const int64_t *idx, const float *g, size_t n,
                     double lr) {
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < dim; j++)
            w[(size_t)idx[i] * dim + j] -= (float)lr * g[i * dim + j];
}

/* dense: the replica w, the full gradient buffer */
sp_result_t sp_run_dense(const sp_work_t *wk, float *w) {
    const sp_opts_t *o = wk->o;
    size_t count = o->rows * o->dim;
    float *g = calloc(count, sizeof *g);
    sp_result_t r;
    memset(&r, 0, sizeof r);
    if (g == NULL) {
        fprintf(stderr, "gvq-perf: rank %d: no memory for the dense gradient\n", perf_rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double mine = 0;
    for (int s = 0; s < o->warmup + o->iters; s++) {
        memset(g, 0, count * sizeof *g);
        fill_grad(wk, s);
        const int64_t *rows = wk->rows[s % wk->nsteps];
        for (size_t i = 0; i < wk->k; i++)
            memcpy(g + (size_t)rows[i] * o->dim, wk->grad + i * o->dim, o->dim * sizeof *g);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        GVQTEST(gvqAllReduce(g, g, count, gvqFloat32, gvqSum, perf_comm, NULL));
        for (size_t e = 0; e < count; e++)
            w[e] -= (float)o->lr * g[e];
        double dt = MPI_Wtime() - t0;
        if (s >= o->warmup) mine += dt;
    }
    /* the ring sends and receives 2(N-1)/N of the buffer */
    double ring = perf_nranks > 1 ? 2.0 * (perf_nranks - 1) / perf_nranks * (double)count * 4 : 0.0;
    r.sent = ring * o->iters;
    r.recv = ring * o->iters;
    finish_result(&r, mine, o->iters);
    free(g);
    return r;
}

sp_result_t sp_run_ag(const sp_work_t *wk, float *w) {
    const sp_opts_t *o = wk->o;
    gvqSparseRows_t out = GVQ_SPARSE_ROWS_INITIALIZER;
    sp_result_t r;
    memset(&r, 0, sizeof r);
    double mine = 0;
    for (int s = 0; s < o->warmup + o->iters; s++) {
        fill_grad(wk, s);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        GVQTEST(gvqSparseAllGatherv(wk->rows[s % wk->nsteps], wk->grad, wk->k, o->rows, o->dim,
                                    gvqFloat32, GVQ_SPARSE_SUMMED, &out, perf_comm, NULL));
        sgd_rows(w, o->dim, out.indices, out.values, out.nrows, o->lr);
        double dt = MPI_Wtime() - t0;
        if (s >= o->warmup) {
            mine += dt;
            r.sent += (double)out.bytesSent;
            r.recv += (double)out.bytesReceived;
        }
    }
    r.algorithm = out.algorithm;
    finish_result(&r, mine, o->iters);
    gvqSparseRowsFree(&out);
    return r;
}

gvqPs_t sp_make_ps(const sp_opts_t *o, int P) {
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    cfg.partitions = P;
    cfg.partitioning = o->partitioning;
    cfg.rule = gvqPsSgd;
    cfg.learningRate = o->lr;
    cfg.localAggregation = o->local_agg;
    gvqPs_t ps = NULL;
    GVQTEST(gvqPsCreate(perf_comm, o->rows, o->dim, gvqFloat32, &cfg, &ps));
    return ps;
}

/* One PS step: pull the rows, push their gradients, apply. */
gvqResult_t sp_ps_step(gvqPs_t ps, const sp_work_t *wk, int s, float *pulled) {
    const int64_t *rows = wk->rows[s % wk->nsteps];
    fill_grad(wk, s);
    gvqResult_t res = gvqPsPull(ps, rows, pulled, wk->k);
    if (res == gvqSuccess) res = gvqPsPush(ps, rows, wk->grad, wk->k);
    if (res == gvqSuccess) res = gvqPsApply(ps);
    return res;
}

sp_result_t sp_run_ps(const sp_work_t *wk, gvqPs_t ps, int iters, int warmup) {
    sp_result_t r;
    memset(&r, 0, sizeof r);
    float *pulled = malloc(SP_MAX(wk->k, 1) * wk->o->dim * sizeof *pulled);
    double mine = 0;
    for (int s = 0; s < warmup + iters; s++) {
        gvqPsStats_t a, b;
        GVQTEST(gvqPsGetStats(ps, &a));
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        GVQTEST(sp_ps_step(ps, wk, s, pulled));
        double dt = MPI_Wtime() - t0;
        GVQTEST(gvqPsGetStats(ps, &b));
        if (s >= warmup) {
            mine += dt;
            r.sent += (double)(b.bytesSent - a.bytesSent);
            r.recv += (double)(b.bytesReceived - a.bytesReceived);
        }
    }
    finish_result(&r, mine, iters);
    free(pulled);
    return r;
}
