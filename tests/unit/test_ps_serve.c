/*
 * test_ps_serve.c -- the served parameter server (gvqPsConfig_t.serve, src/sparse/ps_serve.c)
 * over in-process ranks:
 *   - staleness 0 gives the synchronous server's bits (every rule, both float types, 1-4 ranks,
 *     several pushes a step, duplicates, ranks with nothing to push, blocking and on a stream);
 *   - an owner busy elsewhere (no call on the handle) still answers the others' pulls;
 *   - staleness s: a pull after c steps sees between c - s and c steps, and waits for c - s;
 *   - concurrent pushes and pulls from every rank at once, checked against exact sums;
 *   - abort while a pull waits, a pull past the timeout, refused input and configs;
 *   - a peer sending malformed requests: no shard changes, every call then fails;
 *   - save and load at a step boundary.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gvq_comm.h"
#include "gvq_test.h"

static void msleep(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Wait (bounded) until *v >= want; 1 when it came. */
static int wait_for(int *v, int want, int max_ms) {
    for (int t = 0; t < max_ms; t++) {
        if (__atomic_load_n(v, __ATOMIC_ACQUIRE) >= want) return 1;
        msleep(1);
    }
    return __atomic_load_n(v, __ATOMIC_ACQUIRE) >= want;
}

/* ---- staleness 0 against the synchronous server -------------------------------------------- */

typedef struct {
    size_t rows, dim;
    int P, rule, steps, dtype, pushes; /* pushes per step */
    int stream;                        /* the served handle's calls on a host stream */
} ref_case_t;

/* A pure function of (rank, step, k): rows with duplicates; sometimes none. */
static size_t case_rows(const ref_case_t *c, int rank, int step, int k, int64_t *idx, double *g) {
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(rank * 131 + step * 7 + k * 1031 + 1);
    size_t n = (rank + step + k) % 4 == 3 ? 0 : (size_t)((x >> 7) % 12);
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        idx[i] = (int64_t)(x % c->rows);
        for (size_t j = 0; j < c->dim; j++)
            g[i * c->dim + j] = ((double)((x >> (j + 3)) % 1000) - 500.0) / 317.0;
    }
    return n;
}

static void to_type(int dtype, const double *in, void *out, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (dtype == gvqFloat32)
            ((float *)out)[i] = (float)in[i];
        else
            ((double *)out)[i] = in[i];
}

