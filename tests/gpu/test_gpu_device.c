/*
 * test_gpu_device.c -- the CUDA device ops table against the host backend on random data.
 *
 * Bit for bit: reduce (every type and op, NaN included: a NaN equals any NaN, since x86 keeps an
 * operand's payload where the GPU returns its canonical NaN), divide, scale, cast, collocate and
 * its inverse, the PCA mean, QSGD encode/combine/decode against the host QSGD codec (same Philox
 * stream). Within rounding: sgemm, covariance (cuBLAS ssyrk vs CBLAS), the eigen-solve
 * (cuSOLVER ssyevd: eigenvalues, and A v = l v), GradiVeQ encode/combine/decode (fp32 and fp16
 * wires, chunks starting inside a reuse group, tails) against the host GradiVeQ codec. Also
 * streams and events. Without a CUDA device it reports itself skipped (exit 77).
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gvq_test.h"
#include "gvq_rng.h"

static const gvq_device_ops_t *H = &gvq_host_device, *D;

static uint32_t rng_state = 12345;
static uint32_t rnd32(void) {
    rng_state = rng_state * 1664525u + 1013904223u;
    return rng_state ^ (rng_state >> 13);
}
static float rndf(void) {
    return ((float)(rnd32() >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

/* Bit for bit, except that a NaN of a float type equals any NaN: x86 arithmetic keeps an
 * operand's payload, the GPU's returns its canonical NaN (first seen on an H100, 2026-11-25). */
static int same_values(const void *got, const void *want, size_t n, gvqDataType_t t) {
    size_t es = gvq_dtype_size(t);
    for (size_t i = 0; i < n; i++) {
        const uint8_t *g = (const uint8_t *)got + i * es, *w = (const uint8_t *)want + i * es;
        if (memcmp(g, w, es) == 0) continue;
        double gv, wv;
        if (t == gvqFloat32) {
            gv = *(const float *)(const void *)g, wv = *(const float *)(const void *)w;
        } else if (t == gvqFloat64) {
            gv = *(const double *)(const void *)g, wv = *(const double *)(const void *)w;
        } else if (t == gvqFloat16 || t == gvqBfloat16) {
            uint16_t gh, wh;
            memcpy(&gh, g, 2);
            memcpy(&wh, w, 2);
            gv = t == gvqFloat16 ? gvq_half_to_float(gh) : gvq_bf16_to_float(gh);
            wv = t == gvqFloat16 ? gvq_half_to_float(wh) : gvq_bf16_to_float(wh);
        } else {
            return 0;
        }
        if (!(isnan(gv) && isnan(wv))) return 0;
    }
    return 1;
}

static void *dup_to_dev(const void *h, size_t bytes) {
    void *d = D->alloc(bytes);
    EXPECT(d != NULL, "alloc %zu", bytes);
    EXPECT_RES(D->copy_from_host(d, h, bytes), gvqSuccess);
    return d;
}
static void *from_dev(const void *d, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    EXPECT_RES(D->copy_to_host(h, d, bytes), gvqSuccess);
    return h;
}

/* random element values: raw bytes for integers, floats in [-4, 4) with a NaN now and then */
static void fill(void *p, size_t n, gvqDataType_t t) {
    size_t es = gvq_dtype_size(t);
    for (size_t i = 0; i < n; i++) {
        float f = rndf() * 4.0f;
        if (rnd32() % 97 == 0) f = NAN;
        switch (t) {
        case gvqFloat16:
            ((uint16_t *)p)[i] = gvq_float_to_half(f);
            break;
        case gvqBfloat16:
            ((uint16_t *)p)[i] = gvq_float_to_bf16(f);
            break;
        case gvqFloat32:
            ((float *)p)[i] = f;
            break;
        case gvqFloat64:
            ((double *)p)[i] = (double)f * (1.0 + 1e-9 * rnd32());
            break;
        default:
            for (size_t b = 0; b < es; b++)
                ((uint8_t *)p)[i * es + b] = (uint8_t)rnd32();
        }
    }
}

