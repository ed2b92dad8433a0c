/*
 * test_powersgd.c -- src/algorithms/powersgd.c against references computed here: the three products
 * against double loops, one power iteration on a 6 x 5 matrix of rank 2 against LAPACKE's QR
 * (sgeqrf + sorgqr, columns sign-normalised to a positive R diagonal), and the degenerate
 * columns (a rank-1 matrix, a zero matrix, an exactly dependent column, a NaN column) against
 * the replacement rule written out by hand; the first Q's determinism and moments.
 */
#include <lapacke.h>
#include <math.h>

#include "gvq_test.h"

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static double urand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}
static double nrand(void) {
    double u = urand() + 1e-12, v = urand();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static const gvq_device_ops_t *dev = &gvq_host_device;

/* M (row-major n x m) = sum over k < rank of w_k a_k b_k^T, random a, b. */
static void make_matrix(float *M, size_t n, size_t m, size_t rank) {
    double a[16][16], b[16][16];
    for (size_t k = 0; k < rank; k++) {
        for (size_t i = 0; i < n; i++)
            a[k][i] = nrand();
        for (size_t j = 0; j < m; j++)
            b[k][j] = nrand() * (double)(rank - k);
    }
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < m; j++) {
            double v = 0;
            for (size_t k = 0; k < rank; k++)
                v += a[k][i] * b[k][j];
            M[i * m + j] = (float)v;
        }
}

static double max_abs_diff(const float *a, const double *b, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++)
        w = fmax(w, fabs((double)a[i] - b[i]));
    return w;
}

/* P = M Q, Q = M^T P and P Q^T against double loops. */
static void test_products(void) {
    size_t n = 7, m = 4, r = 3;
    float M[28], Q[12], P[21], Q2[12], out[28];
    double ref[28];
    for (size_t i = 0; i < n * m; i++)
        M[i] = (float)nrand();
    for (size_t i = 0; i < m * r; i++)
        Q[i] = (float)nrand();
    EXPECT_RES(gvq_powersgd_project(dev, M, n, m, r, Q, P), gvqSuccess);
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < r; k++) {
            double s = 0;
            for (size_t j = 0; j < m; j++)
                s += (double)M[i * m + j] * Q[k * m + j];
            ref[k * n + i] = s;
        }
    EXPECT(max_abs_diff(P, ref, n * r) < 1e-5, "P = M Q off by %g", max_abs_diff(P, ref, n * r));
    EXPECT_RES(gvq_powersgd_back(dev, M, n, m, r, P, Q2), gvqSuccess);
    for (size_t j = 0; j < m; j++)
        for (size_t k = 0; k < r; k++) {
            double s = 0;
            for (size_t i = 0; i < n; i++)
                s += (double)M[i * m + j] * P[k * n + i];
            ref[k * m + j] = s;
        }
    EXPECT(max_abs_diff(Q2, ref, m * r) < 1e-4, "Q = M^T P off by %g",
           max_abs_diff(Q2, ref, m * r));
    for (size_t i = 0; i < n * m; i++)
        out[i] = 1.0f;
    EXPECT_RES(gvq_powersgd_expand(dev, n, m, r, P, Q2, 2.0f, -1.0f, out), gvqSuccess);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < m; j++) {
            double s = 0;
            for (size_t k = 0; k < r; k++)
                s += (double)P[k * n + i] * Q2[k * m + j];
            ref[i * m + j] = 2 * s - 1;
        }
    EXPECT(max_abs_diff(out, ref, n * m) < 1e-3, "2 P Q^T - 1 off by %g",
           max_abs_diff(out, ref, n * m));
}

