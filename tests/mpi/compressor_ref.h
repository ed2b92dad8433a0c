/*
 * compressor_ref.h -- what the compressor tests that check a codec against a double-precision
 * reference share:
 *
 *   cref_rand()        a uniform value in [-1, 1) from four integers (splitmix64 of the key)
 *   cref_norm()        ||v|| in double
 *   cref_orth()        Gram-Schmidt of an n x r column-major matrix, in double
 *   cref_saved_tail()  the residual (count floats) and the kept factor (flen floats: PowerSGD's
 *                      Q, a tracked basis's U) at the end of gvqCompressorSave's state
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

#endif /* GVQ_TESTS_COMPRESSOR_REF_H_ */
