/*
 * zero_code.c -- zero-code mode (gvq_zero_code.h, docs/ZERO_CODE.md): with GVQ_CODEC set, a
 * plain gvqAllReduce of floats (sum or avg) runs through compressors made on the first such call
 * for its (recvbuff, count) and kept on the communicator as an attachment, destroyed with it.
 *
 *   gvqAllReduce(send, recv, count, float, sum|avg)
 *     -> (recv, count) known? -- no --> its parts: the whole buffer, or, when the layout's count
 *        is `count`, one part per layer and per gap:
 *
 *          recv  [ conv 0 ][gap][ fc 1 ................ ][other 2][ conv 3 (small) ]
 *                    |             |                        \________|______/ + gap
 *                 GradiVeQ      PowerSGD r            one plain allreduce of them together
 *               (conv shape)   (out x in)             (gathered into scratch when scattered)
 *
 *        a compressor per compressed part (GVQ_CODEC, GVQ_CODEC_CONV/_FC, GVQ_POWER_RANK,
 *        GVQ_GRADIVEQ_*), then every rank checks that the others made the same plan
 *     -> the plain allreduce of the plain parts, then each compressed part's compressed call
 *     -> every GVQ_STATS_EVERY calls rank 0 logs the statistics at INFO
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "gvq_compressor.h"
#include "gvq_group.h"
#include "gvq_zero_code.h"

static const char *const fn_call = "gvqAllReduce (zero-code, GVQ_CODEC)";

/* Zero-code GradiVeQ keeps this many slices of each reuse group per sampling call (spread over
 * it) unless GVQ_GRADIVEQ_SAMPLE_SLICES says otherwise: 100 calls x 64 = 6400 samples for a
 * 256 x 256 covariance, a few MB and tens of ms per fit whatever the buffer's size. */
#define ZC_SAMPLE_SLICES 64

#define PART_WHOLE (-1) /* the part is the whole buffer (no layout) */
#define PART_GAP (-2)   /* the part is a gap between layers */

typedef struct {
    size_t offset, count;
    int layer;            /* index in the layout, PART_WHOLE or PART_GAP */
    int codec;            /* gvqCodec_t; gvqCodecNone: summed by the plain allreduce */
    gvqCompressor_t comp; /* NULL when plain */
} zc_part_t;

typedef struct {
    size_t offset, count;
} zc_range_t;

typedef struct zc_entry {
    struct zc_entry *next;
    const void *buf;
    size_t count;
    int split; /* 1: parts follow the communicator's layout */
    int nparts;
    zc_part_t *parts; /* in offset order */
    int nranges;
    zc_range_t *plain;  /* the plain parts, adjacent ones merged, in offset order */
    size_t plain_count; /* their elements */
    float *gather;      /* plain_count floats when nranges > 1 */
    long long calls;
    unsigned long long plain_wire, plain_raw; /* the plain allreduce's bytes, all calls */
} zc_entry_t;

/* The attachment: the list of buffers, the layout set by a call and the call counter. */
typedef struct {
    zc_entry_t *first;
    int have_layout; /* 1: `layout` replaces GVQ_LAYOUT on this communicator */
    gvq_layout_t layout;
    long long calls;
} zc_state_t;

static const char attachment_key = 0; /* its address names the attachment */

/* ---- GVQ_LAYOUT, parsed once per process --------------------------------------------------- */

static struct {
    gvqResult_t res;
    gvq_layout_t layout;
    char why[256];
} env_layout;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static void env_layout_parse(void) {
    env_layout.res =
        gvq_layout_parse("GVQ_LAYOUT", gvq_param_text(GVQ_PARAM_LAYOUT), &env_layout.layout);
    if (env_layout.res != gvqSuccess)
        snprintf(env_layout.why, sizeof env_layout.why, "%s", gvq_log_last_warn());
}

/* The layout of this communicator (NULL: none): a call's, else GVQ_LAYOUT's. A malformed
 * GVQ_LAYOUT fails every zero-code call, so a job never runs without the layout it asked for. */
static gvqResult_t current_layout(const zc_state_t *st, const gvq_layout_t **out) {
    *out = NULL;
    if (st->have_layout) {
        if (st->layout.nlayers > 0) *out = &st->layout;
        return gvqSuccess;
    }
    pthread_once(&env_once, env_layout_parse);
    if (env_layout.res != gvqSuccess) {
        GVQ_WARN("%s: GVQ_LAYOUT is refused (%s)", fn_call, env_layout.why);
        return env_layout.res;
    }
    if (env_layout.layout.nlayers > 0) *out = &env_layout.layout;
    return gvqSuccess;
}

