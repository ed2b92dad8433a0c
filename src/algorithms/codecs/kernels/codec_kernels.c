/*
 * codec_kernels.c -- the host codecs' inner loops (codec_kernels.h), compiled once per path:
 * GVQ_KPATH names it (scalar, avx2, avx512) and the compiler flags of CMakeLists.txt give its
 * instruction set. The C below is the definition of every path's result: loops over tiles of
 * TILE values whose iterations are independent, so the compiler may run them in vector lanes
 * without changing a bit; only Philox has hand-written vector forms (the compilers do not
 * vectorize its 32x32->64 multiplies well), checked against the scalar form by the tests.
 *
 * Per QSGD bucket: one pass over the values for the scale (integer max of |v|'s bit patterns,
 * or 16 lanes of double sums of squares), then one pass per tile of 128 values: draws, levels,
 * codes packed into the wire. A ring hop's decode-add runs on one bucket (512 values by
 * default: in L1) right before its quantize and hands it the sum's max (its scale, found in the
 * same loop), so each value is read from memory once per hop and the sum once from L1.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "codec_kernels.h"
#include "gvq_rng.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#ifndef GVQ_KPATH
#error "GVQ_KPATH must name the path this file is compiled for"
#endif
#define K_CAT3(a, b) a##b
#define K_CAT2(a, b) K_CAT3(a, b)
#define K_TABLE K_CAT2(gvq_kernels_, GVQ_KPATH)
#define K_STR2(x) #x
#define K_STR(x) K_STR2(x)

enum { TILE = 128, LANES = 16 };
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define K_LITTLE 1
#else
#define K_LITTLE 0
#endif
#include "codec_philox.h" /* philox16(): 16 blocks g0 .. g0+15, out[4j + w] = word w of block j */

/* Philox's words and the 16-bit draws they hold (little end: draw m is half m of the words), one
 * buffer: n <= 128 values span at most 17 blocks, computed 16 at a time. */
typedef union {
    uint32_t w[2 * 16 * 4];
    uint16_t h[2 * 16 * 4 * 2];
} k_draws_t;

/* The draws of stream values e0 .. e0+n-1 (n <= TILE): a pointer to n of them in buf. */
static const uint16_t *draws(const gvq_kparams_t *p, uint64_t e0, size_t n, k_draws_t *buf) {
    uint64_t g0 = e0 >> 3, nb = ((e0 + n - 1) >> 3) - g0 + 1;
    for (uint64_t j = 0; j < nb; j += 16)
        philox16(p, g0 + j, buf->w + 4 * j);
    size_t s = (size_t)(e0 - 8 * g0);
#if K_LITTLE
    return buf->h + s;
#else
    for (size_t i = 0; i < n; i++) { /* words past the blocks: free after the last block's */
        size_t m = s + i;
        buf->h[128 + i] = (uint16_t)(buf->w[m >> 1] >> (16 * (m & 1)));
    }
    return buf->h + 128;
#endif
}

/* ---- QSGD ------------------------------------------------------------------------------------ */

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* max |v| as the largest bit pattern of |v| (non-negative floats order like their patterns;
 * NaN above Inf above every finite value): exact in any order. */
static uint32_t max_abs_bits(const float *v, size_t n) {
    uint32_t lane[LANES] = {0};
    size_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (size_t j = 0; j < LANES; j++) {
            uint32_t a = bits_of(v[i + j]) & 0x7fffffffu;
            lane[j] = a > lane[j] ? a : lane[j];
        }
    for (; i < n; i++) {
        uint32_t a = bits_of(v[i]) & 0x7fffffffu;
        lane[0] = a > lane[0] ? a : lane[0];
    }
    uint32_t m = 0;
    for (size_t j = 0; j < LANES; j++)
        m = lane[j] > m ? lane[j] : m;
    return m;
}

/* sqrt of the sum of squares in double: value i into lane i % 16, lanes added 0..15 in order */
static double l2_norm(const float *v, size_t n) {
    double lane[LANES] = {0};
    size_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (size_t j = 0; j < LANES; j++)
            lane[j] += (double)v[i + j] * (double)v[i + j];
    for (size_t j = 0; i < n; i++, j++)
        lane[j] += (double)v[i] * (double)v[i];
    double s = 0;
    for (size_t j = 0; j < LANES; j++)
        s += lane[j];
    return sqrt(s);
}

