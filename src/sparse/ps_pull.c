/*
 * ps_pull.c -- gvqPsPull (docs/ALGORITHMS.md section 4): the rows of the caller's indices, from the
 * ranks that hold them.
 *
 *   caller's indices -> unique, ascending -> bucketed by owner (rows held here are read here)
 *   -> requests all-to-all (headers + index blocks, gvq_sx_alltoallv)
 *   -> each owner checks every request it got (in range, ascending, held here) and answers
 *      {status, rows} (gvq_ps_wire.h); a malformed request is answered with status 1
 *   -> replies exchanged (sizes known on both sides, gvq_sx_exchange)
 *   -> any refusal: nothing written; else rows scattered to the caller's order
 *
 *      rank 0 wants rows held by 1 and 2:   0 --[i, i, ..]--> 1     0 <--{0, rows}-- 1
 *                                           0 --[i, ..]-----> 2     0 <--{0, rows}-- 2
 *
 * A rank that refused its own indices still serves the others' requests.
 */
#include <stdlib.h>

#include "gvq_ps.h"
#include "gvq_stream.h"
#include "gvq_ps_wire.h"

typedef struct {
    gvqPs_t ps;
    int nranks, rank;
    size_t nunique;
    int64_t *unique; /* the caller's indices, unique, ascending */
    int *owner;      /* per unique index: the rank that holds it */
    size_t *pos;     /* per unique index: its slot (held here) or its place in its request */
    size_t *count;   /* per rank: indices this rank requests from it */
    size_t *cap;     /* per rank: indices it may request from this rank */
    gvq_sx_block_t *request_out, *request_in;
    size_t *reply_out_bytes, *reply_in_bytes;
    void **reply_out, **reply_in;
    int malformed; /* a request this rank got was malformed */
    gvq_sx_bytes_t bytes;
} pull_t;

static gvqResult_t pull_alloc(pull_t *x, gvqPs_t ps) {
    size_t N = (size_t)ps->comm->nranks;
    *x = (pull_t){.ps = ps, .nranks = ps->comm->nranks, .rank = ps->comm->rank};
    x->request_out = calloc(N, sizeof *x->request_out);
    x->request_in = calloc(N, sizeof *x->request_in);
    x->count = calloc(N, sizeof *x->count);
    x->cap = calloc(N, sizeof *x->cap);
    x->reply_out_bytes = calloc(N, sizeof *x->reply_out_bytes);
    x->reply_in_bytes = calloc(N, sizeof *x->reply_in_bytes);
    x->reply_out = calloc(N, sizeof *x->reply_out);
    x->reply_in = calloc(N, sizeof *x->reply_in);
    int ok = x->request_out && x->request_in && x->count && x->cap && x->reply_out_bytes &&
             x->reply_in_bytes && x->reply_out && x->reply_in;
    return ok ? gvqSuccess : gvqSystemError;
}

static void pull_free(pull_t *x) {
    for (int p = 0; p < x->nranks; p++) {
        if (x->request_out != NULL) free(x->request_out[p].buf);
        if (x->request_in != NULL) free(x->request_in[p].buf);
        if (x->reply_out != NULL) free(x->reply_out[p]);
        if (x->reply_in != NULL) free(x->reply_in[p]);
    }
    free(x->request_out), free(x->request_in), free(x->count), free(x->cap);
    free(x->reply_out_bytes), free(x->reply_in_bytes), free(x->reply_out), free(x->reply_in);
    free(x->unique), free(x->owner), free(x->pos);
}

/* The unique indices, ascending, each with its owner and its place there. */
static gvqResult_t unique_by_owner(pull_t *x, const int64_t *idx, size_t n) {
    x->unique = malloc(n * sizeof *x->unique);
    x->owner = malloc(n * sizeof *x->owner);
    x->pos = malloc(n * sizeof *x->pos);
    if (!x->unique || !x->owner || !x->pos) return gvqSystemError;
    memcpy(x->unique, idx, n * sizeof *x->unique);
    qsort(x->unique, n, sizeof *x->unique, gvq_ps_i64_cmp);
    for (size_t i = 0; i < n; i++)
        if (x->nunique == 0 || x->unique[x->nunique - 1] != x->unique[i])
            x->unique[x->nunique++] = x->unique[i];
    for (size_t i = 0; i < x->nunique; i++) {
        uint64_t slot;
        gvq_part_locate(&x->ps->map, (uint64_t)x->unique[i], &x->owner[i], &slot);
        x->pos[i] = x->owner[i] == x->rank ? slot : x->count[x->owner[i]]++;
    }
    return gvqSuccess;
}