static void test_elementwise(void) {
    const size_t counts[] = {1, 37, 100003};
    for (int t = 0; t < gvqNumTypes; t++)
        for (size_t ci = 0; ci < 3; ci++) {
            size_t n = counts[ci], bytes = n * gvq_dtype_size((gvqDataType_t)t);
            void *a = malloc(bytes), *b = malloc(bytes), *want = malloc(bytes);
            fill(a, n, (gvqDataType_t)t);
            fill(b, n, (gvqDataType_t)t);
            void *da = dup_to_dev(a, bytes), *db = dup_to_dev(b, bytes), *dd = D->alloc(bytes);
            for (int op = 0; op < gvqNumOps; op++) {
                H->reduce(want, a, b, n, (gvqDataType_t)t, (gvqRedOp_t)op);
                EXPECT_RES(D->reduce(dd, da, db, n, (gvqDataType_t)t, (gvqRedOp_t)op), gvqSuccess);
                void *got = from_dev(dd, bytes);
                EXPECT(same_values(got, want, n, (gvqDataType_t)t),
                       "reduce %s %s n=%zu differs from the host", gvq_dtype_name((gvqDataType_t)t),
                       gvq_op_name((gvqRedOp_t)op), n);
                free(got);
            }
            /* in place, then divide */
            H->reduce(want, a, b, n, (gvqDataType_t)t, gvqSum);
            H->divide(want, n, (gvqDataType_t)t, 3);
            EXPECT_RES(D->reduce(da, da, db, n, (gvqDataType_t)t, gvqSum), gvqSuccess);
            EXPECT_RES(D->divide(da, n, (gvqDataType_t)t, 3), gvqSuccess);
            void *got = from_dev(da, bytes);
            EXPECT(same_values(got, want, n, (gvqDataType_t)t),
                   "in-place sum + divide %s n=%zu differs", gvq_dtype_name((gvqDataType_t)t), n);
            free(got);
            D->free(da);
            D->free(db);
            D->free(dd);
            free(a);
            free(b);
            free(want);
        }
    EXPECT_RES(D->reduce(NULL, NULL, NULL, 4, (gvqDataType_t)77, gvqSum), gvqInternalError);

    const gvqDataType_t ft[] = {gvqFloat16, gvqBfloat16, gvqFloat32, gvqFloat64};
    size_t n = 4099;
    for (int i = 0; i < 4; i++) {
        size_t sb = n * gvq_dtype_size(ft[i]);
        void *s = malloc(sb);
        fill(s, n, ft[i]);
        void *ds = dup_to_dev(s, sb);
        void *want = malloc(sb), *dd = D->alloc(sb);
        H->scale(want, s, n, ft[i], 0.37);
        EXPECT_RES(D->scale(dd, ds, n, ft[i], 0.37), gvqSuccess);
        void *got = from_dev(dd, sb);
        EXPECT(same_values(got, want, n, ft[i]), "scale %s differs", gvq_dtype_name(ft[i]));
        free(got);
        free(want);
        D->free(dd);
        for (int j = 0; j < 4; j++) {
            size_t db = n * gvq_dtype_size(ft[j]);
            void *w = malloc(db), *d = D->alloc(db);
            H->cast(w, ft[j], s, ft[i], n);
            EXPECT_RES(D->cast(d, ft[j], ds, ft[i], n), gvqSuccess);
            void *g = from_dev(d, db);
            EXPECT(memcmp(g, w, db) == 0, "cast %s -> %s differs", gvq_dtype_name(ft[i]),
                   gvq_dtype_name(ft[j]));
            free(g);
            free(w);
            D->free(d);
        }
        D->free(ds);
        free(s);
    }
    EXPECT_RES(D->scale(NULL, NULL, 4, gvqInt32, 2.0), gvqInvalidArgument);
}

static void test_collocate(void) {
    const size_t shapes[][4] = {{1, 1, 1, 1}, {64, 32, 3, 3}, {5, 7, 2, 3}};
    for (int s = 0; s < 3; s++) {
        size_t K = shapes[s][0], Dd = shapes[s][1], Hh = shapes[s][2], W = shapes[s][3];
        size_t n = K * Dd * Hh * W, bytes = n * sizeof(float);
        float *x = malloc(bytes), *want = malloc(bytes), *back = malloc(bytes);
        for (size_t i = 0; i < n; i++)
            x[i] = rndf();
        gvq_collocate(x, want, K, Dd, Hh, W);
        float *dx = dup_to_dev(x, bytes), *dy = D->alloc(bytes), *dz = D->alloc(bytes);
        EXPECT_RES(D->collocate(dx, dy, K, Dd, Hh, W, 0), gvqSuccess);
        EXPECT_RES(D->collocate(dy, dz, K, Dd, Hh, W, 1), gvqSuccess);
        float *got = from_dev(dy, bytes), *inv = from_dev(dz, bytes);
        H->collocate(x, back, K, Dd, Hh, W, 0);
        EXPECT(memcmp(got, want, bytes) == 0, "collocate %zux%zux%zux%zu differs", K, Dd, Hh, W);
        EXPECT(memcmp(back, want, bytes) == 0, "host collocate op differs from gvq_collocate");
        EXPECT(memcmp(inv, x, bytes) == 0, "uncollocate(collocate(x)) != x");
        free(got);
        free(inv);
        free(x);
        free(want);
        free(back);
        D->free(dx);
        D->free(dy);
        D->free(dz);
    }
}

