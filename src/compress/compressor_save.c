/*
 * compressor_save.c -- a compressor's saved state, for checkpoints:
 *
 *   [ header: magic, bytes, resolved config, schedule state, groups, checksum ]
 *   [ samples (GradiVeQ: groups x T x sampleSlices x L floats)     ]
 *   [ U (groups x L x d), Z (groups x L)          when d > 0       ]
 *   [ residual (count floats)                     with error feedback ]
 *   [ Q (columns x powerRank floats)              PowerSGD: the warm start ]
 *   [ U (L x d floats)                            GradiVeQ with a tracked basis ]
 *
 * The checksum is the CRC-32C of the whole state (gvq_blob_seal). A saved state is outside
 * input: a load trusts none of it. In order, it checks
 *   the frame      magic, the size against the header's, the checksum;
 *   the config     equal to the compressor's (and so every length derived from it);
 *   the schedule   phase, d, counters and stats in the ranges the phase machine can reach
 *                  (check_schedule: each refusal names its field);
 *   the size       against the layout the checked d implies;
 *   the payload    U, Z, the residual and Q finite (what the compressor never keeps otherwise);
 * and only then changes the compressor, all at once. Any failure: gvqInvalidArgument, a WARN
 * naming the field, the compressor as it was.
 */
#include <math.h>
#include <stdlib.h>

#include "gvq_stream.h"
#include "gvq_method.h"

#define SAVE_MAGIC 0x35524d4351564721ull /* "!GVQCMR5" */

typedef struct {
    uint64_t magic;
    uint64_t bytes;
    gvq_comp_cfg_t cfg;
    gvq_comp_state_t st;
    uint64_t ngroups;
    uint64_t checksum; /* gvq_blob_seal's */
} save_hdr_t;

#define CHECKSUM_AT offsetof(save_hdr_t, checksum)

static size_t samples_bytes(gvqCompressor_t c) {
    return c->samples == NULL ? 0
                              : sizeof(float) * c->ngroups * (size_t)c->cfg.sample *
                                    (size_t)c->cfg.sample_slices * (size_t)c->cfg.L;
}

static size_t basis_bytes(gvqCompressor_t c, size_t d) {
    size_t L = (size_t)c->cfg.L, G = c->ngroups;
    return d > 0 ? sizeof(float) * (G * L * d + G * L) : 0;
}

static size_t residual_bytes(gvqCompressor_t c) {
    return c->cfg.error_feedback ? sizeof(float) * c->cfg.count : 0;
}

/* What the method keeps between calls (PowerSGD's Q, m x r; a tracked GradiVeQ basis U, L x d),
 * and its bytes. */
static float *kept_floats(gvqCompressor_t c, size_t *bytes) {
    size_t n = 0;
    float *k = c->method->kept != NULL ? c->method->kept(c, &n) : NULL;
    *bytes = k != NULL ? sizeof(float) * n : 0;
    return k;
}

static size_t kept_bytes(gvqCompressor_t c) {
    size_t b;
    (void)kept_floats(c, &b);
    return b;
}

/* The size of a state of c's config with d columns per basis (d <= L: no overflow, since the
 * compressor holds buffers of these sizes). */
static size_t save_size(gvqCompressor_t c, size_t d) {
    return sizeof(save_hdr_t) + samples_bytes(c) + basis_bytes(c, d) + residual_bytes(c) +
           kept_bytes(c);
}

