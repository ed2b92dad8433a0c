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
static const char attachment_key = 0; /* its address names the attachment */

/* ---- the attachment ------------------------------------------------------------------------- */

static void detach(void *state) {
    zc_state_t *st = state;
    for (zc_entry_t *e = st->first, *next; e != NULL; e = next) {
        next = e->next;
        gvq_zc_entry_free(e);
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
                 GVQ_ZC_FN, gvq_param_rejected(GVQ_PARAM_CODEC));
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
        GVQCHECK(gvq_zc_new_entry(comm, st, master, recv, count, &e));
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
            gvq_zc_entry_free(e);
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
    if (gvq_zc_current_layout(st, &old) != gvqSuccess) old = NULL;
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
    if (st != &none) GVQCHECK(gvq_zc_current_layout(st, &lay));
    if (lay == NULL || layer < 0 || layer >= lay->nlayers) {
        GVQ_WARN("%s: layer %d is not GVQ_STATS_TOTAL (-1) nor a layer of the layout (%d layers)",
                 fn, layer, lay != NULL ? lay->nlayers : 0);
        return gvqInvalidArgument;
    }
    gvqCompressorStats_t t;
    memset(&t, 0, sizeof t);
    int master = (int)gvq_param(GVQ_PARAM_CODEC);
    t.codec =
        master == gvqCodecNone ? gvqCodecNone : gvq_zc_layer_codec(master, &lay->layers[layer]);
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
