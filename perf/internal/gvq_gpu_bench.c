/*
 * gvq_gpu_bench.c -- the CUDA device backend's throughput, side by side with the host one:
 *   GradiVeQ encode and decode (GB/s of gradient) vs device-to-device copy bandwidth,
 *   QSGD quantize/dequantize (4-bit, bucket 512),
 *   PCA fit (covariance + syevd) for L = 256, 512, 1024, 2304 on the GPU vs host LAPACKE,
 *   and a 1-rank allreduce sanity row (NCCL when built in, else staged).
 * Usage: gvq-gpu-bench [M elements, default 2^24]. Prints one table at the end. Without a
 * CUDA device it prints "no CUDA device: skipped" and exits 0.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "gvq_comm.h"

static const gvq_device_ops_t *D, *H;

static double now_s(void) {
    return (double)gvq_now_ns() * 1e-9;
}

static void *dev_rand(size_t n) {
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    void *d = D->alloc(n * sizeof(float));
    if (d != NULL) D->copy_from_host(d, h, n * sizeof(float));
    free(h);
    return d;
}

/* Seconds per execution of stmt, averaged over `iters`, device work included. */
#define TIME(var, iters, stmt)                  \
    do {                                        \
        stmt;                                   \
        D->sync();                              \
        double t0_ = now_s();                   \
        for (int it_ = 0; it_ < (iters); it_++) \
            stmt;                               \
        D->sync();                              \
        var = (now_s() - t0_) / (iters);        \
    } while (0)

/* The rows of the table, printed at the end. */
typedef struct {
    char rows[32][160];
    int n;
} table_t;

/* The d2d copy's GB/s (bytes read + written), measured first: every later row prints its
 * fraction of it (issue 36's target: codec kernels at 0.6 or more). */
static double copy_gbs;

/* A row of "what, ms, GB/s of `bytes` moved per execution, fraction of the copy's GB/s". */
static void add_rate(table_t *tb, const char *what, double t, double bytes) {
    double gbs = bytes / t / 1e9;
    snprintf(tb->rows[tb->n++], 160, "%-34s %10.3f ms %9.1f GB/s  %5.2f of d2d copy", what, t * 1e3,
             gbs, copy_gbs > 0 ? gbs / copy_gbs : 1.0);
}

static void bench_copy(table_t *tb, const float *x, float *y, size_t M) {
    double t;
    TIME(t, 20, D->copy(y, x, M * sizeof(float)));
    add_rate(tb, "d2d copy", t, 2.0 * M * 4);
    copy_gbs = 2.0 * M * 4 / t / 1e9;
}

/* GradiVeQ's encode and decode at L = 256, d = 32, fp32 and fp16 wire. */
static void bench_gradiveq(table_t *tb, const float *x, float *y, size_t M) {
    const size_t L = 256, d = 32;
    size_t M2 = M / L * L;
    float *U = dev_rand(L * d), *Z = dev_rand(L), *UZ = dev_rand(d);
    void *wire = D->alloc(M2 / L * d * sizeof(float) + 64);
    gvq_dev_gq_t g = {L, d, M2 / L, 4, 0, U, Z, UZ};
    double t;
    TIME(t, 20, D->gq_encode_combine(&g, 0, M2, x, NULL, wire, NULL));
    add_rate(tb, "GradiVeQ encode L=256 d=32", t, M2 * 4.0);
    TIME(t, 20, D->gq_decode(&g, 0, M2, wire, y));
    add_rate(tb, "GradiVeQ decode L=256 d=32", t, M2 * 4.0);
    g.wire_fp16 = 1;
    TIME(t, 20, D->gq_encode_combine(&g, 0, M2, x, NULL, wire, NULL));
    add_rate(tb, "GradiVeQ encode fp16 wire", t, M2 * 4.0);
    D->free(wire);
    D->free(U);
    D->free(Z);
    D->free(UZ);
}

