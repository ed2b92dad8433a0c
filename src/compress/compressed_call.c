/*
 * compressed_call.c -- one compressed allreduce:
 *
 *   x (+ residual) --collocate--> ring(plan: codec of the phase, on its transport, sum)
 *     --> phase machine (gvq_compressor_advance) --> (/N) --uncollocate--> y
 *
 * The plan picks the codec and where its ring runs together:
 *
 *   buffers   device transport   ring runs over           codec
 *   host      -                  comm's transport         host codec of the phase
 *   device    yes (NCCL)         the device transport     the device's codec
 *   device    no                 comm's transport         staged(device codec): wire in pinned
 *                                                         host memory
 *
 * Buffers on a device the resident path does not take (error feedback, mixed buffers,
 * GVQ_DEVICE_CODECS=0, PowerSGD) are staged whole through pinned host memory and run the host
 * codecs. Error feedback (error_feedback.c) turns x into x + residual before the ring and
 * computes the next residual from this rank's ring input; PowerSGD (powersgd_call.c, no device
 * kernels) takes the whole call.
 */
#include <math.h>
#include <stdlib.h>

#include "gvq_compressor.h"
#include "gvq_group.h"
#include "gvq_stream.h"

/* ---- the vote -------------------------------------------------------------------------------- */

/* This rank's loss ||x_n - x_hat_n|| / ||x_n|| over the sampled slices of the current call.
 * Both codecs' sums are zeroed at the start of a compressed call and only the one that runs
 * adds to them (the host codec's, or the device codec's on a device-resident call). */
static double local_loss(gvqCompressor_t c) {
    const gvq_gradiveq_t *g = &c->gq;
    const double *dn = c->gq_dev.norms;
    double x2 = g->local_x2 + dn[0], c2 = g->local_c2 + dn[1], all2 = g->local_all2 + dn[2];
    return all2 > 0 ? sqrt(fmax(0, x2 - c2) / all2) : 0;
}

/* This rank's early-exit vote, asked for by the ring once all local encodes are done. The loss
 * is measured on centred slices against the uncentred norm, so it can exceed 1: a threshold >= 1
 * means "never" (no vote is taken then), not "above 1". */
static int32_t local_vote(void *arg) {
    gvqCompressor_t c = arg;
    return local_loss(c) > c->cfg.vote;
}

/* ---- the plan: codec and ring of this call -----------------------------------------------------
 */

typedef struct {
    gvq_codec_t codec;   /* what the ring runs */
    gvq_codec_t inner;   /* the device codec, when codec wraps it (staged wire) */
    gvq_coll_ctx_t comm; /* the communicator's own ring (agreements, the fit) */
    gvq_coll_ctx_t ring; /* where the compressed ring runs */
    unsigned long long sent;
} call_plan_t;

/* The integer-summed wire of the phase's codec (host buffers): QSGD's made once, GradiVeQ's
 * again after every fit. */
static gvqResult_t intsum_codec(gvqCompressor_t c, int gradiveq, gvq_codec_t *out) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    gvq_intsum_t *s = gradiveq ? &c->is_gq : &c->is_qsgd;
    int stale = gradiveq ? c->is_gq_version != c->fit_version : s->bits == 0;
    if (stale) {
        gvq_intsum_fini(s);
        if (gradiveq) c->is_gq_version = 0; /* stays stale if the init below fails */
        GVQCHECK(gvq_intsum_init(s, cfg->int_bits, gradiveq ? 0 : c->qs.levels,
                                 (size_t)cfg->qbucket, gradiveq ? &c->gq : NULL, c->comm->dev,
                                 cfg->count, c->comm->nranks, (uint32_t)cfg->seed,
                                 (uint32_t)c->comm->rank));
        if (gradiveq) c->is_gq_version = c->fit_version;
    }
    s->call = (uint32_t)c->st.iter;
    gvq_codec_intsum_init(out, c->comm->dev, s);
    return gvqSuccess;
}

