/*
 * compressor.c -- compressor handles: config checks, the GradiVeQ schedule, the fits spread over
 * the ranks, the compressed allreduce, statistics, checkpoints and zero-code mode.
 *
 *   call:  x (+ residual) --collocate--> ring(codec of the phase, sum) --> (/N) --uncollocate--> y
 *
 *   phase       codec on the wire        after the ring
 *   warm-up     identity or QSGD         count down W calls
 *   sample      identity or QSGD         keep ss summed slices of every reuse group (the
 *                                        first one by default); after T samples: fit (group
 *                                        g on rank (t+g) mod N,
 *                                        agree on d = max, broadcast U, Z from the owners)
 *   compressed  GradiVeQ                 vote: local loss > eps on a majority -> sample again;
 *                                        after S calls -> sample again
 *
 * Every decision (phase changes, d, refusals) is taken from values that are identical on all
 * ranks (sums of the ring, results of an allreduce), so all ranks stay in step.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "gvq_comm.h"

#define GVQ_COMPRESSOR_MAGIC 0x67767163u
#define SAVE_MAGIC 0x32524d4351564721ull /* "!GVQCMR2" */

/* The resolved configuration (every default filled in). Saved states carry it, so a load can
 * check that it restores into the same kind of compressor. */
typedef struct {
    int32_t codec, K, D, H, W, L, C;
    float eps;
    int32_t warmup, sample, compressed, sample_codec, qbits, qbucket, qmaxnorm, fp16, ef, dmax,
        seed;
    float vote;      /* early-exit threshold on the local loss */
    int32_t ss;      /* slices per reuse group kept per sampling call (1..C) */
    int32_t zero;    /* keeps count 8-aligned without implicit padding, so that save/load can
                        memcmp the struct; always 0 */
    uint64_t count;
} comp_cfg_t;
_Static_assert(sizeof(comp_cfg_t) == 22 * 4 + 8, "comp_cfg_t must have no implicit padding");

typedef struct {
    int32_t phase;
    int32_t d;
    int64_t iter, phase_iter, nsamples;
    gvqCompressorStats_t stats;
} comp_state_t;

struct gvqCompressor {
    uint32_t magic;
    gvqComm_t comm;
    int tensor_index;
    comp_cfg_t cfg;
    comp_state_t st;
    size_t nfull, ngroups;
    int collocate;
    float *samples; /* ngroups x T x ss x L */
    float *U, *Z;   /* ngroups x L x d, ngroups x L */
    float *work;    /* collocated vector (count) */
    float *efin;    /* gradient + residual (count) */
    float *residual;
    gvq_gradiveq_t gq;
    gvq_qsgd_t qs;
    int have_qsgd;
    size_t codec_chunk_bytes; /* ring chunk while a compressing codec runs (GVQ_CODEC_CHUNK_BYTES) */
    uint64_t fit_version;     /* bumped by every codec_setup (a fit or a load) */
    /* Device-resident calls (buffers in a device's memory, run_device): the device's copies of
     * the collocated vector and of U, Z, U^T Z, and the device codecs' parameters. */
    const gvq_device_ops_t *ddev;
    float *dwork, *dU, *dZ, *dUZ;
    size_t dU_len;            /* floats in dU (ngroups L d) */
    uint64_t dev_version;     /* fit_version of dU, dZ, dUZ (0: none) */
    gvq_gq_dev_t gqd;
    gvq_dev_qsgd_t qsd;
    gvq_staging_t stg;
};

/* ---- configuration ---------------------------------------------------------------------- */

static int undef(int v) { return v == GVQ_CONFIG_UNDEF_INT; }