static double max_rel(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num = fmax(num, fabs(d));
        den = fmax(den, fabs((double)b[i]));
    }
    return num / (den > 0 ? den : 1);
}

static void test_linalg(void) {
    int m = 37, n = 29, k = 301;
    float *a = malloc(sizeof(float) * k * m), *b = malloc(sizeof(float) * k * n);
    float *c = malloc(sizeof(float) * m * n), *want = malloc(sizeof(float) * m * n);
    for (int i = 0; i < k * m; i++)
        a[i] = rndf();
    for (int i = 0; i < k * n; i++)
        b[i] = rndf();
    for (int i = 0; i < m * n; i++)
        c[i] = want[i] = rndf();
    float *da = dup_to_dev(a, sizeof(float) * k * m), *db = dup_to_dev(b, sizeof(float) * k * n);
    float *dc = dup_to_dev(c, sizeof(float) * m * n);
    H->sgemm(1, 0, m, n, k, 0.5f, a, k, b, k, 0.25f, want, m);
    EXPECT_RES(D->sgemm(1, 0, m, n, k, 0.5f, da, k, db, k, 0.25f, dc, m), gvqSuccess);
    float *got = from_dev(dc, sizeof(float) * m * n);
    EXPECT(max_rel(got, want, (size_t)m * n) < 1e-5, "sgemm differs: %g",
           max_rel(got, want, (size_t)m * n));
    free(got);
    D->free(da);
    D->free(db);
    D->free(dc);
    free(a);
    free(b);
    free(c);
    free(want);

    /* covariance and eigen-solve of samples with a few strong directions */
    const int Ls[] = {8, 64, 256};
    for (int li = 0; li < 3; li++) {
        int L = Ls[li], T = 2 * L + 3;
        float *s = malloc(sizeof(float) * L * T);
        for (int t = 0; t < T; t++) {
            float a1 = rndf() * 5, a2 = rndf() * 2;
            for (int i = 0; i < L; i++)
                s[t * L + i] = a1 * sinf(0.1f * i) + a2 * cosf(0.3f * i) + 0.05f * rndf() + 1.0f;
        }
        float *Z = malloc(sizeof(float) * L), *cov = calloc((size_t)L * L, sizeof(float));
        float *w = malloc(sizeof(float) * L);
        H->scov(L, T, s, Z, cov);
        float *ds = dup_to_dev(s, sizeof(float) * L * T), *dZ = D->alloc(sizeof(float) * L);
        float *dcov = D->alloc(sizeof(float) * L * L), *dw = D->alloc(sizeof(float) * L);
        EXPECT_RES(D->scov(L, T, ds, dZ, dcov), gvqSuccess);
        float *gZ = from_dev(dZ, sizeof(float) * L), *gcov = from_dev(dcov, sizeof(float) * L * L);
        EXPECT(memcmp(gZ, Z, sizeof(float) * L) == 0, "PCA mean (L=%d) differs from the host", L);
        double e = 0, mx = 0;
        for (int j = 0; j < L; j++)
            for (int i = j; i < L; i++) {
                e = fmax(e, fabs((double)gcov[j * L + i] - cov[j * L + i]));
                mx = fmax(mx, fabs((double)cov[j * L + i]));
            }
        EXPECT(e <= 1e-4 * mx, "covariance (L=%d) differs: %g of %g", L, e, mx);
        /* eigen-solve of the host's covariance on both */
        EXPECT_RES(D->copy_from_host(dcov, cov, sizeof(float) * L * L), gvqSuccess);
        float *A = malloc(sizeof(float) * L * L);
        memcpy(A, cov, sizeof(float) * L * L);
        for (int j = 0; j < L; j++) /* full symmetric copy for the residual */
            for (int i = 0; i < j; i++)
                A[j * L + i] = A[i * L + j];
        H->ssyevd(L, cov, L, w);
        EXPECT_RES(D->ssyevd(L, dcov, L, dw), gvqSuccess);
        float *gw = from_dev(dw, sizeof(float) * L), *gv = from_dev(dcov, sizeof(float) * L * L);
        double lmax = fmax(fabs(w[0]), fabs(w[L - 1])), ew = 0, res = 0;
        for (int i = 0; i < L; i++)
            ew = fmax(ew, fabs((double)gw[i] - w[i]));
        EXPECT(ew <= 1e-4 * lmax, "eigenvalues (L=%d) differ: %g of %g", L, ew, lmax);
        for (int j = L - 3; j < L; j++) /* the leading eigenpairs: A v = l v */
            for (int i = 0; i < L; i++) {
                double av = 0;
                for (int q = 0; q < L; q++)
                    av += (double)A[q * L + i] * gv[j * L + q];
                res = fmax(res, fabs(av - (double)gw[j] * gv[j * L + i]));
            }
        EXPECT(res <= 1e-3 * lmax, "eigenvector residual (L=%d): %g of %g", L, res, lmax);
        free(gw);
        free(gv);
        free(A);
        free(gZ);
        free(gcov);
        D->free(ds);
        D->free(dZ);
        D->free(dcov);
        D->free(dw);
        free(s);
        free(Z);
        free(cov);
        free(w);
    }
}