static void ref_rank(gvqComm_t comm, int rank, int nranks, void *arg) {
    const ref_case_t *c = arg;
    size_t rows = c->rows, dim = c->dim, es = c->dtype == gvqFloat32 ? 4 : 8;
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    cfg.partitions = c->P;
    cfg.rule = c->rule;
    cfg.learningRate = 0.125;
    cfg.average = c->rule == gvqPsMomentum;
    cfg.init = gvqPsInitUniform;
    cfg.seed = 11;
    gvqPs_t sync = NULL, served = NULL;
    gvqStream_t stream = NULL;
    EXPECT_RES(gvqPsCreate(comm, rows, dim, c->dtype, &cfg, &sync), gvqSuccess);
    cfg.serve = 1;
    if (c->stream) {
        EXPECT_RES(gvqStreamCreate(&stream), gvqSuccess);
        cfg.stream = stream;
    }
    EXPECT_RES(gvqPsCreate(comm, rows, dim, c->dtype, &cfg, &served), gvqSuccess);
    if (sync == NULL || served == NULL) return;
    int64_t all[64], idx[16];
    for (size_t r = 0; r < rows; r++)
        all[r] = (int64_t)r;
    double g[16 * 8];
    char gt[16 * 8 * 8];
    char *a = malloc(rows * dim * es), *b = malloc(rows * dim * es);
    for (int step = 0; step < c->steps; step++) {
        for (int k = 0; k < c->pushes; k++) {
            size_t n = case_rows(c, rank, step, k, idx, g);
            to_type(c->dtype, g, gt, n * dim);
            EXPECT_RES(gvqPsPush(sync, idx, gt, n), gvqSuccess);
            EXPECT_RES(gvqPsPush(served, idx, gt, n), gvqSuccess);
            /* queued on the stream: idx and gt are read when it runs */
            if (stream != NULL) EXPECT_RES(gvqStreamSynchronize(stream), gvqSuccess);
        }
        EXPECT_RES(gvqPsApply(sync), gvqSuccess);
        EXPECT_RES(gvqPsApply(served), gvqSuccess);
        /* every rank pulls a different subset, with duplicates, in its own order */
        size_t m = 0;
        for (size_t r = 0; r < rows; r++)
            if ((r + (size_t)rank + (size_t)step) % 3 != 0) all[m++] = (int64_t)((r * 7) % rows);
        EXPECT_RES(gvqPsPull(sync, all, a, m), gvqSuccess);
        memset(b, 0x5a, m * dim * es);
        EXPECT_RES(gvqPsPull(served, all, b, m), gvqSuccess);
        if (stream != NULL) EXPECT_RES(gvqStreamSynchronize(stream), gvqSuccess);
        EXPECT(memcmp(a, b, m * dim * es) == 0,
               "N %d rank %d step %d rule %d dtype %d P %d: the served pull differs from the "
               "synchronous one",
               nranks, rank, step, c->rule, c->dtype, c->P);
        for (size_t r = 0; r < rows; r++)
            all[r] = (int64_t)r;
    }
    gvqPsStats_t st;
    EXPECT_RES(gvqPsGetStats(served, &st), gvqSuccess);
    EXPECT(st.applies == c->steps && st.pulls == c->steps, "stats: applies %lld pulls %lld",
           st.applies, st.pulls);
    EXPECT_RES(gvqPsDestroy(served), gvqSuccess);
    EXPECT_RES(gvqPsDestroy(sync), gvqSuccess);
    if (stream != NULL) gvqStreamDestroy(stream);
    free(a), free(b);
}