static gvqResult_t config_resolve(const gvqCompressorConfig_t *in, size_t count, comp_cfg_t *c) {
    const char *fn = "gvqCompressorCreate";
    gvqCompressorConfig_t def = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    if (in == NULL) in = &def;
    if (in->magic != GVQ_COMPRESSOR_CONFIG_MAGIC || in->size < sizeof(gvqCompressorConfig_t) ||
        in->version > GVQ_VERSION) {
        GVQ_WARN("%s: config not made with GVQ_COMPRESSOR_CONFIG_INITIALIZER (magic 0x%x size %zu "
                 "version %u)", fn, in->magic, in->size, in->version);
        return gvqInvalidArgument;
    }
    memset(c, 0, sizeof *c);
    c->count = count;
    c->codec = undef(in->codec) ? gvqCodecGradiveq : in->codec;
    if (c->codec != gvqCodecNone && c->codec != gvqCodecGradiveq && c->codec != gvqCodecQsgd) {
        GVQ_WARN("%s: codec %d is not gvqCodecNone, gvqCodecGradiveq or gvqCodecQsgd", fn, c->codec);
        return gvqInvalidArgument;
    }
    int shape = !undef(in->filters) || !undef(in->depth) || !undef(in->height) || !undef(in->width);
    if (shape) {
        c->K = undef(in->filters) ? 1 : in->filters;
        c->D = undef(in->depth) ? 1 : in->depth;
        c->H = undef(in->height) ? 1 : in->height;
        c->W = undef(in->width) ? 1 : in->width;
        if (c->K < 1 || c->D < 1 || c->H < 1 || c->W < 1 ||
            (uint64_t)c->K * (uint64_t)c->D * (uint64_t)c->H * (uint64_t)c->W != count) {
            GVQ_WARN("%s: shape filters=%d depth=%d height=%d width=%d does not match count %zu", fn,
                     c->K, c->D, c->H, c->W, count);
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
            GVQ_WARN("%s: sliceSize=%d must be a positive multiple of filters=%d, at most 65536", fn,
                     c->L, c->K);
            return gvqInvalidArgument;
        }
    }
    c->C = undef(in->reuse) ? 0 : in->reuse;
    if (c->C < 0) {
        GVQ_WARN("%s: reuse=%d must be positive", fn, c->C);
        return gvqInvalidArgument;
    }
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
    c->ss = undef(in->sampleSlices) ? 1 : in->sampleSlices;
    if (c->ss < 0) {
        GVQ_WARN("%s: sampleSlices=%d must be >= 0 (0: every slice)", fn, c->ss);
        return gvqInvalidArgument;
    }
    c->warmup = undef(in->warmupIters) ? 0 : in->warmupIters;
    c->sample = undef(in->sampleIters) ? 100 : in->sampleIters;
    c->compressed = undef(in->compressedIters) ? 400 : in->compressedIters;
    if (c->warmup < 0 || c->sample < 1 || c->compressed < 1) {
        GVQ_WARN("%s: warmupIters=%d sampleIters=%d compressedIters=%d: need W >= 0, T >= 1, S >= 1",
                 fn, c->warmup, c->sample, c->compressed);
        return gvqInvalidArgument;
    }
    c->sample_codec = undef(in->sampleCodec) ? gvqCodecNone : in->sampleCodec;
    if (c->sample_codec != gvqCodecNone && c->sample_codec != gvqCodecQsgd) {
        GVQ_WARN("%s: sampleCodec=%d must be gvqCodecNone or gvqCodecQsgd", fn, c->sample_codec);
        return gvqInvalidArgument;
    }
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
    int wt = undef(in->wireType) ? gvqFloat32 : in->wireType;
    if (wt != gvqFloat32 && wt != gvqFloat16) {
        GVQ_WARN("%s: wireType=%d must be gvqFloat32 or gvqFloat16", fn, wt);
        return gvqInvalidArgument;
    }
    c->fp16 = wt == gvqFloat16;
    c->ef = undef(in->errorFeedback) ? 0 : in->errorFeedback;
    if (c->ef != 0 && c->ef != 1) {
        GVQ_WARN("%s: errorFeedback=%d must be 0 or 1", fn, c->ef);
        return gvqInvalidArgument;
    }
    c->dmax = undef(in->maxDims) ? c->L : in->maxDims;
    if (c->dmax < 1 || c->dmax > c->L) {
        GVQ_WARN("%s: maxDims=%d must be in [1, sliceSize=%d]", fn, c->dmax, c->L);
        return gvqInvalidArgument;
    }
    c->seed = undef(in->seed) ? 0 : in->seed;
    return gvqSuccess;
}

static int is_live(gvqCompressor_t c) { return c != NULL && c->magic == GVQ_COMPRESSOR_MAGIC; }