/* codes of n values: level floor(r) + (u < r - floor(r)), r = min(|v| inv, s), sign bit when
 * v < 0 and the level is not 0 */
static void qsgd_levels(const float *v, const uint16_t *d, size_t n, float inv, int s, int bits,
                        uint8_t *c) {
    const float sf = (float)s;
    const int32_t sign = 1 << (bits - 1);
    for (size_t i = 0; i < n; i++) {
        float r = fabsf(v[i]) * inv;
        r = r < sf ? r : sf;
        int32_t li = (int32_t)r;
        float frac = r - (float)li;
        int32_t lvl = li + ((float)d[i] * (1.0f / 65536.0f) < frac ? 1 : 0);
        c[i] = (uint8_t)(lvl | ((v[i] < 0.0f && lvl != 0) ? sign : 0));
    }
}

/* A tile's byte codes, also read as pairs and quads (little end) by pack and unpack; room for
 * whole quads past TILE. */
typedef union {
    uint8_t b[TILE + 4];
    uint16_t h[(TILE + 4) / 2];
    uint32_t w[(TILE + 4) / 4];
} k_codes_t;

/* n codes into ceil(n bits / 8) bytes, low bits first: pairs (quads) of byte codes read as one
 * 16-bit (32-bit) word and folded with shifts, which vectorizes without shuffles; c holds zeros
 * up to the next multiple of 4 past n. */
static inline void pack(const k_codes_t *c, size_t n, int bits, uint8_t *out) {
    if (bits == 8) {
        memcpy(out, c->b, n);
    } else if (!K_LITTLE) {
        for (size_t i = 0; i < n; i++)
            out[i * (size_t)bits / 8] =
                (uint8_t)((i * (size_t)bits % 8 ? out[i * (size_t)bits / 8] : 0) |
                          (c->b[i] << (i * (size_t)bits % 8)));
    } else if (bits == 4) {
        size_t h = (n + 1) / 2;
        for (size_t j = 0; j < h; j++) /* c0 | c1 << 4 (codes < 16) */
            out[j] = (uint8_t)(c->h[j] | (c->h[j] >> 4));
    } else {
        size_t q = (n + 3) / 4;
        for (size_t j = 0; j < q; j++) {
            uint32_t t = c->w[j] | (c->w[j] >> 6); /* c0 | c1 << 2 in byte 0, c2 | c3 << 2 in 2 */
            out[j] = (uint8_t)(t | (t >> 12));     /* codes < 4 */
        }
    }
}

/* The inverse of pack: each byte spread into 2 (4) byte codes with shifts (little end), else
 * one code at a time. */
static inline void unpack(const uint8_t *in, size_t n, int bits, k_codes_t *c) {
    if (bits == 8) {
        memcpy(c->b, in, n);
    } else if (!K_LITTLE) {
        for (size_t i = 0; i < n; i++)
            c->b[i] = (uint8_t)((in[i * (size_t)bits / 8] >> (i * (size_t)bits % 8)) &
                                ((1u << bits) - 1u));
    } else if (bits == 4) {
        size_t h = (n + 1) / 2;
        for (size_t j = 0; j < h; j++)
            c->h[j] = (uint16_t)((in[j] | (in[j] << 4)) & 0x0F0Fu);
    } else {
        size_t q = (n + 3) / 4;
        for (size_t j = 0; j < q; j++) {
            uint32_t x = in[j];
            x = (x | (x << 12)) & 0x000F000Fu; /* nibbles to bytes 0 and 2 */
            c->w[j] = (x | (x << 6)) & 0x03030303u;
        }
    }
}

