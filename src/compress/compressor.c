/*
 * compressor.c -- compressor handles (create, destroy, stats, the registry of live ones) and
 * the GradiVeQ schedule they follow, one step per compressed call:
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
#include "gvq_handles.h"
#include "gvq_stream.h"

static gvq_handles_t live = GVQ_HANDLES_INITIALIZER;

/* A compressor outlives neither its communicator's memory nor its meaning: when the
 * communicator is destroyed or aborted, the attachment below orphans it (comm = NULL), and every
 * call but gvqCompressorDestroy refuses it. */
int gvq_compressor_live(gvqCompressor_t c) {
    gvq_handles_lock(&live);
    int found = gvq_handles_find_locked(&live, c) >= 0, orphaned = found && c->comm == NULL;
    gvq_handles_unlock(&live);
    if (orphaned)
        GVQ_WARN("compressor %p: its communicator was destroyed or aborted; only "
                 "gvqCompressorDestroy may still be called",
                 (void *)c);
    return found && !orphaned;
}

static void orphan(void *state) {
    gvqCompressor_t c = state;
    gvq_handles_lock(&live);
    c->comm = NULL;
    gvq_handles_unlock(&live);
}

uint64_t gvq_compressor_identity(gvqCompressor_t c) {
    const unsigned char *b = (const unsigned char *)&c->cfg; /* no padding: see its assert */
    uint64_t h = 0xcbf29ce484222325ull;                      /* FNV-1a */
    for (size_t i = 0; i < sizeof c->cfg; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    h = (h ^ (uint64_t)(uint32_t)c->tensor_index) * 0x100000001b3ull;
    return h != 0 ? h : 1;
}

void gvq_compressor_set_reason(gvqCompressor_t c, const char *why) {
    snprintf(c->st.stats.reason, sizeof c->st.stats.reason, "%s", why);
}

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

/* ---- create / destroy ------------------------------------------------------------------------ */

static size_t codec_chunk_bytes(void) {
    size_t bytes = (size_t)gvq_param(GVQ_PARAM_CODEC_CHUNK_BYTES);
    if (bytes < 1024 || bytes > (1u << 30)) {
        GVQ_WARN("GVQ_CODEC_CHUNK_BYTES=%zu is outside [1024, 2^30]; using 256 KiB", bytes);
        bytes = 1 << 18;
    }
    return bytes;
}

/* The first phase, and GradiVeQ's sample store. */
static gvqResult_t start_schedule(gvqCompressor_t c) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    c->st.phase = gvqPhasePlain;
    if (cfg->codec != gvqCodecGradiveq || cfg->track) return gvqSuccess; /* no schedule */
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

/* PowerSGD's matrix (n x m, zero-padded), P, the kept Q (random normal from the seed, the same
 * on every rank) and the Q being summed. No collocation work buffer: PowerSGD sees the tensor as
 * it is (filters as rows). */
static gvqResult_t alloc_powersgd(gvqCompressor_t c) {
    size_t n, m, r = (size_t)c->cfg.prank;
    gvq_powersgd_shape(&c->cfg, &n, &m);
    c->ps_n = n;
    c->ps_m = m;
    c->ps_M = calloc(n * m, sizeof(float));
    c->ps_P = malloc(sizeof(float) * n * r);
    c->ps_Q = malloc(sizeof(float) * m * r);
    c->ps_Qsum = malloc(sizeof(float) * m * r);
    if (c->ps_M == NULL || c->ps_P == NULL || c->ps_Q == NULL || c->ps_Qsum == NULL) {
        GVQ_WARN("gvqCompressorCreate: cannot allocate PowerSGD's %zu x %zu matrix and rank-%zu "
                 "factors",
                 n, m, r);
        return gvqSystemError;
    }
    gvq_powersgd_init_q(c->ps_Q, m, r, (uint32_t)c->cfg.seed);
    c->st.stats.ratio = (double)(n * m) / (double)((n + m) * r);
    return gvqSuccess;
}

/* A tracked GradiVeQ basis (gradiveq_track.c): the nslices x L slice matrix (zero-padded),
 * the rings' C0 / C (nslices x d) and B (L x d), and the basis U, random normal from the seed and
 * orthonormalised (the same on every rank). */
static gvqResult_t alloc_track(gvqCompressor_t c) {
    size_t L = (size_t)c->cfg.L, n = GVQ_DIV_UP((size_t)c->cfg.count, L), d = (size_t)c->cfg.dmax;
    c->ps_n = n;
    c->ps_m = L;
    c->ps_M = calloc(n * L, sizeof(float));
    c->ps_P = malloc(sizeof(float) * (n + L) * d);
    c->ps_Q = malloc(sizeof(float) * L * d);
    if (c->ps_M == NULL || c->ps_P == NULL || c->ps_Q == NULL) {
        GVQ_WARN(
            "gvqCompressorCreate: cannot allocate the %zu x %zu slice matrix and the %zu x %zu "
            "basis of a tracked GradiVeQ basis",
            n, L, L, d);
        return gvqSystemError;
    }
    gvq_powersgd_init_q(c->ps_Q, L, d, (uint32_t)c->cfg.seed);
    gvq_powersgd_orthonormalize(c->ps_Q, L, d);
    c->track_plain = (2 * n + L) * d >= (size_t)c->cfg.count;
    double vbytes = c->cfg.int_bits ? c->cfg.int_bits / 8.0 : 4.0; /* a value on the wire */
    c->st.stats.ratio =
        c->track_plain ? 1.0 : 4.0 * (double)(n * L) / ((double)((2 * n + L) * d) * vbytes);
    if (c->track_plain)
        gvq_compressor_set_reason(c, "tracking d directions would send more than the tensor: "
                                     "sent uncompressed");
    return gvqSuccess;
}

size_t gvq_compressor_factor_cols(gvqCompressor_t c) {
    if (c->cfg.codec == gvqCodecPowersgd) return (size_t)c->cfg.prank;
    return c->cfg.track ? (size_t)c->cfg.dmax : 0;
}

/* QSGD's state and the collocation / error-feedback vectors. */
static gvqResult_t alloc_buffers(gvqCompressor_t c) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    size_t count = cfg->count;
    if (cfg->codec == gvqCodecQsgd || cfg->sample_codec == gvqCodecQsgd) {
        GVQCHECK(gvq_qsgd_init(&c->qs, cfg->qbits, (size_t)cfg->qbucket,
                               cfg->qmaxnorm ? GVQ_QSGD_NORM_MAX : GVQ_QSGD_NORM_L2,
                               (uint32_t)cfg->seed, (uint32_t)c->comm->rank));
        c->have_qsgd = 1;
    }
    if ((c->collocate || cfg->error_feedback) && (c->work = malloc(sizeof(float) * count)) == NULL)
        return gvqSystemError;
    if (cfg->error_feedback) {
        c->ef_input = malloc(sizeof(float) * count);
        c->residual = calloc(count, sizeof(float));
        if (c->ef_input == NULL || c->residual == NULL) return gvqSystemError;
    }
    if (cfg->codec == gvqCodecPowersgd) GVQCHECK(alloc_powersgd(c));
    if (cfg->track) GVQCHECK(alloc_track(c));
    return gvqSuccess;
}