GVQ_API gvqResult_t gvqCompressorSave(gvqCompressor_t c, void *buf, size_t *size) {
    if (!gvq_compressor_live(c) || size == NULL) {
        GVQ_WARN("gvqCompressorSave: %s", size == NULL ? "size is NULL" : "not a live compressor");
        return gvqInvalidArgument;
    }
    gvq_stream_comm_settle(c->comm); /* calls queued on host streams change the state */
    size_t need = save_size(c, (size_t)c->st.d);
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
    if (c->samples != NULL) memcpy(p, c->samples, samples_bytes(c));
    p += samples_bytes(c);
    if (c->st.d > 0) {
        size_t ub = sizeof(float) * c->ngroups * (size_t)c->cfg.L * (size_t)c->st.d;
        memcpy(p, c->U, ub);
        memcpy(p + ub, c->Z, basis_bytes(c, (size_t)c->st.d) - ub);
        p += basis_bytes(c, (size_t)c->st.d);
    }
    if (c->cfg.error_feedback) {
        memcpy(p, c->residual, residual_bytes(c));
        p += residual_bytes(c);
    }
    size_t kb;
    const float *kept = kept_floats(c, &kb);
    if (kb > 0) memcpy(p, kept, kb);
    gvq_blob_seal(buf, need, CHECKSUM_AT);
    *size = need;
    return gvqSuccess;
}

/* ---- load: the checks ------------------------------------------------------------------------ */

#define REFUSE(...)                                  \
    do {                                             \
        GVQ_WARN("gvqCompressorLoad: " __VA_ARGS__); \
        return gvqInvalidArgument;                   \
    } while (0)

/* The frame: long enough, the magic, the size the header states, the checksum. */
static gvqResult_t check_frame(const void *buf, size_t size, save_hdr_t *h) {
    if (size < sizeof *h)
        REFUSE("%zu bytes is too short for a saved compressor (header: %zu)", size, sizeof *h);
    memcpy(h, buf, sizeof *h);
    if (h->magic != SAVE_MAGIC)
        REFUSE("magic 0x%016llx is not a saved compressor state of this version (0x%016llx)",
               (unsigned long long)h->magic, (unsigned long long)SAVE_MAGIC);
    if (h->bytes != size)
        REFUSE("the header's size %llu is not the %zu bytes given (truncated or extended)",
               (unsigned long long)h->bytes, size);
    return gvq_blob_verify("gvqCompressorLoad", buf, size, CHECKSUM_AT);
}

/* The saved config is the compressor's, field for field (the lengths all derive from it), but
 * for the seed: it draws the random bits of calls still to come and is nothing the state holds
 * (states saved before the training layer gave each variable its own seed load as before). */
static gvqResult_t check_config(gvqCompressor_t c, const save_hdr_t *h) {
    gvq_comp_cfg_t saved = h->cfg;
    saved.seed = c->cfg.seed;
    if (memcmp(&saved, &c->cfg, sizeof saved) != 0)
        REFUSE("the state was saved from a compressor of another config (count %llu, codec %d, "
               "L %d; this one: count %llu, codec %d, L %d)",
               (unsigned long long)h->cfg.count, h->cfg.codec, h->cfg.L,
               (unsigned long long)c->cfg.count, c->cfg.codec, c->cfg.L);
    if (h->ngroups != c->ngroups)
        REFUSE("ngroups %llu, this compressor has %zu", (unsigned long long)h->ngroups, c->ngroups);
    return gvqSuccess;
}

/* The stats the schedule keeps: counters not negative, the constant fields the compressor's, the
 * reason a string. (ratio, lastLoss, keptEnergy, fitSeconds are reports only: never negative.) */
static gvqResult_t check_stats(gvqCompressor_t c, const gvqCompressorStats_t *s) {
    const gvqCompressorStats_t *mine = &c->st.stats;
    if (s->codec != mine->codec || s->sliceSize != mine->sliceSize || s->groups != mine->groups)
        REFUSE("stats.codec %d / sliceSize %d / groups %d are not this compressor's (%d, %d, %d)",
               s->codec, s->sliceSize, s->groups, mine->codec, mine->sliceSize, mine->groups);
    if (s->fits < 0 || s->fitsRefused < 0 || s->earlyExits < 0 || s->nonFiniteCalls < 0)
        REFUSE("stats.fits %lld / fitsRefused %lld / earlyExits %lld / nonFiniteCalls %lld: "
               "negative",
               s->fits, s->fitsRefused, s->earlyExits, s->nonFiniteCalls);
    if (s->ratio < 0 || s->lastLoss < 0 || s->keptEnergy < 0 || s->fitSeconds < 0)
        REFUSE("stats.ratio / lastLoss / keptEnergy / fitSeconds: negative");
    if (memchr(s->reason, '\0', sizeof s->reason) == NULL)
        REFUSE("stats.reason is not a string (no NUL in its %zu bytes)", sizeof s->reason);
    return gvqSuccess;
}

