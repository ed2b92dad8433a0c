/*
 * codec_watch.c -- a codec watched for what its encodes drop: every encode_combine of the inner
 * codec runs as it would, then r (in the ring's layout, indexed by the chunk's offset) gets
 * (decode(in) + local) - decode(out), the part of this rank's value that encode did not carry,
 * with the very random bits the ring drew. Error feedback (src/compress/error_feedback.c) keeps
 * it as the next call's residual; why this and not x - decode(encode(x)) is said there. Costs
 * two decodes per encode.
 *
 * Also here: the finite watch, a codec that runs the inner one and scans each chunk its decode
 * wrote for NaN and Inf while the chunk is in the cache (the compressed call's finite check,
 * src/compress/phase_call.c; a separate pass over a 64 MiB output cost as much as the codec's
 * decode).
 */
#include <stdlib.h>
#include <string.h>

#include "codec_kernels.h"
#include "gvq_algo.h"

static gvqResult_t watch_tmp(gvq_watch_t *w, size_t count) {
    if (w->tmp_len >= count) return gvqSuccess;
    float *t = realloc(w->tmp, sizeof(float) * count);
    if (t == NULL) return gvqSystemError;
    w->tmp = t;
    w->tmp_len = count;
    return gvqSuccess;
}

/* The inner encode, then r = (decode(in) + local) - decode(out) over the chunk: what this
 * encode dropped. */
static gvqResult_t watch_encode_combine(const gvq_codec_t *c, size_t off, size_t count,
                                        const void *local, const void *in, void *out) {
    gvq_watch_t *w = c->state;
    const gvq_codec_t *inner = w->wrap.inner;
    const float *x = local;
    float *r = w->r + off;
    GVQCHECK(inner->encode_combine(inner, off, count, local, in, out));
    GVQCHECK(watch_tmp(w, count));
    if (in != NULL) {
        GVQCHECK(inner->decode(inner, off, count, in, r));
        for (size_t i = 0; i < count; i++)
            r[i] += x[i];
    } else {
        memcpy(r, x, sizeof(float) * count);
    }
    GVQCHECK(inner->decode(inner, off, count, out, w->tmp));
    for (size_t i = 0; i < count; i++)
        r[i] -= w->tmp[i];
    return gvqSuccess;
}

/* ---- what both wrappers pass on to the inner codec as it is (state: a gvq_codec_wrap_t first) */

static const gvq_codec_t *inner_of(const gvq_codec_t *c) {
    return ((const gvq_codec_wrap_t *)c->state)->inner;
}

static size_t wrap_wire_bytes(const gvq_codec_t *c, size_t off, size_t count) {
    return inner_of(c)->wire_bytes(inner_of(c), off, count);
}

static gvqResult_t wrap_encode_combine(const gvq_codec_t *c, size_t off, size_t count,
                                       const void *local, const void *in, void *out) {
    return inner_of(c)->encode_combine(inner_of(c), off, count, local, in, out);
}

static gvqResult_t wrap_decode(const gvq_codec_t *c, size_t off, size_t count, const void *wire,
                               void *dst) {
    return inner_of(c)->decode(inner_of(c), off, count, wire, dst);
}

static gvqResult_t wrap_begin(const gvq_codec_t *c, gvq_coll_ctx_t *ctx, const void *local,
                              size_t count) {
    return inner_of(c)->begin(inner_of(c), ctx, local, count);
}

static gvqResult_t wrap_begin_part(const gvq_codec_t *c, gvq_coll_ctx_t *ctx, const void *local,
                                   size_t count, size_t lo, size_t hi) {
    return inner_of(c)->begin_part(inner_of(c), ctx, local, count, lo, hi);
}

/* w (the first member of state) runs inner, every op passed on */
static void wrap_init(gvq_codec_wrap_t *w, const gvq_codec_t *inner, void *state) {
    w->codec = *inner;
    w->codec.wire_bytes = wrap_wire_bytes;
    w->codec.encode_combine = wrap_encode_combine;
    w->codec.decode = wrap_decode;
    w->codec.begin = inner->begin != NULL ? wrap_begin : NULL;
    w->codec.begin_part = inner->begin_part != NULL ? wrap_begin_part : NULL;
    w->codec.state = state;
    w->inner = inner;
}

void gvq_codec_watch_init(gvq_watch_t *w, const gvq_codec_t *inner, float *r) {
    memset(w, 0, sizeof *w);
    w->r = r;
    wrap_init(&w->wrap, inner, w);
    w->wrap.codec.name = "error-feedback";
    w->wrap.codec.encode_combine = watch_encode_combine;
}

void gvq_codec_watch_fini(gvq_watch_t *w) {
    free(w->tmp);
    w->tmp = NULL;
    w->tmp_len = 0;
}

/* ---- the finite watch ------------------------------------------------------------------------ */

static gvqResult_t finite_decode(const gvq_codec_t *c, size_t off, size_t count, const void *wire,
                                 void *dst) {
    gvq_finite_watch_t *f = c->state;
    GVQCHECK(f->wrap.inner->decode(f->wrap.inner, off, count, wire, dst));
    if (!f->nonfinite && !gvq_kernels()->all_finite(dst, count)) f->nonfinite = 1;
    return gvqSuccess;
}

void gvq_codec_finite_watch_init(gvq_finite_watch_t *f, const gvq_codec_t *inner) {
    memset(f, 0, sizeof *f);
    wrap_init(&f->wrap, inner, f);
    f->wrap.codec.decode = finite_decode;
}
