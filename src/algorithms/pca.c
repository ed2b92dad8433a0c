/*
 * pca.c -- fitting GradiVeQ's compressor (docs/ALGORITHMS.md section 2): mean, covariance by one
 * sgemm, symmetric eigen-solve on the device (LAPACKE ssyevd on the host), and the number of
 * kept dimensions from the loss threshold eps.
 *
 * Two routes to the same eigenpairs. With Xc the L x T matrix of centred samples:
 *   covariance  (1/T) Xc Xc^T, L x L: one sgemm and an L x L eigen-solve (O(L^3));
 *   Gram        (1/T) Xc^T Xc, T x T: same non-zero eigenvalues, eigenvectors v_j map to
 *               u_j = Xc v_j / sqrt(T l_j); O(T^2 L + T^3), far cheaper when T < L (L = 2304,
 *               T = 100: about 90x). The mapped columns are re-orthonormalised (modified
 *               Gram-Schmidt in double) so that U^T U = I holds to fp32 rounding, as the
 *               compressed-domain sum and the loss bookkeeping assume.
 * The automatic choice takes the Gram route when T < L.
 */
#include <math.h>
#include <stdlib.h>

#include "gvq_algo.h"

/* d from the eigenvalues w[0..n) (ascending): the smallest d whose leading eigenvalues hold
 * 1 - eps of the total, capped at dmax. */
static size_t pca_keep(const float *w, size_t n, double eps, size_t dmax, double *kept) {
    double total = 0, acc = 0;
    for (size_t i = 0; i < n; i++)
        total += w[i] > 0 ? w[i] : 0;
    size_t keep = 0;
    while (keep < n) {
        double l = w[n - 1 - keep];
        acc += l > 0 ? l : 0;
        keep++;
        if (total <= 0 || acc >= (1.0 - eps) * total) break;
    }
    if (dmax > 0 && keep > dmax) {
        keep = dmax;
        acc = 0;
        for (size_t j = 0; j < keep; j++)
            acc += w[n - 1 - j] > 0 ? w[n - 1 - j] : 0;
    }
    *kept = total > 0 ? acc / total : 1.0;
    return keep;
}

/* Modified Gram-Schmidt in double on the d columns of U (L x d). Returns 0 when a column has
 * lost more than half of its norm to the earlier ones (the map from the Gram route was too
 * ill-conditioned for it to be trusted). */
static int pca_orthonormalize(float *U, size_t L, size_t d) {
    for (size_t j = 0; j < d; j++) {
        float *u = U + j * L;
        double n0 = 0;
        for (size_t i = 0; i < L; i++)
            n0 += (double)u[i] * u[i];
        for (size_t q = 0; q < j; q++) {
            const float *v = U + q * L;
            double p = 0;
            for (size_t i = 0; i < L; i++)
                p += (double)u[i] * v[i];
            for (size_t i = 0; i < L; i++)
                u[i] = (float)(u[i] - p * v[i]);
        }
        double n1 = 0;
        for (size_t i = 0; i < L; i++)
            n1 += (double)u[i] * u[i];
        if (!(n1 > 0.25 * n0) || !(n1 > 0)) return 0;
        double s = 1.0 / sqrt(n1);
        for (size_t i = 0; i < L; i++)
            u[i] = (float)(u[i] * s);
    }
    return 1;
}

/* Covariance route: U (L x L) <- eigenvectors of (1/T) Xc Xc^T, leading d first. */
static gvqResult_t pca_covariance(const gvq_device_ops_t *dev, size_t L, size_t T, float *xc,
                                  float *w, double eps, size_t dmax, float *U, size_t *d,
                                  double *kept) {
    GVQCHECK(dev->sgemm(0, 1, (int)L, (int)L, (int)T, 1.0f / (float)T, xc, (int)L, xc, (int)L, 0.0f,
                        U, (int)L));
    GVQCHECK(dev->ssyevd((int)L, U, (int)L, w));
    size_t keep = pca_keep(w, L, eps, dmax, kept);
    /* the leading eigenvectors sit at the end of the ascending order: go through a copy
     * (xc holds >= L*L floats) */
    memcpy(xc, U + (L - keep) * L, sizeof(float) * L * keep);
    for (size_t j = 0; j < keep; j++)
        memcpy(U + j * L, xc + (keep - 1 - j) * L, sizeof(float) * L);
    *d = keep;
    return gvqSuccess;
}

/* Gram route (T < L). Returns gvqInProgress when the result cannot be trusted (degenerate
 * samples), so the caller falls back to the covariance route. xc is kept intact. */