static void k_qsgd_quantize(const gvq_kparams_t *p, uint64_t first, const float *v, size_t len,
                            uint8_t *wire, uint32_t mb) {
    const int bits = p->bits;
    uint8_t *codes = wire + sizeof(float);
    if (mb == GVQ_K_MB_UNKNOWN) mb = max_abs_bits(v, len);
    float scale;
    if (mb > bits_of(GVQ_K_FINITE_MAX)) {
        scale = NAN; /* NaN or Inf in the bucket */
    } else if (p->norm == GVQ_K_NORM_MAX) {
        memcpy(&scale, &mb, sizeof scale);
    } else {
        scale = (float)l2_norm(v, len);
    }
    memcpy(wire, &scale, sizeof scale);
    if (!(scale > 0)) { /* all zero (codes 0), or NaN */
        memset(codes, 0, (len * (size_t)bits + 7) / 8);
        return;
    }
    float inv = (float)p->levels / scale;
    if (!(inv <= FLT_MAX)) inv = FLT_MAX; /* a subnormal scale */
    k_draws_t dbuf;
    k_codes_t c;
    for (size_t t = 0; t < len; t += TILE) {
        size_t n = len - t < TILE ? len - t : TILE;
        const uint16_t *d = draws(p, first + t, n, &dbuf);
        uint8_t *out = codes + t * (size_t)bits / 8;
        if (bits == 8) { /* a code per byte: straight into the wire */
            qsgd_levels(v + t, d, n, inv, p->levels, bits, out);
        } else if (n == TILE) { /* the common case, its trip counts known */
            qsgd_levels(v + t, d, TILE, inv, p->levels, bits, c.b);
            pack(&c, TILE, bits, out);
        } else {
            qsgd_levels(v + t, d, n, inv, p->levels, bits, c.b);
            memset(c.b + n, 0, 4); /* pack reads whole pairs (quads) */
            pack(&c, n, bits, out);
        }
    }
}

static uint32_t k_qsgd_dequantize(const gvq_kparams_t *p, const uint8_t *wire, size_t len,
                                  const float *add, float *out) {
    float scale;
    memcpy(&scale, wire, sizeof scale);
    if (scale != scale) {
        for (size_t i = 0; i < len; i++)
            out[i] = add != NULL ? scale + add[i] : scale;
        return add != NULL ? max_abs_bits(out, len) : 0;
    }
    uint32_t mx = 0; /* the sums' largest |bit pattern|, as max_abs_bits finds it (exact) */
    const int bits = p->bits;
    const unsigned mask = (1u << (bits - 1)) - 1u, sh = (unsigned)bits - 1u;
    const float unit = scale / (float)p->levels;
    k_codes_t cc;
    for (size_t t = 0; t < len; t += TILE) {
        size_t n = len - t < TILE ? len - t : TILE;
        const uint8_t *in = wire + sizeof(float) + t * (size_t)bits / 8, *c = in; /* 8 bits */
        if (bits != 8) {
            unpack(in, n, bits, &cc);
            c = cc.b;
        }
        float *o = out + t;
        if (add != NULL) {
            const float *a = add + t;
            for (size_t i = 0; i < n; i++) {
                float mag = (float)(c[i] & mask) * unit, y = ((c[i] >> sh) ? -mag : mag) + a[i];
                uint32_t b = bits_of(y) & 0x7fffffffu;
                o[i] = y;
                mx = b > mx ? b : mx;
            }
        } else {
            for (size_t i = 0; i < n; i++) {
                float mag = (float)(c[i] & mask) * unit;
                o[i] = (c[i] >> sh) ? -mag : mag;
            }
        }
    }
    return mx;
}

/* ---- integer-summed wires ------------------------------------------------------------------- */

/* the signed level of y: floor(r) + (u < frac), r = |y| m clamped to [0, lv] (NaN: 0) */
static inline int32_t is_level(float y, float m, float lvf, uint16_t d) {
    float r = fabsf(y) * m;
    r = r == r ? r : 0.0f;
    r = r < lvf ? r : lvf;
    int32_t li = (int32_t)r;
    int32_t q = li + ((float)d * (1.0f / 65536.0f) < r - (float)li ? 1 : 0);
    return y < 0.0f ? -q : q;
}