/* One request (an index block) per owning peer; a refusal is announced with no indices. */
static gvqResult_t fill_requests(pull_t *x, int refused) {
    for (int p = 0; p < x->nranks; p++) {
        gvq_sx_block_t *req = &x->request_out[p];
        req->status = refused;
        req->nrows = p == x->rank ? 0 : x->count[p];
        x->cap[p] = x->ps->nlocal;
        if (req->nrows == 0) continue;
        req->buf = malloc(gvq_wire_block_bytes(x->count[p], 0));
        if (req->buf == NULL) return gvqSystemError;
    }
    for (size_t i = 0; i < x->nunique; i++)
        if (x->owner[i] != x->rank)
            gvq_wire_block_indices(x->request_out[x->owner[i]].buf)[x->pos[i]] = x->unique[i];
    return gvqSuccess;
}

/* Answer peer p's request of k rows: its rows, or status 1 when it is malformed. */
static gvqResult_t serve_request(pull_t *x, int p, size_t k) {
    gvqPs_t ps = x->ps;
    size_t row_bytes = ps->row_bytes;
    x->reply_out_bytes[p] = gvq_wire_reply_bytes(k, row_bytes);
    char *reply = calloc(1, x->reply_out_bytes[p]);
    if (reply == NULL) return gvqSystemError;
    x->reply_out[p] = reply;
    const int64_t *idx = gvq_wire_block_indices(x->request_in[p].buf);
    size_t bad = gvq_ps_check_block(ps, idx, k, 1);
    if (bad < k) {
        GVQ_WARN("gvqPsPull: rank %d sent a malformed request: row %zu has index %lld (out of "
                 "range, not ascending or not held by rank %d); it is refused",
                 p, bad, (long long)idx[bad], x->rank);
        x->malformed = 1;
        gvq_wire_reply_set_status(reply, 1);
        return gvqSuccess;
    }
    for (size_t i = 0; i < k; i++) {
        int rank;
        uint64_t slot;
        gvq_part_locate(&ps->map, (uint64_t)idx[i], &rank, &slot);
        memcpy(gvq_wire_reply_row(reply, i, row_bytes), gvq_ps_row(ps, ps->values, slot),
               row_bytes);
    }
    gvq_wire_reply_set_status(reply, 0);
    return gvqSuccess;
}

/* Room for the replies to this rank's requests, and the replies to the requests it got. */
static gvqResult_t serve_requests(pull_t *x) {
    for (int p = 0; p < x->nranks; p++) {
        if (p == x->rank) continue;
        size_t asked = x->request_out[p].nrows;
        if (asked > 0) {
            x->reply_in_bytes[p] = gvq_wire_reply_bytes(asked, x->ps->row_bytes);
            x->reply_in[p] = malloc(x->reply_in_bytes[p]);
            if (x->reply_in[p] == NULL) return gvqSystemError;
        }
        if (x->request_in[p].nrows > 0) GVQCHECK(serve_request(x, p, x->request_in[p].nrows));
    }
    return gvqSuccess;
}

/* The outcome once the replies are in: this rank's refusal, an owner's, or a malformed request
 * this rank got (whose sender was refused; this rank's rows were still delivered). */
static gvqResult_t pull_verdict(const pull_t *x, int refused) {
    int refused_by = -1;
    for (int p = 0; p < x->nranks && refused_by < 0; p++)
        if (x->reply_in[p] != NULL && gvq_wire_reply_status(x->reply_in[p]) != 0) refused_by = p;
    if (refused) return gvqInvalidArgument; /* warned by the caller */
    if (refused_by >= 0) {
        GVQ_WARN("gvqPsPull: rank %d refused this rank's request (see its log); values not "
                 "written",
                 refused_by);
        return gvqRemoteError;
    }
    return x->malformed ? gvqRemoteError : gvqSuccess;
}