/* ---- the attachment ------------------------------------------------------------------------- */

static void entry_free(zc_entry_t *e) {
    for (int i = 0; i < e->nparts; i++)
        if (e->parts[i].comp != NULL) gvqCompressorDestroy(e->parts[i].comp);
    free(e->parts);
    free(e->plain);
    free(e->gather);
    free(e);
}

static void detach(void *state) {
    zc_state_t *st = state;
    for (zc_entry_t *e = st->first, *next; e != NULL; e = next) {
        next = e->next;
        entry_free(e);
    }
    gvq_layout_free(&st->layout);
    free(st);
}

static gvqResult_t attached_state(gvqComm_t comm, zc_state_t **out) {
    zc_state_t *st = gvq_comm_attached(comm, &attachment_key);
    if (st == NULL) {
        if ((st = calloc(1, sizeof *st)) == NULL) return gvqSystemError;
        gvqResult_t res = gvq_comm_attach(comm, &attachment_key, st, detach);
        if (res != gvqSuccess) {
            free(st);
            return res;
        }
    }
    *out = st;
    return gvqSuccess;
}

/* ---- the plan: parts, their codecs and configs ---------------------------------------------- */

/* GVQ_CODEC_CONV / GVQ_CODEC_FC: a codec, or -1 (default: GVQ_CODEC's rule). */
static int kind_override(int kind) {
    return (int)gvq_param(kind == gvqLayerConv ? GVQ_PARAM_CODEC_CONV : GVQ_PARAM_CODEC_FC) - 1;
}

static int power_rank(size_t rows, size_t cols) {
    size_t r = (size_t)GVQ_MAX(gvq_param(GVQ_PARAM_POWER_RANK), 1);
    return (int)GVQ_MIN(r, GVQ_MIN(rows, cols));
}

/* PowerSGD's matrix for a part: conv K x DHW, fc out x in, else the compressor's flat shape. */
static void power_shape(const gvqLayer_t *l, size_t count, size_t *rows, size_t *cols) {
    if (l != NULL && l->kind != gvqLayerOther) {
        *rows = (size_t)l->dims[0];
        *cols = count / *rows;
        return;
    }
    gvq_comp_cfg_t flat = {.count = count, .W = 0};
    gvq_powersgd_shape(&flat, rows, cols);
}

/* The codec of layer l under GVQ_CODEC = master: plain for other kinds and small layers; the
 * kind's override; an explicit GVQ_CODEC; auto: conv GradiVeQ, fc PowerSGD when rank r sends at
 * most a quarter of the matrix (r (out + in) <= out in / 4), else QSGD. */
static int layer_codec(int master, const gvqLayer_t *l) {
    if (l->kind == gvqLayerOther || l->count < (size_t)gvq_param(GVQ_PARAM_LAYOUT_MIN_COUNT))
        return gvqCodecNone;
    int over = kind_override(l->kind);
    if (over >= 0) return over;
    if (master != GVQ_ZERO_CODE_AUTO) return master;
    if (l->kind == gvqLayerConv) return gvqCodecGradiveq;
    size_t rows, cols;
    power_shape(l, l->count, &rows, &cols);
    size_t r = (size_t)power_rank(rows, cols);
    return 4 * r * (rows + cols) <= rows * cols ? gvqCodecPowersgd : gvqCodecQsgd;
}

/* GVQ_INTEGER_BITS (the tracked basis) or GVQ_QSGD_INTEGER_BITS: 0, 8 or 16 (the params'
 * choices 0, 1, 2). One knob each: a width right for the basis costs QSGD 4x its ratio. */
static int integer_bits(gvq_param_id_t knob) {
    return (int)gvq_param(knob) * 8;
}