static void k_is_quantize_add(const gvq_kparams_t *p, uint64_t k0, const float *y, size_t n,
                              const float *mult, int stride, const void *in, void *out) {
    const float lvf = (float)p->levels;
    k_draws_t dbuf;
    for (size_t t = 0; t < n; t += TILE) {
        size_t m = n - t < TILE ? n - t : TILE;
        const uint16_t *d = draws(p, k0 + t, m, &dbuf);
        const float *yt = y + t, *mt = stride ? mult + t : mult;
        if (p->bits == 8) {
            int8_t *o = (int8_t *)out + t;
            const int8_t *a = in != NULL ? (const int8_t *)in + t : NULL;
            for (size_t j = 0; j < m; j++) {
                int32_t q = is_level(yt[j], stride ? mt[j] : mt[0], lvf, d[j]);
                o[j] = (int8_t)(q + (a != NULL ? a[j] : 0));
            }
        } else {
            int16_t *o = (int16_t *)out + t;
            const int16_t *a = in != NULL ? (const int16_t *)in + t : NULL;
            for (size_t j = 0; j < m; j++) {
                int32_t q = is_level(yt[j], stride ? mt[j] : mt[0], lvf, d[j]);
                o[j] = (int16_t)(q + (a != NULL ? a[j] : 0));
            }
        }
    }
}

static void k_is_to_float(int bits, const void *wire, size_t n, const float *unit, int stride,
                          float *dst) {
    if (bits == 8) {
        const int8_t *w = wire;
        if (stride)
            for (size_t j = 0; j < n; j++)
                dst[j] = (float)w[j] * unit[j];
        else
            for (size_t j = 0; j < n; j++)
                dst[j] = (float)w[j] * unit[0];
    } else {
        const int16_t *w = wire;
        if (stride)
            for (size_t j = 0; j < n; j++)
                dst[j] = (float)w[j] * unit[j];
        else
            for (size_t j = 0; j < n; j++)
                dst[j] = (float)w[j] * unit[0];
    }
}

static void k_max_abs_blocks(const float *y, size_t n, size_t block, float *out) {
    for (size_t b = 0, i = 0; i < n; b++, i += block) {
        uint32_t m = max_abs_bits(y + i, n - i < block ? n - i : block);
        if (m > 0x7f800000u) m = 0x7f800000u; /* NaN counts as Inf */
        memcpy(&out[b], &m, sizeof m);
    }
}

static int k_all_finite(const float *v, size_t n) {
    return max_abs_bits(v, n) < 0x7f800000u; /* below Inf's pattern: finite */
}

/* ---- IEEE binary16 <-> float: gvq_util.h's gvq_float_to_half / gvq_half_to_float bit for bit,
 * with selects instead of branches so that the lanes run together. ------------------------ */

static void f32_to_f16_tile(const uint32_t *in, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t x = in[i], absx = x & 0x7fffffffu;
        uint32_t sign = (x >> 16) & 0x8000u;
        uint32_t nan = absx > 0x7f800000u ? 0x200u | ((absx >> 13) & 0x3ffu) : 0u;
        uint32_t special = 0x7c00u | nan; /* inf, nan, or overflow to inf (nan is 0 there) */
        uint32_t r = absx + 0xfffu + ((absx >> 13) & 1u);
        uint32_t normal = (r - 0x38000000u) >> 13;
        /* subnormal half: shift 14..24 (clamped for the lanes that are not subnormal) */
        uint32_t e = absx >> 23;
        e = e < 102u ? 102u : e;
        e = e > 112u ? 112u : e;
        uint32_t sh = 126u - e;
        uint32_t m = (absx & 0x7fffffu) | 0x800000u, hm = m >> sh;
        uint32_t rem = m & ((1u << sh) - 1u), halfway = 1u << (sh - 1u);
        uint32_t up = (uint32_t)(rem > halfway) | ((uint32_t)(rem == halfway) & hm);
        hm += up & 1u;
        uint32_t h = absx >= 0x33000000u ? hm : 0u;
        h = absx >= 0x38800000u ? normal : h;
        h = absx >= 0x477ff000u ? special : h;
        dst[i] = (uint16_t)(sign | h);
    }
}

