/*
 * phase_call.c -- one call of a compressor whose method runs one ring through the phase's codec
 * (plain, the fitted GradiVeQ basis, QSGD: gvq_method.h), on host buffers, device-resident or
 * staged (compressed_call.c picks which):
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
 * Error feedback (error_feedback.c) turns x into x + residual before the ring and computes the
 * next residual from this rank's ring input.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec_kernels.h"
#include "gvq_method.h"

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

/* The integer-summed wire of the phase's codec (host buffers): QSGD's made once, GradiVeQ's
 * again after every fit. */
static gvqResult_t intsum_codec(gvqCompressor_t c, int gradiveq, int summands, gvq_codec_t *out) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    gvq_intsum_t *s = gradiveq ? &c->is_gq : &c->is_qsgd;
    int *made_for = gradiveq ? &c->is_gq_n : &c->is_qsgd_n;
    int stale = gradiveq ? c->is_gq_version != c->fit_version : s->bits == 0;
    if (stale || *made_for != summands) {
        gvq_intsum_fini(s);
        *made_for = 0;
        if (gradiveq) c->is_gq_version = 0; /* stays stale if the init below fails */
        /* QSGD's own s caps each summand's levels; a host sum of K gradients (the hierarchy)
         * gets K s, the same resolution per gradient, within the wire's headroom */
        int per = c->comm->nranks / summands;
        GVQCHECK(gvq_intsum_init(s, cfg->int_bits, gradiveq ? 0 : c->qs.levels * per,
                                 (size_t)cfg->qbucket, gradiveq ? &c->gq : NULL, c->comm->dev,
                                 cfg->count, summands, (uint32_t)cfg->seed,
                                 (uint32_t)c->comm->rank));
        if (gradiveq) c->is_gq_version = c->fit_version;
        *made_for = summands;
    }
    s->call = (uint32_t)c->st.iter;
    gvq_codec_intsum_init(out, c->comm->dev, s);
    return gvqSuccess;
}

