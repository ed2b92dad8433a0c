/*
 * linalg.cu -- the CUDA device's linear algebra: sgemm through cuBLAS, the symmetric
 * eigen-solve through cuSOLVER, and the mean and covariance of PCA samples (scov: a mean and a
 * centering kernel, then a cuBLAS syrk).
 *
 * Products through cuBLAS differ from the host's CBLAS by rounding only; the mean is summed in
 * double in the host's order (one thread per row).
 */
#include "gvq_cuda.h"

extern "C" gvqResult_t gvq_cuda_sgemm(int transa, int transb, int m, int n, int k, float alpha,
                                      const float *a, int lda, const float *b, int ldb, float beta,
                                      float *cm, int ldc) {
    if (m == 0 || n == 0) return gvqSuccess;
    CTX(c);
    CUBLASCHECK(cublasSgemm(c->blas, transa ? CUBLAS_OP_T : CUBLAS_OP_N,
                            transb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, a, lda, b, ldb,
                            &beta, cm, ldc));
    return gvqSuccess;
}

extern "C" gvqResult_t gvq_cuda_ssyevd(int n, float *a, int lda, float *w) {
    if (n <= 0) return gvqSuccess;
    CTX(c);
    int lwork = 0;
    CUSOLVERCHECK(cusolverDnSsyevd_bufferSize(c->solver, CUSOLVER_EIG_MODE_VECTOR,
                                              CUBLAS_FILL_MODE_LOWER, n, a, lda, w, &lwork));
    void *work = NULL;
    GVQCHECK(gvq_cuda_scratch(c, (size_t)lwork * sizeof(float), &work));
    CUSOLVERCHECK(cusolverDnSsyevd(c->solver, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, n,
                                   a, lda, w, (float *)work, lwork, c->info));
    int info = 0;
    CUDACHECK(cudaMemcpyAsync(&info, c->info, sizeof info, cudaMemcpyDeviceToHost, c->cur));
    CUDACHECK(cudaStreamSynchronize(c->cur));
    if (info != 0) {
        GVQ_WARN("cusolverDnSsyevd(n=%d) failed: info=%d (%s)", n, info,
                 info < 0 ? "illegal argument" : "no convergence");
        return gvqInternalError;
    }
    return gvqSuccess;
}

/* Z[i] = mean over t, summed in double in the host's order (one thread per row). */
__global__ void k_mean(const float *s, float *Z, int L, int T) {
    GRID_LOOP(i, (size_t)L) {
        double m = 0;
        for (int t = 0; t < T; t++)
            m += s[(size_t)t * L + i];
        Z[i] = (float)(m / (double)T);
    }
}

__global__ void k_center(const float *s, const float *Z, float *xc, int L, size_t n) {
    GRID_LOOP(i, n) xc[i] = __fsub_rn(s[i], Z[i % (size_t)L]);
}

extern "C" gvqResult_t gvq_cuda_scov(int L, int T, const float *samples, float *Z, float *cov) {
    if (L <= 0 || T <= 0) {
        GVQ_WARN("CUDA scov: L=%d T=%d must be positive", L, T);
        return gvqInvalidArgument;
    }
    CTX(c);
    size_t n = (size_t)L * (size_t)T;
    void *xc = NULL;
    GVQCHECK(gvq_cuda_scratch(c, n * sizeof(float), &xc));
    k_mean<<<blocks_for((size_t)L), THREADS, 0, c->cur>>>(samples, Z, L, T);
    LAUNCHCHECK("mean");
    k_center<<<blocks_for(n), THREADS, 0, c->cur>>>(samples, Z, (float *)xc, L, n);
    LAUNCHCHECK("center");
    const float alpha = 1.0f / (float)T, beta = 0.0f;
    CUBLASCHECK(cublasSsyrk(c->blas, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, L, T, &alpha,
                            (const float *)xc, L, &beta, cov, L));
    return gvqSuccess;
}
