/*
 * test_ps_commit.c -- a parameter server through lost ranks (gvqPsCommit, gvqPsRecover;
 * src/sparse/ps_commit.c) over in-process ranks. Each case:
 *
 *   old communicator, N ranks: steps of pushes, commit, pull every row (the commit's table C),
 *       one more step X, pull every row (the table X)
 *   the ranks left out drop their handle; a new communicator of the survivors (and newcomers,
 *       which bring no handle) recovers: every row equals C, bitwise;
 *   the new ranks push step X's rows between them (another split of the same rows; the
 *       gradients are multiples of 1/8, so their sums are exact in any order): every row then
 *       equals X, bitwise -- the values and the rule's state (momentum, Adagrad) came back;
 *   the recovered handle commits again.
 *
 * Cases: shrinks of 4 -> 3, 4 -> 2 (two lost ranks, not neighbours), 2 -> 1, a shrink and a
 * newcomer (3 -> 2 + 1), growth from one rank (1 -> 1 + 1), other partitions and
 * partitionings on the new server, the old communicator destroyed before the recovery, the
 * served mode (staleness 0). Refused: two neighbours lost (gvqRemoteError on every rank), a
 * commit with rows pushed and not applied, nobody with a commit, a handle of another shape or
 * update rule.
 * The decision itself on given fields: a rank one commit ahead of another (a failure in the
 * middle of a commit) recovers the commit both hold; two apart, sizes that differ, one former
 * rank claimed twice, a former rank outside the old size are refused.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "gvq_comm.h"
#include "gvq_ps.h"
#include "gvq_test.h"

#define MAXR 8

typedef struct {
    const char *name;
    int old_n;        /* ranks of the old communicator */
    int new_of[MAXR]; /* per old rank: its rank in the new communicator, -1: lost */
    int newcomers;    /* processes of the new communicator that had no handle */
    int rule, dtype, partitioning;
    int old_p, new_p;     /* partitions (0: the default, the rank count) */
    int serve;            /* both servers served */
    int destroy_old_comm; /* survivors destroy the old communicator before recovering */
    gvqResult_t want;     /* gvqSuccess, or what every recovering rank must get */
    /* filled by the runner */
    gvqComm_t old_comms[MAXR], new_comms[MAXR];
    int new_n;
    size_t rows, dim;
    char *table_c, *table_x; /* written by old rank 0 */
    pthread_barrier_t phase; /* the old ranks' tables are written before anyone compares */
} case_t;

/* The rows and gradients rank r pushes at step s: a pure function, duplicates included, each
 * gradient a multiple of 1/8 between -8 and 8. */
static size_t step_rows(const case_t *c, int r, int s, int64_t *idx, double *g) {
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(r * 131 + s * 7 + 1);
    size_t n = 3 + (size_t)((x >> 9) % 10);
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        idx[i] = (int64_t)(x % c->rows);
        for (size_t j = 0; j < c->dim; j++)
            g[i * c->dim + j] = (double)((int)((x >> (j + 5)) % 129) - 64) / 8.0;
    }
    return n;
}

static size_t esize(const case_t *c) {
    return c->dtype == gvqFloat32 ? 4 : 8;
}

static void typed(const case_t *c, const double *in, void *out, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (c->dtype == gvqFloat32)
            ((float *)out)[i] = (float)in[i];
        else
            ((double *)out)[i] = in[i];
}

static gvqPsConfig_t config_of(const case_t *c, int partitions) {
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    if (partitions > 0) cfg.partitions = partitions;
    cfg.partitioning = c->partitioning;
    cfg.rule = c->rule;
    cfg.learningRate = 0.125;
    cfg.init = gvqPsInitUniform;
    cfg.seed = 5;
    cfg.serve = c->serve;
    return cfg;
}

/* Push the rows old rank r pushes at step s. */
static void push_step(const case_t *c, gvqPs_t ps, int r, int s) {
    int64_t idx[16];
    double g[16 * 4];
    char gt[16 * 4 * 8];
    size_t n = step_rows(c, r, s, idx, g);
    typed(c, g, gt, n * c->dim);
    EXPECT_RES(gvqPsPush(ps, idx, gt, n), gvqSuccess);
}

static void pull_all(const case_t *c, gvqPs_t ps, char *out) {
    int64_t all[64];
    for (size_t i = 0; i < c->rows; i++)
        all[i] = (int64_t)i;
    EXPECT_RES(gvqPsPull(ps, all, out, c->rows), gvqSuccess);
}

