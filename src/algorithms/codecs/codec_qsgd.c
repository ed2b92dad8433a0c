/*
 * codec_qsgd.c -- QSGD (Alistarh et al., NeurIPS 2017; docs/ALGORITHMS.md section 3) as a ring
 * codec.
 *
 * A bucket v of B float values travels as one float scale (the L2 or max norm of v) and, per
 * value, a sign bit and a level q in 0..s packed into `bits` bits (s = 2^(bits-1) - 1, so
 * "4-bit QSGD" is s = 7):
 *
 *     r = |v_i| s / ||v||,  l = floor(r),  q = l + 1 with probability r - l, else l
 *     Q(v_i) = ||v|| sgn(v_i) q / s                      (unbiased: E[Q(v)] = v)
 *
 *     wire, one bucket:  [ float scale ][ code 0 | code 1 | ... ]   codes packed low bits first
 *
 * QSGD is not linear: combining at a ring hop decodes the incoming bucket, adds the local
 * values and quantizes again, so error grows with every hop (the paper's comparison point).
 * The random bits come from Philox keyed by (seed, rank) with the counter (element index / 8,
 * call): 16 bits per element (codec_kernels.h), so a run is reproducible and no two ranks, calls
 * or elements share bits. The loops themselves are codec_kernels.c's, one path per instruction
 * set, the same bits on every path. Several
 * tensors fused into one ring keep their own element indices, calls and seeds (map_first,
 * map_call, map_seed), so a fused call draws the bits of the calls one by one.
 * A bucket holding NaN or Inf travels with a NaN scale and decodes to NaN, as a plain
 * allreduce would propagate it; nothing stops mid-ring.
 */
#include <math.h>
#include <stdlib.h>

#include "codec_kernels.h"
#include "gvq_algo.h"

static size_t qsgd_bucket_bytes(int bits, size_t len) {
    return sizeof(float) + GVQ_DIV_UP(len * (size_t)bits, 8);
}

size_t gvq_qsgd_wire_size(int bits, size_t bucket, size_t count) {
    size_t full = count / bucket, tail = count % bucket;
    return full * qsgd_bucket_bytes(bits, bucket) + (tail ? qsgd_bucket_bytes(bits, tail) : 0);
}

static size_t qsgd_wire_bytes(const gvq_codec_t *c, size_t off, size_t count) {
    const gvq_qsgd_t *q = c->state;
    (void)off; /* off is a multiple of the bucket: only the last bucket can be short */
    return gvq_qsgd_wire_size(q->bits, q->bucket, count);
}

/* The kernels' parameters for this codec and call (codec_kernels.h). */
static gvq_kparams_t qsgd_kparams(const gvq_qsgd_t *q, uint32_t call) {
    gvq_kparams_t p = {q->bits,
                       q->levels,
                       q->norm == GVQ_QSGD_NORM_MAX ? GVQ_K_NORM_MAX : GVQ_K_NORM_L2,
                       {q->seed, q->rank},
                       call,
                       GVQ_K_TAG_QSGD};
    return p;
}

/* Quantize one bucket of len values starting at tensor element `first` into wire (p: this
 * call's parameters; a bucket of a fused call takes its own tensor's call and index). */
static void qsgd_quantize(const gvq_kernels_t *k, const gvq_qsgd_t *q, const gvq_kparams_t *p,
                          size_t first, const float *v, size_t len, uint8_t *wire, uint32_t mb) {
    if (q->map_first == NULL) {
        k->qsgd_quantize(p, first, v, len, wire, mb);
        return;
    }
    gvq_kparams_t own = *p; /* a bucket of one of several tensors (gvq_qsgd_t) */
    own.call = q->map_call[first / q->bucket];
    own.key[0] = q->map_seed[first / q->bucket];
    k->qsgd_quantize(&own, (size_t)q->map_first[first / q->bucket], v, len, wire, mb);
}

/* encode_combine: per bucket, (decode `in` and add the local values into the bucket's scratch,
 * still in L1,) then quantize: each value is read from memory once. */
