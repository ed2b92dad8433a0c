/*
 * ps_push.c -- gvqPsPush and gvqPsApply (docs/ALGORITHMS.md section 4).
 *
 *   push:  check rows -> merge duplicates
 *          -> (local aggregation: host members send their rows to the host's leader, which
 *              merges them with its own in rank order; the members then push nothing)
 *          -> one block per owning rank (rows this rank owns stay here)
 *          -> headers + blocks all-to-all (gvq_sx_alltoallv)
 *          -> every received block checked (in range, ascending, held here)
 *          -> summed into the pending gradient of its slots, in rank order
 *
 *          All or nothing: a refusal anywhere (announced in the headers) or a malformed block
 *          leaves every shard as it was.
 *
 *   apply: the rule on every pending slot, then the pending sums are cleared (local)
 *
 *      host A: rank 0 (leader) <- rank 1        host B: rank 2 (leader) <- rank 3
 *              rank 0 ---- block ----> rank 2    (one block per owner; 1 and 3 send none)
 *              rank 0 <--- block ----- rank 2
 */
#include <stdlib.h>

#include "gvq_ps.h"
#include "gvq_stream.h"
#include "gvq_ps_wire.h"

/* Rows with strictly ascending indices. */
typedef struct {
    int64_t *idx;
    char *val;
    size_t n;
} rowset_t;

static int rowset_alloc(rowset_t *s, size_t n, size_t row_bytes) {
    s->idx = malloc(n * sizeof *s->idx);
    s->val = malloc(n * row_bytes);
    s->n = 0;
    return s->idx != NULL && s->val != NULL;
}

static void rowset_free(rowset_t *s) {
    free(s->idx);
    free(s->val);
    *s = (rowset_t){NULL, NULL, 0};
}

/* ---- local aggregation ------------------------------------------------------------------- */

/* The exchange between a host's members and its leader. */
typedef struct {
    uint8_t *to_leader;   /* per rank: this rank sends to it (a member: its leader) */
    uint8_t *from_member; /* per rank: this rank receives from it (a leader: its members) */
    size_t *cap;
    gvq_sx_block_t *send, *recv;
    char *block; /* a member's rows as one block */
} host_exchange_t;

static gvqResult_t host_exchange_alloc(host_exchange_t *x, int N) {
    x->to_leader = calloc((size_t)N, 1);
    x->from_member = calloc((size_t)N, 1);
    x->cap = calloc((size_t)N, sizeof *x->cap);
    x->send = calloc((size_t)N, sizeof *x->send);
    x->recv = calloc((size_t)N, sizeof *x->recv);
    x->block = NULL;
    int ok = x->to_leader && x->from_member && x->cap && x->send && x->recv;
    return ok ? gvqSuccess : gvqSystemError;
}

static void host_exchange_free(host_exchange_t *x, int N) {
    for (int p = 0; x->recv != NULL && p < N; p++)
        free(x->recv[p].buf);
    free(x->to_leader), free(x->from_member), free(x->cap), free(x->send), free(x->recv);
    free(x->block);
}

/* A member sends its rows (none when it refused) to its leader; a leader receives from its
 * host's other ranks. */
static gvqResult_t exchange_with_leader(gvqPs_t ps, host_exchange_t *x, const rowset_t *mine,
                                        int64_t status, gvq_sx_bytes_t *bytes) {
    gvqComm_t c = ps->comm;
    int N = c->nranks, r = c->rank, leader = ps->leader;
    if (r != leader) {
        x->to_leader[leader] = 1;
        x->send[leader].status = status;
        x->send[leader].nrows = status ? 0 : mine->n;
        if (x->send[leader].nrows > 0) {
            x->block = malloc(gvq_wire_block_bytes(mine->n, ps->row_bytes));
            if (x->block == NULL) return gvqSystemError;
            gvq_wire_block_pack(x->block, mine->idx, mine->val, mine->n, ps->row_bytes);
            x->send[leader].buf = x->block;
        }
    } else {
        for (int p = 0; p < N; p++)
            x->from_member[p] = p != r && ps->same_host[p];
    }
    for (int p = 0; p < N; p++)
        x->cap[p] = ps->rows;
    gvq_coll_ctx_t ctx = gvq_comm_ctx(c, NULL);
    return gvq_sx_alltoallv(&ctx, GVQ_SX_PUSH_LOCAL, ps->row_bytes, x->send, x->to_leader, x->cap,
                            x->from_member, x->recv, bytes);
}

/* On a leader: the members' headers and blocks. A refusal or a malformed block sets *status
 * (and *malformed). Returns the rows the members sent. */