/* The compressor config of a part (l: its layer, NULL for the whole buffer). */
static void part_config(const zc_part_t *p, const gvqLayer_t *l, gvqCompressorConfig_t *cfg) {
    gvqCompressorConfig_t init = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    *cfg = init;
    cfg->codec = p->codec;
    if (p->codec == gvqCodecGradiveq) {
        double vote = gvq_param_real(GVQ_PARAM_GRADIVEQ_VOTE);
        int64_t slices = gvq_param(GVQ_PARAM_GRADIVEQ_SAMPLE_SLICES);
        cfg->lossThreshold = (float)gvq_param_real(GVQ_PARAM_GRADIVEQ_EPS);
        cfg->voteThreshold = vote == -1 ? 1.0f : (float)vote; /* zero-code: no early exit */
        cfg->sampleSlices = slices == GVQ_CONFIG_UNDEF_INT ? ZC_SAMPLE_SLICES : (int)slices;
        if (gvq_param(GVQ_PARAM_GRADIVEQ_BASIS) == 1) {
            cfg->basisUpdate = gvqBasisTrack;
            cfg->integerBits = integer_bits(GVQ_PARAM_INTEGER_BITS);
        }
        if (l != NULL && l->kind == gvqLayerConv) {
            cfg->filters = l->dims[0];
            cfg->depth = l->dims[1];
            cfg->height = l->dims[2];
            cfg->width = l->dims[3];
        }
    } else if (p->codec == gvqCodecQsgd) {
        cfg->integerBits = integer_bits(GVQ_PARAM_QSGD_INTEGER_BITS);
    } else if (p->codec == gvqCodecPowersgd) {
        size_t rows, cols;
        power_shape(l, p->count, &rows, &cols);
        cfg->powerRank = power_rank(rows, cols);
        if (l != NULL && l->kind != gvqLayerOther) { /* rows x cols through the conv shape */
            cfg->filters = (int)rows;
            cfg->depth = (int)cols;
            cfg->height = cfg->width = 1;
        }
    }
}

static int add_part(zc_entry_t *e, size_t offset, size_t count, int layer, int codec) {
    if (count == 0) return 0;
    e->parts[e->nparts++] = (zc_part_t){offset, count, layer, codec, NULL};
    if (codec != gvqCodecNone) return 0;
    zc_range_t *last = e->nranges > 0 ? &e->plain[e->nranges - 1] : NULL;
    if (last != NULL && last->offset + last->count == offset)
        last->count += count;
    else
        e->plain[e->nranges++] = (zc_range_t){offset, count};
    e->plain_count += count;
    return 0;
}

/* The parts of e (its count set) under GVQ_CODEC = master and layout lay (NULL: none). */
static gvqResult_t plan_parts(zc_entry_t *e, int master, const gvq_layout_t *lay) {
    int n = lay != NULL ? 2 * lay->nlayers + 1 : 1; /* layers and the gaps around them */
    e->parts = calloc((size_t)n, sizeof *e->parts);
    e->plain = calloc((size_t)n, sizeof *e->plain);
    if (e->parts == NULL || e->plain == NULL) return gvqSystemError;
    if (lay == NULL) {
        add_part(e, 0, e->count, PART_WHOLE, master == GVQ_ZERO_CODE_AUTO ? gvqCodecQsgd : master);
    } else {
        e->split = 1;
        size_t at = 0;
        for (int k = 0; k < lay->nlayers; k++) {
            int i = lay->by_offset[k];
            const gvqLayer_t *l = &lay->layers[i];
            add_part(e, at, l->offset - at, PART_GAP, gvqCodecNone);
            add_part(e, l->offset, l->count, i, layer_codec(master, l));
            at = l->offset + l->count;
        }
        add_part(e, at, e->count - at, PART_GAP, gvqCodecNone);
    }
    if (e->nranges > 1 && (e->gather = malloc(sizeof(float) * e->plain_count)) == NULL) {
        GVQ_WARN("%s: cannot allocate %zu floats to gather the plain layers", fn_call,
                 e->plain_count);
        return gvqSystemError;
    }
    return gvqSuccess;
}

/* FNV-1a of what every rank must have decided alike: each part's range, codec and config. */
static uint64_t plan_hash(const zc_entry_t *e, const gvq_layout_t *lay) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < e->nparts; i++) {
        const zc_part_t *p = &e->parts[i];
        gvqCompressorConfig_t cfg;
        part_config(p, p->layer >= 0 ? &lay->layers[p->layer] : NULL, &cfg);
        uint32_t eps, vote;
        memcpy(&eps, &cfg.lossThreshold, sizeof eps);
        memcpy(&vote, &cfg.voteThreshold, sizeof vote);
        uint64_t w[] = {p->offset,
                        p->count,
                        (uint64_t)p->codec,
                        (uint32_t)cfg.filters,
                        (uint32_t)cfg.depth,
                        (uint32_t)cfg.powerRank,
                        (uint32_t)cfg.sampleSlices,
                        eps,
                        vote};
        for (size_t k = 0; k < sizeof w / sizeof w[0]; k++)
            for (int b = 0; b < 8; b++)
                h = (h ^ ((w[k] >> (8 * b)) & 0xffu)) * 1099511628211ull;
    }
    return h;
}

