/*
 * ps_commit.c -- a parameter server's shards kept through a lost rank: gvqPsCommit keeps each
 * rank's rows twice (on the rank, and on the next rank), gvqPsRecover rebuilds the server from
 * those copies on a communicator of the survivors (gvqCommShrink) or a grown one (gvqCommGrow).
 *
 *   commit (collective, between an apply and the next push):
 *       own   = this rank's records (a row's values, then its rule state), slot order
 *       rank r --own--> rank (r + 1) mod N, which keeps it as `buddy` (the rows of r)
 *
 *   recover (collective over the new communicator; the old handle may have lost its own):
 *       every rank tells {its old rank or -1, old size, commits taken, whose copy it keeps}
 *       old rank q's rows come from q if it is here, else from q + 1's copy, else they are lost
 *           (every rank refuses alike: gvqRemoteError naming q)
 *       each source cuts its records by their owner in the new server (any size, partitions
 *       and partitioning) and sends them, {row index, record} (gvq_sx_alltoallv)
 *       each rank checks that what came fills every row it holds exactly once; all agree on the
 *       outcome before any returns, so no pull reaches a rank that has not written its rows
 *       the new handle keeps the recovered rows as its commit (copies exchanged again)
 *
 * What a commit holds: the values and the rule's state (momentum, Adagrad's accumulators), not
 * gradient sums (there are none between an apply and the next push: a commit with rows pushed
 * and not applied is refused on every rank), nor the statistics.
 */
#include <stdlib.h>

#include "gvq_stream.h"
#include "gvq_ps_serve.h"

/* Bytes of one record: the values, then the rule's state. */
static size_t rec_bytes(const struct gvqPs *ps) {
    return ps->row_bytes * (ps->rule_state != NULL ? 2 : 1);
}

static int steps_applied(gvq_ps_srv_t *s, void *arg) {
    return s->version >= *(const uint64_t *)arg || s->failed != gvqSuccess;
}

/* This rank's records into own: with `serve` once the shards here have applied every step the
 * ranks ended (`steps`, agreed: no rank can end another while this one is in the commit). */
static gvqResult_t snapshot(gvqPs_t ps, uint64_t steps, char *own) {
    size_t rb = rec_bytes(ps);
    gvq_ps_pin_t pin;
    GVQCHECK(gvq_ps_pin(ps, "gvqPsCommit", &pin));
    gvqResult_t res = gvqSuccess;
    if (ps->srv != NULL) {
        res = gvq_ps_srv_wait(ps->srv, "gvqPsCommit", steps_applied, &steps,
                              "the shards here to apply every step before the commit");
        if (res == gvqSuccess) res = gvq_ps_srv_refuse_failed(ps->srv, "gvqPsCommit");
    }
    for (size_t s = 0; res == gvqSuccess && s < ps->nlocal; s++) {
        memcpy(own + s * rb, gvq_ps_row(ps, ps->values, s), ps->row_bytes);
        if (ps->rule_state != NULL)
            memcpy(own + s * rb + ps->row_bytes, gvq_ps_row(ps, ps->rule_state, s), ps->row_bytes);
    }
    gvq_ps_unpin(&pin);
    return res;
}

/* Copies this rank's rows and exchanges them with the neighbours; the handle's commit is
 * replaced only when everything arrived. Inside the communicator. */
