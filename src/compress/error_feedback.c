/*
 * error_feedback.c -- what a rank's compression dropped, added back to its next gradient, per
 * call and bounded:
 *
 *   call t:   x = g + e                       (gvq_ef_input)
 *             x_hat = the part of x this rank's own contribution keeps through the codec
 *             e = x - x_hat                   (gvq_ef_begin .. ring .. gvq_ef_end;
 *                                              PowerSGD: methods/powersgd.c)
 *             if ||e|| > efBound ||g||:  e *= efBound ||g|| / ||e||    (gvq_ef_clip)
 *
 * x_hat per codec:
 *   identity (exact calls)   x: e = 0
 *   GradiVeQ (compressed)    per full slice U U^T (x - Z/N) + Z/N, the tail exact (computed
 *                            before the ring from the local input; an integer-summed wire's
 *                            rounding of the coefficients is not counted)
 *   QSGD (main or sampling   the ring's own encodes, watched (codec_watch.c wraps the codec): a
 *   codec)                   rank encodes each element once per ring, its own value alone (the
 *                            segment it sends first) or added to the decoded partial sum coming
 *                            from the left; e = (decode(in) + x) - decode(out), what that encode
 *                            dropped, with the very random bits the ring drew. Along a segment
 *                            these errors telescope: sum over ranks of e = sum of x - y, exactly
 *                            the error of the sum, so carrying them keeps the summed result's
 *                            error bounded over calls. (Taking x - decode(encode(x)) of the local
 *                            values alone would count, on every hop segment, an error that was
 *                            never made and miss the one that was: a second random walk as large
 *                            as the one EF removes, and no gain.) Costs two decodes per encode.
 *                            An integer-summed wire adds integers exactly, so there e is just
 *                            this rank's own rounding.
 *   PowerSGD                 P_hat (Q/N)^T, as PyTorch's powerSGD_hook (methods/powersgd.c)
 *
 * Why per call and why the clip. EF-SGD (Karimireddy et al. 2019) and memory SGD (Stich et al.
 * 2018) carry the full residual e_{t+1} = x_t - C(x_t) and prove convergence when C is a
 * delta-contraction, ||C(x) - x||^2 <= (1 - delta) ||x||^2: then the memory stays bounded by a
 * multiple of the gradients. Top-k, scaled sign and QSGD scaled by 1/(1 + variance) are
 * contractions; PowerSGD's warm-started power iteration behaves like one in practice and keeps
 * the full residual (Vogels et al. 2019). GradiVeQ's fixed PCA projector is not: on the
 * orthogonal complement of U it keeps nothing, so a residual there is never sent and grows
 * linearly with the calls while U stays fixed (the earlier scheme carried it over a whole
 * compressed phase and flushed it in one exact call: a spike that hurt training). Bounding the
 * memory, ||e|| <= efBound ||g|| (as in EF variants with bounded or decayed memory), keeps what
 * EF gives a contractive codec -- the residual of one call comes back in the next -- while the
 * part a codec never transmits cannot pile up beyond one gradient's worth. A non-finite residual
 * (from a NaN or Inf gradient) is dropped so that it cannot poison later calls.
 */
#include <math.h>
#include <stdlib.h>

#include "codec_kernels.h"
#include "gvq_compressor.h"

/* 8 lanes of double sums (value i into lane i % 8, lanes added in order): the codec kernels'
 * sumsq8, in vector lanes on every path, the same bits on every rank and CPU. */
double gvq_ef_norm(const float *v, size_t n) {
    return sqrt(gvq_kernels()->sumsq8(v, NULL, n)); /* 8 lanes (codec_kernels.h) */
}

int gvq_ef_prepare(gvqCompressor_t c, const float *g, float *out, double *gnorm, double *xnorm) {
    double gs, xs;
    int ef = c->cfg.error_feedback;
    int finite = gvq_kernels()->ef_prepare(g, ef ? c->residual : NULL, c->cfg.count, out, &gs, &xs);
    *gnorm = ef ? sqrt(gs) : 0;
    *xnorm = sqrt(xs);
    return finite;
}

double gvq_ef_keep(gvqCompressor_t c, const float *e) {
    return sqrt(gvq_kernels()->sumsq8(e, c->cfg.error_feedback ? c->residual : NULL, c->cfg.count));
}

const float *gvq_ef_input(gvqCompressor_t c, const float *g) {
    for (size_t i = 0; i < c->cfg.count; i++)
        c->ef_input[i] = g[i] + c->residual[i];
    return c->ef_input;
}

void gvq_ef_clip(gvqCompressor_t c, double gnorm) {
    gvq_ef_clip_norm(c, gnorm, gvq_ef_norm(c->residual, c->cfg.count));
}

void gvq_ef_clip_norm(gvqCompressor_t c, double gnorm, double e) {
    size_t n = c->cfg.count;
    double cap = (double)c->cfg.ef_bound * gnorm;
    if (!isfinite(e) || !isfinite(cap)) {
        memset(c->residual, 0, sizeof(float) * n);
        return;
    }
    if (e <= cap) return;
    float s = (float)(cap / e);
    for (size_t i = 0; i < n; i++)
        c->residual[i] *= s;
}

