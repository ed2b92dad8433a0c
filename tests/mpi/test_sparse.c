/*
 * test_sparse.c -- sparse allgatherv and the parameter server against a dense reference built
 * with MPI alone: every rank's rows scattered into a dense rows x dim matrix, MPI_Allreduce of
 * that matrix (and of a touched mask), and the update rule written out here (not gvq's).
 *
 *   allgatherv: the union equals the dense sum on its touched rows (exactly: the values are
 *               small integers), the raw concatenation equals MPI_Allgatherv of the inputs, and
 *               every rank holds the same bytes; random duplicates, empty contributions, float,
 *               double, half
 *   ps:         push / apply / pull over several steps equals dense allreduce + the same rule,
 *               for P from 1 to more than rows, hashed and contiguous, SGD, momentum, Adagrad,
 *               averaging, local aggregation, caller-provided and seeded initial values
 *   save/load:  a restored server continues exactly; a bad state is refused and changes nothing
 *   bad input:  indices outside [0, rows), NULL with n > 0, mismatched dim or datatype, a
 *               config the ranks disagree on: the documented code, and no shard changed
 *
 * Run at 1..5 ranks; GVQ_SPARSE_ALLGATHERV=1 runs the allgatherv through MPI_Iallgatherv.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gvq.h"
#include "mpitest.h"

#define GVQ_MIN_SZ(a, b) ((a) < (b) ? (a) : (b))

static gvqComm_t comm;

/* ---- deterministic data ------------------------------------------------------------------- */

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Rank `rank`'s rows of step `step` under `seed`: some ranks contribute nothing, duplicates are
 * frequent (indices from a range smaller than n at times). Returns n; idx and val (as double)
 * must hold maxn rows. */
static size_t make_rows(uint64_t seed, int rank, int step, size_t rows, size_t dim, size_t maxn,
                        int64_t *idx, double *val) {
    uint64_t x = mix(seed * 1000003u + (uint64_t)rank * 7919u + (uint64_t)step * 104729u + 1);
    if (x % 5 == 0) return 0; /* an empty contribution */
    size_t n = (size_t)(mix(x) % (maxn + 1));
    size_t span = (x >> 8) % 3 == 0 ? GVQ_MIN_SZ(rows, 3) : rows;
    for (size_t i = 0; i < n; i++) {
        uint64_t y = mix(x + i + 1);
        idx[i] = (int64_t)(y % span);
        for (size_t j = 0; j < dim; j++)
            val[i * dim + j] = (double)((int)(mix(y + j) % 11) - 5);
    }
    return n;
}

/* ---- element helpers ---------------------------------------------------------------------- */

