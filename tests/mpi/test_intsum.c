/*
 * test_intsum.c -- integer-summed wires (integerBits) under mpirun, through
 * gvqAllReduceCompressed.
 *
 * Every rank's input is a pure function of (rank, call, index), so each rank regenerates all
 * ranks' inputs and computes, itself, the exact sum and the quantization bound the docs state:
 * a value of block b (a QSGD bucket) ends within N scale_b / lv of the exact sum, with scale_b
 * the largest |x| of the block over all ranks and lv = min(2^(qsgdBits-1) - 1,
 * floor((2^(b-1) - 1) / N)). Nothing is compared with gvq's own output except that all ranks'
 * outputs must be bitwise identical.
 *
 * Parts:
 *   1 qsgd      4-bit QSGD over 8-bit sums and 8-bit QSGD over 16-bit sums: identical outputs,
 *               every value within its bound, the closed-form ratio (1 or 2 bytes a value)
 *   2 headroom  8-bit QSGD over 8-bit sums (lv = floor(127 / N): the accumulator is full):
 *               every rank sends +-scale in every value, so every rank's integer is +-lv and the
 *               sum N lv; the output must be N x (no wrap-around)
 *   3 nan       a NaN in one bucket of one rank: the codec makes that bucket's scale Inf, so the
 *               output is non-finite on every rank and the call is sent again plain (the NaN
 *               where it was fed, the rest the float sum, nonFiniteCalls 1), nothing hangs
 *   4 gradiveq  GradiVeQ with 8- and 16-bit coefficient sums against the fp32-coefficient
 *               compressor fed the same inputs: the same schedule and d, identical outputs, and
 *               per slice ||x_int - x_fp32|| <= sqrt(d) N 2G / lv (G: the largest slice norm of
 *               any rank's input so far, which bounds every coefficient; U is orthonormal); the
 *               int8 wire at least 3x smaller than the fp32 one; GradiVeQ with QSGD sampling over
 *               integer sums: identical, finite outputs, each sampling call within N M / lv of the
 *               exact sum (M: the largest |input|), one fit, the compressed phase within 5%
 */
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gvq.h"
#include "mpitest.h"

#define WATCHDOG_S 100

static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Uniform in [-1, 1) from (rank, call, index, salt). */
static float unif(int rank, int call, size_t i, uint64_t salt) {
    uint64_t h = mix(mix(mix(salt * 1000003u + (uint64_t)rank) + (uint64_t)call) + i);
    return (float)((double)(h >> 11) / 4503599627370496.0 - 1.0);
}

/* ---- QSGD over integer sums ------------------------------------------------------------------ */

/* Rank r's input: uniform values whose bucket b is scaled by 2^(b mod 5 - 2), so the buckets'
 * scales differ. */
static void qsgd_input(int rank, int call, float *x, size_t n, size_t bucket) {
    for (size_t i = 0; i < n; i++)
        x[i] = unif(rank, call, i, 7) * ldexpf(1.0f, (int)((i / bucket) % 5) - 2);
}

static int levels(int qbits, int ibits, int N) {
    int lv = ((1 << (ibits - 1)) - 1) / N, s = (1 << (qbits - 1)) - 1;
    return lv < s ? lv : s;
}

/* Checks out against the exact sum of all ranks' inputs (inputs of all ranks in xs), value by
 * value, with the documented bound. */
static void check_bound(const float *out, const float *xs, size_t n, size_t bucket, int lv,
                        const char *what) {
    int N = mt.nranks, bad = 0;
    for (size_t b0 = 0; b0 < n; b0 += bucket) {
        size_t len = n - b0 < bucket ? n - b0 : bucket;
        double scale = 0;
        for (int r = 0; r < N; r++)
            for (size_t i = 0; i < len; i++)
                scale = fmax(scale, fabs(xs[(size_t)r * n + b0 + i]));
        double bound = N * scale / lv * (1 + 1e-5) + 1e-30;
        for (size_t i = 0; i < len; i++) {
            double exact = 0;
            for (int r = 0; r < N; r++)
                exact += xs[(size_t)r * n + b0 + i];
            double e = fabs(out[b0 + i] - exact);
            if (!(e <= bound) && bad++ < 3)
                MT_FAIL("%s: value %zu is %.9g, exact %.9g: error %.3g above N scale / lv = %.3g",
                        what, b0 + i, out[b0 + i], exact, e, bound);
        }
    }
    mt.checks++;
}