static size_t check_member_blocks(gvqPs_t ps, const host_exchange_t *x, int64_t *status,
                                  int *malformed) {
    size_t rows = 0;
    for (int p = 0; p < ps->comm->nranks; p++) {
        if (!x->from_member[p]) continue;
        if (x->recv[p].status != 0) {
            GVQ_WARN("gvqPsPush: rank %d (same host) refused its rows; the push is refused", p);
            *status = 1;
        }
        const int64_t *idx = gvq_wire_block_indices(x->recv[p].buf);
        size_t k = x->recv[p].nrows, bad = gvq_ps_check_block(ps, idx, k, 0);
        if (bad < k) {
            GVQ_WARN("gvqPsPush: rank %d (same host) sent a malformed block: row %zu has index "
                     "%lld (out of range or not ascending); the push is refused",
                     p, bad, (long long)idx[bad]);
            *status = 1;
            *malformed = 1;
        }
        rows += k;
    }
    return rows;
}

/* The leader's own rows and its members', in rank order, one after the other into cat. */
static void concat_in_rank_order(gvqPs_t ps, const host_exchange_t *x, const rowset_t *mine,
                                 rowset_t *cat) {
    size_t row_bytes = ps->row_bytes;
    cat->n = 0;
    for (int p = 0; p < ps->comm->nranks; p++) {
        size_t k = p == ps->comm->rank ? mine->n : x->from_member[p] ? x->recv[p].nrows : 0;
        if (k == 0) continue;
        if (p == ps->comm->rank) {
            memcpy(cat->idx + cat->n, mine->idx, k * sizeof *mine->idx);
            memcpy(cat->val + cat->n * row_bytes, mine->val, k * row_bytes);
        } else {
            gvq_wire_block_unpack(x->recv[p].buf, k, row_bytes, cat->idx + cat->n,
                                  cat->val + cat->n * row_bytes);
        }
        cat->n += k;
    }
}

/* On a leader: check the members' blocks, then replace *mine by the merge of the host's rows. */
static gvqResult_t merge_host_rows(gvqPs_t ps, const host_exchange_t *x, rowset_t *mine,
                                   int64_t *status, int *malformed) {
    size_t total = mine->n + check_member_blocks(ps, x, status, malformed);
    if (*status || total == mine->n) return gvqSuccess;
    gvqResult_t res = gvqSuccess;
    rowset_t cat, merged;
    int ok = rowset_alloc(&cat, total, ps->row_bytes);
    ok &= rowset_alloc(&merged, total, ps->row_bytes);
    if (!ok) {
        res = gvqSystemError;
        goto out_free;
    }
    concat_in_rank_order(ps, x, mine, &cat);
    GVQCHECKGOTO(gvq_sparse_merge(ps->comm->dev, ps->dtype, ps->dim, cat.idx, cat.val, cat.n,
                                  merged.idx, merged.val, &merged.n),
                 res, out_free);
    rowset_free(mine);
    *mine = merged;
    merged = (rowset_t){NULL, NULL, 0};
out_free:
    rowset_free(&cat);
    rowset_free(&merged);
    return res;
}

/* Local aggregation: the members of a host send their merged rows to its leader, which merges
 * them with its own (rank order). *status becomes 1 on the leader when a member refused or sent
 * a malformed block (then *malformed is set too); a member's rows become empty. */
static gvqResult_t aggregate_local(gvqPs_t ps, rowset_t *mine, int64_t *status, int *malformed,
                                   gvq_sx_bytes_t *bytes) {
    int N = ps->comm->nranks;
    host_exchange_t x;
    gvqResult_t res = host_exchange_alloc(&x, N);
    if (res == gvqSuccess) res = exchange_with_leader(ps, &x, mine, *status, bytes);
    if (res == gvqSuccess) {
        if (ps->comm->rank != ps->leader)
            mine->n = 0; /* the leader pushes for this rank now */
        else
            res = merge_host_rows(ps, &x, mine, status, malformed);
    }
    host_exchange_free(&x, N);
    return res;
}

/* ---- push -------------------------------------------------------------------------------- */

typedef struct {
    gvqPs_t ps;
    int nranks, rank;
    int64_t status; /* announced to every peer: 1 when this rank (or a member of its host,
                       on a leader) refused its rows */
    int malformed;  /* a received block was malformed */
    rowset_t mine;  /* this rank's merged rows (on a leader with local aggregation: its host's) */
    int *owner;     /* per row of mine: the rank that holds it */
    size_t *count;  /* per rank: rows of mine it holds */
    size_t *cap;    /* per rank: rows it may send here */
    gvq_sx_block_t *send, *recv;
    gvq_sx_bytes_t bytes;
} push_t;