static void test_qsgd(void) {
    const int bits[] = {2, 4, 8};
    /* odd buckets put Philox blocks across groups of 8 and code bytes off 4-byte alignment;
     * 100003 elements take several tiles; buckets over 4096 values take the long kernel */
    const size_t buckets[] = {5, 13, 512, 5000}, counts[] = {1, 1000, 4097, 100003};
    for (int bi = 0; bi < 3; bi++)
        for (int norm = 0; norm < 2; norm++)
            for (int ki = 0; ki < 4; ki++)
                for (int ci = 0; ci < 4; ci++) {
                    gvq_qsgd_t q;
                    EXPECT_RES(gvq_qsgd_init(&q, bits[bi], buckets[ki], norm, 77, 3), gvqSuccess);
                    q.call = 5;
                    gvq_codec_t c;
                    gvq_codec_qsgd_init(&c, H, &q);
                    gvq_dev_qsgd_t dq = {q.bits, q.levels, q.norm, q.bucket,
                                         q.seed, q.rank,   q.call};
                    size_t n = counts[ci], off = 3 * q.bucket, wb = c.wire_bytes(&c, off, n);
                    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
                    for (size_t i = 0; i < n; i++) {
                        x[i] = rndf();
                        y[i] = rndf();
                    }
                    if (n > 10) x[7] = 0; /* and a zero bucket when buckets are small */
                    if (n > 10 && q.bucket == 5) memset(x, 0, 5 * sizeof(float));
                    uint8_t *w1 = malloc(wb), *w2 = malloc(wb);
                    float *dec = malloc(sizeof(float) * n);
                    c.encode_combine(&c, off, n, y, NULL, w1); /* y's wire */
                    c.encode_combine(&c, off, n, x, w1, w2);   /* x + decode(y's wire) */
                    c.decode(&c, off, n, w2, dec);
                    float *dx = dup_to_dev(x, sizeof(float) * n),
                          *dy = dup_to_dev(y, sizeof(float) * n);
                    void *dw1 = D->alloc(wb), *dw2 = D->alloc(wb);
                    float *ddec = D->alloc(sizeof(float) * n);
                    EXPECT_RES(D->qsgd_encode_combine(&dq, off, n, dy, NULL, dw1), gvqSuccess);
                    EXPECT_RES(D->qsgd_encode_combine(&dq, off, n, dx, dw1, dw2), gvqSuccess);
                    EXPECT_RES(D->qsgd_decode(&dq, off, n, dw2, ddec), gvqSuccess);
                    uint8_t *g1 = from_dev(dw1, wb), *g2 = from_dev(dw2, wb);
                    float *gd = from_dev(ddec, sizeof(float) * n);
                    EXPECT(memcmp(g1, w1, wb) == 0,
                           "QSGD encode bits=%d norm=%d bucket=%zu n=%zu: wire differs", q.bits,
                           norm, q.bucket, n);
                    EXPECT(memcmp(g2, w2, wb) == 0,
                           "QSGD combine bits=%d norm=%d bucket=%zu n=%zu: wire differs", q.bits,
                           norm, q.bucket, n);
                    EXPECT(memcmp(gd, dec, sizeof(float) * n) == 0,
                           "QSGD decode bits=%d n=%zu differs", q.bits, n);
                    /* x alone (in = NULL): its zero bucket and zero element reach the wire as
                     * they are, not hidden under y's decoded values as in the combine above */
                    uint8_t *w3 = malloc(wb);
                    void *dw3 = D->alloc(wb);
                    c.encode_combine(&c, off, n, x, NULL, w3);
                    EXPECT_RES(D->qsgd_encode_combine(&dq, off, n, dx, NULL, dw3), gvqSuccess);
                    uint8_t *g3 = from_dev(dw3, wb);
                    EXPECT(memcmp(g3, w3, wb) == 0,
                           "QSGD encode of x alone (zero bucket) bits=%d norm=%d bucket=%zu n=%zu: "
                           "wire differs",
                           q.bits, norm, q.bucket, n);
                    free(g3);
                    free(w3);
                    D->free(dw3);
                    free(g1);
                    free(g2);
                    free(gd);
                    D->free(dx);
                    D->free(dy);
                    D->free(dw1);
                    D->free(dw2);
                    D->free(ddec);
                    free(x);
                    free(y);
                    free(w1);
                    free(w2);
                    free(dec);
                    gvq_qsgd_fini(&q);
                }
}