static gvqCompressor_t qsgd_int(gvqComm_t comm, size_t n, int qbits, int ibits, size_t bucket) {
    gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cfg.codec = gvqCodecQsgd;
    cfg.qsgdBits = qbits;
    cfg.qsgdBucket = (int)bucket;
    cfg.integerBits = ibits;
    cfg.seed = 5;
    gvqCompressor_t c = NULL;
    MT_OK(gvqCompressorCreate(comm, n, &cfg, &c));
    return c;
}

static void part_qsgd(gvqComm_t comm) {
    mt_part("1 qsgd: 4-bit over int8, 8-bit over int16: identical, bounded, ratio", WATCHDOG_S);
    int N = mt.nranks;
    const size_t n = 3000, bucket = 512;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    float *xs = malloc(sizeof(float) * n * (size_t)N);
    int cases[2][2] = {{4, 8}, {8, 16}};
    for (int k = 0; k < 2; k++) {
        int qb = cases[k][0], ib = cases[k][1], lv = levels(qb, ib, N);
        gvqCompressor_t c = qsgd_int(comm, n, qb, ib, bucket);
        for (int call = 0; call < 3; call++) {
            for (int r = 0; r < N; r++)
                qsgd_input(r, 10 * k + call, xs + (size_t)r * n, n, bucket);
            memcpy(x, xs + (size_t)mt.rank * n, sizeof(float) * n);
            MT_OK(gvqAllReduceCompressed(x, y, n, gvqFloat32, gvqSum, c, comm, NULL));
            char what[80];
            snprintf(what, sizeof what, "qsgd %d-bit over int%d, call %d", qb, ib, call);
            MT_CHECK(mt_identical(y, sizeof(float) * n), "%s: outputs differ between ranks", what);
            check_bound(y, xs, n, bucket, lv, what);
        }
        gvqCompressorStats_t st;
        MT_OK(gvqCompressorGetStats(c, &st));
        double ratio = (double)(n * 4) / (double)((n * (size_t)(ib / 8) + 3) / 4 * 4);
        MT_CHECK(fabs(st.ratio - ratio) <= 1e-9 * ratio, "qsgd over int%d: ratio %.6g, want %.6g",
                 ib, st.ratio, ratio);
        if (mt.rank == 0)
            printf("   qsgd %d-bit over int%d: lv %d, ratio %.3f\n", qb, ib, lv, st.ratio);
        MT_OK(gvqCompressorDestroy(c));
    }
    free(x);
    free(y);
    free(xs);
}

static void part_headroom(gvqComm_t comm) {
    mt_part("2 headroom: a full 8-bit accumulator does not wrap", WATCHDOG_S);
    int N = mt.nranks, lv = levels(8, 8, N);
    const size_t n = 1000, bucket = 100;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) /* every value is its bucket's max: integer +-lv exactly */
        x[i] = ((i / 7) % 2 ? -1.0f : 1.0f) * ldexpf(1.0f, (int)(i / bucket) - 3);
    gvqCompressor_t c = qsgd_int(comm, n, 8, 8, bucket);
    MT_OK(gvqAllReduceCompressed(x, y, n, gvqFloat32, gvqSum, c, comm, NULL));
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double want = (double)N * x[i];
        if (!(fabs(y[i] - want) <= 1e-6 * fabs(want)) && bad++ < 3)
            MT_FAIL("headroom: value %zu is %g, want %g = %d x %g (N lv = %d of 127)", i, y[i],
                    want, N, x[i], N * lv);
    }
    mt.checks++;
    MT_CHECK(N * lv <= 127, "headroom: N lv = %d exceeds 127", N * lv);
    MT_OK(gvqCompressorDestroy(c));
    free(x);
    free(y);
}

