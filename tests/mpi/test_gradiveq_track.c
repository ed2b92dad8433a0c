/*
 * test_gradiveq_track.c -- GradiVeQ with a tracked basis (basisUpdate gvqBasisTrack) through
 * gvqAllReduceCompressed on real MPI ranks:
 *
 *   1 reference   every rank recomputes each call in double from all ranks' regenerable inputs,
 *                 the basis U and the residuals (read from gvqCompressorSave's documented layout:
 *                 the residual, then U, at the end; residuals gathered with MPI), with its own
 *                 filter collocation: C0 = sum S_j U, B = sum S_j^T C0, the call's basis
 *                 U' = orth(B), C = sum S_j U', y = C U'^T, this rank's clipped residual
 *                 S_me - S_me U' U'^T (the kept U' read back from the saved state); outputs
 *                 bitwise identical on every rank; ratio and wire bytes; a conv tensor and a
 *                 flat one
 *   2 subspace    no error feedback: slices spanning two directions, d = 2: the tracked basis
 *                 finds them and the sum comes back exact; gvqAvg = gvqSum / N; on the integer
 *                 wires (integerBits 8, 16) within 4 N / lv of the sum (lv = (2^(b-1) - 1) / N
 *                 levels a rank: codec_intsum.c), identical on every rank, and b / 32 of the
 *                 fp32 wire's bytes (with the scales' agreement)
 *   (error feedback, bounded and helping: test_compressed_powersgd.c's part 3)
 *   3 save/load   a compressor restored from a saved state continues bitwise (fp32 and int8)
 *   4 NaN         a NaN on one rank: the plain sum on every rank, later calls finite
 *   5 config      refusals (codec, fp16 wire, d > L, unknown basisUpdate) and a tensor too small to
 *                 pay for its basis sent exactly
 *   6 group       tracked-basis calls inside gvqGroupStart/End run fused (one call, three
 *                 rings): conv, flat, too-small and QSGD tensors together, fp32 and int8, a NaN
 *                 in one tensor on one rank: identical on every rank, within 1e-4 of the same
 *                 calls made one by one (fp32; the ring's summation order differs), the NaN
 *                 tensor's plain sum, and a rank that groups differently fails on every rank
 *   zerocode      (argument, GVQ_CODEC=gradiveq GVQ_GRADIVEQ_BASIS=track) plain gvqAllReduce
 *                 through a tracked basis: exact on two-direction data, identical, its stats
 */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>

#include "compressor_ref.h"

/* Rank j's gradient at call t: smooth components weighted by rank and call, plus noise. */
static float grad_val(int j, int t, size_t i) {
    double v = 0;
    const double c[3] = {4, 2, 1};
    for (int q = 0; q < 3; q++)
        v += c[q] * (1 + 0.3 * cref_rand(7, (uint64_t)j, (uint64_t)t, (uint64_t)q)) *
             sin(0.37 * (double)(q + 1) * (double)(i % 23 + 1)) *
             cos(0.21 * (double)(q + 2) * (double)(i / 23 + 1));
    return (float)(v + 0.05 * cref_rand(3, (uint64_t)j, (uint64_t)t, i));
}

static gvqCompressorConfig_t track_cfg(int d, int L, int K, int D, int H, int W) {
    gvqCompressorConfig_t cfg = cref_config(gvqCodecGradiveq, 5, K, D, H, W);
    cfg.basisUpdate = gvqBasisTrack;
    cfg.maxDims = d;
    if (L > 0) cfg.sliceSize = L;
    return cfg;
}

/* Where element i of a [K][D][H][W] tensor sits in the collocated order (include/gvq.h's
 * GradiVeQ: the K filters' values at one (d, h, w) side by side). */
static size_t colloc_index(size_t i, int K, int D, int H, int W) {
    if (K <= 1) return i;
    size_t w = i % (size_t)W, h = i / (size_t)W % (size_t)H, d = i / ((size_t)W * H) % (size_t)D,
           k = i / ((size_t)W * H * D);
    return ((h * (size_t)W + w) * (size_t)D + d) * (size_t)K + k;
}

