/*
 * test_compressed_powersgd.c -- codec gvqCodecPowersgd through gvqAllReduceCompressed, and bounded
 * error feedback for every codec, on real MPI ranks:
 *
 *   1 reference   every rank recomputes each call in double from all ranks' regenerable inputs,
 *                 the warm-start Q and the residuals (read from gvqCompressorSave's documented
 *                 layout: the residual, then Q, at the end; residuals gathered with MPI): sum of
 *                 M_k Q, Gram-Schmidt, Q' = sum M_k^T P_hat, P_hat Q'^T; the kept Q = Q'/N and the
 *                 clipped residual likewise; outputs bitwise identical on every rank; ratio and
 *                 wire bytes; a flat tensor (padded) and a conv one (efBound 0.5, clipping)
 *   2 low rank    no error feedback: a rank-2 sum comes back exactly; a rank-3 one converges to
 *                 the best rank-2 error over warm-started calls; gvqAvg = gvqSum / N
 *   3 EF helps    PowerSGD, QSGD, GradiVeQ fitted and tracked: ||e|| <= efBound ||g|| after
 *                 every call, and the error of the summed results over many calls is smaller
 *                 with error feedback
 *   4 save/load   a compressor restored from a saved state continues bitwise
 *   5 NaN         a NaN or Inf on one rank: the plain sum on every rank, the state unchanged
 *                 (error feedback: later calls finite)
 */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>

#include "compressor_ref.h"

/* ---- helpers ----------------------------------------------------------------------------------
 */

/* The matrix shape PowerSGD uses (include/gvq.h): K x count/K for a conv shape, else
 * ceil(count/R) x R with R = ceil(sqrt(count)). */
static void shape_of(size_t count, int K, size_t *n, size_t *m) {
    if (K > 1) {
        *n = (size_t)K;
        *m = count / (size_t)K;
        return;
    }
    size_t R = 1;
    while (R * R < count)
        R++;
    *m = R;
    *n = (count + R - 1) / R;
}

static gvqCompressorConfig_t psgd_cfg(int rank, int K, int D, int H, int W) {
    gvqCompressorConfig_t cfg = cref_config(gvqCodecPowersgd, 11, K, D, H, W);
    cfg.powerRank = rank;
    return cfg;
}

/* Rank j's gradient at call t: three smooth rank-1 components with weights varying by rank and
 * call, plus noise (matrix coordinates: element i = row * m + col). */
static float grad_val(int j, int t, size_t i, size_t m) {
    size_t row = i / m, col = i % m;
    double v = 0;
    const double c[3] = {4, 2, 1};
    for (int q = 0; q < 3; q++)
        v += c[q] * (1 + 0.3 * cref_rand(7, (uint64_t)j, (uint64_t)t, (uint64_t)q)) *
             sin(0.37 * (double)(q + 1) * (double)(row + 1)) *
             cos(0.21 * (double)(q + 2) * (double)(col + 1));
    return (float)(v + 0.05 * cref_rand(3, (uint64_t)j, (uint64_t)t, i));
}

/* ---- part 1: against a double-precision reference ---------------------------------------------
 */

