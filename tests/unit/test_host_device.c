/*
 * test_host_device.c -- the host device's kernels against independent references: every
 * (datatype, op) reduce against a double/wide-integer computation, divide, sgemm against a
 * naive triple loop, ssyevd through the eigen-equation A v = l v and orthonormality.
 */
#include <math.h>

#include "gvq_test.h"

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

#include "test_values.h"

/* The value the type stores for an exact result v (integers wrap modulo 2^bits). */
static double wrap(gvqDataType_t t, double v) {
    switch (t) {
    case gvqInt8:
        return (double)(int8_t)(uint8_t)(int64_t)v;
    case gvqUint8:
        return (double)(uint8_t)(int64_t)v;
    case gvqInt32:
        return (double)(int32_t)(uint32_t)(int64_t)v;
    case gvqUint32:
        return (double)(uint32_t)(int64_t)v;
    case gvqFloat16:
        return gvq_half_to_float(gvq_float_to_half((float)v));
    case gvqBfloat16:
        return gvq_bf16_to_float(gvq_float_to_bf16((float)v));
    case gvqFloat32:
        return (float)v;
    default:
        return v;
    }
}

static void test_reduce(void) {
    const size_t n = 1027;
    for (int t = 0; t < gvqNumTypes; t++) {
        size_t es = gvq_dtype_size((gvqDataType_t)t);
        char *a = malloc(n * es), *b = malloc(n * es), *d = malloc(n * es);
        for (int op = 0; op < gvqNumOps; op++) {
            for (size_t i = 0; i < n; i++) {
                /* small signed integers (wrapping exercised for 8-bit types by 120+120) */
                double x = (double)((int)(next() % 241) - 120),
                       y = (double)((int)(next() % 241) - 120);
                if (t == gvqUint8 || t == gvqUint32 || t == gvqUint64) x = fabs(x), y = fabs(y);
                if (gvq_dtype_is_float((gvqDataType_t)t)) x /= 8, y /= 8;
                put(a, (gvqDataType_t)t, i, x);
                put(b, (gvqDataType_t)t, i, y);
            }
            EXPECT_RES(gvq_host_device.reduce(d, a, b, n, (gvqDataType_t)t, (gvqRedOp_t)op),
                       gvqSuccess);
            int bad = 0;
            for (size_t i = 0; i < n; i++) {
                double x = get(a, (gvqDataType_t)t, i), y = get(b, (gvqDataType_t)t, i), want;
                switch (op) {
                case gvqSum:
                case gvqAvg:
                    want = x + y;
                    break;
                case gvqProd:
                    want = x * y;
                    break;
                case gvqMax:
                    want = x > y ? x : y;
                    break;
                default:
                    want = x < y ? x : y;
                    break;
                }
                want = wrap((gvqDataType_t)t, want);
                double got = get(d, (gvqDataType_t)t, i);
                if (got != want && bad++ < 3)
                    EXPECT(0, "%s %s [%zu]: %g op %g = %g, want %g",
                           gvq_dtype_name((gvqDataType_t)t), gvq_op_name((gvqRedOp_t)op), i, x, y,
                           got, want);
            }
        }
        /* in place: dst aliases a */
        for (size_t i = 0; i < n; i++)
            put(a, (gvqDataType_t)t, i, 3), put(b, (gvqDataType_t)t, i, 4);
        gvq_host_device.reduce(a, a, b, n, (gvqDataType_t)t, gvqSum);
        EXPECT(get(a, (gvqDataType_t)t, n - 1) == 7 && get(a, (gvqDataType_t)t, 0) == 7,
               "in-place %s", gvq_dtype_name((gvqDataType_t)t));
        /* divide: 7 / 2 truncates for integers, 3.5 for floats */
        EXPECT_RES(gvq_host_device.divide(a, n, (gvqDataType_t)t, 2), gvqSuccess);
        double want = gvq_dtype_is_float((gvqDataType_t)t) ? 3.5 : 3;
        EXPECT(get(a, (gvqDataType_t)t, 5) == want, "divide %s: %g",
               gvq_dtype_name((gvqDataType_t)t), get(a, (gvqDataType_t)t, 5));
        free(a);
        free(b);
        free(d);
    }
    /* float max/min propagate NaN */
    float fa[2] = {NAN, 1}, fb[2] = {1, NAN}, fd[2];
    gvq_host_device.reduce(fd, fa, fb, 2, gvqFloat32, gvqMax);
    EXPECT(isnan(fd[0]) && isnan(fd[1]), "max nan %g %g", fd[0], fd[1]);
    EXPECT_RES(gvq_host_device.reduce(fd, fa, fb, 2, (gvqDataType_t)77, gvqSum), gvqInternalError);
}

static void test_sgemm(void) {
    int m = 37, n = 19, k = 23;
    float *a = malloc(sizeof(float) * (size_t)(k * m)),
          *b = malloc(sizeof(float) * (size_t)(k * n));
    float *c = malloc(sizeof(float) * (size_t)(m * n));
    for (int i = 0; i < k * m; i++)
        a[i] = (float)((int)(next() % 17) - 8) / 4;
    for (int i = 0; i < k * n; i++)
        b[i] = (float)((int)(next() % 17) - 8) / 4;
    /* C = A^T B with A stored k x m (lda k), B k x n (ldb k) */
    EXPECT_RES(gvq_host_device.sgemm(1, 0, m, n, k, 1.0f, a, k, b, k, 0.0f, c, m), gvqSuccess);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double want = 0;
            for (int l = 0; l < k; l++)
                want += (double)a[i * k + l] * b[j * k + l];
            EXPECT(fabs(c[j * m + i] - want) < 1e-4, "sgemm (%d,%d): %g want %g", i, j,
                   c[j * m + i], want);
        }
    free(a);
    free(b);
    free(c);
}

static void test_ssyevd(void) {
    int n = 24;
    float *a = malloc(sizeof(float) * (size_t)(n * n)),
          *v = malloc(sizeof(float) * (size_t)(n * n));
    float *w = malloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) {
            float x = (float)((int)(next() % 201) - 100) / 50;
            a[i * n + j] = a[j * n + i] = x;
        }
    memcpy(v, a, sizeof(float) * (size_t)(n * n));
    EXPECT_RES(gvq_host_device.ssyevd(n, v, n, w), gvqSuccess);
    for (int e = 0; e < n; e++) {
        if (e) EXPECT(w[e - 1] <= w[e], "eigenvalues not ascending at %d", e);
        for (int i = 0; i < n; i++) { /* (A v)_i = l v_i */
            double av = 0;
            for (int j = 0; j < n; j++)
                av += (double)a[j * n + i] * v[e * n + j];
            EXPECT(fabs(av - w[e] * v[e * n + i]) < 1e-3, "A v != l v (e=%d i=%d): %g vs %g", e, i,
                   av, w[e] * v[e * n + i]);
        }
        for (int f = 0; f <= e; f++) {
            double dot = 0;
            for (int i = 0; i < n; i++)
                dot += (double)v[e * n + i] * v[f * n + i];
            EXPECT(fabs(dot - (e == f)) < 1e-4, "eigenvectors %d,%d: dot %g", e, f, dot);
        }
    }
    free(a);
    free(v);
    free(w);
}

int main(void) {
    test_reduce();
    test_sgemm();
    test_ssyevd();
    EXPECT(gvq_device_find("host") == &gvq_host_device, "host device lookup");
    EXPECT(gvq_device_find("tpu") == NULL, "unknown device found");
    return gvq_test_finish("test_host_device");
}
