/*
 * gradiveq_track.c -- one allreduce through a GradiVeQ compressor whose basis is tracked
 * (basisUpdate gvqBasisTrack): GradiVeQ's compression (slices of L values projected on a basis
 * U that every rank shares, the coefficients summed inside the ring) with the PCA of the summed
 * slices found by a streaming block power iteration, one step per call, instead of sampling
 * phases of exact sums and eigen-solves (the paper). The products are algorithms/powersgd.c's.
 *
 *   g --(+ e)--> x --finite on every rank? (agreed)--> collocated, as GradiVeQ's ring input
 *     S_n = x as nslices x L rows, the tail zero-padded; S = sum over the ranks of S_n
 *     ring 1: C0 = sum S_n U                       nslices x d, U the kept basis
 *     ring 2: B = sum S_n^T C0 = S^T S U           L x d
 *     U <- orth(B)             one power iteration on the covariance of the summed slices
 *                              (what the paper's PCA fits), warm-started from the kept U; the
 *                              same on every rank, since B is
 *     C_n = S_n U              this rank's coefficients on the new basis
 *     e_n = S_n - C_n U^T      this rank's loss; kept with error feedback (clipped, in tensor
 *                              order: error_feedback.c)
 *     ring 3: C = sum C_n                          nslices x d
 *     y = C U^T (gvqAvg: / N), uncollocated        ~ S projected on U
 *
 * Three rings of (2 nslices + L) d values in all: fp32 sums, or with integerBits 8 or 16 the
 * integer-summed wire (codec_intsum.c) with one shared scale per column of C0, B and C (the
 * columns are contiguous: the products are column-major), agreed by a max-allreduce before
 * each ring; its rounding is stochastic (unbiased) and, like a plain ring's, the same on every
 * rank. Rings 1-2 are one PowerSGD step on
 * the slice matrix; what stays GradiVeQ's is the output: every slice projected on one shared
 * basis of slice space, its coefficients summed. Why a power iteration: on small-batch
 * gradients the samples of a sampling phase are noise-dominated and a PCA fit of them keeps
 * most of the L dimensions (perf/RESULTS.md section 6), while a few tracked directions plus
 * error feedback carry what matters. Two cheaper variants measured worse on the ResNet (RESULTS
 * section 6): the pooled covariance sum S_n^T S_n U in one ring (N times noisier), and that
 * ring riding with the previous call's coefficients (the basis one call late).
 * Host buffers only (device buffers are staged by gvqAllReduceCompressed). A gradient holding
 * NaN or Inf on any rank is sent uncompressed on every rank alike (gvq_compressed_nonfinite; U
 * untouched, residual dropped).
 */
#include <math.h>
#include <stdlib.h>

#include "gvq_compressor.h"

/* x (count floats, tensor order) into the slice matrix S = ps_M, in GradiVeQ's collocated
 * order; the padding zeroed. */
static void fill_slices(gvqCompressor_t c, const float *x) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    size_t count = cfg->count, nm = c->ps_n * c->ps_m;
    if (c->collocate)
        gvq_collocate(x, c->ps_M, (size_t)cfg->K, (size_t)cfg->D, (size_t)cfg->H, (size_t)cfg->W);
    else
        memcpy(c->ps_M, x, sizeof(float) * count);
    memset(c->ps_M + count, 0, sizeof(float) * (nm - count));
}

/* count floats of the slice matrix back into tensor order. */
static void empty_slices(gvqCompressor_t c, float *out) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    if (c->collocate)
        gvq_uncollocate(c->ps_M, out, (size_t)cfg->K, (size_t)cfg->D, (size_t)cfg->H,
                        (size_t)cfg->W);
    else
        memcpy(out, c->ps_M, sizeof(float) * cfg->count);
}

/* Ring k (1-3) of the call: the sum of `rows` x d values (column-major) in place, plain fp32
 * or on the integer-summed wire with a scale per column; k keys the rounding bits apart. */
static gvqResult_t track_ring(gvqCompressor_t c, gvq_coll_ctx_t *ctx, int k, float *buf,
                              size_t rows) {
    size_t nv = rows * (size_t)c->cfg.dmax;
    gvq_codec_t codec;
    if (c->cfg.int_bits == 0) {
        gvq_codec_identity_init(&codec, c->comm->dev, gvqFloat32, gvqSum);
        return gvq_ring_allreduce(ctx, &codec, buf, buf, nv, gvqSum);
    }
    gvq_intsum_t *s = k == 2 ? &c->is_basis : &c->is_coef;
    if (s->bits == 0)
        GVQCHECK(gvq_intsum_init(s, c->cfg.int_bits, 0, rows, NULL, c->comm->dev, nv,
                                 c->comm->nranks, (uint32_t)c->cfg.seed, (uint32_t)c->comm->rank));
    s->call = (uint32_t)(c->st.iter * 3 + (uint64_t)k);
    gvq_codec_intsum_init(&codec, c->comm->dev, s);
    return gvq_ring_allreduce(ctx, &codec, buf, buf, nv, gvqSum);
}

