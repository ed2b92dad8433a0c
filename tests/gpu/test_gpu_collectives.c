/*
 * test_gpu_collectives.c -- collectives on CUDA buffers under mpiexec: every rank shares the one
 * GPU (or takes device rank % count). The result of each call on cudaMalloc buffers must equal
 * the same call on host buffers (bit for bit with <= 2 ranks, where every path adds the same two
 * values; within rounding beyond). With NCCL usable (a device per rank) the calls run on NCCL,
 * otherwise -- and with GVQ_NCCL=0 -- they are staged through pinned host memory. gvqSend and
 * gvqRecv on CUDA buffers (always staged) move a ring of values between the ranks. Without a
 * CUDA device every rank reports itself skipped (exit 77).
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gvq.h"

static int failures;
#define CHECK(cond, ...)                                             \
    do {                                                             \
        if (!(cond)) {                                               \
            if (failures++ < 20) {                                   \
                fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
                fprintf(stderr, __VA_ARGS__);                        \
                fprintf(stderr, "\n");                               \
            }                                                        \
        }                                                            \
    } while (0)

/* Element i of a buffer of type t as a double (16-bit floats decoded). */
static double value_at(const void *buf, gvqDataType_t t, size_t i) {
    if (t == gvqFloat32) return ((const float *)buf)[i];
    if (t == gvqFloat64) return ((const double *)buf)[i];
    if (t == gvqInt32) return ((const int32_t *)buf)[i];
    uint16_t h = ((const uint16_t *)buf)[i];
    if (t == gvqBfloat16) {
        uint32_t b = (uint32_t)h << 16;
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    int e = (h >> 10) & 0x1f, m = h & 0x3ff; /* fp16 */
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m | 0x400, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* gvqAllReduce with op, then gvqBroadcast, of count values of type t (types[ti]) on CUDA buffers
 * against the same calls on host buffers. */
static void check_type_op(gvqComm_t comm, cudaStream_t s, int rank, int n, int ti, gvqDataType_t t,
                          int op) {
    const size_t count = 100003;
    size_t es = t == gvqFloat64 ? 8 : t == gvqFloat16 || t == gvqBfloat16 ? 2 : 4;
    size_t bytes = count * es;
    unsigned char *h = malloc(bytes), *want = malloc(bytes), *got = malloc(bytes);
    srand(7 + rank * 31 + ti);
    for (size_t i = 0; i < count; i++) {
        float f = (float)(rand() % 200 - 100) / 16.0f;
        if (t == gvqInt32)
            ((int32_t *)h)[i] = rand() % 1000 - 500;
        else if (t == gvqFloat32)
            ((float *)h)[i] = f;
        else if (t == gvqFloat64)
            ((double *)h)[i] = f;
        else { /* small exact values in 16 bits: (-100..99)/16 */
            uint32_t b;
            memcpy(&b, &f, 4);
            ((uint16_t *)h)[i] = t == gvqBfloat16 ? (uint16_t)(b >> 16) : 0;
            if (t == gvqFloat16) { /* through the host's own conversion: gvqFloat32 -> fp16
                                      via a cast below */
                ((uint16_t *)h)[i] = (uint16_t)(rand() % 0x3bff);
            }
        }
    }
    CHECK(gvqAllReduce(h, want, count, t, (gvqRedOp_t)op, comm, NULL) == gvqSuccess,
          "host allreduce");
    void *d = NULL;
    cudaMalloc(&d, bytes);
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    CHECK(gvqAllReduce(d, d, count, t, (gvqRedOp_t)op, comm, s) == gvqSuccess,
          "device allreduce: %s", gvqGetLastError(comm));
    cudaStreamSynchronize(s);
    cudaMemcpy(got, d, bytes, cudaMemcpyDeviceToHost);
    if (n <= 2 || t == gvqInt32) {
        CHECK(memcmp(got, want, bytes) == 0, "type %d op %d: device result differs from host",
              (int)t, op);
    } else { /* several ranks: summation orders may differ; compare within rounding */
        double e = 0, scale = 0;
        for (size_t i = 0; i < count; i++) {
            double a = value_at(got, t, i), b = value_at(want, t, i);
            if (isnan(a) && isnan(b)) continue;
            e = fmax(e, fabs(a - b));
            scale = fmax(scale, fabs(b));
        }
        double tol = (t == gvqFloat16 ? 4e-3 : t == gvqBfloat16 ? 3e-2 : 1e-5) * (1 + scale);
        CHECK(e <= tol, "type %d op %d: device result differs by %g (tolerance %g)", (int)t, op, e,
              tol);
    }
    /* broadcast from the last rank, out of place, of data that differs between ranks (each
     * rank's own input), so that a local copy cannot pass */
    void *d2 = NULL;
    cudaMalloc(&d2, bytes);
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    CHECK(gvqBroadcast(d, d2, count, t, n - 1, comm, s) == gvqSuccess, "device broadcast");
    cudaStreamSynchronize(s);
    cudaMemcpy(got, d2, bytes, cudaMemcpyDeviceToHost);
    CHECK(gvqBroadcast(h, want, count, t, n - 1, comm, NULL) == gvqSuccess, "host broadcast");
    CHECK(memcmp(got, want, bytes) == 0, "broadcast type %d differs", (int)t);
    cudaFree(d);
    cudaFree(d2);
    free(h);
    free(want);
    free(got);
}

/* compressed allreduce on CUDA buffers, device-resident (the CUDA codecs, only the wire
 * staged; GVQ_DEVICE_CODECS=0 stages whole buffers through the host codecs): two compressors
 * of the same config, one fed host buffers and one device buffers, through warm-up,
 * sampling, the fit and compressed calls. Warm-up and sampling add the same values in the
 * same order (bit for bit); the compressed calls' products come from cuBLAS instead of
 * CBLAS, so they must agree within rounding, and the schedules must agree exactly. */
static void check_compressed(gvqComm_t comm, cudaStream_t s, int rank) {
    const size_t cn = 64 * 200 + 7;
    gvqCompressorConfig_t cc = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cc.codec = gvqCodecGradiveq;
    cc.sliceSize = 64;
    cc.warmupIters = 1;
    cc.sampleIters = 8;
    cc.compressedIters = 8;
    gvqCompressor_t ch = NULL, cd = NULL;
    CHECK(gvqCompressorCreate(comm, cn, &cc, &ch) == gvqSuccess, "host compressor");
    CHECK(gvqCompressorCreate(comm, cn, &cc, &cd) == gvqSuccess, "device compressor");
    float *x = malloc(cn * 4), *want = malloc(cn * 4), *got = malloc(cn * 4), *dx = NULL;
    cudaMalloc((void **)&dx, cn * 4);
    for (int it = 0; it < 14 && ch != NULL && cd != NULL; it++) {
        for (size_t i = 0; i < cn; i++)
            x[i] = (float)(sin(0.01 * (double)(i % 64) * (1 + it % 3) + rank) +
                           0.1 * cos(0.37 * (double)i + it));
        CHECK(gvqAllReduceCompressed(x, want, cn, gvqFloat32, gvqAvg, ch, comm, NULL) == gvqSuccess,
              "host compressed call %d", it);
        cudaMemcpy(dx, x, cn * 4, cudaMemcpyHostToDevice);
        CHECK(gvqAllReduceCompressed(dx, dx, cn, gvqFloat32, gvqAvg, cd, comm, s) == gvqSuccess,
              "device compressed call %d: %s", it, gvqGetLastError(comm));
        cudaStreamSynchronize(s);
        cudaMemcpy(got, dx, cn * 4, cudaMemcpyDeviceToHost);
        gvqCompressorStats_t sh, sd;
        gvqCompressorGetStats(ch, &sh);
        gvqCompressorGetStats(cd, &sd);
        CHECK(sh.phase == sd.phase && sh.fits == sd.fits && sh.dims == sd.dims,
              "compressed call %d: schedules differ (phase %d/%d fits %lld/%lld d %d/%d)", it,
              sh.phase, sd.phase, sh.fits, sd.fits, sh.dims, sd.dims);
        double top = 0, err = 0;
        for (size_t i = 0; i < cn; i++) {
            top = fmax(top, fabs(want[i]));
            err = fmax(err, fabs((double)got[i] - want[i]));
        }
        int exact_phase = it <= cc.warmupIters + cc.sampleIters - 1; /* before the first fit */
        const char *dc = getenv("GVQ_DEVICE_CODECS");
        if (exact_phase || (dc != NULL && atoi(dc) == 0))
            CHECK(memcmp(got, want, cn * 4) == 0,
                  "compressed call %d: device result differs "
                  "(max error %g)",
                  it, err);
        else
            CHECK(err <= 1e-4 * top, "compressed call %d: device result off by %g (max %g)", it,
                  err, top);
    }
    gvqCompressorStats_t st;
    if (cd != NULL) {
        gvqCompressorGetStats(cd, &st);
        CHECK(st.fits >= 1, "the device-fed compressor never fitted (%lld)", st.fits);
    }
    cudaFree(dx);
    free(x);
    free(want);
    free(got);
    if (ch) gvqCompressorDestroy(ch);
    if (cd) gvqCompressorDestroy(cd);
}

/* point-to-point on CUDA buffers (staged through pinned memory): a ring in a group, each
 * rank to the next, device to device and device to host, with an odd size */
static void check_p2p(gvqComm_t comm, cudaStream_t s, int rank, int n) {
    const size_t pn = 300007;
    float *hs = malloc(pn * 4), *hr = malloc(pn * 4), *hr2 = malloc(pn * 4);
    float *ds = NULL, *dr = NULL;
    cudaMalloc((void **)&ds, pn * 4);
    cudaMalloc((void **)&dr, pn * 4);
    for (size_t i = 0; i < pn; i++)
        hs[i] = (float)(rank * 1000003 + (int)i);
    cudaMemcpy(ds, hs, pn * 4, cudaMemcpyHostToDevice);
    cudaMemset(dr, 0, pn * 4);
    memset(hr2, 0, pn * 4);
    int to = (rank + 1) % n, from = (rank + n - 1) % n;
    gvqGroupStart();
    gvqSend(ds, pn, gvqFloat32, to, comm, s);
    gvqRecv(dr, pn, gvqFloat32, from, comm, s);
    gvqSend(ds, pn, gvqFloat32, to, comm, s);
    gvqRecv(hr2, pn, gvqFloat32, from, comm, NULL);
    gvqResult_t pr = gvqGroupEnd();
    CHECK(pr == gvqSuccess, "p2p on CUDA buffers: %s (%s)", gvqGetErrorString(pr),
          gvqGetLastError(comm));
    cudaStreamSynchronize(s);
    cudaMemcpy(hr, dr, pn * 4, cudaMemcpyDeviceToHost);
    size_t bad = 0, bad2 = 0;
    for (size_t i = 0; i < pn; i++) {
        float want = (float)(from * 1000003 + (int)i);
        bad += hr[i] != want;
        bad2 += hr2[i] != want;
    }
    CHECK(bad == 0, "p2p device to device: %zu of %zu values wrong", bad, pn);
    CHECK(bad2 == 0, "p2p device to host: %zu of %zu values wrong", bad2, pn);
    cudaFree(ds);
    cudaFree(dr);
    free(hs);
    free(hr);
    free(hr2);
}

int main(int argc, char **argv) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIPPED: no CUDA device\n");
        return 77;
    }
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    cudaSetDevice(rank % ndev);
    gvqUniqueId id;
    if (rank == 0) gvqGetUniqueId(&id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    gvqComm_t comm;
    CHECK(gvqCommInitRank(&comm, n, id, rank) == gvqSuccess, "init");
    cudaStream_t s;
    cudaStreamCreate(&s);
    const gvqDataType_t types[] = {gvqInt32, gvqFloat16, gvqFloat32, gvqFloat64, gvqBfloat16};
    for (int ti = 0; ti < 5; ti++)
        for (int op = 0; op < gvqNumOps; op++)
            check_type_op(comm, s, rank, n, ti, types[ti], op);
    check_compressed(comm, s, rank);
    check_p2p(comm, s, rank, n);
    cudaStreamDestroy(s);
    gvqCommDestroy(comm);
    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("test_gpu_collectives (%d ranks): %s\n", n, all ? "FAILED" : "all checks passed");
    MPI_Finalize();
    return all ? 1 : 0;
}