/* ---- part 1 -----------------------------------------------------------------------------------
 */

static void part_reference(const char *title, size_t count, int L, int d, int K, int D, int H,
                           int W, float ef_bound, int calls) {
    if (mt.rank == 0) printf("-- %s\n", title);
    gvqComm_t comm = mt_new_comm();
    int N = mt.nranks;
    size_t n = (count + (size_t)L - 1) / (size_t)L, nL = n * (size_t)L, Ld = (size_t)L * d;
    gvqCompressorConfig_t cfg = track_cfg(d, L, K, D, H, W);
    cfg.efBound = ef_bound;
    gvqCompressor_t c = NULL;
    MT_OK(gvqCompressorCreate(comm, count, &cfg, &c));
    float *g = malloc(4 * count), *y = malloc(4 * count), *U = malloc(4 * Ld);
    float *e = malloc(4 * count), *eall = malloc(4 * count * (size_t)N), *Unew = malloc(4 * Ld);
    double *S = calloc(nL * (size_t)N, sizeof(double)), *C = malloc(sizeof(double) * n * d);
    double *B = malloc(sizeof(double) * Ld), *Cme = malloc(sizeof(double) * n * d);
    unsigned long long wire_prev = 0;
    for (int t = 0; t < calls; t++) {
        cref_saved_tail(c, count, Ld, e, U);
        MPI_Allgather(e, (int)count, MPI_FLOAT, eall, (int)count, MPI_FLOAT, MPI_COMM_WORLD);
        for (size_t i = 0; i < count; i++)
            g[i] = grad_val(mt.rank, t, i);
        MT_OK(gvqAllReduceCompressed(g, y, count, gvqFloat32, gvqSum, c, comm, NULL));
        MT_CHECK(mt_identical(y, 4 * count), "%s call %d: outputs differ between ranks", title, t);
        /* S_j: g_j + e_j collocated, as nslices x L rows, zero-padded */
        memset(S, 0, sizeof(double) * nL * (size_t)N);
        for (int j = 0; j < N; j++)
            for (size_t i = 0; i < count; i++)
                S[(size_t)j * nL + colloc_index(i, K, D, H, W)] =
                    (double)(grad_val(j, t, i) + eall[(size_t)j * count + i]);
        /* C0 = sum_j S_j U (U the basis before the call), B = sum_j S_j^T C0, orth(B) */
        memset(C, 0, sizeof(double) * n * d);
        memset(B, 0, sizeof(double) * Ld);
        for (int j = 0; j < N; j++)
            for (size_t a = 0; a < n; a++)
                for (int k = 0; k < d; k++)
                    for (size_t b = 0; b < (size_t)L; b++)
                        C[(size_t)k * n + a] +=
                            S[(size_t)j * nL + a * L + b] * U[(size_t)k * L + b];
        for (int j = 0; j < N; j++)
            for (size_t a = 0; a < n; a++)
                for (int k = 0; k < d; k++)
                    for (size_t b = 0; b < (size_t)L; b++)
                        B[(size_t)k * L + b] +=
                            S[(size_t)j * nL + a * L + b] * C[(size_t)k * n + a];
        cref_orth(B, (size_t)L, (size_t)d);
        float *enew = e;
        cref_saved_tail(c, count, Ld, enew, Unew);
        double uw = 0;
        for (size_t i = 0; i < Ld; i++)
            uw = fmax(uw, fabs((double)Unew[i] - B[i]));
        MT_CHECK(uw <= 1e-3, "%s call %d: the call's basis is off orth(B) by %g", title, t, uw);
        /* C = sum_j S_j U' with U' the library's new basis (kept), y = C U'^T */
        memset(C, 0, sizeof(double) * n * d);
        for (int j = 0; j < N; j++)
            for (size_t a = 0; a < n; a++)
                for (int k = 0; k < d; k++) {
                    double s = 0;
                    for (size_t b = 0; b < (size_t)L; b++)
                        s += S[(size_t)j * nL + a * L + b] * Unew[(size_t)k * L + b];
                    C[(size_t)k * n + a] += s;
                    if (j == mt.rank) Cme[(size_t)k * n + a] = s;
                }
        double worst = 0, scale = 0;
        for (size_t i = 0; i < count; i++) {
            size_t p = colloc_index(i, K, D, H, W), a = p / (size_t)L, b = p % (size_t)L;
            double s = 0;
            for (int k = 0; k < d; k++)
                s += C[(size_t)k * n + a] * Unew[(size_t)k * L + b];
            scale = fmax(scale, fabs(s));
            worst = fmax(worst, fabs((double)y[i] - s));
        }
        MT_CHECK(worst <= 2e-4 * scale + 1e-6,
                 "%s call %d: output off the reference by %g (scale %g)", title, t, worst, scale);
        /* this rank's residual S_me - C_me U'^T, back in tensor order, clipped against ||g|| */
        double er2 = 0, gn = cref_norm(g, count), *r = malloc(sizeof(double) * count);
        for (size_t i = 0; i < count; i++) {
            size_t p = colloc_index(i, K, D, H, W), a = p / (size_t)L, b = p % (size_t)L;
            double s = 0;
            for (int k = 0; k < d; k++)
                s += Cme[(size_t)k * n + a] * Unew[(size_t)k * L + b];
            r[i] = S[(size_t)mt.rank * nL + p] - s;
            er2 += r[i] * r[i];
        }
        double f = sqrt(er2) > ef_bound * gn ? ef_bound * gn / sqrt(er2) : 1.0, ew = 0;
        for (size_t i = 0; i < count; i++)
            ew = fmax(ew, fabs((double)enew[i] - f * r[i]));
        free(r);
        MT_CHECK(ew <= 1e-3 * scale + 1e-6, "%s call %d: residual off the reference by %g", title,
                 t, ew);
        MT_CHECK(cref_norm(enew, count) <= ef_bound * gn * (1 + 1e-5),
                 "%s call %d: ||e|| = %g > efBound ||g|| = %g", title, t, cref_norm(enew, count),
                 ef_bound * gn);
        gvqCompressorStats_t st;
        MT_OK(gvqCompressorGetStats(c, &st));
        double ratio = (double)nL / (double)((2 * n + (size_t)L) * (size_t)d);
        MT_CHECK(st.ratio == ratio && st.dims == d && st.phase == gvqPhasePlain &&
                     st.iteration == t + 1,
                 "%s call %d: stats ratio %g (want %g) dims %d phase %d iteration %lld", title, t,
                 st.ratio, ratio, st.dims, st.phase, st.iteration);
        unsigned long long w = st.wireBytes - wire_prev, wsum = 0;
        wire_prev = st.wireBytes;
        MPI_Allreduce(&w, &wsum, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        unsigned long long want = 2ull * (unsigned long long)(N - 1) * (2 * n + (size_t)L) * d * 4;
        MT_CHECK(wsum == want, "%s call %d: wire bytes over the ranks %llu, want %llu", title, t,
                 wsum, want);
    }
    MT_OK(gvqCompressorDestroy(c));
    MT_OK(gvqCommDestroy(comm));
    free(g), free(y), free(U), free(e), free(eall), free(Unew), free(S), free(C), free(B),
        free(Cme);
}

/* ---- part 2 -----------------------------------------------------------------------------------
 */

/* The relative error of the last of 12 calls; *ratio: fp32 wire bytes over this one's. */
static double subspace_run(int bits, double *wire) {
    gvqComm_t comm = mt_new_comm();
    const size_t L = 24, n = 40, count = L * n;
    int N = mt.nranks;
    double *v = malloc(sizeof(double) * 2 * L), *ref = malloc(sizeof(double) * count);
    float *g = malloc(4 * count), *y = malloc(4 * count), *ya = malloc(4 * count);
    for (size_t i = 0; i < 2 * L; i++)
        v[i] = cref_rand(9, i, 0, 0);
    gvqCompressorConfig_t cfg = track_cfg(2, (int)L, 0, 0, 0, 0);
    cfg.errorFeedback = 0;
    cfg.integerBits = bits;
    gvqCompressor_t cs = NULL, ca = NULL;
    MT_OK(gvqCompressorCreate(comm, count, &cfg, &cs));
    MT_OK(gvqCompressorCreate(comm, count, &cfg, &ca));
    double err = 1;
    for (int t = 0; t < 12; t++) {
        /* every slice a combination of v0 and v1, different on every rank and call */
        double rn = 0;
        memset(ref, 0, sizeof(double) * count);
        for (int j = 0; j < N; j++)
            for (size_t a = 0; a < n; a++) {
                double c0 = cref_rand(1, (uint64_t)j, (uint64_t)t, a);
                double c1 = 0.5 * cref_rand(2, (uint64_t)j, (uint64_t)t, a);
                for (size_t b = 0; b < L; b++) {
                    float x = (float)(c0 * v[b] + c1 * v[L + b]);
                    if (j == mt.rank) g[a * L + b] = x;
                    ref[a * L + b] += x;
                }
            }
        MT_OK(gvqAllReduceCompressed(g, y, count, gvqFloat32, gvqSum, cs, comm, NULL));
        MT_OK(gvqAllReduceCompressed(g, ya, count, gvqFloat32, gvqAvg, ca, comm, NULL));
        MT_CHECK(mt_identical(y, 4 * count), "subspace call %d: outputs differ between ranks", t);
        int avg_ok = 1;
        double e2 = 0;
        for (size_t i = 0; i < count; i++) {
            avg_ok &= ya[i] == y[i] / (float)N;
            e2 += (y[i] - ref[i]) * (y[i] - ref[i]);
            rn += ref[i] * ref[i];
        }
        MT_CHECK(avg_ok, "subspace call %d: gvqAvg is not gvqSum / N", t);
        err = sqrt(e2 / rn);
    }
    gvqCompressorStats_t st;
    MT_OK(gvqCompressorGetStats(cs, &st));
    *wire = (double)st.wireBytes;
    MT_OK(gvqCompressorDestroy(cs));
    MT_OK(gvqCompressorDestroy(ca));
    MT_OK(gvqCommDestroy(comm));
    free(v), free(ref), free(g), free(y), free(ya);
    return err;
}

static void part_subspace(void) {
    if (mt.rank == 0)
        printf("-- 2 subspace: two directions found, the sum exact (fp32) or "
               "within the integer wires' levels\n");
    double w32 = 0, err = subspace_run(0, &w32);
    MT_CHECK(err < 1e-5, "after 12 calls the two-direction sum is off by %g (relative)", err);
    for (int bits = 8; bits <= 16; bits += 8) {
        double w = 0, lv = (double)(((1 << (bits - 1)) - 1) / mt.nranks);
        err = subspace_run(bits, &w);
        if (mt.rank == 0)
            printf("   int%d: relative error %.3g (bound %.3g), %.3f of fp32's bytes\n", bits, err,
                   4.0 * mt.nranks / lv, w / w32);
        MT_CHECK(err < 4.0 * mt.nranks / lv,
                 "int%d wire: the two-direction sum is off by %g "
                 "(relative), above 4 N / lv = %g",
                 bits, err, 4.0 * mt.nranks / lv);
        if (mt.nranks > 1) /* the payload shrinks by bits / 32; the scale agreement adds a bit */
            MT_CHECK(w < w32 * (bits / 32.0 + 0.1) && w > w32 * bits / 32.0 * 0.9,
                     "int%d wire: %.0f bytes against fp32's %.0f", bits, w, w32);
    }
}

/* ---- part 3 -----------------------------------------------------------------------------------
 */

static void fill_saveload(float *g, size_t count, int t) {
    for (size_t i = 0; i < count; i++)
        g[i] = grad_val(mt.rank, t, i);
}

static void part_saveload(void) {
    if (mt.rank == 0) printf("-- 3 save/load continues bitwise\n");
    gvqComm_t comm = mt_new_comm();
    const size_t count = 16 * 8 * 9;
    gvqCompressorConfig_t cfg = track_cfg(3, 0, 16, 8, 3, 3);
    size_t sz = 0;
    char *blob = cref_resume(comm, &cfg, count, 10, 4, fill_saveload, &sz);
    /* a flipped byte in the saved U is refused (the checksum), the compressor unchanged */
    gvqCompressor_t c = NULL;
    MT_OK(gvqCompressorCreate(comm, count, &cfg, &c));
    blob[sz - 3] ^= 0x10;
    MT_EXPECT_RES(gvqCompressorLoad(c, blob, sz), gvqInvalidArgument);
    MT_OK(gvqCompressorDestroy(c));
    free(blob);
    cfg.integerBits = 8; /* the integer wire's rounding bits follow the call count */
    free(cref_resume(comm, &cfg, count, 10, 4, fill_saveload, &sz));
    MT_OK(gvqCommDestroy(comm));
}

/* ---- part 4 -----------------------------------------------------------------------------------
 */

static void part_nan(void) {
    if (mt.rank == 0) printf("-- 4 NaN: the plain sum, later calls finite\n");
    gvqComm_t comm = mt_new_comm();
    const size_t count = 1000;
    gvqCompressorConfig_t cfg = track_cfg(2, 0, 0, 0, 0, 0);
    gvqCompressor_t c = NULL;
    MT_OK(gvqCompressorCreate(comm, count, &cfg, &c));
    float *g = malloc(4 * count), *y = malloc(4 * count);
    for (int t = 0; t < 4; t++) {
        for (size_t i = 0; i < count; i++)
            g[i] = grad_val(mt.rank, t, i);
        if (t == 1 && mt.rank == mt.nranks - 1) g[7] = NAN;
        MT_OK(gvqAllReduceCompressed(g, y, count, gvqFloat32, gvqSum, c, comm, NULL));
        MT_CHECK(mt_identical(y, 4 * count), "NaN call %d: outputs differ between ranks", t);
        int finite = 1;
        for (size_t i = 0; i < count; i++)
            finite &= i == 7 && t == 1 ? isnan(y[i]) : isfinite(y[i]) != 0;
        MT_CHECK(finite, "call %d: %s", t,
                 t == 1 ? "the NaN is not where it was fed, or others are not finite"
                        : "a non-finite value in a clean call");
    }
    gvqCompressorStats_t st;
    MT_OK(gvqCompressorGetStats(c, &st));
    MT_CHECK(st.nonFiniteCalls == 1, "nonFiniteCalls %lld, want 1", st.nonFiniteCalls);
    MT_OK(gvqCompressorDestroy(c));
    MT_OK(gvqCommDestroy(comm));
    free(g), free(y);
}

/* ---- part 5 -----------------------------------------------------------------------------------
 */

static void part_config(void) {
    if (mt.rank == 0) printf("-- 5 config refusals; a tensor too small for its basis\n");
    gvqComm_t comm = mt_new_comm();
    gvqCompressor_t c = NULL;
    gvqCompressorConfig_t cfg = track_cfg(2, 0, 0, 0, 0, 0);
    cfg.codec = gvqCodecQsgd;
    MT_EXPECT_RES(gvqCompressorCreate(comm, 1000, &cfg, &c), gvqInvalidArgument);
    cfg = track_cfg(2, 0, 0, 0, 0, 0);
    cfg.integerBits = 12;
    MT_EXPECT_RES(gvqCompressorCreate(comm, 1000, &cfg, &c), gvqInvalidArgument);
    cfg = track_cfg(2, 0, 0, 0, 0, 0);
    cfg.wireType = gvqFloat16;
    MT_EXPECT_RES(gvqCompressorCreate(comm, 1000, &cfg, &c), gvqInvalidArgument);
    cfg = track_cfg(33, 32, 0, 0, 0, 0);
    MT_EXPECT_RES(gvqCompressorCreate(comm, 1000, &cfg, &c), gvqInvalidArgument);
    cfg = track_cfg(2, 0, 0, 0, 0, 0);
    cfg.basisUpdate = 2;
    MT_EXPECT_RES(gvqCompressorCreate(comm, 1000, &cfg, &c), gvqInvalidArgument);
    MT_CHECK(c == NULL, "a refused create wrote the handle");
    /* a tensor shorter than an explicit slice is made (and sent plain, below's rule); a maxDims
     * above the fitted default L but within the tracked L is accepted */
    cfg = track_cfg(4, 128, 0, 0, 0, 0);
    MT_OK(gvqCompressorCreate(comm, 100, &cfg, &c));
    MT_OK(gvqCompressorDestroy(c));
    cfg = track_cfg(300, 0, 0, 0, 0, 0); /* 1e6 values: L = 1000 */
    MT_OK(gvqCompressorCreate(comm, 1000000, &cfg, &c));
    MT_OK(gvqCompressorDestroy(c));
    c = NULL;
    /* 144 floats, L 12: d 2 would send (2 12 + 12) 2 = 72 and pay; d 4 sends 144: plain */
    const size_t count = 144;
    float g[144], y[144];
    for (size_t i = 0; i < count; i++)
        g[i] = (float)(mt.rank + 1) * 0.25f * (float)(i % 7);
    cfg = track_cfg(4, 0, 0, 0, 0, 0);
    MT_OK(gvqCompressorCreate(comm, count, &cfg, &c));
    MT_OK(gvqAllReduceCompressed(g, y, count, gvqFloat32, gvqSum, c, comm, NULL));
    int exact = 1;
    float tri = (float)(mt.nranks * (mt.nranks + 1) / 2) * 0.25f;
    for (size_t i = 0; i < count; i++)
        exact &= y[i] == tri * (float)(i % 7);
    gvqCompressorStats_t st;
    MT_OK(gvqCompressorGetStats(c, &st));
    MT_CHECK(exact && st.ratio == 1.0 && st.reason[0] != '\0',
             "a tensor too small for its basis: exact %d ratio %g reason '%s'", exact, st.ratio,
             st.reason);
    MT_OK(gvqCompressorDestroy(c));
    MT_OK(gvqCommDestroy(comm));
}

/* ---- zero-code (argument "zerocode", with GVQ_CODEC=gradiveq GVQ_GRADIVEQ_BASIS=track) ------
 * Plain gvqAllReduce calls on a flat buffer go through a tracked basis: the slices (L = 71, the
 * multiple of 1 above sqrt(5000)) span two fixed directions, so after a few calls the d = 4
 * basis holds them and the sum is exact; every rank gets the same bits; the communicator's
 * stats show the tracked compressor and the wire it saved. */
static void part_zerocode(void) {
    if (mt.rank == 0) printf("-- zero-code: GVQ_CODEC=gradiveq GVQ_GRADIVEQ_BASIS=track\n");
    const char *b = getenv("GVQ_GRADIVEQ_BASIS");
    MT_CHECK(b != NULL && strcmp(b, "track") == 0, "needs GVQ_GRADIVEQ_BASIS=track, got '%s'",
             b ? b : "");
    gvqComm_t comm = mt_new_comm();
    const size_t count = 5000, L = 71;
    double *ref = malloc(sizeof(double) * count), err = 1;
    float *x = malloc(sizeof(float) * count);
    for (int t = 0; t < 12; t++) {
        memset(ref, 0, sizeof(double) * count);
        for (int j = 0; j < mt.nranks; j++)
            for (size_t i = 0; i < count; i++) {
                size_t a = i / L, p = i % L;
                double v = cref_rand(1, (uint64_t)j, (uint64_t)t, a) * sin(0.3 * (double)p) +
                           0.5 * cref_rand(2, (uint64_t)j, (uint64_t)t, a) * cos(0.17 * (double)p);
                float f = (float)v;
                if (j == mt.rank) x[i] = f;
                ref[i] += f;
            }
        MT_OK(gvqAllReduce(x, x, count, gvqFloat32, gvqSum, comm, NULL));
        MT_CHECK(mt_identical(x, 4 * count), "zero-code call %d: outputs differ between ranks", t);
        double e2 = 0, r2 = 0;
        for (size_t i = 0; i < count; i++) {
            e2 += (x[i] - ref[i]) * (x[i] - ref[i]);
            r2 += ref[i] * ref[i];
        }
        err = sqrt(e2 / r2);
    }
    const char *ib = getenv("GVQ_INTEGER_BITS");
    int bits = ib != NULL ? atoi(ib) : 0; /* 16: within the wire's levels, half the bytes */
    double tol = bits ? 4.0 * mt.nranks / (double)(((1 << (bits - 1)) - 1) / mt.nranks) : 1e-4;
    MT_CHECK(err < tol, "zero-code (int%d): after 12 calls the two-direction sum is off by %g",
             bits, err);
    gvqCompressorStats_t st;
    MT_OK(gvqCommGetCompressionStats(comm, GVQ_STATS_TOTAL, &st));
    size_t n = (count + L - 1) / L;
    double want = (double)count / (double)((2 * n + L) * 4) * (bits ? 32.0 / bits : 1.0);
    MT_CHECK(st.codec == gvqCodecGradiveq && st.groups == 1 && st.iteration == 12 &&
                 (mt.nranks == 1 || fabs(st.ratio / want - 1) < 0.05),
             "zero-code stats: codec %d groups %d calls %lld ratio %g (want about %g)", st.codec,
             st.groups, st.iteration, st.ratio, want);
    MT_OK(gvqCommDestroy(comm));
    free(ref), free(x);
}

/* ---- part 6 -----------------------------------------------------------------------------------
 */

#define NG 4
static const size_t g_count[NG] = {16 * 4 * 9, 1000, 40, 500}; /* conv, flat, too small, QSGD */

static void group_make(gvqComm_t comm, int bits, gvqCompressor_t *c) {
    for (int i = 0; i < NG; i++) {
        gvqCompressorConfig_t cfg =
            i == 0 ? track_cfg(3, 0, 16, 4, 3, 3) : track_cfg(2, 0, 0, 0, 0, 0);
        cfg.integerBits = bits;
        if (i == 3) {
            cfg = cref_config(gvqCodecQsgd, 5, 0, 0, 0, 0);
        }
        MT_OK(gvqCompressorCreate(comm, g_count[i], &cfg, &c[i]));
    }
}

static void group_calls(int bits) {
    gvqComm_t comm = mt_new_comm();
    gvqCompressor_t cg[NG], cs[NG];
    group_make(comm, bits, cg);
    group_make(comm, bits, cs);
    float *g[NG], *yg[NG], *ys[NG];
    for (int i = 0; i < NG; i++) {
        g[i] = malloc(4 * g_count[i]);
        yg[i] = malloc(4 * g_count[i]);
        ys[i] = malloc(4 * g_count[i]);
    }
    double worst = 0;
    for (int t = 0; t < 6; t++) {
        for (int i = 0; i < NG; i++)
            for (size_t j = 0; j < g_count[i]; j++)
                g[i][j] = grad_val(mt.rank, t * NG + i, j);
        if (t == 2 && mt.rank == mt.nranks - 1) g[1][5] = NAN;
        MT_OK(gvqGroupStart());
        for (int i = 0; i < NG; i++)
            MT_OK(gvqAllReduceCompressed(g[i], yg[i], g_count[i], gvqFloat32, gvqAvg, cg[i], comm,
                                         NULL));
        MT_OK(gvqGroupEnd());
        for (int i = 0; i < NG; i++)
            MT_OK(gvqAllReduceCompressed(g[i], ys[i], g_count[i], gvqFloat32, gvqAvg, cs[i], comm,
                                         NULL));
        for (int i = 0; i < NG; i++) {
            MT_CHECK(mt_identical(yg[i], 4 * g_count[i]),
                     "int%d call %d tensor %d: grouped "
                     "outputs differ between ranks",
                     bits, t, i);
            double e2 = 0, n2 = 0;
            int nan_ok = 1;
            for (size_t j = 0; j < g_count[i]; j++) {
                if (t == 2 && i == 1 && j == 5) {
                    nan_ok = isnan(yg[i][j]) && isnan(ys[i][j]);
                    continue;
                }
                e2 += ((double)yg[i][j] - ys[i][j]) * ((double)yg[i][j] - ys[i][j]);
                n2 += (double)ys[i][j] * ys[i][j];
            }
            MT_CHECK(nan_ok, "call %d: the NaN of tensor 1 is not in the grouped output", t);
            if (bits == 0 && i != 3 && n2 > 0 && sqrt(e2 / n2) > worst) worst = sqrt(e2 / n2);
        }
    }
    if (bits == 0)
        MT_CHECK(worst < 1e-4, "grouped and one-by-one calls differ by %g (relative)", worst);
    gvqCompressorStats_t a, b;
    MT_OK(gvqCompressorGetStats(cg[1], &a));
    MT_OK(gvqCompressorGetStats(cs[1], &b));
    MT_CHECK(a.nonFiniteCalls == 1 && b.nonFiniteCalls == 1, "nonFiniteCalls %lld / %lld, want 1",
             a.nonFiniteCalls, b.nonFiniteCalls);
    MT_CHECK(a.iteration == b.iteration && a.iteration >= 5,
             "grouped compressor counted %lld "
             "calls, one by one %lld",
             a.iteration, b.iteration);
    for (int i = 0; i < NG; i++) {
        MT_OK(gvqCompressorDestroy(cg[i]));
        MT_OK(gvqCompressorDestroy(cs[i]));
        free(g[i]), free(yg[i]), free(ys[i]);
    }
    MT_OK(gvqCommDestroy(comm));
}

/* Rank 0 groups two calls, the others make them one by one: every rank fails (the others at
 * their first call), no data moves, and the communicator goes on. */
static void group_mismatch(void) {
    gvqComm_t comm = mt_new_comm();
    gvqCompressor_t c[NG];
    group_make(comm, 0, c);
    float *g0 = calloc(g_count[0], 4), *g1 = calloc(g_count[1], 4);
    gvqResult_t res;
    if (mt.rank == 0) {
        MT_OK(gvqGroupStart());
        MT_OK(gvqAllReduceCompressed(g0, g0, g_count[0], gvqFloat32, gvqSum, c[0], comm, NULL));
        MT_OK(gvqAllReduceCompressed(g1, g1, g_count[1], gvqFloat32, gvqSum, c[1], comm, NULL));
        res = gvqGroupEnd();
    } else {
        res = gvqAllReduceCompressed(g0, g0, g_count[0], gvqFloat32, gvqSum, c[0], comm, NULL);
        if (res == gvqSuccess)
            res = gvqAllReduceCompressed(g1, g1, g_count[1], gvqFloat32, gvqSum, c[1], comm, NULL);
    }
    MT_CHECK(res == gvqInvalidArgument, "grouped on rank 0 only: %s, want gvqInvalidArgument",
             gvqGetErrorString(res));
    MT_OK(gvqGroupStart());
    MT_OK(gvqAllReduceCompressed(g0, g0, g_count[0], gvqFloat32, gvqSum, c[0], comm, NULL));
    MT_OK(gvqAllReduceCompressed(g1, g1, g_count[1], gvqFloat32, gvqSum, c[1], comm, NULL));
    MT_OK(gvqGroupEnd());
    for (int i = 0; i < NG; i++)
        MT_OK(gvqCompressorDestroy(c[i]));
    MT_OK(gvqCommDestroy(comm));
    free(g0), free(g1);
}

static void part_group(void) {
    if (mt.rank == 0) printf("-- 6 group: tracked-basis calls fused\n");
    group_calls(0);
    group_calls(8);
    if (mt.nranks > 1) group_mismatch();
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    if (argc > 1 && strcmp(argv[1], "zerocode") == 0) {
        part_zerocode();
        return mt_finish("test_gradiveq_track zerocode");
    }
    part_reference("1a reference: conv 16x4x3x3 (collocated), L 48, d 3", 576, 48, 3, 16, 4, 3, 3,
                   4.0f, 6);
    part_reference("1b reference: flat 1000, L 32 (padded), d 2, efBound 0.5", 1000, 32, 2, 0, 0, 0,
                   0, 0.5f, 6);
    part_subspace();
    part_saveload();
    part_nan();
    part_config();
    part_group();
    return mt_finish("test_gradiveq_track");
}