static void test_gradiveq(void) {
    /* L, d, C, extra tail, full slices; chunk offsets start inside a group. d = 16, 32, 48,
     * 64 take the one-kernel decode (groups changing inside a block of 32 slices, one group
     * for all, L from 9 to 256), the other d the cuBLAS decode. */
    const size_t shapes[][5] = {{16, 4, 3, 5, 11},    {64, 8, 1, 3, 11},   {256, 32, 4, 0, 11},
                                {9, 9, 2, 7, 11},     {64, 16, 32, 3, 50}, {128, 32, 1000, 0, 37},
                                {256, 64, 48, 1, 70}, {96, 80, 2, 1, 20},  {256, 32, 7, 0, 40}};
    for (int si = 0; si < 9; si++)
        for (int fp16 = 0; fp16 < 2; fp16++) {
            size_t L = shapes[si][0], d = shapes[si][1], C = shapes[si][2];
            size_t full = shapes[si][4], M = full * L + shapes[si][3];
            gvq_gradiveq_t g;
            memset(&g, 0, sizeof g);
            g.count = M;
            g.L = L;
            g.d = d;
            g.C = C;
            g.nranks = 3;
            g.wire_fp16 = fp16;
            size_t ngroups = GVQ_DIV_UP(full, C);
            float *U = malloc(sizeof(float) * ngroups * L * d),
                  *Z = malloc(sizeof(float) * ngroups * L);
            for (size_t i = 0; i < ngroups * L * d; i++)
                U[i] = rndf() / sqrtf((float)L);
            for (size_t i = 0; i < ngroups * L; i++)
                Z[i] = rndf();
            g.U = U;
            g.Z = Z;
            EXPECT_RES(gvq_gradiveq_prepare(&g, H), gvqSuccess);
            gvq_codec_t c;
            gvq_codec_gradiveq_init(&c, H, &g);
            float *dU = dup_to_dev(U, sizeof(float) * ngroups * L * d);
            float *dZ = dup_to_dev(Z, sizeof(float) * ngroups * L);
            float *dUZ = dup_to_dev(g.UZ, sizeof(float) * ngroups * d);
            gvq_dev_gq_t dg = {L, d, C, 3, fp16, dU, dZ, dUZ};
            /* chunk [off, M): off = one slice in (inside group 0 when C > 1) */
            size_t off = L, n = M - off, wb = c.wire_bytes(&c, off, n);
            float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
            for (size_t i = 0; i < n; i++) {
                x[i] = rndf();
                y[i] = rndf();
            }
            uint8_t *w1 = malloc(wb), *w2 = malloc(wb);
            float *dec = malloc(sizeof(float) * n);
            c.encode_combine(&c, off, n, y, NULL, w1);
            g.local_x2 = g.local_c2 = g.local_all2 = 0;
            c.encode_combine(&c, off, n, x, w1, w2);
            c.decode(&c, off, n, w2, dec);
            float *dx = dup_to_dev(x, sizeof(float) * n), *dy = dup_to_dev(y, sizeof(float) * n);
            void *dw1 = D->alloc(wb), *dw2 = D->alloc(wb);
            float *ddec = D->alloc(sizeof(float) * n);
            double norms[3] = {0, 0, 0};
            EXPECT_RES(D->gq_encode_combine(&dg, off, n, dy, NULL, dw1, NULL), gvqSuccess);
            EXPECT_RES(D->gq_encode_combine(&dg, off, n, dx, dw1, dw2, norms), gvqSuccess);
            EXPECT_RES(D->gq_decode(&dg, off, n, dw2, ddec), gvqSuccess);
            uint8_t *g2 = from_dev(dw2, wb);
            float *gd = from_dev(ddec, sizeof(float) * n);
            size_t ncoef = (n / L) * d, cb = ((ncoef * (fp16 ? 2 : 4)) + 3) & ~(size_t)3;
            float *wc = malloc(sizeof(float) * (ncoef + 1)),
                  *gc = malloc(sizeof(float) * (ncoef + 1));
            for (size_t i = 0; i < ncoef; i++) {
                wc[i] = fp16 ? gvq_half_to_float(((uint16_t *)w2)[i]) : ((float *)w2)[i];
                gc[i] = fp16 ? gvq_half_to_float(((uint16_t *)g2)[i]) : ((float *)g2)[i];
            }
            double tol = fp16 ? 2e-3 : 1e-5;
            EXPECT(max_rel(gc, wc, ncoef) < tol,
                   "GradiVeQ L=%zu d=%zu C=%zu fp16=%d: coefficients differ by %g", L, d, C, fp16,
                   max_rel(gc, wc, ncoef));
            EXPECT(memcmp(g2 + cb, w2 + cb, wb - cb) == 0, "GradiVeQ tail on the wire differs");
            EXPECT(max_rel(gd, dec, n) < tol,
                   "GradiVeQ L=%zu d=%zu C=%zu fp16=%d: decode differs by %g", L, d, C, fp16,
                   max_rel(gd, dec, n));
            EXPECT(fabs(norms[0] - g.local_x2) <= 1e-6 * g.local_x2 &&
                       fabs(norms[1] - g.local_c2) <= 1e-4 * g.local_c2 + 1e-12 &&
                       fabs(norms[2] - g.local_all2) <= 1e-6 * g.local_all2,
                   "GradiVeQ norms differ: %g %g %g vs host %g %g %g", norms[0], norms[1], norms[2],
                   g.local_x2, g.local_c2, g.local_all2);
            free(wc);
            free(gc);
            free(g2);
            free(gd);
            D->free(dx);
            D->free(dy);
            D->free(dw1);
            D->free(dw2);
            D->free(ddec);
            D->free(dU);
            D->free(dZ);
            D->free(dUZ);
            free(x);
            free(y);
            free(w1);
            free(w2);
            free(dec);
            free(U);
            free(Z);
            gvq_gradiveq_fini(&g);
        }
}