static void test_reference(void) {
    static const ref_case_t cases[] = {
        {10, 3, 1, gvqPsSgd, 5, gvqFloat32, 1, 0},
        {10, 3, 4, gvqPsMomentum, 5, gvqFloat32, 2, 0},
        {10, 2, 13, gvqPsAdagrad, 6, gvqFloat64, 3, 0},
        {37, 8, 3, gvqPsAdagrad, 4, gvqFloat32, 2, 1},
        {5, 1, 2, gvqPsMomentum, 3, gvqFloat64, 1, 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int N = 1; N <= 4; N++)
            gvq_test_run(N, NULL, ref_rank, (void *)&cases[k]);
}

/* ---- answered while the owner is busy; staleness bounds ---------------------------------- */

/* Every rank pushes a gradient of 1 to every row each step; SGD with lr 1 from zero: a row's
 * value after v steps is -v N (exact), so a pull tells which steps it saw. */
typedef struct {
    int staleness;
    int pulled;  /* ranks done pulling (atomic) */
    int applied; /* rank 0's second apply began (atomic) */
} busy_t;

static void push_ones(gvqPs_t ps, size_t rows) {
    int64_t idx[8];
    float g[8];
    for (size_t r = 0; r < rows; r++)
        idx[r] = (int64_t)r, g[r] = 1.0f;
    EXPECT_RES(gvqPsPush(ps, idx, g, rows), gvqSuccess);
}

static void busy_rank(gvqComm_t comm, int rank, int nranks, void *arg) {
    busy_t *b = arg;
    enum { ROWS = 8 };
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    cfg.partitioning = gvqPsContiguous;
    cfg.learningRate = 1.0;
    cfg.serve = 1;
    cfg.staleness = b->staleness;
    gvqPs_t ps = NULL;
    EXPECT_RES(gvqPsCreate(comm, ROWS, 1, gvqFloat32, &cfg, &ps), gvqSuccess);
    if (ps == NULL) return;
    int64_t all[ROWS];
    float w[ROWS];
    for (int r = 0; r < ROWS; r++)
        all[r] = r;
    /* step 0 on every rank */
    push_ones(ps, ROWS);
    EXPECT_RES(gvqPsApply(ps), gvqSuccess);
    if (rank == 0) {
        /* busy elsewhere: no call on the handle until every other rank pulled (with staleness
         * 0 each needs step 0 of every rank, which rank 0 has ended) */
        int want = b->staleness == 0 ? nranks - 1 : 2 * (nranks - 1);
        EXPECT(wait_for(&b->pulled, want, 20000),
               "s %d: the other ranks' pulls were not answered while rank 0 was busy (%d of %d)",
               b->staleness, b->pulled, want);
        /* then step 1, which the others' second pulls wait for (s = 0) or have not (s >= 1:
         * with s ignored they would wait for it, and the wait above would fail) */
        push_ones(ps, ROWS);
        __atomic_store_n(&b->applied, 1, __ATOMIC_RELEASE);
        EXPECT_RES(gvqPsApply(ps), gvqSuccess);
    } else {
        EXPECT_RES(gvqPsPull(ps, all, w, ROWS), gvqSuccess); /* clock 1 */
        for (int r = 0; r < ROWS; r++)
            EXPECT(w[r] == -1.0f * nranks || (b->staleness > 0 && w[r] == 0.0f),
                   "s %d rank %d row %d after step 0: %g, want %d%s", b->staleness, rank, r, w[r],
                   -nranks, b->staleness > 0 ? " or 0" : "");
        __atomic_add_fetch(&b->pulled, 1, __ATOMIC_ACQ_REL);
        push_ones(ps, ROWS);
        EXPECT_RES(gvqPsApply(ps), gvqSuccess);
        /* clock 2: with s = 0 this waits for rank 0's step 1; with s >= 1 it need not */
        EXPECT_RES(gvqPsPull(ps, all, w, ROWS), gvqSuccess);
        int zero_applied = __atomic_load_n(&b->applied, __ATOMIC_ACQUIRE);
        __atomic_add_fetch(&b->pulled, 1, __ATOMIC_ACQ_REL);
        for (int r = 0; r < ROWS; r++) {
            int v = (int)lroundf(-w[r] / (float)nranks);
            EXPECT(w[r] == -(float)(v * nranks) && v >= 2 - b->staleness && v <= 2,
                   "s %d rank %d row %d at clock 2: %g (%d steps)", b->staleness, rank, r, w[r], v);
            if (b->staleness == 0)
                EXPECT(v == 2 && zero_applied, "s 0: the pull returned before rank 0's step 1");
        }
    }
    /* everyone at clock 2: the rows after both steps on every rank, whatever s */
    gvqResult_t res = gvqPsPull(ps, all, w, ROWS);
    EXPECT_RES(res, gvqSuccess);
    if (b->staleness == 0)
        for (int r = 0; r < ROWS && res == gvqSuccess; r++)
            EXPECT(w[r] == -2.0f * nranks, "rank %d row %d after step 1: %g", rank, r, w[r]);
    EXPECT_RES(gvqPsDestroy(ps), gvqSuccess);
}

static void test_busy_owner(void) {
    for (int s = 0; s <= 2; s++)
        for (int N = 2; N <= 4; N++) {
            busy_t b = {s, 0, 0};
            gvq_test_run(N, NULL, busy_rank, &b);
        }
}

/* A rank ahead by more than s waits for the others; by s or less it does not. With s = 1, rank
 * 1 runs two steps ahead of rank 0 and pulls: it must wait until rank 0 ends step 0. */
typedef struct {
    int zero_ended; /* atomic */
} ahead_t;

static void ahead_rank(gvqComm_t comm, int rank, int nranks, void *arg) {
    ahead_t *a = arg;
    (void)nranks;
    enum { ROWS = 4 };
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    cfg.partitioning = gvqPsContiguous;
    cfg.learningRate = 1.0;
    cfg.serve = 1;
    cfg.staleness = 1;
    gvqPs_t ps = NULL;
    EXPECT_RES(gvqPsCreate(comm, ROWS, 1, gvqFloat32, &cfg, &ps), gvqSuccess);
    if (ps == NULL) return;
    int64_t all[ROWS] = {0, 1, 2, 3};
    float w[ROWS];
    if (rank == 1) {
        for (int step = 0; step < 2; step++) {
            push_ones(ps, ROWS);
            EXPECT_RES(gvqPsApply(ps), gvqSuccess);
        }
        EXPECT_RES(gvqPsPull(ps, all, w, ROWS), gvqSuccess); /* needs step 0 of rank 0 */
        EXPECT(__atomic_load_n(&a->zero_ended, __ATOMIC_ACQUIRE),
               "s 1: a pull two steps ahead returned before the slowest rank ended its step");
        for (int r = 0; r < ROWS; r++)
            EXPECT(w[r] == -2.0f || w[r] == -4.0f, "row %d: %g", r, w[r]);
    } else {
        msleep(100); /* rank 1 is waiting in its pull by now (or will be) */
        push_ones(ps, ROWS);
        __atomic_store_n(&a->zero_ended, 1, __ATOMIC_RELEASE);
        EXPECT_RES(gvqPsApply(ps), gvqSuccess);
        push_ones(ps, ROWS);
        EXPECT_RES(gvqPsApply(ps), gvqSuccess);
    }
    EXPECT_RES(gvqPsDestroy(ps), gvqSuccess);
}

static void test_ahead(void) {
    ahead_t a = {0};
    gvq_test_run(2, NULL, ahead_rank, &a);
}

/* ---- concurrent traffic: every rank pushes and pulls at once, many steps ------------------- */

static void storm_rank(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)arg;
    enum { ROWS = 40, DIM = 4, STEPS = 30 };
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    cfg.learningRate = 1.0;
    cfg.serve = 1;
    gvqPs_t ps = NULL;
    EXPECT_RES(gvqPsCreate(comm, ROWS, DIM, gvqFloat64, &cfg, &ps), gvqSuccess);
    if (ps == NULL) return;
    int64_t idx[ROWS];
    double g[ROWS * DIM], w[ROWS * DIM], want[ROWS * DIM] = {0};
    for (int step = 0; step < STEPS; step++) {
        /* rank q pushes rows r with (r + q + step) % 3 == 0, value q + 1 in every column */
        for (int q = 0; q < nranks; q++)
            for (int r = 0; r < ROWS; r++)
                if ((r + q + step) % 3 == 0)
                    for (int j = 0; j < DIM; j++)
                        want[r * DIM + j] -= (double)(q + 1);
        size_t n = 0;
        for (int r = 0; r < ROWS; r++)
            if ((r + rank + step) % 3 == 0) {
                idx[n] = r;
                for (int j = 0; j < DIM; j++)
                    g[n * DIM + j] = (double)(rank + 1);
                n++;
            }
        EXPECT_RES(gvqPsPush(ps, idx, g, n), gvqSuccess);
        EXPECT_RES(gvqPsApply(ps), gvqSuccess);
        for (int r = 0; r < ROWS; r++)
            idx[r] = ROWS - 1 - r;
        EXPECT_RES(gvqPsPull(ps, idx, w, ROWS), gvqSuccess);
        for (int r = 0; r < ROWS; r++)
            for (int j = 0; j < DIM; j++)
                EXPECT(w[r * DIM + j] == want[(ROWS - 1 - r) * DIM + j],
                       "N %d rank %d step %d row %d: %g, want %g", nranks, rank, step, ROWS - 1 - r,
                       w[r * DIM + j], want[(ROWS - 1 - r) * DIM + j]);
    }
    EXPECT_RES(gvqPsDestroy(ps), gvqSuccess);
}