static gvqResult_t pca_gram(const gvq_device_ops_t *dev, size_t L, size_t T, const float *xc,
                            float *w, double eps, size_t dmax, float *U, size_t *d, double *kept) {
    gvqResult_t res = gvqSuccess;
    float *G = malloc(sizeof(float) * T * T), *V = malloc(sizeof(float) * T * T);
    if (G == NULL || V == NULL) {
        res = gvqSystemError;
        goto out;
    }
    GVQCHECKGOTO(dev->sgemm(1, 0, (int)T, (int)T, (int)L, 1.0f / (float)T, xc, (int)L, xc, (int)L,
                            0.0f, G, (int)T),
                 res, out);
    GVQCHECKGOTO(dev->ssyevd((int)T, G, (int)T, w), res, out);
    size_t keep = pca_keep(w, T, eps, dmax, kept);
    for (size_t j = 0; j < keep; j++) {
        double l = w[T - 1 - j];
        if (!(l > 0)) { /* nothing to map: fall back */
            res = gvqInProgress;
            goto out;
        }
        double s = 1.0 / sqrt((double)T * l);
        for (size_t i = 0; i < T; i++)
            V[j * T + i] = (float)(G[(T - 1 - j) * T + i] * s);
    }
    GVQCHECKGOTO(
        dev->sgemm(0, 0, (int)L, (int)keep, (int)T, 1.0f, xc, (int)L, V, (int)T, 0.0f, U, (int)L),
        res, out);
    if (!pca_orthonormalize(U, L, keep)) {
        res = gvqInProgress;
        goto out;
    }
    *d = keep;
out:
    free(G);
    free(V);
    return res;
}

gvqResult_t gvq_pca_fit_method(const gvq_device_ops_t *dev, size_t L, size_t T,
                               const float *samples, double eps, size_t dmax, float *U, float *Z,
                               size_t *d, double *kept_energy, gvq_pca_method_t method) {
    if (L == 0 || T == 0 || L > 65536 || !(eps >= 0 && eps < 1)) {
        GVQ_WARN("PCA fit: L=%zu T=%zu eps=%g out of range", L, T, eps);
        return gvqInvalidArgument;
    }
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < L; i++)
            if (!isfinite(samples[t * L + i])) {
                GVQ_WARN("PCA fit refused: sample %zu holds a non-finite value (%g) at element %zu",
                         t, (double)samples[t * L + i], i);
                return gvqInvalidArgument;
            }
    if (method == GVQ_PCA_AUTO) method = T < L ? GVQ_PCA_GRAM : GVQ_PCA_COVARIANCE;
    gvqResult_t res = gvqSuccess;
    float *xc = malloc(sizeof(float) * L * GVQ_MAX(T, L));
    float *w = malloc(sizeof(float) * GVQ_MAX(T, L));
    double kept = 1.0;
    if (xc == NULL || w == NULL) {
        res = gvqSystemError;
        goto out_free;
    }
    for (size_t i = 0; i < L; i++) {
        double m = 0;
        for (size_t t = 0; t < T; t++)
            m += samples[t * L + i];
        Z[i] = (float)(m / (double)T);
    }
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < L; i++)
            xc[t * L + i] = samples[t * L + i] - Z[i];
    if (method == GVQ_PCA_GRAM) {
        res = pca_gram(dev, L, T, xc, w, eps, dmax, U, d, &kept);
        if (res != gvqInProgress) goto out_free;
        GVQ_INFO("PCA fit: Gram route degenerate (L=%zu T=%zu), using the covariance route", L, T);
    }
    res = pca_covariance(dev, L, T, xc, w, eps, dmax, U, d, &kept);
out_free:
    /* Columns past d are zero, not leftovers: the compressor agrees on one d for all reuse
     * groups (the largest), so a group that kept fewer sends those columns too. The Gram route
     * left them unwritten (garbage reached the coefficients and the loss estimate); the
     * covariance route left small-eigenvalue vectors, which repeat a leading one once d > L/2. */
    if (res == gvqSuccess && *d < L) memset(U + *d * L, 0, sizeof(float) * L * (L - *d));
    if (res == gvqSuccess && kept_energy != NULL) *kept_energy = kept;
    free(xc);
    free(w);
    return res;
}

gvqResult_t gvq_pca_fit(const gvq_device_ops_t *dev, size_t L, size_t T, const float *samples,
                        double eps, size_t dmax, float *U, float *Z, size_t *d,
                        double *kept_energy) {
    return gvq_pca_fit_method(dev, L, T, samples, eps, dmax, U, Z, d, kept_energy, GVQ_PCA_AUTO);
}