/* One iteration on a 6 x 5 matrix, rank 2 (and a full-rank one), against LAPACKE's QR. */
static void test_against_qr(size_t rank) {
    enum { n = 6, m = 5, r = 2 };
    float M[n * m], Q[m * r], P[n * r], Pref[n * r], tau[r], Qn[m * r], out[n * m];
    double Qref[m * r], oref[n * m], Pd[n * r];
    make_matrix(M, n, m, rank);
    for (size_t i = 0; i < m * r; i++)
        Q[i] = (float)nrand();
    /* the codec */
    EXPECT_RES(gvq_powersgd_project(dev, M, n, m, r, Q, P), gvqSuccess);
    memcpy(Pref, P, sizeof P);
    size_t replaced = gvq_powersgd_orthonormalize(P, n, r);
    EXPECT(replaced == 0, "rank %zu: %zu columns replaced, want 0", rank, replaced);
    EXPECT_RES(gvq_powersgd_back(dev, M, n, m, r, P, Qn), gvqSuccess);
    EXPECT_RES(gvq_powersgd_expand(dev, n, m, r, P, Qn, 1.0f, 0.0f, out), gvqSuccess);
    /* the reference: QR of M Q by LAPACKE, columns flipped where R's diagonal is negative */
    EXPECT(LAPACKE_sgeqrf(LAPACK_COL_MAJOR, n, r, Pref, n, tau) == 0, "sgeqrf");
    float rdiag[r];
    for (int k = 0; k < r; k++)
        rdiag[k] = Pref[k * n + k];
    EXPECT(LAPACKE_sorgqr(LAPACK_COL_MAJOR, n, r, r, Pref, n, tau) == 0, "sorgqr");
    for (int k = 0; k < r; k++)
        for (int i = 0; i < n; i++)
            Pd[k * n + i] = rdiag[k] < 0 ? -(double)Pref[k * n + i] : (double)Pref[k * n + i];
    EXPECT(max_abs_diff(P, Pd, n * r) < 1e-5, "rank %zu: P_hat differs from QR's by %g", rank,
           max_abs_diff(P, Pd, n * r));
    for (int j = 0; j < m; j++)
        for (int k = 0; k < r; k++) {
            double s = 0;
            for (int i = 0; i < n; i++)
                s += (double)M[i * m + j] * Pd[k * n + i];
            Qref[k * m + j] = s;
        }
    double scale = 0, err = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double s = 0;
            for (int k = 0; k < r; k++)
                s += Pd[k * n + i] * Qref[k * m + j];
            oref[i * m + j] = s;
            scale = fmax(scale, fabs(s));
        }
    err = max_abs_diff(out, oref, n * m);
    EXPECT(err < 1e-5 * fmax(scale, 1), "rank %zu: P_hat Q^T differs from the QR reference by %g",
           rank, err);
    if (rank <= r) { /* a rank-2 matrix is reproduced exactly */
        double e2 = 0;
        for (int i = 0; i < n * m; i++)
            e2 = fmax(e2, fabs((double)out[i] - M[i]));
        EXPECT(e2 < 1e-4 * fmax(scale, 1), "rank-%zu matrix not reproduced: %g", rank, e2);
    }
}

/* The replacement rule by hand: the unit vector e_i with the largest 1 - sum_j P_j[i]^2 (the
 * lowest i on ties), minus its projections on the earlier columns, normalised. */
static void expected_replacement(const float *P, size_t n, size_t k, double *v) {
    size_t best = 0;
    double left = -1;
    for (size_t i = 0; i < n; i++) {
        double cov = 0;
        for (size_t j = 0; j < k; j++)
            cov += (double)P[j * n + i] * P[j * n + i];
        if (1 - cov > left + 1e-12) {
            left = 1 - cov;
            best = i;
        }
    }
    for (size_t i = 0; i < n; i++)
        v[i] = i == best;
    for (size_t j = 0; j < k; j++) {
        double h = P[j * n + best];
        for (size_t i = 0; i < n; i++)
            v[i] -= h * P[j * n + i];
    }
    double nrm = 0;
    for (size_t i = 0; i < n; i++)
        nrm += v[i] * v[i];
    for (size_t i = 0; i < n; i++)
        v[i] /= sqrt(nrm);
}

static double orthonormality_error(const float *P, size_t n, size_t r) {
    double w = 0;
    for (size_t a = 0; a < r; a++)
        for (size_t b = 0; b < r; b++) {
            double s = 0;
            for (size_t i = 0; i < n; i++)
                s += (double)P[a * n + i] * P[b * n + i];
            w = fmax(w, fabs(s - (a == b)));
        }
    return w;
}

