/*
 * compressor_config.c -- a public gvqCompressorConfig_t resolved into gvq_comp_cfg_t: every
 * field left at GVQ_CONFIG_UNDEF_INT (or -1 for the thresholds) gets its default, and every
 * refusal names the field and the rule.
 *
 *   header -> codec -> shape (K D H W) and slices (L, reuse C) -> thresholds (eps, vote)
 *          -> schedule (W T S, sampling codec, sampleSlices) -> QSGD -> wire, error feedback,
 *             maxDims, seed, integer sums, the clip -> GradiVeQ's basis (fitted or tracked)
 *          -> PowerSGD's rank -> the method's own fields (gvq_method.h: resolve)
 */
#include "gvq_method.h"

static const char *const fn = "gvqCompressorCreate";

static int undef(int v) {
    return v == GVQ_CONFIG_UNDEF_INT;
}

/* Conv shape [K][D][H][W] (K D H W all 1 but W = 0 for a flat tensor) and the slice length. */
static gvqResult_t resolve_shape(const gvqCompressorConfig_t *in, size_t count, gvq_comp_cfg_t *c) {
    int shape = !undef(in->filters) || !undef(in->depth) || !undef(in->height) || !undef(in->width);
    if (shape) {
        c->K = undef(in->filters) ? 1 : in->filters;
        c->D = undef(in->depth) ? 1 : in->depth;
        c->H = undef(in->height) ? 1 : in->height;
        c->W = undef(in->width) ? 1 : in->width;
        if (c->K < 1 || c->D < 1 || c->H < 1 || c->W < 1 ||
            (uint64_t)c->K * (uint64_t)c->D * (uint64_t)c->H * (uint64_t)c->W != count) {
            GVQ_WARN("%s: shape filters=%d depth=%d height=%d width=%d does not match count %zu",
                     fn, c->K, c->D, c->H, c->W, count);
            return gvqInvalidArgument;
        }
    } else {
        c->K = c->D = c->H = 1;
        c->W = 0; /* flat */
    }
    if (undef(in->sliceSize)) {
        int64_t L = (int64_t)c->K * GVQ_DIV_UP(256, c->K);
        int64_t cap = ((int64_t)count / c->K) * c->K;
        c->L = (int32_t)(cap >= c->K ? GVQ_MIN(L, cap) : L);
    } else {
        c->L = in->sliceSize;
        if (c->L < 1 || c->L % c->K != 0 || c->L > 65536) {
            GVQ_WARN("%s: sliceSize=%d must be a positive multiple of filters=%d, at most 65536",
                     fn, c->L, c->K);
            return gvqInvalidArgument;
        }
    }
    c->C = undef(in->reuse) ? 0 : in->reuse;
    if (c->C < 0) {
        GVQ_WARN("%s: reuse=%d must be positive", fn, c->C);
        return gvqInvalidArgument;
    }
    return gvqSuccess;
}

/* The loss threshold, the early-exit vote and the phase schedule. */
static gvqResult_t resolve_schedule(const gvqCompressorConfig_t *in, gvq_comp_cfg_t *c) {
    c->eps = in->lossThreshold < 0 ? 0.01f : in->lossThreshold;
    if (!(c->eps > 0 && c->eps < 1)) {
        GVQ_WARN("%s: lossThreshold=%g must be in (0, 1)", fn, (double)c->eps);
        return gvqInvalidArgument;
    }
    c->vote = in->voteThreshold == -1.0f ? c->eps : in->voteThreshold;
    if (!(c->vote > 0)) { /* also refuses NaN */
        GVQ_WARN("%s: voteThreshold=%g must be positive (>= 1: no early exit)", fn,
                 (double)in->voteThreshold);
        return gvqInvalidArgument;
    }
    c->sample_slices = undef(in->sampleSlices) ? 1 : in->sampleSlices;
    if (c->sample_slices < 0) {
        GVQ_WARN("%s: sampleSlices=%d must be >= 0 (0: every slice)", fn, c->sample_slices);
        return gvqInvalidArgument;
    }
    c->warmup = undef(in->warmupIters) ? 0 : in->warmupIters;
    c->sample = undef(in->sampleIters) ? 100 : in->sampleIters;
    c->compressed = undef(in->compressedIters) ? 400 : in->compressedIters;
    if (c->warmup < 0 || c->sample < 1 || c->compressed < 1) {
        GVQ_WARN(
            "%s: warmupIters=%d sampleIters=%d compressedIters=%d: need W >= 0, T >= 1, S >= 1", fn,
            c->warmup, c->sample, c->compressed);
        return gvqInvalidArgument;
    }
    c->sample_codec = undef(in->sampleCodec) ? gvqCodecNone : in->sampleCodec;
    if (c->sample_codec != gvqCodecNone && c->sample_codec != gvqCodecQsgd) {
        GVQ_WARN("%s: sampleCodec=%d must be gvqCodecNone or gvqCodecQsgd", fn, c->sample_codec);
        return gvqInvalidArgument;
    }
    return gvqSuccess;
}

/* QSGD's bits, bucket and norm. */
static gvqResult_t resolve_qsgd(const gvqCompressorConfig_t *in, gvq_comp_cfg_t *c) {
    c->qbits = undef(in->qsgdBits) ? 4 : in->qsgdBits;
    c->qbucket = undef(in->qsgdBucket) ? 512 : in->qsgdBucket;
    c->qmaxnorm = undef(in->qsgdMaxNorm) ? 1 : in->qsgdMaxNorm;
    if (c->qbits != 2 && c->qbits != 4 && c->qbits != 8) {
        GVQ_WARN("%s: qsgdBits=%d must be 2, 4 or 8", fn, c->qbits);
        return gvqInvalidArgument;
    }
    if (c->qbucket < 1 || c->qbucket > (1 << 24) || (c->qmaxnorm != 0 && c->qmaxnorm != 1)) {
        GVQ_WARN("%s: qsgdBucket=%d must be in [1, 2^24] and qsgdMaxNorm=%d 0 or 1", fn, c->qbucket,
                 c->qmaxnorm);
        return gvqInvalidArgument;
    }
    return gvqSuccess;
}