static gvqResult_t make_compressors(gvqComm_t comm, zc_entry_t *e, const gvq_layout_t *lay) {
    for (int i = 0; i < e->nparts; i++) {
        zc_part_t *p = &e->parts[i];
        if (p->codec == gvqCodecNone) continue;
        gvqCompressorConfig_t cfg;
        part_config(p, p->layer >= 0 ? &lay->layers[p->layer] : NULL, &cfg);
        GVQCHECK(gvqCompressorCreate(comm, p->count, &cfg, &p->comp));
    }
    return gvqSuccess;
}

/* Every rank learns whether the others could make their parts, then compares the plans. A rank
 * that refused returns its own error; the others gvqRemoteError; a different plan is refused on
 * every rank alike (gvqInvalidArgument). */
static gvqResult_t agree_plan(gvqComm_t comm, gvqResult_t local, const zc_entry_t *e,
                              const gvq_layout_t *lay) {
    gvq_coll_ctx_t ctx = gvq_comm_ctx(comm, NULL);
    int32_t refused = local != gvqSuccess;
    GVQCHECK(gvq_agree_i32(&ctx, &refused, 1, gvqSum));
    if (local != gvqSuccess) return local;
    if (refused > 0) {
        GVQ_WARN("%s: %d other rank(s) refused the zero-code setup of this call (count %zu); "
                 "their log says why",
                 fn_call, (int)refused, e->count);
        return gvqRemoteError;
    }
    static const char *const names[] = {
        "count", "layout layers (0: no layout for this count)",
        "layout hash (kinds, offsets, dims of the layers)",
        "plan hash (per-layer codecs and knobs: GVQ_CODEC, GVQ_CODEC_CONV/_FC, GVQ_POWER_RANK, "
        "GVQ_GRADIVEQ_*, GVQ_LAYOUT_MIN_COUNT)"};
    int64_t mine[4] = {(int64_t)e->count, lay != NULL ? lay->nlayers : 0,
                       lay != NULL ? (int64_t)gvq_layout_hash(lay) : 0, (int64_t)plan_hash(e, lay)};
    return gvq_agree_fields(&ctx, fn_call, mine, names, 4, NULL);
}

/* The plan of a new buffer. A buffer split by a layout is shown once on rank 0 at the default
 * level (the layout as gvq understood it: a layout of the right count but of another model's
 * layers shows here); the rest at INFO. */
static void log_plan(const gvqComm_t comm, const zc_entry_t *e, const gvq_layout_t *lay) {
    static const char *const codec_name[] = {"plain", "gradiveq", "qsgd", "powersgd"};
    int shown = e->split && comm->rank == 0;
    if (!GVQ_LOG_ENABLED(shown ? GVQ_LOG_WARN : GVQ_LOG_INFO)) return;
    if (!e->split) {
        GVQ_INFO("GVQ_CODEC: buffer %p count %zu: one %s compressor (no layout of this count)",
                 e->buf, e->count, codec_name[e->parts[0].codec]);
        return;
    }
    GVQ_NOTE("GVQ_CODEC: buffer %p count %zu split by its layout of %d layers; %zu elements in "
             "%d plain range(s)",
             e->buf, e->count, lay->nlayers, e->plain_count, e->nranges);
    for (int i = 0; i < e->nparts; i++) {
        const zc_part_t *p = &e->parts[i];
        if (p->layer < 0) continue;
        const gvqLayer_t *l = &lay->layers[p->layer];
        char dims[64];
        if (l->kind == gvqLayerConv)
            snprintf(dims, sizeof dims, "%dx%dx%dx%d", l->dims[0], l->dims[1], l->dims[2],
                     l->dims[3]);
        else if (l->kind == gvqLayerFc)
            snprintf(dims, sizeof dims, "%dx%d", l->dims[0], l->dims[1]);
        else
            snprintf(dims, sizeof dims, "%zu", p->count);
        GVQ_NOTE("GVQ_CODEC:   layer %d %s at %zu (%zu elements, dims %s) -> %s", p->layer,
                 gvq_layer_kind_name(l->kind), p->offset, p->count, dims, codec_name[p->codec]);
    }
}

