/*
 * powersgd.c -- the linear algebra of PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019; the
 * same steps as PyTorch's powerSGD_hook): one power iteration per call, warm-started from the
 * previous call's Q. The caller (src/compress/methods/powersgd.c) sums P and Q over the ranks
 * between the steps. On the host the products are the codec kernels' (codec_linalg.h: each value
 * one chain of fused multiply-adds in a fixed order, so the same bits on every CPU); another
 * device's run through its dev->sgemm.
 *
 *     rank k:   M_k = g_k + e_k             n x m, row-major (the tensor itself, zero-padded)
 *               P_k = M_k Q                 gvq_powersgd_project     Q: m x r, same on all ranks
 *     ring:     P = sum_k P_k               n*r floats, plain fp32 ring
 *               P_hat = orth(P)             gvq_powersgd_orthonormalize (same on all ranks)
 *               Q_k = M_k^T P_hat           gvq_powersgd_back
 *     ring:     Q = sum_k Q_k               m*r floats
 *     output:   P_hat Q^T  (~ sum_k M_k)    gvq_powersgd_expand
 *     kept:     Q / N (next warm start);  e_k = M_k - P_hat (Q/N)^T (error feedback)
 *
 * Layout: M is row-major n x m, which BLAS (column-major) sees as M^T, an m x n matrix with
 * leading dimension m. P (n x r, ld n) and Q (m x r, ld m) are column-major, so every column is
 * contiguous for the Gram-Schmidt sweep. Host memory only: there are no device kernels for
 * PowerSGD; device buffers are staged through host memory by the caller.
 */
#include <math.h>
#include <stdlib.h>

#include "codec_kernels.h"
#include "gvq_algo.h"
#include "gvq_rng.h"

/* A column that keeps less than this share of its norm after the projections is treated as
 * linearly dependent on the earlier ones (fp32 cancellation leaves about 1e-7). */
#define PSGD_DEGENERATE_TOL 1e-4

/* ---- the first Q ------------------------------------------------------------------------------
 */

void gvq_powersgd_init_q(float *Q, size_t m, size_t r, uint32_t seed) {
    uint32_t key[2] = {seed, 0x50534744u}; /* "PSGD": no rank in the key: same Q everywhere */
    for (size_t i = 0; i < m * r; i++) {
        uint32_t ctr[4] = {(uint32_t)i, (uint32_t)((uint64_t)i >> 32), 0, 0x51494e49u}, out[4];
        gvq_philox4x32_10(ctr, key, out);
        double u1 = ((double)(out[0] >> 8) + 1.0) / 16777216.0; /* (0, 1] */
        double u2 = (double)gvq_u01(out[1]);
        Q[i] = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2)); /* Box-Muller */
    }
}

/* ---- the products -----------------------------------------------------------------------------
 */

gvqResult_t gvq_powersgd_project(const gvq_device_ops_t *dev, const float *M, size_t n, size_t m,
                                 size_t r, const float *Q, float *P) {
    if (dev == &gvq_host_device) {
        /* the host: the codec kernels' projection (the same bits on every CPU; OpenBLAS packs
         * M before multiplying, a pass of its own at these small r) */
        gvq_kernels()->project(n, m, r, M, Q, P, 1, n, 0);
        return gvqSuccess;
    }
    /* P (n x r) = M Q = (M^T)^T Q, M^T being the m x n column-major view of M */
    return dev->sgemm(1, 0, (int)n, (int)r, (int)m, 1.0f, M, (int)m, Q, (int)m, 0.0f, P, (int)n);
}

gvqResult_t gvq_powersgd_project_residual(const gvq_device_ops_t *dev, float *M, size_t n, size_t m,
                                          size_t r, const float *Q, float *P) {
    if (dev == &gvq_host_device) { /* one sweep over M: each row in the cache */
        gvq_kernels()->project(n, m, r, M, Q, P, 1, n, 1);
        return gvqSuccess;
    }
    GVQCHECK(gvq_powersgd_project(dev, M, n, m, r, Q, P));
    return gvq_powersgd_expand(dev, n, m, r, P, Q, -1.0f, 1.0f, M);
}