static gvqResult_t push_alloc(push_t *x, gvqPs_t ps, int refused) {
    int N = ps->comm->nranks;
    *x = (push_t){.ps = ps, .nranks = N, .rank = ps->comm->rank, .status = refused};
    x->send = calloc((size_t)N, sizeof *x->send);
    x->recv = calloc((size_t)N, sizeof *x->recv);
    x->count = calloc((size_t)N, sizeof *x->count);
    x->cap = calloc((size_t)N, sizeof *x->cap);
    return x->send && x->recv && x->count && x->cap ? gvqSuccess : gvqSystemError;
}

static void push_free(push_t *x) {
    for (int p = 0; p < x->nranks && x->send != NULL; p++)
        free(x->send[p].buf);
    for (int p = 0; p < x->nranks && x->recv != NULL; p++)
        free(x->recv[p].buf);
    free(x->send), free(x->recv), free(x->count), free(x->cap), free(x->owner);
    rowset_free(&x->mine);
}

static gvqResult_t merge_own_rows(push_t *x, const int64_t *idx, const void *grads, size_t n) {
    gvqPs_t ps = x->ps;
    if (!rowset_alloc(&x->mine, n, ps->row_bytes)) return gvqSystemError;
    return gvq_sparse_merge(ps->comm->dev, ps->dtype, ps->dim, idx, grads, n, x->mine.idx,
                            x->mine.val, &x->mine.n);
}

static int host_ranks(gvqPs_t ps) {
    int n = 0;
    for (int p = 0; p < ps->comm->nranks; p++)
        n += ps->same_host[p];
    return n;
}

/* One block per owning peer (none after a refusal); this rank's own rows stay in mine. */
static gvqResult_t fill_send_blocks(push_t *x) {
    gvqPs_t ps = x->ps;
    x->owner = malloc(GVQ_MAX(x->mine.n, (size_t)1) * sizeof *x->owner);
    if (x->owner == NULL) return gvqSystemError;
    for (size_t i = 0; i < x->mine.n; i++) {
        uint64_t slot;
        gvq_part_locate(&ps->map, (uint64_t)x->mine.idx[i], &x->owner[i], &slot);
        x->count[x->owner[i]]++;
    }
    for (int p = 0; p < x->nranks; p++) {
        x->send[p].status = x->status;
        x->send[p].nrows = x->status ? 0 : x->count[p];
        x->cap[p] = ps->nlocal;
        if (p == x->rank || x->send[p].nrows == 0) continue;
        x->send[p].buf = malloc(gvq_wire_block_bytes(x->count[p], ps->row_bytes));
        if (x->send[p].buf == NULL) return gvqSystemError;
        x->count[p] = 0; /* now the fill position */
    }
    for (size_t i = 0; i < x->mine.n && !x->status; i++) {
        int p = x->owner[i];
        if (p == x->rank) continue;
        gvq_wire_block_put(x->send[p].buf, x->send[p].nrows, x->count[p]++, x->mine.idx[i],
                           x->mine.val + i * ps->row_bytes, ps->row_bytes);
    }
    return gvqSuccess;
}

/* All or nothing: every refusal and every malformed block is found before the first sum. */
static gvqResult_t check_received(push_t *x, int refused) {
    const char *fn = "gvqPsPush";
    int peer_refused = -1;
    for (int p = 0; p < x->nranks; p++) {
        if (p == x->rank) continue;
        if (x->recv[p].status != 0 && peer_refused < 0) peer_refused = p;
        const int64_t *idx = gvq_wire_block_indices(x->recv[p].buf);
        size_t k = x->recv[p].nrows, bad = gvq_ps_check_block(x->ps, idx, k, 1);
        if (bad < k) {
            GVQ_WARN("%s: rank %d sent a malformed block: row %zu has index %lld (out of range, "
                     "not ascending or not held by rank %d); this rank's shards discard the push",
                     fn, p, bad, (long long)idx[bad], x->rank);
            x->malformed = 1;
        }
    }
    if (refused) return gvqInvalidArgument; /* warned by the caller; the last WARN */
    if (x->malformed) return gvqRemoteError;
    if (x->status) {
        GVQ_WARN("%s: a rank of this host refused its rows; no shard changed", fn);
        return gvqRemoteError;
    }
    if (peer_refused >= 0) {
        GVQ_WARN("%s: rank %d refused its rows (see its log); no shard changed", fn, peer_refused);
        return gvqRemoteError;
    }
    return gvqSuccess;
}

/* The sums in rank order: this rank's own rows at position rank. */
static gvqResult_t add_in_rank_order(push_t *x) {
    gvqPs_t ps = x->ps;
    for (int p = 0; p < x->nranks; p++) {
        if (p == x->rank) {
            for (size_t i = 0; i < x->mine.n; i++)
                if (x->owner[i] == x->rank)
                    GVQCHECK(gvq_ps_add_pending(ps, &x->mine.idx[i],
                                                x->mine.val + i * ps->row_bytes, 1));
        } else if (x->recv[p].nrows > 0) {
            size_t k = x->recv[p].nrows;
            void *block = x->recv[p].buf;
            GVQCHECK(gvq_ps_add_pending(ps, gvq_wire_block_indices(block),
                                        gvq_wire_block_values(block, k), k));
        }
    }
    return gvqSuccess;
}