static void test_degenerate(void) {
    enum { n = 6, m = 5, r = 2 };
    float M[n * m], Q[m * r], P[n * r], Qn[m * r], out[n * m];
    double v[n];
    /* a rank-1 matrix: P's second column is a multiple of the first */
    make_matrix(M, n, m, 1);
    for (size_t i = 0; i < m * r; i++)
        Q[i] = (float)nrand();
    gvq_powersgd_project(dev, M, n, m, r, Q, P);
    double u[n], un = 0;
    for (int i = 0; i < n; i++)
        un += (double)P[i] * P[i];
    for (int i = 0; i < n; i++)
        u[i] = P[i] / sqrt(un);
    size_t rep = gvq_powersgd_orthonormalize(P, n, r);
    EXPECT(rep == 1, "rank-1 matrix: %zu columns replaced, want 1", rep);
    EXPECT(max_abs_diff(P, u, n) < 1e-6, "rank-1: first column is not P_0 / ||P_0||");
    expected_replacement(P, n, 1, v);
    EXPECT(max_abs_diff(P + n, v, n) < 1e-6, "rank-1: replacement column off by %g",
           max_abs_diff(P + n, v, n));
    EXPECT(orthonormality_error(P, n, r) < 1e-6, "rank-1: not orthonormal (%g)",
           orthonormality_error(P, n, r));
    gvq_powersgd_back(dev, M, n, m, r, P, Qn);
    gvq_powersgd_expand(dev, n, m, r, P, Qn, 1.0f, 0.0f, out);
    double e = 0, sc = 0;
    for (int i = 0; i < n * m; i++) {
        e = fmax(e, fabs((double)out[i] - M[i]));
        sc = fmax(sc, fabs((double)M[i]));
    }
    EXPECT(e < 1e-5 * sc, "rank-1 matrix not reproduced: %g of %g", e, sc);

    /* a zero matrix: both columns replaced, e_0 then e_1; the output is zero, not NaN */
    memset(M, 0, sizeof M);
    gvq_powersgd_project(dev, M, n, m, r, Q, P);
    rep = gvq_powersgd_orthonormalize(P, n, r);
    EXPECT(rep == 2, "zero matrix: %zu replaced, want 2", rep);
    for (int i = 0; i < n; i++)
        EXPECT(P[i] == (i == 0) && P[n + i] == (i == 1),
               "zero matrix: P_hat[%d] = (%g, %g), want e_0, e_1", i, P[i], P[n + i]);
    gvq_powersgd_back(dev, M, n, m, r, P, Qn);
    gvq_powersgd_expand(dev, n, m, r, P, Qn, 1.0f, 0.0f, out);
    for (int i = 0; i < n * m; i++)
        EXPECT(out[i] == 0.0f, "zero matrix: output[%d] = %g", i, out[i]);

    /* an exactly dependent third column, and a NaN one */
    float P3[n * 4];
    for (int i = 0; i < n; i++) {
        P3[i] = (float)nrand();
        P3[n + i] = (float)nrand();
        P3[2 * n + i] = 2.0f * P3[i];
        P3[3 * n + i] = i == 2 ? NAN : 1.0f;
    }
    rep = gvq_powersgd_orthonormalize(P3, n, 4);
    EXPECT(rep == 2, "dependent + NaN columns: %zu replaced, want 2", rep);
    expected_replacement(P3, n, 2, v);
    EXPECT(max_abs_diff(P3 + 2 * n, v, n) < 1e-6, "dependent column: replacement off by %g",
           max_abs_diff(P3 + 2 * n, v, n));
    expected_replacement(P3, n, 3, v);
    EXPECT(max_abs_diff(P3 + 3 * n, v, n) < 1e-6, "NaN column: replacement off by %g",
           max_abs_diff(P3 + 3 * n, v, n));
    EXPECT(orthonormality_error(P3, n, 4) < 1e-6, "4 columns not orthonormal (%g)",
           orthonormality_error(P3, n, 4));
}

/* The first Q: the same for the same seed, another for another seed, standard normal moments. */
static void test_init_q(void) {
    size_t m = 400, r = 25;
    float *a = malloc(sizeof(float) * m * r), *b = malloc(sizeof(float) * m * r),
          *c = malloc(sizeof(float) * m * r);
    gvq_powersgd_init_q(a, m, r, 7);
    gvq_powersgd_init_q(b, m, r, 7);
    gvq_powersgd_init_q(c, m, r, 8);
    EXPECT(memcmp(a, b, sizeof(float) * m * r) == 0, "same seed, different Q");
    EXPECT(memcmp(a, c, sizeof(float) * m * r) != 0, "different seed, same Q");
    double s = 0, s2 = 0;
    for (size_t i = 0; i < m * r; i++) {
        EXPECT(isfinite(a[i]), "Q[%zu] = %g", i, a[i]);
        s += a[i];
        s2 += (double)a[i] * a[i];
    }
    double mean = s / (double)(m * r), var = s2 / (double)(m * r) - mean * mean;
    EXPECT(fabs(mean) < 0.03 && fabs(var - 1) < 0.05, "Q's mean %g variance %g, want 0 and 1", mean,
           var);
    free(a), free(b), free(c);
}

int main(void) {
    test_products();
    test_against_qr(2);
    test_against_qr(5);
    test_degenerate();
    test_init_q();
    return gvq_test_finish("test_powersgd");
}