static gvqResult_t commit_locked(gvqPs_t ps, uint64_t serial, uint64_t steps) {
    gvqComm_t c = ps->comm;
    int N = c->nranks, r = c->rank, prev = (r + N - 1) % N, next = (r + 1) % N;
    size_t rb = rec_bytes(ps), nprev = N > 1 ? ps->map.rank_rows[prev] : 0;
    gvq_ps_commit_t k = {.serial = serial, .nranks = N, .own_rank = r, .buddy_of = N > 1 ? prev : -1};
    k.own = malloc(GVQ_MAX(ps->nlocal * rb, (size_t)1));
    k.buddy = malloc(GVQ_MAX(nprev * rb, (size_t)1));
    void **sbuf = calloc((size_t)N, sizeof *sbuf), **rbuf = calloc((size_t)N, sizeof *rbuf);
    size_t *sbytes = calloc((size_t)N, sizeof *sbytes), *rbytes = calloc((size_t)N, sizeof *rbytes);
    gvqResult_t res = gvqSuccess;
    if (k.own == NULL || k.buddy == NULL || sbuf == NULL || rbuf == NULL || sbytes == NULL ||
        rbytes == NULL) {
        GVQ_WARN("gvqPsCommit: cannot allocate the copies of %zu and %zu rows", ps->nlocal, nprev);
        res = gvqSystemError;
    }
    if (res == gvqSuccess) res = snapshot(ps, steps, k.own);
    if (res == gvqSuccess && N > 1) { /* both sides know the sizes */
        sbuf[next] = k.own, sbytes[next] = ps->nlocal * rb;
        rbuf[prev] = k.buddy, rbytes[prev] = nprev * rb;
        gvq_coll_ctx_t ctx = gvq_comm_ctx(c, NULL);
        gvq_sx_bytes_t bytes = {0, 0};
        res = gvq_sx_exchange(&ctx, sbuf, sbytes, rbuf, rbytes, &bytes);
        ps->stats.bytesSent += bytes.sent;
        ps->stats.bytesReceived += bytes.received;
    }
    free(sbuf), free(rbuf), free(sbytes), free(rbytes);
    if (res != gvqSuccess) {
        gvq_ps_commit_free(&k);
        return res;
    }
    gvq_ps_commit_free(&ps->commit);
    ps->commit = k;
    return gvqSuccess;
}

GVQ_API gvqResult_t gvqPsCommit(gvqPs_t ps) {
    const char *fn = "gvqPsCommit";
    GVQCHECK(gvq_ps_check_call(ps, fn));
    gvq_stream_comm_settle(ps->comm); /* pushes and applies queued on the config's stream */
    gvq_ps_pin_t pin; /* the served mode's step count and pushes, read under its lock */
    GVQCHECK(gvq_ps_pin(ps, fn, &pin));
    uint64_t steps = ps->srv != NULL ? ps->srv->clocked[ps->srv->rank] : 0;
    int pushed = ps->srv != NULL ? ps->srv->calls > 0 : ps->npending > 0;
    gvq_ps_unpin(&pin);
    GVQCHECK(gvq_comm_enter(ps->comm, fn));
    static const char *const names[3] = {"commits taken", "rows pushed since the last apply",
                                         "steps ended (gvqPsApply calls)"};
    int64_t mine[3] = {(int64_t)ps->commit.serial, pushed, (int64_t)steps};
    gvq_coll_ctx_t ctx = gvq_comm_ctx(ps->comm, NULL);
    gvqResult_t res = gvq_agree_fields(&ctx, fn, mine, names, 3, NULL);
    if (res == gvqSuccess && pushed) { /* the same on every rank (agreed) */
        GVQ_WARN("%s: rows were pushed since the last gvqPsApply; commit between an apply and "
                 "the next push",
                 fn);
        res = gvqInvalidUsage;
    }
    if (res == gvqSuccess) res = commit_locked(ps, ps->commit.serial + 1, steps);
    gvq_comm_leave(ps->comm);
    return res;
}

/* ---- recovery ------------------------------------------------------------------------------ */

enum { F_OLD_RANK, F_OLD_SIZE, F_SERIAL, F_BUDDY_OF, F_BAD, NF };

typedef struct {
    gvqPs_t from, ps; /* the old handle (NULL on a newcomer) and the new one */
    int N, me, old_n;
    int64_t serial;   /* the commit recovered from */
    int64_t *all;     /* N x NF: every rank's fields */
    int *source;      /* per old rank: the new rank that sends its rows */
    int *from_buddy;  /* per old rank: 1 when they come from the next rank's copy */
    gvq_sx_block_t *send, *recv;
    size_t *cap;
    uint8_t *filled; /* per slot of the new handle */
    size_t nfilled;
} recover_t;