static void part_nan(gvqComm_t comm) {
    mt_part("3 nan: one rank's NaN: the plain sum everywhere", WATCHDOG_S);
    int N = mt.nranks;
    const size_t n = 2048, bucket = 256;
    const long nan_bucket = 3;
    float *xs = malloc(sizeof(float) * n * (size_t)N), *y = malloc(sizeof(float) * n);
    for (int r = 0; r < N; r++)
        qsgd_input(r, 99, xs + (size_t)r * n, n, bucket);
    xs[(size_t)(N - 1) * n + (size_t)nan_bucket * bucket + 17] = NAN;
    gvqCompressor_t c = qsgd_int(comm, n, 4, 8, bucket);
    MT_OK(
        gvqAllReduceCompressed(xs + (size_t)mt.rank * n, y, n, gvqFloat32, gvqSum, c, comm, NULL));
    MT_CHECK(mt_identical(y, sizeof(float) * n), "nan: outputs differ between ranks");
    /* the codec gives the bucket an Inf scale, so the ring's output is non-finite on every rank
     * and the call is sent again plain: NaN where it was fed, the other values the float sum */
    const size_t at = (size_t)nan_bucket * bucket + 17;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double exact = 0, abs = 0;
        for (int r = 0; r < N; r++) {
            exact += xs[(size_t)r * n + i];
            abs += fabs(xs[(size_t)r * n + i]);
        }
        int ok = i == at ? isnan(y[i]) : fabs(y[i] - exact) <= abs * N * 1.2e-7;
        if (!ok && bad++ < 3)
            MT_FAIL("nan: value %zu is %.9g, want %s %.9g", i, y[i], i == at ? "NaN, not" : "",
                    exact);
    }
    mt.checks++;
    gvqCompressorStats_t st;
    MT_OK(gvqCompressorGetStats(c, &st));
    MT_CHECK(st.nonFiniteCalls == 1, "nan: nonFiniteCalls %lld, want 1", st.nonFiniteCalls);
    MT_OK(gvqCompressorDestroy(c));
    free(xs);
    free(y);
}

/* ---- GradiVeQ over integer sums ----------------------------------------------------------- */

#define GVQ_TEST_MIN(a, b) ((a) < (b) ? (a) : (b))
#define GQ_L 32
#define GQ_R 4
#define GQ_SLICES 40
#define GQ_TAIL 7

/* Rank r's input at a call: every full slice in span(B_0..B_3), fixed unit-free directions,
 * with per-rank, per-call coefficients; a random tail. */
static void gq_input(int rank, int call, float *x) {
    for (size_t s = 0; s < GQ_SLICES; s++)
        for (size_t i = 0; i < GQ_L; i++) {
            double v = 0;
            for (int j = 0; j < GQ_R; j++)
                v += (1.0 + 0.3 * unif(rank, call, s * GQ_R + (size_t)j, 11)) *
                     unif(0, 0, (size_t)j * GQ_L + i, 13);
            x[s * GQ_L + i] = (float)v;
        }
    for (size_t i = 0; i < GQ_TAIL; i++)
        x[GQ_SLICES * GQ_L + i] = unif(rank, call, i, 17);
}

static double slice_norm(const float *x, size_t s) {
    double a = 0;
    for (size_t i = 0; i < GQ_L; i++)
        a += (double)x[s * GQ_L + i] * x[s * GQ_L + i];
    return sqrt(a);
}

/* GradiVeQ on GQ_L slices: 6 sampling calls (every slice a sample) through sample_codec, then
 * compressed calls without the vote, over integer sums of `bits` (0: fp32). */
static gvqCompressorConfig_t gq_config(int sample_codec, int bits) {
    gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cfg.codec = gvqCodecGradiveq;
    cfg.sampleCodec = sample_codec;
    cfg.sliceSize = GQ_L;
    cfg.warmupIters = 0;
    cfg.sampleIters = 6;
    cfg.compressedIters = 5;
    cfg.sampleSlices = 0;
    cfg.voteThreshold = 2.0f;
    cfg.lossThreshold = 1e-3f;
    cfg.integerBits = bits;
    return cfg;
}

/* QSGD-int sampling, then GradiVeQ over integer sums (int8 and int16): identical finite
 * outputs, each sampling call within N M / lv of the exact sum, one fit, the compressed phase
 * near the sum. x, yi, yf and xr: n floats each (scratch). */
