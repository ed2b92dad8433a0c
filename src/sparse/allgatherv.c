/*
 * sparse.c -- gvqSparseAllGatherv: argument checks, the count exchange, the transfer (ring or
 * the transport's own allgatherv, GVQ_SPARSE_ALLGATHERV) and the summed union.
 *
 *     rank r: check its rows -> (merge its duplicates unless RAW) -> block [indices | values]
 *     allgather of (status, rows sent, dim, datatype, rows, flags) per rank (gvq_agree_fields)
 *         dim, datatype, rows or flags differ between ranks -> every rank refuses
 *         any status "refused" -> every rank returns (nothing moved)
 *     blocks placed by the counts -> ring allgatherv or MPI_Iallgatherv
 *     every received block checked (indices in range; ascending when merged) -> concatenation
 *     in rank order -> merge (sort by index, sum in rank order) -> *out
 *
 *         rank 0: [i0 i1 | v0 v1]          every rank, after the transfer:
 *         rank 1: [i0 | v0]          -->   [i0 i1 | v0 v1][i0 | v0][i0 i1 i2 | v0 v1 v2]
 *         rank 2: [i0 i1 i2 | v0 v1 v2]     displ[0]        displ[1] displ[2]
 *
 * Blocks are in the row-block layout of gvq_ps_wire.h.
 */
#include <stdio.h>
#include <stdlib.h>

#include "gvq_comm.h"
#include "gvq_ps_wire.h"
#include "gvq_sparse.h"
#include "gvq_stream.h"

typedef struct { /* bytes each array of a gvqSparseRows_t holds */
    size_t indices, values, raw_indices, raw_values, rank_rows;
} rows_capacity_t;

/* What every rank announces before rows move; the last four must be equal on every rank. */
enum { F_STATUS, F_NROWS, F_DIM, F_DATATYPE, F_ROWS, F_FLAGS, NFIELDS };
static const char *const field_names[NFIELDS] = {NULL, NULL, "dim", "datatype", "rows", "flags"};

/* A gvqSparseRows_t made with GVQ_SPARSE_ROWS_INITIALIZER (called what in the WARN). */
static gvqResult_t check_rows_header(const char *fn, const char *what, const gvqSparseRows_t *o) {
    if (o == NULL) {
        GVQ_WARN("%s: %s is NULL", fn, what);
        return gvqInvalidArgument;
    }
    return gvq_config_header_check(fn, what, o->size, o->magic, o->version, GVQ_SPARSE_ROWS_MAGIC,
                                   sizeof(gvqSparseRows_t), sizeof(gvqSparseRows_t),
                                   "GVQ_SPARSE_ROWS_INITIALIZER");
}