/* A host function enqueued on a stream (cudaLaunchHostFunc): holds the stream for `arg` ms. */
static void CUDART_CB sleep_cb(void *arg) {
    struct timespec t = {0, (long)(intptr_t)arg * 1000000L};
    nanosleep(&t, NULL);
}

/* Event ordering without a stream switch in between (set_stream synchronises the stream it
 * leaves, which would hide a missing wait): the user stream is held busy for 200 ms, then writes
 * db; an event recorded after that is waited for by the device's own stream, which then scales db.
 * Without the wait the scale would run first and the result would differ. */
static void test_event_order(void) {
    size_t n = 1 << 16, bytes = n * sizeof(float);
    float *h = malloc(bytes), *want = malloc(bytes);
    for (size_t i = 0; i < n; i++)
        h[i] = rndf();
    float *da = dup_to_dev(h, bytes), *db = D->alloc(bytes);
    cudaStream_t user;
    EXPECT(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking) == cudaSuccess,
           "cudaStreamCreate");
    EXPECT(cudaMemset(db, 0, bytes) == cudaSuccess, "cudaMemset");
    void *ev = NULL;
    EXPECT_RES(D->event_create(&ev), gvqSuccess);
    EXPECT(cudaLaunchHostFunc(user, sleep_cb, (void *)(intptr_t)200) == cudaSuccess,
           "cudaLaunchHostFunc");
    EXPECT(cudaMemcpyAsync(db, da, bytes, cudaMemcpyDeviceToDevice, user) == cudaSuccess,
           "cudaMemcpyAsync");
    EXPECT(cudaEventRecord((cudaEvent_t)ev, user) == cudaSuccess, "cudaEventRecord");
    EXPECT_RES(D->event_wait(ev), gvqSuccess); /* on the device's own stream */
    EXPECT_RES(D->scale(db, db, n, gvqFloat32, 0.5), gvqSuccess);
    EXPECT_RES(D->sync(), gvqSuccess);
    float *got = from_dev(db, bytes);
    H->scale(want, h, n, gvqFloat32, 0.5);
    EXPECT(memcmp(got, want, bytes) == 0,
           "event_wait did not order the own stream after the user stream");
    D->event_destroy(ev);
    cudaStreamSynchronize(user);
    cudaStreamDestroy(user);
    D->free(da);
    D->free(db);
    free(h);
    free(want);
    free(got);
}

