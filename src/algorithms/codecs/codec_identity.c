/*
 * codec_identity.c -- the identity codec: what travels is the values, combine is the
 * elementwise op. The ring's plain allreduce is the ring run with this codec.
 */
#include "gvq_algo.h"

static size_t identity_wire_bytes(const gvq_codec_t *c, size_t off, size_t count) {
    (void)off;
    return count * gvq_dtype_size(c->dtype);
}

static gvqResult_t identity_encode_combine(const gvq_codec_t *c, size_t off, size_t count,
                                           const void *local, const void *in, void *out) {
    (void)off;
    if (in == NULL) return c->dev->copy(out, local, count * gvq_dtype_size(c->dtype));
    return c->dev->reduce(out, local, in, count, c->dtype, c->op);
}

static gvqResult_t identity_decode(const gvq_codec_t *c, size_t off, size_t count, const void *wire,
                                   void *dst) {
    (void)off;
    return c->dev->copy(dst, wire, count * gvq_dtype_size(c->dtype));
}

void gvq_codec_identity_init(gvq_codec_t *c, const gvq_device_ops_t *dev, gvqDataType_t dtype,
                             gvqRedOp_t op) {
    memset(c, 0, sizeof *c);
    c->name = "identity";
    c->wire_is_values = 1;
    c->granule = 1;
    c->wire_bytes = identity_wire_bytes;
    c->encode_combine = identity_encode_combine;
    c->decode = identity_decode;
    c->dev = dev;
    c->dtype = dtype;
    c->op = op == gvqAvg ? gvqSum : op;
}