static void test_storm(void) {
    for (int N = 1; N <= 4; N++)
        gvq_test_run(N, NULL, storm_rank, NULL);
}

/* ---- failures: abort, timeout, refused input and configs ------------------------------------ */

typedef struct {
    gvqComm_t comm;
    int ms;
} abort_later_t;

static void *abort_later(void *p) {
    abort_later_t *a = p;
    msleep(a->ms);
    gvqCommAbort(a->comm);
    return NULL;
}

typedef struct {
    int phase; /* 0: abort while waiting, 1: timeout */
    int done;  /* atomic: rank 1's pull returned */
} fail_t;

static void fail_rank(gvqComm_t comm, int rank, int nranks, void *arg) {
    fail_t *f = arg;
    (void)nranks;
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    cfg.serve = 1;
    gvqPs_t ps = NULL;
    EXPECT_RES(gvqPsCreate(comm, 6, 2, gvqFloat32, &cfg, &ps), gvqSuccess);
    if (ps == NULL) return;
    int64_t all[6] = {0, 1, 2, 3, 4, 5};
    float w[12];
    if (rank == 1) {
        EXPECT_RES(gvqPsApply(ps), gvqSuccess); /* clock 1: a pull needs rank 0's step 0 */
        pthread_t th;
        abort_later_t a = {comm, 200};
        if (f->phase == 0) pthread_create(&th, NULL, abort_later, &a);
        EXPECT_RES(gvqPsPull(ps, all, w, 6), f->phase == 0 ? gvqInvalidUsage : gvqTimeout);
        if (f->phase == 0) pthread_join(th, NULL);
        __atomic_store_n(&f->done, 1, __ATOMIC_RELEASE);
        if (f->phase == 1) /* the handle failed: every later call says so */
            EXPECT_RES(gvqPsPull(ps, all, w, 6), gvqTimeout);
    } else {
        EXPECT(wait_for(&f->done, 1, 20000), "rank 1's pull never returned");
    }
    EXPECT_RES(gvqPsDestroy(ps), gvqSuccess);
}