/* Work queued on a caller's stream, ordered by an event into the device's own stream. */
static void test_streams(void) {
    size_t n = 1 << 20, bytes = n * sizeof(float);
    float *h = malloc(bytes), *want = malloc(bytes);
    for (size_t i = 0; i < n; i++)
        h[i] = rndf();
    float *da = dup_to_dev(h, bytes), *db = D->alloc(bytes);
    void *user = NULL, *prev = (void *)1, *ev = NULL;
    EXPECT(cudaStreamCreate((cudaStream_t *)&user) == cudaSuccess, "cudaStreamCreate");
    EXPECT_RES(D->set_stream(user, &prev), gvqSuccess);
    EXPECT(prev == NULL, "the first current stream is the device's own (NULL)");
    EXPECT_RES(D->copy(db, da, bytes), gvqSuccess);
    EXPECT_RES(D->reduce(db, db, da, n, gvqFloat32, gvqSum), gvqSuccess);
    EXPECT_RES(D->event_create(&ev), gvqSuccess);
    EXPECT_RES(D->event_record(ev), gvqSuccess);
    EXPECT_RES(D->set_stream(NULL, &prev), gvqSuccess);
    EXPECT(prev == user, "set_stream returns the previous stream");
    EXPECT_RES(D->event_wait(ev), gvqSuccess);
    EXPECT_RES(D->scale(db, db, n, gvqFloat32, 0.5), gvqSuccess);
    EXPECT_RES(D->sync(), gvqSuccess);
    EXPECT_RES(D->event_sync(ev), gvqSuccess);
    float *got = from_dev(db, bytes);
    H->reduce(want, h, h, n, gvqFloat32, gvqSum);
    H->scale(want, want, n, gvqFloat32, 0.5);
    EXPECT(memcmp(got, want, bytes) == 0, "stream/event ordered work differs");
    D->event_destroy(ev);
    cudaStreamDestroy((cudaStream_t)user);
    free(got);
    free(h);
    free(want);
    D->free(da);
    D->free(db);
    float *pinned = D->host_alloc(64);
    EXPECT(pinned != NULL, "pinned host memory");
    D->host_free(pinned);
}

int main(void) {
    int n = gvq_cuda_device_count();
    if (n == 0) {
        printf("SKIPPED: no CUDA device\n");
        return 77;
    }
    D = gvq_device_find("cuda");
    EXPECT(D != NULL && D->size == sizeof(gvq_device_ops_t), "the CUDA device table");
    if (D == NULL) return 1;
    EXPECT(gvq_device_of(NULL) == H, "NULL is host memory");
    float hostv[4];
    void *dv = D->alloc(16);
    EXPECT(gvq_device_of(hostv) == H, "a stack array is host memory");
    EXPECT(gvq_device_of(dv) == D, "cudaMalloc memory is the CUDA device's");
    D->free(dv);
    test_elementwise();
    test_collocate();
    test_linalg();
    test_qsgd();
    test_gradiveq();
    test_event_order();
    test_streams();
    if (gvq_test_failures) {
        fprintf(stderr, "test_gpu_device: %d failure(s)\n", gvq_test_failures);
        return 1;
    }
    printf("test_gpu_device: all checks passed\n");
    return 0;
}