/* The codec of the current phase, for dev's buffers (a device codec when on_dev). */
static gvqResult_t choose_codec(gvqCompressor_t c, const gvq_device_ops_t *dev, int on_dev,
                                gvq_call_plan_t *p) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    int phase = c->st.phase;
    gvq_codec_t *out = on_dev ? &p->inner : &p->codec;
    int summands = p->hier ? p->comm.hier->nhosts : c->comm->nranks; /* an integer wire's */
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
            GVQCHECK(intsum_codec(c, 1, summands, out));
        else
            gvq_codec_gradiveq_init(out, c->comm->dev, &c->gq);
    } else if (use_qsgd) {
        c->qs.call = (uint32_t)c->st.iter;
        if (on_dev) {
            c->qsgd_dev = (gvq_dev_qsgd_t){c->qs.bits, c->qs.levels, c->qs.norm, c->qs.bucket,
                                           c->qs.seed, c->qs.rank,   c->qs.call};
            gvq_codec_qsgd_dev_init(out, dev, &c->qsgd_dev);
        } else if (cfg->int_bits) {
            GVQCHECK(intsum_codec(c, 0, summands, out));
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
                        gvq_call_plan_t *p) {
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

gvqResult_t gvq_compressed_plan(gvqCompressor_t c, const gvq_device_ops_t *dev,
                                gvq_call_plan_t *p) {
    int on_dev = dev != &gvq_host_device;
    p->sent = 0;
    p->comm = gvq_comm_ctx(c->comm, &p->sent);
    p->hier = !on_dev && p->comm.hier != NULL && gvq_comm_hier_compressed(c->comm);
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

int gvq_compressed_all_finite(const float *v, size_t n) {
    /* a vector pass at memory speed (the float sum it replaced, acc += v[i] * 0, was one
     * dependent add per value: 16 ms at 64 MiB against 6.5 ms; perf/RESULTS.md section 12) */
    return gvq_kernels()->all_finite(v, n);
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
    gvq_call_plan_t p;
    GVQCHECK(gvq_compressed_plan(c, dev, &p));
    /* error feedback (error_feedback.c): the ring runs the codec watched for what it drops */
    const gvq_codec_t *codec = &p.codec;
    gvq_ef_call_t ef;
    if (cfg->error_feedback) GVQCHECK(gvq_ef_begin(c, &ef, &p.codec, send, src, &codec));
    /* the early-exit vote rides inside the compressed ring's allgather when it can */
    int voting = phase == gvqPhaseCompressed && cfg->vote < 1.0f;
    gvq_tally_t tally = {local_vote, c, 0, 0};
    /* the flat ring on host memory: its decodes write every output value and check each chunk
     * for NaN and Inf as they write it (codec_watch.c); else a pass over the output after */
    gvq_finite_watch_t fw;
    int watched =
        !p.hier && dev == &gvq_host_device && !codec->wire_is_values && codec->dtype == gvqFloat32;
    if (watched) {
        gvq_codec_finite_watch_init(&fw, codec);
        codec = &fw.wrap.codec;
    }
    /* hosts of several ranks: compressed between the hosts only (gvq_hier_allreduce), and the
     * vote agreed on after the call; host memory only. An integer wire was made for H summands
     * (choose_codec). Error feedback's watched residual: this rank encodes only its piece of
     * the host's sum, so what it dropped is that piece's and the rest of r is zero. */
    gvqResult_t res;
    if (p.hier) {
        if (codec != &p.codec) memset(ef.r, 0, sizeof(float) * cfg->count);
        /* GradiVeQ's encodes each take Z / (encodes per segment) off (codec_gradiveq.c): across
         * the hosts that is H encodes of host sums, not N of gradients */
        int weight = c->gq.nranks;
        if (phase == gvqPhaseCompressed) c->gq.nranks = p.ring.hier->nhosts;
        res = gvq_hier_allreduce(&p.ring, codec, src, dst, cfg->count, gvqSum);
        c->gq.nranks = weight;
        if (voting) tally.sum = local_vote(c); /* carried 0: agreed on below */
    } else {
        res = gvq_ring_allreduce_tally(&p.ring, codec, src, dst, cfg->count, gvqSum,
                                       voting ? &tally : NULL);
    }
    int finite = res != gvqSuccess || dev != &gvq_host_device ||
                 (watched ? !fw.nonfinite : gvq_compressed_all_finite(dst, cfg->count));
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

/* ---- device buffers --------------------------------------------------------------------------
 * Device-resident: collocation, the codecs, the divide and the inverse collocation run on the
 * device, on the caller's stream; the PCA fit (the samples are copied out) and the phase
 * bookkeeping stay on the host. */

void gvq_compressor_device_free(gvqCompressor_t c) {
    const gvq_device_ops_t *dev = c->ddev;
    if (dev != NULL) {
        gvq_staging_fini(&c->stg);
        float *bufs[] = {c->dwork, c->dU, c->dZ, c->dUZ};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            if (bufs[i] != NULL) dev->free(bufs[i]);
    }
    c->ddev = NULL;
    c->dwork = c->dU = c->dZ = c->dUZ = NULL;
    c->dU_len = 0;
    c->dev_version = 0;
}

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

gvqResult_t gvq_compressed_run_device(gvqCompressor_t c, const gvq_device_ops_t *dev,
                                      const void *send, void *recv, gvqRedOp_t op,
                                      gvqStream_t stream) {
    void *prev = NULL;
    GVQCHECK(dev->set_stream(gvq_device_user_stream(dev, stream), &prev));
    gvqResult_t res = device_ready(c, dev);
    if (res == gvqSuccess) res = run(c, dev, send, recv, op);
    gvqResult_t r2 = dev->set_stream(prev, NULL);
    return res != gvqSuccess ? res : r2;
}

gvqResult_t gvq_compressed_run_host(gvqCompressor_t c, const float *send, float *recv,
                                    gvqRedOp_t op) {
    return run(c, &gvq_host_device, send, recv, op);
}

gvqResult_t gvq_compressed_qsgd_init(gvqCompressor_t c) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    GVQCHECK(gvq_qsgd_init(&c->qs, cfg->qbits, (size_t)cfg->qbucket,
                           cfg->qmaxnorm ? GVQ_QSGD_NORM_MAX : GVQ_QSGD_NORM_L2,
                           (uint32_t)cfg->seed, (uint32_t)c->comm->rank));
    c->have_qsgd = 1;
    return gvqSuccess;
}
