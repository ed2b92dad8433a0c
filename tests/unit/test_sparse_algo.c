/*
 * test_sparse_algo.c -- the src/algorithms/ pieces of sparse variables against independent
 * references: merging duplicate rows (a dense sum), the partition map (every row placed exactly
 * once, the inverse, balance, P > rows), the update rules (a hand-written double reference), the
 * least- squares fit (exact thetas back from noiseless data), the tuner's search (a known cost
 * curve), and, over in-process ranks, the parameter server end to end against a dense reference
 * plus a malicious peer whose malformed messages must never change a shard.
 */
#include <math.h>

#include "gvq_sparse.h"
#include "gvq_test.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t next_u64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* ---- merge ---------------------------------------------------------------------------------- */

static void test_merge(void) {
    for (int trial = 0; trial < 50; trial++) {
        size_t n = next_u64() % 200, rows = 1 + next_u64() % 40, dim = 1 + next_u64() % 5;
        int64_t *idx = malloc((n + 1) * 8), *oi = malloc((n + 1) * 8);
        float *val = malloc((n + 1) * dim * 4), *ov = malloc((n + 1) * dim * 4);
        double *dense = calloc(rows * dim, sizeof *dense);
        int *hit = calloc(rows, sizeof *hit);
        for (size_t i = 0; i < n; i++) {
            idx[i] = (int64_t)(next_u64() % rows);
            hit[idx[i]] = 1;
            for (size_t j = 0; j < dim; j++) {
                val[i * dim + j] = (float)((int)(next_u64() % 17) - 8);
                dense[idx[i] * dim + j] += val[i * dim + j];
            }
        }
        size_t m = 12345;
        EXPECT_RES(gvq_sparse_merge(&gvq_host_device, gvqFloat32, dim, idx, val, n, oi, ov, &m),
                   gvqSuccess);
        size_t want = 0;
        for (size_t r = 0; r < rows; r++)
            want += hit[r];
        EXPECT(m == want, "merge: %zu unique rows, expected %zu", m, want);
        EXPECT(gvq_sparse_find_unsorted(oi, m) == m, "merge output not strictly ascending");
        for (size_t i = 0; i < m && i < want; i++)
            for (size_t j = 0; j < dim; j++)
                EXPECT(ov[i * dim + j] == (float)dense[oi[i] * dim + j],
                       "merge: row %lld col %zu = %g, expected %g", (long long)oi[i], j,
                       ov[i * dim + j], dense[oi[i] * dim + j]);
        free(idx), free(oi), free(val), free(ov), free(dense), free(hit);
    }
    /* empty input */
    size_t m = 7;
    EXPECT_RES(gvq_sparse_merge(&gvq_host_device, gvqFloat64, 3, NULL, NULL, 0, NULL, NULL, &m),
               gvqSuccess);
    EXPECT(m == 0, "merge of nothing gave %zu rows", m);
    /* fp16 adds in fp32 */
    int64_t i2[3] = {5, 5, 2}, o2[3];
    uint16_t v2[3] = {gvq_float_to_half(1.5f), gvq_float_to_half(2.0f), gvq_float_to_half(-1.0f)};
    uint16_t ov2[3];
    EXPECT_RES(gvq_sparse_merge(&gvq_host_device, gvqFloat16, 1, i2, v2, 3, o2, ov2, &m),
               gvqSuccess);
    EXPECT(m == 2 && o2[0] == 2 && o2[1] == 5 && gvq_half_to_float(ov2[1]) == 3.5f,
           "fp16 merge: m %zu, rows %lld %lld, sum %g", m, (long long)o2[0], (long long)o2[1],
           gvq_half_to_float(ov2[1]));
    /* index checks */
    int64_t bad[4] = {0, 3, -1, 9};
    EXPECT(gvq_sparse_find_out_of_range(bad, 4, 10) == 2, "negative index not found");
    EXPECT(gvq_sparse_find_out_of_range(bad, 2, 3) == 1, "index == rows not found");
    EXPECT(gvq_sparse_find_unsorted(bad, 4) == 2, "descent not found");
}

/* ---- partition map -------------------------------------------------------------------------- */

