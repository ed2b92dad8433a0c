/*
 * test_shrink.c -- gvqCommShrink over the transport of GVQ_TRANSPORT (MPI or UCX). One scenario
 * per argv[1]:
 *
 *   exclude  a healthy communicator less given ranks (the last; at 4 ranks and more also rank
 *            1): the excluded ranks do not call; every survivor gets a communicator of the
 *            survivors in parent order, its sums exact; it is shrunk again (less its rank 0),
 *            which needs the shrunk communicator's own spare on UCX; bad arguments refused;
 *            then the excluded ranks join again (gvqCommGrow): the members keep their ranks,
 *            the newcomers take the ranks above them.
 *   stall    the last rank stops (SIGSTOP) in the middle of its allreduces (stall-ps: of its
 *            parameter-server pushes; stall-qsgd: of its 4-bit QSGD calls); the others' call
 *            times out and they shrink with GVQ_SHRINK_ABORT. With 3 ranks or more they get the
 *            communicator of the others; at 2 ranks the survivor is not a majority and gets
 *            gvqRemoteError, then shrinks again with GVQ_SHRINK_NO_QUORUM. The stopped rank is
 *            resumed afterwards and its own shrink must fail: it must not go on alone.
 *
 * A parameter server commits before the shrink (exclude, stall-ps); the survivors recover it on
 * their communicator (gvqPsRecover) and, in exclude, the grown one with the newcomers: the rows
 * pulled whole afterwards must be the commit's, bit for bit.
 *
 * Expected values come from the definition (which parent ranks remain), never from gvq.
 */
#include <pthread.h>

#include "mpitest.h"

#define TIMEOUT_MS 1000
#define BIG ((size_t)1 << 18)

/* parent rank p's value i: small integers, so every float sum is exact */
static float val(int p, size_t i) {
    return (float)((int)((i * 7 + (size_t)p * 13) % 41) - 20);
}

static gvqComm_t comm_with_timeout(int timeout_ms) {
    gvqUniqueId id;
    memset(&id, 0, sizeof id);
    if (mt.rank == 0) MT_OK(gvqGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = timeout_ms;
    gvqComm_t comm = NULL;
    MT_OK(gvqCommInitRankConfig(&comm, mt.nranks, id, mt.rank, &cfg));
    if (comm == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
    return comm;
}

/* c must hold the parent ranks members[0..m) in that order, this one among them: its count,
 * rank, everyone's parent rank (allgather) and an exact sum of `count` values. */
static void check_members(gvqComm_t c, int parent_rank, const int *members, int m, size_t count,
                          const char *what) {
    int cn = -1, cr = -1, want = -1;
    for (int k = 0; k < m; k++)
        if (members[k] == parent_rank) want = k;
    MT_OK(gvqCommCount(c, &cn));
    MT_OK(gvqCommUserRank(c, &cr));
    MT_CHECK(cn == m && cr == want, "%s: rank %d of %d, want %d of %d", what, cr, cn, want, m);
    if (cn != m) return;
    int32_t mine = parent_rank, *all = calloc((size_t)m, sizeof *all);
    MT_OK(gvqAllGather(&mine, all, 1, gvqInt32, c, NULL));
    for (int k = 0; k < m; k++)
        MT_CHECK(all[k] == members[k], "%s: member %d is parent rank %d, want %d", what, k, all[k],
                 members[k]);
    free(all);
    float *x = malloc(count * sizeof *x), *y = malloc(count * sizeof *y);
    for (size_t i = 0; i < count; i++)
        x[i] = val(parent_rank, i);
    MT_OK(gvqAllReduce(x, y, count, gvqFloat32, gvqSum, c, NULL));
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        float s = 0;
        for (int k = 0; k < m; k++)
            s += val(members[k], i);
        bad += y[i] != s;
    }
    MT_CHECK(bad == 0, "%s: allreduce of %zu: %zu wrong", what, count, bad);
    free(x);
    free(y);
}

/* ---- a parameter server's rows through the shrink and the grow (gvqPsCommit, gvqPsRecover):
 * committed after three steps of gradients that are multiples of 1/8 and pulled whole by every
 * rank; the server recovered on the new communicator must hold that table bit for bit, whichever
 * ranks are gone (a lost rank's rows come from the copy its next rank kept). */
#define PS_ROWS 1024
#define PS_DIM 8

static gvqPsConfig_t ps_config(void) {
    gvqPsConfig_t cfg = GVQ_PS_CONFIG_INITIALIZER;
    cfg.rule = gvqPsMomentum;
    cfg.learningRate = 0.125;
    cfg.init = gvqPsInitUniform;
    cfg.seed = 3;
    return cfg;
}

static void ps_pull_all(gvqPs_t ps, float *table) {
    int64_t *all = malloc(PS_ROWS * sizeof *all);
    for (int64_t i = 0; i < PS_ROWS; i++)
        all[i] = i;
    MT_OK(gvqPsPull(ps, all, table, PS_ROWS));
    free(all);
}

static gvqPs_t ps_committed(gvqComm_t comm, float *table) {
    gvqPsConfig_t cfg = ps_config();
    gvqPs_t ps = NULL;
    MT_OK(gvqPsCreate(comm, PS_ROWS, PS_DIM, gvqFloat32, &cfg, &ps));
    if (ps == NULL) return NULL;
    int64_t idx[32];
    float g[32 * PS_DIM];
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < 32; i++) {
            idx[i] = (i * 37 + mt.rank * 11 + s) % PS_ROWS;
            for (int j = 0; j < PS_DIM; j++)
                g[i * PS_DIM + j] = (float)((i + j + mt.rank + s) % 17 - 8) / 8.0f;
        }
        MT_OK(gvqPsPush(ps, idx, g, 32));
        MT_OK(gvqPsApply(ps));
    }
    MT_OK(gvqPsCommit(ps));
    ps_pull_all(ps, table);
    return ps;
}

