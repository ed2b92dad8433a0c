/*
 * test_kernels.c -- the host codec kernels (src/algorithms/codecs/kernels/codec_kernels.h):
 * every path this CPU runs (scalar, avx2, avx512) gives the bits of the scalar path, and the
 * scalar path gives the bits of the definition written out here value by value (Philox draws of
 * 16 bits per value, levels, packing, scales, integer sums), for odd lengths, misaligned
 * buffers, stream offsets that carry into the counter's high word, NaN, Inf, -0, subnormal and
 * huge values, and every bit width.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec_kernels.h"
#include "gvq_rng.h"
#include "gvq_test.h"
#include "gvq_util.h"

static uint32_t rs = 2463534242u;
static uint32_t rnd32(void) { /* xorshift32: the test's own inputs */
    rs ^= rs << 13;
    rs ^= rs >> 17;
    rs ^= rs << 5;
    return rs;
}

/* A value of the kind k: ordinary, tiny, subnormal, -0, huge, NaN, Inf */
static float value(int kind) {
    float u = (float)(rnd32() >> 8) / 16777216.0f - 0.5f;
    switch (kind) {
    case 1:
        return u * 1e-30f;
    case 2:
        return u * 1e-40f; /* subnormal */
    case 3:
        return -0.0f;
    case 4:
        return u * 2.0f * 3.3e38f; /* some above GVQ_K_FINITE_MAX, all finite */
    case 5:
        return NAN;
    case 6:
        return u < 0 ? -INFINITY : INFINITY;
    default:
        return u;
    }
}

/* v[0..n) of one of several mixes: 0 plain, 1 with zeros, 2 tiny, 3 subnormal, 4 one NaN,
 * 5 one Inf, 6 huge, 7 all zero */
static void fill(float *v, size_t n, int mix) {
    for (size_t i = 0; i < n; i++) {
        int kind = mix == 2 ? 1 : mix == 3 ? 2 : mix == 6 ? 4 : 0;
        v[i] = mix == 7 ? 0.0f : (mix == 1 && rnd32() % 3 == 0) ? value(3) : value(kind);
    }
    if (mix == 4 && n > 0) v[rnd32() % n] = NAN;
    if (mix == 5 && n > 0) v[rnd32() % n] = value(6);
}

/* ---- the definitions ------------------------------------------------------------------------ */

static float ref_u(const gvq_kparams_t *p, uint64_t e) {
    uint32_t ctr[4] = {(uint32_t)(e >> 3), (uint32_t)(e >> 35), p->call, p->tag}, out[4];
    gvq_philox4x32_10(ctr, p->key, out);
    return gvq_u01_16(out[(e >> 1) & 3], (int)(e & 1));
}

static void ref_qsgd_quantize(const gvq_kparams_t *p, uint64_t first, const float *v, size_t len,
                              uint8_t *wire) {
    double lane[16] = {0}, s2 = 0;
    float mx = 0;
    int finite = 1;
    for (size_t i = 0; i < len; i++) {
        float a = fabsf(v[i]);
        if (!(a <= GVQ_K_FINITE_MAX)) finite = 0;
        mx = a > mx ? a : mx;
        lane[i % 16] += (double)v[i] * (double)v[i];
    }
    for (int j = 0; j < 16; j++)
        s2 += lane[j];
    float scale = !finite ? NAN : p->norm == GVQ_K_NORM_MAX ? mx : (float)sqrt(s2);
    memcpy(wire, &scale, 4);
    uint8_t *codes = wire + 4;
    memset(codes, 0, (len * (size_t)p->bits + 7) / 8);
    if (!(scale > 0)) return;
    float inv = (float)p->levels / scale;
    if (!(inv <= FLT_MAX)) inv = FLT_MAX;
    for (size_t i = 0; i < len; i++) {
        float r = fabsf(v[i]) * inv;
        if (r > (float)p->levels) r = (float)p->levels;
        float l = floorf(r);
        int level = (int)l + (ref_u(p, first + i) < r - l);
        unsigned code = (unsigned)level | ((v[i] < 0 && level) ? 1u << (p->bits - 1) : 0u);
        codes[i * (size_t)p->bits / 8] |= (uint8_t)(code << (i * (size_t)p->bits % 8));
    }
}