/* A new entry for (buf, count): its parts and compressors, agreed with the other ranks. */
static gvqResult_t new_entry(gvqComm_t comm, zc_state_t *st, int master, const void *buf,
                             size_t count, zc_entry_t **out) {
    int tensors = comm->ntensors; /* restored on refusal: fits stay spread alike on every rank */
    const gvq_layout_t *lay = NULL;
    zc_entry_t *e = calloc(1, sizeof *e);
    if (e == NULL) return gvqSystemError;
    e->buf = buf;
    e->count = count;
    gvqResult_t res = current_layout(st, &lay);
    if (lay != NULL && lay->count != count) {
        /* said at the default level: the user asked for a layout and this buffer runs without
         * it (buffers below GVQ_LAYOUT_MIN_COUNT, a loss or a metric, stay quiet) */
        if (count >= (size_t)gvq_param(GVQ_PARAM_LAYOUT_MIN_COUNT))
            GVQ_WARN("%s: buffer %p of %zu floats: the layout (%d layers) describes %zu floats, "
                     "so it is not used for this buffer; it runs as one whole-buffer compressor",
                     fn_call, buf, count, lay->nlayers, lay->count);
        lay = NULL;
    }
    if (res == gvqSuccess) res = plan_parts(e, master, lay);
    if (res == gvqSuccess) res = make_compressors(comm, e, lay);
    res = agree_plan(comm, res, e, lay);
    if (res != gvqSuccess) {
        entry_free(e);
        comm->ntensors = tensors;
        return res;
    }
    log_plan(comm, e, lay);
    *out = e;
    return gvqSuccess;
}

/* ---- one call ------------------------------------------------------------------------------- */

static unsigned long long raw_bytes(int nranks, size_t count) {
    return nranks > 1 ? 2 * (unsigned long long)(nranks - 1) * count * 4 / (unsigned)nranks : 0;
}

/* The plain parts: one allreduce, straight between the buffers when they are one range, else
 * gathered into scratch, summed in place and scattered. */
static gvqResult_t run_plain(gvqComm_t comm, zc_entry_t *e, const float *send, float *recv,
                             gvqRedOp_t op) {
    if (e->plain_count == 0) return gvqSuccess;
    unsigned long long sent = 0;
    gvq_coll_ctx_t ctx = gvq_comm_ctx(comm, &sent);
    gvq_codec_t id;
    gvq_codec_identity_init(&id, comm->dev, gvqFloat32, op);
    if (e->nranges == 1) {
        const zc_range_t *r = &e->plain[0];
        GVQCHECK(gvq_ring_allreduce(&ctx, &id, send + r->offset, recv + r->offset, r->count, op));
    } else {
        size_t at = 0;
        for (int i = 0; i < e->nranges; at += e->plain[i++].count)
            memcpy(e->gather + at, send + e->plain[i].offset, sizeof(float) * e->plain[i].count);
        GVQCHECK(gvq_ring_allreduce(&ctx, &id, e->gather, e->gather, e->plain_count, op));
        at = 0;
        for (int i = 0; i < e->nranges; at += e->plain[i++].count)
            memcpy(recv + e->plain[i].offset, e->gather + at, sizeof(float) * e->plain[i].count);
    }
    e->plain_wire += sent;
    e->plain_raw += raw_bytes(comm->nranks, e->plain_count);
    return gvqSuccess;
}

/* The plain part, then the compressed layers as one set (gvq_compressed_allreduce_set: the
 * tracked-basis, PowerSGD and QSGD layers each fused into one call, the others one by one). */
static gvqResult_t run_entry(gvqComm_t comm, zc_entry_t *e, const float *send, float *recv,
                             gvqRedOp_t op) {
    GVQCHECK(run_plain(comm, e, send, recv, op));
    size_t n = (size_t)GVQ_MAX(e->nparts, 1), k = 0;
    gvqCompressor_t *cs = malloc(n * sizeof *cs);
    const float **s = malloc(n * sizeof *s);
    float **r = malloc(n * sizeof *r);
    gvqResult_t res = gvqSystemError;
    if (cs == NULL || s == NULL || r == NULL) {
        GVQ_WARN("GVQ_CODEC: out of memory for the %d layers of a call", e->nparts);
    } else {
        for (int i = 0; i < e->nparts; i++)
            if (e->parts[i].comp != NULL) {
                cs[k] = e->parts[i].comp;
                s[k] = send + e->parts[i].offset;
                r[k++] = recv + e->parts[i].offset;
            }
        res = gvq_compressed_allreduce_set(cs, s, r, NULL, op, k);
    }
    free(cs), free(s), free(r);
    if (res == gvqSuccess) e->calls++;
    return res;
}

/* ---- statistics ----------------------------------------------------------------------------- */

/* Add a part's statistics into *t: the first part (n == 0) sets the fields that are not sums. */
static void add_stats(gvqCompressorStats_t *t, const gvqCompressorStats_t *s, int n) {
    if (n == 0) {
        *t = *s;
        return;
    }
    t->wireBytes += s->wireBytes;
    t->rawBytes += s->rawBytes;
    t->fits += s->fits;
    t->fitsRefused += s->fitsRefused;
    t->earlyExits += s->earlyExits;
    t->fitSeconds += s->fitSeconds;
    t->lastLoss = GVQ_MAX(t->lastLoss, s->lastLoss);
}