/* The handle's layout: full slices, reuse groups, collocation, the stats that never change. */
static void lay_out(gvqCompressor_t c) {
    gvq_comp_cfg_t *cfg = &c->cfg;
    c->nfull = cfg->count / (size_t)cfg->L;
    size_t C = cfg->C > 0 ? (size_t)cfg->C : GVQ_MAX(c->nfull, (size_t)1);
    c->ngroups = GVQ_DIV_UP(c->nfull, C);
    cfg->C = (int32_t)C;
    if (cfg->sample_slices == 0 || (size_t)cfg->sample_slices > C) cfg->sample_slices = (int32_t)C;
    c->collocate = cfg->codec != gvqCodecPowersgd && cfg->K > 1 && cfg->D * cfg->H * cfg->W > 1;
    c->st.stats.codec = cfg->codec;
    c->st.stats.sliceSize = cfg->L;
    c->st.stats.groups = (int)c->ngroups;
}

static void compressor_free(gvqCompressor_t c) {
    c->magic = 0;
    if (c->have_qsgd) gvq_qsgd_fini(&c->qs);
    gvq_intsum_fini(&c->is_qsgd);
    gvq_intsum_fini(&c->is_gq);
    gvq_gradiveq_fini(&c->gq);
    gvq_compressor_device_free(c);
    free(c->samples);
    free(c->U);
    free(c->Z);
    free(c->work);
    free(c->ef_input);
    free(c->residual);
    free(c->ps_M);
    free(c->ps_P);
    free(c->ps_Q);
    free(c->ps_Qsum);
    free(c);
}