static void sampling_pair(gvqComm_t comm, size_t n, float *x, float *yi, float *yf, float *xr) {
    int N = mt.nranks;
    int bits[2] = {8, 16};
    for (int k = 0; k < 2; k++) { /* QSGD-int sampling, then GradiVeQ over integer sums */
        gvqCompressorConfig_t cfg = gq_config(gvqCodecQsgd, bits[k]);
        gvqCompressor_t pair;
        MT_OK(gvqCompressorCreate(comm, n, &cfg, &pair));
        /* QSGD's levels (4 bits: 7) capped by the wire's headroom */
        int lv = GVQ_TEST_MIN(((1 << (bits[k] - 1)) - 1) / N, 7);
        double worst[2] = {0, 0};
        for (int call = 0; call < 11; call++) {
            double M = 0, e2 = 0, s2 = 0, emax = 0;
            for (size_t i = 0; i < n; i++)
                yf[i] = 0; /* the exact sum */
            for (int r = 0; r < N; r++) {
                gq_input(r, call, xr);
                for (size_t i = 0; i < n; i++) {
                    yf[i] += xr[i];
                    M = fmax(M, fabs(xr[i]));
                }
                if (r == mt.rank) memcpy(x, xr, sizeof(float) * n);
            }
            gvqCompressorStats_t st;
            MT_OK(gvqCompressorGetStats(pair, &st));
            int compressed = st.phase == gvqPhaseCompressed;
            MT_CHECK(compressed == (call >= 6), "qsgd-int sampling, int%d, call %d: phase %d",
                     bits[k], call, st.phase);
            MT_OK(gvqAllReduceCompressed(x, yi, n, gvqFloat32, gvqSum, pair, comm, NULL));
            MT_CHECK(mt_identical(yi, sizeof(float) * n),
                     "qsgd-int sampling, int%d, call %d: outputs differ between ranks", bits[k],
                     call);
            for (size_t i = 0; i < n; i++) {
                double e = fabs((double)yi[i] - yf[i]);
                MT_CHECK(isfinite(yi[i]), "qsgd-int sampling, int%d, call %d: value %zu is %g",
                         bits[k], call, i, yi[i]);
                emax = fmax(emax, e);
                e2 += e * e;
                s2 += (double)yf[i] * yf[i];
            }
            if (!compressed) /* each rank's rounding below one level of its block's scale */
                MT_CHECK(emax <= N * M / lv * (1 + 1e-4),
                         "qsgd-int sampling, int%d, call %d: error %.4g above N M / lv = %.4g",
                         bits[k], call, emax, N * M / lv);
            worst[compressed] = fmax(worst[compressed], sqrt(e2 / s2));
        }
        gvqCompressorStats_t st;
        MT_OK(gvqCompressorGetStats(pair, &st));
        MT_CHECK(st.fits == 1 && st.fitsRefused == 0 && st.nonFiniteCalls == 0,
                 "qsgd-int sampling, int%d: fits %lld, refused %lld, non-finite calls %lld",
                 bits[k], st.fits, st.fitsRefused, st.nonFiniteCalls);
        /* the basis is fitted to QSGD sums, but the input has rank GQ_R per slice and the noise
         * only adds directions: the compressed phase stays far below the sampling error (measured
         * 0.003 at int8 on 4 and 5 ranks) */
        MT_CHECK(worst[1] <= 0.05 && worst[1] < worst[0],
                 "qsgd-int sampling, int%d: compressed-phase relative error %.4g (sampling %.4g)",
                 bits[k], worst[1], worst[0]);
        if (mt.rank == 0)
            printf("   qsgd-int sampling then gradiveq over int%d: relative error sampling %.4f, "
                   "compressed %.4f\n",
                   bits[k], worst[0], worst[1]);
        MT_OK(gvqCompressorDestroy(pair));
    }
}