static void check_map(uint64_t rows, uint64_t P, int N, int mode) {
    gvq_part_t m;
    EXPECT_RES(gvq_part_init(&m, rows, P, N, mode), gvqSuccess);
    uint64_t total = 0;
    for (int r = 0; r < N; r++)
        total += m.rank_rows[r];
    EXPECT(total == rows, "rows %llu P %llu N %d mode %d: ranks hold %llu rows",
           (unsigned long long)rows, (unsigned long long)P, N, mode, (unsigned long long)total);
    uint8_t **seen = calloc((size_t)N, sizeof *seen);
    for (int r = 0; r < N; r++)
        seen[r] = calloc(m.rank_rows[r] + 1, 1);
    uint64_t *per_shard = calloc(P, sizeof *per_shard);
    for (uint64_t row = 0; row < rows; row++) {
        int rk = -1;
        uint64_t slot = 0, s = gvq_part_shard(&m, row);
        gvq_part_locate(&m, row, &rk, &slot);
        per_shard[s]++;
        EXPECT(rk == (int)(s % (uint64_t)N), "row %llu: shard %llu on rank %d",
               (unsigned long long)row, (unsigned long long)s, rk);
        if (rk < 0 || rk >= N || slot >= m.rank_rows[rk]) {
            EXPECT(0, "row %llu: slot %llu of rank %d out of range", (unsigned long long)row,
                   (unsigned long long)slot, rk);
            continue;
        }
        EXPECT(!seen[rk][slot], "row %llu: slot %llu of rank %d taken twice",
               (unsigned long long)row, (unsigned long long)slot, rk);
        seen[rk][slot] = 1;
        uint64_t back = gvq_part_row_of(&m, rk, slot);
        EXPECT(back == row, "row_of(locate(%llu)) = %llu", (unsigned long long)row,
               (unsigned long long)back);
        if (mode == GVQ_PART_CONTIGUOUS)
            EXPECT(row >= gvq_part_start(&m, s) && row < gvq_part_start(&m, s + 1),
                   "contiguous: row %llu outside shard %llu", (unsigned long long)row,
                   (unsigned long long)s);
    }
    /* shards are nearly equal: floor or ceil of rows / P */
    for (uint64_t s = 0; s < P; s++)
        EXPECT(per_shard[s] == rows / P || per_shard[s] == rows / P + 1,
               "shard %llu holds %llu rows of %llu / %llu", (unsigned long long)s,
               (unsigned long long)per_shard[s], (unsigned long long)rows, (unsigned long long)P);
    for (int r = 0; r < N; r++)
        free(seen[r]);
    free(seen);
    free(per_shard);
    gvq_part_fini(&m);
}

static void test_partition(void) {
    static const uint64_t rows[] = {1, 2, 7, 10, 64, 97, 1000};
    static const uint64_t Ps[] = {1, 2, 3, 5, 8, 13, 150};
    for (size_t a = 0; a < sizeof rows / sizeof rows[0]; a++)
        for (size_t b = 0; b < sizeof Ps / sizeof Ps[0]; b++)
            for (int N = 1; N <= 5; N += 2)
                for (int mode = 0; mode < 2; mode++)
                    check_map(rows[a], Ps[b], N, mode);
    /* hashed spreads neighbouring (hot) rows: rows 0..P-1 do not all land on one shard */
    gvq_part_t m;
    EXPECT_RES(gvq_part_init(&m, 100000, 8, 4, GVQ_PART_HASHED), gvqSuccess);
    int shards[8] = {0};
    for (uint64_t row = 0; row < 64; row++)
        shards[gvq_part_shard(&m, row)]++;
    int used = 0;
    for (int s = 0; s < 8; s++)
        used += shards[s] > 0;
    EXPECT(used >= 6, "hashed: the first 64 rows use %d of 8 shards", used);
    gvq_part_fini(&m);
    EXPECT_RES(gvq_part_init(&m, 0, 1, 1, 0), gvqInvalidArgument);
    EXPECT_RES(gvq_part_init(&m, 5, 0, 1, 0), gvqInvalidArgument);
    EXPECT_RES(gvq_part_init(&m, 5, 1, 1, 7), gvqInvalidArgument);
}

/* ---- update rules ------------------------------------------------------------------------- */

