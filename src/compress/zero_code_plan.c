/*
 * zero_code_plan.c -- zero-code mode's plan of a buffer (zero_code.c has the design): the layout
 * in force (gvqCommSetLayout, else GVQ_LAYOUT, parsed once per process), the buffer cut into its
 * parts, each part's codec and compressor config, the compressors made, and every rank's plan
 * checked against the others'.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "gvq_compressor.h"
#include "gvq_zero_code.h"

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
gvqResult_t gvq_zc_current_layout(const zc_state_t *st, const gvq_layout_t **out) {
    *out = NULL;
    if (st->have_layout) {
        if (st->layout.nlayers > 0) *out = &st->layout;
        return gvqSuccess;
    }
    pthread_once(&env_once, env_layout_parse);
    if (env_layout.res != gvqSuccess) {
        GVQ_WARN("%s: GVQ_LAYOUT is refused (%s)", GVQ_ZC_FN, env_layout.why);
        return env_layout.res;
    }
    if (env_layout.layout.nlayers > 0) *out = &env_layout.layout;
    return gvqSuccess;
}

void gvq_zc_entry_free(zc_entry_t *e) {
    for (int i = 0; i < e->nparts; i++)
        if (e->parts[i].comp != NULL) gvqCompressorDestroy(e->parts[i].comp);
    free(e->parts);
    free(e->plain);
    free(e->gather);
    free(e);
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
int gvq_zc_layer_codec(int master, const gvqLayer_t *l) {
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
            add_part(e, l->offset, l->count, i, gvq_zc_layer_codec(master, l));
            at = l->offset + l->count;
        }
        add_part(e, at, e->count - at, PART_GAP, gvqCodecNone);
    }
    if (e->nranges > 1 && (e->gather = malloc(sizeof(float) * e->plain_count)) == NULL) {
        GVQ_WARN("%s: cannot allocate %zu floats to gather the plain layers", GVQ_ZC_FN,
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

static gvqResult_t make_compressors(gvqComm_t comm, zc_entry_t *e, const gvq_layout_t *lay,
                                    int *seeds) {
    for (int i = 0; i < e->nparts; i++) {
        zc_part_t *p = &e->parts[i];
        if (p->codec == gvqCodecNone) continue;
        gvqCompressorConfig_t cfg;
        part_config(p, p->layer >= 0 ? &lay->layers[p->layer] : NULL, &cfg);
        cfg.seed = (*seeds)++; /* its own random stream: the communicator's k-th compressor */
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
                 GVQ_ZC_FN, (int)refused, e->count);
        return gvqRemoteError;
    }
    static const char *const names[] = {
        "count", "layout layers (0: no layout for this count)",
        "layout hash (kinds, offsets, dims of the layers)",
        "plan hash (per-layer codecs and knobs: GVQ_CODEC, GVQ_CODEC_CONV/_FC, GVQ_POWER_RANK, "
        "GVQ_GRADIVEQ_*, GVQ_LAYOUT_MIN_COUNT)"};
    int64_t mine[4] = {(int64_t)e->count, lay != NULL ? lay->nlayers : 0,
                       lay != NULL ? (int64_t)gvq_layout_hash(lay) : 0, (int64_t)plan_hash(e, lay)};
    return gvq_agree_fields(&ctx, GVQ_ZC_FN, mine, names, 4, NULL);
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
gvqResult_t gvq_zc_new_entry(gvqComm_t comm, zc_state_t *st, int master, const void *buf,
                             size_t count, zc_entry_t **out) {
    int tensors = comm->ntensors; /* restored on refusal: fits stay spread alike on every rank */
    const gvq_layout_t *lay = NULL;
    zc_entry_t *e = calloc(1, sizeof *e);
    if (e == NULL) return gvqSystemError;
    e->buf = buf;
    e->count = count;
    gvqResult_t res = gvq_zc_current_layout(st, &lay);
    if (lay != NULL && lay->count != count) {
        /* said at the default level: the user asked for a layout and this buffer runs without
         * it (buffers below GVQ_LAYOUT_MIN_COUNT, a loss or a metric, stay quiet) */
        if (count >= (size_t)gvq_param(GVQ_PARAM_LAYOUT_MIN_COUNT))
            GVQ_WARN("%s: buffer %p of %zu floats: the layout (%d layers) describes %zu floats, "
                     "so it is not used for this buffer; it runs as one whole-buffer compressor",
                     GVQ_ZC_FN, buf, count, lay->nlayers, lay->count);
        lay = NULL;
    }
    if (res == gvqSuccess) res = plan_parts(e, master, lay);
    if (res == gvqSuccess) res = make_compressors(comm, e, lay, &st->seeds);
    res = agree_plan(comm, res, e, lay);
    if (res != gvqSuccess) {
        gvq_zc_entry_free(e);
        comm->ntensors = tensors;
        return res;
    }
    log_plan(comm, e, lay);
    *out = e;
    return gvqSuccess;
}