static void part_gradiveq(gvqComm_t comm) {
    mt_part("4 gradiveq: int8 and int16 coefficient sums against fp32 coefficients", WATCHDOG_S);
    int N = mt.nranks;
    const size_t n = GQ_SLICES * GQ_L + GQ_TAIL;
    float *x = malloc(sizeof(float) * n), *yi = malloc(sizeof(float) * n);
    float *yf = malloc(sizeof(float) * n), *xr = malloc(sizeof(float) * n);
    int bits[2] = {8, 16};
    sampling_pair(comm, n, x, yi, yf, xr);
    for (int k = 0; k < 2; k++) {
        gvqCompressor_t c[2];
        for (int v = 0; v < 2; v++) {
            gvqCompressorConfig_t cfg = gq_config(gvqCodecNone, v ? bits[k] : 0);
            MT_OK(gvqCompressorCreate(comm, n, &cfg, &c[v]));
        }
        int lv = ((1 << (bits[k] - 1)) - 1) / N;
        double G = 0, tail_scale = 0;
        unsigned long long wire[2] = {0, 0};
        for (int call = 0; call < 11; call++) {
            for (int r = 0; r < N; r++) {
                gq_input(r, call, xr);
                for (size_t s = 0; s < GQ_SLICES; s++)
                    G = fmax(G, slice_norm(xr, s));
                if (r == mt.rank) memcpy(x, xr, sizeof(float) * n);
            }
            gvqCompressorStats_t st[2];
            unsigned long long before[2];
            for (int v = 0; v < 2; v++) {
                MT_OK(gvqCompressorGetStats(c[v], &st[v]));
                before[v] = st[v].wireBytes;
            }
            int compressed = st[0].phase == gvqPhaseCompressed;
            MT_OK(gvqAllReduceCompressed(x, yf, n, gvqFloat32, gvqSum, c[0], comm, NULL));
            MT_OK(gvqAllReduceCompressed(x, yi, n, gvqFloat32, gvqSum, c[1], comm, NULL));
            for (int v = 0; v < 2; v++)
                MT_OK(gvqCompressorGetStats(c[v], &st[v]));
            char what[80];
            snprintf(what, sizeof what, "gradiveq over int%d, call %d", bits[k], call);
            MT_CHECK(mt_identical(yi, sizeof(float) * n), "%s: outputs differ between ranks", what);
            MT_CHECK(st[0].phase == st[1].phase && st[0].dims == st[1].dims,
                     "%s: phase %d / %d, d %d / %d differ between fp32 and int", what, st[0].phase,
                     st[1].phase, st[0].dims, st[1].dims);
            if (!compressed) {
                MT_CHECK(memcmp(yf, yi, sizeof(float) * n) == 0,
                         "%s: exact phase differs between fp32 and int compressors", what);
                continue;
            }
            wire[0] += st[0].wireBytes - before[0];
            wire[1] += st[1].wireBytes - before[1];
            double bound = sqrt((double)st[1].dims) * N * 2 * G / lv * (1 + 1e-4);
            for (size_t s = 0; s < GQ_SLICES; s++) {
                double e = 0;
                for (size_t i = 0; i < GQ_L; i++)
                    e += pow((double)yi[s * GQ_L + i] - yf[s * GQ_L + i], 2);
                MT_CHECK(sqrt(e) <= bound, "%s: slice %zu differs by %.4g, bound %.4g", what, s,
                         sqrt(e), bound);
            }
            tail_scale = 0;
            for (int r = 0; r < N; r++) {
                gq_input(r, call, xr);
                for (size_t i = 0; i < GQ_TAIL; i++)
                    tail_scale = fmax(tail_scale, fabs(xr[GQ_SLICES * GQ_L + i]));
            }
            for (size_t i = GQ_SLICES * GQ_L; i < n; i++)
                MT_CHECK(fabs(yi[i] - yf[i]) <= N * tail_scale / lv * (1 + 1e-4) + 1e-6,
                         "%s: tail value %zu: %g vs %g", what, i, yi[i], yf[i]);
        }
        MT_CHECK(N == 1 || (wire[1] > 0 &&
                            (bits[k] == 16 ? 1.5 : 3.0) * (double)wire[1] <= (double)wire[0]),
                 "gradiveq over int%d: compressed-phase wire %llu bytes vs fp32 %llu", bits[k],
                 wire[1], wire[0]);
        if (mt.rank == 0)
            printf("   gradiveq over int%d: compressed-phase bytes %llu (fp32 coefficients %llu)\n",
                   bits[k], wire[1], wire[0]);
        for (int v = 0; v < 2; v++)
            MT_OK(gvqCompressorDestroy(c[v]));
    }
    free(x);
    free(yi);
    free(yf);
    free(xr);
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    gvqComm_t comm = mt_new_comm();
    part_qsgd(comm);
    part_headroom(comm);
    part_nan(comm);
    part_gradiveq(comm);
    MT_OK(gvqCommDestroy(comm));
    alarm(0);
    return mt_finish("intsum");
}