static void test_failures(void) {
    gvqConfig_t cc = GVQ_CONFIG_INITIALIZER;
    cc.timeoutMs = 700;
    for (int phase = 0; phase < 2; phase++) {
        fail_t f = {phase, 0};
        gvq_test_run(2, &cc, fail_rank, &f);
    }
}

static void refuse_rank(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)arg;
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    gvqPs_t ps = NULL;
    cfg.staleness = 1; /* without serve */
    EXPECT_RES(gvqPsCreate(comm, 6, 2, gvqFloat32, &cfg, &ps), gvqInvalidArgument);
    cfg.serve = 2, cfg.staleness = 0;
    EXPECT_RES(gvqPsCreate(comm, 6, 2, gvqFloat32, &cfg, &ps), gvqInvalidArgument);
    cfg.serve = 1, cfg.staleness = -1;
    EXPECT_RES(gvqPsCreate(comm, 6, 2, gvqFloat32, &cfg, &ps), gvqInvalidArgument);
    cfg.staleness = 0, cfg.localAggregation = 1;
    EXPECT_RES(gvqPsCreate(comm, 6, 2, gvqFloat32, &cfg, &ps), gvqInvalidArgument);
    /* ranks that differ in serve: refused on every rank, before any thread starts */
    cfg.localAggregation = 0;
    cfg.serve = rank == nranks - 1;
    EXPECT_RES(gvqPsCreate(comm, 6, 2, gvqFloat32, &cfg, &ps),
               nranks > 1 ? gvqInvalidArgument : gvqSuccess);
    if (nranks == 1) gvqPsDestroy(ps);
    cfg.serve = 1;
    EXPECT_RES(gvqPsCreate(comm, 6, 2, gvqFloat32, &cfg, &ps), gvqSuccess);
    if (ps == NULL) return;
    int64_t bad[2] = {1, 6};
    float g[4] = {1, 1, 1, 1};
    /* a refusal is this rank's alone; the others go on */
    if (rank == 0) EXPECT_RES(gvqPsPush(ps, bad, g, 2), gvqInvalidArgument);
    if (rank == 0) EXPECT_RES(gvqPsPull(ps, bad, g, 2), gvqInvalidArgument);
    EXPECT_RES(gvqPsPush(ps, NULL, g, 1), gvqInvalidArgument);
    int64_t ok[2] = {1, 5};
    EXPECT_RES(gvqPsPush(ps, ok, g, 2), gvqSuccess);
    EXPECT_RES(gvqPsApply(ps), gvqSuccess);
    EXPECT_RES(gvqPsPull(ps, ok, g, 2), gvqSuccess);
    for (int j = 0; j < 4; j++)
        EXPECT(fabsf(g[j] + 0.01f * nranks) < 1e-6f, "element %d: %g", j, g[j]);
    EXPECT_RES(gvqPsDestroy(ps), gvqSuccess);
}

