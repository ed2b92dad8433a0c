/*
 * sparse.c -- gvqSparseAllGatherv: argument checks, the count exchange, the transfer (ring or
 * the transport's own allgatherv, GVQ_SPARSE_ALLGATHERV) and the summed union.
 *
 *     rank r: check its rows -> (merge its duplicates unless RAW) -> block [indices | values]
 *     allgather of (status, rows) per rank (gvq's ring, 16 bytes each)
 *         any status "refused" -> every rank returns (nothing moved)
 *     blocks placed by the counts -> ring allgatherv or MPI_Iallgatherv
 *     every received block checked (indices in range; ascending when merged) -> concatenation
 *     in rank order -> merge (sort by index, sum in rank order) -> *out
 */
#include <stdio.h>
#include <stdlib.h>

#include "gvq_comm.h"
#include "gvq_sparse.h"

typedef struct { /* bytes each array of a gvqSparseRows_t holds */
    size_t indices, values, raw_indices, raw_values, rank_rows;
} rows_internal_t;

static int rows_valid(const gvqSparseRows_t *o) {
    return o != NULL && o->magic == GVQ_SPARSE_ROWS_MAGIC && o->size == sizeof(gvqSparseRows_t);
}

GVQ_API gvqResult_t gvqSparseRowsFree(gvqSparseRows_t *o) {
    if (!rows_valid(o)) {
        GVQ_WARN("gvqSparseRowsFree: rows is %s", o == NULL ? "NULL"
                                                            : "not made with "
                                                              "GVQ_SPARSE_ROWS_INITIALIZER");
        return gvqInvalidArgument;
    }
    free(o->indices);
    free(o->values);
    free(o->rawIndices);
    free(o->rawValues);
    free(o->rankRows);
    free(o->internal);
    gvqSparseRows_t init = GVQ_SPARSE_ROWS_INITIALIZER;
    *o = init;
    return gvqSuccess;
}

/* Grow *p to hold `bytes` (contents kept); *cap is what it holds. */
static gvqResult_t grow(void **p, size_t *cap, size_t bytes) {
    if (bytes <= *cap && *p != NULL) return gvqSuccess;
    size_t want = GVQ_MAX(bytes, (size_t)64);
    void *q = realloc(*p, want);
    if (q == NULL) {
        GVQ_WARN("gvqSparseAllGatherv: cannot allocate %zu bytes for the result", want);
        return gvqSystemError;
    }
    *p = q;
    *cap = want;
    return gvqSuccess;
}

/* The checks that do not depend on the data: the same on every rank, so refusing at once
 * keeps the ranks in step (as the other collectives do). */
static gvqResult_t check_args(size_t rows, size_t dim, gvqDataType_t dtype, unsigned flags,
                              const gvqSparseRows_t *out, gvqComm_t comm) {
    const char *fn = "gvqSparseAllGatherv";
    GVQCHECK(gvq_comm_check(comm, fn, 1));
    if (!rows_valid(out)) {
        GVQ_WARN("%s: out is %s", fn,
                 out == NULL ? "NULL" : "not made with GVQ_SPARSE_ROWS_INITIALIZER");
        return gvqInvalidArgument;
    }
    if (!gvq_dtype_valid((int)dtype)) {
        GVQ_WARN("%s: invalid datatype %d", fn, (int)dtype);
        return gvqInvalidArgument;
    }
    if (flags > (GVQ_SPARSE_SUMMED | GVQ_SPARSE_RAW)) {
        GVQ_WARN("%s: flags 0x%x: only GVQ_SPARSE_SUMMED and GVQ_SPARSE_RAW exist", fn, flags);
        return gvqInvalidArgument;
    }
    if (dim == 0 || dim > ((size_t)1 << 40) / gvq_dtype_size(dtype)) {
        GVQ_WARN("%s: dim %zu is %s", fn, dim, dim == 0 ? "0" : "too large");
        return gvqInvalidArgument;
    }
    if (rows == 0 || rows > (size_t)INT64_MAX) {
        GVQ_WARN("%s: rows %zu is outside [1, 2^63)", fn, rows);
        return gvqInvalidArgument;
    }
    return gvqSuccess;
}

/* The rows this rank sends: a block [indices | values], merged unless raw. */
static gvqResult_t pack_own(const gvq_device_ops_t *dev, const int64_t *idx, const void *val,
                            size_t n, size_t dim, gvqDataType_t dtype, int raw, char **block,
                            size_t *nsend) {
    size_t rb = dim * gvq_dtype_size(dtype);
    *block = NULL;
    *nsend = 0;
    if (n == 0) return gvqSuccess;
    char *b = malloc(n * (8 + rb));
    if (b == NULL) {
        GVQ_WARN("gvqSparseAllGatherv: cannot allocate %zu rows", n);
        return gvqSystemError;
    }
    if (raw) {
        memcpy(b, idx, n * 8);
        memcpy(b + n * 8, val, n * rb);
        *nsend = n;
    } else {
        int64_t *mi = malloc(n * 8);
        char *mv = malloc(n * rb);
        gvqResult_t res = mi && mv ? gvq_sparse_merge(dev, dtype, dim, idx, val, n, mi, mv, nsend)
                                   : gvqSystemError;
        if (res == gvqSuccess) {
            memcpy(b, mi, *nsend * 8);
            memcpy(b + *nsend * 8, mv, *nsend * rb);
        }
        free(mi);
        free(mv);
        if (res != gvqSuccess) {
            free(b);
            return res;
        }
    }
    *block = b;
    return gvqSuccess;
}