/* The coefficients' wire type, error feedback, the cap on d and the seed. */
static gvqResult_t resolve_wire(const gvqCompressorConfig_t *in, gvq_comp_cfg_t *c) {
    int wt = undef(in->wireType) ? gvqFloat32 : in->wireType;
    if (wt != gvqFloat32 && wt != gvqFloat16) {
        GVQ_WARN("%s: wireType=%d must be gvqFloat32 or gvqFloat16", fn, wt);
        return gvqInvalidArgument;
    }
    c->fp16 = wt == gvqFloat16;
    c->error_feedback = undef(in->errorFeedback) ? 0 : in->errorFeedback;
    if (c->error_feedback != 0 && c->error_feedback != 1) {
        GVQ_WARN("%s: errorFeedback=%d must be 0 or 1", fn, c->error_feedback);
        return gvqInvalidArgument;
    }
    c->dmax = undef(in->maxDims) ? c->L : in->maxDims;
    int tracked = in->basisUpdate == gvqBasisTrack; /* its L comes later: resolve_basis checks */
    if (c->dmax < 1 || (c->dmax > c->L && !tracked)) {
        GVQ_WARN("%s: maxDims=%d must be in [1, sliceSize=%d]", fn, c->dmax, c->L);
        return gvqInvalidArgument;
    }
    c->seed = undef(in->seed) ? 0 : in->seed;
    c->int_bits = undef(in->integerBits) ? 0 : in->integerBits;
    if (c->int_bits != 0 && c->int_bits != 8 && c->int_bits != 16) {
        GVQ_WARN("%s: integerBits=%d must be 0, 8 or 16", fn, c->int_bits);
        return gvqInvalidArgument;
    }
    if (c->int_bits != 0 && c->fp16) {
        GVQ_WARN("%s: integerBits=%d and wireType gvqFloat16 exclude each other", fn, c->int_bits);
        return gvqInvalidArgument;
    }
    c->ef_bound = in->efBound == -1.0f ? 4.0f : in->efBound;
    if (!(c->ef_bound > 0 && c->ef_bound <= 1e6f)) { /* also refuses NaN */
        GVQ_WARN("%s: efBound=%g must be in (0, 1e6]", fn, (double)in->efBound);
        return gvqInvalidArgument;
    }
    return gvqSuccess;
}

/* GradiVeQ's basis: fitted from sampling phases (the paper), or tracked on every call
 * (methods/gradiveq_track.c resolves its fields). */
static gvqResult_t resolve_basis(const gvqCompressorConfig_t *in, gvq_comp_cfg_t *c) {
    c->track = undef(in->basisUpdate) ? gvqBasisFit : in->basisUpdate;
    if (c->track != gvqBasisFit && c->track != gvqBasisTrack) {
        GVQ_WARN("%s: basisUpdate=%d must be gvqBasisFit (0) or gvqBasisTrack (1)", fn, c->track);
        return gvqInvalidArgument;
    }
    if (c->track == gvqBasisTrack && c->codec != gvqCodecGradiveq) {
        GVQ_WARN("%s: basisUpdate gvqBasisTrack is for codec gvqCodecGradiveq, not codec %d", fn,
                 c->codec);
        return gvqInvalidArgument;
    }
    return gvqSuccess; /* the tracked basis's own fields: methods/gradiveq_track.c */
}

/* PowerSGD's rank (methods/powersgd.c checks it against its matrix). */
static void resolve_powersgd(const gvqCompressorConfig_t *in, gvq_comp_cfg_t *c) {
    c->prank = undef(in->powerRank) ? 1 : in->powerRank;
}

gvqResult_t gvq_compressor_config_resolve(const gvqCompressorConfig_t *in, size_t count,
                                          gvq_comp_cfg_t *c) {
    gvqCompressorConfig_t def = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    if (in == NULL) in = &def;
    GVQCHECK(gvq_config_header_check(fn, "config", in->size, in->magic, in->version,
                                     GVQ_COMPRESSOR_CONFIG_MAGIC, sizeof(gvqCompressorConfig_t),
                                     sizeof(gvqCompressorConfig_t),
                                     "GVQ_COMPRESSOR_CONFIG_INITIALIZER"));
    memset(c, 0, sizeof *c);
    c->count = count;
    c->codec = undef(in->codec) ? gvqCodecGradiveq : in->codec;
    if (c->codec != gvqCodecNone && c->codec != gvqCodecGradiveq && c->codec != gvqCodecQsgd &&
        c->codec != gvqCodecPowersgd) {
        GVQ_WARN("%s: codec %d is not gvqCodecNone, gvqCodecGradiveq, gvqCodecQsgd or "
                 "gvqCodecPowersgd",
                 fn, c->codec);
        return gvqInvalidArgument;
    }
    GVQCHECK(resolve_shape(in, count, c));
    GVQCHECK(resolve_schedule(in, c));
    GVQCHECK(resolve_qsgd(in, c));
    GVQCHECK(resolve_wire(in, c));
    GVQCHECK(resolve_basis(in, c));
    resolve_powersgd(in, c);
    const gvq_method_t *m = gvq_method_of(c); /* the method's own fields */
    return m->resolve != NULL ? m->resolve(fn, in, c) : gvqSuccess;
}