/* A plain part's share (by elements) of its entry's plain allreduce. */
static void plain_stats(const zc_entry_t *e, const zc_part_t *p, gvqCompressorStats_t *s) {
    memset(s, 0, sizeof *s);
    double share = (double)p->count / (double)e->plain_count;
    s->codec = gvqCodecNone;
    s->phase = gvqPhasePlain;
    s->iteration = s->phaseIter = e->calls;
    s->wireBytes = (unsigned long long)((double)e->plain_wire * share + 0.5);
    s->rawBytes = (unsigned long long)((double)e->plain_raw * share + 0.5);
    s->ratio = e->plain_wire > 0 ? (double)e->plain_raw / (double)e->plain_wire : 0;
}

/* The sum over every zero-code call (bytes of the compressors and the plain allreduces), and
 * the bytes sent per codec (wire[gvqCodecNone]: the plain allreduces). */
static void total_stats(const zc_state_t *st, gvqCompressorStats_t *t, unsigned long long *wire) {
    memset(t, 0, sizeof *t);
    t->codec = gvqCodecNone;
    t->phase = -1;
    t->keptEnergy = 1.0;
    for (const zc_entry_t *e = st->first; e != NULL; e = e->next) {
        t->wireBytes += e->plain_wire;
        t->rawBytes += e->plain_raw;
        wire[gvqCodecNone] += e->plain_wire;
        for (int i = 0; i < e->nparts; i++) {
            const zc_part_t *p = &e->parts[i];
            gvqCompressorStats_t s;
            if (p->comp == NULL || gvqCompressorGetStats(p->comp, &s) != gvqSuccess) continue;
            t->codec = t->groups == 0 || t->codec == s.codec ? s.codec : -1;
            t->groups++;
            t->wireBytes += s.wireBytes;
            t->rawBytes += s.rawBytes;
            t->fits += s.fits;
            t->fitsRefused += s.fitsRefused;
            t->earlyExits += s.earlyExits;
            t->fitSeconds += s.fitSeconds;
            t->lastLoss = GVQ_MAX(t->lastLoss, s.lastLoss);
            if (s.fits > 0) t->keptEnergy = GVQ_MIN(t->keptEnergy, s.keptEnergy);
            if (s.fits > 0 && s.dims > 0)
                t->dims = t->dims == 0 ? s.dims : GVQ_MIN(t->dims, s.dims);
            if (s.codec >= 0 && s.codec <= gvqCodecPowersgd) wire[s.codec] += s.wireBytes;
            if (t->reason[0] != '\0' || s.reason[0] == '\0') continue;
            if (p->layer >= 0)
                snprintf(t->reason, sizeof t->reason, "layer %d: %.140s", p->layer, s.reason);
            else
                snprintf(t->reason, sizeof t->reason, "buffer of %zu: %.130s", e->count, s.reason);
        }
    }
    if (t->fits == 0) t->keptEnergy = 0;
    t->iteration = t->phaseIter = st->calls;
    t->ratio = t->wireBytes > 0 ? (double)t->rawBytes / (double)t->wireBytes : 0;
}

/* Rank 0's statistics line every GVQ_STATS_EVERY calls: at INFO, or at the default level when
 * GVQ_STATS_EVERY was set (asked for by name, it is shown without GVQ_DEBUG=INFO). */
static void report(gvqComm_t comm, const zc_state_t *st) {
    int64_t every = gvq_param(GVQ_PARAM_STATS_EVERY);
    int asked = gvq_param_is_set(GVQ_PARAM_STATS_EVERY);
    if (every <= 0 || st->calls % every != 0 || comm->rank != 0 ||
        !GVQ_LOG_ENABLED(asked ? GVQ_LOG_WARN : GVQ_LOG_INFO))
        return;
    gvqCompressorStats_t t;
    unsigned long long w[gvqCodecPowersgd + 1] = {0};
    total_stats(st, &t, w);
    const double MB = 1e6;
    char fit[96] = "";
    if (t.fits > 0) /* why GradiVeQ's ratio is what it is */
        snprintf(fit, sizeof fit, ", GradiVeQ d %d (smallest fitted) keeping %.4f of the energy",
                 t.dims, t.keptEnergy);
    char line[900];
    snprintf(line, sizeof line,
             "zero-code stats after %lld calls: ratio %.2fx (%.4g MB a plain ring would send per "
             "rank, %.4g MB sent); sent by plain allreduce %.4g MB, gradiveq %.4g MB, qsgd %.4g "
             "MB, powersgd %.4g MB; %d compressors, fits %lld (refused %lld)%s, early exits "
             "%lld%s%s",
             st->calls, t.ratio, (double)t.rawBytes / MB, (double)t.wireBytes / MB,
             (double)w[gvqCodecNone] / MB, (double)w[gvqCodecGradiveq] / MB,
             (double)w[gvqCodecQsgd] / MB, (double)w[gvqCodecPowersgd] / MB, t.groups, t.fits,
             t.fitsRefused, fit, t.earlyExits,
             t.reason[0] != '\0' ? "; not compressing at this call: " : "", t.reason);
    if (asked)
        GVQ_NOTE("%s", line);
    else
        GVQ_INFO("%s", line);
}

