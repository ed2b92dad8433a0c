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
 * rounded with bits keyed by (seed, rank, call). With ctx->hier set (the caller's choice: the
 * compressed calls' GVQ_ALGO=hier) the sum is hierarchical (hier.c): fp32 inside each host,
 * the integer wire only between the hosts, its headroom that of H summands. The ring buffer and
 * the integer wire's state
 * live in a workspace the caller keeps (gvq_factor_ws_t), so a call allocates nothing once the
 * sizes have been seen.
 */
#include <stdlib.h>
#include <string.h>

#include "gvq_algo.h"

void gvq_factor_ws_fini(gvq_factor_ws_t *ws) {
    if (ws == NULL) return;
    free(ws->buf);
    free(ws->col_len);
    gvq_intsum_fini(&ws->is);
    memset(ws, 0, sizeof *ws);
}

/* Room for nv values and ncol column lengths. */
static gvqResult_t ws_grow(gvq_factor_ws_t *ws, size_t nv, size_t ncol) {
    if (nv > ws->cap) {
        float *b = realloc(ws->buf, sizeof(float) * nv);
        if (b == NULL) return gvqSystemError;
        ws->buf = b;
        ws->cap = nv;
    }
    if (ncol > ws->ccap) {
        size_t *c = realloc(ws->col_len, sizeof(size_t) * ncol);
        if (c == NULL) return gvqSystemError;
        ws->col_len = c;
        ws->ccap = ncol;
    }
    return gvqSuccess;
}

/* The integer wire of these columns: the kept one when nothing it depends on changed. */
static gvqResult_t ws_intsum(gvq_factor_ws_t *ws, gvq_coll_ctx_t *ctx, int bits, size_t ncol,
                             uint32_t seed, int same_cols) {
    uint32_t rank = (uint32_t)ctx->xport->rank;
    int nranks = ctx->hier != NULL ? ctx->hier->nhosts : ctx->xport->nranks; /* the summands */
    if (ws->is.bits == bits && same_cols && ws->is_nranks == nranks && ws->is_seed == seed &&
        ws->is_rank == rank)
        return gvqSuccess;
    gvq_intsum_fini(&ws->is);
    GVQCHECK(gvq_intsum_init_columns(&ws->is, bits, ws->col_len, ncol, nranks, seed, rank));
    ws->is_nranks = nranks;
    ws->is_seed = seed;
    ws->is_rank = rank;
    return gvqSuccess;
}

/* The sum over the hosts of ring j (this rank's local index): the scales agreed over every rank
 * first (codec.begin is collective over ctx), then ring j alone. */
static gvqResult_t sum_across(gvq_coll_ctx_t *ctx, const gvq_codec_t *codec, float *buf,
                              size_t nv) {
    const gvq_hier_t *h = ctx->hier;
    if (codec->begin != NULL) GVQCHECK(codec->begin(codec, ctx, buf, nv));
    if (nv == 0) return gvqSuccess; /* every member of ring j has the same shapes */
    size_t *off = h->scratch->off + h->per_host + 1; /* H + 1 boundaries, as hier.c's stage 2 */
    gvq_ring_partition(off, h->nhosts, nv, codec->granule);
    gvq_subring_t cross = {h->cross, h->nhosts, off};
    return gvq_subring_allreduce(ctx, &cross, codec, buf, buf);
}

static gvqResult_t factor_ring_ws(gvq_coll_ctx_t *ctx, int bits, const gvq_factor_t *f, size_t n,
                                  uint32_t seed, uint32_t call, gvq_factor_ws_t *ws, int across) {
    size_t nv = 0, ncol = 0;
    for (size_t i = 0; i < n; i++) {
        nv += f[i].rows * f[i].cols;
        ncol += f[i].cols;
    }
    across = across && ctx->hier != NULL;
    if (nv == 0 && !(across && bits != 0)) return gvqSuccess; /* across: the scales' agreement */
    if (ws_grow(ws, GVQ_MAX(nv, (size_t)1), ncol) != gvqSuccess) {
        GVQ_WARN("gvqAllReduceCompressed: out of memory for a ring of %zu factor values", nv);
        return gvqSystemError;
    }
    int same_cols = ws->ncol == ncol;
    for (size_t i = 0, at = 0, c = 0; i < n; i++) {
        memcpy(ws->buf + at, f[i].buf, sizeof(float) * f[i].rows * f[i].cols);
        at += f[i].rows * f[i].cols;
        for (size_t j = 0; j < f[i].cols; j++, c++) {
            same_cols &= ws->col_len[c] == f[i].rows;
            ws->col_len[c] = f[i].rows;
        }
    }
    ws->ncol = ncol;
    gvq_codec_t codec;
    if (bits == 0) {
        gvq_codec_identity_init(&codec, ctx->dev, gvqFloat32, gvqSum);
    } else {
        gvqResult_t r = ws_intsum(ws, ctx, bits, ncol, seed, same_cols);
        if (r != gvqSuccess) {
            ws->ncol = 0; /* make it again next time */
            return r;
        }
        ws->is.call = call;
        gvq_codec_intsum_init(&codec, ctx->dev, &ws->is);
    }
    if (across)
        GVQCHECK(sum_across(ctx, &codec, ws->buf, nv));
    else if (ctx->hier != NULL)
        GVQCHECK(gvq_hier_allreduce(ctx, &codec, ws->buf, ws->buf, nv, gvqSum));
    else
        GVQCHECK(gvq_ring_allreduce(ctx, &codec, ws->buf, ws->buf, nv, gvqSum));
    for (size_t i = 0, at = 0; i < n; i++) {
        memcpy(f[i].buf, ws->buf + at, sizeof(float) * f[i].rows * f[i].cols);
        at += f[i].rows * f[i].cols;
    }
    return gvqSuccess;
}

static gvqResult_t factor_ring_any(gvq_coll_ctx_t *ctx, int bits, const gvq_factor_t *f, size_t n,
                                   uint32_t seed, uint32_t call, gvq_factor_ws_t *ws, int across) {
    if (ws != NULL) return factor_ring_ws(ctx, bits, f, n, seed, call, ws, across);
    gvq_factor_ws_t tmp = {0};
    gvqResult_t res = factor_ring_ws(ctx, bits, f, n, seed, call, &tmp, across);
    gvq_factor_ws_fini(&tmp);
    return res;
}

gvqResult_t gvq_factor_ring(gvq_coll_ctx_t *ctx, int bits, const gvq_factor_t *f, size_t n,
                            uint32_t seed, uint32_t call, gvq_factor_ws_t *ws) {
    return factor_ring_any(ctx, bits, f, n, seed, call, ws, 0);
}

gvqResult_t gvq_factor_ring_across(gvq_coll_ctx_t *ctx, int bits, const gvq_factor_t *f, size_t n,
                                   uint32_t seed, uint32_t call, gvq_factor_ws_t *ws) {
    return factor_ring_any(ctx, bits, f, n, seed, call, ws, 1);
}