static gvqPs_t ps_recovered(gvqPs_t from, gvqComm_t nc, const float *table, const char *what) {
    gvqPsConfig_t cfg = ps_config();
    gvqPs_t ps = NULL;
    MT_OK(gvqPsRecover(from, nc, PS_ROWS, PS_DIM, gvqFloat32, &cfg, &ps));
    if (ps == NULL) return NULL;
    float *t = malloc(PS_ROWS * PS_DIM * sizeof *t);
    ps_pull_all(ps, t);
    MT_CHECK(memcmp(t, table, PS_ROWS * PS_DIM * sizeof *t) == 0,
             "%s: the recovered parameter server's rows differ from the commit's", what);
    free(t);
    return ps;
}

static void bad_arguments(gvqComm_t comm) {
    gvqComm_t nc = (gvqComm_t)0x1;
    int self = mt.rank, out = mt.nranks;
    MT_EXPECT_RES(gvqCommShrink(comm, NULL, 0, NULL, NULL, 0), gvqInvalidArgument);
    MT_EXPECT_RES(gvqCommShrink(comm, &self, 1, &nc, NULL, 0), gvqInvalidArgument);
    MT_CHECK(nc == NULL, "a refused shrink left *newcomm set");
    MT_EXPECT_RES(gvqCommShrink(comm, &out, 1, &nc, NULL, 0), gvqInvalidArgument);
    MT_EXPECT_RES(gvqCommShrink(comm, NULL, 1, &nc, NULL, 0), gvqInvalidArgument);
    MT_EXPECT_RES(gvqCommShrink(comm, NULL, 0, &nc, NULL, 8), gvqInvalidArgument);
    MT_EXPECT_RES(gvqCommShrink(NULL, NULL, 0, &nc, NULL, 0), gvqInvalidArgument);
}