/* ---- entry points --------------------------------------------------------------------------- */

/* GVQ_CODEC's value names no codec: its calls are refused, not run uncompressed. */
static int codec_rejected(gvqDataType_t dtype, gvqRedOp_t op) {
    return gvq_param_rejected(GVQ_PARAM_CODEC) != NULL && dtype == gvqFloat32 &&
           (op == gvqSum || op == gvqAvg);
}

static uint64_t zero_code_identity(gvqDataType_t dtype, gvqRedOp_t op) {
    int master = (int)gvq_param(GVQ_PARAM_CODEC);
    if (codec_rejected(dtype, op)) return 0xff; /* unlike any rank whose GVQ_CODEC parsed */
    if (master == gvqCodecNone || dtype != gvqFloat32 || (op != gvqSum && op != gvqAvg)) return 0;
    const gvq_param_id_t knobs[] = {GVQ_PARAM_CODEC_CONV,       GVQ_PARAM_CODEC_FC,
                                    GVQ_PARAM_POWER_RANK,       GVQ_PARAM_GRADIVEQ_SAMPLE_SLICES,
                                    GVQ_PARAM_LAYOUT_MIN_COUNT, GVQ_PARAM_GRADIVEQ_BASIS,
                                    GVQ_PARAM_INTEGER_BITS,     GVQ_PARAM_QSGD_INTEGER_BITS};
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the knobs' values */
    for (size_t k = 0; k < sizeof knobs / sizeof knobs[0]; k++) {
        uint64_t v = (uint64_t)gvq_param(knobs[k]);
        for (int b = 0; b < 8; b++)
            h = (h ^ ((v >> (8 * b)) & 0xffu)) * 1099511628211ull;
    }
    return h << 8 | (uint64_t)master; /* the low byte names GVQ_CODEC in the WARN */
}

static gvqResult_t zero_code_allreduce(gvqComm_t comm, const void *send, void *recv, size_t count,
                                       gvqDataType_t dtype, gvqRedOp_t op, int *handled) {
    int master = (int)gvq_param(GVQ_PARAM_CODEC);
    *handled = 0;
    if (codec_rejected(dtype, op) && count > 0) {
        *handled = 1;
        GVQ_WARN("%s: GVQ_CODEC='%s' names no codec (none, gradiveq, qsgd, powersgd or auto, in "
                 "any case): the call is refused rather than run uncompressed",
                 fn_call, gvq_param_rejected(GVQ_PARAM_CODEC));
        return gvqInvalidArgument;
    }
    if (master == gvqCodecNone || dtype != gvqFloat32 || (op != gvqSum && op != gvqAvg) ||
        count == 0)
        return gvqSuccess;
    zc_state_t *st;
    GVQCHECK(attached_state(comm, &st));
    zc_entry_t *e = st->first;
    while (e != NULL && !(e->buf == recv && e->count == count))
        e = e->next;
    if (e == NULL) {
        GVQCHECK(new_entry(comm, st, master, recv, count, &e));
        e->next = st->first;
        st->first = e;
    }
    *handled = 1;
    GVQCHECK(run_entry(comm, e, send, recv, op));
    st->calls++;
    report(comm, st);
    return gvqSuccess;
}

/* Drop the entries a layout change affects (those of either layout's count). */
static void drop_entries(zc_state_t *st, size_t count_a, size_t count_b) {
    for (zc_entry_t **pe = &st->first; *pe != NULL;) {
        zc_entry_t *e = *pe;
        if (e->count == count_a || e->count == count_b) {
            *pe = e->next;
            entry_free(e);
        } else {
            pe = &e->next;
        }
    }
}