enum { STEPS = 3, STEP_X = 100 };

/* The old communicator's part; returns the handle a survivor keeps (NULL if lost). */
static gvqPs_t old_part(case_t *c, int r) {
    gvqComm_t comm = c->old_comms[r];
    gvqPsConfig_t cfg = config_of(c, c->old_p);
    gvqPs_t ps = NULL;
    EXPECT_RES(gvqPsCreate(comm, c->rows, c->dim, c->dtype, &cfg, &ps), gvqSuccess);
    if (ps == NULL) return NULL;
    size_t bytes = c->rows * c->dim * esize(c);
    char *t = malloc(bytes);
    for (int s = 0; s < STEPS; s++) {
        push_step(c, ps, r, s);
        if (s == 0 && c->want == gvqInvalidUsage) /* refused: pushed and not applied */
            EXPECT_RES(gvqPsCommit(ps), gvqInvalidUsage);
        EXPECT_RES(gvqPsApply(ps), gvqSuccess);
        EXPECT_RES(gvqPsCommit(ps), gvqSuccess); /* three commits: the third reuses the first's
                                                  * buffers; the last one is recovered */
    }
    pull_all(c, ps, t);
    if (r == 0) memcpy(c->table_c, t, bytes);
    push_step(c, ps, r, STEP_X);
    EXPECT_RES(gvqPsApply(ps), gvqSuccess);
    pull_all(c, ps, t);
    if (r == 0) memcpy(c->table_x, t, bytes);
    free(t);
    return ps;
}

/* The new communicator's part: recover from `from` (NULL: a newcomer). */
static void new_part(case_t *c, int nr, gvqPs_t from) {
    gvqPsConfig_t cfg = config_of(c, c->new_p);
    gvqPs_t ps = NULL;
    gvqResult_t res = gvqPsRecover(from, c->new_comms[nr], c->rows, c->dim, c->dtype, &cfg, &ps);
    gvqResult_t want = c->want == gvqInvalidUsage ? gvqSuccess : c->want;
    EXPECT(res == want, "%s: new rank %d: gvqPsRecover returned %s, expected %s (%s)", c->name, nr,
           gvqGetErrorString(res), gvqGetErrorString(want), gvqGetLastError(NULL));
    if (res != gvqSuccess || ps == NULL) return;
    size_t bytes = c->rows * c->dim * esize(c);
    char *t = malloc(bytes);
    memset(t, 0x5a, bytes);
    pull_all(c, ps, t);
    EXPECT(memcmp(t, c->table_c, bytes) == 0,
           "%s: new rank %d: the recovered rows differ from "
           "the commit's",
           c->name, nr);
    /* step X's rows, split among the new ranks; pushes are collective: the same count on every
     * rank, empty where a rank has no old rank's rows left */
    for (int k = 0; k * c->new_n < c->old_n; k++) {
        int q = k * c->new_n + nr;
        if (q < c->old_n)
            push_step(c, ps, q, STEP_X);
        else
            EXPECT_RES(gvqPsPush(ps, NULL, NULL, 0), gvqSuccess);
    }
    EXPECT_RES(gvqPsApply(ps), gvqSuccess);
    memset(t, 0x5a, bytes);
    pull_all(c, ps, t);
    EXPECT(memcmp(t, c->table_x, bytes) == 0,
           "%s: new rank %d: step X after the recovery "
           "differs from step X after the commit (values or rule state lost)",
           c->name, nr);
    EXPECT_RES(gvqPsCommit(ps), gvqSuccess);
    gvqPsStats_t st;
    EXPECT_RES(gvqPsGetStats(ps, &st), gvqSuccess);
    EXPECT_RES(gvqPsDestroy(ps), gvqSuccess);
    free(t);
}

typedef struct {
    case_t *c;
    int old_rank, new_rank;
} role_t;

static void *role_main(void *arg) {
    role_t *ro = arg;
    case_t *c = ro->c;
    gvqPs_t ps = ro->old_rank >= 0 ? old_part(c, ro->old_rank) : NULL;
    pthread_barrier_wait(&c->phase);
    if (ro->old_rank >= 0 && (ro->new_rank < 0 || c->destroy_old_comm)) {
        EXPECT_RES(gvqCommDestroy(c->old_comms[ro->old_rank]), gvqSuccess);
        c->old_comms[ro->old_rank] = NULL;
    }
    if (ro->new_rank < 0) { /* lost: its memory goes with it */
        if (ps != NULL) gvqPsDestroy(ps);
        return NULL;
    }
    new_part(c, ro->new_rank, ps);
    if (ps != NULL) EXPECT_RES(gvqPsDestroy(ps), gvqSuccess);
    return NULL;
}