static void k_f32_to_f16(const float *src, uint16_t *dst, size_t n) {
    uint32_t buf[TILE];
    size_t t = 0;
#if defined(__AVX512F__)
    /* vcvtps2ph rounding to nearest even: IEEE's conversion, which the C form spells out
     * (a NaN keeps its sign and top payload bits and turns quiet; checked on every float
     * pattern class by tests/unit/test_kernels.c) */
    for (; t + 16 <= n; t += 16)
        _mm256_storeu_si256((__m256i *)(dst + t),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + t),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__)
    for (; t + 8 <= n; t += 8)
        _mm_storeu_si128((__m128i *)(dst + t),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + t),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; t < n; t += TILE) {
        size_t m = n - t < TILE ? n - t : TILE;
        memcpy(buf, src + t, 4 * m);
        f32_to_f16_tile(buf, dst + t, m);
    }
}

static void k_f16_to_f32(const uint16_t *src, float *dst, size_t n) {
    union {
        float f[TILE];
        uint32_t u[TILE];
    } sub;
    uint32_t out[TILE];
    size_t t = 0;
    /* vcvtph2ps is exact, as the C form, but quiets a signalling NaN (sets bit 22), which the
     * C form keeps as it is: that bit is cleared again where the half was one. */
#if defined(__AVX512F__)
    for (; t + 16 <= n; t += 16) {
        __m256i hv = _mm256_loadu_si256((const __m256i *)(src + t));
        __m512i w = _mm512_cvtepu16_epi32(hv), f = _mm512_castps_si512(_mm512_cvtph_ps(hv));
        __mmask16 snan = _mm512_cmpeq_epi32_mask(_mm512_and_si512(w, _mm512_set1_epi32(0x7e00)),
                                                 _mm512_set1_epi32(0x7c00)) &
                         _mm512_test_epi32_mask(w, _mm512_set1_epi32(0x1ff));
        f = _mm512_mask_xor_epi32(f, snan, f, _mm512_set1_epi32(0x400000));
        _mm512_storeu_si512((void *)(dst + t), f);
    }
#elif defined(__F16C__)
    for (; t + 8 <= n; t += 8) {
        __m128i hv = _mm_loadu_si128((const __m128i *)(src + t));
        __m256i w = _mm256_cvtepu16_epi32(hv), f = _mm256_castps_si256(_mm256_cvtph_ps(hv));
        __m256i snan =
            _mm256_andnot_si256(_mm256_cmpeq_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x1ff)),
                                                   _mm256_setzero_si256()),
                                _mm256_cmpeq_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x7e00)),
                                                   _mm256_set1_epi32(0x7c00)));
        f = _mm256_xor_si256(f, _mm256_and_si256(snan, _mm256_set1_epi32(0x400000)));
        _mm256_storeu_si256((__m256i *)(dst + t), f);
    }
#endif
    for (; t < n; t += TILE) {
        size_t m = n - t < TILE ? n - t : TILE;
        const uint16_t *h = src + t;
        for (size_t i = 0; i < m; i++) /* a subnormal half is man 2^-24 exactly, a normal float */
            sub.f[i] = (float)(int32_t)(h[i] & 0x3ffu) * 5.9604644775390625e-8f;
        for (size_t i = 0; i < m; i++) {
            uint32_t sign = (uint32_t)(h[i] & 0x8000u) << 16, exp = (h[i] >> 10) & 0x1fu;
            uint32_t man = h[i] & 0x3ffu;
            uint32_t b = exp != 0 ? ((exp + 112u) << 23) | (man << 13) : sub.u[i];
            b = exp == 0x1fu ? 0x7f800000u | (man << 13) : b;
            out[i] = b | sign;
        }
        memcpy(dst + t, out, 4 * m);
    }
}

#include "codec_linalg.h" /* k_expand, k_project, k_back */
#include "codec_colloc.h" /* k_collocate, k_uncollocate */

/* ---- error feedback's norms: 8 double lanes (value i into lane i % 8, added 0..7) ---------- */

static double lanes8_sum(const double *lane) {
    double s = 0;
    for (size_t j = 0; j < 8; j++)
        s += lane[j];
    return s;
}