/* values[i] = the row of idx[i], from this rank's slots or from its owner's reply. */
static void scatter_rows(const pull_t *x, const int64_t *idx, void *values, size_t n) {
    gvqPs_t ps = x->ps;
    size_t row_bytes = ps->row_bytes;
    for (size_t i = 0; i < n; i++) {
        size_t j = gvq_ps_find_sorted(x->unique, x->nunique, idx[i]);
        const char *src = x->owner[j] == x->rank
                              ? gvq_ps_row(ps, ps->values, x->pos[j])
                              : gvq_wire_reply_row(x->reply_in[x->owner[j]], x->pos[j], row_bytes);
        memcpy((char *)values + i * row_bytes, src, row_bytes);
    }
}

static gvqResult_t pull_entered(gvqPs_t ps, const int64_t *idx, void *values, size_t n,
                                int refused) {
    pull_t x;
    gvqResult_t res = gvqSuccess;
    GVQCHECKGOTO(pull_alloc(&x, ps), res, out_free);
    if (!refused && n > 0) GVQCHECKGOTO(unique_by_owner(&x, idx, n), res, out_free);
    GVQCHECKGOTO(fill_requests(&x, refused), res, out_free);
    gvq_coll_ctx_t ctx = gvq_comm_ctx(ps->comm, NULL);
    GVQCHECKGOTO(gvq_sx_alltoallv(&ctx, GVQ_SX_PULL, 0, x.request_out, NULL, x.cap, NULL,
                                  x.request_in, &x.bytes),
                 res, out_free);
    GVQCHECKGOTO(serve_requests(&x), res, out_free);
    GVQCHECKGOTO(gvq_sx_exchange(&ctx, x.reply_out, x.reply_out_bytes, x.reply_in, x.reply_in_bytes,
                                 &x.bytes),
                 res, out_free);
    GVQCHECKGOTO(pull_verdict(&x, refused), res, out_free);
    scatter_rows(&x, idx, values, n);
    ps->stats.pulls++;
out_free:
    ps->stats.bytesSent += x.bytes.sent;
    ps->stats.bytesReceived += x.bytes.received;
    pull_free(&x);
    return res;
}

typedef struct {
    gvqPs_t ps;
    const int64_t *indices;
    void *values;
    size_t n;
} pull_args_t;

/* The pull after the handle checks: on the caller's thread, or on the config's host stream. */
static gvqResult_t pull_run(void *arg) {
    const pull_args_t *a = arg;
    const char *fn = "gvqPsPull";
    int refused = gvq_ps_refuse_rows(a->ps, fn, a->indices, a->values, "values", a->n);
    gvqComm_t comm = a->ps->comm;
    GVQCHECK(gvq_comm_enter(comm, fn));
    gvqResult_t res = !a->ps->cfg.serve ? pull_entered(a->ps, a->indices, a->values, a->n, refused)
                      : refused         ? gvqInvalidArgument
                                        : gvq_ps_serve_pull(a->ps, a->indices, a->values, a->n);
    gvq_comm_leave(comm); /* last: an abort may free the served state once it is left */
    return res;
}

GVQ_API gvqResult_t gvqPsPull(gvqPs_t ps, const int64_t *indices, void *values, size_t n) {
    const char *fn = "gvqPsPull";
    GVQCHECK(gvq_ps_check_call(ps, fn));
    pull_args_t a = {ps, indices, values, n};
    if (ps->cfg.stream == NULL) return pull_run(&a);
    pull_args_t *copy = malloc(sizeof *copy);
    if (copy == NULL) {
        GVQ_WARN("%s: out of memory queueing the call", fn);
        return gvqSystemError;
    }
    *copy = a;
    return gvq_stream_enqueue(ps->cfg.stream, fn, &ps->comm, 1, pull_run, free, copy);
}