/* The codec of the current phase, for dev's buffers (a device codec when on_dev). */
static gvqResult_t choose_codec(gvqCompressor_t c, const gvq_device_ops_t *dev, int on_dev,
                                call_plan_t *p) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    int phase = c->st.phase;
    gvq_codec_t *out = on_dev ? &p->inner : &p->codec;
    int use_qsgd = cfg->codec == gvqCodecQsgd ||
                   (cfg->codec == gvqCodecGradiveq && phase != gvqPhaseCompressed &&
                    cfg->sample_codec == gvqCodecQsgd);
    if (phase == gvqPhaseCompressed || use_qsgd) p->comm.chunk_bytes = c->codec_chunk_bytes;
    if (phase == gvqPhaseCompressed) {
        c->gq.local_x2 = c->gq.local_c2 = c->gq.local_all2 = 0;
        c->gq_dev.norms[0] = c->gq_dev.norms[1] = c->gq_dev.norms[2] = 0;
        if (on_dev)
            gvq_codec_gradiveq_dev_init(out, dev, &c->gq_dev);
        else if (cfg->int_bits)
            GVQCHECK(intsum_codec(c, 1, out));
        else
            gvq_codec_gradiveq_init(out, c->comm->dev, &c->gq);
    } else if (use_qsgd) {
        c->qs.call = (uint32_t)c->st.iter;
        if (on_dev) {
            c->qsgd_dev = (gvq_dev_qsgd_t){c->qs.bits, c->qs.levels, c->qs.norm, c->qs.bucket,
                                           c->qs.seed, c->qs.rank,   c->qs.call};
            gvq_codec_qsgd_dev_init(out, dev, &c->qsgd_dev);
        } else if (cfg->int_bits) {
            GVQCHECK(intsum_codec(c, 0, out));
        } else {
            gvq_codec_qsgd_init(out, c->comm->dev, &c->qs);
        }
    } else {
        gvq_codec_identity_init(out, on_dev ? dev : c->comm->dev, gvqFloat32, gvqSum);
    }
    return gvqSuccess;
}

/* Device rings run over the device transport (NCCL) when there is one, their wire in device
 * memory; otherwise the wire is staged through pinned host memory over the communicator's own. */
static void choose_ring(gvqCompressor_t c, const gvq_device_ops_t *dev, int on_dev,
                        call_plan_t *p) {
    gvqComm_t comm = c->comm;
    p->ring = p->comm;
    gvq_transport_t *dxp = on_dev ? gvq_comm_device_transport(comm, dev) : NULL;
    if (dxp != NULL) {
        p->ring = (gvq_coll_ctx_t){.xport = dxp,
                                   .dev = dev,
                                   .chunk_bytes = p->comm.chunk_bytes,
                                   .scratch = &comm->dscratch,
                                   .scratch_bytes = &comm->dscratch_bytes,
                                   .bytes_sent = &p->sent};
        p->codec = p->inner;
    } else if (on_dev) {
        gvq_codec_staged_init(&p->codec, &p->inner, &c->stg);
        p->ring.dev = gvq_comm_pinned_host(comm, dev); /* wire slots in pinned memory */
        p->ring.scratch = &comm->pscratch;
        p->ring.scratch_bytes = &comm->pscratch_bytes;
    }
}

static gvqResult_t plan_call(gvqCompressor_t c, const gvq_device_ops_t *dev, call_plan_t *p) {
    int on_dev = dev != &gvq_host_device;
    p->sent = 0;
    p->comm = gvq_comm_ctx(c->comm, &p->sent);
    GVQCHECK(choose_codec(c, dev, on_dev, p));
    choose_ring(c, dev, on_dev, p);
    return gvqSuccess;
}

/* ---- one call ----------------------------------------------------------------------------------
 */

/* The ring's input (src) and output (dst): the collocated work vector, or the caller's
 * buffers, after adding the error-feedback residual. */
static gvqResult_t prepare_input(gvqCompressor_t c, const gvq_device_ops_t *dev, const float *send,
                                 float *recv, const float **src, float **dst) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    int on_dev = dev != &gvq_host_device;
    /* the gradient plus what earlier compression dropped (error_feedback.c) */
    const float *x = cfg->error_feedback ? gvq_ef_input(c, send) : send;
    *src = x;
    *dst = recv;
    size_t K = (size_t)cfg->K, D = (size_t)cfg->D, H = (size_t)cfg->H, W = (size_t)cfg->W;
    if (c->collocate && on_dev) {
        GVQCHECK(dev->collocate(x, c->dwork, K, D, H, W, 0));
        *src = *dst = c->dwork;
    } else if (c->collocate) {
        gvq_collocate(x, c->work, K, D, H, W);
        *src = *dst = c->work;
    } else if (send == recv && !on_dev) {
        /* in place: the ring writes the work vector, so that the gradient is still there if a
         * non-finite result sends the call round again uncompressed (finish_output copies) */
        if (c->work == NULL && (c->work = malloc(sizeof(float) * cfg->count)) == NULL) {
            GVQ_WARN("compressor of tensor %d: cannot allocate its work vector", c->tensor_index);
            return gvqSystemError;
        }
        *dst = c->work;
    }
    return gvqSuccess;
}

