/*
 * compressor_fit.c -- the fit of a compressor's reuse groups, spread over the ranks, and the
 * GradiVeQ codec state it yields.
 *
 *   rank (t + g) mod N owns group g of tensor t:
 *     owner: PCA fit of the group's samples -> U_g (L x L, first d_g columns kept), Z_g, d_g
 *     all:   agree on (max d_g, any refusal)          (one int32 allreduce)
 *     all:   for each g, chain broadcast of [U_g (first d columns) | Z_g | kept energy] from g's
 *            owner
 *   -> U, Z of every group with the common d; the codec state is rebuilt from them.
 */
#include <stdlib.h>

#include "gvq_compressor.h"

size_t gvq_compressor_group_samples(gvqCompressor_t c, size_t g) {
    size_t C = (size_t)c->cfg.C, cg = GVQ_MIN(C, c->nfull - g * C);
    return GVQ_MIN((size_t)c->cfg.sample_slices, cg);
}

gvqResult_t gvq_compressor_codec_setup(gvqCompressor_t c) {
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
    size_t vbytes = c->cfg.int_bits ? (size_t)c->cfg.int_bits / 8 : c->cfg.fp16 ? 2 : 4;
    size_t tail = c->cfg.count - c->nfull * (size_t)c->cfg.L;
    size_t tail_bytes = tail * (c->cfg.int_bits ? vbytes : 4); /* integer sums carry it too */
    c->st.stats.ratio = (double)(c->cfg.count * sizeof(float)) /
                        (double)(c->nfull * (size_t)c->st.d * vbytes + tail_bytes);
    return gvqSuccess;
}

static int owner_of(gvqCompressor_t c, size_t g) {
    return (c->tensor_index + (int)g) % c->comm->nranks;
}

/* The fits of the groups this rank owns: group g's L x L basis at full + k L L (k counting
 * this rank's groups), its mean at Zall + g L, its kept energy and d. agree = {max d, refused}. */
typedef struct {
    float *full, *Zall, *kept;
    size_t *dg;
    int32_t agree[2];
} fit_work_t;

static gvqResult_t fit_own_groups(gvqCompressor_t c, fit_work_t *w) {
    gvqComm_t comm = c->comm;
    size_t L = (size_t)c->cfg.L, T = (size_t)c->st.nsamples;
    size_t stride = (size_t)c->cfg.sample * (size_t)c->cfg.sample_slices;
    for (size_t g = 0, k = 0; g < c->ngroups; g++) {
        if (owner_of(c, g) != comm->rank) continue;
        double e = 0;
        size_t ng = T * gvq_compressor_group_samples(c, g);
        gvqResult_t fr =
            gvq_pca_fit(comm->dev, L, ng, c->samples + g * stride * L, c->cfg.eps,
                        (size_t)c->cfg.dmax, w->full + k * L * L, w->Zall + g * L, &w->dg[g], &e);
        /* refused: non-finite samples, or finite ones whose covariance overflows so that the
         * eigen-solve fails; every rank learns it in the agreement that follows (an error
         * returned here would leave the other ranks waiting for this rank's broadcast) */
        if (fr == gvqInvalidArgument || fr == gvqInternalError)
            w->agree[1] = 1;
        else if (fr != gvqSuccess)
            return fr;
        w->kept[g] = (float)e;
        w->agree[0] = GVQ_MAX(w->agree[0], (int32_t)w->dg[g]);
        k++;
    }
    return gvqSuccess;
}

/* Every group's first d columns of U and Z from its owner, into U and Z; the mean kept energy
 * into the stats. */
static gvqResult_t broadcast_fits(gvqCompressor_t c, gvq_coll_ctx_t *ctx, const fit_work_t *w,
                                  size_t d, float *U, float *Z) {
    size_t L = (size_t)c->cfg.L, G = c->ngroups;
    float *pack = malloc(sizeof(float) * (L * d + L + 1));
    if (pack == NULL) return gvqSystemError;
    gvqResult_t res = gvqSuccess;
    double kept_sum = 0;
    for (size_t g = 0, k = 0; g < G && res == gvqSuccess; g++) {
        int owner = owner_of(c, g);
        if (owner == c->comm->rank) {
            memcpy(pack, w->full + k * L * L, sizeof(float) * L * d); /* first d of L columns */
            memcpy(pack + L * d, w->Zall + g * L, sizeof(float) * L);
            pack[L * d + L] = w->kept[g];
            k++;
        }
        res = gvq_chain_broadcast(ctx, pack, pack, sizeof(float) * (L * d + L + 1), owner);
        if (res != gvqSuccess) break;
        memcpy(U + g * L * d, pack, sizeof(float) * L * d);
        memcpy(Z + g * L, pack + L * d, sizeof(float) * L);
        kept_sum += pack[L * d + L];
    }
    free(pack);
    c->st.stats.keptEnergy = kept_sum / (double)G;
    return res;
}

/* U, Z of the common d from the owners, then the codec state. */
static gvqResult_t adopt_fits(gvqCompressor_t c, gvq_coll_ctx_t *ctx, const fit_work_t *w,
                              size_t d) {
    size_t L = (size_t)c->cfg.L, G = c->ngroups;
    float *U = malloc(sizeof(float) * L * d * G), *Z = malloc(sizeof(float) * L * G);
    gvqResult_t res = U != NULL && Z != NULL ? gvqSuccess : gvqSystemError;
    if (res == gvqSuccess) res = broadcast_fits(c, ctx, w, d, U, Z);
    if (res != gvqSuccess) {
        free(U), free(Z);
        return res;
    }
    free(c->U);
    free(c->Z);
    c->U = U;
    c->Z = Z;
    c->st.d = (int32_t)d;
    return gvq_compressor_codec_setup(c);
}

gvqResult_t gvq_compressor_fit(gvqCompressor_t c, gvq_coll_ctx_t *ctx, int *ok) {
    size_t L = (size_t)c->cfg.L, G = c->ngroups, mine = 0;
    uint64_t t0 = gvq_now_ns();
    for (size_t g = 0; g < G; g++)
        mine += (size_t)(owner_of(c, g) == c->comm->rank);
    fit_work_t w = {malloc(sizeof(float) * L * L * GVQ_MAX(mine, (size_t)1)),
                    malloc(sizeof(float) * L * G),
                    calloc(G, sizeof(float)),
                    calloc(G, sizeof(size_t)),
                    {1, 0}};
    gvqResult_t res = gvqSuccess;
    if (w.full == NULL || w.Zall == NULL || w.kept == NULL || w.dg == NULL) {
        res = gvqSystemError;
        goto out_free;
    }
    GVQCHECKGOTO(fit_own_groups(c, &w), res, out_free);
    GVQCHECKGOTO(gvq_agree_i32(ctx, w.agree, 2, gvqMax), res, out_free);
    *ok = !w.agree[1];
    if (*ok) res = adopt_fits(c, ctx, &w, (size_t)w.agree[0]);
    if (res != gvqSuccess) *ok = 0;
out_free:
    c->st.stats.fitSeconds = (double)(gvq_now_ns() - t0) / 1e9;
    free(w.full);
    free(w.Zall);
    free(w.kept);
    free(w.dg);
    return res;
}