static void test_refusals(void) {
    for (int N = 1; N <= 3; N++)
        gvq_test_run(N, NULL, refuse_rank, NULL);
}

/* ---- a malicious peer ------------------------------------------------------------------------
 * Rank 1 sends rank 0's server messages of its own making (below the public API, on the tags of
 * the communicator's first served handle): an unknown op, a push of more rows than rank 0 holds,
 * a push of a row rank 0 does not hold, a step ended out of sequence. Rank 0's shards must stay
 * as they were, its own calls then fail with gvqRemoteError, and rank 2's pull of rank 0's rows
 * is answered with a refusal (gvqRemoteError), not with rows. */
typedef struct {
    int mode;
    int failed_seen; /* atomic: rank 0's handle reported the failure */
} rogue_t;

static void rogue_rank(gvqComm_t comm, int rank, int nranks, void *arg) {
    rogue_t *e = arg;
    (void)nranks;
    const size_t rows = 30, dim = 2;
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    cfg.partitioning = gvqPsContiguous; /* rank 0 holds rows 0..9 */
    cfg.init = gvqPsInitUniform;
    cfg.serve = 1;
    gvqPs_t ps = NULL;
    EXPECT_RES(gvqPsCreate(comm, rows, dim, gvqFloat32, &cfg, &ps), gvqSuccess);
    if (ps == NULL) return;
    int64_t own[2] = {3, 4};
    float vals[4];
    if (rank == 0) {
        size_t n0 = 0, n1 = 0;
        gvqPsSave(ps, NULL, &n0);
        char *before = malloc(n0), *after = malloc(n0 + 64);
        gvqPsSave(ps, before, &n0);
        gvqResult_t res = gvqSuccess;
        for (int t = 0; t < 10000 && res == gvqSuccess; t++) { /* its own rows: no message */
            res = gvqPsPull(ps, own, vals, 2);
            if (res == gvqSuccess) msleep(1);
        }
        EXPECT_RES(res, gvqRemoteError);
        EXPECT_RES(gvqPsApply(ps), gvqRemoteError);
        __atomic_store_n(&e->failed_seen, 1, __ATOMIC_RELEASE);
        n1 = n0 + 64;
        gvqPsSave(ps, after, &n1);
        EXPECT(n1 == n0 && memcmp(before, after, n0) == 0,
               "mode %d: rank 0's shard changed after a malformed message", e->mode);
        free(before), free(after);
    } else if (rank == 1) {
        gvq_transport_t *t = comm->xport;
        int64_t hdr[4] = {1 /* PUSH */, 0, 1, 0};
        int64_t blk[2] = {3, 0}; /* one row: index, then dim floats */
        if (e->mode == 0) hdr[0] = 99;
        if (e->mode == 1) hdr[2] = 11;            /* rank 0 holds 10 rows */
        if (e->mode == 2) blk[0] = 12;            /* held by rank 1 */
        if (e->mode == 3) hdr[0] = 2, hdr[1] = 5; /* CLOCK of step 5 first */
        gvq_req_t req[2];
        memset(req, 0, sizeof req);
        t->ops->isend(t, 0, 64, hdr, sizeof hdr, &req[0]); /* the first handle's request tag */
        if (e->mode == 2) t->ops->isend(t, 0, 65, blk, sizeof blk, &req[1]);
        gvq_xport_waitall(t, req, 2, "rogue");
    } else {
        EXPECT(wait_for(&e->failed_seen, 1, 20000), "mode %d: rank 0 never failed", e->mode);
        /* a step that cannot complete on rank 0 (rank 1 is no longer listened to): the pull
         * waiting for it is refused at once, not left to the timeout */
        EXPECT_RES(gvqPsApply(ps), gvqSuccess);
        memset(vals, 0x7f, sizeof vals);
        EXPECT_RES(gvqPsPull(ps, own, vals, 2), gvqRemoteError);
    }
    gvqPsDestroy(ps); /* a failed server still answers until the others' goodbyes */
}