static void test_rules(void) {
    double w[3] = {1.0, -2.0, 0.5}, s[3] = {0.0, 0.1, 0.2}, g[3] = {0.5, -1.0, 2.0};
    for (int rule = 0; rule < 3; rule++) {
        gvq_rule_t r = {rule, 0.1, 0.9, 1e-7, 0.5};
        double wd[3], sd[3];
        float wf[3], sf[3], gf[3];
        for (int j = 0; j < 3; j++) {
            wd[j] = w[j], sd[j] = s[j];
            wf[j] = (float)w[j], sf[j] = (float)s[j], gf[j] = (float)g[j];
        }
        gvq_rule_apply(&r, gvqFloat64, 3, wd, sd, g);
        gvq_rule_apply(&r, gvqFloat32, 3, wf, sf, gf);
        for (int j = 0; j < 3; j++) {
            double gj = g[j] * 0.5, ws = w[j], ss = s[j];
            if (rule == GVQ_RULE_SGD) ws -= 0.1 * gj;
            if (rule == GVQ_RULE_MOMENTUM) ss = 0.9 * ss + gj, ws -= 0.1 * ss;
            if (rule == GVQ_RULE_ADAGRAD) ss += gj * gj, ws -= 0.1 * gj / (sqrt(ss) + 1e-7);
            EXPECT(fabs(wd[j] - ws) < 1e-12, "rule %d col %d: w %g, expected %g", rule, j, wd[j],
                   ws);
            EXPECT(fabs(wf[j] - ws) < 1e-5, "rule %d col %d (float): w %g, expected %g", rule, j,
                   wf[j], ws);
            if (rule != GVQ_RULE_SGD)
                EXPECT(fabs(sd[j] - ss) < 1e-12, "rule %d col %d: state %g, expected %g", rule, j,
                       sd[j], ss);
        }
    }
}

/* ---- least squares and the tuner's search -------------------------------------------------- */

static double cost(double th0, double th1, double th2, double P) {
    return th0 + th1 / P + th2 * P;
}

static void test_lsq(void) {
    double P[6] = {1, 2, 4, 8, 16, 32}, t[6], th[3];
    for (int i = 0; i < 6; i++)
        t[i] = cost(0.5, 3.0, 0.01, P[i]);
    EXPECT(gvq_lsq_fit3(P, t, 6, th) == 0, "fit on 6 exact samples failed");
    EXPECT(fabs(th[0] - 0.5) < 1e-9 && fabs(th[1] - 3.0) < 1e-9 && fabs(th[2] - 0.01) < 1e-9,
           "fit: %g %g %g, expected 0.5 3 0.01", th[0], th[1], th[2]);
    /* exactly 3 samples determine it; 2 distinct do not */
    EXPECT(gvq_lsq_fit3(P + 1, t + 1, 3, th) == 0 && fabs(th[1] - 3.0) < 1e-8,
           "fit on 3 samples: th1 %g", th[1]);
    double P2[4] = {4, 8, 4, 8}, t2[4] = {1, 2, 1, 2};
    EXPECT(gvq_lsq_fit3(P2, t2, 4, th) != 0, "fit on 2 distinct P must fail");
    /* noisy data: the least-squares solution satisfies the normal equations */
    double Pn[7] = {1, 2, 3, 5, 8, 13, 21}, tn[7];
    for (int i = 0; i < 7; i++)
        tn[i] = cost(1.0, 2.0, 0.05, Pn[i]) + ((i % 2) ? 0.01 : -0.01);
    EXPECT(gvq_lsq_fit3(Pn, tn, 7, th) == 0, "noisy fit failed");
    double grad[3] = {0, 0, 0};
    for (int i = 0; i < 7; i++) {
        double x[3] = {1, 1 / Pn[i], Pn[i]}, e = th[0] + th[1] * x[1] + th[2] * x[2] - tn[i];
        for (int a = 0; a < 3; a++)
            grad[a] += x[a] * e;
    }
    EXPECT(fabs(grad[0]) < 1e-9 && fabs(grad[1]) < 1e-9 && fabs(grad[2]) < 1e-8,
           "residual not orthogonal to the columns: %g %g %g", grad[0], grad[1], grad[2]);
}

static int run_search(int start, int maxp, double th0, double th1, double th2, int *fit_ok,
                      int *nsamples, int *sampled) {
    gvq_ptune_t s;
    gvq_ptune_init(&s, start, maxp, 1);
    for (int P; (P = gvq_ptune_next(&s)) != 0;)
        gvq_ptune_record(&s, cost(th0, th1, th2, P));
    double theta[3], pred;
    int best = gvq_ptune_choose(&s, fit_ok, theta, &pred);
    *nsamples = s.n;
    for (int i = 0; i < s.n; i++)
        sampled[i] = s.Ps[i];
    return best;
}