/* The INFO line of a new compressor: the fields of its own method only. */
static void log_created(const gvqCompressor_t c, size_t count) {
    const gvq_comp_cfg_t *g = &c->cfg;
    if (!GVQ_LOG_ENABLED(GVQ_LOG_INFO)) return;
    if (g->codec == gvqCodecPowersgd)
        GVQ_INFO("compressor %p: tensor %d count %zu powersgd rank %d error feedback %d", (void *)c,
                 c->tensor_index, count, g->prank, g->error_feedback);
    else if (g->codec == gvqCodecQsgd)
        GVQ_INFO("compressor %p: tensor %d count %zu qsgd %d bits bucket %d %s norm integer "
                 "wire %d",
                 (void *)c, c->tensor_index, count, g->qbits, g->qbucket,
                 g->qmaxnorm ? "max" : "L2", g->int_bits);
    else if (g->track)
        GVQ_INFO("compressor %p: tensor %d count %zu gradiveq tracked basis d %d L=%d K=%d "
                 "integer wire %d",
                 (void *)c, c->tensor_index, count, g->dmax, g->L, g->K, g->int_bits);
    else
        GVQ_INFO("compressor %p: tensor %d count %zu gradiveq L=%d C=%d groups %zu K=%d W=%d "
                 "T=%d S=%d",
                 (void *)c, c->tensor_index, count, g->L, g->C, c->ngroups, g->K, g->warmup,
                 g->sample, g->compressed);
}

GVQ_API gvqResult_t gvqCompressorCreate(gvqComm_t comm, size_t count,
                                        const gvqCompressorConfig_t *config,
                                        gvqCompressor_t *compressor) {
    if (compressor == NULL) {
        GVQ_WARN("gvqCompressorCreate: compressor is NULL");
        return gvqInvalidArgument;
    }
    if (!gvq_comm_is_live(comm)) return gvq_comm_refuse_dead(comm, "gvqCompressorCreate");
    if (count == 0 || count > ((size_t)1 << 40)) {
        GVQ_WARN("gvqCompressorCreate: count %zu must be in [1, 2^40]", count);
        return gvqInvalidArgument;
    }
    gvq_comp_cfg_t cfg;
    GVQCHECK(gvq_compressor_config_resolve(config, count, &cfg));
    gvqCompressor_t c = calloc(1, sizeof *c);
    if (c == NULL) return gvqSystemError;
    c->magic = GVQ_COMPRESSOR_MAGIC;
    c->comm = comm;
    c->tensor_index = comm->ntensors++;
    c->cfg = cfg;
    c->codec_chunk_bytes = codec_chunk_bytes();
    lay_out(c);
    gvqResult_t res = start_schedule(c);
    if (res == gvqSuccess) res = alloc_buffers(c);
    if (res == gvqSuccess) res = gvq_comm_attach(comm, c, c, orphan);
    if (res == gvqSuccess && (res = gvq_handles_add(&live, c)) != gvqSuccess)
        gvq_comm_detach(comm, c);
    if (res != gvqSuccess) {
        compressor_free(c);
        return res;
    }
    log_created(c, count);
    *compressor = c;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqCompressorDestroy(gvqCompressor_t c) {
    gvq_handles_lock(&live);
    gvqComm_t comm = gvq_handles_find_locked(&live, c) >= 0 ? c->comm : NULL;
    gvq_handles_unlock(&live);
    if (comm != NULL && gvq_comm_is_live(comm)) gvq_stream_comm_drain(comm); /* queued calls */
    if (!gvq_handles_remove(&live, c)) {
        GVQ_WARN("gvqCompressorDestroy: %p is not a live compressor", (void *)c);
        return gvqInvalidArgument;
    }
    if (c->comm != NULL) gvq_comm_detach(c->comm, c); /* NULL: the communicator went first */
    compressor_free(c);
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqCompressorGetStats(gvqCompressor_t c, gvqCompressorStats_t *stats) {
    if (!gvq_compressor_live(c) || stats == NULL) {
        GVQ_WARN("gvqCompressorGetStats: %s",
                 stats == NULL ? "stats is NULL" : "not a live compressor");
        return gvqInvalidArgument;
    }
    gvq_stream_comm_settle(c->comm); /* calls queued on host streams change the stats */
    *stats = c->st.stats;
    stats->phase = c->st.phase;
    stats->iteration = c->st.iter;
    stats->phaseIter = c->st.phase_iter;
    stats->dims = c->cfg.track ? (c->track_plain ? 0 : c->cfg.dmax) : c->st.d;
    return gvqSuccess;
}

/* ---- the schedule ---------------------------------------------------------------------------- */

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