static void ref_qsgd_dequantize(const gvq_kparams_t *p, const uint8_t *wire, size_t len,
                                const float *add, float *out) {
    float scale;
    memcpy(&scale, wire, 4);
    for (size_t i = 0; i < len; i++) {
        unsigned code = (wire[4 + i * (size_t)p->bits / 8] >> (i * (size_t)p->bits % 8)) &
                        ((1u << p->bits) - 1u);
        float mag = (float)(code & ((1u << (p->bits - 1)) - 1u)) * (scale / (float)p->levels);
        float x = (code >> (p->bits - 1)) ? -mag : mag;
        if (scale != scale) x = scale;
        out[i] = add != NULL ? x + add[i] : x;
    }
}

static int32_t ref_is_level(const gvq_kparams_t *p, uint64_t k, float y, float m) {
    float r = fabsf(y) * m;
    if (r != r) r = 0;
    if (r > (float)p->levels) r = (float)p->levels;
    float l = floorf(r);
    int32_t q = (int32_t)l + (ref_u(p, k) < r - l);
    return y < 0 ? -q : q;
}

/* ---- the checks ------------------------------------------------------------------------------ */

static const char *const paths[] = {"scalar", "avx2", "avx512"};

static void check_qsgd(const gvq_kernels_t *k) {
    static const size_t lens[] = {1, 2, 3, 7, 8, 9, 15, 17, 127, 128, 129, 255, 512, 1000};
    static const uint64_t firsts[] = {0, 1, 5, 8, 13, ((uint64_t)1 << 35) - 21};
    float *buf = malloc(sizeof(float) * 1100), *add = malloc(sizeof(float) * 1100);
    float *o1 = malloc(sizeof(float) * 1100), *o2 = malloc(sizeof(float) * 1100);
    uint8_t *w1 = malloc(8200), *w2 = malloc(8200);
    for (int bits = 2; bits <= 8; bits *= 2)
        for (int norm = 0; norm < 2; norm++)
            for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
                for (int mix = 0; mix < 8; mix++) {
                    size_t len = lens[li], fo = (size_t)(rnd32() % 3), wo = (size_t)(rnd32() % 5);
                    uint64_t first = firsts[rnd32() % (sizeof firsts / sizeof *firsts)];
                    gvq_kparams_t p = {bits,    (1 << (bits - 1)) - 1, norm, {rnd32(), rnd32()},
                                       rnd32(), GVQ_K_TAG_QSGD};
                    float *v = buf + fo;
                    fill(v, len, mix);
                    size_t wb = 4 + (len * (size_t)bits + 7) / 8;
                    memset(w1, 0xA5, wb + 8);
                    memset(w2 + wo, 0x5A, wb + 8);
                    ref_qsgd_quantize(&p, first, v, len, w1);
                    k->qsgd_quantize(&p, first, v, len, w2 + wo, GVQ_K_MB_UNKNOWN);
                    EXPECT(memcmp(w1, w2 + wo, wb) == 0 && w2[wo + wb] == 0x5A,
                           "%s qsgd_quantize bits %d norm %d len %zu mix %d first %llu differs "
                           "from the definition (or wrote past the bucket)",
                           k->name, bits, norm, len, mix, (unsigned long long)first);
                    /* decode: the wire just made, or random codes under a scale of any kind */
                    if (mix >= 6) {
                        for (size_t i = 0; i < wb; i++)
                            w1[i] = (uint8_t)rnd32();
                        float sc = value((int)(rnd32() % 7));
                        memcpy(w1, &sc, 4);
                    }
                    memcpy(w2 + wo, w1, wb);
                    fill(add, len, mix % 4);
                    for (int with_add = 0; with_add < 2; with_add++) {
                        ref_qsgd_dequantize(&p, w1, len, with_add ? add : NULL, o1);
                        o2[len] = 42.0f;
                        uint32_t mx =
                            k->qsgd_dequantize(&p, w2 + wo, len, with_add ? add : NULL, o2);
                        EXPECT(memcmp(o1, o2, sizeof(float) * len) == 0 && o2[len] == 42.0f,
                               "%s qsgd_dequantize bits %d len %zu add %d mix %d differs", k->name,
                               bits, len, with_add, mix);
                        uint32_t want = 0; /* a hop's sum: its largest |bit pattern| with it */
                        for (size_t i = 0; with_add && i < len; i++) {
                            uint32_t b;
                            memcpy(&b, &o1[i], 4);
                            want = (b & 0x7fffffffu) > want ? (b & 0x7fffffffu) : want;
                        }
                        EXPECT(mx == want,
                               "%s qsgd_dequantize bits %d len %zu add %d mix %d: max "
                               "%#x, not %#x",
                               k->name, bits, len, with_add, mix, mx, want);
                    }
                }
    free(buf);
    free(add);
    free(o1);
    free(o2);
    free(w1);
    free(w2);
}

