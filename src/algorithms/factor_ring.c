/*
 * factor_ring.c -- what the low-rank methods of one call share when they carry several tensors
 * at once (a group of compressed calls, a zero-code layout): the tracked GradiVeQ basis and
 * PowerSGD (src/compress/methods/) each sum small factor matrices in plain rings, so the factors
 * of all the tensors travel in one ring:
 *
 *   tensor 0: rows0 x cols0    tensor 1: rows1 x cols1  ...     (column-major, in place)
 *   ring buffer:  [ t0 col 0 | t0 col 1 | .. | t1 col 0 | .. ]    one ring, then copied back
 *
 * fp32 sums, or the integer-summed wire (codec_intsum.c) with one shared scale per column,
 * rounded with bits keyed by (seed, rank, call).
 */
#include <stdlib.h>

#include "gvq_algo.h"

gvqResult_t gvq_factor_ring(gvq_coll_ctx_t *ctx, int bits, const gvq_factor_t *f, size_t n,
                            uint32_t seed, uint32_t call) {
    size_t nv = 0, ncol = 0;
    for (size_t i = 0; i < n; i++) {
        nv += f[i].rows * f[i].cols;
        ncol += f[i].cols;
    }
    if (nv == 0) return gvqSuccess;
    float *buf = malloc(sizeof(float) * nv);
    size_t *col_len = malloc(sizeof(size_t) * ncol);
    gvqResult_t res = gvqSuccess;
    if (buf == NULL || col_len == NULL) {
        GVQ_WARN("gvqAllReduceCompressed: out of memory for a ring of %zu factor values", nv);
        res = gvqSystemError;
        goto out;
    }
    for (size_t i = 0, at = 0, c = 0; i < n; i++) {
        memcpy(buf + at, f[i].buf, sizeof(float) * f[i].rows * f[i].cols);
        at += f[i].rows * f[i].cols;
        for (size_t j = 0; j < f[i].cols; j++)
            col_len[c++] = f[i].rows;
    }
    gvq_codec_t codec;
    gvq_intsum_t is = {0};
    if (bits == 0) {
        gvq_codec_identity_init(&codec, ctx->dev, gvqFloat32, gvqSum);
    } else {
        GVQCHECKGOTO(gvq_intsum_init_columns(&is, bits, col_len, ncol, ctx->dev, ctx->xport->nranks,
                                             seed, (uint32_t)ctx->xport->rank),
                     res, out);
        is.call = call;
        gvq_codec_intsum_init(&codec, ctx->dev, &is);
    }
    res = gvq_ring_allreduce(ctx, &codec, buf, buf, nv, gvqSum);
    gvq_intsum_fini(&is);
    for (size_t i = 0, at = 0; i < n && res == gvqSuccess; i++) {
        memcpy(f[i].buf, buf + at, sizeof(float) * f[i].rows * f[i].cols);
        at += f[i].rows * f[i].cols;
    }
out:
    free(buf);
    free(col_len);
    return res;
}
