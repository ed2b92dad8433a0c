/*
 * gradiveq.c -- the GradiVeQ method with a fitted basis (gvq_method.h): compressors of codec
 * gvqCodecGradiveq, basisUpdate gvqBasisFit. Its calls follow the schedule of schedule.c
 * (warm-up, sampling, a PCA fit spread over the ranks in compressor_fit.c, compressed calls),
 * each one ring of the phase's codec (phase_call.c): identity or QSGD while sampling, GradiVeQ
 * (src/algorithms/codecs/codec_gradiveq.c) or its integer-summed wire when compressed; on a
 * device with codecs, the device's.
 */
#include <stdlib.h>

#include "gvq_method.h"

/* The first phase, the sample store, and QSGD's state when the sampling calls run QSGD. */
static gvqResult_t gradiveq_create(gvqCompressor_t c) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    if (cfg->sample_codec == gvqCodecQsgd) GVQCHECK(gvq_compressed_qsgd_init(c));
    if (c->nfull == 0) {
        gvq_compressor_set_reason(c, "tensor shorter than one slice: sent uncompressed");
        return gvqSuccess;
    }
    c->st.phase = cfg->warmup > 0 ? gvqPhaseWarmup : gvqPhaseSample;
    gvq_compressor_set_reason(c, "no compressor fitted yet");
    size_t sb = sizeof(float) * c->ngroups * (size_t)cfg->sample * (size_t)cfg->sample_slices *
                (size_t)cfg->L;
    if ((c->samples = malloc(sb)) == NULL) {
        GVQ_WARN("gvqCompressorCreate: cannot allocate %zu bytes for %d sampling calls x %d "
                 "slices per reuse group (sampleIters, sampleSlices) of %zu groups",
                 sb, cfg->sample, cfg->sample_slices, c->ngroups);
        return gvqSystemError;
    }
    return gvqSuccess;
}

static int gradiveq_serves(const gvq_comp_cfg_t *cfg) {
    return cfg->codec == gvqCodecGradiveq && !cfg->track;
}

static void gradiveq_log(gvqCompressor_t c, size_t count) {
    const gvq_comp_cfg_t *g = &c->cfg;
    GVQ_INFO("compressor %p: tensor %d count %zu gradiveq L=%d C=%d groups %zu K=%d W=%d "
             "T=%d S=%d",
             (void *)c, c->tensor_index, count, g->L, g->C, c->ngroups, g->K, g->warmup, g->sample,
             g->compressed);
}

const gvq_method_t gvq_method_gradiveq = {.name = "gradiveq",
                                          .serves = gradiveq_serves,
                                          .create = gradiveq_create,
                                          .log_created = gradiveq_log,
                                          .allreduce = gvq_compressed_run_host,
                                          .collocates = 1,
                                          .device_resident = 1};
