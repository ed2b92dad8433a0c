/*
 * compressor.c -- compressor handles: create (the config resolved, the method of gvq_method.h
 * chosen and its state made), destroy, stats, the registry of live ones and their identity.
 * schedule.c has the phases a call moves through; the methods in methods/ the calls.
 */
#include <stdio.h>
#include <stdlib.h>

#include "gvq_method.h"
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

/* ---- create / destroy ------------------------------------------------------------------------ */

static size_t codec_chunk_bytes(void) {
    size_t bytes = (size_t)gvq_param(GVQ_PARAM_CODEC_CHUNK_BYTES);
    if (bytes < 1024 || bytes > (1u << 30)) {
        GVQ_WARN("GVQ_CODEC_CHUNK_BYTES=%zu is outside [1024, 2^30]; using 256 KiB", bytes);
        bytes = 1 << 18;
    }
    return bytes;
}

/* The collocation / error-feedback vectors (every method's). */
static gvqResult_t alloc_buffers(gvqCompressor_t c) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    size_t count = cfg->count;
    if ((c->collocate || cfg->error_feedback) && (c->work = malloc(sizeof(float) * count)) == NULL)
        return gvqSystemError;
    if (cfg->error_feedback) {
        c->ef_input = malloc(sizeof(float) * count);
        c->residual = calloc(count, sizeof(float));
        c->ef_coef = malloc(sizeof(float) * (size_t)GVQ_MAX(cfg->L, 1)); /* d <= L */
        if (c->ef_input == NULL || c->residual == NULL || c->ef_coef == NULL) return gvqSystemError;
    }
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
    c->collocate = c->method->collocates && cfg->K > 1 && cfg->D * cfg->H * cfg->W > 1;
    c->st.stats.codec = cfg->codec;
    c->st.stats.sliceSize = cfg->L;
    c->st.stats.groups = (int)c->ngroups;
}

static void compressor_free(gvqCompressor_t c) {
    c->magic = 0;
    if (c->method != NULL && c->method->destroy != NULL) c->method->destroy(c);
    if (c->have_qsgd) gvq_qsgd_fini(&c->qs);
    gvq_intsum_fini(&c->is_qsgd);
    gvq_intsum_fini(&c->is_gq);
    gvq_gradiveq_fini(&c->gq);
    gvq_compressor_device_free(c);
    free(c->samples);
    free(c->U);
    free(c->Z);
    free(c->work);
    free(c->fuse_buf);
    free(c->ef_input);
    free(c->residual);
    free(c->ef_coef);
    free(c);
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
    c->method = gvq_method_of(&c->cfg);
    lay_out(c);
    c->st.phase = gvqPhasePlain; /* the method's create may start a schedule */
    gvqResult_t res = alloc_buffers(c);
    if (res == gvqSuccess && c->method->create != NULL) res = c->method->create(c);
    if (res == gvqSuccess) res = gvq_comm_attach(comm, c, c, orphan);
    if (res == gvqSuccess && (res = gvq_handles_add(&live, c)) != gvqSuccess)
        gvq_comm_detach(comm, c);
    if (res != gvqSuccess) {
        compressor_free(c);
        return res;
    }
    if (GVQ_LOG_ENABLED(GVQ_LOG_INFO)) c->method->log_created(c, count);
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
    stats->dims = c->method->dims != NULL ? c->method->dims(c) : c->st.d;
    return gvqSuccess;
}