static void test_search(void) {
    int fit_ok = 0, n = 0, sp[GVQ_PTUNE_MAX];
    /* optimum sqrt(th1/th2) = sqrt(100/0.25) = 20: from 4, samples 4 8 16 32 (rises), then 2;
     * refinement: the fit's argmin 20, then midway between 20 and its neighbour above (26), then
     * between 20 and 26 (23) */
    int best = run_search(4, 1000, 1.0, 100.0, 0.25, &fit_ok, &n, sp);
    EXPECT(fit_ok && best == 20, "search from 4: best %d (fit %d), expected 20", best, fit_ok);
    EXPECT(n == 8 && sp[0] == 4 && sp[1] == 8 && sp[2] == 16 && sp[3] == 32 && sp[4] == 2 &&
               sp[5] == 20 && sp[6] == 26 && sp[7] == 23,
           "search from 4 sampled %d: %d %d %d %d %d %d %d %d", n, sp[0], sp[1], sp[2], sp[3],
           sp[4], sp[5], sp[6], sp[7]);
    /* optimum below the start: 8 then 16 rises, then 4, 2, 1 */
    best = run_search(8, 1000, 1.0, 4.0, 1.0, &fit_ok, &n, sp);
    EXPECT(fit_ok && best == 2, "search from 8: best %d, expected 2", best);
    EXPECT(n >= 5 && sp[1] == 16 && sp[2] == 4 && sp[3] == 2 && sp[4] == 1,
           "search from 8 sampled %d: %d %d %d %d %d", n, sp[0], sp[1], sp[2], sp[3], sp[4]);
    /* capped by maxp: never samples beyond it */
    best = run_search(2, 8, 0.0, 100.0, 0.0001, &fit_ok, &n, sp);
    for (int i = 0; i < n; i++)
        EXPECT(sp[i] <= 8, "sampled %d beyond maxp 8", sp[i]);
    EXPECT(best == 8, "capped search chose %d, expected 8", best);
    /* one sample only (start = maxp = 1): no fit, the sample */
    best = run_search(1, 1, 1.0, 1.0, 1.0, &fit_ok, &n, sp);
    EXPECT(best == 1 && !fit_ok && n == 1, "single sample: best %d fit %d n %d", best, fit_ok, n);
    /* two samples: no fit, the faster one */
    gvq_ptune_t s;
    gvq_ptune_init(&s, 1, 2, 1);
    gvq_ptune_record(&s, 2.0);
    EXPECT(gvq_ptune_next(&s) == 2, "second sample should be 2");
    gvq_ptune_record(&s, 1.0);
    EXPECT(gvq_ptune_next(&s) == 0, "the search should end at maxp with nothing below 1");
    double th[3], pred;
    EXPECT(gvq_ptune_choose(&s, &fit_ok, th, &pred) == 2 && !fit_ok, "two samples: choice");
    /* a granule: the optimum 20 is not a multiple of 8; the fit's argmin among the multiples of
     * 8 is 24 (f(24) = 11.17 < f(16) = 11.25), which the refinement samples and keeps */
    gvq_ptune_init(&s, 4, 1000, 8);
    for (int P; (P = gvq_ptune_next(&s)) != 0;) {
        EXPECT(s.n < 5 || P % 8 == 0, "granule 8: refinement sampled %d", P);
        gvq_ptune_record(&s, cost(1.0, 100.0, 0.25, P));
    }
    int g8 = gvq_ptune_choose(&s, &fit_ok, th, &pred);
    EXPECT(fit_ok && g8 == 24, "granule 8: chose %d, expected 24", g8);
    EXPECT(fabs(pred - cost(1.0, 100.0, 0.25, 24)) < 1e-6, "granule 8: predicted %g", pred);
    /* a measured curve with a bump the model cannot see (the shape of a run on the emulated
     * cluster): flat from 4 up, 12 the fastest; the search samples 4 8 16 2, the fit points at 8
     * (sampled), so the refinement tries midway between 8 and 16 and finds 12 */
    static const double bumpy[17] = {0,    78.6, 48.4, 35.4, 29.6, 32.3, 32.5, 30.5, 28.7,
                                     32.2, 31.3, 27.8, 27.0, 27.8, 28.4, 28.3, 29.2};
    gvq_ptune_init(&s, 4, 16, 4);
    for (int P; (P = gvq_ptune_next(&s)) != 0;)
        gvq_ptune_record(&s, bumpy[P]);
    int gb = gvq_ptune_choose(&s, &fit_ok, th, &pred);
    EXPECT(gb == 12, "bumpy curve: chose %d after %d samples, expected 12", gb, s.n);
    EXPECT(s.n <= 4 + GVQ_PTUNE_REFINE, "bumpy curve: %d samples", s.n);
}

