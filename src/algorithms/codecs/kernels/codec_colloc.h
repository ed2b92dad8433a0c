/*
 * codec_colloc.h -- GradiVeQ's filter collocation (codec_gradiveq.c), included by codec_kernels.c
 * only (compiled once per path). A conv weight [K][D][H][W] is K rows of P = D H W positions;
 * collocated, position p = d HW + hw becomes row perm(p) = hw D + d of a P x K matrix:
 *
 *     dst[perm(p) K + k] = src[k P + p]           (uncollocate: the other way)
 *
 * a transpose with its rows permuted. Pure data movement: every path gives the same bits. The C
 * form runs over blocks of 16 filters (a block's rows read or written position by position while
 * the other side moves 16 contiguous floats). The vector forms move 8 x 8 tiles through
 * registers: 8 rows of 8 contiguous floats in, transposed, 8 rows of 8 contiguous floats out, so
 * neither side is read or written a float at a time (the element loops ran at 0.47-0.6 of
 * memcpy; perf/RESULTS.md section 12).
 */
#ifndef GVQ_CODEC_COLLOC_H_
#define GVQ_CODEC_COLLOC_H_

enum { COLLOC_KB = 16 };

/* row of position p in the collocated order */
static inline size_t colloc_row(size_t p, size_t D, size_t HW) {
    return (p % HW) * D + p / HW;
}

#if defined(__AVX512F__) || defined(__AVX2__)
/* r[0..7] (8 floats each) transposed in place: r[i][j] <- r[j][i] */
static inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* filters [k0, k1) at positions [p0, p1), a float at a time (dir as colloc_any's) */
static void colloc_elems(int dir, const float *src, float *dst, size_t K, size_t D, size_t HW,
                         size_t k0, size_t k1, size_t p0, size_t p1) {
    const size_t P = D * HW;
    for (size_t k = k0; k < k1; k++)
        for (size_t p = p0; p < p1; p++) {
            size_t c = colloc_row(p, D, HW) * K + k, t = k * P + p;
            if (dir == 0)
                dst[c] = src[t];
            else
                dst[t] = src[c];
        }
}
#define K_COLLOC_VEC 1
#else
#define K_COLLOC_VEC 0
#endif

/* dir 0: collocate (src K x P rows -> dst P x K rows permuted); 1: uncollocate */
static void colloc_any(int dir, const float *src, float *dst, size_t K, size_t D, size_t H,
                       size_t W) {
    size_t HW = H * W, P = D * HW;
#if K_COLLOC_VEC
    size_t pv = P - P % 8, kv = K - K % 8; /* the tiles cover positions [0, pv), filters [0, kv) */
    if (dir == 0) {                        /* the collocated rows filled one after another */
        for (size_t p0 = 0; p0 < pv; p0 += 8) {
            size_t row[8];
            for (size_t i = 0; i < 8; i++)
                row[i] = colloc_row(p0 + i, D, HW) * K;
            for (size_t k0 = 0; k0 < kv; k0 += 8) {
                __m256 r[8];
                for (size_t i = 0; i < 8; i++)
                    r[i] = _mm256_loadu_ps(src + (k0 + i) * P + p0);
                transpose8(r);
                for (size_t i = 0; i < 8; i++)
                    _mm256_storeu_ps(dst + row[i] + k0, r[i]);
            }
        }
    } else { /* the tensor's rows (8 filters) filled one after another */
        for (size_t k0 = 0; k0 < kv; k0 += 8)
            for (size_t p0 = 0; p0 < pv; p0 += 8) {
                __m256 r[8];
                for (size_t i = 0; i < 8; i++)
                    r[i] = _mm256_loadu_ps(src + colloc_row(p0 + i, D, HW) * K + k0);
                transpose8(r);
                for (size_t i = 0; i < 8; i++)
                    _mm256_storeu_ps(dst + (k0 + i) * P + p0, r[i]);
            }
    }
    /* what the tiles left: filters [kv, K) at every position, positions [pv, P) of the rest */
    colloc_elems(dir, src, dst, K, D, HW, kv, K, 0, P);
    colloc_elems(dir, src, dst, K, D, HW, 0, kv, pv, P);
#else
    for (size_t k0 = 0; k0 < K; k0 += COLLOC_KB) {
        size_t kb = K - k0 < COLLOC_KB ? K - k0 : COLLOC_KB;
        if (dir == 0) /* the collocated side in order */
            for (size_t hw = 0; hw < HW; hw++)
                for (size_t d = 0; d < D; d++) {
                    const float *t = src + k0 * P + d * HW + hw;
                    float *c = dst + (hw * D + d) * K + k0;
                    for (size_t j = 0; j < kb; j++)
                        c[j] = t[j * P];
                }
        else /* the tensor's side in order */
            for (size_t d = 0; d < D; d++)
                for (size_t hw = 0; hw < HW; hw++) {
                    const float *c = src + (hw * D + d) * K + k0;
                    float *t = dst + k0 * P + d * HW + hw;
                    for (size_t j = 0; j < kb; j++)
                        t[j * P] = c[j];
                }
    }
#endif
}

static void k_collocate(const float *src, float *dst, size_t K, size_t D, size_t H, size_t W) {
    colloc_any(0, src, dst, K, D, H, W);
}

static void k_uncollocate(const float *src, float *dst, size_t K, size_t D, size_t H, size_t W) {
    colloc_any(1, src, dst, K, D, H, W);
}

#endif /* GVQ_CODEC_COLLOC_H_ */