/* gvqAvg's divide and the inverse collocation into recv. */
static gvqResult_t finish_output(gvqCompressor_t c, const gvq_device_ops_t *dev, float *dst,
                                 float *recv, gvqRedOp_t op) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    size_t K = (size_t)cfg->K, D = (size_t)cfg->D, H = (size_t)cfg->H, W = (size_t)cfg->W;
    if (op == gvqAvg) GVQCHECK(dev->divide(dst, cfg->count, gvqFloat32, c->comm->nranks));
    if (c->collocate && dev != &gvq_host_device)
        GVQCHECK(dev->collocate(c->dwork, recv, K, D, H, W, 1));
    else if (c->collocate)
        gvq_uncollocate(c->work, recv, K, D, H, W);
    else if (dst != recv)
        memcpy(recv, dst, sizeof(float) * cfg->count);
    return gvqSuccess;
}

/* ---- a non-finite result ------------------------------------------------------------------------
 * The ring's output is the same on every rank, so whether it holds a NaN or an Inf is a decision
 * every rank takes alike without an agreement. Such a call is given what an uncompressed
 * allreduce gives (gvq_compressed_nonfinite, error_feedback.c), and kept out of the phase
 * schedule and the fit's samples. */

static int all_finite(const float *v, size_t n) {
    float acc = 0;
    for (size_t i = 0; i < n; i++)
        acc += v[i] * 0.0f; /* stays 0 unless some v[i] is NaN or +-Inf */
    return acc == 0.0f;
}

/* One call. dev holds send and recv: the host device, or (run_device) a device with its own
 * codecs, whose copies of U, Z and the work vector are ready. */
static gvqResult_t run(gvqCompressor_t c, const gvq_device_ops_t *dev, const float *send,
                       float *recv, gvqRedOp_t op) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    int phase = c->st.phase;
    const float *src;
    float *dst;
    GVQCHECK(prepare_input(c, dev, send, recv, &src, &dst));
    call_plan_t p;
    GVQCHECK(plan_call(c, dev, &p));
    /* error feedback (error_feedback.c): the ring runs the codec watched for what it drops */
    const gvq_codec_t *codec = &p.codec;
    gvq_ef_call_t ef;
    if (cfg->error_feedback) GVQCHECK(gvq_ef_begin(c, &ef, &p.codec, send, src, &codec));
    /* the early-exit vote rides inside the compressed ring's allgather when it can */
    int voting = phase == gvqPhaseCompressed && cfg->vote < 1.0f;
    gvq_tally_t tally = {local_vote, c, 0, 0};
    gvqResult_t res = gvq_ring_allreduce_tally(&p.ring, codec, src, dst, cfg->count, gvqSum,
                                               voting ? &tally : NULL);
    int finite = res != gvqSuccess || dev != &gvq_host_device || all_finite(dst, cfg->count);
    if (cfg->error_feedback) gvq_ef_end(c, &ef, res == gvqSuccess && finite);
    GVQCHECK(res);
    if (!finite) return gvq_compressed_nonfinite(c, &p.comm, send, recv, op);
    unsigned long long sent = p.sent; /* the compressed ring's bytes, before any agreement */
    int32_t vote = voting ? tally.sum : 0;
    if (voting && !tally.carried) GVQCHECK(gvq_agree_i32(&p.comm, &vote, 1, gvqSum));
    if (phase == gvqPhasePlain && cfg->codec == gvqCodecQsgd)
        c->st.stats.ratio =
            (double)(cfg->count * 4) / (double)p.codec.wire_bytes(&p.codec, 0, cfg->count);
    double loss = phase == gvqPhaseCompressed ? local_loss(c) : 0;
    GVQCHECK(gvq_compressor_advance(c, &p.comm, dev, dst, sent, loss, vote));
    return finish_output(c, dev, dst, recv, op);
}

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
 * the codec maps each bucket to its tensor's element index and call (gvq_qsgd_t.map_first).
 * Then per tensor what one call does: a non-finite result sent again uncompressed (the ring's
 * output is the same on every rank, so every rank decides alike), gvqAvg's divide, the inverse
 * collocation, the bytes shared out by values. For compressors of the same QSGD settings,
 * without error feedback or an integer wire (gvq_compressed_qsgd_fusable). */

