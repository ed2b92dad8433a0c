/*
 * codec_device.c -- the ring codecs run by a device's own codec operations, and a wrapper that
 * gives a device codec a host wire (gvq_algo.h).
 *
 *   ring over NCCL (device wire)       ring over MPI (host wire)
 *   codec = device codec               codec = staged(device codec)
 *                                        encode_combine: wire in  --copy_from_host--> device
 *                                                        device codec
 *                                                        wire out <--copy_to_host--   device
 *                                        decode:         wire     --copy_from_host--> device
 *                                                        device codec -> output on the device
 *
 * The staged wrapper moves only the wire across the bus: d/L of the gradient for GradiVeQ,
 * bits/32 for QSGD, where staging the whole buffer (gvq_device_staged) moves all of it twice.
 */
#include "gvq_algo.h"

int gvq_device_has_codecs(const gvq_device_ops_t *dev) {
    return dev != NULL && dev != &gvq_host_device && GVQ_DEVICE_HAS(dev, gq_decode);
}

/* ---- QSGD ---------------------------------------------------------------------------------- */

static size_t dq_wire_bytes(const gvq_codec_t *c, size_t off, size_t count) {
    const gvq_dev_qsgd_t *q = c->state;
    (void)off;
    return gvq_qsgd_wire_size(q->bits, q->bucket, count);
}

static gvqResult_t dq_encode_combine(const gvq_codec_t *c, size_t off, size_t count,
                                     const void *local, const void *in, void *out) {
    return c->dev->qsgd_encode_combine(c->state, off, count, local, in, out);
}

static gvqResult_t dq_decode(const gvq_codec_t *c, size_t off, size_t count, const void *wire,
                             void *dst) {
    return c->dev->qsgd_decode(c->state, off, count, wire, dst);
}

void gvq_codec_qsgd_dev_init(gvq_codec_t *c, const gvq_device_ops_t *dev, const gvq_dev_qsgd_t *q) {
    memset(c, 0, sizeof *c);
    c->name = "qsgd(device)";
    c->granule = q->bucket;
    c->wire_bytes = dq_wire_bytes;
    c->encode_combine = dq_encode_combine;
    c->decode = dq_decode;
    c->dev = dev;
    c->dtype = gvqFloat32;
    c->op = gvqSum;
    c->state = (void *)q;
}

/* ---- GradiVeQ ------------------------------------------------------------------------------ */

static size_t dg_wire_bytes(const gvq_codec_t *c, size_t off, size_t count) {
    const gvq_gq_dev_codec_t *g = c->state;
    (void)off;
    return gvq_gradiveq_wire_size(g->params.L, g->params.d, g->params.wire_fp16, count);
}

static gvqResult_t dg_encode_combine(const gvq_codec_t *c, size_t off, size_t count,
                                     const void *local, const void *in, void *out) {
    gvq_gq_dev_codec_t *g = c->state;
    /* the norms are the loss of this rank's own values: every local slice is encoded exactly
     * once per ring, so every encode adds them */
    return c->dev->gq_encode_combine(&g->params, off, count, local, in, out, g->norms);
}

static gvqResult_t dg_decode(const gvq_codec_t *c, size_t off, size_t count, const void *wire,
                             void *dst) {
    const gvq_gq_dev_codec_t *g = c->state;
    return c->dev->gq_decode(&g->params, off, count, wire, dst);
}

void gvq_codec_gradiveq_dev_init(gvq_codec_t *c, const gvq_device_ops_t *dev,
                                 gvq_gq_dev_codec_t *g) {
    memset(c, 0, sizeof *c);
    c->name = "gradiveq(device)";
    c->granule = g->params.L;
    c->wire_bytes = dg_wire_bytes;
    c->encode_combine = dg_encode_combine;
    c->decode = dg_decode;
    c->dev = dev;
    c->dtype = gvqFloat32;
    c->op = gvqSum;
    c->state = g;
}

/* ---- a device codec behind a host wire ------------------------------------------------------ */

static gvqResult_t stg_reserve(gvq_staging_t *st, size_t bytes) {
    if (bytes <= st->cap) return gvqSuccess;
    const gvq_device_ops_t *dev = st->dev;
    void *a = dev->alloc(bytes), *b = dev->alloc(bytes);
    if (a == NULL || b == NULL) {
        if (a != NULL) dev->free(a);
        if (b != NULL) dev->free(b);
        GVQ_WARN("cannot allocate 2 x %zu bytes on the %s device to stage the ring's wire", bytes,
                 dev->name);
        return gvqSystemError;
    }
    gvq_staging_fini(st);
    st->din = a;
    st->dout = b;
    st->cap = bytes;
    return gvqSuccess;
}

static size_t stg_wire_bytes(const gvq_codec_t *c, size_t off, size_t count) {
    const gvq_staging_t *st = c->state;
    if (st->inner->wire_is_values) return count * gvq_dtype_size(st->inner->dtype);
    return st->inner->wire_bytes(st->inner, off, count);
}

static gvqResult_t stg_encode_combine(const gvq_codec_t *c, size_t off, size_t count,
                                      const void *local, const void *in, void *out) {
    gvq_staging_t *st = c->state;
    const gvq_device_ops_t *dev = st->inner->dev;
    size_t wb = stg_wire_bytes(c, off, count);
    GVQCHECK(stg_reserve(st, wb));
    if (in != NULL) GVQCHECK(dev->copy_from_host(st->din, in, wb));
    GVQCHECK(st->inner->encode_combine(st->inner, off, count, local, in != NULL ? st->din : NULL,
                                       st->dout));
    return dev->copy_to_host(out, st->dout, wb); /* waits for the encode */
}

static gvqResult_t stg_decode(const gvq_codec_t *c, size_t off, size_t count, const void *wire,
                              void *dst) {
    gvq_staging_t *st = c->state;
    const gvq_device_ops_t *dev = st->inner->dev;
    size_t wb = stg_wire_bytes(c, off, count);
    GVQCHECK(stg_reserve(st, wb));
    GVQCHECK(dev->copy_from_host(st->din, wire, wb));
    /* din is reused by the next call's copy_from_host, which the device orders behind this
     * decode (one stream) */
    return st->inner->decode(st->inner, off, count, st->din, dst);
}

void gvq_codec_staged_init(gvq_codec_t *c, const gvq_codec_t *inner, gvq_staging_t *st) {
    memset(c, 0, sizeof *c);
    if (st->dev != inner->dev) gvq_staging_fini(st); /* buffers of another device */
    st->inner = inner;
    st->dev = inner->dev;
    c->name = inner->name;
    c->wire_is_values = 0;
    c->granule = inner->granule;
    c->wire_bytes = stg_wire_bytes;
    c->encode_combine = stg_encode_combine;
    c->decode = stg_decode;
    c->dev = inner->dev;
    c->dtype = inner->dtype;
    c->op = inner->op;
    c->state = st;
}

void gvq_staging_fini(gvq_staging_t *st) {
    if (st->dev != NULL) {
        if (st->din != NULL) st->dev->free(st->din);
        if (st->dout != NULL) st->dev->free(st->dout);
    }
    st->din = st->dout = NULL;
    st->cap = 0;
}