/* Drop the device copies (run_device makes them again when needed). */
static void device_free(gvqCompressor_t c) {
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

static void set_reason(gvqCompressor_t c, const char *why) {
    snprintf(c->st.stats.reason, sizeof c->st.stats.reason, "%s", why);
}

GVQ_API gvqResult_t gvqCompressorCreate(gvqComm_t comm, size_t count,
                                        const gvqCompressorConfig_t *config,
                                        gvqCompressor_t *compressor) {
    if (compressor == NULL) {
        GVQ_WARN("gvqCompressorCreate: compressor is NULL");
        return gvqInvalidArgument;
    }
    if (!gvq_comm_is_live(comm)) {
        GVQ_WARN("gvqCompressorCreate: comm %p is not a live communicator", (void *)comm);
        return gvqInvalidArgument;
    }
    if (count == 0 || count > ((size_t)1 << 40)) {
        GVQ_WARN("gvqCompressorCreate: count %zu must be in [1, 2^40]", count);
        return gvqInvalidArgument;
    }
    comp_cfg_t cfg;
    GVQCHECK(config_resolve(config, count, &cfg));
    gvqCompressor_t c = calloc(1, sizeof *c);
    if (c == NULL) return gvqSystemError;
    c->magic = GVQ_COMPRESSOR_MAGIC;
    c->comm = comm;
    c->tensor_index = comm->ntensors++;
    c->cfg = cfg;
    c->codec_chunk_bytes = (size_t)gvq_param(GVQ_PARAM_CODEC_CHUNK_BYTES);
    if (c->codec_chunk_bytes < 1024 || c->codec_chunk_bytes > (1u << 30)) {
        GVQ_WARN("GVQ_CODEC_CHUNK_BYTES=%zu is outside [1024, 2^30]; using 256 KiB",
                 c->codec_chunk_bytes);
        c->codec_chunk_bytes = 1 << 18;
    }
    c->nfull = count / (size_t)cfg.L;
    size_t C = cfg.C > 0 ? (size_t)cfg.C : GVQ_MAX(c->nfull, (size_t)1);
    c->ngroups = GVQ_DIV_UP(c->nfull, C);
    c->cfg.C = (int32_t)C;
    if (c->cfg.ss == 0 || (size_t)c->cfg.ss > C) c->cfg.ss = (int32_t)C;
    cfg.ss = c->cfg.ss;
    c->collocate = cfg.K > 1 && cfg.D * cfg.H * cfg.W > 1;
    gvqResult_t res = gvqSuccess;
    gvqCompressorStats_t *s = &c->st.stats;
    s->codec = cfg.codec;
    s->sliceSize = cfg.L;
    s->groups = (int)c->ngroups;
    if (cfg.codec == gvqCodecGradiveq && c->nfull == 0) {
        c->st.phase = gvqPhasePlain;
        set_reason(c, "tensor shorter than one slice: sent uncompressed");
    } else if (cfg.codec == gvqCodecGradiveq) {
        c->st.phase = cfg.warmup > 0 ? gvqPhaseWarmup : gvqPhaseSample;
        set_reason(c, "no compressor fitted yet");
        size_t sb = sizeof(float) * c->ngroups * (size_t)cfg.sample * (size_t)cfg.ss * (size_t)cfg.L;
        c->samples = malloc(sb);
        if (c->samples == NULL) {
            GVQ_WARN("gvqCompressorCreate: cannot allocate %zu bytes for %d sampling calls x %d "
                     "slices per reuse group (sampleIters, sampleSlices) of %zu groups",
                     sb, cfg.sample, cfg.ss, c->ngroups);
            res = gvqSystemError;
        }
    } else {
        c->st.phase = gvqPhasePlain;
    }
    if (res == gvqSuccess && (cfg.codec == gvqCodecQsgd || cfg.sample_codec == gvqCodecQsgd)) {
        res = gvq_qsgd_init(&c->qs, cfg.qbits, (size_t)cfg.qbucket,
                            cfg.qmaxnorm ? GVQ_QSGD_NORM_MAX : GVQ_QSGD_NORM_L2, (uint32_t)cfg.seed,
                            (uint32_t)comm->rank);
        c->have_qsgd = res == gvqSuccess;
    }
    if (res == gvqSuccess && (c->collocate || cfg.ef)) {
        c->work = malloc(sizeof(float) * count);
        if (c->work == NULL) res = gvqSystemError;
    }
    if (res == gvqSuccess && cfg.ef) {
        c->efin = malloc(sizeof(float) * count);
        c->residual = calloc(count, sizeof(float));
        if (c->efin == NULL || c->residual == NULL) res = gvqSystemError;
    }
    if (res != gvqSuccess) {
        gvqCompressorDestroy(c);
        return res;
    }
    GVQ_INFO("compressor %p: tensor %d count %zu codec %d L=%d C=%zu groups %zu K=%d W=%d T=%d S=%d",
             (void *)c, c->tensor_index, count, cfg.codec, cfg.L, C, c->ngroups, cfg.K, cfg.warmup,
             cfg.sample, cfg.compressed);
    *compressor = c;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqCompressorDestroy(gvqCompressor_t c) {
    if (!is_live(c)) {
        GVQ_WARN("gvqCompressorDestroy: %p is not a live compressor", (void *)c);
        return gvqInvalidArgument;
    }
    c->magic = 0;
    if (c->have_qsgd) gvq_qsgd_fini(&c->qs);
    gvq_gradiveq_fini(&c->gq);
    device_free(c);
    free(c->samples);
    free(c->U);
    free(c->Z);
    free(c->work);
    free(c->efin);
    free(c->residual);
    free(c);
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqCompressorGetStats(gvqCompressor_t c, gvqCompressorStats_t *stats) {
    if (!is_live(c) || stats == NULL) {
        GVQ_WARN("gvqCompressorGetStats: %s", stats == NULL ? "stats is NULL" : "not a live compressor");
        return gvqInvalidArgument;
    }
    *stats = c->st.stats;
    stats->phase = c->st.phase;
    stats->iteration = c->st.iter;
    stats->phaseIter = c->st.phase_iter;
    stats->dims = c->st.d;
    return gvqSuccess;
}

/* ---- the fit --------------------------------------------------------------------------------- */

static gvqCompressorStats_t *stats_of(gvqCompressor_t c) { return &c->st.stats; }

/* (Re)build the GradiVeQ codec state from U, Z, d. */
static gvqResult_t codec_setup(gvqCompressor_t c) {
    gvq_gradiveq_fini(&c->gq);
    memset(&c->gq, 0, sizeof c->gq);
    c->gq.count = c->cfg.count;
    c->gq.L = (size_t)c->cfg.L;
    c->gq.d = (size_t)c->st.d;
    c->gq.C = (size_t)c->cfg.C;
    c->gq.nranks = c->comm->nranks;
    c->gq.wire_fp16 = c->cfg.fp16;
    c->gq.U = c->U;
    c->gq.Z = c->Z;
    GVQCHECK(gvq_gradiveq_prepare(&c->gq, c->comm->dev));
    c->fit_version++;
    size_t full_bytes = (size_t)c->cfg.L * sizeof(float);
    size_t coef_bytes = (size_t)c->st.d * (c->cfg.fp16 ? 2 : 4);
    stats_of(c)->ratio = (double)(c->cfg.count * sizeof(float)) /
                         (double)(c->nfull * coef_bytes + (c->cfg.count - c->nfull * (size_t)c->cfg.L) * 4);
    (void)full_bytes;
    return gvqSuccess;
}

/* A small allreduce of int32 through the plain ring (all ranks call it in the same order). */
static gvqResult_t agree_i32(gvq_coll_ctx_t *ctx, int32_t *v, int n, gvqRedOp_t op) {
    gvq_codec_t id;
    gvq_codec_identity_init(&id, ctx->dev, gvqInt32, op);
    return gvq_ring_allreduce(ctx, &id, v, v, (size_t)n, op);
}

/* Slices of group g kept per sampling call: ss, or fewer in a short last group. */
static size_t group_samples(gvqCompressor_t c, size_t g) {
    size_t C = (size_t)c->cfg.C, cg = GVQ_MIN(C, c->nfull - g * C);
    return GVQ_MIN((size_t)c->cfg.ss, cg);
}

/* Fit every reuse group on its owner rank, agree on d, broadcast (U, Z) from the owners.
 * Returns gvqSuccess with *ok = 0 when a fit was refused (non-finite samples) on any rank. */
static gvqResult_t fit(gvqCompressor_t c, gvq_coll_ctx_t *ctx, int *ok) {
    gvqComm_t comm = c->comm;
    size_t L = (size_t)c->cfg.L, T = (size_t)c->st.nsamples, G = c->ngroups;
    int n = comm->nranks;
    uint64_t t0 = gvq_now_ns();
    gvqResult_t res = gvqSuccess;
    float *full = NULL, *Zall = malloc(sizeof(float) * L * G), *kept = calloc(G, sizeof(float));
    int32_t agree[2] = {1, 0}; /* max d, refused */
    size_t mine = 0;
    for (size_t g = 0; g < G; g++) mine += (size_t)((c->tensor_index + (int)g) % n == comm->rank);
    full = malloc(sizeof(float) * L * L * GVQ_MAX(mine, (size_t)1));
    size_t *dg = calloc(G, sizeof(size_t));
    if (Zall == NULL || kept == NULL || full == NULL || dg == NULL) {
        res = gvqSystemError;
        goto out_free;
    }
    for (size_t g = 0, k = 0; g < G; g++) {
        if ((c->tensor_index + (int)g) % n != comm->rank) continue;
        double e = 0;
        size_t ng = T * group_samples(c, g), stride = (size_t)c->cfg.sample * (size_t)c->cfg.ss;
        gvqResult_t fr = gvq_pca_fit(comm->dev, L, ng, c->samples + g * stride * L, c->cfg.eps,
                                     (size_t)c->cfg.dmax, full + k * L * L, Zall + g * L, &dg[g], &e);
        if (fr == gvqInvalidArgument) {
            agree[1] = 1;
        } else if (fr != gvqSuccess) {
            res = fr;
            goto out_free;
        }
        kept[g] = (float)e;
        agree[0] = GVQ_MAX(agree[0], (int32_t)dg[g]);
        k++;
    }
    GVQCHECKGOTO(agree_i32(ctx, agree, 2, gvqMax), res, out_free);
    if (agree[1]) {
        *ok = 0;
        goto out_free;
    }
    size_t d = (size_t)agree[0];
    float *U = malloc(sizeof(float) * L * d * G), *Z = malloc(sizeof(float) * L * G);
    float *pack = malloc(sizeof(float) * (L * d + L + 1));
    if (U == NULL || Z == NULL || pack == NULL) {
        free(U), free(Z), free(pack);
        res = gvqSystemError;
        goto out_free;
    }
    double kept_sum = 0;
    for (size_t g = 0, k = 0; g < G; g++) {
        int owner = (c->tensor_index + (int)g) % n;
        if (owner == comm->rank) {
            memcpy(pack, full + k * L * L, sizeof(float) * L * d); /* first d of L columns */
            memcpy(pack + L * d, Zall + g * L, sizeof(float) * L);
            pack[L * d + L] = kept[g];
            k++;
        }
        res = gvq_chain_broadcast(ctx, pack, pack, sizeof(float) * (L * d + L + 1), owner);
        if (res != gvqSuccess) break;
        memcpy(U + g * L * d, pack, sizeof(float) * L * d);
        memcpy(Z + g * L, pack + L * d, sizeof(float) * L);
        kept_sum += pack[L * d + L];
    }
    free(pack);
    if (res != gvqSuccess) {
        free(U), free(Z);
        goto out_free;
    }
    free(c->U);
    free(c->Z);
    c->U = U;
    c->Z = Z;
    c->st.d = (int32_t)d;
    stats_of(c)->keptEnergy = kept_sum / (double)G;
    GVQCHECKGOTO(codec_setup(c), res, out_free);
    *ok = 1;
out_free:
    stats_of(c)->fitSeconds = (double)(gvq_now_ns() - t0) / 1e9;
    free(full);
    free(Zall);
    free(kept);
    free(dg);
    return res;
}

/* ---- one compressed allreduce ----------------------------------------------------------------- */

static void enter_phase(gvqCompressor_t c, int phase) {
    c->st.phase = phase;
    c->st.phase_iter = 0;
    if (phase == gvqPhaseSample) c->st.nsamples = 0;
}

/* Error feedback: the residual is what this rank's own contribution loses to compression,
 * x - x_hat with x_hat = U U^T (x - Z/N) + Z/N per full slice (the tail travels exactly). It is
 * computed before the ring from the local (collocated) input, and stored in the tensor's order.
 * Exact phases leave no residual. */
static gvqResult_t update_residual(gvqCompressor_t c, const float *xs, int compressed) {
    const comp_cfg_t *cfg = &c->cfg;
    memset(c->residual, 0, sizeof(float) * cfg->count);
    if (!compressed) return gvqSuccess;
    size_t L = (size_t)cfg->L, d = (size_t)c->st.d, K = (size_t)cfg->K, D = (size_t)cfg->D;
    size_t H = (size_t)cfg->H, W = (size_t)cfg->W;
    float n = (float)c->comm->nranks;
    float *coef = malloc(sizeof(float) * d), *v = malloc(sizeof(float) * L);
    gvqResult_t res = coef && v ? gvqSuccess : gvqSystemError;
    for (size_t j = 0; res == gvqSuccess && j < c->nfull; j++) {
        size_t g = j / (size_t)cfg->C;
        const float *U = c->U + g * L * d, *Z = c->Z + g * L;
        for (size_t i = 0; i < L; i++) v[i] = xs[j * L + i] - Z[i] / n;
        res = c->comm->dev->sgemm(1, 0, (int)d, 1, (int)L, 1.0f, U, (int)L, v, (int)L, 0.0f, coef, (int)d);
        if (res == gvqSuccess) /* v = (I - U U^T)(x - Z/N) = x - x_hat */
            res = c->comm->dev->sgemm(0, 0, (int)L, 1, (int)d, -1.0f, U, (int)L, coef, (int)d, 1.0f, v, (int)L);
        for (size_t i = 0; i < L; i++) {
            size_t e = j * L + i;
            if (c->collocate) { /* collocated index ((h*W + w)*D + d)*K + k -> [k][d][h][w] */
                size_t k = e % K, dd = (e / K) % D, w = (e / (K * D)) % W, h = e / (K * D * W);
                c->residual[((k * D + dd) * H + h) * W + w] = v[i];
            } else {
                c->residual[e] = v[i];
            }
        }
    }
    free(coef);
    free(v);
    return res;
}

/* This rank's loss ||x_n - x_hat_n|| / ||x_n|| over the sampled slices of the current call.
 * Both codecs' sums are zeroed at the start of a compressed call and only the one that runs
 * adds to them (the host codec's, or the device codec's on a device-resident call). */
static double local_loss(gvqCompressor_t c) {
    const gvq_gradiveq_t *g = &c->gq;
    const double *dn = c->gqd.norms;
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

/* One call. dev holds send and recv: the host device, or (run_device) a device with its own
 * codecs, whose copies of U, Z and the work vector are ready; its ring runs over the device
 * transport, or over the communicator's with the wire staged (gvq_codec_staged_init). */
static gvqResult_t run(gvqCompressor_t c, const gvq_device_ops_t *dev, const float *send,
                       float *recv, gvqRedOp_t op) {
    gvqComm_t comm = c->comm;
    int on_dev = dev != &gvq_host_device;
    const comp_cfg_t *cfg = &c->cfg;
    size_t M = cfg->count;
    int n = comm->nranks;
    gvqCompressorStats_t *s = stats_of(c);
    unsigned long long sent = 0;
    gvq_coll_ctx_t ctx = {comm->xport, comm->dev, comm->chunk_bytes, &comm->scratch,
                          &comm->scratch_bytes, &sent};
    const float *x = send;
    if (cfg->ef) { /* the gradient plus what earlier compression dropped */
        for (size_t i = 0; i < M; i++) c->efin[i] = send[i] + c->residual[i];
        x = c->efin;
    }
    const float *src = x;
    float *dst = recv;
    if (c->collocate && on_dev) {
        GVQCHECK(dev->collocate(x, c->dwork, (size_t)cfg->K, (size_t)cfg->D, (size_t)cfg->H,
                                (size_t)cfg->W, 0));
        src = dst = c->dwork;
    } else if (c->collocate) {
        gvq_collocate(x, c->work, (size_t)cfg->K, (size_t)cfg->D, (size_t)cfg->H, (size_t)cfg->W);
        src = dst = c->work;
    } else if (cfg->ef) {
        src = c->efin;
    }
    int phase = c->st.phase;
    gvq_codec_t codec, inner;
    int use_qsgd = cfg->codec == gvqCodecQsgd ||
                   (cfg->codec == gvqCodecGradiveq && phase != gvqPhaseCompressed &&
                    cfg->sample_codec == gvqCodecQsgd);
    if (phase == gvqPhaseCompressed || use_qsgd) ctx.chunk_bytes = c->codec_chunk_bytes;
    if (phase == gvqPhaseCompressed) {
        c->gq.local_x2 = c->gq.local_c2 = c->gq.local_all2 = 0;
        c->gqd.norms[0] = c->gqd.norms[1] = c->gqd.norms[2] = 0;
        if (on_dev) gvq_codec_gradiveq_dev_init(&inner, dev, &c->gqd);
        else gvq_codec_gradiveq_init(&codec, comm->dev, &c->gq);
    } else if (use_qsgd) {
        c->qs.call = (uint32_t)c->st.iter;
        if (on_dev) {
            c->qsd = (gvq_dev_qsgd_t){c->qs.bits, c->qs.levels, c->qs.norm, c->qs.bucket,
                                      c->qs.seed, c->qs.rank,   c->qs.call};
            gvq_codec_qsgd_dev_init(&inner, dev, &c->qsd);
        } else {
            gvq_codec_qsgd_init(&codec, comm->dev, &c->qs);
        }
    } else {
        gvq_codec_identity_init(on_dev ? &inner : &codec, on_dev ? dev : comm->dev, gvqFloat32,
                                gvqSum);
    }
    /* device rings run over the device transport (NCCL) when there is one, their wire in device
     * memory; otherwise the wire is staged through host memory over the communicator's own */
    gvq_coll_ctx_t rctx = ctx;
    gvq_transport_t *dxp = on_dev ? gvq_comm_device_transport(comm, dev) : NULL;
    if (dxp != NULL) {
        rctx = (gvq_coll_ctx_t){dxp, dev, ctx.chunk_bytes, &comm->dscratch, &comm->dscratch_bytes,
                                &sent};
        codec = inner;
    } else if (on_dev) {
        gvq_codec_staged_init(&codec, &inner, &c->stg);
        rctx.dev = gvq_comm_pinned_host(comm, dev); /* wire slots in pinned memory */
        rctx.scratch = &comm->pscratch;
        rctx.scratch_bytes = &comm->pscratch_bytes;
    }
    if (cfg->ef) GVQCHECK(update_residual(c, src, phase == gvqPhaseCompressed));
    /* the early-exit vote rides inside the compressed ring's allgather when it can */
    int voting = phase == gvqPhaseCompressed && cfg->vote < 1.0f;
    gvq_tally_t tally = {local_vote, c, 0, 0};
    GVQCHECK(gvq_ring_allreduce_tally(&rctx, &codec, src, dst, M, gvqSum, voting ? &tally : NULL));

    /* phase bookkeeping on values identical on all ranks */
    s->wireBytes += sent;
    s->rawBytes += (unsigned long long)(n > 1 ? 2 * (size_t)(n - 1) * M * 4 / (size_t)n : 0);
    if (phase == gvqPhaseSample) {
        size_t L = (size_t)cfg->L, T = (size_t)cfg->sample, S = (size_t)cfg->ss;
        size_t C = (size_t)cfg->C, t = (size_t)c->st.nsamples;
        for (size_t g = 0; g < c->ngroups; g++) { /* ns slices spread evenly over the group */
            size_t cg = GVQ_MIN(C, c->nfull - g * C), ns = group_samples(c, g);
            for (size_t j = 0; j < ns; j++) /* a plain copy on the host device */
                GVQCHECK(dev->copy_to_host(c->samples + (g * T * S + t * ns + j) * L,
                                           dst + (g * C + j * cg / ns) * L, sizeof(float) * L));
        }
        c->st.nsamples++;
    }
    if (phase == gvqPhaseCompressed) {
        s->lastLoss = local_loss(c);
        int32_t vote = 0;
        if (voting) {
            vote = tally.sum;
            if (!tally.carried) GVQCHECK(agree_i32(&ctx, &vote, 1, gvqSum));
        }
        c->st.phase_iter++;
        if (2 * vote > n) {
            s->earlyExits++;
            set_reason(c, "majority of ranks above the loss threshold: resampling");
            enter_phase(c, gvqPhaseSample);
        } else if (c->st.phase_iter >= cfg->compressed) {
            set_reason(c, "compressed phase over: resampling");
            enter_phase(c, gvqPhaseSample);
        }
    } else if (phase == gvqPhaseWarmup) {
        if (++c->st.phase_iter >= cfg->warmup) enter_phase(c, gvqPhaseSample);
    } else if (phase == gvqPhaseSample) {
        c->st.phase_iter++;
        if (c->st.nsamples >= cfg->sample) {
            int ok = 0;
            GVQCHECK(fit(c, &ctx, &ok));
            if (ok) {
                s->fits++;
                s->reason[0] = '\0';
                enter_phase(c, gvqPhaseCompressed);
            } else {
                s->fitsRefused++;
                set_reason(c, "fit refused: the samples hold NaN or Inf; sampling again");
                GVQ_WARN("compressor of tensor %d: fit refused (non-finite gradient samples); "
                         "staying uncompressed and sampling again", c->tensor_index);
                enter_phase(c, gvqPhaseSample);
            }
        }
    } else {
        c->st.phase_iter++;
        if (cfg->codec == gvqCodecQsgd) s->ratio = (double)(M * 4) / (double)codec.wire_bytes(&codec, 0, M);
    }
    c->st.iter++;

    if (op == gvqAvg) GVQCHECK(dev->divide(dst, M, gvqFloat32, n));
    if (c->collocate && on_dev)
        GVQCHECK(dev->collocate(c->dwork, recv, (size_t)cfg->K, (size_t)cfg->D, (size_t)cfg->H,
                                (size_t)cfg->W, 1));
    else if (c->collocate)
        gvq_uncollocate(c->work, recv, (size_t)cfg->K, (size_t)cfg->D, (size_t)cfg->H, (size_t)cfg->W);
    return gvqSuccess;
}

/* Dispatch for a comm the caller has entered. */
static gvqResult_t compressed_entered(gvqCompressor_t c, const void *send, void *recv,
                                      gvqRedOp_t op) {
    return run(c, &gvq_host_device, send, recv, op);
}

/* ---- device buffers --------------------------------------------------------------------------
 * Buffers in a device's memory (CUDA) run device-resident: collocation, the codecs, the divide
 * and the inverse collocation run on the device, on the caller's stream; the ring runs over the
 * device transport (NCCL), or keeps its wire in pinned host memory for the communicator's own
 * transport, so only the wire crosses the bus. What
 * stays on the host: the PCA fit (the samples, ss slices per reuse group per sampling call, are
 * copied out), the phase bookkeeping, and error feedback (a compressor with errorFeedback stages
 * the whole buffers and runs on the host, as does GVQ_DEVICE_CODECS=0). */

/* The device copies this call needs: the collocated work vector, and in the compressed phase
 * U, Z and U^T Z of the current fit. */
static gvqResult_t device_ready(gvqCompressor_t c, const gvq_device_ops_t *dev) {
    if (c->ddev != dev) {
        device_free(c);
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
    if (c->dUZ == NULL && (c->dUZ = dev->alloc(sizeof(float) * G * L)) == NULL) goto oom; /* d <= L */
    GVQCHECK(dev->copy_from_host(c->dU, c->U, sizeof(float) * G * L * d));
    GVQCHECK(dev->copy_from_host(c->dZ, c->Z, sizeof(float) * G * L));
    GVQCHECK(dev->copy_from_host(c->dUZ, c->gq.UZ, sizeof(float) * G * d));
    c->gqd.p = (gvq_dev_gq_t){L, d, (size_t)c->cfg.C, c->comm->nranks, c->cfg.fp16,
                              c->dU, c->dZ, c->dUZ};
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

/* Device buffers the device-resident path does not take (error feedback, mixed buffers,
 * GVQ_DEVICE_CODECS=0): staged whole through pinned host memory (gvq_device_staged), the host
 * codecs run. Correct, not fast. */
typedef struct {
    gvqCompressor_t c;
    gvqRedOp_t op;
} staged_call_t;

static gvqResult_t compressed_on_host(void *arg, const void *send, void *recv) {
    const staged_call_t *s = arg;
    return compressed_entered(s->c, send, recv, s->op);
}

GVQ_API gvqResult_t gvqAllReduceCompressed(const void *sendbuff, void *recvbuff, size_t count,
                                           gvqDataType_t datatype, gvqRedOp_t op,
                                           gvqCompressor_t compressor, gvqComm_t comm,
                                           gvqStream_t stream) {
    const char *fn = "gvqAllReduceCompressed";
    if (!is_live(compressor)) {
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
    if (sendbuff != recvbuff && (const char *)sendbuff < (const char *)recvbuff + count * 4 &&
        (const char *)recvbuff < (const char *)sendbuff + count * 4) {
        GVQ_WARN("%s: recvbuff overlaps sendbuff but is not in place", fn);
        return gvqInvalidArgument;
    }
    if (gvq_group_active()) {
        GVQ_WARN("%s: not allowed inside gvqGroupStart/gvqGroupEnd", fn);
        return gvqInvalidUsage;
    }
    GVQCHECK(gvq_comm_enter(comm, fn));
    const gvq_device_ops_t *sdev = gvq_device_of(sendbuff), *rdev = gvq_device_of(recvbuff);
    const gvq_device_ops_t *dev = sdev != &gvq_host_device ? sdev : rdev;
    staged_call_t sc = {compressor, op};
    size_t bytes = count * sizeof(float);
    gvqResult_t res;
    if (dev == &gvq_host_device)
        res = compressed_entered(compressor, sendbuff, recvbuff, op);
    else if (sdev == rdev && gvq_device_has_codecs(dev) && !compressor->cfg.ef &&
             gvq_param(GVQ_PARAM_DEVICE_CODECS))
        res = run_device(compressor, dev, sendbuff, recvbuff, op, stream);
    else
        res = gvq_device_staged(dev, stream, fn, &comm->pinned, sendbuff, bytes, recvbuff, bytes,
                                compressed_on_host, &sc);
    gvq_comm_leave(comm);
    return res;
}

/* ---- checkpoints ---------------------------------------------------------------------------- */

typedef struct {
    uint64_t magic;
    uint64_t bytes;
    comp_cfg_t cfg;
    comp_state_t st;
    uint64_t ngroups;
} save_hdr_t;

static size_t save_size(gvqCompressor_t c) {
    size_t L = (size_t)c->cfg.L, G = c->ngroups;
    size_t n = sizeof(save_hdr_t);
    if (c->samples) n += sizeof(float) * G * (size_t)c->cfg.sample * (size_t)c->cfg.ss * L;
    n += sizeof(float) * (G * L * (size_t)c->st.d + G * L) * (c->st.d > 0);
    if (c->cfg.ef) n += sizeof(float) * c->cfg.count;
    return n;
}

GVQ_API gvqResult_t gvqCompressorSave(gvqCompressor_t c, void *buf, size_t *size) {
    if (!is_live(c) || size == NULL) {
        GVQ_WARN("gvqCompressorSave: %s", size == NULL ? "size is NULL" : "not a live compressor");
        return gvqInvalidArgument;
    }
    size_t need = save_size(c);
    if (buf == NULL) {
        *size = need;
        return gvqSuccess;
    }
    if (*size < need) {
        GVQ_WARN("gvqCompressorSave: buffer of %zu bytes, %zu needed", *size, need);
        *size = need;
        return gvqInvalidArgument;
    }
    save_hdr_t h;
    memset(&h, 0, sizeof h);
    h.magic = SAVE_MAGIC;
    h.bytes = need;
    h.cfg = c->cfg;
    h.st = c->st;
    h.ngroups = c->ngroups;
    char *p = buf;
    memcpy(p, &h, sizeof h);
    p += sizeof h;
    size_t L = (size_t)c->cfg.L, G = c->ngroups;
    if (c->samples) {
        size_t b = sizeof(float) * G * (size_t)c->cfg.sample * (size_t)c->cfg.ss * L;
        memcpy(p, c->samples, b);
        p += b;
    }
    if (c->st.d > 0) {
        memcpy(p, c->U, sizeof(float) * G * L * (size_t)c->st.d);
        p += sizeof(float) * G * L * (size_t)c->st.d;
        memcpy(p, c->Z, sizeof(float) * G * L);
        p += sizeof(float) * G * L;
    }
    if (c->cfg.ef) memcpy(p, c->residual, sizeof(float) * c->cfg.count);
    *size = need;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqCompressorLoad(gvqCompressor_t c, const void *buf, size_t size) {
    if (!is_live(c) || buf == NULL) {
        GVQ_WARN("gvqCompressorLoad: %s", buf == NULL ? "buf is NULL" : "not a live compressor");
        return gvqInvalidArgument;
    }
    save_hdr_t h;
    if (size < sizeof h) {
        GVQ_WARN("gvqCompressorLoad: %zu bytes is too short for a saved compressor", size);
        return gvqInvalidArgument;
    }
    memcpy(&h, buf, sizeof h);
    if (h.magic != SAVE_MAGIC || h.bytes != size) {
        GVQ_WARN("gvqCompressorLoad: not a saved compressor state (magic or size %zu wrong)", size);
        return gvqInvalidArgument;
    }
    if (memcmp(&h.cfg, &c->cfg, sizeof h.cfg) != 0 || h.ngroups != c->ngroups) {
        GVQ_WARN("gvqCompressorLoad: the state was saved from a compressor of another count or "
                 "config");
        return gvqInvalidArgument;
    }
    size_t L = (size_t)c->cfg.L, G = c->ngroups, d = (size_t)h.st.d;
    const char *p = (const char *)buf + sizeof h;
    if (c->samples) {
        size_t b = sizeof(float) * G * (size_t)c->cfg.sample * (size_t)c->cfg.ss * L;
        memcpy(c->samples, p, b);
        p += b;
    }
    if (d > 0) {
        float *U = malloc(sizeof(float) * G * L * d), *Z = malloc(sizeof(float) * G * L);
        if (U == NULL || Z == NULL) {
            free(U), free(Z);
            return gvqSystemError;
        }
        memcpy(U, p, sizeof(float) * G * L * d);
        p += sizeof(float) * G * L * d;
        memcpy(Z, p, sizeof(float) * G * L);
        p += sizeof(float) * G * L;
        free(c->U), free(c->Z);
        c->U = U, c->Z = Z;
    }
    if (c->cfg.ef) memcpy(c->residual, p, sizeof(float) * c->cfg.count);
    c->st = h.st;
    if (d > 0) GVQCHECK(codec_setup(c));
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqCompressorSaveFile(gvqCompressor_t c, const char *path) {
    size_t n = 0;
    if (path == NULL) {
        GVQ_WARN("gvqCompressorSaveFile: path is NULL");
        return gvqInvalidArgument;
    }
    GVQCHECK(gvqCompressorSave(c, NULL, &n));
    void *buf = malloc(n);
    if (buf == NULL) return gvqSystemError;
    gvqResult_t res = gvqCompressorSave(c, buf, &n);
    FILE *f = res == gvqSuccess ? fopen(path, "wb") : NULL;
    if (res == gvqSuccess && (f == NULL || fwrite(buf, 1, n, f) != n)) {
        GVQ_WARN("gvqCompressorSaveFile: cannot write '%s'", path);
        res = gvqSystemError;
    }
    if (f != NULL && fclose(f) != 0 && res == gvqSuccess) res = gvqSystemError;
    free(buf);
    return res;
}

GVQ_API gvqResult_t gvqCompressorLoadFile(gvqCompressor_t c, const char *path) {
    if (path == NULL) {
        GVQ_WARN("gvqCompressorLoadFile: path is NULL");
        return gvqInvalidArgument;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        GVQ_WARN("gvqCompressorLoadFile: cannot open '%s'", path);
        return gvqSystemError;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = n > 0 ? malloc((size_t)n) : NULL;
    gvqResult_t res = gvqSuccess;
    if (buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        GVQ_WARN("gvqCompressorLoadFile: cannot read '%s'", path);
        res = gvqSystemError;
    }
    fclose(f);
    if (res == gvqSuccess) res = gvqCompressorLoad(c, buf, (size_t)n);
    free(buf);
    return res;
}

/* ---- zero-code mode ------------------------------------------------------------------------- */

struct gvq_auto {
    struct gvq_auto *next;
    const void *buf;
    size_t count;
    gvqCompressor_t comp;
};

/* A number from the environment, or `def` (with a WARN) when it is not one. */
static double env_number(const char *name, double def) {
    const char *e = getenv(name);
    if (e == NULL || e[0] == '\0') return def;
    char *end;
    double v = strtod(e, &end);
    if (end == e || *end != '\0' || !isfinite(v)) {
        GVQ_WARN("%s='%s' is not a number; using the default", name, e);
        return def;
    }
    return v;
}

gvqResult_t gvq_auto_allreduce(gvqComm_t comm, const void *send, void *recv, size_t count,
                               gvqDataType_t dtype, gvqRedOp_t op, int *handled) {
    static int mode = -1; /* -1 unread, 0 off, else the codec */
    static float eps, vote;
    static int slices;
    *handled = 0;
    if (mode < 0) {
        /* GradiVeQ knobs of zero-code mode; out-of-range values are refused by
         * gvqCompressorCreate, which names the field */
        eps = (float)env_number("GVQ_GRADIVEQ_EPS", -1.0);
        vote = (float)env_number("GVQ_GRADIVEQ_VOTE", -1.0);
        double ss = env_number("GVQ_GRADIVEQ_SAMPLE_SLICES", GVQ_CONFIG_UNDEF_INT);
        slices = GVQ_CONFIG_UNDEF_INT;
        if (ss != (double)GVQ_CONFIG_UNDEF_INT) {
            if (ss == floor(ss) && fabs(ss) < 1e9) slices = (int)ss;
            else GVQ_WARN("GVQ_GRADIVEQ_SAMPLE_SLICES=%g is not an integer; using the default", ss);
        }
        const char *e = getenv("GVQ_CODEC");
        int m = 0;
        if (e != NULL && e[0] != '\0') {
            if (strcmp(e, "gradiveq") == 0) m = gvqCodecGradiveq;
            else if (strcmp(e, "qsgd") == 0) m = gvqCodecQsgd;
            else if (strcmp(e, "none") != 0)
                GVQ_WARN("GVQ_CODEC='%s' is not gradiveq, qsgd or none; not compressing", e);
        }
        __atomic_store_n(&mode, m, __ATOMIC_RELEASE);
    }
    if (mode == 0 || dtype != gvqFloat32 || (op != gvqSum && op != gvqAvg) || count == 0)
        return gvqSuccess;
    struct gvq_auto *a = comm->autos;
    while (a != NULL && !(a->buf == recv && a->count == count)) a = a->next;
    if (a == NULL) {
        a = calloc(1, sizeof *a);
        if (a == NULL) return gvqSystemError;
        gvqCompressorConfig_t cfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
        cfg.codec = mode;
        cfg.lossThreshold = eps;
        cfg.voteThreshold = vote;
        cfg.sampleSlices = slices;
        gvqResult_t res = gvqCompressorCreate(comm, count, &cfg, &a->comp);
        if (res != gvqSuccess) {
            free(a);
            return res;
        }
        a->buf = recv;
        a->count = count;
        a->next = comm->autos;
        comm->autos = a;
        GVQ_INFO("GVQ_CODEC: attached a compressor to buffer %p count %zu", recv, count);
    }
    *handled = 1;
    return compressed_entered(a->comp, send, recv, op);
}

void gvq_auto_free(gvqComm_t comm) {
    struct gvq_auto *a = comm->autos;
    while (a != NULL) {
        struct gvq_auto *next = a->next;
        gvqCompressorDestroy(a->comp);
        free(a);
        a = next;
    }
    comm->autos = NULL;
}