/* ---- GradiVeQ: the projection residual of every full slice ------------------------------------
 */

/* v = (I - U U^T)(x_j - Z/N) = x_j - x_hat_j for full slice j of the collocated input. */
static gvqResult_t slice_residual(gvqCompressor_t c, size_t j, const float *xs, float *coef,
                                  float *v) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    const gvq_device_ops_t *dev = c->comm->dev;
    size_t L = (size_t)cfg->L, d = (size_t)c->st.d, g = j / (size_t)cfg->C;
    const float *U = c->U + g * L * d, *Z = c->Z + g * L;
    float n = (float)c->comm->nranks;
    for (size_t i = 0; i < L; i++)
        v[i] = xs[j * L + i] - Z[i] / n;
    GVQCHECK(dev->sgemm(1, 0, (int)d, 1, (int)L, 1.0f, U, (int)L, v, (int)L, 0.0f, coef, (int)d));
    return dev->sgemm(0, 0, (int)L, 1, (int)d, -1.0f, U, (int)L, coef, (int)d, 1.0f, v, (int)L);
}

static gvqResult_t gradiveq_residual(gvqCompressor_t c, const float *xs, float *r) {
    size_t L = (size_t)c->cfg.L, full = c->nfull * L;
    memset(r + full, 0, sizeof(float) * (c->cfg.count - full)); /* the tail travels exactly */
    gvqResult_t res = gvqSuccess; /* c->ef_coef: L floats, made with the compressor (d <= L) */
    for (size_t j = 0; res == gvqSuccess && j < c->nfull; j++)
        res = slice_residual(c, j, xs, c->ef_coef, r + j * L);
    return res;
}

/* ---- one call ---------------------------------------------------------------------------------
 */

gvqResult_t gvq_ef_begin(gvqCompressor_t c, gvq_ef_call_t *ef, const gvq_codec_t *codec,
                         const float *g, const float *src, const gvq_codec_t **ring_codec) {
    memset(ef, 0, sizeof *ef);
    ef->gnorm = gvq_ef_norm(g, c->cfg.count);
    /* the residual in the ring's layout: collocated into ef_input (free once collocated) */
    ef->r = c->collocate ? c->ef_input : c->residual;
    *ring_codec = codec;
    if (codec->wire_is_values) {
        memset(ef->r, 0, sizeof(float) * c->cfg.count);
        return gvqSuccess;
    }
    if (c->st.phase == gvqPhaseCompressed) return gradiveq_residual(c, src, ef->r);
    gvq_codec_watch_init(&ef->watch, codec, ef->r); /* the ring's encodes, watched */
    *ring_codec = &ef->watch.wrap.codec;
    return gvqSuccess;
}

void gvq_ef_end(gvqCompressor_t c, gvq_ef_call_t *ef, int ok) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    if (!ok) /* a failed ring left a partial residual: carry none */
        memset(c->residual, 0, sizeof(float) * cfg->count);
    else if (c->collocate)
        gvq_uncollocate(ef->r, c->residual, (size_t)cfg->K, (size_t)cfg->D, (size_t)cfg->H,
                        (size_t)cfg->W);
    gvq_ef_clip(c, ef->gnorm);
    gvq_codec_watch_fini(&ef->watch);
}

/* ---- a call whose gradient is not finite --------------------------------------------------------
 * What an uncompressed allreduce gives (the sum of the gradients as they came, the NaN where it
 * was fed), counted and logged once per compressor; the residual is dropped (the ring was
 * rewriting it), so that the NaN never reaches a later call. */
gvqResult_t gvq_compressed_nonfinite(gvqCompressor_t c, gvq_coll_ctx_t *ctx, const float *send,
                                     float *recv, gvqRedOp_t op) {
    const gvq_device_ops_t *dev = c->comm->dev;
    if (c->st.stats.nonFiniteCalls++ == 0)
        GVQ_WARN("gvqAllReduceCompressed: tensor %d: the gradient holds NaN or Inf on some rank "
                 "(call %lld); sent again uncompressed, kept out of the residual and the fit "
                 "(logged once; stats.nonFiniteCalls counts them)",
                 c->tensor_index, (long long)c->st.iter);
    if (c->cfg.error_feedback) memset(c->residual, 0, sizeof(float) * c->cfg.count);
    gvq_codec_t plain;
    gvq_codec_identity_init(&plain, dev, gvqFloat32, gvqSum);
    ctx->chunk_bytes = c->comm->chunk_bytes; /* the plain ring's chunks */
    GVQCHECK(gvq_ring_allreduce(ctx, &plain, send, recv, c->cfg.count, gvqSum));
    if (op == gvqAvg) GVQCHECK(dev->divide(recv, c->cfg.count, gvqFloat32, c->comm->nranks));
    return gvqSuccess;
}
