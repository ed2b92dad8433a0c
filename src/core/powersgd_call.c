/*
 * powersgd_call.c -- one allreduce through a compressor of codec gvqCodecPowersgd (the math is
 * algorithms/powersgd.c; Vogels et al. 2019, as PyTorch's powerSGD_hook):
 *
 *   g --(+ e)--> x --finite on every rank? (agreed)--> M = x as n x m, zero-padded
 *     P = M Q                        Q: the kept warm start, the same on every rank
 *     ring: P = sum over ranks       plain fp32 ring (identity codec) on the comm's context
 *     P_hat = orth(P)                the same on every rank, since P is
 *     Q_n = M^T P_hat                this rank's coefficients
 *     ring: Q' = sum over ranks of Q_n
 *     y = P_hat Q'^T (gvqAvg: / N);  kept Q = Q' / N;  e = M - P_hat Q_n^T, clipped
 * (error_feedback.c)
 *
 * The residual is this rank's own loss, M - P_hat P_hat^T M (Vogels et al.'s local
 * decompression), not PyTorch's M - P_hat (Q'/N)^T: both sum over the ranks to the same global
 * error, but PyTorch's also holds the rank's deviation from the mean gradient, which the clip
 * would cut unevenly across ranks and so break the cancellation of that part in the sum.
 *
 * No filter collocation: the tensor [K][D][H][W] is read as the K x DHW matrix it is, a flat one
 * as ceil(count / R) x R (gvq_powersgd_shape). Host buffers only: device buffers reach this file
 * staged through host memory (gvqAllReduceCompressed); there are no device kernels for
 * PowerSGD. A gradient holding NaN or Inf on any rank (agreed before the first ring) is sent
 * uncompressed on every rank alike (gvq_compressed_nonfinite: the plain sum, counted and logged
 * once; Q and the schedule untouched, the residual dropped).
 */
#include <math.h>
#include <stdlib.h>

#include "gvq_compressor.h"

gvqResult_t gvq_compressed_any_nonfinite(gvqCompressor_t c, gvq_coll_ctx_t *ctx, const float *x,
                                         int32_t *bad) {
    int32_t mine = 0;
    for (size_t i = 0; i < c->cfg.count && !mine; i++)
        mine = !isfinite(x[i]);
    *bad = mine;
    return gvq_agree_i32(ctx, bad, 1, gvqSum);
}

/* The two rings: P summed, orthonormalised, Q_n = M^T P_hat (kept in ps_Q) summed into
 * ps_Qsum. */
static gvqResult_t power_step(gvqCompressor_t c, gvq_coll_ctx_t *ctx) {
    const gvq_device_ops_t *dev = c->comm->dev;
    size_t n = c->ps_n, m = c->ps_m, r = (size_t)c->cfg.prank;
    gvq_codec_t plain;
    gvq_codec_identity_init(&plain, dev, gvqFloat32, gvqSum);
    GVQCHECK(gvq_powersgd_project(dev, c->ps_M, n, m, r, c->ps_Q, c->ps_P));
    GVQCHECK(gvq_ring_allreduce(ctx, &plain, c->ps_P, c->ps_P, n * r, gvqSum));
    gvq_powersgd_orthonormalize(c->ps_P, n, r);
    GVQCHECK(gvq_powersgd_back(dev, c->ps_M, n, m, r, c->ps_P, c->ps_Q));
    memcpy(c->ps_Qsum, c->ps_Q, sizeof(float) * m * r);
    return gvq_ring_allreduce(ctx, &plain, c->ps_Qsum, c->ps_Qsum, m * r, gvqSum);
}

/* This rank's residual e = M - P_hat Q_n^T (its loss in stats.lastLoss; kept with error
 * feedback, clipped against ||g||), the kept Q (Q' / N), then the output P_hat Q'^T into recv. */
static gvqResult_t finish(gvqCompressor_t c, double gnorm, float *recv, gvqRedOp_t op) {
    const gvq_device_ops_t *dev = c->comm->dev;
    size_t n = c->ps_n, m = c->ps_m, r = (size_t)c->cfg.prank, count = c->cfg.count;
    int N = c->comm->nranks;
    double xnorm = gvq_ef_norm(c->ps_M, count);
    GVQCHECK(gvq_powersgd_expand(dev, n, m, r, c->ps_P, c->ps_Q, -1.0f, 1.0f, c->ps_M));
    for (size_t i = 0; i < m * r; i++)
        c->ps_Q[i] = c->ps_Qsum[i] / (float)N;
    c->st.stats.lastLoss = xnorm > 0 ? gvq_ef_norm(c->ps_M, count) / xnorm : 0;
    if (c->cfg.error_feedback) {
        memcpy(c->residual, c->ps_M, sizeof(float) * count);
        gvq_ef_clip(c, gnorm);
    }
    GVQCHECK(gvq_powersgd_expand(dev, n, m, r, c->ps_P, c->ps_Qsum, 1.0f, 0.0f, c->ps_M));
    memcpy(recv, c->ps_M, sizeof(float) * count);
    if (op == gvqAvg) GVQCHECK(dev->divide(recv, count, gvqFloat32, N));
    return gvqSuccess;
}

gvqResult_t gvq_powersgd_allreduce(gvqCompressor_t c, const float *send, float *recv,
                                   gvqRedOp_t op) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    size_t count = cfg->count, nm = c->ps_n * c->ps_m;
    unsigned long long sent = 0;
    gvq_coll_ctx_t ctx = gvq_comm_ctx(c->comm, &sent);
    double gnorm = cfg->error_feedback ? gvq_ef_norm(send, count) : 0;
    const float *x = cfg->error_feedback ? gvq_ef_input(c, send) : send;
    int32_t bad = 0;
    GVQCHECK(gvq_compressed_any_nonfinite(c, &ctx, x, &bad));
    if (bad) return gvq_compressed_nonfinite(c, &ctx, send, recv, op);
    unsigned long long agreed = sent; /* wireBytes counts the two rings */
    memcpy(c->ps_M, x, sizeof(float) * count);
    memset(c->ps_M + count, 0, sizeof(float) * (nm - count)); /* the padding */
    GVQCHECK(power_step(c, &ctx));
    GVQCHECK(finish(c, gnorm, recv, op));
    c->st.stats.ratio = (double)nm / (double)((c->ps_n + c->ps_m) * (size_t)cfg->prank);
    return gvq_compressor_advance(c, &ctx, c->comm->dev, recv, sent - agreed, 0, 0);
}
