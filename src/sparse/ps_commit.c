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

/* The statistics, which the served mode's thread updates under its lock. */
static void count_bytes(gvqPs_t ps, const gvq_sx_bytes_t *bytes) {
    gvq_ps_pin_t pin;
    if (gvq_ps_pin(ps, "gvqPsCommit", &pin) != gvqSuccess) return;
    ps->stats.bytesSent += bytes->sent;
    ps->stats.bytesReceived += bytes->received;
    gvq_ps_unpin(&pin);
}

static int reserve(char **buf, size_t *cap, size_t bytes) {
    if (bytes <= *cap && *buf != NULL) return 1;
    char *p = realloc(*buf, GVQ_MAX(bytes, (size_t)1));
    if (p == NULL) return 0;
    *buf = p, *cap = GVQ_MAX(bytes, (size_t)1);
    return 1;
}

/* Copies this rank's rows and exchanges them with the neighbours into the older generation,
 * which becomes the newest once everything arrived (until then it holds no commit: serial 0).
 * Inside the communicator. */
static gvqResult_t commit_locked(gvqPs_t ps, uint64_t serial, uint64_t steps) {
    gvqComm_t c = ps->comm;
    int N = c->nranks, r = c->rank, prev = (r + N - 1) % N, next = (r + 1) % N;
    size_t rb = rec_bytes(ps), nprev = N > 1 ? ps->map.rank_rows[prev] : 0;
    gvq_ps_commit_t *k = &ps->commit;
    gvq_ps_gen_t *g = &k->gen[1];
    gvq_coll_ctx_t ctx = gvq_comm_ctx(c, NULL);
    g->serial = 0;
    k->nranks = N, k->own_rank = r, k->buddy_of = N > 1 ? prev : -1;
    void **sb = calloc((size_t)N, sizeof *sb), **rbp = calloc((size_t)N, sizeof *rbp);
    size_t *sn = calloc((size_t)N, sizeof *sn), *rn = calloc((size_t)N, sizeof *rn);
    gvqResult_t res = gvqSuccess;
    if (sb == NULL || rbp == NULL || sn == NULL || rn == NULL ||
        GVQ_MAX(ps->nlocal, nprev) > SIZE_MAX / rb ||
        !reserve(&g->own, &g->own_cap, ps->nlocal * rb) ||
        !reserve(&g->buddy, &g->buddy_cap, nprev * rb)) {
        GVQ_WARN("gvqPsCommit: cannot allocate the copies of %zu and %zu rows", ps->nlocal, nprev);
        res = gvqSystemError;
    }
    if (res == gvqSuccess) res = snapshot(ps, steps, g->own);
    /* what failed here fails every rank before any copy moves (the neighbours would wait) */
    int32_t bad = res != gvqSuccess;
    if (N > 1) {
        gvqResult_t ag = gvq_agree_i32(&ctx, &bad, 1, gvqMax);
        if (ag != gvqSuccess)
            res = ag;
        else if (bad && res == gvqSuccess) {
            GVQ_WARN(
                "gvqPsCommit: another rank could not take its copy; the previous commit stays");
            res = gvqRemoteError;
        }
    }
    if (res == gvqSuccess && N > 1) { /* both sides know the sizes: the next rank gets ours */
        sb[next] = g->own, sn[next] = ps->nlocal * rb;
        rbp[prev] = g->buddy, rn[prev] = nprev * rb;
        gvq_sx_bytes_t bytes = {0, 0};
        res = gvq_sx_exchange(&ctx, sb, sn, rbp, rn, &bytes);
        count_bytes(ps, &bytes);
    }
    free(sb), free(rbp), free(sn), free(rn);
    GVQCHECK(res);
    g->serial = serial;
    gvq_ps_gen_t newest = *g;
    k->gen[1] = k->gen[0];
    k->gen[0] = newest;
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
    int64_t mine[3] = {(int64_t)ps->commit.gen[0].serial, pushed, (int64_t)steps};
    gvq_coll_ctx_t ctx = gvq_comm_ctx(ps->comm, NULL);
    gvqResult_t res = gvq_agree_fields(&ctx, fn, mine, names, 3, NULL);
    if (res == gvqSuccess && pushed) { /* the same on every rank (agreed) */
        GVQ_WARN("%s: rows were pushed since the last gvqPsApply; commit between an apply and "
                 "the next push",
                 fn);
        res = gvqInvalidUsage;
    }
    if (res == gvqSuccess) res = commit_locked(ps, ps->commit.gen[0].serial + 1, steps);
    gvq_comm_leave(ps->comm);
    return res;
}