static void scenario_exclude(void) {
    int n = mt.nranks;
    gvqComm_t comm = comm_with_timeout(20000);
    mt_part("exclude: bad arguments", 60);
    bad_arguments(comm);
    int excl[2] = {n - 1, 1}, ne = n >= 4 ? 2 : 1;
    int members[8], m = 0, in = 1;
    for (int p = 0; p < n; p++) {
        int out = 0;
        for (int k = 0; k < ne; k++)
            out |= excl[k] == p;
        if (!out) members[m++] = p;
        if (out && p == mt.rank) in = 0;
    }
    mt_part("exclude: a parameter server commits", 60);
    float *table = malloc(PS_ROWS * PS_DIM * sizeof *table);
    gvqPs_t ps0 = ps_committed(comm, table), psn = NULL, psg = NULL;
    mt_part("exclude: the survivors shrink", 60);
    gvqComm_t nc = NULL;
    if (!in && ps0 != NULL) MT_OK(gvqPsDestroy(ps0)); /* the left-out lose their rows */
    if (in) {
        MT_OK(gvqCommShrink(comm, excl, ne, &nc, NULL, GVQ_SHRINK_DEFAULT));
        MT_CHECK(nc != NULL, "no communicator from the shrink");
        if (nc != NULL) {
            psn = ps_recovered(ps0, nc, table, "exclude");
            check_members(nc, mt.rank, members, m, 1, "exclude");
            check_members(nc, mt.rank, members, m, 100003, "exclude");
            if (m >= 2) { /* again, less the new rank 0: the shrunk communicator's own spare */
                int zero = 0, nr = -1;
                MT_OK(gvqCommUserRank(nc, &nr));
                mt_part("exclude: the shrunk communicator shrinks", 60);
                if (nr != 0) {
                    gvqComm_t nc2 = NULL;
                    MT_OK(gvqCommShrink(nc, &zero, 1, &nc2, NULL, 0));
                    if (nc2 != NULL) {
                        check_members(nc2, mt.rank, members + 1, m - 1, 4099, "exclude twice");
                        MT_OK(gvqCommDestroy(nc2));
                    }
                }
            }
        }
    }
    mt_part("exclude: the excluded join again (grow)", 60);
    gvqUniqueId id;
    memset(&id, 0, sizeof id);
    if (mt.rank == 0) MT_OK(gvqGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    int order[8], k = 0, newrank = -1;
    for (int i = 0; i < m; i++)
        order[k++] = members[i];
    for (int p = 0; p < n; p++) { /* the newcomers, in their old order, above the members */
        int member = 0;
        for (int i = 0; i < m; i++)
            member |= members[i] == p;
        if (!member) {
            if (p == mt.rank) newrank = k;
            order[k++] = p;
        }
    }
    gvqComm_t grown = NULL;
    if (in) {
        MT_EXPECT_RES(gvqCommGrow(nc, n, &id, 0, &grown, NULL), gvqInvalidArgument);
        MT_OK(gvqCommGrow(nc, n, &id, -1, &grown, NULL));
    } else {
        MT_EXPECT_RES(gvqCommGrow(NULL, n, &id, n, &grown, NULL), gvqInvalidArgument);
        MT_OK(gvqCommGrow(NULL, n, &id, newrank, &grown, NULL));
    }
    if (grown != NULL) {
        check_members(grown, mt.rank, order, n, 100003, "grown");
        psg = ps_recovered(psn, grown, table, "grown"); /* newcomers: NULL, rows sent to them */
        if (psg != NULL) MT_OK(gvqPsDestroy(psg));
        MT_OK(gvqCommDestroy(grown));
    }
    if (psn != NULL) MT_OK(gvqPsDestroy(psn));
    if (in && ps0 != NULL) MT_OK(gvqPsDestroy(ps0));
    free(table);
    if (nc != NULL) MT_OK(gvqCommDestroy(nc));
    mt_part("exclude: destroy", 60);
    MT_OK(gvqCommDestroy(comm));
}

static volatile int stopped;
static void *stop_self(void *arg) {
    (void)arg;
    mt_sleep_ms(300);
    stopped = 1;
    kill(getpid(), SIGSTOP); /* the whole process, in the middle of its allreduces */
    return NULL;
}

/* The call that fails when the peer stops: a plain allreduce, a parameter-server push, or a
 * 4-bit QSGD allreduce, over and over until it fails. */
typedef struct {
    int kind; /* 0 allreduce, 1 ps push, 2 qsgd */
    gvqPs_t ps;
    gvqCompressor_t cp;
    int64_t idx[64];
    float grads[64 * 8];
} caller_t;

static gvqResult_t call_until_failure(caller_t *c, gvqComm_t comm, float *a, float *b) {
    gvqResult_t res;
    do {
        if (c->kind == 1)
            res = gvqPsPush(c->ps, c->idx, c->grads, 64);
        else if (c->kind == 2)
            res = gvqAllReduceCompressed(a, b, BIG, gvqFloat32, gvqSum, c->cp, comm, NULL);
        else
            res = gvqAllReduce(a, b, BIG, gvqFloat32, gvqSum, comm, NULL);
    } while (res == gvqSuccess);
    return res;
}

static void scenario_stall(int kind) {
    int n = mt.nranks, staller = n - 1;
    pid_t *pids = calloc((size_t)n, sizeof *pids), me = getpid();
    MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, pids, (int)sizeof me, MPI_BYTE, MPI_COMM_WORLD);
    gvqComm_t comm = comm_with_timeout(TIMEOUT_MS);
    float *a = malloc(BIG * sizeof(float)), *b = malloc(BIG * sizeof(float));
    for (size_t i = 0; i < BIG; i++)
        a[i] = 1.0f;
    gvqResult_t res = gvqSuccess;
    caller_t *cl = calloc(1, sizeof *cl);
    cl->kind = kind;
    for (int i = 0; i < 64; i++)
        cl->idx[i] = (i * 37 + mt.rank) % 1024;
    float *table = malloc(PS_ROWS * PS_DIM * sizeof *table);
    if (kind == 1) /* committed first: the survivors recover its rows after the shrink */
        cl->ps = ps_committed(comm, table);
    else if (kind == 2) {
        gvqCompressorConfig_t ccfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
        ccfg.codec = gvqCodecQsgd;
        ccfg.qsgdBits = 4;
        MT_OK(gvqCompressorCreate(comm, BIG, &ccfg, &cl->cp));
    }
    mt_part("stall: the failing call", 60);
    if (mt.rank != staller) {
        res = call_until_failure(cl, comm, a, b);
        MT_CHECK(res == gvqTimeout, "survivor: expected gvqTimeout, got %s",
                 gvqGetErrorString(res));
        mt_part("stall: the survivors shrink", 60);
        int members[8], m = 0;
        for (int p = 0; p < n; p++)
            if (p != staller) members[m++] = p;
        gvqComm_t nc = NULL;
        double t0 = mt_now();
        if (n == 2) { /* one of two: not a majority */
            MT_EXPECT_RES(gvqCommShrink(comm, NULL, 0, &nc, NULL, GVQ_SHRINK_ABORT),
                          gvqRemoteError);
            MT_CHECK(nc == NULL, "a failed shrink gave a communicator");
            MT_OK(gvqCommShrink(comm, NULL, 0, &nc, NULL, GVQ_SHRINK_ABORT | GVQ_SHRINK_NO_QUORUM));
        } else {
            MT_OK(gvqCommShrink(comm, NULL, 0, &nc, NULL, GVQ_SHRINK_ABORT));
        }
        double took = mt_now() - t0;
        printf("  rank %d: shrink of %d to %d in %.2f s\n", mt.rank, n, m, took);
        MT_CHECK(took < 8.0 * TIMEOUT_MS / 1000.0, "the shrink took %.1f s", took);
        if (nc != NULL) {
            check_members(nc, mt.rank, members, m, 1, "stall");
            check_members(nc, mt.rank, members, m, BIG + 3, "stall");
            if (kind == 1) { /* the stopped rank's rows from the copy its next rank kept */
                gvqPs_t r = ps_recovered(cl->ps, nc, table, "stall-ps");
                if (r != NULL) MT_OK(gvqPsDestroy(r));
            }
            MT_OK(gvqCommDestroy(nc));
        }
        MT_OK(gvqCommDestroy(comm));
        mt_part("stall: the stopped rank resumes", 60);
        if (mt.rank == 0) kill(pids[staller], SIGCONT);
    } else {
        pthread_t th;
        pthread_create(&th, NULL, stop_self, NULL);
        res = call_until_failure(cl, comm, a, b);
        pthread_join(th, NULL);
        MT_CHECK(res != gvqSuccess, "the stopped rank's allreduce succeeded without its peers");
        /* resumed: its peers went on without it; it must not make a communicator */
        gvqComm_t nc = NULL;
        gvqResult_t rs = gvqCommShrink(comm, NULL, 0, &nc, NULL, GVQ_SHRINK_ABORT);
        MT_CHECK(rs != gvqSuccess && nc == NULL,
                 "the resumed rank's shrink gave %s and a communicator %p", gvqGetErrorString(rs),
                 (void *)nc);
        printf("  rank %d (stopped, resumed): allreduce -> %s, shrink -> %s\n", mt.rank,
               gvqGetErrorString(res), gvqGetErrorString(rs));
        if (nc != NULL) gvqCommDestroy(nc);
        gvqCommDestroy(comm);
    }
    mt_part("stall: everyone at the barrier", 60);
    if (cl->ps != NULL) (void)gvqPsDestroy(cl->ps);
    if (cl->cp != NULL) (void)gvqCompressorDestroy(cl->cp);
    free(cl);
    free(a);
    free(b);
    free(pids);
    free(table);
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    const char *mode = argc > 1 ? argv[1] : "exclude";
    if (mt.nranks > 8) {
        if (mt.rank == 0) printf("test_shrink: at most 8 ranks\n");
    } else if (strcmp(mode, "exclude") == 0 && mt.nranks >= 2) {
        scenario_exclude();
    } else if (strcmp(mode, "stall") == 0 && mt.nranks >= 2) {
        scenario_stall(0);
    } else if (strcmp(mode, "stall-ps") == 0 && mt.nranks >= 2) {
        scenario_stall(1);
    } else if (strcmp(mode, "stall-qsgd") == 0 && mt.nranks >= 2) {
        scenario_stall(2);
    } else if (mt.rank == 0) {
        printf("usage: test_shrink exclude|stall|stall-ps|stall-qsgd (>= 2 ranks)\n");
        mt.failures++;
    }
    return mt_finish("test_shrink");
}
