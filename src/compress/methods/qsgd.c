/*
 * qsgd.c -- the QSGD method (gvq_method.h): compressors of codec gvqCodecQsgd. A call runs the
 * phase's ring (phase_call.c) with the QSGD codec (src/algorithms/codecs/codec_qsgd.c) or its
 * integer-summed wire; several calls of the same settings share one ring (below).
 */
#include <stdlib.h>
#include <string.h>

#include "gvq_method.h"

/* ---- several QSGD tensors in one ring --------------------------------------------------------
 * One ring whose every value meets the arithmetic it meets when its tensor runs alone, so that a
 * fused group gives the bits of the calls one by one (tests/mpi/test_reference.c holds it to
 * that). A lone call collocates a conv tensor (gvq_collocate), cuts it into N ring segments on
 * bucket boundaries (gvq_ring_partition), and each segment's values are added up around the ring
 * in an order fixed by the segment, re-quantized at every hop with random bits drawn by (element
 * index, call). The fused vector is therefore laid out segment-major:
 *
 *     [ t0 seg 0 | t1 seg 0 | ... | tk seg 0 ][ t0 seg 1 | t1 seg 1 | ... ] ... [ ... seg N-1 ]
 *
 * each piece padded with zeros to whole buckets (no bucket, and no bucket's norm, spans two
 * tensors; zeros quantize to zero), the ring's segment s is the s-th group (given offsets), and
 * the codec maps each bucket to its tensor's element index, call and seed (gvq_qsgd_t.map_first).
 * Then per tensor what one call does: a non-finite result sent again uncompressed (the ring's
 * output is the same on every rank, so every rank decides alike), gvqAvg's divide, the inverse
 * collocation, the bytes shared out by values. For compressors of the same QSGD settings,
 * without error feedback or an integer wire, outside the hierarchy (qsgd_fusable). */

static int qsgd_fusable(gvqCompressor_t c, gvqCompressor_t c0) {
    const gvq_comp_cfg_t *a = &c->cfg, *b = &c0->cfg;
    /* the hierarchy (GVQ_ALGO=hier) quantizes between the hosts only, on pieces of its own: a
     * fused flat ring would not give a tensor its lone call's bits there, so each runs alone */
    if (gvq_comm_hier_compressed(c->comm)) return 0;
    return a->codec == gvqCodecQsgd && !a->error_feedback && a->int_bits == 0 &&
           b->codec == gvqCodecQsgd && a->qbits == b->qbits && a->qbucket == b->qbucket &&
           a->qmaxnorm == b->qmaxnorm; /* seeds may differ: each bucket keeps its own */
}

/* The segment-major layout of k tensors over n ranks: seg[i * (n + 1) + s] the tensor's own
 * segment boundaries, at[i * n + s] where its piece s starts in the fused vector, off[s] the
 * fused ring's segment boundaries (n + 1). Returns the fused length. */
static size_t qsgd_layout(gvqCompressor_t const *cs, size_t k, int n, size_t bucket, size_t *seg,
                          size_t *at, size_t *off) {
    size_t total = 0;
    for (size_t i = 0; i < k; i++)
        gvq_ring_partition(seg + i * (size_t)(n + 1), n, (size_t)cs[i]->cfg.count, bucket);
    for (int s = 0; s < n; s++) {
        off[s] = total;
        for (size_t i = 0; i < k; i++) {
            const size_t *g = seg + i * (size_t)(n + 1);
            at[i * (size_t)n + (size_t)s] = total;
            total += GVQ_DIV_UP(g[s + 1] - g[s], bucket) * bucket;
        }
    }
    off[n] = total;
    return total;
}

/* The group lead's kept buffer grown to `bytes` (its contents kept): no allocation per call
 * once the group's shapes repeat. */
static void *fuse_room(gvqCompressor_t c, size_t bytes) {
    if (bytes <= c->fuse_cap) return c->fuse_buf;
    void *p = realloc(c->fuse_buf, bytes);
    if (p == NULL) return NULL;
    c->fuse_buf = p;
    c->fuse_cap = bytes;
    return p;
}