/* ---- recovery ------------------------------------------------------------------------------ */

enum {
    F_OLD_RANK = GVQ_PSR_OLD_RANK,
    F_OLD_SIZE = GVQ_PSR_OLD_SIZE,
    F_SERIAL0 = GVQ_PSR_SERIAL0,
    F_SERIAL1 = GVQ_PSR_SERIAL1,
    F_BUDDY_OF = GVQ_PSR_BUDDY_OF,
    F_BAD = GVQ_PSR_BAD,
    NF = GVQ_PSR_FIELDS
};

typedef struct {
    gvqPs_t from, ps; /* the old handle (NULL on a newcomer) and the new one */
    int N, me;
    gvq_ps_plan_t plan;
    const gvq_ps_gen_t *gen; /* from's generation holding the commit recovered (a source's) */
    int64_t *all;            /* N x NF: every rank's fields */
    gvq_sx_block_t *send, *recv;
    size_t *cap;
    uint8_t *filled; /* per slot of the new handle */
    size_t nfilled;
} recover_t;

/* What this rank brings: checked locally, told to every rank with the rest. */
static void my_fields(const char *fn, const recover_t *x, int64_t *f) {
    gvqPs_t o = x->from;
    f[F_OLD_RANK] = -1, f[F_OLD_SIZE] = 0, f[F_SERIAL0] = 0, f[F_SERIAL1] = 0;
    f[F_BUDDY_OF] = -1, f[F_BAD] = 0;
    if (o == NULL) return; /* a newcomer */
    const gvq_ps_commit_t *k = &o->commit;
    if (o->rows != x->ps->rows || o->dim != x->ps->dim || o->dtype != x->ps->dtype ||
        o->cfg.rule != x->ps->cfg.rule || k->gen[0].serial == 0) {
        GVQ_WARN("%s: the old parameter server %s", fn,
                 k->gen[0].serial == 0
                     ? "has no commit (gvqPsCommit)"
                     : "has another shape or rule (rows, dim, datatype or update rule)");
        f[F_BAD] = 1;
        return;
    }
    f[F_OLD_RANK] = k->own_rank, f[F_OLD_SIZE] = k->nranks, f[F_BUDDY_OF] = k->buddy_of;
    f[F_SERIAL0] = (int64_t)k->gen[0].serial, f[F_SERIAL1] = (int64_t)k->gen[1].serial;
}

/* The members' commits: one size, and the newest commit every member holds (a failure in the
 * middle of a commit leaves some ranks one commit ahead: they still hold the one before). */
static gvqResult_t pick_commit(const char *fn, const int64_t *all, int N, gvq_ps_plan_t *pl) {
    for (int p = 0; p < N; p++) {
        const int64_t *f = all + (size_t)p * NF;
        if (f[F_BAD]) {
            GVQ_WARN("%s: rank %d cannot recover from its old parameter server", fn, p);
            return gvqInvalidUsage;
        }
        if (f[F_OLD_RANK] < 0) continue;
        if ((pl->old_n != 0 && f[F_OLD_SIZE] != pl->old_n) || f[F_OLD_RANK] >= f[F_OLD_SIZE] ||
            f[F_SERIAL0] <= 0) {
            GVQ_WARN("%s: rank %d's commit (rank %lld of %lld) is not of the others' server (%d "
                     "ranks)",
                     fn, p, (long long)f[F_OLD_RANK], (long long)f[F_OLD_SIZE], pl->old_n);
            return gvqInvalidUsage;
        }
        pl->old_n = (int)f[F_OLD_SIZE];
        if (pl->serial == 0 || (uint64_t)f[F_SERIAL0] < pl->serial)
            pl->serial = (uint64_t)f[F_SERIAL0];
    }
    if (pl->old_n == 0) {
        GVQ_WARN("%s: no rank holds a commit of the old parameter server", fn);
        return gvqInvalidUsage;
    }
    for (int p = 0; p < N; p++) {
        const int64_t *f = all + (size_t)p * NF;
        if (f[F_OLD_RANK] >= 0 && (uint64_t)f[F_SERIAL0] != pl->serial &&
            (uint64_t)f[F_SERIAL1] != pl->serial) {
            GVQ_WARN("%s: rank %d holds commits %lld and %lld, not %llu as every rank must", fn, p,
                     (long long)f[F_SERIAL0], (long long)f[F_SERIAL1],
                     (unsigned long long)pl->serial);
            return gvqInvalidUsage;
        }
    }
    return gvqSuccess;
}