/* ---- parameter server over in-process ranks ------------------------------------------------- */

typedef struct {
    size_t rows, dim;
    int P, rule, steps;
} ps_case_t;

/* A pure function of (rank, step, k): the rows a rank pushes (duplicates, sometimes none). */
static size_t case_rows(const ps_case_t *c, int rank, int step, int64_t *idx, float *g) {
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(rank * 131 + step * 7 + 1);
    size_t n = (rank + step) % 4 == 3 ? 0 : (size_t)((x >> 7) % 12);
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        idx[i] = (int64_t)(x % c->rows);
        for (size_t j = 0; j < c->dim; j++)
            g[i * c->dim + j] = (float)((int)((x >> (j + 3)) % 9) - 4);
    }
    return n;
}

static void ps_rank(gvqComm_t comm, int rank, int nranks, void *arg) {
    const ps_case_t *c = arg;
    size_t rows = c->rows, dim = c->dim;
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    cfg.partitions = c->P;
    cfg.rule = c->rule;
    cfg.learningRate = 0.125;
    cfg.init = gvqPsInitUniform;
    cfg.seed = 7;
    gvqPs_t ps = NULL;
    EXPECT_RES(gvqPsCreate(comm, rows, dim, gvqFloat32, &cfg, &ps), gvqSuccess);
    if (ps == NULL) return;
    /* the dense reference: every rank computes every rank's rows */
    float *w = malloc(rows * dim * 4), *st = calloc(rows * dim, 4), *gsum = malloc(rows * dim * 4);
    int *touched = malloc(rows * sizeof *touched);
    int64_t all[rows];
    for (size_t r = 0; r < rows; r++)
        all[r] = (int64_t)r;
    EXPECT_RES(gvqPsPull(ps, all, w, rows), gvqSuccess); /* the uniform init, whatever it is */
    if (c->rule == GVQ_RULE_ADAGRAD)
        for (size_t k = 0; k < rows * dim; k++)
            st[k] = 0.1f;
    int64_t idx[16];
    float g[16 * 8];
    for (int step = 0; step < c->steps; step++) {
        memset(gsum, 0, rows * dim * 4);
        memset(touched, 0, rows * sizeof *touched);
        for (int r = 0; r < nranks; r++) {
            size_t n = case_rows(c, r, step, idx, g);
            for (size_t i = 0; i < n; i++) {
                touched[idx[i]] = 1;
                for (size_t j = 0; j < dim; j++)
                    gsum[idx[i] * dim + j] += g[i * dim + j];
            }
        }
        gvq_rule_t rule = {c->rule, 0.125, 0.9, 1e-7, 1.0};
        for (size_t r = 0; r < rows; r++)
            if (touched[r])
                gvq_rule_apply(&rule, gvqFloat32, dim, w + r * dim, st + r * dim, gsum + r * dim);
        size_t n = case_rows(c, rank, step, idx, g);
        EXPECT_RES(gvqPsPush(ps, idx, g, n), gvqSuccess);
        EXPECT_RES(gvqPsApply(ps), gvqSuccess);
    }
    float *got = malloc(rows * dim * 4);
    EXPECT_RES(gvqPsPull(ps, all, got, rows), gvqSuccess);
    for (size_t k = 0; k < rows * dim; k++)
        EXPECT(fabsf(got[k] - w[k]) <= 1e-5f * (1.0f + fabsf(w[k])),
               "rank %d P %d rule %d: element %zu = %g, dense reference %g", rank, c->P, c->rule, k,
               got[k], w[k]);
    gvqPsDestroy(ps);
    free(w), free(st), free(gsum), free(touched), free(got);
}

static void test_ps_inproc(void) {
    static const ps_case_t cases[] = {
        {10, 3, 1, 0, 5}, {10, 3, 4, 1, 5}, {10, 2, 13, 2, 6}, {37, 8, 3, 2, 4}, {5, 1, 2, 1, 3}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int N = 1; N <= 4; N++)
            gvq_test_run(N, NULL, ps_rank, (void *)&cases[k]);
}

/* ---- a malicious peer ------------------------------------------------------------------------ */