/* What this rank brings: checked locally, told to every rank with the rest. */
static void my_fields(const char *fn, const recover_t *x, int64_t *f) {
    gvqPs_t o = x->from;
    f[F_OLD_RANK] = -1, f[F_OLD_SIZE] = 0, f[F_SERIAL] = 0, f[F_BUDDY_OF] = -1, f[F_BAD] = 0;
    if (o == NULL) return; /* a newcomer */
    if (o->rows != x->ps->rows || o->dim != x->ps->dim || o->dtype != x->ps->dtype ||
        o->commit.serial == 0) {
        GVQ_WARN("%s: the old parameter server %s", fn,
                 o->commit.serial == 0 ? "has no commit (gvqPsCommit)"
                                       : "has another shape (rows, dim or datatype)");
        f[F_BAD] = 1;
        return;
    }
    f[F_OLD_RANK] = o->commit.own_rank, f[F_OLD_SIZE] = o->commit.nranks;
    f[F_SERIAL] = (int64_t)o->commit.serial, f[F_BUDDY_OF] = o->commit.buddy_of;
}

/* Where each old rank's rows come from; the same decision on every rank (from the same
 * gathered fields). */
static gvqResult_t plan_sources(const char *fn, recover_t *x) {
    int64_t serial = 0;
    x->old_n = 0;
    x->serial = 0;
    for (int p = 0; p < x->N; p++) {
        const int64_t *f = x->all + (size_t)p * NF;
        if (f[F_BAD]) {
            GVQ_WARN("%s: rank %d cannot recover from its old parameter server", fn, p);
            return gvqInvalidUsage;
        }
        if (f[F_OLD_RANK] < 0) continue;
        if ((x->old_n != 0 && f[F_OLD_SIZE] != x->old_n) || (serial != 0 && f[F_SERIAL] != serial) ||
            f[F_OLD_RANK] >= f[F_OLD_SIZE]) {
            GVQ_WARN("%s: rank %d's commit (%lld of %lld ranks, commit %lld) is not the others' "
                     "(%d ranks, commit %lld)",
                     fn, p, (long long)f[F_OLD_RANK], (long long)f[F_OLD_SIZE],
                     (long long)f[F_SERIAL], x->old_n, (long long)serial);
            return gvqInvalidUsage;
        }
        x->old_n = (int)f[F_OLD_SIZE], serial = f[F_SERIAL];
    }
    x->serial = serial;
    if (x->old_n == 0) {
        GVQ_WARN("%s: no rank holds a commit of the old parameter server", fn);
        return gvqInvalidUsage;
    }
    x->source = malloc((size_t)x->old_n * sizeof *x->source);
    x->from_buddy = calloc((size_t)x->old_n, sizeof *x->from_buddy);
    if (x->source == NULL || x->from_buddy == NULL) return gvqSystemError;
    for (int q = 0; q < x->old_n; q++)
        x->source[q] = -1;
    for (int p = 0; p < x->N; p++) {
        const int64_t *f = x->all + (size_t)p * NF;
        if (f[F_OLD_RANK] < 0) continue;
        if (x->source[f[F_OLD_RANK]] >= 0 && !x->from_buddy[f[F_OLD_RANK]]) {
            GVQ_WARN("%s: ranks %d and %d were both rank %lld of the old parameter server", fn,
                     x->source[f[F_OLD_RANK]], p, (long long)f[F_OLD_RANK]);
            return gvqInvalidUsage;
        }
        x->source[f[F_OLD_RANK]] = p, x->from_buddy[f[F_OLD_RANK]] = 0;
        int64_t b = f[F_BUDDY_OF];
        if (b >= 0 && b < x->old_n && x->source[b] < 0) x->source[b] = p, x->from_buddy[b] = 1;
    }
    for (int q = 0; q < x->old_n; q++)
        if (x->source[q] < 0) {
            GVQ_WARN("%s: the rows of old rank %d are lost: neither it nor old rank %d (which "
                     "kept their copy) is in the new communicator",
                     fn, q, (q + 1) % x->old_n);
            return gvqRemoteError;
        }
    return gvqSuccess;
}