static void check_intsum(const gvq_kernels_t *k) {
    static const size_t lens[] = {1, 3, 8, 9, 31, 128, 129, 300, 1000};
    float *y = malloc(sizeof(float) * 1001), *mult = malloc(sizeof(float) * 1001);
    float *f1 = malloc(sizeof(float) * 1001), *f2 = malloc(sizeof(float) * 1001);
    int16_t *in = malloc(2 * 1001), *o1 = malloc(2 * 1001), *o2 = malloc(2 * 1001);
    for (int bits = 8; bits <= 16; bits *= 2)
        for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
            for (int mix = 0; mix < 8; mix++)
                for (int stride = 0; stride < 2; stride++) {
                    size_t n = lens[li];
                    int lv = bits == 8 ? 31 : 8191;
                    gvq_kparams_t p = {bits, lv, 0, {rnd32(), rnd32()}, rnd32(), GVQ_K_TAG_INTSUM};
                    uint64_t k0 = rnd32() % 2 ? rnd32() % 100 : ((uint64_t)1 << 35) - 7;
                    fill(y, n, mix);
                    for (size_t j = 0; j < n; j++) { /* multipliers of every kind the codec sets */
                        uint32_t c = rnd32() % 8;
                        mult[j] = c == 0   ? 0.0f
                                  : c == 1 ? FLT_MAX
                                           : (float)(rnd32() % 1000) * 0.37f;
                    }
                    for (size_t j = 0; j < n; j++)
                        in[j] = (int16_t)(rnd32() % 41) - 20;
                    int8_t in8[1001];
                    for (size_t j = 0; j < n; j++)
                        in8[j] = (int8_t)in[j];
                    const void *src = bits == 8 ? (const void *)in8 : (const void *)in;
                    for (int with_in = 0; with_in < 2; with_in++) {
                        for (size_t j = 0; j < n; j++) {
                            float m = stride ? mult[j] : mult[0];
                            int32_t q = ref_is_level(&p, k0 + j, y[j], m);
                            int32_t a = with_in ? (bits == 8 ? in8[j] : in[j]) : 0;
                            if (bits == 8)
                                ((int8_t *)o1)[j] = (int8_t)(q + a);
                            else
                                o1[j] = (int16_t)(q + a);
                        }
                        memset(o2, 0x77, 2 * (n + 1));
                        k->is_quantize_add(&p, k0, y, n, mult, stride, with_in ? src : NULL, o2);
                        size_t nb = n * (size_t)bits / 8;
                        EXPECT(memcmp(o1, o2, nb) == 0 && ((uint8_t *)o2)[nb] == 0x77,
                               "%s is_quantize_add bits %d n %zu mix %d stride %d in %d differs",
                               k->name, bits, n, mix, stride, with_in);
                    }
                    for (size_t j = 0; j < n; j++) { /* units: finite, 0 or NaN */
                        uint32_t c = rnd32() % 6;
                        mult[j] = c == 0 ? NAN : c == 1 ? 0.0f : (float)(rnd32() % 1000) * 1e-3f;
                    }
                    for (size_t j = 0; j < n; j++)
                        f1[j] = (float)(bits == 8 ? ((int8_t *)o1)[j] : o1[j]) *
                                (stride ? mult[j] : mult[0]);
                    k->is_to_float(bits, o1, n, mult, stride, f2);
                    EXPECT(memcmp(f1, f2, sizeof(float) * n) == 0,
                           "%s is_to_float bits %d n %zu stride %d differs", k->name, bits, n,
                           stride);
                    size_t block = 1 + rnd32() % 300, nblk = (n + block - 1) / block;
                    for (size_t b = 0; b < nblk; b++) {
                        float m = 0;
                        for (size_t j = b * block; j < n && j < (b + 1) * block; j++) {
                            float a = fabsf(y[j]);
                            if (a != a) a = INFINITY;
                            m = a > m ? a : m;
                        }
                        f1[b] = m;
                    }
                    k->max_abs_blocks(y, n, block, f2);
                    EXPECT(memcmp(f1, f2, sizeof(float) * nblk) == 0,
                           "%s max_abs_blocks n %zu block %zu mix %d differs", k->name, n, block,
                           mix);
                }
    free(y);
    free(mult);
    free(f1);
    free(f2);
    free(in);
    free(o1);
    free(o2);
}