static void run_case(case_t *c) {
    c->rows = 37, c->dim = 3;
    c->new_n = c->newcomers;
    for (int q = 0; q < c->old_n; q++)
        c->new_n += c->new_of[q] >= 0;
    size_t bytes = c->rows * c->dim * esize(c);
    c->table_c = malloc(bytes), c->table_x = malloc(bytes);
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = 20000;
    if (gvq_comm_init_inproc(c->old_n, &cfg, c->old_comms) != gvqSuccess ||
        gvq_comm_init_inproc(c->new_n, &cfg, c->new_comms) != gvqSuccess) {
        EXPECT(0, "%s: cannot make the in-process communicators", c->name);
        return;
    }
    role_t roles[2 * MAXR];
    pthread_t tid[2 * MAXR];
    int n = 0;
    for (int q = 0; q < c->old_n; q++)
        roles[n++] = (role_t){c, q, c->new_of[q]};
    for (int k = 0; k < c->newcomers; k++) /* the newcomers take the new ranks above */
        roles[n++] = (role_t){c, -1, c->new_n - c->newcomers + k};
    pthread_barrier_init(&c->phase, NULL, (unsigned)n);
    for (int i = 0; i < n; i++)
        pthread_create(&tid[i], NULL, role_main, &roles[i]);
    for (int i = 0; i < n; i++)
        pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&c->phase);
    for (int q = 0; q < c->old_n; q++)
        if (c->old_comms[q] != NULL) gvqCommDestroy(c->old_comms[q]);
    for (int r = 0; r < c->new_n; r++)
        gvqCommDestroy(c->new_comms[r]);
    free(c->table_c), free(c->table_x);
}

/* ---- refusals ------------------------------------------------------------------------------- */

static void refusals_rank(gvqComm_t comm, int rank, int nranks, void *arg) {
    (void)arg;
    (void)nranks;
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    gvqPs_t ps = NULL, other = NULL, out = NULL;
    EXPECT_RES(gvqPsCreate(comm, 20, 2, gvqFloat32, &cfg, &ps), gvqSuccess);
    /* nobody has a commit: refused on every rank, no handle */
    EXPECT_RES(gvqPsRecover(ps, comm, 20, 2, gvqFloat32, &cfg, &out), gvqInvalidUsage);
    EXPECT(out == NULL, "a refused recovery gave a handle");
    EXPECT_RES(gvqPsRecover(NULL, comm, 20, 2, gvqFloat32, &cfg, &out), gvqInvalidUsage);
    EXPECT_RES(gvqPsCommit(ps), gvqSuccess);
    /* a handle of another shape on one rank: every rank refuses */
    EXPECT_RES(gvqPsRecover(ps, comm, rank == 1 ? 20 : 21, 2, gvqFloat32, &cfg, &out),
               gvqInvalidArgument); /* gvqPsCreate's agreement on the shape */
    EXPECT_RES(gvqPsCreate(comm, 21, 2, gvqFloat32, &cfg, &other), gvqSuccess);
    EXPECT_RES(gvqPsCommit(other), gvqSuccess);
    EXPECT_RES(gvqPsRecover(rank == 0 ? other : ps, comm, 20, 2, gvqFloat32, &cfg, &out),
               gvqInvalidUsage);
    /* another update rule: the records hold no momentum to carry */
    gvqPsConfig_t mom = GVQ_PS_CONFIG_INITIALIZER;
    mom.rule = gvqPsMomentum;
    EXPECT_RES(gvqPsRecover(ps, comm, 20, 2, gvqFloat32, &mom, &out), gvqInvalidUsage);
    /* not a handle */
    EXPECT_RES(gvqPsRecover((gvqPs_t)&cfg, comm, 20, 2, gvqFloat32, &cfg, &out),
               gvqInvalidArgument);
    /* one rank refuses its own call: it still takes part, so the others fail at once with
     * gvqRemoteError instead of waiting out the 20 s timeout (they did before 2026-11-29) */
    EXPECT_RES(gvqPsRecover(rank == 2 ? (gvqPs_t)&cfg : ps, comm, 20, 2, gvqFloat32, &cfg, &out),
               rank == 2 ? gvqInvalidArgument : gvqRemoteError);
    EXPECT(out == NULL, "a recovery refused on another rank gave a handle");
    /* no place for the handle on one rank (it crashed at the end of the recovery before) */
    EXPECT_RES(gvqPsRecover(ps, comm, 20, 2, gvqFloat32, &cfg, rank == 0 ? NULL : &out),
               rank == 0 ? gvqInvalidArgument : gvqRemoteError);
    EXPECT(out == NULL, "a recovery refused on rank 0 gave a handle");
    EXPECT_RES(gvqPsCreate(comm, 20, rank == 0 ? 0 : 2, gvqFloat32, &cfg, &out),
               rank == 0 ? gvqInvalidArgument : gvqRemoteError);
    gvqPsConfig_t bad = GVQ_PS_CONFIG_INITIALIZER;
    bad.staleness = 1; /* without serve: refused by the config's checks */
    EXPECT_RES(gvqPsCreate(comm, 20, 2, gvqFloat32, rank == 1 ? &bad : &cfg, &out),
               rank == 1 ? gvqInvalidArgument : gvqRemoteError);
    EXPECT(out == NULL, "a server refused on another rank was made");
    /* and the communicator goes on: the same call, right on every rank */
    EXPECT_RES(gvqPsCreate(comm, 20, 2, gvqFloat32, &cfg, &out), gvqSuccess);
    gvqPsDestroy(out);
    EXPECT_RES(gvqPsCommit(NULL), gvqInvalidArgument);
    gvqPsDestroy(ps);
    gvqPsDestroy(other);
}