static gvqResult_t push_entered(gvqPs_t ps, const int64_t *idx, const void *grads, size_t n,
                                int refused) {
    push_t x;
    gvqResult_t res = gvqSuccess;
    GVQCHECKGOTO(push_alloc(&x, ps, refused), res, out_free);
    if (!refused && n > 0) GVQCHECKGOTO(merge_own_rows(&x, idx, grads, n), res, out_free);
    if (ps->cfg.local_aggregation && host_ranks(ps) > 1)
        GVQCHECKGOTO(aggregate_local(ps, &x.mine, &x.status, &x.malformed, &x.bytes), res,
                     out_free);
    GVQCHECKGOTO(fill_send_blocks(&x), res, out_free);
    gvq_coll_ctx_t ctx = gvq_comm_ctx(ps->comm, NULL);
    GVQCHECKGOTO(gvq_sx_alltoallv(&ctx, GVQ_SX_PUSH, ps->row_bytes, x.send, NULL, x.cap, NULL,
                                  x.recv, &x.bytes),
                 res, out_free);
    GVQCHECKGOTO(check_received(&x, refused), res, out_free);
    GVQCHECKGOTO(add_in_rank_order(&x), res, out_free);
    ps->stats.pushes++;
out_free:
    ps->stats.bytesSent += x.bytes.sent;
    ps->stats.bytesReceived += x.bytes.received;
    push_free(&x);
    return res;
}

typedef struct {
    gvqPs_t ps;
    const int64_t *indices;
    const void *grads;
    size_t n;
} push_args_t;

/* The push after the handle checks: on the caller's thread, or on the config's host stream. */
static gvqResult_t push_run(void *arg) {
    const push_args_t *a = arg;
    const char *fn = "gvqPsPush";
    int refused = gvq_ps_refuse_rows(a->ps, fn, a->indices, a->grads, "grads", a->n);
    gvqComm_t comm = a->ps->comm;
    GVQCHECK(gvq_comm_enter(comm, fn));
    gvqResult_t res = !a->ps->cfg.serve ? push_entered(a->ps, a->indices, a->grads, a->n, refused)
                      : refused         ? gvqInvalidArgument /* served: this rank's alone */
                                        : gvq_ps_serve_push(a->ps, a->indices, a->grads, a->n);
    gvq_comm_leave(comm);
    return res;
}

GVQ_API gvqResult_t gvqPsPush(gvqPs_t ps, const int64_t *indices, const void *grads, size_t n) {
    const char *fn = "gvqPsPush";
    GVQCHECK(gvq_ps_check_call(ps, fn));
    push_args_t a = {ps, indices, grads, n};
    if (ps->cfg.stream == NULL) return push_run(&a);
    push_args_t *copy = malloc(sizeof *copy);
    if (copy == NULL) {
        GVQ_WARN("%s: out of memory queueing the call", fn);
        return gvqSystemError;
    }
    *copy = a;
    return gvq_stream_enqueue(ps->cfg.stream, fn, &ps->comm, 1, push_run, free, copy);
}

/* ---- apply ------------------------------------------------------------------------------- */

static gvqResult_t apply_run(void *arg) {
    gvqPs_t ps = arg;
    if (ps->cfg.serve) {
        gvqComm_t comm = ps->comm;
        GVQCHECK(gvq_comm_enter(comm, "gvqPsApply"));
        gvqResult_t res = gvq_ps_serve_apply(ps);
        gvq_comm_leave(comm);
        return res;
    }
    gvq_ps_apply_pending(ps, ps->cfg.average ? 1.0 / ps->comm->nranks : 1.0);
    ps->stats.applies++;
    return gvqSuccess;
}

static void keep_handle(void *arg) {
    (void)arg; /* the handle is the caller's */
}

/* ---- apply ------------------------------------------------------------------------------- */

GVQ_API gvqResult_t gvqPsApply(gvqPs_t ps) {
    if (!gvq_ps_live(ps)) {
        GVQ_WARN("gvqPsApply: ps is %s", ps == NULL ? "NULL" : "not a live parameter server");
        return gvqInvalidArgument;
    }
    if (ps->cfg.stream == NULL) return apply_run(ps);
    return gvq_stream_enqueue(ps->cfg.stream, "gvqPsApply", &ps->comm, 1, apply_run, keep_handle,
                              ps);
}