/* The schedule (compressor.c's phase machine) in a state it can reach:
 *   GradiVeQ with a full slice: warm-up (phaseIter < W), sample (nsamples < T), or compressed
 *   (phaseIter < S, d > 0); anything else: plain, d = 0.
 *   0 <= d <= maxDims (<= L); 0 <= nsamples <= T; 0 <= phaseIter <= iteration. */
static gvqResult_t check_schedule(gvqCompressor_t c, const gvq_comp_state_t *st) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    int scheduled = c->samples != NULL; /* GradiVeQ with at least one full slice */
    if (st->iter < 0 || st->phase_iter < 0 || st->phase_iter > st->iter)
        REFUSE("iteration %lld / phaseIter %lld: not 0 <= phaseIter <= iteration",
               (long long)st->iter, (long long)st->phase_iter);
    if (st->d < 0 || st->d > (scheduled ? cfg->dmax : 0))
        REFUSE("d %d outside [0, %d] (%s)", st->d, scheduled ? cfg->dmax : 0,
               scheduled ? "maxDims" : "no GradiVeQ schedule");
    if (st->nsamples < 0 || st->nsamples > (scheduled ? cfg->sample : 0))
        REFUSE("nsamples %lld outside [0, %d]", (long long)st->nsamples,
               scheduled ? cfg->sample : 0);
    switch (st->phase) {
    case gvqPhasePlain:
        if (scheduled) REFUSE("phase plain for a GradiVeQ compressor with a schedule");
        break;
    case gvqPhaseWarmup:
        if (!scheduled || st->phase_iter >= cfg->warmup)
            REFUSE("phase warm-up with phaseIter %lld (warmupIters %d%s)",
                   (long long)st->phase_iter, cfg->warmup, scheduled ? "" : ", no schedule");
        break;
    case gvqPhaseSample:
        if (!scheduled || st->nsamples >= cfg->sample)
            REFUSE("phase sample with nsamples %lld (sampleIters %d%s)", (long long)st->nsamples,
                   cfg->sample, scheduled ? "" : ", no schedule");
        break;
    case gvqPhaseCompressed:
        if (!scheduled || st->d == 0 || st->phase_iter >= cfg->compressed)
            REFUSE("phase compressed with d %d, phaseIter %lld (compressedIters %d%s)", st->d,
                   (long long)st->phase_iter, cfg->compressed, scheduled ? "" : ", no schedule");
        break;
    default:
        REFUSE("phase %d is not a phase", st->phase);
    }
    return check_stats(c, &st->stats);
}

/* n floats at p (unaligned) are finite; else a WARN naming what. */
static gvqResult_t check_finite(const char *p, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, p + i * sizeof v, sizeof v);
        if (!isfinite(v)) REFUSE("%s[%zu] is %g: a saved %s is always finite", what, i, v, what);
    }
    return gvqSuccess;
}

/* The sections of a checked state, in file order. */
typedef struct {
    const char *samples, *U, *Z, *residual, *Q;
} sections_t;

static sections_t sections_of(gvqCompressor_t c, const char *buf, size_t d) {
    sections_t s;
    s.samples = buf + sizeof(save_hdr_t);
    s.U = s.samples + samples_bytes(c);
    s.Z = s.U + sizeof(float) * c->ngroups * (size_t)c->cfg.L * d;
    s.residual = s.U + basis_bytes(c, d);
    s.Q = s.residual + residual_bytes(c);
    return s;
}

/* ---- load: the change, all at once ------------------------------------------------------------
 */