gvqResult_t gvq_ps_plan_recovery(const char *fn, const int64_t *all, int N, gvq_ps_plan_t *pl) {
    *pl = (gvq_ps_plan_t){0, 0, NULL, NULL};
    GVQCHECK(pick_commit(fn, all, N, pl));
    pl->source = malloc((size_t)pl->old_n * sizeof *pl->source);
    pl->from_buddy = calloc((size_t)pl->old_n, sizeof *pl->from_buddy);
    if (pl->source == NULL || pl->from_buddy == NULL) return gvqSystemError;
    for (int q = 0; q < pl->old_n; q++)
        pl->source[q] = -1;
    for (int p = 0; p < N; p++) {
        const int64_t *f = all + (size_t)p * NF;
        int q = (int)f[F_OLD_RANK];
        if (q < 0) continue;
        if (pl->source[q] >= 0 && !pl->from_buddy[q]) {
            GVQ_WARN("%s: ranks %d and %d were both rank %d of the old parameter server", fn,
                     pl->source[q], p, q);
            return gvqInvalidUsage;
        }
        pl->source[q] = p, pl->from_buddy[q] = 0;
        int64_t b = f[F_BUDDY_OF];
        if (b >= 0 && b < pl->old_n && pl->source[b] < 0) pl->source[b] = p, pl->from_buddy[b] = 1;
    }
    for (int q = 0; q < pl->old_n; q++)
        if (pl->source[q] < 0) {
            GVQ_WARN("%s: the rows of old rank %d are lost: neither it nor old rank %d (which "
                     "kept their copy) is in the new communicator",
                     fn, q, (q + 1) % pl->old_n);
            return gvqRemoteError;
        }
    return gvqSuccess;
}

