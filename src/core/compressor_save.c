/*
 * compressor_save.c -- a compressor's saved state, for checkpoints:
 *
 *   [ header: magic, bytes, resolved config, schedule state, groups ]
 *   [ samples (GradiVeQ: groups x T x sampleSlices x L floats)     ]
 *   [ U (groups x L x d), Z (groups x L)          when d > 0       ]
 *   [ residual (count floats)                     with error feedback ]
 *   [ Q (columns x powerRank floats)              PowerSGD: the warm start ]
 *
 * A load checks the magic, the size and that the config matches the compressor's exactly.
 */
#include <stdlib.h>

#include "gvq_compressor.h"

#define SAVE_MAGIC 0x33524d4351564721ull /* "!GVQCMR3" */

typedef struct {
    uint64_t magic;
    uint64_t bytes;
    gvq_comp_cfg_t cfg;
    gvq_comp_state_t st;
    uint64_t ngroups;
} save_hdr_t;

static size_t samples_bytes(gvqCompressor_t c) {
    return c->samples == NULL ? 0
                              : sizeof(float) * c->ngroups * (size_t)c->cfg.sample *
                                    (size_t)c->cfg.sample_slices * (size_t)c->cfg.L;
}

static size_t basis_bytes(gvqCompressor_t c, size_t d) {
    size_t L = (size_t)c->cfg.L, G = c->ngroups;
    return d > 0 ? sizeof(float) * (G * L * d + G * L) : 0;
}

/* PowerSGD's kept Q (m x r). */
static size_t powersgd_bytes(gvqCompressor_t c) {
    return c->cfg.codec == gvqCodecPowersgd ? sizeof(float) * c->ps_m * (size_t)c->cfg.prank : 0;
}

static size_t save_size(gvqCompressor_t c) {
    return sizeof(save_hdr_t) + samples_bytes(c) + basis_bytes(c, (size_t)c->st.d) +
           (c->cfg.error_feedback ? sizeof(float) * c->cfg.count : 0) + powersgd_bytes(c);
}

GVQ_API gvqResult_t gvqCompressorSave(gvqCompressor_t c, void *buf, size_t *size) {
    if (!gvq_compressor_live(c) || size == NULL) {
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
    if (c->samples != NULL) memcpy(p, c->samples, samples_bytes(c));
    p += samples_bytes(c);
    if (c->st.d > 0) {
        size_t ub = sizeof(float) * c->ngroups * (size_t)c->cfg.L * (size_t)c->st.d;
        memcpy(p, c->U, ub);
        memcpy(p + ub, c->Z, basis_bytes(c, (size_t)c->st.d) - ub);
        p += basis_bytes(c, (size_t)c->st.d);
    }
    if (c->cfg.error_feedback) {
        memcpy(p, c->residual, sizeof(float) * c->cfg.count);
        p += sizeof(float) * c->cfg.count;
    }
    if (powersgd_bytes(c) > 0) memcpy(p, c->ps_Q, powersgd_bytes(c));
    *size = need;
    return gvqSuccess;
}

/* The header of a saved state, checked against c. */
static gvqResult_t check_header(gvqCompressor_t c, const void *buf, size_t size, save_hdr_t *h) {
    if (size < sizeof *h) {
        GVQ_WARN("gvqCompressorLoad: %zu bytes is too short for a saved compressor", size);
        return gvqInvalidArgument;
    }
    memcpy(h, buf, sizeof *h);
    if (h->magic != SAVE_MAGIC || h->bytes != size) {
        GVQ_WARN("gvqCompressorLoad: not a saved compressor state (magic or size %zu wrong)", size);
        return gvqInvalidArgument;
    }
    if (memcmp(&h->cfg, &c->cfg, sizeof h->cfg) != 0 || h->ngroups != c->ngroups) {
        GVQ_WARN("gvqCompressorLoad: the state was saved from a compressor of another count or "
                 "config");
        return gvqInvalidArgument;
    }
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqCompressorLoad(gvqCompressor_t c, const void *buf, size_t size) {
    if (!gvq_compressor_live(c) || buf == NULL) {
        GVQ_WARN("gvqCompressorLoad: %s", buf == NULL ? "buf is NULL" : "not a live compressor");
        return gvqInvalidArgument;
    }
    save_hdr_t h;
    GVQCHECK(check_header(c, buf, size, &h));
    size_t L = (size_t)c->cfg.L, G = c->ngroups, d = (size_t)h.st.d;
    const char *p = (const char *)buf + sizeof h;
    if (c->samples != NULL) memcpy(c->samples, p, samples_bytes(c));
    p += samples_bytes(c);
    if (d > 0) {
        float *U = malloc(sizeof(float) * G * L * d), *Z = malloc(sizeof(float) * G * L);
        if (U == NULL || Z == NULL) {
            free(U), free(Z);
            return gvqSystemError;
        }
        memcpy(U, p, sizeof(float) * G * L * d);
        memcpy(Z, p + sizeof(float) * G * L * d, sizeof(float) * G * L);
        p += basis_bytes(c, d);
        free(c->U), free(c->Z);
        c->U = U, c->Z = Z;
    }
    if (c->cfg.error_feedback) {
        memcpy(c->residual, p, sizeof(float) * c->cfg.count);
        p += sizeof(float) * c->cfg.count;
    }
    if (powersgd_bytes(c) > 0) memcpy(c->ps_Q, p, powersgd_bytes(c));
    c->st = h.st;
    if (d > 0) GVQCHECK(gvq_compressor_codec_setup(c));
    return gvqSuccess;
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