int gvq_compressed_qsgd_fusable(gvqCompressor_t c, gvqCompressor_t c0) {
    const gvq_comp_cfg_t *a = &c->cfg, *b = &c0->cfg;
    return a->codec == gvqCodecQsgd && !a->error_feedback && a->int_bits == 0 &&
           b->codec == gvqCodecQsgd && a->qbits == b->qbits && a->qbucket == b->qbucket &&
           a->qmaxnorm == b->qmaxnorm && a->seed == b->seed;
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

static gvqResult_t qsgd_allreduce_many(gvqCompressor_t const *cs, const float *const *send,
                                       float *const *recv, size_t k, gvqRedOp_t op) {
    if (k == 0) return gvqSuccess;
    int n = cs[0]->comm->nranks;
    size_t bucket = (size_t)cs[0]->cfg.qbucket, maxcount = 0, nb = (size_t)n + 1;
    for (size_t i = 0; i < k; i++)
        maxcount = GVQ_MAX(maxcount, (size_t)cs[i]->cfg.count);
    size_t *seg = malloc(sizeof(size_t) * (k * nb + k * (size_t)n + nb));
    float *lay = malloc(sizeof(float) * GVQ_MAX(maxcount, 1)), *in = NULL;
    uint64_t *map_first = NULL;
    uint32_t *map_call = NULL;
    gvqResult_t res = gvqSystemError;
    if (seg == NULL || lay == NULL) goto out;
    size_t *at = seg + k * nb, *off = at + k * (size_t)n;
    size_t total = qsgd_layout(cs, k, n, bucket, seg, at, off);
    in = calloc(2 * total, sizeof(float));
    map_first = malloc(sizeof(uint64_t) * (total / bucket + 1));
    map_call = malloc(sizeof(uint32_t) * (total / bucket + 1));
    if (in == NULL || map_first == NULL || map_call == NULL) goto out;
    float *out = in + total;
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
            memcpy(in + a, x + g[s], sizeof(float) * len);
            for (size_t b = 0; b < GVQ_DIV_UP(len, bucket); b++) {
                map_first[a / bucket + b] = g[s] + b * bucket;
                map_call[a / bucket + b] = (uint32_t)cs[i]->st.iter;
            }
        }
    }
    call_plan_t p;
    res = plan_call(cs[0], &gvq_host_device, &p);
    gvq_qsgd_t *q = &cs[0]->qs;
    q->map_first = map_first;
    q->map_call = map_call;
    if (res == gvqSuccess)
        res = n > 1 ? gvq_ring_allreduce_given(&p.ring, &p.codec, in, out, total, off)
                    : gvq_ring_allreduce_tally(&p.ring, &p.codec, in, out, total, gvqSum, NULL);
    q->map_first = NULL;
    q->map_call = NULL;
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
        if (!all_finite(lay, count)) {
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
out:
    if (res == gvqSystemError &&
        (seg == NULL || lay == NULL || in == NULL || map_first == NULL || map_call == NULL))
        GVQ_WARN("gvqAllReduceCompressed: out of memory for a QSGD call of %zu tensors", k);
    free(seg);
    free(lay);
    free(in);
    free(map_first);
    free(map_call);
    return res;
}

gvqResult_t gvq_compressed_allreduce_entered(gvqCompressor_t c, const void *send, void *recv,
                                             gvqRedOp_t op) {
    if (c->cfg.codec == gvqCodecPowersgd) return gvq_powersgd_allreduce(c, send, recv, op);
    if (c->cfg.track) return gvq_gradiveq_track_allreduce(c, send, recv, op);
    return run(c, &gvq_host_device, send, recv, op);
}

/* ---- device buffers --------------------------------------------------------------------------
 * Device-resident: collocation, the codecs, the divide and the inverse collocation run on the
 * device, on the caller's stream; the PCA fit (the samples are copied out) and the phase
 * bookkeeping stay on the host. */

/* The device copies this call needs: the collocated work vector, and in the compressed phase
 * U, Z and U^T Z of the current fit. */
