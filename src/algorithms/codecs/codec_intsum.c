/*
 * codec_intsum.c -- integer-summed wires: values quantized against scales every rank shares,
 * so the ring adds integers (exact, order-independent, identical on every rank), after THC
 * (Li et al., NSDI 2024) for scalar quantization, applied here to QSGD's values and to
 * GradiVeQ's coefficients (docs/ALGORITHMS.md section 2: the coefficients are linear in the input,
 * so their sum is the coefficient vector of the sum; quantizing each rank's coefficients with its
 * own scale would lose that).
 *
 *   begin (once per call, collective)
 *     y = this rank's values in codec coordinates        QSGD: the values themselves
 *                                                          GradiVeQ: c = U^T (x - Z/N) per full
 *                                                          slice, then the raw tail
 *     m_b = max |y| over block b                          QSGD: a bucket; GradiVeQ: one
 *                                                          coefficient index of one reuse group
 *                                                          (all its slices), the tail one block
 *     scale_b = max over ranks of m_b                     one small max-allreduce of the float
 *                                                          bit patterns (order-preserving for
 *                                                          non-negative floats; NaN/Inf > all)
 *   encode_combine (per chunk, per hop)
 *     q_i = stochastic_round(y_i lv / scale_b)            |q_i| <= lv, unbiased
 *     out_i = q_i + in_i                                  b-bit integer add, exact
 *   decode (once per chunk)
 *     sum_i scale_b / lv                                  QSGD: the output value;
 *                                                          GradiVeQ: a coefficient, then
 *                                                          x = U c + Z (the GradiVeQ decode)
 *
 * Headroom: each rank's level is bounded by lv = floor((2^(b-1) - 1) / N) (and for QSGD by its
 * own s = 2^(qsgdBits-1) - 1), so the sum of N ranks' levels lies in [-(2^(b-1) - 1), 2^(b-1)
 * - 1] and the b-bit accumulator never overflows, whatever the order of the additions. With
 * 8 bits, 4 ranks get lv = 31 (GradiVeQ) and QSGD 4-bit keeps its s = 7 up to 18 ranks; a
 * communicator where lv would be 0 (more than 127 ranks at 8 bits) is refused. Each rank's
 * rounding error is below one level, so |decoded - exact sum| <= N scale_b / lv per value.
 *
 * A block holding NaN or Inf on any rank gets an Inf scale on every rank and decodes to NaN (as
 * a plain allreduce propagates it); its codes travel as zeros.
 *
 *     wire of a chunk:  [ b-bit integers of the chunk's y values, in y order ][ pad to 4 bytes ]
 *
 * The random bits come from Philox keyed by (seed, rank), counter (y index / 8, call), 16 bits
 * per value (codec_kernels.h), so runs repeat and no two ranks, calls or values share bits. The
 * loops are codec_kernels.c's: one per instruction set, the same bits on each. A value's level
 * is |y| (lv / scale_b) rounded, lv / scale_b computed once per block and call.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "codec_kernels.h"
#include "gvq_algo.h"

/* The y values of the chunk [off, off+count) of the tensor: [y0, y0+n) (GradiVeQ: the chunk's
 * slices' coefficients, then the tail's raw values when the chunk holds the tensor's end). */
static void is_span(const gvq_intsum_t *s, size_t off, size_t count, size_t *y0, size_t *ncoef,
                    size_t *t0, size_t *ntail) {
    if (s->gq == NULL) {
        *y0 = off;
        *ncoef = count;
        *t0 = *ntail = 0;
        return;
    }
    size_t L = s->gq->L, d = s->gq->d;
    *y0 = off / L * d;
    *ncoef = count / L * d;
    *ntail = count % L; /* only the chunk at the tensor's end has one */
    *t0 = s->gq->count / L * d;
}

/* The block (scale index) of y value k. */
static size_t is_block(const gvq_intsum_t *s, size_t k) {
    if (s->blk != NULL) return s->blk[k];
    if (s->gq == NULL) return k / s->block;
    size_t d = s->gq->d, ncoef = s->gq->count / s->gq->L * d;
    if (k >= ncoef) return s->nscales - 1; /* the raw tail */
    return k / d / s->gq->C * d + k % d;
}

static size_t is_bytes(const gvq_intsum_t *s, size_t n) {
    return (n * (size_t)(s->bits / 8) + 3) & ~(size_t)3;
}

size_t gvq_intsum_wire_size(const gvq_intsum_t *s, size_t off, size_t count) {
    size_t y0, nc, t0, nt;
    is_span(s, off, count, &y0, &nc, &t0, &nt);
    return is_bytes(s, nc + nt);
}