/* QSGD at 4 bits, bucket 512. */
static void bench_qsgd(table_t *tb, const float *x, float *y, size_t M) {
    gvq_dev_qsgd_t q = {4, 7, 0, 512, 1, 0, 0};
    void *qw = D->alloc(M / 512 * (4 + 256) + 1024);
    double t;
    TIME(t, 20, D->qsgd_encode_combine(&q, 0, M, x, NULL, qw));
    add_rate(tb, "QSGD quantize 4-bit b=512", t, M * 4.0);
    void *qw2 = D->alloc(M / 512 * (4 + 256) + 1024);
    TIME(t, 20, D->qsgd_encode_combine(&q, 0, M, x, qw, qw2)); /* a ring hop */
    add_rate(tb, "QSGD hop (dequantize+add+quantize)", t, M * 4.0);
    D->free(qw2);
    TIME(t, 20, D->qsgd_decode(&q, 0, M, qw, y));
    add_rate(tb, "QSGD dequantize 4-bit b=512", t, M * 4.0);
    D->free(qw);
}

/* Covariance + syevd of L x 2L samples on the device against the host. */
static void bench_fit(table_t *tb, int l) {
    int T = 2 * l;
    float *s = dev_rand((size_t)l * T), *cov = D->alloc((size_t)l * l * 4);
    float *w = D->alloc((size_t)l * 4), *zz = D->alloc((size_t)l * 4);
    double t;
    TIME(t, 3, (D->scov(l, T, s, zz, cov), D->ssyevd(l, cov, l, w)));
    float *hs = malloc((size_t)l * T * 4), *hc = malloc((size_t)l * l * 4);
    float *hw = malloc((size_t)l * 4);
    D->copy_to_host(hs, s, (size_t)l * T * 4);
    double t0 = now_s();
    H->scov(l, T, hs, hw, hc);
    H->ssyevd(l, hc, l, hw);
    double th = now_s() - t0;
    snprintf(tb->rows[tb->n++], 160,
             "fit L=%-5d T=%-5d cov+syevd       %10.3f ms  host %9.3f ms (x%.1f)", l, T, t * 1e3,
             th * 1e3, th / t);
    free(hs);
    free(hc);
    free(hw);
    D->free(s);
    D->free(cov);
    D->free(w);
    D->free(zz);
}

/* gvqAllReduce on one rank: NCCL when the communicator brought it up, else staged. */
static void bench_allreduce(table_t *tb, const float *x, float *y, size_t M) {
    gvqComm_t comm;
    gvqUniqueId id;
    if (gvqGetUniqueId(&id) != gvqSuccess || gvqCommInitRank(&comm, 1, id, 0) != gvqSuccess) return;
    gvqResult_t r = gvqAllReduce(x, y, M, gvqFloat32, gvqSum, comm, NULL);
    cudaDeviceSynchronize();
    double t0 = now_s();
    for (int it = 0; it < 10 && r == gvqSuccess; it++)
        r = gvqAllReduce(x, y, M, gvqFloat32, gvqSum, comm, NULL);
    cudaDeviceSynchronize();
    double t = (now_s() - t0) / 10;
    snprintf(tb->rows[tb->n++], 160, "%-34s %10.3f ms %9.1f GB/s (%s, %s)", "allreduce 1 rank",
             t * 1e3, M * 4.0 / t / 1e9, gvqGetErrorString(r),
             comm->nccl_state == 1 ? "NCCL" : "staged");
    gvqCommDestroy(comm);
}

int main(int argc, char **argv) {
    if (gvq_cuda_device_count() == 0) {
        printf("gvq-gpu-bench: no CUDA device: skipped\n");
        return 0;
    }
    D = gvq_device_find("cuda");
    H = &gvq_host_device;
    size_t M = argc > 1 ? (size_t)strtoull(argv[1], NULL, 0) : (size_t)1 << 24;
    static table_t tb;
    float *x = dev_rand(M), *y = D->alloc(M * sizeof(float));
    bench_copy(&tb, x, y, M);
    bench_gradiveq(&tb, x, y, M);
    bench_qsgd(&tb, x, y, M);
    static const int Ls[] = {256, 512, 1024, 2304};
    for (int i = 0; i < 4; i++)
        bench_fit(&tb, Ls[i]);
    bench_allreduce(&tb, x, y, M);
    printf("# gvq-gpu-bench: M=%zu floats\n", M);
    for (int i = 0; i < tb.n; i++)
        printf("%s\n", tb.rows[i]);
    return 0;
}