/* fp16 both ways against gvq_util.h's converters: every half, and floats of every sign,
 * exponent and high mantissa with low bits of every kind (round-half cases included) */
static void check_f16(const gvq_kernels_t *k) {
    enum { N = 65536 };
    uint16_t *h = malloc(2 * N), *h2 = malloc(2 * N);
    float *f = malloc(4 * N), *g = malloc(4 * N);
    for (uint32_t i = 0; i < N; i++)
        h[i] = (uint16_t)i;
    k->f16_to_f32(h, f, N);
    int bad = 0;
    for (uint32_t i = 0; i < N; i++)
        bad += memcmp(&f[i], &(float){gvq_half_to_float(h[i])}, 4) != 0;
    EXPECT(bad == 0, "%s f16_to_f32: %d of 65536 halves differ from gvq_half_to_float", k->name,
           bad);
    static const uint32_t lows[] = {0, 1, 0xfff, 0x1000, 0x1fff, 0x2000, 0xffff};
    bad = 0;
    for (size_t l = 0; l < sizeof lows / sizeof *lows + 4; l++) {
        for (uint32_t i = 0; i < N; i++) {
            uint32_t low = l < sizeof lows / sizeof *lows ? lows[l] : rnd32() & 0xffffu;
            uint32_t x = (i << 16) | low;
            memcpy(&f[i], &x, 4);
        }
        k->f32_to_f16(f, h2, N);
        for (uint32_t i = 0; i < N; i++)
            bad += h2[i] != gvq_float_to_half(f[i]);
    }
    EXPECT(bad == 0, "%s f32_to_f16: %d values differ from gvq_float_to_half", k->name, bad);
    /* misaligned and of odd lengths (the vector loops' tails), nothing written past the end */
    for (size_t len = 0; len < 40; len++) {
        h2[len + 1] = 0xbeef;
        k->f32_to_f16(f + 1, h2, len);
        int tail_ok = h2[len + 1] == 0xbeef;
        for (size_t i = 0; i < len; i++)
            tail_ok &= h2[i] == gvq_float_to_half(f[1 + i]);
        g[len + 1] = 42.0f;
        k->f16_to_f32(h + 0x7c00 + 3, g + 1, len); /* Inf and NaNs of both kinds */
        tail_ok &= g[len + 1] == 42.0f;
        for (size_t i = 0; i < len; i++)
            tail_ok &= memcmp(&g[1 + i], &(float){gvq_half_to_float(h[0x7c03 + i])}, 4) == 0;
        EXPECT(tail_ok, "%s fp16 conversions of %zu values from a misaligned address", k->name,
               len);
    }
    free(h);
    free(h2);
    free(f);
    free(g);
}