static size_t is_wire_bytes(const gvq_codec_t *c, size_t off, size_t count) {
    return gvq_intsum_wire_size(c->state, off, count);
}

/* The run of y values from k (at most n) that find their scales alike: stride 0, all of them
 * use block *b; stride 1, value k + j uses block *b + j (GradiVeQ: the d coefficients of one
 * slice). Returns its length. */
static size_t is_run(const gvq_intsum_t *s, size_t k, size_t n, size_t *b, int *stride) {
    *stride = 0;
    if (s->blk != NULL) {
        size_t m = 1;
        *b = s->blk[k];
        while (m < n && s->blk[k + m] == *b)
            m++;
        return m;
    }
    if (s->gq == NULL) {
        *b = k / s->block;
        return GVQ_MIN(n, (*b + 1) * s->block - k);
    }
    size_t d = s->gq->d, ncoef = s->gq->count / s->gq->L * d;
    *b = is_block(s, k);
    if (k >= ncoef) return n; /* the raw tail: one block */
    *stride = 1;
    return GVQ_MIN(n, GVQ_MIN(d - k % d, ncoef - k));
}

/* out[j] = q(y[k0 + j]) + in[j] for n values (in may be NULL): q(y) = y lv / scale rounded up
 * with probability equal to the fraction (codec_kernels.c), run by run of shared scales. */
static void is_add_range(const gvq_intsum_t *s, size_t k0, size_t n, const void *in, void *out,
                         size_t at) {
    const gvq_kernels_t *kt = gvq_kernels();
    gvq_kparams_t p = {s->bits, s->levels, 0, {s->seed, s->rank}, s->call, GVQ_K_TAG_INTSUM};
    size_t esz = (size_t)s->bits / 8;
    for (size_t j = 0; j < n;) {
        size_t b;
        int stride;
        size_t m = is_run(s, k0 + j, n - j, &b, &stride);
        kt->is_quantize_add(&p, k0 + j, s->y + k0 + j, m, s->mult + b, stride,
                            in != NULL ? (const char *)in + (at + j) * esz : NULL,
                            (char *)out + (at + j) * esz);
        j += m;
    }
}

static gvqResult_t is_encode_combine(const gvq_codec_t *c, size_t off, size_t count,
                                     const void *local, const void *in, void *out) {
    const gvq_intsum_t *s = c->state;
    size_t y0, nc, t0, nt;
    (void)local; /* begin took the local values (y) */
    is_span(s, off, count, &y0, &nc, &t0, &nt);
    is_add_range(s, y0, nc, in, out, 0);
    is_add_range(s, t0, nt, in, out, nc);
    return gvqSuccess;
}

/* dst[j] = sum of y value k0 + j as a float: wire[at + j] scale / lv (NaN for a non-finite
 * block). */
static void is_to_float(const gvq_intsum_t *s, size_t k0, size_t n, const void *wire, size_t at,
                        float *dst) {
    const gvq_kernels_t *kt = gvq_kernels();
    size_t esz = (size_t)s->bits / 8;
    for (size_t j = 0; j < n;) {
        size_t b;
        int stride;
        size_t m = is_run(s, k0 + j, n - j, &b, &stride);
        kt->is_to_float(s->bits, (const char *)wire + (at + j) * esz, m, s->unit + b, stride,
                        dst + j);
        j += m;
    }
}

static gvqResult_t is_decode(const gvq_codec_t *c, size_t off, size_t count, const void *wire,
                             void *dst) {
    gvq_intsum_t *s = c->state;
    size_t y0, nc, t0, nt;
    is_span(s, off, count, &y0, &nc, &t0, &nt);
    if (s->gq == NULL) {
        is_to_float(s, y0, nc, wire, 0, dst);
        return gvqSuccess;
    }
    /* GradiVeQ: rebuild the fp32 wire [coefficients][tail] and let its decode do x = U c + Z */
    float *w = s->tmp;
    if (nc + nt > s->tmp_len) {
        float *t = realloc(s->tmp, sizeof(float) * (nc + nt));
        if (t == NULL) {
            GVQ_WARN("integer-summed wire: cannot allocate %zu floats of scratch", nc + nt);
            return gvqSystemError;
        }
        s->tmp = w = t;
        s->tmp_len = nc + nt;
    }
    is_to_float(s, y0, nc, wire, 0, w);
    is_to_float(s, t0, nt, wire, nc, w + nc);
    return s->gq_codec.decode(&s->gq_codec, off, count, w, dst);
}