static uint16_t to_half(float f) { /* exact for the small integers used here */
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a == 0) return (uint16_t)sign;
    return (uint16_t)(sign | ((((a >> 23) - 112u) << 10) | ((a & 0x7fffffu) >> 13)));
}
static float from_half(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t x = e == 0 ? sign : (sign | ((e + 112u) << 23) | (m << 13));
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static size_t esize_of(gvqDataType_t t) {
    return t == gvqFloat64 ? 8 : t == gvqFloat32 ? 4 : 2;
}
static void put(void *b, size_t i, gvqDataType_t t, double v) {
    if (t == gvqFloat64)
        ((double *)b)[i] = v;
    else if (t == gvqFloat32)
        ((float *)b)[i] = (float)v;
    else
        ((uint16_t *)b)[i] = to_half((float)v);
}
static double get(const void *b, size_t i, gvqDataType_t t) {
    if (t == gvqFloat64) return ((const double *)b)[i];
    if (t == gvqFloat32) return ((const float *)b)[i];
    return from_half(((const uint16_t *)b)[i]);
}

/* ---- the dense reference ------------------------------------------------------------------ */

/* Dense sum over ranks of this step's rows (each rank adds its own, then MPI_Allreduce), and
 * the mask of rows any rank touched. */
static void dense_reference(const int64_t *idx, const double *val, size_t n, size_t rows,
                            size_t dim, double *sum, int *touched) {
    double *mine = calloc(rows * dim, sizeof *mine);
    int *tm = calloc(rows, sizeof *tm);
    for (size_t i = 0; i < n; i++) {
        tm[idx[i]] = 1;
        for (size_t j = 0; j < dim; j++)
            mine[idx[i] * dim + j] += val[i * dim + j];
    }
    MPI_Allreduce(mine, sum, (int)(rows * dim), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(tm, touched, (int)rows, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    free(mine);
    free(tm);
}

/* Every rank holds the same bytes: compare a hash of them across ranks. */
static void same_on_all(const void *buf, size_t bytes, const char *what) {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ ((const unsigned char *)buf)[i]) * 0x100000001b3ull;
    unsigned long long mine = h, lo = 0, hi = 0;
    MPI_Allreduce(&mine, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    MT_CHECK(lo == hi, "%s: ranks hold different bytes", what);
}

/* ---- allgatherv ----------------------------------------------------------------------------- */

static void test_allgatherv_case(size_t rows, size_t dim, size_t maxn, gvqDataType_t dt,
                                 uint64_t seed, gvqSparseRows_t *out) {
    size_t es = esize_of(dt);
    int64_t *idx = malloc((maxn + 1) * 8);
    double *val = malloc((maxn + 1) * dim * sizeof *val);
    size_t n = make_rows(seed, mt.rank, 0, rows, dim, maxn, idx, val);
    void *v = malloc((maxn + 1) * dim * es);
    for (size_t k = 0; k < n * dim; k++)
        put(v, k, dt, val[k]);
    double *sum = malloc(rows * dim * sizeof *sum);
    int *touched = malloc(rows * sizeof *touched);
    dense_reference(idx, val, n, rows, dim, sum, touched);
    MT_OK(gvqSparseAllGatherv(idx, v, n, rows, dim, dt, GVQ_SPARSE_SUMMED | GVQ_SPARSE_RAW, out,
                              comm, NULL));
    size_t want = 0;
    for (size_t r = 0; r < rows; r++)
        want += touched[r] != 0;
    MT_CHECK(out->nrows == want,
             "allgatherv rows %zu dim %zu type %d: %zu unique rows, dense "
             "reference %zu",
             rows, dim, (int)dt, out->nrows, want);
    for (size_t i = 0, r = 0; i < out->nrows && i < want; i++, r++) {
        while (!touched[r])
            r++;
        MT_CHECK(out->indices[i] == (int64_t)r, "union row %zu: index %lld, expected %zu", i,
                 (long long)out->indices[i], r);
        for (size_t j = 0; j < dim; j++)
            MT_CHECK(get(out->values, i * dim + j, dt) == sum[r * dim + j],
                     "union row %zu (index %zu) col %zu: %g, dense reference %g", i, r, j,
                     get(out->values, i * dim + j, dt), sum[r * dim + j]);
    }
    /* the raw concatenation against MPI_Allgatherv */
    int *cnt = malloc(mt.nranks * sizeof *cnt), *dsp = malloc(mt.nranks * sizeof *dsp), ni = (int)n;
    MPI_Allgather(&ni, 1, MPI_INT, cnt, 1, MPI_INT, MPI_COMM_WORLD);
    int total = 0;
    for (int p = 0; p < mt.nranks; p++)
        dsp[p] = total, total += cnt[p];
    int64_t *ref = malloc(((size_t)total + 1) * 8);
    MPI_Allgatherv(idx, ni, MPI_INT64_T, ref, cnt, dsp, MPI_INT64_T, MPI_COMM_WORLD);
    MT_CHECK(out->rawRows == (size_t)total, "raw rows %zu, MPI_Allgatherv %d", out->rawRows, total);
    for (int p = 0; p < mt.nranks && out->rankRows != NULL; p++)
        MT_CHECK(out->rankRows[p] == (size_t)cnt[p], "rank %d sent %zu rows, gave %d", p,
                 out->rankRows[p], cnt[p]);
    if (out->rawRows == (size_t)total)
        MT_CHECK(total == 0 || memcmp(ref, out->rawIndices, (size_t)total * 8) == 0,
                 "raw indices differ from MPI_Allgatherv");
    if (n > 0 && out->rawRows == (size_t)total)
        MT_CHECK(
            memcmp((char *)out->rawValues + (size_t)dsp[mt.rank] * dim * es, v, n * dim * es) == 0,
            "raw values of this rank's block differ from its input");
    same_on_all(out->values, out->nrows * dim * es, "union values");
    same_on_all(out->rawValues, out->rawRows * dim * es, "raw values");
    /* summed only: each rank merges first, the union is the same */
    gvqSparseRows_t o2 = GVQ_SPARSE_ROWS_INITIALIZER;
    MT_OK(gvqSparseAllGatherv(idx, v, n, rows, dim, dt, 0, &o2, comm, NULL));
    MT_CHECK(o2.nrows == out->nrows && o2.rawRows == 0 &&
                 memcmp(o2.indices, out->indices, out->nrows * 8) == 0 &&
                 memcmp(o2.values, out->values, out->nrows * dim * es) == 0,
             "summed-only union differs from the one built from the raw rows");
    MT_OK(gvqSparseRowsFree(&o2));
    free(idx), free(val), free(v), free(sum), free(touched), free(cnt), free(dsp), free(ref);
}

static void test_allgatherv(void) {
    gvqSparseRows_t out = GVQ_SPARSE_ROWS_INITIALIZER; /* reused: grows between calls */
    static const struct {
        size_t rows, dim, maxn;
    } c[] = {{1, 1, 3}, {7, 3, 20}, {100, 5, 40}, {1000, 16, 300}, {50, 1, 0}};
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++)
        for (int t = 0; t < 3; t++) {
            gvqDataType_t dt = t == 0 ? gvqFloat32 : t == 1 ? gvqFloat64 : gvqFloat16;
            test_allgatherv_case(c[k].rows, c[k].dim, c[k].maxn, dt, 11 + k * 3 + (size_t)t, &out);
        }
    /* a large one crossing several pipeline chunks */
    test_allgatherv_case(20000, 64, 6000, gvqFloat32, 99, &out);
    if (mt.rank == 0) printf("allgatherv: algorithm %d (0 ring, 1 native)\n", out.algorithm);
    MT_OK(gvqSparseRowsFree(&out));
}

/* ---- parameter server ------------------------------------------------------------------------ */

typedef struct {
    int P, partitioning, rule, average, local_agg, init;
    size_t rows, dim;
    gvqDataType_t dt;
} ps_case_t;

/* The rule on one row, written out independently of gvq's. */
static void ref_rule(const ps_case_t *c, double lr, double *w, double *s, const double *g,
                     double scale) {
    for (size_t j = 0; j < c->dim; j++) {
        double gj = g[j] * scale;
        if (c->rule == gvqPsSgd) {
            w[j] -= lr * gj;
        } else if (c->rule == gvqPsMomentum) {
            s[j] = 0.9 * s[j] + gj;
            w[j] -= lr * s[j];
        } else {
            s[j] += gj * gj;
            w[j] -= lr * gj / (sqrt(s[j]) + 1e-7);
        }
    }
}

static double init_value(size_t r, size_t j) {
    return 0.25 * (double)((r * 7 + j * 3) % 9) - 1.0;
}

static int serve; /* the second pass: every server served at any time (ps_serve.c) */

static gvqPs_t make_ps(const ps_case_t *c, const void *initv) {
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    cfg.serve = serve;
    cfg.partitions = c->P;
    cfg.partitioning = c->partitioning;
    cfg.rule = c->rule;
    cfg.learningRate = 0.0625;
    cfg.average = c->average;
    cfg.localAggregation = c->local_agg;
    cfg.init = c->init;
    cfg.seed = 42;
    cfg.initValues = initv;
    gvqPs_t ps = NULL;
    MT_OK(gvqPsCreate(comm, c->rows, c->dim, c->dt, &cfg, &ps));
    return ps;
}

static double tol_of(gvqDataType_t dt) {
    return dt == gvqFloat64 ? 1e-12 : 2e-5;
}

/* Pull every row and compare with w (rows x dim). */
static void check_all(gvqPs_t ps, const ps_case_t *c, const double *w, const char *when) {
    size_t es = esize_of(c->dt);
    int64_t *all = malloc(c->rows * 8);
    void *got = malloc(c->rows * c->dim * es);
    for (size_t r = 0; r < c->rows; r++)
        all[r] = (int64_t)r;
    MT_OK(gvqPsPull(ps, all, got, c->rows));
    long bad = 0;
    for (size_t k = 0; k < c->rows * c->dim; k++) {
        double g = get(got, k, c->dt);
        if (!(fabs(g - w[k]) <= tol_of(c->dt) * (1.0 + fabs(w[k])))) {
            if (bad++ < 3)
                MT_REPORT("%s: P %d part %d rule %d avg %d agg %d: element %zu (row %zu) = %.9g, "
                          "dense reference %.9g",
                          when, c->P, c->partitioning, c->rule, c->average, c->local_agg, k,
                          k / c->dim, g, w[k]);
        }
    }
    mt.checks++;
    if (bad) mt.failures++;
    free(all);
    free(got);
}

static void test_ps_case(const ps_case_t *c, int steps) {
    size_t rows = c->rows, dim = c->dim, es = esize_of(c->dt), maxn = rows + 5;
    void *initv = NULL;
    double *w = malloc(rows * dim * sizeof *w), *s = calloc(rows * dim, sizeof *s);
    if (c->init == gvqPsInitValues) {
        initv = calloc(rows * dim, es);
        for (size_t r = 0; r < rows; r++)
            for (size_t j = 0; j < dim; j++)
                put(initv, r * dim + j, c->dt, init_value(r, j));
    }
    gvqPs_t ps = make_ps(c, initv);
    if (ps == NULL) return;
    free(initv); /* read during gvqPsCreate only */
    /* the starting point: known values, or whatever the seed gave (pulled, and checked to be
     * identical on every rank and within the scale) */
    int64_t *all = malloc(rows * 8);
    void *tmp = malloc(maxn * dim * es);
    for (size_t r = 0; r < rows; r++)
        all[r] = (int64_t)r;
    MT_OK(gvqPsPull(ps, all, tmp, rows));
    for (size_t k = 0; k < rows * dim; k++) {
        w[k] = get(tmp, k, c->dt);
        if (c->init == gvqPsInitValues)
            MT_CHECK(w[k] == init_value(k / dim, k % dim), "init value %zu = %g", k, w[k]);
        if (c->init == gvqPsInitZero) MT_CHECK(w[k] == 0.0, "zero init %zu = %g", k, w[k]);
        if (c->init == gvqPsInitUniform)
            MT_CHECK(fabs(w[k]) <= 0.05, "uniform init %zu = %g outside the scale", k, w[k]);
    }
    same_on_all(tmp, rows * dim * es, "initial values");
    if (c->rule == gvqPsAdagrad)
        for (size_t k = 0; k < rows * dim; k++)
            s[k] = 0.1;
    int64_t *idx = malloc(maxn * 8);
    double *val = malloc(maxn * dim * sizeof *val), *sum = malloc(rows * dim * sizeof *sum);
    int *touched = malloc(rows * sizeof *touched);
    void *g = malloc(maxn * dim * es);
    for (int step = 0; step < steps; step++) {
        size_t n = make_rows(1000 + (uint64_t)c->P, mt.rank, step, rows, dim, maxn, idx, val);
        for (size_t k = 0; k < n * dim; k++)
            put(g, k, c->dt, val[k]);
        dense_reference(idx, val, n, rows, dim, sum, touched);
        for (size_t r = 0; r < rows; r++)
            if (touched[r])
                ref_rule(c, 0.0625, w + r * dim, s + r * dim, sum + r * dim,
                         c->average ? 1.0 / mt.nranks : 1.0);
        MT_OK(gvqPsPush(ps, idx, g, n));
        MT_OK(gvqPsApply(ps));
        /* a pull of some rows, duplicates and all, in a scrambled order */
        size_t m = make_rows(2000 + (uint64_t)c->P, mt.rank, step, rows, 1, maxn, idx, val);
        MT_OK(gvqPsPull(ps, idx, tmp, m));
        for (size_t i = 0; i < m; i++)
            for (size_t j = 0; j < dim; j++) {
                double want = w[(size_t)idx[i] * dim + j], got = get(tmp, i * dim + j, c->dt);
                MT_CHECK(fabs(got - want) <= tol_of(c->dt) * (1.0 + fabs(want)),
                         "step %d: pulled row %lld col %zu = %.9g, reference %.9g", step,
                         (long long)idx[i], j, got, want);
            }
    }
    check_all(ps, c, w, "after the steps");
    gvqPsStats_t st;
    MT_OK(gvqPsGetStats(ps, &st));
    MT_CHECK(st.partitions == c->P && st.pendingRows == 0, "stats: P %d pending %llu",
             st.partitions, (unsigned long long)st.pendingRows);
    unsigned long long held = st.localRows, sum_held = 0;
    MPI_Allreduce(&held, &sum_held, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    MT_CHECK(sum_held == rows, "the ranks hold %llu rows of %zu", sum_held, rows);
    MT_OK(gvqPsDestroy(ps));
    free(w), free(s), free(all), free(tmp), free(idx), free(val), free(sum), free(touched), free(g);
}

static void test_ps(void) {
    int N = mt.nranks;
    const size_t rows = 23;
    int Ps[] = {1, 2, N, 3 * N + 1, (int)rows + 3};
    for (size_t a = 0; a < sizeof Ps / sizeof Ps[0]; a++)
        for (int part = 0; part < 2; part++)
            for (int rule = 0; rule < 3; rule++) {
                ps_case_t c = {Ps[a], part, rule,
                               0,     0,    (int)(a + (size_t)rule) % 3,
                               rows,  4,    rule == 1 ? gvqFloat64 : gvqFloat32};
                test_ps_case(&c, 4);
            }
    ps_case_t avg = {N + 1, gvqPsHashed, gvqPsMomentum, 1, 0, gvqPsInitValues, 57, 3, gvqFloat32};
    test_ps_case(&avg, 5);
    ps_case_t agg = {2 * N, gvqPsHashed, gvqPsAdagrad, 0, !serve, gvqPsInitUniform,
                     41,    5,           gvqFloat64};
    test_ps_case(&agg, 5);
    ps_case_t big = {3, gvqPsHashed, gvqPsSgd, 0, 0, gvqPsInitValues, 5000, 32, gvqFloat32};
    test_ps_case(&big, 3);
}

/* ---- save / load ------------------------------------------------------------------------------
 */

/* n rows of the step (seeded), pushed, not applied. */
static void push_step(gvqPs_t ps, const ps_case_t *c, int step) {
    size_t maxn = c->rows;
    int64_t *idx = malloc(maxn * 8);
    double *val = malloc(maxn * c->dim * sizeof *val);
    float *g = malloc(maxn * c->dim * 4);
    size_t n = make_rows(77, mt.rank, step, c->rows, c->dim, maxn, idx, val);
    for (size_t k = 0; k < n * c->dim; k++)
        g[k] = (float)val[k];
    MT_OK(gvqPsPush(ps, idx, g, n));
    free(idx), free(val), free(g);
}

static void pull_all(gvqPs_t ps, const ps_case_t *c, float *out) {
    int64_t *all = malloc(c->rows * 8);
    for (size_t r = 0; r < c->rows; r++)
        all[r] = (int64_t)r;
    MT_OK(gvqPsPull(ps, all, out, c->rows));
    free(all);
}

static void test_save_load(void) {
    ps_case_t c = {mt.nranks + 2, gvqPsHashed, gvqPsAdagrad, 0, 0, gvqPsInitUniform, 31, 3,
                   gvqFloat32};
    gvqPs_t ps = make_ps(&c, NULL);
    if (ps == NULL) return;
    for (int step = 0; step < 3; step++) {
        push_step(ps, &c, step);
        MT_OK(gvqPsApply(ps));
    }
    push_step(ps, &c, 3); /* pending sums travel with the state */
    size_t n = 0;
    MT_OK(gvqPsSave(ps, NULL, &n));
    char *saved = malloc(n), path[256];
    MT_OK(gvqPsSave(ps, saved, &n));
    size_t small = n - 1;
    MT_EXPECT_RES(gvqPsSave(ps, saved, &small), gvqInvalidArgument);
    MT_CHECK(small == n, "a too small buffer should report %zu, got %zu", n, small);
    snprintf(path, sizeof path, "/tmp/gvq_test_sparse_%d_%d.ps", (int)getpid(), mt.rank);
    MT_OK(gvqPsSaveFile(ps, path));
    /* go on: apply, two more steps; remember the result */
    MT_OK(gvqPsApply(ps));
    for (int step = 4; step < 6; step++) {
        push_step(ps, &c, step);
        MT_OK(gvqPsApply(ps));
    }
    float *first = malloc(c.rows * c.dim * 4), *again = malloc(c.rows * c.dim * 4);
    pull_all(ps, &c, first);
    /* a restarted job: a fresh server (other seed, so other values) loads the file */
    gvqPs_t ps2 = NULL;
    {
        gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
        cfg.partitions = c.P;
        cfg.rule = c.rule;
        cfg.learningRate = 0.0625;
        cfg.init = gvqPsInitUniform;
        cfg.seed = 4242;
        MT_OK(gvqPsCreate(comm, c.rows, c.dim, c.dt, &cfg, &ps2));
    }
    /* refusals first: none may change anything */
    size_t n_before = 0;
    MT_OK(gvqPsSave(ps2, NULL, &n_before));
    char *before = malloc(n_before), *after = malloc(n_before);
    MT_OK(gvqPsSave(ps2, before, &n_before));
    MT_EXPECT_RES(gvqPsLoad(ps2, saved, n - 1), gvqInvalidArgument); /* truncated */
    char *bad = malloc(n);
    memcpy(bad, saved, n);
    bad[0] ^= 1;
    MT_EXPECT_RES(gvqPsLoad(ps2, bad, n), gvqInvalidArgument); /* not a state */
    memcpy(bad, saved, n);
    if (n >= 16 * 8) { /* the pending count (header word 11) beyond the slots */
        uint64_t huge = 1ull << 40;
        memcpy(bad + 11 * 8, &huge, 8);
        MT_EXPECT_RES(gvqPsLoad(ps2, bad, n), gvqInvalidArgument);
    }
    MT_EXPECT_RES(gvqPsLoad(ps2, NULL, n), gvqInvalidArgument);
    MT_EXPECT_RES(gvqPsLoadFile(ps2, "/nonexistent/dir/x.ps"), gvqSystemError);
    size_t n_after = n_before;
    MT_OK(gvqPsSave(ps2, after, &n_after));
    MT_CHECK(n_after == n_before && memcmp(before, after, n_before) == 0,
             "a refused load changed the shard");
    {
        gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER; /* another P: refused */
        cfg.partitions = c.P + 1;
        cfg.rule = c.rule;
        gvqPs_t other = NULL;
        MT_OK(gvqPsCreate(comm, c.rows, c.dim, c.dt, &cfg, &other));
        MT_EXPECT_RES(gvqPsLoad(other, saved, n), gvqInvalidArgument);
        gvqPsDestroy(other);
    }
    MT_OK(gvqPsLoadFile(ps2, path));
    remove(path);
    MT_OK(gvqPsApply(ps2));
    for (int step = 4; step < 6; step++) {
        push_step(ps2, &c, step);
        MT_OK(gvqPsApply(ps2));
    }
    pull_all(ps2, &c, again);
    MT_CHECK(memcmp(first, again, c.rows * c.dim * 4) == 0,
             "the restored server did not continue exactly");
    /* and from the buffer into the first server: back to the saved point */
    MT_OK(gvqPsLoad(ps, saved, n));
    MT_OK(gvqPsApply(ps));
    for (int step = 4; step < 6; step++) {
        push_step(ps, &c, step);
        MT_OK(gvqPsApply(ps));
    }
    pull_all(ps, &c, again);
    MT_CHECK(memcmp(first, again, c.rows * c.dim * 4) == 0, "load from a buffer: not exact");
    gvqPsDestroy(ps);
    gvqPsDestroy(ps2);
    free(saved), free(first), free(again), free(before), free(after), free(bad);
}

/* ---- bad input ------------------------------------------------------------------------------- */

static void snapshot(gvqPs_t ps, char **buf, size_t *n) {
    *n = 0;
    gvqPsSave(ps, NULL, n);
    *buf = malloc(*n);
    gvqPsSave(ps, *buf, n);
}

static void expect_unchanged(gvqPs_t ps, const char *buf, size_t n, const char *what) {
    char *now;
    size_t m;
    snapshot(ps, &now, &m);
    MT_CHECK(m == n && memcmp(now, buf, n) == 0, "%s: the shard changed", what);
    free(now);
}

static void test_bad_input(void) {
    const size_t rows = 17, dim = 2;
    ps_case_t c = {mt.nranks + 1,    gvqPsHashed, gvqPsMomentum, 0,         0,
                   gvqPsInitUniform, rows,        dim,           gvqFloat32};
    gvqPs_t ps = make_ps(&c, NULL);
    if (ps == NULL) return;
    push_step(ps, &c, 0); /* some pending sums, which must survive the refusals */
    char *snap;
    size_t sn;
    snapshot(ps, &snap, &sn);
    int64_t idx[3] = {1, 5, 9};
    float g[6] = {1, 2, 3, 4, 5, 6}, out[6] = {-7, -7, -7, -7, -7, -7};
    /* every rank passes an index outside [0, rows) */
    idx[1] = (int64_t)rows;
    MT_EXPECT_RES(gvqPsPush(ps, idx, g, 3), gvqInvalidArgument);
    expect_unchanged(ps, snap, sn, "push with index == rows");
    idx[1] = -1;
    MT_EXPECT_RES(gvqPsPush(ps, idx, g, 3), gvqInvalidArgument);
    expect_unchanged(ps, snap, sn, "push with index -1");
    MT_EXPECT_RES(gvqPsPush(ps, NULL, g, 3), gvqInvalidArgument);
    MT_EXPECT_RES(gvqPsPush(ps, idx, NULL, 3), gvqInvalidArgument);
    expect_unchanged(ps, snap, sn, "push with NULL");
    MT_EXPECT_RES(gvqPsPull(ps, idx, out, 3), gvqInvalidArgument);
    MT_CHECK(out[0] == -7 && out[5] == -7, "a refused pull wrote its output");
    MT_EXPECT_RES(gvqPsPull(ps, idx, NULL, 3), gvqInvalidArgument);
    /* one rank only refuses: it returns gvqInvalidArgument, the others gvqRemoteError, and no
     * shard changes anywhere */
    idx[1] = 5;
    int64_t badidx[3] = {1, 999, 2};
    if (mt.nranks > 1) {
        MT_EXPECT_RES(gvqPsPush(ps, mt.rank == 0 ? badidx : idx, g, 3),
                      mt.rank == 0 ? gvqInvalidArgument : gvqRemoteError);
        expect_unchanged(ps, snap, sn, "push refused by rank 0 only");
        /* a pull refused on rank 0 only: the others still get their rows */
        MT_EXPECT_RES(gvqPsPull(ps, mt.rank == 0 ? badidx : idx, out, 3),
                      mt.rank == 0 ? gvqInvalidArgument : gvqSuccess);
    }
    /* NULL with n = 0 is fine: an empty contribution */
    MT_OK(gvqPsPush(ps, NULL, NULL, 0));
    expect_unchanged(ps, snap, sn, "empty push");
    /* the handle and the creation arguments */
    MT_EXPECT_RES(gvqPsPush(NULL, idx, g, 3), gvqInvalidArgument);
    MT_EXPECT_RES(gvqPsApply(NULL), gvqInvalidArgument);
    gvqPs_t other = NULL;
    MT_EXPECT_RES(gvqPsCreate(comm, rows, dim, gvqInt32, NULL, &other), gvqInvalidArgument);
    MT_EXPECT_RES(gvqPsCreate(comm, rows, 0, gvqFloat32, NULL, &other), gvqInvalidArgument);
    MT_EXPECT_RES(gvqPsCreate(comm, 0, dim, gvqFloat32, NULL, &other), gvqInvalidArgument);
    MT_EXPECT_RES(gvqPsCreate(NULL, rows, dim, gvqFloat32, NULL, &other), gvqInvalidArgument);
    {
        gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
        cfg.learningRate = 0.0;
        MT_EXPECT_RES(gvqPsCreate(comm, rows, dim, gvqFloat32, &cfg, &other), gvqInvalidArgument);
        cfg = (gvqPsConfig_t)GVQ_PS_CONFIG_INITIALIZER;
        cfg.partitions = 0;
        MT_EXPECT_RES(gvqPsCreate(comm, rows, dim, gvqFloat32, &cfg, &other), gvqInvalidArgument);
        cfg = (gvqPsConfig_t)GVQ_PS_CONFIG_INITIALIZER;
        cfg.init = gvqPsInitValues; /* initValues NULL */
        MT_EXPECT_RES(gvqPsCreate(comm, rows, dim, gvqFloat32, &cfg, &other), gvqInvalidArgument);
        cfg = (gvqPsConfig_t)GVQ_PS_CONFIG_INITIALIZER;
        cfg.magic = 0;
        MT_EXPECT_RES(gvqPsCreate(comm, rows, dim, gvqFloat32, &cfg, &other), gvqInvalidArgument);
    }
    if (mt.nranks > 1) { /* the ranks disagree on dim, or on the datatype: all refuse */
        MT_EXPECT_RES(
            gvqPsCreate(comm, rows, mt.rank == 0 ? dim + 1 : dim, gvqFloat32, NULL, &other),
            gvqInvalidArgument);
        MT_EXPECT_RES(
            gvqPsCreate(comm, rows, dim, mt.rank == 0 ? gvqFloat64 : gvqFloat32, NULL, &other),
            gvqInvalidArgument);
    }
    MT_CHECK(other == NULL, "a refused gvqPsCreate wrote its output");
    expect_unchanged(ps, snap, sn, "after all refusals");
    /* the server still works */
    MT_OK(gvqPsApply(ps));
    MT_OK(gvqPsPull(ps, idx, out, 3));
    gvqPsDestroy(ps);
    MT_EXPECT_RES(gvqPsDestroy(ps), gvqInvalidArgument);
    free(snap);

    /* sparse allgatherv */
    gvqSparseRows_t o = GVQ_SPARSE_ROWS_INITIALIZER;
    int64_t i3[3] = {1, 2, 3};
    float v3[3 * 2 * 2] = {0}; /* room for 3 rows of 2 doubles (the datatype mismatch case) */
    MT_OK(gvqSparseAllGatherv(i3, v3, 3, rows, dim, gvqFloat32, 0, &o, comm, NULL));
    size_t nrows_before = o.nrows;
    i3[2] = (int64_t)rows;
    MT_EXPECT_RES(gvqSparseAllGatherv(i3, v3, 3, rows, dim, gvqFloat32, 0, &o, comm, NULL),
                  gvqInvalidArgument);
    MT_CHECK(o.nrows == nrows_before, "a refused allgatherv changed its output");
    i3[2] = 3;
    MT_EXPECT_RES(gvqSparseAllGatherv(NULL, v3, 3, rows, dim, gvqFloat32, 0, &o, comm, NULL),
                  gvqInvalidArgument);
    if (mt.nranks > 1) {
        i3[0] = mt.rank == 0 ? -5 : 1;
        MT_EXPECT_RES(gvqSparseAllGatherv(i3, v3, 3, rows, dim, gvqFloat32, 0, &o, comm, NULL),
                      mt.rank == 0 ? gvqInvalidArgument : gvqRemoteError);
        i3[0] = 1;
        MT_EXPECT_RES(gvqSparseAllGatherv(i3, v3, 3, rows, mt.rank == 0 ? 1 : dim, gvqFloat32, 0,
                                          &o, comm, NULL),
                      gvqInvalidArgument);
        MT_EXPECT_RES(gvqSparseAllGatherv(i3, v3, 3, rows, dim,
                                          mt.rank == 0 ? gvqFloat64 : gvqFloat32, 0, &o, comm,
                                          NULL),
                      gvqInvalidArgument);
    }
    MT_EXPECT_RES(gvqSparseAllGatherv(i3, v3, 3, rows, 0, gvqFloat32, 0, &o, comm, NULL),
                  gvqInvalidArgument);
    MT_EXPECT_RES(gvqSparseAllGatherv(i3, v3, 3, rows, dim, gvqFloat32, 8, &o, comm, NULL),
                  gvqInvalidArgument);
    MT_EXPECT_RES(gvqSparseAllGatherv(i3, v3, 3, rows, dim, gvqFloat32, 0, NULL, comm, NULL),
                  gvqInvalidArgument);
    MT_CHECK(o.nrows == nrows_before, "a refused allgatherv changed its output");
    MT_OK(gvqSparseAllGatherv(i3, v3, 3, rows, dim, gvqFloat32, 0, &o, comm, NULL));
    MT_OK(gvqSparseRowsFree(&o));
}

/* ---- tuner ------------------------------------------------------------------------------------
 */

typedef struct {
    size_t rows, dim;
} tune_arg_t;

static gvqResult_t tune_step(gvqPs_t ps, int it, void *arg) {
    const tune_arg_t *a = arg;
    int64_t idx[8];
    float g[8 * 4];
    for (int i = 0; i < 8; i++) {
        idx[i] = (int64_t)(mix((uint64_t)it * 31 + (uint64_t)mt.rank * 7 + (uint64_t)i) % a->rows);
        for (size_t j = 0; j < a->dim; j++)
            g[i * a->dim + j] = 1.0f;
    }
    gvqResult_t r = gvqPsPush(ps, idx, g, 8);
    if (r == gvqSuccess) r = gvqPsApply(ps);
    if (r == gvqSuccess) r = gvqPsPull(ps, idx, g, 8);
    return r;
}

static void test_tuner(void) {
    tune_arg_t a = {200, 4};
    gvqPsTuneConfig_t tc = GVQ_PS_TUNE_CONFIG_INITIALIZER;
    tc.itersPerSample = 6;
    tc.skipIters = 2;
    tc.maxPartitions = 16;
    gvqPsTuneResult_t res;
    memset(&res, 0, sizeof res);
    MT_OK(gvqPsTunePartitions(comm, a.rows, a.dim, gvqFloat32, NULL, &tc, tune_step, &a, &res));
    MT_CHECK(res.nsamples >= 1 && res.bestPartitions >= 1 && res.bestPartitions <= 16,
             "tuner: %d samples, best %d", res.nsamples, res.bestPartitions);
    for (int i = 0; i < res.nsamples; i++)
        MT_CHECK(res.partitions[i] >= 1 && res.partitions[i] <= 16 && res.seconds[i] > 0,
                 "tuner sample %d: P %d, %g s", i, res.partitions[i], res.seconds[i]);
    same_on_all(&res, sizeof res, "tuner result");
    MT_EXPECT_RES(gvqPsTunePartitions(comm, a.rows, a.dim, gvqFloat32, NULL, &tc, NULL, &a, &res),
                  gvqInvalidArgument);
    tc.skipIters = 6;
    MT_EXPECT_RES(
        gvqPsTunePartitions(comm, a.rows, a.dim, gvqFloat32, NULL, &tc, tune_step, &a, &res),
        gvqInvalidArgument);
}

/* Rank 0 ends step 0 and then waits in MPI (no gvq call) until every other rank has pulled its
 * rows twice: its shards are answered by the handle's thread. A server that needed rank 0's
 * calls would leave the others' pulls to time out. */
static void test_served_busy(void) {
    enum { ROWS = 64, DIM = 8 };
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    cfg.partitioning = gvqPsContiguous;
    cfg.learningRate = 1.0;
    cfg.serve = 1;
    gvqPs_t ps = NULL;
    MT_OK(gvqPsCreate(comm, ROWS, DIM, gvqFloat32, &cfg, &ps));
    if (ps == NULL) return;
    int64_t idx[ROWS];
    float g[ROWS * DIM], w[ROWS * DIM];
    for (int r = 0; r < ROWS; r++)
        idx[r] = r;
    for (int k = 0; k < ROWS * DIM; k++)
        g[k] = 1.0f;
    MT_OK(gvqPsPush(ps, idx, g, ROWS));
    MT_OK(gvqPsApply(ps));
    int token = 0;
    if (mt.rank == 0) {
        for (int p = 1; p < mt.nranks; p++)
            MPI_Recv(&token, 1, MPI_INT, p, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
        for (int rep = 0; rep < 2; rep++) {
            MT_OK(gvqPsPull(ps, idx, w, ROWS));
            for (int k = 0; k < ROWS * DIM; k++)
                MT_CHECK(w[k] == -(float)mt.nranks, "busy owner: element %d = %g, want %d", k, w[k],
                         -mt.nranks);
        }
        MPI_Send(&token, 1, MPI_INT, 0, 77, MPI_COMM_WORLD);
    }
    gvqPsStats_t st;
    MT_OK(gvqPsGetStats(ps, &st));
    MT_CHECK(st.pulls == (mt.rank == 0 ? 0 : 2) && st.applies == 1,
             "stats: pulls %lld applies %lld", st.pulls, st.applies);
    MT_OK(gvqPsDestroy(ps));
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    gvqUniqueId id;
    if (mt.rank == 0) gvqGetUniqueId(&id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (gvqCommInitRank(&comm, mt.nranks, id, mt.rank) != gvqSuccess) {
        MT_FAIL("gvqCommInitRank failed: %s", gvqGetLastError(NULL));
        return mt_finish("test_sparse");
    }
    test_allgatherv();
    test_ps();
    test_save_load();
    test_bad_input();
    test_tuner();
    /* served at any time: the same cases against the same dense reference (staleness 0), and
     * an owner that makes no call while the others pull */
    serve = 1;
    test_ps();
    test_served_busy();
    gvqCommDestroy(comm);
    return mt_finish("test_sparse");
}