/* Record i of old rank q's rows as this source keeps them. */
static const char *source_record(const recover_t *x, int q, size_t i) {
    return (x->plan.from_buddy[q] ? x->gen->buddy : x->gen->own) + i * rec_bytes(x->from);
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
        for (int q = 0; q < x->plan.old_n; q++) {
            if (x->plan.source[q] != x->me) continue;
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
            if (x->send[p].nrows > 0 &&
                (x->send[p].nrows > SIZE_MAX / (8 + rb) ||
                 (x->send[p].buf = malloc(x->send[p].nrows * (8 + rb))) == NULL)) {
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
            if (row >= 0 && (uint64_t)row < ps->rows)
                gvq_part_locate(&ps->map, (uint64_t)row, &to, &slot);
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
    gvqResult_t res = gvq_ps_plan_recovery(fn, x->all, x->N, &x->plan);
    if (res != gvqSuccess && res != gvqSystemError) return res; /* decided alike everywhere */
    if (res == gvqSuccess && x->from != NULL) { /* the generation holding the commit picked */
        const gvq_ps_commit_t *k = &x->from->commit;
        x->gen = k->gen[0].serial == x->plan.serial ? &k->gen[0] : &k->gen[1];
    }
    x->send = calloc((size_t)x->N, sizeof *x->send);
    x->recv = calloc((size_t)x->N, sizeof *x->recv);
    x->cap = malloc((size_t)x->N * sizeof *x->cap);
    x->filled = calloc(GVQ_MAX(ps->nlocal, (size_t)1), 1);
    if (x->send == NULL || x->recv == NULL || x->cap == NULL || x->filled == NULL)
        res = gvqSystemError;
    /* a local failure (memory) fails every rank before rows move: the others would wait */
    int32_t bad = res != gvqSuccess;
    GVQCHECK(gvq_agree_i32(&ctx, &bad, 1, gvqMax));
    if (bad) {
        GVQ_WARN("%s: %s could not prepare the exchange", fn,
                 res != gvqSuccess ? "this rank" : "another rank");
        return res != gvqSuccess ? res : gvqRemoteError;
    }
    for (int p = 0; p < x->N; p++)
        x->cap[p] = ps->nlocal;
    gvq_ps_pin_t pin; /* the served mode's thread must not answer from half-written rows */
    GVQCHECK(gvq_ps_pin(ps, fn, &pin));
    res = cut_records(x);
    bad = res != gvqSuccess;
    for (int p = 0; bad && p < x->N; p++) { /* tell the others, who wait for our headers */
        free(x->send[p].buf);
        x->send[p] = (gvq_sx_block_t){1, 0, NULL};
    }
    gvq_sx_bytes_t bytes = {0, 0};
    res = gvq_sx_alltoallv(&ctx, GVQ_SX_MOVE, rec_bytes(ps), x->send, NULL, x->cap, NULL, x->recv,
                           &bytes);
    if (res == gvqSuccess && !bad) bad = !place_received(x);
    ps->stats.bytesSent += bytes.sent;
    ps->stats.bytesReceived += bytes.received;
    gvq_ps_unpin(&pin);
    if (res != gvqSuccess) return res; /* the communicator is broken */
    /* every rank learns whether every rank has its rows before any returns */
    GVQCHECK(gvq_agree_i32(&ctx, &bad, 1, gvqMax));
    if (bad) {
        GVQ_WARN("%s: a rank did not get its rows whole; no rank keeps the new server", fn);
        return gvqRemoteError;
    }
    return commit_locked(ps, x->plan.serial, 0);
}

GVQ_API gvqResult_t gvqPsRecover(gvqPs_t from, gvqComm_t comm, size_t rows, size_t dim,
                                 gvqDataType_t datatype, const gvqPsConfig_t *config,
                                 gvqPs_t *out) {
    const char *fn = "gvqPsRecover";
    /* a local refusal still takes part in gvq_ps_create's agreement (the others fail at once) */
    GVQCHECK(gvq_comm_check(comm, fn, 1));
    gvqResult_t pre = gvqSuccess;
    if (out == NULL) {
        GVQ_WARN("%s: out is NULL", fn);
        pre = gvqInvalidArgument;
    } else if (from != NULL && !gvq_ps_known(from)) {
        GVQ_WARN("%s: from is not a parameter server (NULL on a rank without one)", fn);
        pre = gvqInvalidArgument;
    }
    recover_t x = {.from = from, .N = comm->nranks, .me = comm->rank};
    x.all = malloc((size_t)x.N * NF * sizeof *x.all);
    if (x.all == NULL && pre == gvqSuccess) {
        GVQ_WARN("%s: out of memory for %d ranks' fields", fn, x.N);
        pre = gvqSystemError;
    }
    gvqPs_t ps;
    gvqResult_t res = gvq_ps_create(comm, rows, dim, datatype, config, 1, pre, &ps);
    if (res != gvqSuccess) {
        free(x.all);
        return res;
    }
    x.ps = ps;
    res = gvq_comm_enter(comm, fn);
    if (res == gvqSuccess) {
        res = recover_locked(fn, &x);
        gvq_comm_leave(comm);
    }
    for (int p = 0; x.send != NULL && p < x.N; p++)
        free(x.send[p].buf);
    for (int p = 0; x.recv != NULL && p < x.N; p++)
        free(x.recv[p].buf);
    free(x.all), free(x.plan.source), free(x.plan.from_buddy), free(x.send), free(x.recv),
        free(x.cap);
    free(x.filled);
    if (res != gvqSuccess) {
        gvqPsDestroy(ps);
        return res;
    }
    *out = ps;
    GVQ_INFO("%s: %zu rows here from the commit %llu of %d ranks, on %d ranks", fn, ps->nlocal,
             (unsigned long long)ps->commit.gen[0].serial, x.plan.old_n, x.N);
    return gvqSuccess;
}