/* the low-rank expand against its definition: every value one fmaf chain over its r products in
 * order, then alpha and beta, or alpha and z; P column-major (PowerSGD, the tracked basis) and
 * row-major (GradiVeQ's coefficients, a slice's r together) */
static void check_expand(const gvq_kernels_t *k) {
    static const size_t shapes[][3] = {{1, 1, 1},     {3, 7, 2},    {5, 64, 4},    {2, 65, 16},
                                       {4, 256, 16},  {3, 300, 33}, {1, 129, 64},  {2, 128, 0},
                                       {7, 191, 8},   {3, 130, 65}, {2, 256, 100}, {9, 48, 5},
                                       {10, 200, 40}, {6, 97, 3}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        size_t n = shapes[s][0], m = shapes[s][1], r = shapes[s][2];
        /* P, Q, z and the output one float past an alignment (the vector loads are unaligned) */
        float *Pb = malloc(sizeof(float) * (n * r + 1)), *Qb = malloc(sizeof(float) * (m * r + 1));
        float *o1 = malloc(sizeof(float) * (n * m + 1)), *o2b = malloc(sizeof(float) * (n * m + 2));
        float *zb = malloc(sizeof(float) * (m + 1));
        float *P = Pb + 1, *Q = Qb + 1, *o2 = o2b + 1, *zv = zb + 1;
        fill(P, n * r, (int)(s % 3));
        fill(Q, m * r, 0);
        fill(zv, m, 1);
        for (int mode = 0; mode < 8; mode++) {
            float alpha = (mode & 3) == 2 ? -1.0f : 1.0f, beta = (mode & 3) == 0 ? 0.0f : 1.0f;
            const float *z = (mode & 3) == 3 ? zv : NULL;
            size_t pi = mode < 4 ? 1 : r, pj = mode < 4 ? n : 1; /* column-, then row-major */
            fill(o1, n * m, 0);
            memcpy(o2, o1, sizeof(float) * n * m);
            if (beta == 0.0f || z != NULL) o2[0] = NAN; /* not read */
            o2[n * m] = 42.0f;
            for (size_t i = 0; i < n; i++)
                for (size_t l = 0; l < m; l++) {
                    float acc = 0.0f;
                    for (size_t j = 0; j < r; j++)
                        acc = fmaf(P[i * pi + j * pj], Q[l + j * m], acc);
                    float *o = &o1[i * m + l];
                    *o = z != NULL      ? alpha * acc + z[l]
                         : beta == 0.0f ? alpha * acc
                                        : alpha * acc + beta * *o;
                }
            k->expand(n, m, r, P, pi, pj, Q, alpha, beta, z, o2);
            EXPECT(memcmp(o1, o2, sizeof(float) * n * m) == 0 && o2[n * m] == 42.0f,
                   "%s expand %zux%zu r %zu alpha %g beta %g z %d, P %s differs", k->name, n, m, r,
                   alpha, beta, z != NULL, mode < 4 ? "column-major" : "row-major");
        }
        free(Pb), free(Qb), free(o1), free(o2b), free(zb);
    }
}

/* the projection against its definition, spelled out here: c_ij one chain of fmaf over l in
 * order; with residual, row i of S minus c_i U^T with the expand's operations (-1 times the
 * in-order sum, plus s); C column-major (PowerSGD, the tracked basis) and row-major (GradiVeQ);
 * d past 64 (groups of columns) */