static void test_rogue(void) {
    gvqConfig_t cc = GVQ_CONFIG_INITIALIZER;
    cc.timeoutMs = 500;
    for (int mode = 0; mode <= 3; mode++) {
        rogue_t e = {mode, 0};
        gvq_test_run(3, &cc, rogue_rank, &e);
    }
}

/* ---- save and load at a step boundary ------------------------------------------------------- */

static void save_rank(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)arg, (void)nranks;
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    cfg.serve = 1;
    cfg.rule = gvqPsAdagrad;
    cfg.init = gvqPsInitUniform;
    gvqPs_t ps = NULL, back = NULL;
    EXPECT_RES(gvqPsCreate(comm, 9, 3, gvqFloat32, &cfg, &ps), gvqSuccess);
    EXPECT_RES(gvqPsCreate(comm, 9, 3, gvqFloat32, &cfg, &back), gvqSuccess);
    if (ps == NULL || back == NULL) return;
    int64_t all[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    float g[27], a[27], b[27];
    for (int k = 0; k < 27; k++)
        g[k] = (float)((k * 5 + rank) % 7) - 3.0f;
    for (int step = 0; step < 3; step++) {
        EXPECT_RES(gvqPsPush(ps, all, g, 9), gvqSuccess);
        EXPECT_RES(gvqPsApply(ps), gvqSuccess);
        EXPECT_RES(gvqPsApply(back), gvqSuccess);
    }
    EXPECT_RES(gvqPsPull(ps, all, a, 9), gvqSuccess); /* every rank at step 3 */
    size_t n = 0;
    EXPECT_RES(gvqPsSave(ps, NULL, &n), gvqSuccess);
    char *buf = malloc(n);
    EXPECT_RES(gvqPsSave(ps, buf, &n), gvqSuccess);
    EXPECT_RES(gvqPsLoad(back, buf, n), gvqSuccess);
    free(buf);
    /* another rank's pull may reach rank q's server before q loaded: compare after a step
     * that every rank ends after loading */
    EXPECT_RES(gvqPsApply(back), gvqSuccess);
    EXPECT_RES(gvqPsApply(ps), gvqSuccess);
    EXPECT_RES(gvqPsPull(back, all, b, 9), gvqSuccess);
    EXPECT_RES(gvqPsPull(ps, all, a, 9), gvqSuccess);
    EXPECT(memcmp(a, b, sizeof a) == 0, "rank %d: the loaded server differs", rank);
    EXPECT_RES(gvqPsDestroy(back), gvqSuccess);
    EXPECT_RES(gvqPsDestroy(ps), gvqSuccess);
}

static void test_save_load(void) {
    for (int N = 1; N <= 3; N++)
        gvq_test_run(N, NULL, save_rank, NULL);
}

int main(void) {
    test_reference();
    test_busy_owner();
    test_ahead();
    test_storm();
    test_failures();
    test_refusals();
    test_rogue();
    test_save_load();
    return gvq_test_finish("test_ps_serve");
}
