/*
 * pca.c -- fitting GradiVeQ's compressor (ALGORITHMS.md section 2): mean, covariance by one
 * sgemm, symmetric eigen-solve on the device (LAPACKE ssyevd on the host), and the number of
 * kept dimensions from the loss threshold eps.
 */
#include <math.h>
#include <stdlib.h>

#include "gvq_algo.h"

gvqResult_t gvq_pca_fit(const gvq_device_ops_t *dev, size_t L, size_t T, const float *samples,
                        double eps, size_t dmax, float *U, float *Z, size_t *d,
                        double *kept_energy) {
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
    gvqResult_t res = gvqSuccess;
    float *xc = malloc(sizeof(float) * L * GVQ_MAX(T, L)), *w = malloc(sizeof(float) * L);
    if (xc == NULL || w == NULL) {
        res = gvqSystemError;
        goto out_free;
    }
    for (size_t i = 0; i < L; i++) {
        double m = 0;
        for (size_t t = 0; t < T; t++) m += samples[t * L + i];
        Z[i] = (float)(m / (double)T);
    }
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < L; i++) xc[t * L + i] = samples[t * L + i] - Z[i];
    /* covariance into U (L x L): (1/T) Xc Xc^T */
    GVQCHECKGOTO(dev->sgemm(0, 1, (int)L, (int)L, (int)T, 1.0f / (float)T, xc, (int)L, xc, (int)L,
                            0.0f, U, (int)L),
                 res, out_free);
    GVQCHECKGOTO(dev->ssyevd((int)L, U, (int)L, w), res, out_free);
    /* eigenvalues ascend: the leading ones are at the end */
    double total = 0;
    for (size_t i = 0; i < L; i++) total += w[i] > 0 ? w[i] : 0;
    size_t keep = 0;
    double acc = 0;
    while (keep < L) {
        double l = w[L - 1 - keep];
        acc += l > 0 ? l : 0;
        keep++;
        if (total <= 0 || acc >= (1.0 - eps) * total) break;
    }
    if (dmax > 0 && keep > dmax) {
        keep = dmax;
        acc = 0;
        for (size_t j = 0; j < keep; j++) acc += w[L - 1 - j] > 0 ? w[L - 1 - j] : 0;
    }
    /* U's first `keep` columns become the leading eigenvectors, largest first (the leading
     * eigenvectors sit at the end of the ascending order, so go through a copy) */
    memcpy(xc, U + (L - keep) * L, sizeof(float) * L * keep); /* xc holds >= L*L floats */
    for (size_t j = 0; j < keep; j++)
        memcpy(U + j * L, xc + (keep - 1 - j) * L, sizeof(float) * L);
    *d = keep;
    if (kept_energy != NULL) *kept_energy = total > 0 ? acc / total : 1.0;
out_free:
    free(xc);
    free(w);
    return res;
}