static void check_project(const gvq_kernels_t *k) {
    static const size_t shapes[][3] = {
        {1, 1, 1},     {3, 16, 1},   {5, 64, 4}, {2, 65, 16},   {4, 256, 16}, {3, 300, 33},
        {1, 128, 64},  {6, 256, 7},  {7, 48, 9}, {2, 17, 0},    {5, 256, 32}, {17, 600, 24},
        {9, 513, 16},  {11, 40, 17}, {3, 0, 5},  {70, 256, 16}, {40, 64, 5},  {5, 130, 65},
        {3, 200, 128}, {4, 96, 150}, {1, 256, 8}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
        size_t n = shapes[sh][0], m = shapes[sh][1], d = shapes[sh][2];
        /* S, U and C one float past an alignment */
        float *Sb = malloc(sizeof(float) * (n * m + 1)), *S2 = malloc(sizeof(float) * n * m);
        float *Ub = malloc(sizeof(float) * (m * d + 1)), *Cb = malloc(sizeof(float) * (n * d + 2));
        float *C1 = malloc(sizeof(float) * (n * d + 1)), *E1 = malloc(sizeof(float) * n * m);
        float *S = Sb + 1, *U = Ub + 1, *C = Cb + 1;
        fill(S, n * m, (int)(sh % 3));
        fill(U, m * d, 0);
        for (size_t i = 0; i < n; i++) {
            for (size_t j = 0; j < d; j++) {
                float c = 0.0f;
                for (size_t l = 0; l < m; l++)
                    c = fmaf(S[i * m + l], U[j * m + l], c);
                C1[i + j * n] = c;
            }
            for (size_t l = 0; l < m; l++) {
                float acc = 0.0f;
                for (size_t j = 0; j < d; j++)
                    acc = fmaf(C1[i + j * n], U[j * m + l], acc);
                E1[i * m + l] = -1.0f * acc + 1.0f * S[i * m + l];
            }
        }
        for (int mode = 0; mode < 4; mode++) {
            int residual = mode & 1, rowmajor = mode >> 1;
            size_t ci = rowmajor ? d : 1, cj = rowmajor ? 1 : n;
            memcpy(S2, S, sizeof(float) * n * m);
            C[n * d] = 42.0f;
            k->project(n, m, d, S2, U, C, ci, cj, residual);
            int same = 1;
            for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j < d; j++)
                    same &= memcmp(&C[i * ci + j * cj], &C1[i + j * n], sizeof(float)) == 0;
            EXPECT(same && C[n * d] == 42.0f,
                   "%s project %zux%zu d %zu (residual %d, C %s): C differs", k->name, n, m, d,
                   residual, rowmajor ? "row-major" : "column-major");
            EXPECT(memcmp(S2, residual ? E1 : S, sizeof(float) * n * m) == 0,
                   "%s project %zux%zu d %zu: S %s", k->name, n, m, d,
                   residual ? "differs from S - C U^T" : "was written");
        }
        free(Sb), free(S2), free(Ub), free(Cb), free(C1), free(E1);
    }
}

/* the back product against its definition: b_lj one chain of fmaf over the rows i in order;
 * C column-major (PowerSGD, the tracked basis) and row-major; odd shapes, d past 64, several
 * super-blocks of rows (300 x 256, 10 x 8200, 130 x 260), nothing written past B */
static void check_back(const gvq_kernels_t *k) {
    static const size_t shapes[][3] = {
        {1, 1, 1},     {3, 16, 1}, {4, 64, 4},   {5, 65, 16},    {8, 256, 16},  {9, 300, 33},
        {1, 128, 64},  {6, 17, 0}, {13, 48, 9},  {0, 32, 4},     {7, 130, 65},  {12, 40, 130},
        {33, 256, 32}, {4, 7, 3},  {101, 96, 5}, {300, 256, 16}, {10, 8200, 5}, {130, 260, 7}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
        size_t n = shapes[sh][0], m = shapes[sh][1], d = shapes[sh][2];
        float *Sb = malloc(sizeof(float) * (n * m + 1)), *Cb = malloc(sizeof(float) * (n * d + 1));
        float *B1 = malloc(sizeof(float) * (m * d + 1)), *Bb = malloc(sizeof(float) * (m * d + 2));
        float *S = Sb + 1, *C = Cb + 1, *B = Bb + 1;
        fill(S, n * m, (int)(sh % 3));
        fill(C, n * d, 0);
        for (int rowmajor = 0; rowmajor < 2; rowmajor++) {
            size_t ci = rowmajor ? d : 1, cj = rowmajor ? 1 : n;
            for (size_t l = 0; l < m; l++)
                for (size_t j = 0; j < d; j++) {
                    float b = 0.0f;
                    for (size_t i = 0; i < n; i++)
                        b = fmaf(S[i * m + l], C[i * ci + j * cj], b);
                    B1[l + j * m] = b;
                }
            fill(B, m * d, 1); /* overwritten, not added to */
            B[m * d] = 42.0f;
            k->back(n, m, d, S, C, ci, cj, B);
            EXPECT(memcmp(B, B1, sizeof(float) * m * d) == 0 && B[m * d] == 42.0f,
                   "%s back %zux%zu d %zu (C %s) differs", k->name, n, m, d,
                   rowmajor ? "row-major" : "column-major");
        }
        free(Sb), free(Cb), free(B1), free(Bb);
    }
}

