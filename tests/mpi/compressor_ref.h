/*
 * compressor_ref.h -- what the compressor tests that check a codec against a double-precision
 * reference share:
 *
 *   cref_rand()        a uniform value in [-1, 1) from four integers (splitmix64 of the key)
 *   cref_norm()        ||v|| in double
 *   cref_orth()        Gram-Schmidt of an n x r column-major matrix, in double
 *   cref_saved_tail()  the residual (count floats) and the kept factor (flen floats: PowerSGD's
 *                      Q, a tracked basis's U) at the end of gvqCompressorSave's state
 *   cref_resume()      a compressor restored from another's saved state continues bitwise
 *   cref_config()      a config of a codec and seed, with a conv shape [K][D][H][W] when K > 0
 */
#ifndef GVQ_TESTS_COMPRESSOR_REF_H_
#define GVQ_TESTS_COMPRESSOR_REF_H_

#include <math.h>
#include <stdint.h>

#include "mpitest.h"

static inline double cref_rand(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
    uint64_t z = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^
                 (c + 7) * 0x94D049BB133111EBull ^ (d + 13) * 0xD6E8FEB86659FD93ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / 4503599627370496.0 - 1.0;
}

static inline gvqCompressorConfig_t cref_config(int codec, int seed, int K, int D, int H, int W) {
    gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    cfg.codec = codec;
    cfg.seed = seed;
    if (K > 0) {
        cfg.filters = K;
        cfg.depth = D;
        cfg.height = H;
        cfg.width = W;
    }
    return cfg;
}

static inline double cref_norm(const float *v, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)v[i] * v[i];
    return sqrt(s);
}

static inline void cref_orth(double *P, size_t n, size_t r) {
    for (size_t k = 0; k < r; k++) {
        double *v = P + k * n;
        for (size_t j = 0; j < k; j++) {
            double h = 0;
            for (size_t i = 0; i < n; i++)
                h += P[j * n + i] * v[i];
            for (size_t i = 0; i < n; i++)
                v[i] -= h * P[j * n + i];
        }
        double s = 0;
        for (size_t i = 0; i < n; i++)
            s += v[i] * v[i];
        for (size_t i = 0; i < n; i++)
            v[i] /= sqrt(s);
    }
}

/* compressor_save.c's layout: [... residual][factor] at the end (NULL: not wanted). */
static inline void cref_saved_tail(gvqCompressor_t c, size_t count, size_t flen, float *e,
                                   float *F) {
    size_t sz = 0;
    MT_OK(gvqCompressorSave(c, NULL, &sz));
    char *buf = malloc(sz);
    MT_OK(gvqCompressorSave(c, buf, &sz));
    if (F != NULL) memcpy(F, buf + sz - flen * 4, flen * 4);
    if (e != NULL) memcpy(e, buf + sz - flen * 4 - count * 4, count * 4);
    free(buf);
}

/* Two compressors of cfg; after `at` of `calls` calls (gradients from fill(g, count, call)), a's
 * state is saved and loaded into b, which from then on must give bitwise a's results and end in
 * a's state. Returns the saved state (the caller frees it) and its size. */
static inline char *cref_resume(gvqComm_t comm, const gvqCompressorConfig_t *cfg, size_t count,
                                int calls, int at, void (*fill)(float *, size_t, int),
                                size_t *size) {
    gvqCompressor_t a = NULL, b = NULL;
    MT_OK(gvqCompressorCreate(comm, count, cfg, &a));
    MT_OK(gvqCompressorCreate(comm, count, cfg, &b));
    float *g = malloc(4 * count), *ya = malloc(4 * count), *yb = malloc(4 * count);
    char *blob = NULL;
    size_t sz = 0;
    for (int t = 0; t < calls; t++) {
        if (t == at) {
            MT_OK(gvqCompressorSave(a, NULL, &sz));
            blob = malloc(sz);
            MT_OK(gvqCompressorSave(a, blob, &sz));
            MT_OK(gvqCompressorLoad(b, blob, sz));
        }
        fill(g, count, t);
        MT_OK(gvqAllReduceCompressed(g, ya, count, gvqFloat32, gvqSum, a, comm, NULL));
        if (t >= at) {
            MT_OK(gvqAllReduceCompressed(g, yb, count, gvqFloat32, gvqSum, b, comm, NULL));
            MT_CHECK(memcmp(ya, yb, 4 * count) == 0, "call %d: the restored compressor differs", t);
        }
    }
    size_t sa = 0, sb = 0;
    MT_OK(gvqCompressorSave(a, NULL, &sa));
    MT_OK(gvqCompressorSave(b, NULL, &sb));
    char *ba = malloc(sa), *bb = malloc(sb);
    MT_OK(gvqCompressorSave(a, ba, &sa));
    MT_OK(gvqCompressorSave(b, bb, &sb));
    MT_CHECK(sa == sb && memcmp(ba, bb, sa) == 0, "final saved states differ");
    MT_OK(gvqCompressorDestroy(a));
    MT_OK(gvqCompressorDestroy(b));
    free(g), free(ya), free(yb), free(ba), free(bb);
    *size = sz;
    return blob;
}

#endif /* GVQ_TESTS_COMPRESSOR_REF_H_ */