/* This rank's max |y| per block over y values [k0, k1) into s->scale; every other block 0. */
static void is_local_scales(gvq_intsum_t *s, size_t k0, size_t k1) {
    const gvq_kernels_t *kt = gvq_kernels();
    if (s->gq == NULL && s->blk == NULL && k0 == 0 && k1 == s->ny) {
        kt->max_abs_blocks(s->y, s->ny, s->block, s->scale); /* blocks of `block` values */
        return;
    }
    for (size_t b = 0; b < s->nscales; b++)
        s->scale[b] = 0;
    for (size_t k = k0; k < k1;) {
        size_t b;
        int stride;
        size_t m = is_run(s, k, k1 - k, &b, &stride);
        if (stride == 0) { /* one block: the kernel's max over a block of m values */
            float a;
            kt->max_abs_blocks(s->y + k, m, m, &a);
            if (a > s->scale[b]) s->scale[b] = a;
        } else {
            for (size_t i = 0; i < m; i++) {
                float a = fabsf(s->y[k + i]);
                if (a != a) a = INFINITY; /* NaN and Inf alike, as the kernel has it */
                if (a > s->scale[b + i]) s->scale[b + i] = a;
            }
        }
        k += m;
    }
}

void gvq_intsum_local_scales(gvq_intsum_t *s) {
    is_local_scales(s, 0, s->ny);
}

/* Non-negative floats order like their bit patterns as int32: a max over the patterns is the
 * max of the floats. A NaN or Inf value makes its block's scale Inf, above every finite one.
 * Then each block's multiplier (lv / scale, 0 for a zero or non-finite block) and unit. The
 * local maxima are over y values [k0, k1) (the part this rank encodes); the max over the ranks
 * of ctx makes every block's scale whichever ranks hold it. */
static gvqResult_t is_agree_scales(gvq_intsum_t *s, gvq_coll_ctx_t *ctx, size_t k0, size_t k1) {
    is_local_scales(s, k0, k1);
    GVQCHECK(gvq_agree_i32(ctx, (int32_t *)s->scale, (int)s->nscales, gvqMax));
    const float lv = (float)s->levels;
    for (size_t b = 0; b < s->nscales; b++) {
        float sc = s->scale[b], m = lv / sc;
        s->mult[b] = sc > 0 && sc <= GVQ_K_FINITE_MAX ? (m <= FLT_MAX ? m : FLT_MAX) : 0.0f;
        s->unit[b] = sc <= GVQ_K_FINITE_MAX ? sc / lv : NAN;
    }
    return gvqSuccess;
}

/* begin for a rank that encodes only [lo, hi) of the tensor (the hierarchy's stage across the
 * hosts: its piece of the host's sum; lo and hi on the granule): y of that part only (GradiVeQ:
 * its slices' coefficients, and the tail when hi is the end), its blocks' maxima. */
static gvqResult_t is_begin_part(const gvq_codec_t *c, gvq_coll_ctx_t *ctx, const void *local,
                                 size_t count, size_t lo, size_t hi) {
    gvq_intsum_t *s = c->state;
    if (lo > hi || hi > count || lo % c->granule != 0 || (hi % c->granule != 0 && hi != count))
        return gvqInternalError;
    size_t y0, nc, t0, nt;
    is_span(s, lo, hi - lo, &y0, &nc, &t0, &nt);
    if (s->gq == NULL) {
        s->y = local;
        s->ny = count;
    } else { /* this part's coefficients (the fp32 GradiVeQ encode), in y's layout */
        if (hi > lo)
            GVQCHECK(s->gq_codec.encode_combine(&s->gq_codec, lo, hi - lo,
                                                (const float *)local + lo, NULL, s->ybuf + y0));
        s->y = s->ybuf;
    }
    if (nt == 0) t0 = y0 + nc; /* no tail in the part: [y0, y0 + nc) */
    return is_agree_scales(s, ctx, nc > 0 ? y0 : t0, t0 + nt);
}

static gvqResult_t is_begin(const gvq_codec_t *c, gvq_coll_ctx_t *ctx, const void *local,
                            size_t count) {
    return is_begin_part(c, ctx, local, count, 0, count);
}

/* The scales, multipliers and units of s->nscales blocks (s holds none yet). */
static gvqResult_t is_alloc_scales(gvq_intsum_t *s) {
    size_t n = GVQ_MAX(s->nscales, (size_t)1);
    s->scale = calloc(n, sizeof(float));
    s->mult = calloc(n, sizeof(float));
    s->unit = calloc(n, sizeof(float));
    return s->scale != NULL && s->mult != NULL && s->unit != NULL ? gvqSuccess : gvqSystemError;
}