/* the filter collocation against its definition, dst[(hw D + d) K + k] = src[k D H W + d H W + hw]
 * and back: filters and positions past the 8 x 8 tiles, 1 x 1 and 5 x 5 kernels, misaligned,
 * every bit kept (NaN payloads too), nothing written past dst */
static void check_colloc(const gvq_kernels_t *k) {
    static const size_t shapes[][4] = {{1, 1, 1, 1},   {8, 1, 3, 3}, {16, 16, 3, 3}, {17, 3, 3, 3},
                                       {64, 64, 3, 3}, {9, 7, 1, 1}, {24, 5, 5, 5},  {3, 40, 1, 2},
                                       {33, 8, 2, 2},  {7, 9, 3, 3}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
        size_t K = shapes[sh][0], D = shapes[sh][1], H = shapes[sh][2], W = shapes[sh][3];
        size_t HW = H * W, P = D * HW, n = K * P;
        uint32_t *a = malloc(4 * (n + 1)), *b = malloc(4 * (n + 2)), *c = malloc(4 * (n + 2));
        uint32_t *src = a + 1, *dst = b + 1, *back = c + 1;
        for (size_t i = 0; i < n; i++)
            src[i] = 0x7f800001u + (uint32_t)i * 2654435761u; /* NaN payloads and others */
        dst[n] = back[n] = 42;
        k->collocate((const float *)src, (float *)dst, K, D, H, W);
        int bad = 0;
        for (size_t kk = 0; kk < K; kk++)
            for (size_t d = 0; d < D; d++)
                for (size_t hw = 0; hw < HW; hw++)
                    bad += dst[(hw * D + d) * K + kk] != src[kk * P + d * HW + hw];
        EXPECT(bad == 0 && dst[n] == 42, "%s collocate %zux%zux%zux%zu: %d values misplaced",
               k->name, K, D, H, W, bad);
        k->uncollocate((const float *)dst, (float *)back, K, D, H, W);
        EXPECT(memcmp(back, src, 4 * n) == 0 && back[n] == 42,
               "%s uncollocate %zux%zux%zux%zu does not invert it", k->name, K, D, H, W);
        free(a), free(b), free(c);
    }
}

/* error feedback's sums against their definition: value i into double lane i % 8, lanes added
 * 0..7; x = g + e; finite exactly when no x is NaN or Inf; copies and outputs whole, nothing
 * written past them; odd lengths, misaligned */