/* Record i of old rank q's rows as this source keeps them. */
static const char *source_record(const recover_t *x, int q, size_t i) {
    const gvq_ps_commit_t *k = &x->from->commit;
    return (x->from_buddy[q] ? k->buddy : k->own) + i * rec_bytes(x->from);
}

/* Write one record into slot s of the new handle, once. */
static int place(recover_t *x, uint64_t slot, const char *rec) {
    gvqPs_t ps = x->ps;
    if (slot >= ps->nlocal || x->filled[slot]) return 0;
    x->filled[slot] = 1, x->nfilled++;
    memcpy(gvq_ps_row(ps, ps->values, slot), rec, ps->row_bytes);
    if (ps->rule_state != NULL)
        memcpy(gvq_ps_row(ps, ps->rule_state, slot), rec + ps->row_bytes, ps->row_bytes);
    return 1;
}

/* The records this rank sends, cut by their new owner; its own are placed at once. */
static gvqResult_t cut_records(recover_t *x) {
    gvqPs_t ps = x->ps;
    size_t rb = rec_bytes(ps), *count = calloc((size_t)x->N, sizeof *count);
    if (count == NULL) return gvqSystemError;
    for (int pass = 0; pass < 2; pass++) { /* count, then fill */
        for (int q = 0; q < x->old_n; q++) {
            if (x->source[q] != x->me) continue;
            for (uint64_t i = 0; i < x->from->map.rank_rows[q]; i++) {
                uint64_t row = gvq_part_row_of(&x->from->map, q, i), slot;
                int to;
                gvq_part_locate(&ps->map, row, &to, &slot);
                if (to == x->me) {
                    if (pass == 1 && !place(x, slot, source_record(x, q, i))) goto dup;
                    continue;
                }
                gvq_sx_block_t *b = &x->send[to];
                if (pass == 0) {
                    b->nrows++;
                    continue;
                }
                size_t k = count[to]++;
                ((int64_t *)b->buf)[k] = (int64_t)row;
                memcpy((char *)b->buf + b->nrows * 8 + k * rb, source_record(x, q, i), rb);
            }
        }
        for (int p = 0; pass == 0 && p < x->N; p++)
            if (x->send[p].nrows > 0 && (x->send[p].buf = malloc(x->send[p].nrows * (8 + rb))) == NULL) {
                free(count);
                return gvqSystemError;
            }
    }
    free(count);
    return gvqSuccess;
dup:
    free(count);
    GVQ_WARN("gvqPsRecover: a row of this rank's commit maps twice onto one slot");
    return gvqInternalError;
}

/* What came from the others: every index in range, held here, each slot filled once. */
static int place_received(recover_t *x) {
    gvqPs_t ps = x->ps;
    size_t rb = rec_bytes(ps);
    for (int p = 0; p < x->N; p++) {
        const gvq_sx_block_t *b = &x->recv[p];
        if (p != x->me && b->status != 0) {
            GVQ_WARN("gvqPsRecover: rank %d could not send its rows", p);
            return 0;
        }
        for (size_t k = 0; p != x->me && k < b->nrows; k++) {
            int64_t row = ((const int64_t *)b->buf)[k];
            int to = -1;
            uint64_t slot = UINT64_MAX;
            if (row >= 0 && (uint64_t)row < ps->rows) gvq_part_locate(&ps->map, (uint64_t)row, &to, &slot);
            if (to != x->me || !place(x, slot, (const char *)b->buf + b->nrows * 8 + k * rb)) {
                GVQ_WARN("gvqPsRecover: rank %d sent row %lld, which is not this rank's or came "
                         "twice",
                         p, (long long)row);
                return 0;
            }
        }
    }
    if (x->nfilled != ps->nlocal) {
        GVQ_WARN("gvqPsRecover: %zu of this rank's %zu rows came", x->nfilled, ps->nlocal);
        return 0;
    }
    return 1;
}