static gvqResult_t qsgd_allreduce_many(gvqCompressor_t const *cs, const float *const *send,
                                       float *const *recv, size_t k, gvqRedOp_t op) {
    if (k == 0) return gvqSuccess;
    int n = cs[0]->comm->nranks;
    size_t bucket = (size_t)cs[0]->cfg.qbucket, maxcount = 0, nb = (size_t)n + 1;
    for (size_t i = 0; i < k; i++)
        maxcount = GVQ_MAX(maxcount, (size_t)cs[i]->cfg.count);
    /* one kept block: [seg, at, off | lay | in, out | map_first | map_call, map_seed] */
    size_t seg_bytes = GVQ_DIV_UP(sizeof(size_t) * (k * nb + k * (size_t)n + nb), 64) * 64;
    size_t *seg = fuse_room(cs[0], seg_bytes), total = 0;
    if (seg == NULL) {
        GVQ_WARN("gvqAllReduceCompressed: out of memory for a QSGD call of %zu tensors", k);
        return gvqSystemError;
    }
    total = qsgd_layout(cs, k, n, bucket, seg, seg + k * nb, seg + k * nb + k * (size_t)n);
    size_t nbk = total / bucket + 1, lay_bytes = GVQ_DIV_UP(sizeof(float) * maxcount, 64) * 64;
    size_t in_bytes = GVQ_DIV_UP(sizeof(float) * 2 * total, 64) * 64;
    char *room = fuse_room(cs[0], seg_bytes + lay_bytes + in_bytes + nbk * (8 + 2 * 4));
    if (room == NULL) {
        GVQ_WARN("gvqAllReduceCompressed: out of memory for a QSGD call of %zu tensors", k);
        return gvqSystemError;
    }
    seg = (size_t *)room;
    size_t *at = seg + k * nb, *off = at + k * (size_t)n;
    float *lay = (float *)(room + seg_bytes), *in = (float *)(room + seg_bytes + lay_bytes);
    uint64_t *map_first = (uint64_t *)(room + seg_bytes + lay_bytes + in_bytes);
    uint32_t *map_call = (uint32_t *)(map_first + nbk), *map_seed = map_call + nbk;
    float *out = in + total;
    gvqResult_t res = gvqSuccess;
    for (size_t i = 0; i < k; i++) { /* each tensor as its lone call lays it out */
        const gvq_comp_cfg_t *cfg = &cs[i]->cfg;
        const float *x = send[i];
        if (cs[i]->collocate) {
            gvq_collocate(x, lay, (size_t)cfg->K, (size_t)cfg->D, (size_t)cfg->H, (size_t)cfg->W);
            x = lay;
        }
        for (int s = 0; s < n; s++) {
            const size_t *g = seg + i * nb;
            size_t a = at[i * (size_t)n + (size_t)s], len = g[s + 1] - g[s];
            size_t padded = GVQ_DIV_UP(len, bucket) * bucket;
            memcpy(in + a, x + g[s], sizeof(float) * len);
            memset(in + a + len, 0, sizeof(float) * (padded - len)); /* zeros quantize to zero */
            for (size_t b = 0; b < GVQ_DIV_UP(len, bucket); b++) {
                map_first[a / bucket + b] = g[s] + b * bucket;
                map_call[a / bucket + b] = (uint32_t)cs[i]->st.iter;
                map_seed[a / bucket + b] = cs[i]->qs.seed;
            }
        }
    }
    gvq_call_plan_t p;
    res = gvq_compressed_plan(cs[0], &gvq_host_device, &p);
    gvq_qsgd_t *q = &cs[0]->qs;
    q->map_first = map_first;
    q->map_call = map_call;
    q->map_seed = map_seed;
    if (res == gvqSuccess)
        res = n > 1 ? gvq_ring_allreduce_given(&p.ring, &p.codec, in, out, total, off)
                    : gvq_ring_allreduce_tally(&p.ring, &p.codec, in, out, total, gvqSum, NULL);
    q->map_first = NULL;
    q->map_call = NULL;
    q->map_seed = NULL;
    unsigned long long sent = p.sent;
    for (size_t i = 0; i < k && res == gvqSuccess; i++) {
        gvqCompressor_t c = cs[i];
        const gvq_comp_cfg_t *cfg = &c->cfg;
        size_t count = (size_t)cfg->count, padded = 0;
        for (int s = 0; s < n; s++) { /* the tensor's result, in its lone call's layout */
            const size_t *g = seg + i * nb;
            size_t a = at[i * (size_t)n + (size_t)s];
            memcpy(lay + g[s], out + a, sizeof(float) * (g[s + 1] - g[s]));
            padded += GVQ_DIV_UP(g[s + 1] - g[s], bucket) * bucket;
        }
        if (!gvq_compressed_all_finite(lay, count)) {
            res = gvq_compressed_nonfinite(c, &p.comm, send[i], recv[i], op);
            continue;
        }
        if (op == gvqAvg) res = gvq_host_device.divide(lay, count, gvqFloat32, c->comm->nranks);
        if (c->collocate)
            gvq_uncollocate(lay, recv[i], (size_t)cfg->K, (size_t)cfg->D, (size_t)cfg->H,
                            (size_t)cfg->W);
        else
            memcpy(recv[i], lay, sizeof(float) * count);
        c->st.stats.ratio = (double)(count * 4) / (double)p.codec.wire_bytes(&p.codec, 0, count);
        if (res == gvqSuccess)
            res = gvq_compressor_advance(c, &p.comm, &gvq_host_device, recv[i],
                                         sent * padded / total, 0, 0);
    }
    return res;
}

/* ---- the method ---------------------------------------------------------------------------- */

static int qsgd_serves(const gvq_comp_cfg_t *cfg) {
    return cfg->codec == gvqCodecQsgd;
}

static gvqResult_t qsgd_create(gvqCompressor_t c) {
    return gvq_compressed_qsgd_init(c);
}

static void qsgd_log(gvqCompressor_t c, size_t count) {
    const gvq_comp_cfg_t *g = &c->cfg;
    GVQ_INFO("compressor %p: tensor %d count %zu qsgd %d bits bucket %d %s norm integer "
             "wire %d",
             (void *)c, c->tensor_index, count, g->qbits, g->qbucket, g->qmaxnorm ? "max" : "L2",
             g->int_bits);
}

const gvq_method_t gvq_method_qsgd = {.name = "qsgd",
                                      .serves = qsgd_serves,
                                      .create = qsgd_create,
                                      .log_created = qsgd_log,
                                      .allreduce = gvq_compressed_run_host,
                                      .fusable = qsgd_fusable,
                                      .allreduce_many = qsgd_allreduce_many,
                                      .collocates = 1,
                                      .device_resident = 1};