static void check_ef_sums(const gvq_kernels_t *k) {
    static const size_t lens[] = {0, 1, 7, 8, 9, 31, 64, 1000, 1027};
    for (size_t t = 0; t < sizeof lens / sizeof *lens; t++)
        for (int mix = 0; mix < 6; mix++) {
            size_t n = lens[t];
            float *gb = malloc(sizeof(float) * (n + 1)), *eb = malloc(sizeof(float) * (n + 1));
            float *ob = malloc(sizeof(float) * (n + 2)), *x = malloc(sizeof(float) * (n + 1));
            float *g = gb + 1, *e = eb + 1, *o = ob + 1;
            fill(g, n, mix);
            fill(e, n, 0);
            double gl[8] = {0}, xl[8] = {0}, g2 = 0, x2 = 0;
            int finite = 1, gfinite = 1;
            for (size_t i = 0; i < n; i++) {
                x[i] = g[i] + e[i];
                gfinite &= isfinite(g[i]) != 0;
                gl[i % 8] += (double)g[i] * (double)g[i];
                xl[i % 8] += (double)x[i] * (double)x[i];
                finite &= isfinite(x[i]) != 0;
            }
            for (size_t j = 0; j < 8; j++)
                g2 += gl[j], x2 += xl[j];
            double gs = -1, xs = -1;
            o[n] = 42.0f;
            int f = k->ef_prepare(g, e, n, o, &gs, &xs);
            EXPECT(f == finite && memcmp(&gs, &g2, 8) == 0 && memcmp(&xs, &x2, 8) == 0 &&
                       memcmp(o, x, sizeof(float) * n) == 0 && o[n] == 42.0f,
                   "%s ef_prepare of %zu values (mix %d) differs", k->name, n, mix);
            int f2 = k->ef_prepare(g, NULL, n, NULL, &gs, &xs);
            EXPECT(memcmp(&gs, &g2, 8) == 0 && memcmp(&xs, &g2, 8) == 0 && f2 == gfinite,
                   "%s ef_prepare without e, %zu values (mix %d) differs", k->name, n, mix);
            double s1 = k->sumsq8(g, o, n), s2 = k->sumsq8(x, NULL, n);
            EXPECT(memcmp(&s1, &g2, 8) == 0 && memcmp(o, g, sizeof(float) * n) == 0 &&
                       o[n] == 42.0f && memcmp(&s2, &x2, 8) == 0,
                   "%s sumsq8 of %zu values (mix %d) differs", k->name, n, mix);
            free(gb), free(eb), free(ob), free(x);
        }
}

/* all_finite against isfinite: one NaN, +-Inf or none at every position of lengths around the
 * vector widths, the largest finite float and -0 among finite values, misaligned starts */
static void check_all_finite(const gvq_kernels_t *k) {
    enum { N = 70 };
    float buf[N + 1];
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};
    for (size_t off = 0; off < 2; off++)
        for (size_t n = 0; n <= 67; n++)
            for (size_t at = 0; at <= n; at++) /* at == n: nothing bad */
                for (size_t b = 0; b < 4; b++) {
                    float *v = buf + off;
                    for (size_t j = 0; j < n; j++)
                        v[j] = j % 3 == 0 ? FLT_MAX : j % 3 == 1 ? -0.0f : -(float)j;
                    if (at < n) v[at] = bad[b];
                    buf[off + n] = NAN; /* past the end: never read */
                    int want = 1;
                    for (size_t j = 0; j < n; j++)
                        want &= isfinite(v[j]) != 0;
                    EXPECT(k->all_finite(v, n) == want,
                           "%s all_finite n %zu bad at %zu (%g) off %zu", k->name, n, at,
                           (double)bad[b], off);
                    if (at == n) break;
                }
}

int main(void) {
    int ran = 0;
    EXPECT(gvq_kernels_named("scalar") != NULL, "the scalar kernels are always there");
    EXPECT(gvq_kernels_named("sse9") == NULL && gvq_kernels_force("sse9") == -1,
           "an unknown path is refused");
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        const gvq_kernels_t *k = gvq_kernels_named(paths[i]);
        if (k == NULL) {
            printf("test_kernels: %s: skipped (not on this CPU or build)\n", paths[i]);
            continue;
        }
        check_qsgd(k);
        check_intsum(k);
        check_f16(k);
        check_expand(k);
        check_project(k);
        check_back(k);
        check_colloc(k);
        check_ef_sums(k);
        check_all_finite(k);
        printf("test_kernels: %s: checked\n", paths[i]);
        ran++;
    }
    EXPECT(ran >= 1, "no kernel path ran");
    EXPECT(gvq_kernels() != NULL, "a path is chosen");
    return gvq_test_finish("test_kernels");
}