static gvqResult_t qsgd_encode_combine(const gvq_codec_t *c, size_t off, size_t count,
                                       const void *local, const void *in, void *out) {
    gvq_qsgd_t *q = c->state;
    const gvq_kernels_t *k = gvq_kernels();
    gvq_kparams_t p = qsgd_kparams(q, q->call);
    const float *x = local;
    const uint8_t *win = in;
    uint8_t *wout = out;
    for (size_t b = 0; b < count; b += q->bucket) {
        size_t len = GVQ_MIN(q->bucket, count - b), bytes = qsgd_bucket_bytes(q->bits, len);
        const float *src = x + b;
        uint32_t mb = GVQ_K_MB_UNKNOWN;
        if (b + len < count) { /* the next bucket's values and wire, while this one is coded */
            size_t next = GVQ_MIN(q->bucket, count - b - len);
            gvq_prefetch_range(x + b + len, sizeof(float) * next);
            if (win != NULL) gvq_prefetch_range(win + bytes, qsgd_bucket_bytes(q->bits, next));
        }
        if (win != NULL) {                                        /* decode, add, re-encode */
            mb = k->qsgd_dequantize(&p, win, len, x + b, q->tmp); /* the sum's max with it */
            src = q->tmp;
            win += bytes;
        }
        qsgd_quantize(k, q, &p, off + b, src, len, wout, mb);
        wout += bytes;
    }
    return gvqSuccess;
}

static gvqResult_t qsgd_decode(const gvq_codec_t *c, size_t off, size_t count, const void *wire,
                               void *dst) {
    gvq_qsgd_t *q = c->state;
    const gvq_kernels_t *k = gvq_kernels();
    gvq_kparams_t p = qsgd_kparams(q, q->call);
    const uint8_t *w = wire;
    float *d = dst;
    (void)off;
    for (size_t b = 0; b < count; b += q->bucket) {
        size_t len = GVQ_MIN(q->bucket, count - b);
        (void)k->qsgd_dequantize(&p, w, len, NULL, d + b);
        w += qsgd_bucket_bytes(q->bits, len);
    }
    return gvqSuccess;
}

gvqResult_t gvq_qsgd_init(gvq_qsgd_t *q, int bits, size_t bucket, int norm, uint32_t seed,
                          uint32_t rank) {
    memset(q, 0, sizeof *q);
    if (bits != 2 && bits != 4 && bits != 8) {
        GVQ_WARN("QSGD: bits=%d must be 2, 4 or 8 (sign + level bits per value)", bits);
        return gvqInvalidArgument;
    }
    if (bucket < 1 || bucket > (1u << 24)) {
        GVQ_WARN("QSGD: bucket=%zu must be in [1, 2^24]", bucket);
        return gvqInvalidArgument;
    }
    if (norm != GVQ_QSGD_NORM_L2 && norm != GVQ_QSGD_NORM_MAX) {
        GVQ_WARN("QSGD: norm=%d must be L2 (0) or max (1)", norm);
        return gvqInvalidArgument;
    }
    q->bits = bits;
    q->levels = (1 << (bits - 1)) - 1;
    q->bucket = bucket;
    q->norm = norm;
    q->seed = seed;
    q->rank = rank;
    q->tmp = malloc(sizeof(float) * bucket);
    if (q->tmp == NULL) return gvqSystemError;
    return gvqSuccess;
}

void gvq_qsgd_fini(gvq_qsgd_t *q) {
    free(q->tmp);
    q->tmp = NULL;
}

void gvq_codec_qsgd_init(gvq_codec_t *c, const gvq_device_ops_t *dev, gvq_qsgd_t *q) {
    memset(c, 0, sizeof *c);
    c->name = "qsgd";
    c->wire_is_values = 0;
    c->granule = q->bucket;
    c->wire_bytes = qsgd_wire_bytes;
    c->encode_combine = qsgd_encode_combine;
    c->decode = qsgd_decode;
    c->dev = dev;
    c->dtype = gvqFloat32;
    c->op = gvqSum;
    c->state = q;
}