static gvqResult_t allgatherv_entered(gvqComm_t c, const int64_t *idx, const void *val, size_t n,
                                      size_t rows, size_t dim, gvqDataType_t dtype,
                                      unsigned flags, int refused, gvqSparseRows_t *out) {
    const char *fn = "gvqSparseAllGatherv";
    int N = c->nranks, r = c->rank, raw = (flags & GVQ_SPARSE_RAW) != 0;
    int summed = (flags & GVQ_SPARSE_SUMMED) != 0;
    size_t rb = dim * gvq_dtype_size(dtype), rowb = 8 + rb;
    unsigned long long ring_sent = 0;
    gvq_coll_ctx_t ctx = {c->xport, c->dev, c->chunk_bytes, &c->scratch, &c->scratch_bytes,
                          &ring_sent};
    gvq_sx_bytes_t bytes = {0, 0};
    gvqResult_t res = gvqSuccess;
    char *own = NULL, *all = NULL;
    int64_t *cat_idx = NULL, (*counts)[6] = NULL;
    char *cat_val = NULL;
    size_t *displ = NULL, *blen = NULL, nsend = 0;

    if (!refused) GVQCHECK(pack_own(c->dev, idx, val, n, dim, dtype, raw, &own, &nsend));
    /* (status, rows sent, and the arguments every rank must agree on) */
    int64_t mine[6] = {refused, (int64_t)nsend, (int64_t)dim, (int64_t)dtype, (int64_t)rows,
                       (int64_t)flags};
    counts = calloc((size_t)N, sizeof *counts);
    displ = calloc((size_t)N + 1, sizeof *displ);
    blen = calloc((size_t)N, sizeof *blen);
    if (counts == NULL || displ == NULL || blen == NULL) {
        res = gvqSystemError;
        goto out_free;
    }
    GVQCHECKGOTO(gvq_ring_allgather(&ctx, mine, counts, 6, gvqInt64), res, out_free);
    bytes.sent += ring_sent;
    bytes.received += ring_sent; /* the ring receives as much as it sends */
    /* arguments that differ between ranks: every rank refuses alike */
    for (int p = 0; p < N; p++) {
        static const char *const what[6] = {"", "", "dim", "datatype", "rows", "flags"};
        for (int f = 2; f < 6; f++)
            if (counts[p][f] != mine[f]) {
                GVQ_WARN("%s: rank %d passed %s %lld, this rank %lld (must be equal on every rank)",
                         fn, p, what[f], (long long)counts[p][f], (long long)mine[f]);
                res = gvqInvalidArgument;
                goto out_free;
            }
    }
    /* a refusal anywhere ends the call everywhere, before any row moves */
    for (int p = 0; p < N; p++) {
        if (counts[p][0] == 0) continue;
        if (p == r) {
            res = gvqInvalidArgument; /* warned by the caller */
        } else if (!refused) {
            GVQ_WARN("%s: rank %d refused its rows (see its log); nothing was gathered", fn, p);
            res = gvqRemoteError;
        }
        if (res != gvqSuccess) goto out_free;
    }
    for (int p = 0; p < N; p++) {
        int64_t k = counts[p][1];
        /* a merged block holds each row at most once */
        if (counts[p][0] != 0 || k < 0 || (!raw && (uint64_t)k > rows) ||
            (uint64_t)k > (SIZE_MAX / 2 - displ[p]) / rowb) {
            GVQ_WARN("%s: rank %d announced %lld rows (status %lld), impossible for %zu rows",
                     fn, p, (long long)k, (long long)counts[p][0], rows);
            res = gvqRemoteError;
            goto out_free;
        }
        blen[p] = (size_t)k * rowb;
        displ[p + 1] = displ[p] + blen[p];
    }
    size_t total_rows = displ[N] / rowb;
    all = malloc(GVQ_MAX(displ[N], (size_t)1));
    if (all == NULL) {
        GVQ_WARN("%s: cannot allocate %zu bytes for the gathered rows", fn, displ[N]);
        res = gvqSystemError;
        goto out_free;
    }
    if (blen[r]) memcpy(all + displ[r], own, blen[r]);
    int native = gvq_param(GVQ_PARAM_SPARSE_ALLGATHERV) == 1 && gvq_sparse_native_ok(c->xport, blen);
    if (native)
        GVQCHECKGOTO(gvq_sparse_native_allgatherv(&ctx, all, displ, blen, &bytes), res, out_free);
    else
        GVQCHECKGOTO(gvq_sparse_ring_allgatherv(&ctx, all, displ, blen, &bytes), res, out_free);
    /* check what arrived, then lay it out in rank order */
    cat_idx = malloc(GVQ_MAX(total_rows, (size_t)1) * 8);
    cat_val = malloc(GVQ_MAX(total_rows * rb, (size_t)1));
    if (cat_idx == NULL || cat_val == NULL) {
        res = gvqSystemError;
        goto out_free;
    }
    for (int p = 0, at = 0; p < N; p++) {
        size_t k = blen[p] / rowb;
        const char *b = all + displ[p];
        memcpy(cat_idx + at, b, k * 8);
        memcpy(cat_val + (size_t)at * rb, b + k * 8, k * rb);
        size_t bad = gvq_sparse_find_out_of_range(cat_idx + at, k, rows);
        size_t uns = raw ? k : gvq_sparse_find_unsorted(cat_idx + at, k);
        if (bad < k || uns < k) {
            size_t i = bad < k ? bad : uns;
            GVQ_WARN("%s: rank %d's block is malformed: row %zu has index %lld (%s)", fn, p, i,
                     (long long)cat_idx[at + i],
                     bad < k ? "outside [0, rows)" : "not ascending after its merge");
            res = gvqRemoteError;
            goto out_free;
        }
        at += (int)k;
    }
    /* outputs: grow, then fill */
    rows_internal_t *in = out->internal;
    if (in == NULL) {
        in = calloc(1, sizeof *in);
        if (in == NULL) {
            res = gvqSystemError;
            goto out_free;
        }
        out->internal = in;
    }
    GVQCHECKGOTO(grow((void **)&out->rankRows, &in->rank_rows, (size_t)N * sizeof(size_t)), res,
                 out_free);
    if (summed) {
        GVQCHECKGOTO(grow((void **)&out->indices, &in->indices, total_rows * 8), res, out_free);
        GVQCHECKGOTO(grow(&out->values, &in->values, total_rows * rb), res, out_free);
        size_t m = 0;
        GVQCHECKGOTO(gvq_sparse_merge(c->dev, dtype, dim, cat_idx, cat_val, total_rows,
                                      out->indices, out->values, &m),
                     res, out_free);
        out->nrows = m;
    } else {
        out->nrows = 0;
    }
    if (raw) {
        GVQCHECKGOTO(grow((void **)&out->rawIndices, &in->raw_indices, total_rows * 8), res,
                     out_free);
        GVQCHECKGOTO(grow(&out->rawValues, &in->raw_values, total_rows * rb), res, out_free);
        memcpy(out->rawIndices, cat_idx, total_rows * 8);
        memcpy(out->rawValues, cat_val, total_rows * rb);
        out->rawRows = total_rows;
    } else {
        out->rawRows = 0;
    }
    for (int p = 0; p < N; p++) out->rankRows[p] = blen[p] / rowb;
    out->nranks = N;
    out->bytesSent = bytes.sent;
    out->bytesReceived = bytes.received;
    out->algorithm = native;
out_free:
    free(cat_idx);
    free(cat_val);
    /* a native collective abandoned on error may still write into `all` */
    if (!(res != gvqSuccess && c->broken != gvqSuccess && c->xport->cancel_keeps_buffers)) free(all);
    free(own);
    free(counts);
    free(displ);
    free(blen);
    return res;
}

