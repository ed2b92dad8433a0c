/*
 * plain.c -- the method of codec gvqCodecNone (gvq_method.h): the tensor summed uncompressed
 * through the phase's ring (phase_call.c) with the identity codec, with the compressor's
 * statistics and, when asked, its collocation and error feedback.
 */
#include "gvq_method.h"

static int plain_serves(const gvq_comp_cfg_t *cfg) {
    return cfg->codec == gvqCodecNone;
}

static void plain_log(gvqCompressor_t c, size_t count) {
    GVQ_INFO("compressor %p: tensor %d count %zu none (uncompressed) K=%d", (void *)c,
             c->tensor_index, count, c->cfg.K);
}

const gvq_method_t gvq_method_plain = {.name = "plain",
                                       .serves = plain_serves,
                                       .log_created = plain_log,
                                       .allreduce = gvq_compressed_run_host,
                                       .collocates = 1,
                                       .device_resident = 1};