gvqResult_t gvq_powersgd_back(const gvq_device_ops_t *dev, const float *M, size_t n, size_t m,
                              size_t r, const float *P, float *Q) {
    if (dev == &gvq_host_device) { /* the codec kernels' (the same bits on every CPU) */
        gvq_kernels()->back(n, m, r, M, P, 1, n, Q);
        return gvqSuccess;
    }
    /* Q (m x r) = M^T P */
    return dev->sgemm(0, 0, (int)m, (int)r, (int)n, 1.0f, M, (int)m, P, (int)n, 0.0f, Q, (int)m);
}

gvqResult_t gvq_powersgd_expand(const gvq_device_ops_t *dev, size_t n, size_t m, size_t r,
                                const float *P, const float *Q, float alpha, float beta,
                                float *out) {
    if (dev == &gvq_host_device) {
        /* the host: the codec kernels' expand (the same bits on every CPU; BLAS kernels differ
         * between CPUs, and at small r run at a fraction of their speed) */
        gvq_kernels()->expand(n, m, r, P, 1, n, Q, alpha, beta, NULL, out);
        return gvqSuccess;
    }
    /* out row-major n x m = column-major m x n: alpha Q P^T + beta out = (alpha P Q^T + beta)^T */
    return dev->sgemm(0, 1, (int)m, (int)n, (int)r, alpha, Q, (int)m, P, (int)n, beta, out, (int)m);
}

/* ---- orthonormalisation -----------------------------------------------------------------------
 */

static double col_dot(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * (double)b[i];
    return s;
}

/* v -= (P_j . v) P_j for every earlier column j < k, twice ("twice is enough": the second sweep
 * removes what rounding left of the first). */
static void project_out(const float *P, size_t n, size_t k, float *v) {
    for (int pass = 0; pass < 2; pass++)
        for (size_t j = 0; j < k; j++) {
            const float *pj = P + j * n;
            float h = (float)col_dot(pj, v, n);
            for (size_t i = 0; i < n; i++)
                v[i] -= h * pj[i];
        }
}

/* Scale v to unit norm; 0 when its norm is not above `floor` (then v is left as it is). */
static int normalise(float *v, size_t n, double floor) {
    double nrm = sqrt(col_dot(v, v, n));
    if (!(nrm > floor)) return 0; /* also a NaN norm */
    for (size_t i = 0; i < n; i++)
        v[i] = (float)((double)v[i] / nrm);
    return 1;
}

/* A replacement for the degenerate column k: the unit vector e_i least covered by the columns
 * before it (largest 1 - sum_j P_j[i]^2, the lowest i on ties), orthogonalised against them and
 * normalised. Since k < n orthonormal columns leave some e_i with 1 - sum >= (n - k) / n, the
 * result is a unit vector; it depends on P's earlier columns only, so it is the same on every
 * rank. */
static void replace_column(float *P, size_t n, size_t k) {
    size_t best = 0;
    double best_left = -1;
    for (size_t i = 0; i < n; i++) {
        double covered = 0;
        for (size_t j = 0; j < k; j++)
            covered += (double)P[j * n + i] * (double)P[j * n + i];
        if (1.0 - covered > best_left) {
            best_left = 1.0 - covered;
            best = i;
        }
    }
    float *v = P + k * n;
    for (size_t i = 0; i < n; i++)
        v[i] = i == best ? 1.0f : 0.0f;
    project_out(P, n, k, v);
    normalise(v, n, 0.0);
}

size_t gvq_powersgd_orthonormalize(float *P, size_t n, size_t r) {
    size_t replaced = 0;
    for (size_t k = 0; k < r; k++) {
        float *v = P + k * n;
        double before = sqrt(col_dot(v, v, n));
        project_out(P, n, k, v);
        if (before > 0 && normalise(v, n, PSGD_DEGENERATE_TOL * before)) continue;
        replace_column(P, n, k);
        replaced++;
    }
    return replaced;
}