static gvqResult_t device_ready(gvqCompressor_t c, const gvq_device_ops_t *dev) {
    if (c->ddev != dev) {
        gvq_compressor_device_free(c);
        c->ddev = dev;
    }
    size_t M = c->cfg.count, G = c->ngroups, L = (size_t)c->cfg.L, d = (size_t)c->st.d;
    if (c->collocate && c->dwork == NULL && (c->dwork = dev->alloc(sizeof(float) * M)) == NULL)
        goto oom;
    if (c->st.phase != gvqPhaseCompressed || c->dev_version == c->fit_version) return gvqSuccess;
    if (c->dU_len < G * L * d) {
        if (c->dU != NULL) dev->free(c->dU);
        c->dU_len = 0;
        if ((c->dU = dev->alloc(sizeof(float) * G * L * d)) == NULL) goto oom;
        c->dU_len = G * L * d;
    }
    if (c->dZ == NULL && (c->dZ = dev->alloc(sizeof(float) * G * L)) == NULL) goto oom;
    if (c->dUZ == NULL && (c->dUZ = dev->alloc(sizeof(float) * G * L)) == NULL)
        goto oom; /* d <= L */
    GVQCHECK(dev->copy_from_host(c->dU, c->U, sizeof(float) * G * L * d));
    GVQCHECK(dev->copy_from_host(c->dZ, c->Z, sizeof(float) * G * L));
    GVQCHECK(dev->copy_from_host(c->dUZ, c->gq.UZ, sizeof(float) * G * d));
    c->gq_dev.params =
        (gvq_dev_gq_t){L, d, (size_t)c->cfg.C, c->comm->nranks, c->cfg.fp16, c->dU, c->dZ, c->dUZ};
    c->dev_version = c->fit_version;
    return gvqSuccess;
oom:
    GVQ_WARN("compressor of tensor %d: cannot allocate its buffers on the %s device",
             c->tensor_index, dev->name);
    return gvqSystemError;
}

static gvqResult_t run_device(gvqCompressor_t c, const gvq_device_ops_t *dev, const void *send,
                              void *recv, gvqRedOp_t op, gvqStream_t stream) {
    void *prev = NULL;
    GVQCHECK(dev->set_stream(gvq_device_user_stream(dev, stream), &prev));
    gvqResult_t res = device_ready(c, dev);
    if (res == gvqSuccess) res = run(c, dev, send, recv, op);
    gvqResult_t r2 = dev->set_stream(prev, NULL);
    return res != gvqSuccess ? res : r2;
}

typedef struct {
    gvqCompressor_t c;
    gvqRedOp_t op;
} staged_call_t;

static gvqResult_t compressed_on_host(void *arg, const void *send, void *recv) {
    const staged_call_t *s = arg;
    return gvq_compressed_allreduce_entered(s->c, send, recv, s->op);
}

/* ---- the public call ------------------------------------------------------------------------- */

static gvqResult_t check_call(const void *sendbuff, void *recvbuff, size_t count,
                              gvqDataType_t datatype, gvqRedOp_t op, gvqCompressor_t compressor,
                              gvqComm_t comm) {
    const char *fn = "gvqAllReduceCompressed";
    if (!gvq_compressor_live(compressor)) {
        GVQ_WARN("%s: compressor %p is not a live compressor", fn, (void *)compressor);
        return gvqInvalidArgument;
    }
    if (compressor->comm != comm) {
        GVQ_WARN("%s: the compressor belongs to another communicator", fn);
        return gvqInvalidArgument;
    }
    if (datatype != gvqFloat32) {
        GVQ_WARN("%s: datatype %s: compressed allreduce takes gvqFloat32", fn,
                 gvq_dtype_name(datatype));
        return gvqInvalidArgument;
    }
    if (op != gvqSum && op != gvqAvg) {
        GVQ_WARN("%s: op %d: compressed allreduce takes gvqSum or gvqAvg", fn, (int)op);
        return gvqInvalidArgument;
    }
    if (count != compressor->cfg.count) {
        GVQ_WARN("%s: count %zu, but the compressor was made for %llu", fn, count,
                 (unsigned long long)compressor->cfg.count);
        return gvqInvalidArgument;
    }
    if (sendbuff == NULL || recvbuff == NULL) {
        GVQ_WARN("%s: %s is NULL", fn, sendbuff == NULL ? "sendbuff" : "recvbuff");
        return gvqInvalidArgument;
    }
    uintptr_t sb = (uintptr_t)sendbuff, rb = (uintptr_t)recvbuff; /* distances: cannot wrap */
    if (sendbuff != recvbuff && (sb < rb ? rb - sb : sb - rb) / 4 < count) {
        GVQ_WARN("%s: recvbuff overlaps sendbuff but is not in place", fn);
        return gvqInvalidArgument;
    }
    return gvqSuccess;
}

