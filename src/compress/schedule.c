/*
 * schedule.c -- the schedule a compressor follows, one step per compressed call (the GradiVeQ
 * phases of the fitted basis; the other methods stay in the plain phase and count calls):
 *
 *   phase       codec on the wire        after the ring (gvq_compressor_advance)
 *   warm-up     identity or QSGD         count down W calls
 *   sample      identity or QSGD         keep sampleSlices summed slices of every reuse group
 *                                        (the first one by default); after T samples: fit
 *                                        (compressor_fit.c)
 *   compressed  GradiVeQ                 vote: local loss > eps on a majority -> sample again;
 *                                        after S calls -> sample again
 *
 * Every decision (phase changes, d, refusals) is taken from values that are identical on all
 * ranks (sums of the ring, results of an allreduce), so all ranks stay in step.
 */
#include <stdio.h>
#include <stdlib.h>

#include "gvq_compressor.h"

void gvq_compressor_set_reason(gvqCompressor_t c, const char *why) {
    snprintf(c->st.stats.reason, sizeof c->st.stats.reason, "%s", why);
}

static void enter_phase(gvqCompressor_t c, int phase) {
    c->st.phase = phase;
    c->st.phase_iter = 0;
    if (phase == gvqPhaseSample) c->st.nsamples = 0;
}

/* Copy this call's samples out of the summed result: sample_slices slices of every reuse
 * group, spread evenly over it (a plain copy on the host device). */
static gvqResult_t keep_samples(gvqCompressor_t c, const gvq_device_ops_t *dev, const float *dst) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    size_t L = (size_t)cfg->L, T = (size_t)cfg->sample, S = (size_t)cfg->sample_slices;
    size_t C = (size_t)cfg->C, t = (size_t)c->st.nsamples;
    if (t >= T) { /* the round is full (cannot happen after after_sample; a guard all the same) */
        GVQ_WARN("compressor of tensor %d: sampling round already full (%zu samples)",
                 c->tensor_index, t);
        return gvqInternalError;
    }
    for (size_t g = 0; g < c->ngroups; g++) {
        size_t cg = GVQ_MIN(C, c->nfull - g * C), ns = gvq_compressor_group_samples(c, g);
        for (size_t j = 0; j < ns; j++)
            GVQCHECK(dev->copy_to_host(c->samples + (g * T * S + t * ns + j) * L,
                                       dst + (g * C + j * cg / ns) * L, sizeof(float) * L));
    }
    c->st.nsamples++;
    return gvqSuccess;
}

static void after_compressed(gvqCompressor_t c, double loss, int32_t vote) {
    gvqCompressorStats_t *s = &c->st.stats;
    s->lastLoss = loss;
    c->st.phase_iter++;
    if (2 * vote > c->comm->nranks) {
        s->earlyExits++;
        gvq_compressor_set_reason(c, "majority of ranks above the loss threshold: resampling");
        enter_phase(c, gvqPhaseSample);
    } else if (c->st.phase_iter >= c->cfg.compressed) {
        gvq_compressor_set_reason(c, "sampling again, as scheduled after compressedIters calls "
                                     "(not a failure)");
        enter_phase(c, gvqPhaseSample);
    }
}

static gvqResult_t after_sample(gvqCompressor_t c, gvq_coll_ctx_t *ctx) {
    gvqCompressorStats_t *s = &c->st.stats;
    c->st.phase_iter++;
    if (c->st.nsamples < c->cfg.sample) return gvqSuccess;
    int ok = 0;
    gvqResult_t res = gvq_compressor_fit(c, ctx, &ok);
    if (res != gvqSuccess) { /* a failed fit (a timeout, no memory): sample again from scratch,
                                never past the samples buffer */
        enter_phase(c, gvqPhaseSample);
        return res;
    }
    if (ok) {
        s->fits++;
        s->reason[0] = '\0';
        enter_phase(c, gvqPhaseCompressed);
        return gvqSuccess;
    }
    s->fitsRefused++;
    gvq_compressor_set_reason(c, "fit refused: the samples hold NaN or Inf; sampling again");
    GVQ_WARN("compressor of tensor %d: fit refused (non-finite gradient samples); "
             "staying uncompressed and sampling again",
             c->tensor_index);
    enter_phase(c, gvqPhaseSample);
    return gvqSuccess;
}

gvqResult_t gvq_compressor_advance(gvqCompressor_t c, gvq_coll_ctx_t *ctx,
                                   const gvq_device_ops_t *dev, const float *dst,
                                   unsigned long long sent, double loss, int32_t vote) {
    gvqCompressorStats_t *s = &c->st.stats;
    size_t M = c->cfg.count;
    int n = c->comm->nranks, phase = c->st.phase;
    s->wireBytes += sent;
    s->rawBytes += (unsigned long long)(n > 1 ? 2 * (size_t)(n - 1) * M * 4 / (size_t)n : 0);
    if (phase == gvqPhaseSample) GVQCHECK(keep_samples(c, dev, dst));
    if (phase == gvqPhaseCompressed) {
        after_compressed(c, loss, vote);
    } else if (phase == gvqPhaseWarmup) {
        if (++c->st.phase_iter >= c->cfg.warmup) enter_phase(c, gvqPhaseSample);
    } else if (phase == gvqPhaseSample) {
        GVQCHECK(after_sample(c, ctx));
    } else {
        c->st.phase_iter++;
    }
    c->st.iter++;
    return gvqSuccess;
}