/* The new basis: C0 = sum S_n U (ring 1), B = sum S_n^T C0 (ring 2), U = orth(B). */
static gvqResult_t track_basis(gvqCompressor_t c, gvq_coll_ctx_t *ctx) {
    const gvq_device_ops_t *dev = c->comm->dev;
    size_t n = c->ps_n, L = c->ps_m, d = (size_t)c->cfg.dmax;
    float *C0 = c->ps_P, *B = c->ps_P + n * d;
    GVQCHECK(gvq_powersgd_project(dev, c->ps_M, n, L, d, c->ps_Q, C0));
    GVQCHECK(track_ring(c, ctx, 1, C0, n));
    GVQCHECK(gvq_powersgd_back(dev, c->ps_M, n, L, d, C0, B));
    GVQCHECK(track_ring(c, ctx, 2, B, L));
    memcpy(c->ps_Q, B, sizeof(float) * L * d);
    gvq_powersgd_orthonormalize(c->ps_Q, L, d);
    return gvqSuccess;
}

/* C_n = S_n U (U the new basis) into the ring's buffer, then S_n - C_n U^T left in ps_M. */
static gvqResult_t encode(gvqCompressor_t c) {
    const gvq_device_ops_t *dev = c->comm->dev;
    size_t n = c->ps_n, L = c->ps_m, d = (size_t)c->cfg.dmax;
    GVQCHECK(gvq_powersgd_project(dev, c->ps_M, n, L, d, c->ps_Q, c->ps_P));
    return gvq_powersgd_expand(dev, n, L, d, c->ps_P, c->ps_Q, -1.0f, 1.0f, c->ps_M);
}

/* This rank's loss (stats.lastLoss) and, with error feedback, its residual. */
static void keep_residual(gvqCompressor_t c, double xnorm, double gnorm) {
    double rnorm = gvq_ef_norm(c->ps_M, c->ps_n * c->ps_m);
    c->st.stats.lastLoss = xnorm > 0 ? rnorm / xnorm : 0;
    if (!c->cfg.error_feedback) return;
    empty_slices(c, c->residual);
    gvq_ef_clip(c, gnorm);
}

/* y = C U^T into recv. */
static gvqResult_t decode(gvqCompressor_t c, float *recv, gvqRedOp_t op) {
    const gvq_device_ops_t *dev = c->comm->dev;
    size_t n = c->ps_n, L = c->ps_m, d = (size_t)c->cfg.dmax;
    GVQCHECK(gvq_powersgd_expand(dev, n, L, d, c->ps_P, c->ps_Q, 1.0f, 0.0f, c->ps_M));
    empty_slices(c, recv);
    if (op == gvqAvg) GVQCHECK(dev->divide(recv, c->cfg.count, gvqFloat32, c->comm->nranks));
    return gvqSuccess;
}

gvqResult_t gvq_gradiveq_track_allreduce(gvqCompressor_t c, const float *send, float *recv,
                                         gvqRedOp_t op) {
    const gvq_comp_cfg_t *cfg = &c->cfg;
    size_t count = cfg->count, n = c->ps_n, L = c->ps_m;
    unsigned long long sent = 0;
    gvq_coll_ctx_t ctx = gvq_comm_ctx(c->comm, &sent);
    gvq_codec_t plain;
    gvq_codec_identity_init(&plain, c->comm->dev, gvqFloat32, gvqSum);
    if (c->track_plain) { /* the basis would cost more than the tensor: the exact sum */
        GVQCHECK(gvq_ring_allreduce(&ctx, &plain, send, recv, count, gvqSum));
        if (op == gvqAvg) GVQCHECK(c->comm->dev->divide(recv, count, gvqFloat32, c->comm->nranks));
        return gvq_compressor_advance(c, &ctx, c->comm->dev, recv, sent, 0, 0);
    }
    double gnorm = cfg->error_feedback ? gvq_ef_norm(send, count) : 0;
    const float *x = cfg->error_feedback ? gvq_ef_input(c, send) : send;
    int32_t bad = 0;
    GVQCHECK(gvq_compressed_any_nonfinite(c, &ctx, x, &bad));
    if (bad) return gvq_compressed_nonfinite(c, &ctx, send, recv, op);
    unsigned long long agreed = sent; /* wireBytes counts the three rings */
    fill_slices(c, x);
    double xnorm = gvq_ef_norm(c->ps_M, n * L);
    GVQCHECK(track_basis(c, &ctx));
    GVQCHECK(encode(c));
    keep_residual(c, xnorm, gnorm);
    GVQCHECK(track_ring(c, &ctx, 3, c->ps_P, n));
    GVQCHECK(decode(c, recv, op));
    return gvq_compressor_advance(c, &ctx, c->comm->dev, recv, sent - agreed, 0, 0);
}