/* The call's signature (gvq_call_agree, signature.c): what every rank must pass alike, the
 * compressor's config among it; refused: this rank's own refusal of its arguments. */
static gvq_call_sig_t call_sig(size_t count, gvqRedOp_t op, gvqCompressor_t compressor,
                               gvqResult_t refused) {
    uint64_t identity = refused == gvqSuccess ? gvq_compressor_identity(compressor) : 0;
    return (gvq_call_sig_t){.kind = GVQ_SIG_COMPRESSED,
                            .count = count,
                            .dtype = gvqFloat32,
                            .op = (int)op,
                            .root = -1,
                            .identity = identity,
                            .algo = -1, /* the codec's ring */
                            .refused = refused};
}

/* A call this rank refused takes part in the agreement when the communicator can carry it, so
 * that the other ranks fail at once instead of waiting out the timeout. */
static void refuse_together(gvqComm_t comm, const char *fn, size_t count, gvqRedOp_t op,
                            gvqResult_t res) {
    if (!gvq_comm_is_live(comm) || gvq_group_active()) return;
    if (gvq_comm_enter(comm, fn) != gvqSuccess) return;
    gvq_call_sig_t sig = call_sig(count, op, NULL, res);
    (void)gvq_call_agree(comm, fn, &sig);
    gvq_comm_leave(comm);
}

/* The call once its arguments passed: agree on the signature, then run (on the caller's thread,
 * or on a host stream's progress thread). */
typedef struct {
    const void *sendbuff;
    void *recvbuff;
    size_t count;
    gvqRedOp_t op;
    gvqCompressor_t compressor;
    gvqComm_t comm;
    gvqStream_t stream; /* a cudaStream_t, or NULL */
    gvqResult_t refused;
} compressed_args_t;

static gvqResult_t compressed_run(const compressed_args_t *a) {
    const char *fn = "gvqAllReduceCompressed";
    gvqComm_t comm = a->comm;
    GVQCHECK(gvq_comm_enter(comm, fn));
    gvq_call_sig_t sig = call_sig(a->count, a->op, a->compressor, gvqSuccess);
    gvqResult_t agreed = gvq_call_agree(comm, fn, &sig);
    if (agreed != gvqSuccess) {
        gvq_comm_leave(comm);
        return agreed;
    }
    const gvq_device_ops_t *sdev = gvq_device_of(a->sendbuff), *rdev = gvq_device_of(a->recvbuff);
    const gvq_device_ops_t *dev = sdev != &gvq_host_device ? sdev : rdev;
    gvqCompressor_t c = a->compressor;
    staged_call_t sc = {c, a->op};
    size_t bytes = a->count * sizeof(float);
    gvqResult_t res;
    if (dev == &gvq_host_device)
        res = gvq_compressed_allreduce_entered(c, a->sendbuff, a->recvbuff, a->op);
    else if (sdev == rdev && gvq_device_has_codecs(dev) && !c->cfg.error_feedback &&
             c->cfg.codec != gvqCodecPowersgd && !c->cfg.track && /* host only, staged */
             !c->cfg.int_bits && gvq_param(GVQ_PARAM_DEVICE_CODECS))
        res = run_device(c, dev, a->sendbuff, a->recvbuff, a->op, a->stream);
    else
        res = gvq_device_staged(dev, a->stream, fn, &comm->pinned, a->sendbuff, bytes, a->recvbuff,
                                bytes, compressed_on_host, &sc);
    gvq_comm_leave(comm);
    return res;
}

/* ---- groups: gvqAllReduceCompressed between gvqGroupStart and gvqGroupEnd ------------------ */

static gvq_call_sig_t compressed_signature(const gvq_op_t *o, gvqResult_t refused) {
    return call_sig(o->count, o->op, o->compressor, refused);
}

/* The signature of n > 1 compressed calls run as one: their counts summed, their compressors'
 * identities and counts mixed in call order, root the number of calls. A rank that groups the
 * calls differently (or not at all) fails the agreement on every rank. */