typedef struct {
    int mode; /* 0 too many rows announced, 1 index out of range, 2 row not held by rank 0,
                 3 block shorter than its header, 4 wrong magic, 5 a malformed pull request */
} evil_t;

static void evil_rank(gvqComm_t comm, int rank, int nranks, void *arg) {
    const evil_t *e = arg;
    (void)nranks;
    const size_t rows = 20, dim = 2;
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    cfg.partitions = 2;
    cfg.partitioning = gvqPsContiguous; /* rank 0 holds rows 0..9, rank 1 rows 10..19 */
    cfg.init = gvqPsInitUniform;
    gvqPs_t ps = NULL;
    EXPECT_RES(gvqPsCreate(comm, rows, dim, gvqFloat32, &cfg, &ps), gvqSuccess);
    if (ps == NULL) return;
    if (rank == 0) {
        size_t n0 = 0, n1 = 0;
        gvqPsSave(ps, NULL, &n0);
        char *before = malloc(n0), *after = malloc(n0 + 64);
        gvqPsSave(ps, before, &n0);
        int64_t idx[2] = {3, 15};
        float vals[4] = {1, 2, 3, 4};
        if (e->mode == 5) {
            /* rank 0 serves rank 1's malformed request; its own pull of row 3 is local */
            EXPECT_RES(gvqPsPull(ps, idx, vals, 1), gvqRemoteError);
        } else {
            EXPECT_RES(gvqPsPush(ps, idx, vals, 2), gvqRemoteError);
        }
        n1 = n0 + 64;
        gvqPsSave(ps, after, &n1);
        EXPECT(n1 == n0 && memcmp(before, after, n0) == 0,
               "mode %d: rank 0's shard changed after a malformed message", e->mode);
        gvqPsStats_t st;
        gvqPsGetStats(ps, &st);
        EXPECT(st.pendingRows == 0, "mode %d: %llu pending rows", e->mode,
               (unsigned long long)st.pendingRows);
        free(before), free(after);
    } else {
        /* impersonate a push (or pull) to rank 0, below the public API */
        gvq_transport_t *t = comm->xport;
        int kind = e->mode == 5 ? GVQ_SX_PULL : GVQ_SX_PUSH;
        int64_t hdr[3] = {GVQ_SX_MAGIC ^ kind, 0, 1};
        int64_t blk[1 + 2] = {25, 0, 0}; /* one row: index, then dim floats (as 8 bytes) */
        size_t blen = e->mode == 5 ? 8 : 8 + dim * 4;
        if (e->mode == 0) hdr[2] = 11; /* rank 0 holds 10 rows */
        if (e->mode == 2) blk[0] = 12; /* held by rank 1 */
        if (e->mode == 3) hdr[2] = 2;  /* the block carries one row only */
        if (e->mode == 4) hdr[0] = 12345;
        if (e->mode == 5) blk[0] = -4;
        gvq_req_t req[2];
        memset(req, 0, sizeof req);
        t->ops->isend(t, 0, GVQ_TAG_COLL, hdr, sizeof hdr, &req[0]);
        if (e->mode != 0 && e->mode != 4) t->ops->isend(t, 0, GVQ_TAG_COLL, blk, blen, &req[1]);
        gvq_xport_waitall(t, req, 2, "evil");
        if (e->mode == 5) { /* take rank 0's answer {status, row} and check it refused */
            int64_t hdr0[3];
            char reply[8 + 8];
            gvq_req_t rr;
            memset(&rr, 0, sizeof rr);
            t->ops->irecv(t, 0, GVQ_TAG_COLL, hdr0, sizeof hdr0, &rr);
            gvq_xport_wait(t, &rr, "evil");
            t->ops->irecv(t, 0, GVQ_TAG_COLL, reply, sizeof reply, &rr);
            gvq_xport_wait(t, &rr, "evil");
            int64_t st;
            memcpy(&st, reply, 8);
            EXPECT(st == 1, "a malformed pull request was answered with status %lld",
                   (long long)st);
        }
    }
    gvqPsDestroy(ps);
}

static void test_malicious(void) {
    for (int mode = 0; mode <= 5; mode++) {
        evil_t e = {mode};
        gvq_test_run(2, NULL, evil_rank, &e);
    }
}

int main(void) {
    test_merge();
    test_partition();
    test_rules();
    test_lsq();
    test_search();
    test_ps_inproc();
    test_malicious();
    return gvq_test_finish("test_sparse_algo");
}