/* The recovery proper, inside the new communicator. */
static gvqResult_t recover_locked(const char *fn, recover_t *x) {
    gvqPs_t ps = x->ps;
    gvq_coll_ctx_t ctx = gvq_comm_ctx(ps->comm, NULL);
    static const char *const names[NF] = {NULL, NULL, NULL, NULL, NULL};
    int64_t mine[NF];
    my_fields(fn, x, mine);
    GVQCHECK(gvq_agree_fields(&ctx, fn, mine, names, NF, x->all));
    GVQCHECK(plan_sources(fn, x));
    x->send = calloc((size_t)x->N, sizeof *x->send);
    x->recv = calloc((size_t)x->N, sizeof *x->recv);
    x->cap = malloc((size_t)x->N * sizeof *x->cap);
    x->filled = calloc(GVQ_MAX(ps->nlocal, (size_t)1), 1);
    if (x->send == NULL || x->recv == NULL || x->cap == NULL || x->filled == NULL)
        return gvqSystemError;
    for (int p = 0; p < x->N; p++)
        x->cap[p] = ps->nlocal;
    gvq_ps_pin_t pin; /* the served mode's thread must not answer from half-written rows */
    GVQCHECK(gvq_ps_pin(ps, fn, &pin));
    gvqResult_t res = cut_records(x);
    int32_t bad = res != gvqSuccess;
    for (int p = 0; bad && p < x->N; p++) { /* tell the others, who wait for our headers */
        free(x->send[p].buf);
        x->send[p] = (gvq_sx_block_t){1, 0, NULL};
    }
    gvq_sx_bytes_t bytes = {0, 0};
    res = gvq_sx_alltoallv(&ctx, GVQ_SX_MOVE, rec_bytes(ps), x->send, NULL, x->cap, NULL,
                               x->recv, &bytes);
    if (res == gvqSuccess && !bad) bad = !place_received(x);
    gvq_ps_unpin(&pin);
    ps->stats.bytesSent += bytes.sent;
    ps->stats.bytesReceived += bytes.received;
    if (res != gvqSuccess) return res; /* the communicator is broken */
    /* every rank learns whether every rank has its rows before any returns */
    GVQCHECK(gvq_agree_i32(&ctx, &bad, 1, gvqMax));
    if (bad) {
        GVQ_WARN("%s: a rank did not get its rows whole; no rank keeps the new server", fn);
        return gvqRemoteError;
    }
    return commit_locked(ps, (uint64_t)x->serial, 0);
}

GVQ_API gvqResult_t gvqPsRecover(gvqPs_t from, gvqComm_t comm, size_t rows, size_t dim,
                                 gvqDataType_t datatype, const gvqPsConfig_t *config,
                                 gvqPs_t *out) {
    const char *fn = "gvqPsRecover";
    if (from != NULL && !gvq_ps_known(from)) {
        GVQ_WARN("%s: from is not a parameter server (NULL on a rank without one)", fn);
        return gvqInvalidArgument;
    }
    if (gvq_group_active()) {
        GVQ_WARN("%s: not allowed inside gvqGroupStart/gvqGroupEnd", fn);
        return gvqInvalidUsage;
    }
    gvqPs_t ps;
    GVQCHECK(gvqPsCreate(comm, rows, dim, datatype, config, &ps));
    recover_t x = {.from = from, .ps = ps, .N = comm->nranks, .me = comm->rank};
    x.all = malloc((size_t)x.N * NF * sizeof *x.all);
    gvqResult_t res = x.all == NULL ? gvqSystemError : gvq_comm_enter(comm, fn);
    if (res == gvqSuccess) {
        res = recover_locked(fn, &x);
        gvq_comm_leave(comm);
    }
    for (int p = 0; x.send != NULL && p < x.N; p++)
        free(x.send[p].buf);
    for (int p = 0; x.recv != NULL && p < x.N; p++)
        free(x.recv[p].buf);
    free(x.all), free(x.source), free(x.from_buddy), free(x.send), free(x.recv), free(x.cap);
    free(x.filled);
    if (res != gvqSuccess) {
        gvqPsDestroy(ps);
        return res;
    }
    *out = ps;
    GVQ_INFO("%s: %zu rows here from the commit %llu of %d ranks, on %d ranks", fn, ps->nlocal,
             (unsigned long long)ps->commit.serial, x.old_n, x.N);
    return gvqSuccess;
}