/* U and Z from the state (d > 0), or none (d == 0: the compressor has no basis). */
static gvqResult_t take_basis(gvqCompressor_t c, const sections_t *s, size_t d) {
    float *U = NULL, *Z = NULL;
    if (d > 0) {
        size_t ub = sizeof(float) * c->ngroups * (size_t)c->cfg.L * d;
        size_t zb = sizeof(float) * c->ngroups * (size_t)c->cfg.L;
        U = malloc(ub), Z = malloc(zb);
        if (U == NULL || Z == NULL) {
            free(U), free(Z);
            GVQ_WARN("gvqCompressorLoad: cannot allocate %zu bytes for the basis", ub + zb);
            return gvqSystemError;
        }
        memcpy(U, s->U, ub);
        memcpy(Z, s->Z, zb);
    }
    free(c->U), free(c->Z);
    c->U = U, c->Z = Z;
    return gvqSuccess;
}

/* own: the state is this rank's (its residual taken); else another rank's, whose residual is
 * not this rank's to carry (gvqCompressorLoadShared: the residual set to zero). */
static gvqResult_t load_state(gvqCompressor_t c, const void *buf, size_t size, int own) {
    if (!gvq_compressor_live(c) || buf == NULL) {
        GVQ_WARN("gvqCompressorLoad%s: %s", own ? "" : "Shared",
                 buf == NULL ? "buf is NULL" : "not a live compressor");
        return gvqInvalidArgument;
    }
    gvq_stream_comm_settle(c->comm);
    save_hdr_t h;
    GVQCHECK(check_frame(buf, size, &h));
    GVQCHECK(check_config(c, &h));
    GVQCHECK(check_schedule(c, &h.st));
    size_t d = (size_t)h.st.d, L = (size_t)c->cfg.L, G = c->ngroups;
    if (save_size(c, d) != size)
        REFUSE("%zu bytes, but a state of this config with d %zu has %zu", size, d,
               save_size(c, d));
    sections_t s = sections_of(c, buf, d);
    GVQCHECK(check_finite(s.U, G * L * d, "U"));
    GVQCHECK(check_finite(s.Z, d > 0 ? G * L : 0, "Z"));
    GVQCHECK(check_finite(s.residual, residual_bytes(c) / sizeof(float), "residual"));
    GVQCHECK(check_finite(s.Q, kept_bytes(c) / sizeof(float), "Q"));
    GVQCHECK(take_basis(c, &s, d));
    if (c->samples != NULL) memcpy(c->samples, s.samples, samples_bytes(c));
    if (c->cfg.error_feedback && own) memcpy(c->residual, s.residual, residual_bytes(c));
    if (c->cfg.error_feedback && !own) memset(c->residual, 0, residual_bytes(c));
    size_t kb;
    float *kept = kept_floats(c, &kb);
    if (kb > 0) memcpy(kept, s.Q, kb);
    c->st = h.st;
    if (d > 0) return gvq_compressor_codec_setup(c);
    gvq_gradiveq_fini(&c->gq); /* no basis: no codec state either */
    memset(&c->gq, 0, sizeof c->gq);
    c->fit_version++;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqCompressorLoad(gvqCompressor_t c, const void *buf, size_t size) {
    return load_state(c, buf, size, 1);
}

GVQ_API gvqResult_t gvqCompressorLoadShared(gvqCompressor_t c, const void *buf, size_t size) {
    return load_state(c, buf, size, 0);
}

static gvqResult_t save_adapter(void *obj, void *buf, size_t *size) {
    return gvqCompressorSave(obj, buf, size);
}

static gvqResult_t load_adapter(void *obj, const void *buf, size_t size) {
    return gvqCompressorLoad(obj, buf, size);
}

GVQ_API gvqResult_t gvqCompressorSaveFile(gvqCompressor_t c, const char *path) {
    return gvq_blob_save_file("gvqCompressorSaveFile", path, save_adapter, c);
}

GVQ_API gvqResult_t gvqCompressorLoadFile(gvqCompressor_t c, const char *path) {
    return gvq_blob_load_file("gvqCompressorLoadFile", path, load_adapter, c);
}