static gvq_call_sig_t group_sig(const gvq_op_t *ops, size_t n) {
    gvq_call_sig_t sig = call_sig(0, ops[0].op, ops[0].compressor, gvqSuccess);
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n; i++) {
        sig.count += ops[i].count;
        h = (h ^ gvq_compressor_identity(ops[i].compressor)) * 0x100000001B3ull;
        h = (h ^ (uint64_t)ops[i].count ^ ((uint64_t)ops[i].op << 40)) * 0x100000001B3ull;
    }
    sig.identity = h;
    sig.root = (int)GVQ_MIN(n, (size_t)INT32_MAX);
    return sig;
}

/* Which fused call compressor c can join: 1 a tracked basis, 2 PowerSGD, 3 QSGD of the first
 * fusable QSGD call's settings (q0), 0 none (it runs alone). */
static int fuse_kind(gvqCompressor_t c, gvqCompressor_t q0) {
    if (c->cfg.track) return 1;
    if (c->cfg.codec == gvqCodecPowersgd) return 2;
    return q0 != NULL && gvq_compressed_qsgd_fusable(c, q0) ? 3 : 0;
}

gvqResult_t gvq_compressed_allreduce_set(gvqCompressor_t const *c, const float *const *send,
                                         float *const *recv, const gvqRedOp_t *ops, gvqRedOp_t op,
                                         size_t n) {
    gvqCompressor_t *cs = calloc(3 * n + 1, sizeof *cs), q0 = NULL;
    const float **s = calloc(3 * n + 1, sizeof *s);
    float **r = calloc(3 * n + 1, sizeof *r);
    gvqResult_t res = gvqSuccess;
    size_t k[4] = {0, 0, 0, 0}; /* tracked in slots 0.., PowerSGD in n.., QSGD in 2n.. */
    if (cs == NULL || s == NULL || r == NULL) {
        GVQ_WARN("gvqAllReduceCompressed: out of memory for a set of %zu compressed calls", n);
        res = gvqSystemError;
    }
    for (size_t i = 0; i < n && q0 == NULL; i++)
        if ((ops == NULL || ops[i] == op) && gvq_compressed_qsgd_fusable(c[i], c[i])) q0 = c[i];
    for (size_t i = 0; i < n && res == gvqSuccess; i++) {
        gvqRedOp_t o = ops != NULL ? ops[i] : op;
        int f = o == op ? fuse_kind(c[i], q0) : 0;
        if (f == 0) {
            res = gvq_compressed_allreduce_entered(c[i], send[i], recv[i], o);
            continue;
        }
        size_t at = (size_t)(f - 1) * n + k[f]++;
        cs[at] = c[i];
        s[at] = send[i];
        r[at] = recv[i];
    }
    if (res == gvqSuccess) res = gvq_gradiveq_track_allreduce_many(cs, s, r, k[1], op);
    if (res == gvqSuccess) res = gvq_powersgd_allreduce_many(cs + n, s + n, r + n, k[2], op);
    if (res == gvqSuccess) res = qsgd_allreduce_many(cs + 2 * n, s + 2 * n, r + 2 * n, k[3], op);
    free(cs);
    free(s);
    free(r);
    return res;
}

/* The group's calls under one agreement (all on host buffers), as one set fused by ops[0]'s op. */
static gvqResult_t group_entered(const gvq_op_t *ops, size_t n) {
    gvqCompressor_t *c = calloc(n, sizeof *c);
    const float **send = calloc(n, sizeof *send);
    float **recv = calloc(n, sizeof *recv);
    gvqRedOp_t *op = calloc(n, sizeof *op);
    gvqResult_t res = gvqSystemError;
    if (c == NULL || send == NULL || recv == NULL || op == NULL) {
        GVQ_WARN("gvqGroupEnd: out of memory for a group of %zu compressed calls", n);
    } else {
        for (size_t i = 0; i < n; i++)
            c[i] = ops[i].compressor, send[i] = ops[i].sendbuff, recv[i] = ops[i].recvbuff,
            op[i] = ops[i].op;
        res = gvq_compressed_allreduce_set(c, send, recv, op, ops[0].op, n);
    }
    free(c), free(send), free(recv), free(op);
    return res;
}

/* The consecutive compressed calls ops[0..n) of one communicator run under one agreement, the
 * QSGD and tracked-basis ones on host buffers fused. */