static void part_reference(const char *title, size_t count, int K, int D, int H, int W, int r,
                           float ef_bound, int calls) {
    if (mt.rank == 0) printf("-- %s\n", title);
    gvqComm_t comm = mt_new_comm();
    int N = mt.nranks;
    size_t n, m;
    shape_of(count, K, &n, &m);
    gvqCompressorConfig_t cfg = psgd_cfg(r, K, D, H, W);
    cfg.efBound = ef_bound;
    gvqCompressor_t c = NULL;
    MT_OK(gvqCompressorCreate(comm, count, &cfg, &c));
    size_t nm = n * m;
    float *g = malloc(4 * count), *y = malloc(4 * count), *Q = malloc(4 * m * r);
    float *e = malloc(4 * count), *eall = malloc(4 * count * (size_t)N), *Qnew = malloc(4 * m * r);
    double *M = calloc(nm * (size_t)N, sizeof(double)), *P = calloc(n * (size_t)r, sizeof(double));
    double *Qs = calloc(m * (size_t)r, sizeof(double)), *out = malloc(sizeof(double) * nm);
    unsigned long long wire_prev = 0;
    for (int t = 0; t < calls; t++) {
        cref_saved_tail(c, count, m * (size_t)r, e, Q);
        MPI_Allgather(e, (int)count, MPI_FLOAT, eall, (int)count, MPI_FLOAT, MPI_COMM_WORLD);
        for (size_t i = 0; i < count; i++)
            g[i] = grad_val(mt.rank, t, i, m);
        MT_OK(gvqAllReduceCompressed(g, y, count, gvqFloat32, gvqSum, c, comm, NULL));
        MT_CHECK(mt_identical(y, 4 * count), "%s call %d: outputs differ between ranks", title, t);
        /* the reference: M_j = g_j + e_j, P = sum M_j Q, P_hat, Q' = sum M_j^T P_hat */
        memset(M, 0, sizeof(double) * nm * (size_t)N);
        for (int j = 0; j < N; j++)
            for (size_t i = 0; i < count; i++)
                M[(size_t)j * nm + i] =
                    (double)(grad_val(j, t, i, m) + eall[(size_t)j * count + i]);
        memset(P, 0, sizeof(double) * n * (size_t)r);
        memset(Qs, 0, sizeof(double) * m * (size_t)r);
        for (int j = 0; j < N; j++)
            for (size_t a = 0; a < n; a++)
                for (int k = 0; k < r; k++)
                    for (size_t b = 0; b < m; b++)
                        P[(size_t)k * n + a] +=
                            M[(size_t)j * nm + a * m + b] * Q[(size_t)k * m + b];
        cref_orth(P, n, (size_t)r);
        for (int j = 0; j < N; j++)
            for (size_t b = 0; b < m; b++)
                for (int k = 0; k < r; k++)
                    for (size_t a = 0; a < n; a++)
                        Qs[(size_t)k * m + b] +=
                            M[(size_t)j * nm + a * m + b] * P[(size_t)k * n + a];
        double worst = 0, scale = 0;
        for (size_t i = 0; i < nm; i++) {
            double s = 0;
            for (int k = 0; k < r; k++)
                s += P[(size_t)k * n + i / m] * Qs[(size_t)k * m + i % m];
            out[i] = s;
            scale = fmax(scale, fabs(s));
            if (i < count) worst = fmax(worst, fabs((double)y[i] - s));
        }
        MT_CHECK(worst <= 2e-4 * scale, "%s call %d: output off the reference by %g (scale %g)",
                 title, t, worst, scale);
        /* the kept Q and this rank's residual: M_me - P_hat Q_me^T with Q_me = M_me^T P_hat
         * (this rank's own loss), clipped */
        float *enew = e;
        cref_saved_tail(c, count, m * (size_t)r, enew, Qnew);
        double qw = 0, qs = 0;
        for (size_t i = 0; i < m * (size_t)r; i++) {
            qw = fmax(qw, fabs((double)Qnew[i] - Qs[i] / N));
            qs = fmax(qs, fabs(Qs[i] / N));
        }
        MT_CHECK(qw <= 2e-4 * qs, "%s call %d: kept Q off Q'/N by %g (scale %g)", title, t, qw, qs);
        double er2 = 0, gn = cref_norm(g, count);
        const double *Mme = M + (size_t)mt.rank * nm;
        for (size_t i = 0; i < count; i++) {
            double s = 0;
            for (int k = 0; k < r; k++) {
                double qme = 0; /* Q_me[i % m][k] = sum_a M_me[a][i % m] P_hat[a][k] */
                for (size_t a = 0; a < n; a++)
                    qme += Mme[a * m + i % m] * P[(size_t)k * n + a];
                s += P[(size_t)k * n + i / m] * qme;
            }
            out[i] = M[(size_t)mt.rank * nm + i] - s;
            er2 += out[i] * out[i];
        }
        double f = sqrt(er2) > ef_bound * gn ? ef_bound * gn / sqrt(er2) : 1.0, ew = 0;
        for (size_t i = 0; i < count; i++)
            ew = fmax(ew, fabs((double)enew[i] - f * out[i]));
        MT_CHECK(ew <= 1e-3 * scale, "%s call %d: residual off the reference by %g", title, t, ew);
        MT_CHECK(cref_norm(enew, count) <= ef_bound * gn * (1 + 1e-5),
                 "%s call %d: ||e|| = %g > efBound ||g|| = %g", title, t, cref_norm(enew, count),
                 ef_bound * gn);
        gvqCompressorStats_t st;
        MT_OK(gvqCompressorGetStats(c, &st));
        double ratio = (double)nm / (double)((n + m) * (size_t)r);
        MT_CHECK(st.ratio == ratio && st.phase == gvqPhasePlain && st.iteration == t + 1,
                 "%s call %d: stats ratio %g (want %g) phase %d iteration %lld", title, t, st.ratio,
                 ratio, st.phase, st.iteration);
        unsigned long long w = st.wireBytes - wire_prev, wsum = 0;
        wire_prev = st.wireBytes;
        MPI_Allreduce(&w, &wsum, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        unsigned long long want = 2ull * (unsigned long long)(N - 1) * (n + m) * (size_t)r * 4;
        MT_CHECK(wsum == want, "%s call %d: wire bytes over the ranks %llu, want %llu", title, t,
                 wsum, want);
    }
    MT_OK(gvqCompressorDestroy(c));
    MT_OK(gvqCommDestroy(comm));
    free(g), free(y), free(Q), free(e), free(eall), free(Qnew), free(M), free(P), free(Qs),
        free(out);
}

/* ---- part 2: a low-rank sum, no error feedback ------------------------------------------------
 */

/* S (K x m row-major) = sum_q sigma_q u_q v_q^T, u and v orthonormal (Gram-Schmidt here). */
static void make_lowrank(double *S, size_t K, size_t m, const double *sigma, int nq) {
    double u[4][64], v[4][64];
    for (int q = 0; q < nq; q++) {
        for (size_t i = 0; i < K; i++)
            u[q][i] = cref_rand(1, (uint64_t)q, i, 0);
        for (size_t i = 0; i < m; i++)
            v[q][i] = cref_rand(2, (uint64_t)q, i, 0);
        for (int p = 0; p < q; p++) {
            double hu = 0, hv = 0;
            for (size_t i = 0; i < K; i++)
                hu += u[p][i] * u[q][i];
            for (size_t i = 0; i < m; i++)
                hv += v[p][i] * v[q][i];
            for (size_t i = 0; i < K; i++)
                u[q][i] -= hu * u[p][i];
            for (size_t i = 0; i < m; i++)
                v[q][i] -= hv * v[p][i];
        }
        double nu = 0, nv = 0;
        for (size_t i = 0; i < K; i++)
            nu += u[q][i] * u[q][i];
        for (size_t i = 0; i < m; i++)
            nv += v[q][i] * v[q][i];
        for (size_t i = 0; i < K; i++)
            u[q][i] /= sqrt(nu);
        for (size_t i = 0; i < m; i++)
            v[q][i] /= sqrt(nv);
    }
    for (size_t a = 0; a < K; a++)
        for (size_t b = 0; b < m; b++) {
            double s = 0;
            for (int q = 0; q < nq; q++)
                s += sigma[q] * u[q][a] * v[q][b];
            S[a * m + b] = s;
        }
}

static void part_lowrank(void) {
    if (mt.rank == 0) printf("-- 2 low rank: exact for rank 2, converging for rank 3\n");
    gvqComm_t comm = mt_new_comm();
    const size_t K = 20, m = 30, count = K * m;
    int N = mt.nranks;
    double w = (double)(mt.rank + 1) / (N * (N + 1) / 2.0);
    double *S = malloc(sizeof(double) * count);
    float *g = malloc(4 * count), *y = malloc(4 * count), *ya = malloc(4 * count);
    for (int pass = 0; pass < 2; pass++) {
        const double sigma[3] = {8, 4, pass == 0 ? 0 : 0.2};
        make_lowrank(S, K, m, sigma, 3);
        double snorm = sqrt(64 + 16 + sigma[2] * sigma[2]), best = sigma[2] / snorm;
        gvqCompressorConfig_t cfg = psgd_cfg(2, (int)K, 1, 5, 6);
        cfg.errorFeedback = 0;
        gvqCompressor_t cs = NULL, ca = NULL;
        MT_OK(gvqCompressorCreate(comm, count, &cfg, &cs));
        MT_OK(gvqCompressorCreate(comm, count, &cfg, &ca));
        for (size_t i = 0; i < count; i++)
            g[i] = (float)(S[i] * w);
        double prev = INFINITY;
        for (int t = 0; t < 10; t++) {
            MT_OK(gvqAllReduceCompressed(g, y, count, gvqFloat32, gvqSum, cs, comm, NULL));
            MT_OK(gvqAllReduceCompressed(g, ya, count, gvqFloat32, gvqAvg, ca, comm, NULL));
            MT_CHECK(mt_identical(y, 4 * count), "low rank call %d: outputs differ between ranks",
                     t);
            int avg_ok = 1;
            for (size_t i = 0; i < count; i++)
                avg_ok &= ya[i] == y[i] / (float)N;
            MT_CHECK(avg_ok, "low rank call %d: gvqAvg is not gvqSum / N", t);
            double e2 = 0;
            for (size_t i = 0; i < count; i++)
                e2 += ((double)y[i] - S[i]) * ((double)y[i] - S[i]);
            double err = sqrt(e2) / snorm;
            if (pass == 0)
                MT_CHECK(err < 2e-6, "rank-2 sum call %d: relative error %g, want exact", t, err);
            else
                MT_CHECK(err <= prev * 1.001 + 1e-6,
                         "rank-3 sum call %d: error %g grew from %g (warm start)", t, err, prev);
            if (pass == 1 && t == 9)
                MT_CHECK(err <= best * 1.02 + 1e-6,
                         "rank-3 sum after 10 calls: error %g, best rank-2 error %g", err, best);
            prev = err;
        }
        MT_OK(gvqCompressorDestroy(cs));
        MT_OK(gvqCompressorDestroy(ca));
    }
    MT_OK(gvqCommDestroy(comm));
    free(S), free(g), free(y), free(ya);
}

/* ---- part 3: error feedback helps, stays bounded ----------------------------------------------
 */

/* Relative error of the sum of the results over `calls` calls, with or without EF; checks
 * ||e|| <= efBound ||g|| after every call (the residual at the end of the saved state). */
static double accumulated_error(gvqComm_t comm, const gvqCompressorConfig_t *base, size_t count,
                                size_t qlen, int ef, int calls, const char *what) {
    gvqCompressorConfig_t cfg = *base;
    cfg.errorFeedback = ef;
    gvqCompressor_t c = NULL;
    MT_OK(gvqCompressorCreate(comm, count, &cfg, &c));
    float *g = malloc(4 * count), *y = malloc(4 * count), *e = malloc(4 * count);
    double *acc = calloc(count, sizeof(double)), *ref = calloc(count, sizeof(double));
    float bound = base->efBound == -1.0f ? 4.0f : base->efBound;
    for (int t = 0; t < calls; t++) {
        for (size_t i = 0; i < count; i++)
            g[i] = grad_val(mt.rank, t, i, 40);
        MT_OK(gvqAllReduceCompressed(g, y, count, gvqFloat32, gvqSum, c, comm, NULL));
        for (size_t i = 0; i < count; i++) {
            acc[i] += y[i];
            for (int j = 0; j < mt.nranks; j++)
                ref[i] += grad_val(j, t, i, 40);
        }
        if (ef) {
            cref_saved_tail(c, count, qlen, e, NULL);
            MT_CHECK(cref_norm(e, count) <= bound * cref_norm(g, count) * (1 + 1e-5),
                     "%s call %d: ||e|| = %g > efBound ||g|| = %g", what, t, cref_norm(e, count),
                     bound * cref_norm(g, count));
        }
    }
    double d2 = 0, r2 = 0;
    for (size_t i = 0; i < count; i++) {
        d2 += (acc[i] - ref[i]) * (acc[i] - ref[i]);
        r2 += ref[i] * ref[i];
    }
    MT_OK(gvqCompressorDestroy(c));
    free(g), free(y), free(e), free(acc), free(ref);
    return sqrt(d2 / r2);
}

static void ef_compare(gvqComm_t comm, const char *what, const gvqCompressorConfig_t *cfg,
                       size_t count, size_t qlen, int calls, double factor) {
    double off = accumulated_error(comm, cfg, count, qlen, 0, calls, what);
    double on = accumulated_error(comm, cfg, count, qlen, 1, calls, what);
    if (mt.rank == 0)
        printf("   %-9s (efBound %g) error of the summed results over %d calls: EF off %.3g, "
               "on %.3g\n",
               what, cfg->efBound == -1.0f ? 1.0 : (double)cfg->efBound, calls, off, on);
    MT_CHECK(on < factor * off, "%s: error feedback does not help: %g with, %g without", what, on,
             off);
}

static void part_ef(void) {
    if (mt.rank == 0) printf("-- 3 error feedback: bounded, and helping\n");
    gvqComm_t comm = mt_new_comm();
    const size_t count = 1200; /* 30 x 40 */
    if (mt.nranks > 1) {       /* one rank: QSGD and GradiVeQ's sums are local */
        gvqCompressorConfig_t q = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
        q.codec = gvqCodecQsgd;
        q.qsgdBits = 4;
        q.qsgdBucket = 64;
        ef_compare(comm, "qsgd", &q, count, 0, 30, 0.5);
        q.efBound = 0.25f; /* clipping */
        q.qsgdBits = 2;
        accumulated_error(comm, &q, count, 0, 1, 10, "qsgd clipped");
        gvqCompressorConfig_t gq = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
        gq.codec = gvqCodecGradiveq;
        gq.sliceSize = 40;
        gq.sampleIters = 2;
        gq.compressedIters = 6;
        gq.maxDims = 1;
        gq.voteThreshold = 10;
        ef_compare(comm, "gradiveq", &gq, count, 0, 40, 0.9);
        gq.efBound = 4.0f;
        ef_compare(comm, "gradiveq4", &gq, count, 0, 40, 0.9);
    }
    gvqCompressorConfig_t tr = GVQ_COMPRESSOR_CONFIG_INITIALIZER; /* GradiVeQ, tracked basis */
    tr.codec = gvqCodecGradiveq;
    tr.basisUpdate = gvqBasisTrack;
    tr.sliceSize = 40;
    tr.maxDims = 1;
    ef_compare(comm, "gq-track", &tr, count, 40, 30, 0.8);
    gvqCompressorConfig_t p = psgd_cfg(1, 30, 1, 5, 8);
    ef_compare(comm, "powersgd", &p, count, 40, 30, 0.8);
    p.efBound = 4.0f;
    ef_compare(comm, "powersgd4", &p, count, 40, 30, 0.8);
    MT_OK(gvqCommDestroy(comm));
}

/* ---- part 4: save / load ----------------------------------------------------------------------
 */

static void fill_saveload(float *g, size_t count, int t) {
    for (size_t i = 0; i < count; i++)
        g[i] = grad_val(mt.rank, t, i, 32);
}

static void part_saveload(void) {
    if (mt.rank == 0) printf("-- 4 save/load continues bitwise\n");
    gvqComm_t comm = mt_new_comm();
    gvqCompressorConfig_t cfg = psgd_cfg(2, 0, 0, 0, 0);
    size_t sz = 0;
    free(cref_resume(comm, &cfg, 1000, 10, 4, fill_saveload, &sz));
    MT_OK(gvqCommDestroy(comm));
}

/* ---- part 5: NaN / Inf sent uncompressed ----------------------------------------------------
 * A call whose gradient holds NaN or Inf on one rank gives every rank the plain sum (the NaN or
 * -Inf where it was fed, the other values within float rounding of the exact sum), counted in
 * stats.nonFiniteCalls. Without error feedback the compressor's state is untouched: a twin that
 * never saw those calls gives bitwise the same results afterwards. With error feedback the
 * following calls stay finite (the NaN never enters the residual). */

static void part_nan(void) {
    if (mt.rank == 0) printf("-- 5 NaN and Inf: the plain sum, the state not poisoned\n");
    gvqComm_t comm = mt_new_comm();
    const size_t count = 1000, m = 32;
    gvqCompressorConfig_t cfg = psgd_cfg(2, 0, 0, 0, 0);
    cfg.errorFeedback = 0;
    gvqCompressor_t a = NULL, b = NULL, e = NULL;
    MT_OK(gvqCompressorCreate(comm, count, &cfg, &a));
    MT_OK(gvqCompressorCreate(comm, count, &cfg, &b));
    cfg.errorFeedback = 1;
    MT_OK(gvqCompressorCreate(comm, count, &cfg, &e));
    float *g = malloc(4 * count), *ya = malloc(4 * count), *yb = malloc(4 * count);
    for (int t = 0; t < 6; t++) {
        for (size_t i = 0; i < count; i++)
            g[i] = grad_val(mt.rank, t, i, m);
        if (t == 1 || t == 2) { /* a and e only; b never sees these calls */
            if (mt.rank == mt.nranks - 1) g[5] = t == 1 ? NAN : -INFINITY;
            MT_OK(gvqAllReduceCompressed(g, ya, count, gvqFloat32, gvqSum, a, comm, NULL));
            MT_OK(gvqAllReduceCompressed(g, yb, count, gvqFloat32, gvqSum, e, comm, NULL));
            MT_CHECK(memcmp(ya, yb, 4 * count) == 0,
                     "call %d: the plain sums of two compressors differ", t);
            MT_CHECK(t == 1 ? isnan(ya[5]) : (isinf(ya[5]) && ya[5] < 0),
                     "call %d: element 5 = %g, want %s where it was fed", t, (double)ya[5],
                     t == 1 ? "NaN" : "-Inf");
            double worst = 0;
            for (size_t i = 0; i < count; i++) {
                if (i == 5) continue;
                double sum = 0, abs = 0;
                for (int j = 0; j < mt.nranks; j++) {
                    sum += grad_val(j, t, i, m);
                    abs += fabs(grad_val(j, t, i, m));
                }
                worst = fmax(worst, fabs(ya[i] - sum) / (abs * mt.nranks * 1.2e-7 + 1e-30));
            }
            MT_CHECK(worst <= 1.0, "call %d: the plain sum is off by %.3g float roundings", t,
                     worst);
            continue;
        }
        MT_OK(gvqAllReduceCompressed(g, ya, count, gvqFloat32, gvqSum, a, comm, NULL));
        MT_OK(gvqAllReduceCompressed(g, yb, count, gvqFloat32, gvqSum, b, comm, NULL));
        MT_CHECK(memcmp(ya, yb, 4 * count) == 0,
                 "call %d: after non-finite calls the result differs from a clean twin's", t);
        MT_OK(gvqAllReduceCompressed(g, ya, count, gvqFloat32, gvqSum, e, comm, NULL));
        int finite = 1;
        for (size_t i = 0; i < count; i++)
            finite &= isfinite(ya[i]) != 0;
        MT_CHECK(finite, "call %d: error feedback carried a NaN into a later call", t);
    }
    gvqCompressorStats_t st;
    MT_OK(gvqCompressorGetStats(a, &st));
    MT_CHECK(st.nonFiniteCalls == 2, "nonFiniteCalls %lld, want 2", st.nonFiniteCalls);
    MT_OK(gvqCompressorDestroy(a));
    MT_OK(gvqCompressorDestroy(b));
    MT_OK(gvqCompressorDestroy(e));
    MT_OK(gvqCommDestroy(comm));
    free(g), free(ya), free(yb);
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    part_reference("1a reference: flat 1000 -> 32 x 32 padded, rank 2", 1000, 0, 0, 0, 0, 2, 1.0f,
                   6);
    part_reference("1b reference: conv 8x3x3x3 -> 8 x 27, rank 3, efBound 0.5", 216, 8, 3, 3, 3, 3,
                   0.5f, 6);
    /* rows of 150 and blocks of 8 rows: the kernels' vector forms (128 values an expand pass, the
     * projection's row blocks) and their tails, which a job of mixed paths must agree on */
    part_reference("1c reference: flat 22400 -> 150 x 150 padded, rank 3", 22400, 0, 0, 0, 0, 3,
                   1.0f, 3);
    part_lowrank();
    part_ef();
    part_saveload();
    part_nan();
    return mt_finish("test_compressed_powersgd");
}