/* ---- the recovery's decision on given fields (gvq_ps_plan_recovery) ------------------------- */

typedef struct {
    int64_t old_rank, old_size, serial0, serial1;
} member_t;

/* Fields of n new ranks; buddy of old rank q is q - 1 mod old_size; old_rank -1: a newcomer. */
static gvqResult_t plan(const member_t *m, int n, gvq_ps_plan_t *pl) {
    int64_t all[8 * GVQ_PSR_FIELDS];
    for (int p = 0; p < n; p++) {
        int64_t *f = all + p * GVQ_PSR_FIELDS;
        f[GVQ_PSR_OLD_RANK] = m[p].old_rank, f[GVQ_PSR_OLD_SIZE] = m[p].old_size;
        f[GVQ_PSR_SERIAL0] = m[p].serial0, f[GVQ_PSR_SERIAL1] = m[p].serial1;
        f[GVQ_PSR_BUDDY_OF] = m[p].old_rank < 0 || m[p].old_size < 2
                                  ? -1
                                  : (m[p].old_rank + m[p].old_size - 1) % m[p].old_size;
        f[GVQ_PSR_BAD] = 0;
    }
    return gvq_ps_plan_recovery("test", all, n, pl);
}

static void test_plans(void) {
    gvq_ps_plan_t pl;
    /* old rank 1 finished commit 6, old rank 0 did not (a failure in the middle of it), old rank
     * 2 is gone: commit 5, which both hold; 2's rows from old rank 0's copy */
    member_t ahead[3] = {{0, 3, 5, 4}, {1, 3, 6, 5}, {-1, 0, 0, 0}};
    EXPECT_RES(plan(ahead, 3, &pl), gvqSuccess);
    EXPECT(pl.serial == 5 && pl.old_n == 3, "picked commit %llu of %d ranks",
           (unsigned long long)pl.serial, pl.old_n);
    if (pl.source != NULL && pl.old_n == 3)
        EXPECT(pl.source[0] == 0 && !pl.from_buddy[0] && pl.source[1] == 1 && !pl.from_buddy[1] &&
                   pl.source[2] == 0 && pl.from_buddy[2],
               "sources %d/%d %d/%d %d/%d", pl.source[0], pl.from_buddy[0], pl.source[1],
               pl.from_buddy[1], pl.source[2], pl.from_buddy[2]);
    free(pl.source), free(pl.from_buddy);
    /* two commits apart: the older rank no longer holds the newer's commit, nor the other way */
    member_t apart[2] = {{0, 2, 5, 4}, {1, 2, 7, 6}};
    EXPECT_RES(plan(apart, 2, &pl), gvqInvalidUsage);
    free(pl.source), free(pl.from_buddy);
    member_t sizes[2] = {{0, 2, 3, 2}, {1, 3, 3, 2}};
    EXPECT_RES(plan(sizes, 2, &pl), gvqInvalidUsage);
    free(pl.source), free(pl.from_buddy);
    member_t twice[2] = {{1, 3, 3, 2}, {1, 3, 3, 2}};
    EXPECT_RES(plan(twice, 2, &pl), gvqInvalidUsage);
    free(pl.source), free(pl.from_buddy);
    member_t nobody[2] = {{-1, 0, 0, 0}, {-1, 0, 0, 0}};
    EXPECT_RES(plan(nobody, 2, &pl), gvqInvalidUsage);
    free(pl.source), free(pl.from_buddy);
    member_t outside[1] = {{4, 3, 3, 2}};
    EXPECT_RES(plan(outside, 1, &pl), gvqInvalidUsage);
    free(pl.source), free(pl.from_buddy);
    /* 5 ranks, 1 and 3 gone: from 2's and 4's copies; 1 and 2 gone: 1's rows lost */
    member_t gaps[3] = {{0, 5, 9, 8}, {2, 5, 9, 8}, {4, 5, 9, 8}};
    EXPECT_RES(plan(gaps, 3, &pl), gvqSuccess);
    if (pl.source != NULL)
        EXPECT(pl.source[1] == 1 && pl.from_buddy[1] && pl.source[3] == 2 && pl.from_buddy[3],
               "5 ranks less 1 and 3: sources %d %d", pl.source[1], pl.source[3]);
    free(pl.source), free(pl.from_buddy);
    member_t lost[3] = {{0, 5, 9, 8}, {3, 5, 9, 8}, {4, 5, 9, 8}};
    EXPECT_RES(plan(lost, 3, &pl), gvqRemoteError);
    free(pl.source), free(pl.from_buddy);
}