static gvqResult_t compressed_run_group(const gvq_op_t *ops, size_t n) {
    int host = 1;
    for (size_t i = 0; i < n; i++)
        host &= gvq_device_of(ops[i].sendbuff) == &gvq_host_device &&
                gvq_device_of(ops[i].recvbuff) == &gvq_host_device;
    if (n == 1 || !host) { /* one by one, each with its own agreement */
        for (size_t i = 0; i < n; i++) {
            compressed_args_t a = {ops[i].sendbuff,   ops[i].recvbuff, ops[i].count,  ops[i].op,
                                   ops[i].compressor, ops[i].comm,     ops[i].stream, gvqSuccess};
            if (gvq_stream_is_host(a.stream)) a.stream = NULL;
            GVQCHECK(compressed_run(&a));
        }
        return gvqSuccess;
    }
    const char *fn = "gvqAllReduceCompressed";
    gvqComm_t comm = ops[0].comm;
    GVQCHECK(gvq_comm_enter(comm, fn));
    gvq_call_sig_t sig = group_sig(ops, n);
    gvqResult_t res = gvq_call_agree(comm, fn, &sig);
    if (res == gvqSuccess) res = group_entered(ops, n);
    gvq_comm_leave(comm);
    return res;
}

/* what comm's group machinery calls for a queued compressed call (gvq_group.h) */
static const gvq_upper_ops_t compressed_upper = {.signature = compressed_signature,
                                                 .run_group = compressed_run_group};

/* The job of a call queued on a host stream (stream.c): the call, or its refusal. */
static gvqResult_t compressed_job(void *arg) {
    const compressed_args_t *a = arg;
    if (a->refused == gvqSuccess) return compressed_run(a);
    refuse_together(a->comm, "gvqAllReduceCompressed", a->count, a->op, a->refused);
    return gvqSuccess; /* the refusal was the call's result already */
}

static gvqResult_t enqueue_compressed(const compressed_args_t *a, gvqStream_t stream) {
    compressed_args_t *copy = malloc(sizeof *copy);
    if (copy == NULL) {
        GVQ_WARN("gvqAllReduceCompressed: out of memory queueing the call on stream %p", stream);
        return gvqSystemError;
    }
    *copy = *a;
    copy->stream = NULL; /* host buffers */
    return gvq_stream_enqueue(stream, "gvqAllReduceCompressed", &a->comm, 1, compressed_job, free,
                              copy);
}

GVQ_API gvqResult_t gvqAllReduceCompressed(const void *sendbuff, void *recvbuff, size_t count,
                                           gvqDataType_t datatype, gvqRedOp_t op,
                                           gvqCompressor_t compressor, gvqComm_t comm,
                                           gvqStream_t stream) {
    const char *fn = "gvqAllReduceCompressed";
    compressed_args_t a = {sendbuff, recvbuff, count, op, compressor, comm, stream, gvqSuccess};
    int streamed = gvq_stream_is_host(stream);
    gvqResult_t bad = check_call(sendbuff, recvbuff, count, datatype, op, compressor, comm);
    if (bad == gvqSuccess && streamed &&
        (gvq_device_of(sendbuff) != &gvq_host_device ||
         gvq_device_of(recvbuff) != &gvq_host_device)) {
        GVQ_WARN("%s: stream %p is a host stream (gvqStreamCreate), but a buffer is CUDA memory; "
                 "pass a cudaStream_t",
                 fn, stream);
        bad = gvqInvalidArgument;
    }
    if (gvq_group_active()) { /* queued; gvqGroupEnd runs it, fused where it can */
        gvq_group_t *g = gvq_group_self();
        if (bad != gvqSuccess) {
            gvq_group_refuse(g, bad);
            return bad;
        }
        gvq_op_t o = {.kind = GVQ_OP_COMPRESSED,
                      .sendbuff = sendbuff,
                      .recvbuff = recvbuff,
                      .count = count,
                      .dtype = gvqFloat32,
                      .op = op,
                      .comm = comm,
                      .stream = stream,
                      .compressor = compressor,
                      .upper = &compressed_upper};
        return gvq_group_push(g, &o);
    }
    if (bad != gvqSuccess) {
        a.refused = bad;
        if (streamed && gvq_comm_is_live(comm) && !gvq_group_active())
            (void)enqueue_compressed(&a, stream);
        else
            refuse_together(comm, fn, count, op, bad);
        return bad;
    }
    GVQCHECK(gvq_comm_check(comm, fn, 1)); /* live, and not inside a group */
    return streamed ? enqueue_compressed(&a, stream) : compressed_run(&a);
}