#if defined(__AVX512F__)
typedef __m512d l8_t; /* the 8 lanes in one register */
static inline l8_t l8_zero(void) {
    return _mm512_setzero_pd();
}
static inline l8_t l8_addsq(l8_t a, __m256 x) {
    __m512d d = _mm512_cvtps_pd(x);
    return _mm512_add_pd(a, _mm512_mul_pd(d, d));
}
static inline void l8_store(double *lane, l8_t a) {
    _mm512_storeu_pd(lane, a);
}
#define K_L8 1
#elif defined(__AVX2__)
typedef struct {
    __m256d lo, hi; /* lanes 0-3 and 4-7 */
} l8_t;
static inline l8_t l8_zero(void) {
    return (l8_t){_mm256_setzero_pd(), _mm256_setzero_pd()};
}
static inline l8_t l8_addsq(l8_t a, __m256 x) {
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    a.lo = _mm256_add_pd(a.lo, _mm256_mul_pd(lo, lo));
    a.hi = _mm256_add_pd(a.hi, _mm256_mul_pd(hi, hi));
    return a;
}
static inline void l8_store(double *lane, l8_t a) {
    _mm256_storeu_pd(lane, a.lo);
    _mm256_storeu_pd(lane + 4, a.hi);
}
#define K_L8 1
#else
#define K_L8 0
#endif

static double k_sumsq8(const float *v, float *dst, size_t n) {
    double lane[8] = {0};
    size_t i = 0;
#if K_L8
    l8_t a = l8_zero();
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(v + i);
        if (dst != NULL) _mm256_storeu_ps(dst + i, x);
        a = l8_addsq(a, x);
    }
    l8_store(lane, a);
#else
    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; j++) {
            float x = v[i + j];
            if (dst != NULL) dst[i + j] = x;
            lane[j] += (double)x * (double)x;
        }
#endif
    for (size_t j = 0; i < n; i++, j++) {
        float x = v[i];
        if (dst != NULL) dst[i] = x;
        lane[j] += (double)x * (double)x;
    }
    return lanes8_sum(lane);
}

static int k_ef_prepare(const float *g, const float *e, size_t n, float *out, double *gs,
                        double *xs) {
    double gl[8] = {0}, xl[8] = {0};
    float nonfinite = 0.0f; /* x * 0 is NaN exactly when x is NaN or infinite */
    size_t i = 0;
#if K_L8
    l8_t ga = l8_zero(), xa = l8_zero();
    __m256 nf = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 xv = e != NULL ? _mm256_add_ps(gv, _mm256_loadu_ps(e + i)) : gv;
        if (out != NULL) _mm256_storeu_ps(out + i, xv);
        ga = l8_addsq(ga, gv);
        xa = l8_addsq(xa, xv);
        nf = _mm256_add_ps(nf, _mm256_mul_ps(xv, _mm256_setzero_ps()));
    }
    l8_store(gl, ga);
    l8_store(xl, xa);
    float nfl[8];
    _mm256_storeu_ps(nfl, nf);
    for (size_t j = 0; j < 8; j++)
        nonfinite += nfl[j];
#else
    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; j++) {
            float gi = g[i + j], xi = e != NULL ? gi + e[i + j] : gi;
            if (out != NULL) out[i + j] = xi;
            gl[j] += (double)gi * (double)gi;
            xl[j] += (double)xi * (double)xi;
            nonfinite += xi * 0.0f;
        }
#endif
    for (size_t j = 0; i < n; i++, j++) {
        float gi = g[i], xi = e != NULL ? gi + e[i] : gi;
        if (out != NULL) out[i] = xi;
        gl[j] += (double)gi * (double)gi;
        xl[j] += (double)xi * (double)xi;
        nonfinite += xi * 0.0f;
    }
    *gs = lanes8_sum(gl);
    *xs = lanes8_sum(xl);
    return nonfinite == 0.0f;
}

const gvq_kernels_t K_TABLE = {
    .name = K_STR(GVQ_KPATH),
    .qsgd_quantize = k_qsgd_quantize,
    .qsgd_dequantize = k_qsgd_dequantize,
    .is_quantize_add = k_is_quantize_add,
    .is_to_float = k_is_to_float,
    .max_abs_blocks = k_max_abs_blocks,
    .all_finite = k_all_finite,
    .f32_to_f16 = k_f32_to_f16,
    .f16_to_f32 = k_f16_to_f32,
    .expand = k_expand,
    .project = k_project,
    .back = k_back,
    .collocate = k_collocate,
    .uncollocate = k_uncollocate,
    .sumsq8 = k_sumsq8,
    .ef_prepare = k_ef_prepare,
};