int main(void) {
    test_plans();
    case_t cases[] = {
        {.name = "4 -> 3, SGD float32",
         .old_n = 4,
         .new_of = {0, 1, -1, 2},
         .rule = gvqPsSgd,
         .dtype = gvqFloat32,
         .want = gvqSuccess},
        {.name = "4 -> 2 (1 and 3 lost), momentum float64, hashed P 8, old comm destroyed",
         .old_n = 4,
         .new_of = {0, -1, 1, -1},
         .rule = gvqPsMomentum,
         .dtype = gvqFloat64,
         .old_p = 8,
         .new_p = 8,
         .destroy_old_comm = 1,
         .want = gvqSuccess},
        {.name = "3 -> 2 + a newcomer, Adagrad float32, contiguous, P 5 -> 7",
         .old_n = 3,
         .new_of = {-1, 0, 1},
         .newcomers = 1,
         .rule = gvqPsAdagrad,
         .dtype = gvqFloat32,
         .partitioning = gvqPsContiguous,
         .old_p = 5,
         .new_p = 7,
         .want = gvqSuccess},
        {.name = "2 -> 1, momentum float32",
         .old_n = 2,
         .new_of = {-1, 0},
         .rule = gvqPsMomentum,
         .dtype = gvqFloat32,
         .want = gvqSuccess},
        {.name = "1 -> 1 + a newcomer, Adagrad float64",
         .old_n = 1,
         .new_of = {0},
         .newcomers = 1,
         .rule = gvqPsAdagrad,
         .dtype = gvqFloat64,
         .want = gvqSuccess},
        {.name = "served, 3 -> 2, momentum float32, old comm destroyed",
         .old_n = 3,
         .new_of = {0, -1, 1},
         .rule = gvqPsMomentum,
         .dtype = gvqFloat32,
         .serve = 1,
         .destroy_old_comm = 1,
         .want = gvqSuccess},
        {.name = "4 -> 2 with neighbours 1 and 2 lost: refused",
         .old_n = 4,
         .new_of = {0, -1, -1, 1},
         .rule = gvqPsSgd,
         .dtype = gvqFloat32,
         .want = gvqRemoteError},
        {.name = "a commit with rows not applied is refused, then 3 -> 3 reordered",
         .old_n = 3,
         .new_of = {2, 0, 1},
         .rule = gvqPsAdagrad,
         .dtype = gvqFloat64,
         .want = gvqInvalidUsage},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].partitioning == 0) cases[i].partitioning = gvqPsHashed;
        run_case(&cases[i]);
    }
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = 20000;
    gvq_test_run(3, &cfg, refusals_rank, NULL);
    return gvq_test_finish("test_ps_commit");
}