static gvqResult_t set_layout(gvqComm_t comm, gvq_layout_t *lay) {
    zc_state_t *st;
    gvqResult_t res = attached_state(comm, &st);
    if (res != gvqSuccess) {
        gvq_layout_free(lay);
        return res;
    }
    const gvq_layout_t *old = NULL;
    if (current_layout(st, &old) != gvqSuccess) old = NULL;
    drop_entries(st, old != NULL ? old->count : 0, lay->count);
    gvq_layout_free(&st->layout);
    st->layout = *lay;
    st->have_layout = 1;
    GVQ_INFO("gvqCommSetLayout: comm %p: %d layers over %zu elements", (void *)comm, lay->nlayers,
             lay->count);
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqCommSetLayout(gvqComm_t comm, size_t count, const gvqLayer_t *layers,
                                     int nlayers) {
    const char *fn = "gvqCommSetLayout";
    GVQCHECK(gvq_comm_check(comm, fn, 0));
    gvq_layout_t lay;
    GVQCHECK(gvq_layout_make(fn, count, layers, nlayers, &lay));
    return set_layout(comm, &lay);
}

GVQ_API gvqResult_t gvqCommSetLayoutString(gvqComm_t comm, const char *layout) {
    const char *fn = "gvqCommSetLayoutString";
    GVQCHECK(gvq_comm_check(comm, fn, 0));
    gvq_layout_t lay;
    GVQCHECK(gvq_layout_parse(fn, layout, &lay));
    return set_layout(comm, &lay);
}

GVQ_API gvqResult_t gvqCommGetCompressionStats(gvqComm_t comm, int layer,
                                               gvqCompressorStats_t *stats) {
    const char *fn = "gvqCommGetCompressionStats";
    GVQCHECK(gvq_comm_check(comm, fn, 0));
    if (stats == NULL) {
        GVQ_WARN("%s: stats is NULL", fn);
        return gvqInvalidArgument;
    }
    zc_state_t *st = gvq_comm_attached(comm, &attachment_key);
    zc_state_t none = {0};
    if (st == NULL) st = &none;
    if (layer == GVQ_STATS_TOTAL) {
        unsigned long long w[gvqCodecPowersgd + 1] = {0};
        total_stats(st, stats, w);
        return gvqSuccess;
    }
    const gvq_layout_t *lay = NULL;
    if (st != &none) GVQCHECK(current_layout(st, &lay));
    if (lay == NULL || layer < 0 || layer >= lay->nlayers) {
        GVQ_WARN("%s: layer %d is not GVQ_STATS_TOTAL (-1) nor a layer of the layout (%d layers)",
                 fn, layer, lay != NULL ? lay->nlayers : 0);
        return gvqInvalidArgument;
    }
    gvqCompressorStats_t t;
    memset(&t, 0, sizeof t);
    int master = (int)gvq_param(GVQ_PARAM_CODEC);
    t.codec = master == gvqCodecNone ? gvqCodecNone : layer_codec(master, &lay->layers[layer]);
    int n = 0;
    for (const zc_entry_t *e = st->first; e != NULL; e = e->next) {
        if (!e->split) continue;
        for (int i = 0; i < e->nparts; i++) {
            const zc_part_t *p = &e->parts[i];
            if (p->layer != layer) continue;
            gvqCompressorStats_t s;
            if (p->comp != NULL)
                GVQCHECK(gvqCompressorGetStats(p->comp, &s));
            else
                plain_stats(e, p, &s);
            add_stats(&t, &s, n++);
        }
    }
    *stats = t;
    return gvqSuccess;
}

/* ---- gvqAllReduce ----------------------------------------------------------------------------
 * The public allreduce is made here, one layer above the plain collectives (src/comm/), so that
 * zero-code mode can take it: its op carries zero_code_upper, which collectives.c calls for the
 * signature's identity and, as the call runs, to compress it when it qualifies. */
static const gvq_upper_ops_t zero_code_upper = {.identity = zero_code_identity,
                                                .allreduce = zero_code_allreduce};

GVQ_API gvqResult_t gvqAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                 gvqDataType_t datatype, gvqRedOp_t op, gvqComm_t comm,
                                 gvqStream_t stream) {
    gvq_op_t o = {.kind = GVQ_OP_ALLREDUCE,
                  .sendbuff = sendbuff,
                  .recvbuff = recvbuff,
                  .count = count,
                  .dtype = datatype,
                  .op = op,
                  .comm = comm,
                  .stream = stream,
                  .upper = &zero_code_upper};
    return gvq_op_submit(&o);
}