/* The width, levels and stream of s (zeroed first); the checks every layout shares. */
static gvqResult_t is_setup(gvq_intsum_t *s, int bits, int max_levels, int nranks, uint32_t seed,
                            uint32_t rank) {
    memset(s, 0, sizeof *s);
    if (bits != 8 && bits != 16) {
        GVQ_WARN("integer-summed wire: bits=%d must be 8 or 16", bits);
        return gvqInvalidArgument;
    }
    int lv = ((1 << (bits - 1)) - 1) / GVQ_MAX(nranks, 1);
    if (max_levels > 0 && lv > max_levels) lv = max_levels;
    if (lv < 1) {
        GVQ_WARN("integer-summed wire: %d ranks cannot add %d-bit integers without overflow "
                 "(each rank needs at least one level: at most %d ranks)",
                 nranks, bits, (1 << (bits - 1)) - 1);
        return gvqInvalidArgument;
    }
    s->bits = bits;
    s->levels = lv;
    s->seed = seed;
    s->rank = rank;
    return gvqSuccess;
}

gvqResult_t gvq_intsum_init(gvq_intsum_t *s, int bits, int max_levels, size_t block,
                            gvq_gradiveq_t *gq, const gvq_device_ops_t *dev, size_t count,
                            int nranks, uint32_t seed, uint32_t rank) {
    GVQCHECK(is_setup(s, bits, max_levels, nranks, seed, rank));
    if (gq == NULL && block == 0) {
        GVQ_WARN("integer-summed wire: block of 0 values");
        return gvqInvalidArgument;
    }
    s->block = block;
    s->gq = gq;
    if (gq != NULL) {
        size_t full = count / gq->L;
        s->ny = full * gq->d + count % gq->L;
        s->nscales = GVQ_DIV_UP(full, gq->C) * gq->d + 1;
        gvq_codec_gradiveq_init(&s->gq_codec, dev, gq);
        if ((s->ybuf = malloc(sizeof(float) * GVQ_MAX(s->ny, (size_t)1))) == NULL) goto oom;
    } else {
        s->nscales = GVQ_DIV_UP(count, block);
    }
    if (is_alloc_scales(s) != gvqSuccess) goto oom;
    return gvqSuccess;
oom:
    GVQ_WARN("integer-summed wire: cannot allocate its %zu scales", s->nscales);
    gvq_intsum_fini(s);
    return gvqSystemError;
}

gvqResult_t gvq_intsum_init_columns(gvq_intsum_t *s, int bits, const size_t *col_len, size_t ncols,
                                    int nranks, uint32_t seed, uint32_t rank) {
    size_t ny = 0;
    for (size_t j = 0; j < ncols; j++)
        ny += col_len[j];
    if (ncols == 0 || ny == 0 || ncols > UINT32_MAX) {
        GVQ_WARN("integer-summed wire: %zu columns of %zu values in all", ncols, ny);
        return gvqInvalidArgument;
    }
    GVQCHECK(is_setup(s, bits, 0, nranks, seed, rank));
    s->block = ny; /* as one block of ny values would have it; the columns are the blocks */
    s->nscales = ncols;
    s->blk = malloc(sizeof(uint32_t) * ny);
    if (s->blk == NULL || is_alloc_scales(s) != gvqSuccess) {
        GVQ_WARN("integer-summed wire: cannot allocate the scales of %zu columns", ncols);
        gvq_intsum_fini(s);
        return gvqSystemError;
    }
    for (size_t j = 0, k = 0; j < ncols; j++)
        for (size_t i = 0; i < col_len[j]; i++)
            s->blk[k++] = (uint32_t)j;
    return gvqSuccess;
}

void gvq_intsum_fini(gvq_intsum_t *s) {
    free(s->blk);
    free(s->mult);
    free(s->unit);
    free(s->ybuf);
    free(s->scale);
    free(s->tmp);
    memset(s, 0, sizeof *s);
}

void gvq_codec_intsum_init(gvq_codec_t *c, const gvq_device_ops_t *dev, gvq_intsum_t *s) {
    memset(c, 0, sizeof *c);
    c->name = s->gq != NULL ? "gradiveq-int" : "qsgd-int";
    c->wire_is_values = 0;
    c->granule = s->gq != NULL ? s->gq->L : 1;
    c->wire_bytes = is_wire_bytes;
    c->begin = is_begin;
    c->begin_part = is_begin_part;
    c->encode_combine = is_encode_combine;
    c->decode = is_decode;
    c->dev = dev;
    c->dtype = gvqFloat32;
    c->op = gvqSum;
    c->state = s;
}