GVQ_API gvqResult_t gvqSparseAllGatherv(const int64_t *indices, const void *values, size_t nrows,
                                        size_t rows, size_t dim, gvqDataType_t datatype,
                                        unsigned int flags, gvqSparseRows_t *out, gvqComm_t comm,
                                        gvqStream_t stream) {
    const char *fn = "gvqSparseAllGatherv";
    (void)stream;
    GVQCHECK(check_args(rows, dim, datatype, flags, out, comm));
    if (flags == 0) flags = GVQ_SPARSE_SUMMED;
    /* data checks: a refusal still takes part in the count exchange, so no rank waits */
    int refused = 0;
    if (nrows > 0 && (indices == NULL || values == NULL)) {
        GVQ_WARN("%s: %s is NULL with nrows %zu", fn, indices == NULL ? "indices" : "values",
                 nrows);
        refused = 1;
    } else {
        size_t bad = gvq_sparse_find_out_of_range(indices, nrows, rows);
        if (bad < nrows) {
            GVQ_WARN("%s: indices[%zu] = %lld is outside [0, rows = %zu)", fn, bad,
                     (long long)indices[bad], rows);
            refused = 1;
        }
    }
    GVQCHECK(gvq_comm_enter(comm, fn));
    gvqResult_t res =
        allgatherv_entered(comm, indices, values, nrows, rows, dim, datatype, flags, refused, out);
    gvq_comm_leave(comm);
    return res; /* a refusal's WARN stays the last: nothing after it warns on this rank */
}