GVQ_API gvqResult_t gvqSparseRowsFree(gvqSparseRows_t *o) {
    GVQCHECK(check_rows_header("gvqSparseRowsFree", "rows", o));
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
    GVQCHECK(check_rows_header(fn, "out", out));
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

/* The rows this rank sends: one block, merged unless raw. */
static gvqResult_t pack_own(const gvq_device_ops_t *dev, const int64_t *idx, const void *val,
                            size_t n, size_t dim, gvqDataType_t dtype, int raw, char **block,
                            size_t *nsend) {
    size_t row_bytes = dim * gvq_dtype_size(dtype);
    *block = NULL;
    *nsend = 0;
    if (n == 0) return gvqSuccess;
    char *b = malloc(gvq_wire_block_bytes(n, row_bytes));
    if (b == NULL) {
        GVQ_WARN("gvqSparseAllGatherv: cannot allocate %zu rows", n);
        return gvqSystemError;
    }
    if (raw) {
        gvq_wire_block_pack(b, idx, val, n, row_bytes);
        *nsend = n;
    } else {
        int64_t *merged_idx = malloc(n * sizeof *merged_idx);
        char *merged_val = malloc(n * row_bytes);
        gvqResult_t res = merged_idx && merged_val ? gvq_sparse_merge(dev, dtype, dim, idx, val, n,
                                                                      merged_idx, merged_val, nsend)
                                                   : gvqSystemError;
        if (res == gvqSuccess) gvq_wire_block_pack(b, merged_idx, merged_val, *nsend, row_bytes);
        free(merged_idx);
        free(merged_val);
        if (res != gvqSuccess) {
            free(b);
            return res;
        }
    }
    *block = b;
    return gvqSuccess;
}

/* One call's state once the communicator is entered. */
typedef struct {
    gvqComm_t comm;
    int nranks, rank, raw, refused;
    size_t rows, dim, row_bytes;
    gvqDataType_t dtype;
    int64_t *announced;   /* nranks x NFIELDS: what every rank announced */
    size_t *displ, *blen; /* per rank: its block's offset in blocks and its bytes */
    char *blocks;         /* every rank's block, in rank order */
    size_t total_rows;
    int64_t *gathered_idx; /* every rank's rows, checked, in rank order */
    char *gathered_val;
} gather_t;

static gvqResult_t gather_init(gather_t *g, gvqComm_t c, size_t rows, size_t dim,
                               gvqDataType_t dtype, unsigned flags, int refused) {
    size_t N = (size_t)c->nranks;
    *g = (gather_t){.comm = c,
                    .nranks = c->nranks,
                    .rank = c->rank,
                    .refused = refused,
                    .raw = (flags & GVQ_SPARSE_RAW) != 0,
                    .rows = rows,
                    .dim = dim,
                    .dtype = dtype,
                    .row_bytes = dim * gvq_dtype_size(dtype)};
    g->announced = calloc(N * NFIELDS, sizeof *g->announced);
    g->displ = calloc(N + 1, sizeof *g->displ);
    g->blen = calloc(N, sizeof *g->blen);
    return g->announced && g->displ && g->blen ? gvqSuccess : gvqSystemError;
}

static int64_t field_of(const gather_t *g, int p, int field) {
    return g->announced[(size_t)p * NFIELDS + field];
}

/* A refusal anywhere ends the call everywhere, before any row moves; then every announced count
 * must fit the rows (a merged block holds each row at most once) and the address space. */
static gvqResult_t check_announced(gather_t *g) {
    const char *fn = "gvqSparseAllGatherv";
    size_t block_row = gvq_wire_block_bytes(1, g->row_bytes);
    for (int p = 0; p < g->nranks; p++) {
        if (field_of(g, p, F_STATUS) == 0) continue;
        if (p == g->rank) return gvqInvalidArgument; /* warned by the caller */
        if (!g->refused) {
            GVQ_WARN("%s: rank %d refused its rows (see its log); nothing was gathered", fn, p);
            return gvqRemoteError;
        }
    }
    for (int p = 0; p < g->nranks; p++) {
        int64_t k = field_of(g, p, F_NROWS), status = field_of(g, p, F_STATUS);
        if (status != 0 || k < 0 || (!g->raw && (uint64_t)k > g->rows) ||
            (uint64_t)k > (SIZE_MAX / 2 - g->displ[p]) / block_row) {
            GVQ_WARN("%s: rank %d announced %lld rows (status %lld), impossible for %zu rows", fn,
                     p, (long long)k, (long long)status, g->rows);
            return gvqRemoteError;
        }
        g->blen[p] = (size_t)k * block_row;
        g->displ[p + 1] = g->displ[p] + g->blen[p];
    }
    g->total_rows = g->displ[g->nranks] / block_row;
    return gvqSuccess;
}

/* Every rank's block in place on every rank (this rank's own copied in first): the ring, or the
 * transport's own allgatherv (*native). */
static gvqResult_t transfer_blocks(gather_t *g, gvq_coll_ctx_t *ctx, const char *own,
                                   gvq_sx_bytes_t *bytes, int *native) {
    size_t total = g->displ[g->nranks];
    g->blocks = malloc(GVQ_MAX(total, (size_t)1));
    if (g->blocks == NULL) {
        GVQ_WARN("gvqSparseAllGatherv: cannot allocate %zu bytes for the gathered rows", total);
        return gvqSystemError;
    }
    if (g->blen[g->rank]) memcpy(g->blocks + g->displ[g->rank], own, g->blen[g->rank]);
    *native = gvq_param(GVQ_PARAM_SPARSE_ALLGATHERV) == 1 &&
              gvq_sparse_native_ok(g->comm->xport, g->blen);
    if (*native) return gvq_sparse_native_allgatherv(ctx, g->blocks, g->displ, g->blen, bytes);
    return gvq_sparse_ring_allgatherv(ctx, g->blocks, g->displ, g->blen, bytes);
}

/* Check what arrived (indices in range; ascending when merged), then lay it out in rank order
 * as separate index and value arrays. */
static gvqResult_t unpack_gathered(gather_t *g) {
    const char *fn = "gvqSparseAllGatherv";
    size_t block_row = gvq_wire_block_bytes(1, g->row_bytes);
    g->gathered_idx = malloc(GVQ_MAX(g->total_rows, (size_t)1) * sizeof *g->gathered_idx);
    g->gathered_val = malloc(GVQ_MAX(g->total_rows * g->row_bytes, (size_t)1));
    if (g->gathered_idx == NULL || g->gathered_val == NULL) return gvqSystemError;
    size_t at = 0;
    for (int p = 0; p < g->nranks; p++) {
        size_t k = g->blen[p] / block_row;
        int64_t *idx = g->gathered_idx + at;
        gvq_wire_block_unpack(g->blocks + g->displ[p], k, g->row_bytes, idx,
                              g->gathered_val + at * g->row_bytes);
        size_t bad = gvq_sparse_find_out_of_range(idx, k, g->rows);
        size_t uns = g->raw ? k : gvq_sparse_find_unsorted(idx, k);
        if (bad < k || uns < k) {
            size_t i = bad < k ? bad : uns;
            GVQ_WARN("%s: rank %d's block is malformed: row %zu has index %lld (%s)", fn, p, i,
                     (long long)idx[i],
                     bad < k ? "outside [0, rows)" : "not ascending after its merge");
            return gvqRemoteError;
        }
        at += k;
    }
    return gvqSuccess;
}

/* out's arrays grown to hold the result, then filled: the union (SUMMED), the rows as they
 * came (RAW), the rows per rank. */
static gvqResult_t fill_outputs(const gather_t *g, unsigned flags, gvqSparseRows_t *out) {
    size_t n = g->total_rows, row_bytes = g->row_bytes;
    rows_capacity_t *cap = out->internal;
    if (cap == NULL) {
        cap = calloc(1, sizeof *cap);
        if (cap == NULL) return gvqSystemError;
        out->internal = cap;
    }
    GVQCHECK(grow((void **)&out->rankRows, &cap->rank_rows, (size_t)g->nranks * sizeof(size_t)));
    if (flags & GVQ_SPARSE_SUMMED) {
        GVQCHECK(grow((void **)&out->indices, &cap->indices, n * sizeof *out->indices));
        GVQCHECK(grow(&out->values, &cap->values, n * row_bytes));
        size_t m = 0;
        GVQCHECK(gvq_sparse_merge(g->comm->dev, g->dtype, g->dim, g->gathered_idx, g->gathered_val,
                                  n, out->indices, out->values, &m));
        out->nrows = m;
    } else {
        out->nrows = 0;
    }
    if (g->raw) {
        GVQCHECK(grow((void **)&out->rawIndices, &cap->raw_indices, n * sizeof *out->rawIndices));
        GVQCHECK(grow(&out->rawValues, &cap->raw_values, n * row_bytes));
        memcpy(out->rawIndices, g->gathered_idx, n * sizeof *out->rawIndices);
        memcpy(out->rawValues, g->gathered_val, n * row_bytes);
        out->rawRows = n;
    } else {
        out->rawRows = 0;
    }
    for (int p = 0; p < g->nranks; p++)
        out->rankRows[p] = g->blen[p] / gvq_wire_block_bytes(1, row_bytes);
    out->nranks = g->nranks;
    return gvqSuccess;
}

static gvqResult_t allgatherv_entered(gvqComm_t c, const int64_t *idx, const void *val, size_t n,
                                      size_t rows, size_t dim, gvqDataType_t dtype, unsigned flags,
                                      int refused, gvqSparseRows_t *out) {
    const char *fn = "gvqSparseAllGatherv";
    gather_t g;
    unsigned long long ring_sent = 0;
    gvq_coll_ctx_t ctx = gvq_comm_ctx(c, &ring_sent);
    gvq_sx_bytes_t bytes = {0, 0};
    gvqResult_t res = gvqSuccess;
    char *own = NULL;
    size_t nsend = 0;

    GVQCHECKGOTO(gather_init(&g, c, rows, dim, dtype, flags, refused), res, out_free);
    if (!refused)
        GVQCHECKGOTO(pack_own(c->dev, idx, val, n, dim, dtype, g.raw, &own, &nsend), res, out_free);
    /* (status, rows sent, and the arguments every rank must agree on) */
    int64_t mine[NFIELDS] = {refused,        (int64_t)nsend, (int64_t)dim,
                             (int64_t)dtype, (int64_t)rows,  (int64_t)flags};
    GVQCHECKGOTO(gvq_agree_fields(&ctx, fn, mine, field_names, NFIELDS, g.announced), res,
                 out_free);
    bytes.sent += ring_sent;
    bytes.received += ring_sent; /* the ring receives as much as it sends */
    GVQCHECKGOTO(check_announced(&g), res, out_free);
    int native = 0;
    GVQCHECKGOTO(transfer_blocks(&g, &ctx, own, &bytes, &native), res, out_free);
    GVQCHECKGOTO(unpack_gathered(&g), res, out_free);
    GVQCHECKGOTO(fill_outputs(&g, flags, out), res, out_free);
    out->bytesSent = bytes.sent;
    out->bytesReceived = bytes.received;
    out->algorithm = native;
out_free:
    free(g.gathered_idx);
    free(g.gathered_val);
    /* a native collective abandoned on error may still write into the blocks */
    if (!(res != gvqSuccess && gvq_broken_get(&c->broken) != gvqSuccess &&
          c->xport->cancel_keeps_buffers))
        free(g.blocks);
    free(own);
    free(g.announced);
    free(g.displ);
    free(g.blen);
    return res;
}

typedef struct {
    const int64_t *indices;
    const void *values;
    size_t nrows, rows, dim;
    gvqDataType_t dtype;
    unsigned flags;
    gvqSparseRows_t *out;
    gvqComm_t comm;
} sparse_args_t;

/* The call after the checks that do not read the data: on the caller's thread, or on a host
 * stream's progress thread (the rows are read when the call runs). */
static gvqResult_t sparse_run(const sparse_args_t *a) {
    const char *fn = "gvqSparseAllGatherv";
    /* data checks: a refusal still takes part in the count exchange, so no rank waits */
    int refused = 0;
    if (a->nrows > 0 && (a->indices == NULL || a->values == NULL)) {
        GVQ_WARN("%s: %s is NULL with nrows %zu", fn, a->indices == NULL ? "indices" : "values",
                 a->nrows);
        refused = 1;
    } else {
        size_t bad = gvq_sparse_find_out_of_range(a->indices, a->nrows, a->rows);
        if (bad < a->nrows) {
            GVQ_WARN("%s: indices[%zu] = %lld is outside [0, rows = %zu)", fn, bad,
                     (long long)a->indices[bad], a->rows);
            refused = 1;
        }
    }
    GVQCHECK(gvq_comm_enter(a->comm, fn));
    gvqResult_t res = allgatherv_entered(a->comm, a->indices, a->values, a->nrows, a->rows, a->dim,
                                         a->dtype, a->flags, refused, a->out);
    gvq_comm_leave(a->comm);
    return res; /* a refusal's WARN stays the last: nothing after it warns on this rank */
}

static gvqResult_t sparse_job(void *arg) {
    return sparse_run(arg);
}

GVQ_API gvqResult_t gvqSparseAllGatherv(const int64_t *indices, const void *values, size_t nrows,
                                        size_t rows, size_t dim, gvqDataType_t datatype,
                                        unsigned int flags, gvqSparseRows_t *out, gvqComm_t comm,
                                        gvqStream_t stream) {
    GVQCHECK(check_args(rows, dim, datatype, flags, out, comm));
    sparse_args_t a = {
        indices, values, nrows, rows, dim, datatype, flags == 0 ? GVQ_SPARSE_SUMMED : flags,
        out,     comm};
    if (!gvq_stream_is_host(stream)) return sparse_run(&a);
    sparse_args_t *copy = malloc(sizeof *copy);
    if (copy == NULL) {
        GVQ_WARN("gvqSparseAllGatherv: out of memory queueing the call on stream %p", stream);
        return gvqSystemError;
    }
    *copy = a;
    return gvq_stream_enqueue(stream, "gvqSparseAllGatherv", &comm, 1, sparse_job, free, copy);
}
