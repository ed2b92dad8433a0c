/*
 * elastic_trainer.c -- a data-parallel trainer that rides through dead ranks: it commits its
 * state every K steps, and when a step's allreduce fails the survivors shrink the communicator
 * (gvqCommShrink with GVQ_SHRINK_ABORT), roll back to the last commit, rescale, and go on.
 * Started without mpirun (any launcher that sets torchrun's or Slurm's variables; here
 * scripts/gvq-launch.sh), over the UCX transport, so a process may die without ending the job:
 *
 *   bash scripts/gvq-launch.sh -n 4 -- build/examples/example_elastic_trainer \
 *        --steps 600 --commit 50 --die 3:170 --die 1:420 --codec qsgd
 *
 * The model: softmax regression (64 inputs, 10 classes) learning a fixed random linear "teacher"
 * from synthetic inputs; each rank draws its own batches, seeded by its rank in the first job
 * and the step, so a survivor keeps its shard. SGD with momentum on the averaged gradient
 * (gvqAvg), plain or through a 4-bit QSGD compressor with error feedback.
 *
 * A commit holds what a rollback needs: the step, the weights, the momentum and the
 * compressor's state (gvqCompressorSave: its error-feedback residual); it is a copy in memory,
 * taken between steps, the same step on every rank. After a failure:
 *   - the survivors shrink: every one gets the same communicator of the ranks that answered;
 *   - the compressor is made anew on it and loaded from the commit (same count and config);
 *   - weights and momentum come back from the commit, and the steps since are run again;
 *   - the per-rank batch stays, so the global batch shrinks with the ranks: the learning rate is
 *     scaled by the same factor (the linear scaling rule).
 * Each fault prints one line: the step it hit, the time to detect it (the failed call), to
 * shrink, to reload, to the first good step after, and the steps lost. At the end every rank
 * checks that the loss fell and that the weights are identical on every survivor.
 *
 * --die R:S (repeatable): the process that was rank R of the first job leaves at step S with
 * _exit, as a crash would (no destroy, no goodbye). --replace: at the first commit after a
 * fault, rank 0 starts a replacement for each rank lost (this program, told to join) and every
 * rank grows into a communicator of the first size (gvqCommGrow, a new unique id passed on the
 * replacement's command line); rank 0 hands over the step, learning rate, weights and momentum
 * (gvqBroadcast); every rank makes its compressor anew (a newcomer has no residual that would
 * match, so the residuals start from zero); the learning rate scales back up; the replacement
 * draws a data shard of its own. Exit status 0 when the run ended well on this rank and on the
 * replacements it started.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gvq.h"

enum { IN = 64, OUT = 10, NP = OUT * IN + OUT, BATCH = 32, MAXDIE = 16 };

static int first_rank = -1; /* this process's rank in the first communicator */

#define GVQ(call)                                                                                  \
    do {                                                                                           \
        gvqResult_t r_ = (call);                                                                   \
        if (r_ != gvqSuccess) {                                                                    \
            fprintf(stderr, "[%d] %s failed: %s (%s)\n", first_rank, #call, gvqGetErrorString(r_), \
                    gvqGetLastError(NULL));                                                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* a small deterministic generator (splitmix64), so runs repeat exactly */
static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float unif(uint64_t *s) { /* in [-1, 1) */
    return (float)((double)(mix(s) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

/* one batch: inputs x and the teacher's class of each, from (seed, step) */
static void batch(const float *teacher, uint64_t seed, long step, float *x, int *y) {
    uint64_t s = seed * 0x100000001b3ull + (uint64_t)step;
    for (int b = 0; b < BATCH; b++) {
        for (int i = 0; i < IN; i++)
            x[b * IN + i] = unif(&s);
        int best = 0;
        float bv = -1e30f;
        for (int o = 0; o < OUT; o++) {
            float z = teacher[OUT * IN + o];
            for (int i = 0; i < IN; i++)
                z += teacher[o * IN + i] * x[b * IN + i];
            if (z > bv) bv = z, best = o;
        }
        y[b] = best;
    }
}

/* mean cross-entropy of w on the batch; grad (NP, may be NULL) gets its gradient */
static double loss_grad(const float *w, const float *x, const int *y, float *grad) {
    double loss = 0;
    if (grad != NULL) memset(grad, 0, NP * sizeof *grad);
    for (int b = 0; b < BATCH; b++) {
        float z[OUT], mx = -1e30f, sum = 0;
        for (int o = 0; o < OUT; o++) {
            z[o] = w[OUT * IN + o];
            for (int i = 0; i < IN; i++)
                z[o] += w[o * IN + i] * x[b * IN + i];
            if (z[o] > mx) mx = z[o];
        }
        for (int o = 0; o < OUT; o++)
            sum += (z[o] = expf(z[o] - mx));
        loss -= log(z[y[b]] / sum);
        for (int o = 0; grad != NULL && o < OUT; o++) {
            float d = (z[o] / sum - (o == y[b])) / BATCH;
            for (int i = 0; i < IN; i++)
                grad[o * IN + i] += d * x[b * IN + i];
            grad[OUT * IN + o] += d;
        }
    }
    return loss / BATCH;
}

typedef struct { /* a fault, reported at the first good step after it */
    long step;
    int n_from, n_to;
    long lost;
    double detect, shrink, reload, t_loaded;
} event_t;

typedef struct {
    long step;
    float w[NP], v[NP];
    void *cstate;
    size_t cbytes;
} commit_t;

static void commit_take(commit_t *c, long step, const float *w, const float *v,
                        gvqCompressor_t cp) {
    c->step = step;
    memcpy(c->w, w, sizeof c->w);
    memcpy(c->v, v, sizeof c->v);
    if (cp == NULL) return;
    size_t need = 0;
    GVQ(gvqCompressorSave(cp, NULL, &need));
    if (need > c->cbytes) {
        free(c->cstate);
        c->cstate = malloc(need);
        if (c->cstate == NULL) exit(1);
    }
    c->cbytes = need;
    GVQ(gvqCompressorSave(cp, c->cstate, &c->cbytes));
}

static uint64_t hash_of(const void *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

extern char **environ;

/* Start a replacement: this program with this run's options, told to join as rank r of n
 * through the id, with data shard `shard`. */
static pid_t spawn_replacement(int argc, char **argv, const gvqUniqueId *id, int r, int n,
                               int shard) {
    char hex[2 * sizeof *id + 1], rs[16], ns[16], ss[16];
    for (size_t i = 0; i < sizeof *id; i++)
        snprintf(hex + 2 * i, 3, "%02x", ((const unsigned char *)id)[i]);
    snprintf(rs, sizeof rs, "%d", r);
    snprintf(ns, sizeof ns, "%d", n);
    snprintf(ss, sizeof ss, "%d", shard);
    char **args = calloc((size_t)argc + 9, sizeof *args);
    if (args == NULL) return -1;
    int k = 0;
    for (int i = 0; i < argc; i++) /* --replace too: it takes part in the commits' exchange */
        args[k++] = argv[i];
    char *more[] = {"--join", hex, "--join-rank", rs, "--join-size", ns, "--shard", ss};
    for (int i = 0; i < 8; i++)
        args[k++] = more[i];
    pid_t pid = -1;
    if (posix_spawn(&pid, argv[0], NULL, NULL, args, environ) != 0) pid = -1;
    free(args);
    return pid;
}

static int parse_id(const char *hex, gvqUniqueId *id) {
    if (strlen(hex) != 2 * sizeof *id) return -1;
    for (size_t i = 0; i < sizeof *id; i++) {
        unsigned b = 0;
        if (sscanf(hex + 2 * i, "%2x", &b) != 1) return -1;
        ((unsigned char *)id)[i] = (unsigned char)b;
    }
    return 0;
}

/* What a newcomer gets from rank 0 after a grow: the step to start at and the learning rate,
 * then the weights and the momentum (broadcasts of their own). */
typedef struct {
    int64_t step;
    float lr;
    int32_t pad;
} handoff_t;

int main(int argc, char **argv) {
    long steps = 600, every = 50, die_at[MAXDIE];
    int die_rank[MAXDIE], ndie = 0, qsgd = 0, replace = 0, join_rank = -1, join_size = 0;
    int shard = -1;
    const char *join_hex = NULL;
    float lr = 0.5f, mu = 0.9f;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--replace") == 0)
            replace = 1;
        else if (strcmp(argv[i], "--join") == 0 && i + 1 < argc)
            join_hex = argv[++i];
        else if (strcmp(argv[i], "--join-rank") == 0 && i + 1 < argc)
            join_rank = atoi(argv[++i]);
        else if (strcmp(argv[i], "--join-size") == 0 && i + 1 < argc)
            join_size = atoi(argv[++i]);
        else if (strcmp(argv[i], "--shard") == 0 && i + 1 < argc)
            shard = atoi(argv[++i]);
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
            steps = atol(argv[++i]);
        else if (strcmp(argv[i], "--commit") == 0 && i + 1 < argc)
            every = atol(argv[++i]);
        else if (strcmp(argv[i], "--lr") == 0 && i + 1 < argc)
            lr = (float)atof(argv[++i]);
        else if (strcmp(argv[i], "--codec") == 0 && i + 1 < argc)
            qsgd = !strcmp(argv[++i], "qsgd");
        else if (strcmp(argv[i], "--die") == 0 && i + 1 < argc && ndie < MAXDIE &&
                 sscanf(argv[++i], "%d:%ld", &die_rank[ndie], &die_at[ndie]) == 2)
            ndie++;
        else {
            fprintf(stderr,
                    "usage: %s [--steps S] [--commit K] [--lr X] [--codec none|qsgd] "
                    "[--die RANK:STEP]... [--replace]\n",
                    argv[0]);
            return 2;
        }
    }
    if (every < 1) every = 1;
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = 2000; /* a dead peer is noticed within this */
    gvqComm_t comm = NULL;
    gvqUniqueId jid;
    int joining = join_hex != NULL;
    if (joining && parse_id(join_hex, &jid) != 0) return 2;
    if (joining) /* a replacement: grow into the survivors' communicator */
        GVQ(gvqCommGrow(NULL, join_size, &jid, join_rank, &comm, &cfg));
    else
        GVQ(gvqCommInitFromEnv(&comm, &cfg));
    int n0 = 0, n = 0, rank = 0, spawned = 0;
    pid_t kids[MAXDIE];
    GVQ(gvqCommUserRank(comm, &rank));
    GVQ(gvqCommCount(comm, &n0));
    n = n0;
    first_rank = joining ? shard : rank;
    gvqCompressorConfig_t ccfg = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    ccfg.codec = gvqCodecQsgd;
    ccfg.qsgdBits = 4;
    ccfg.errorFeedback = 1;
    gvqCompressor_t cp = NULL;
    if (qsgd && !joining) GVQ(gvqCompressorCreate(comm, NP, &ccfg, &cp));

    float *teacher = malloc(NP * sizeof(float)), *w = calloc(NP, sizeof(float));
    float *v = calloc(NP, sizeof(float)), *g = malloc(NP * sizeof(float));
    float *x = malloc(BATCH * IN * sizeof(float)), *tx = malloc(BATCH * IN * sizeof(float));
    int y[BATCH], ty[BATCH];
    commit_t *c = calloc(1, sizeof *c);
    if (!teacher || !w || !v || !g || !x || !tx || !c) return 1;
    uint64_t s = 12345;
    for (int i = 0; i < NP; i++)
        teacher[i] = 2.0f * unif(&s);
    batch(teacher, 999999, 0, tx, ty); /* the held-out batch, the same on every rank */
    double loss0 = loss_grad(w, tx, ty, NULL);
    long step = 0;
    if (joining) { /* the state, from rank 0 */
        handoff_t h;
        GVQ(gvqBroadcast(&h, &h, sizeof h, gvqUint8, 0, comm, NULL));
        GVQ(gvqBroadcast(w, w, NP, gvqFloat32, 0, comm, NULL));
        GVQ(gvqBroadcast(v, v, NP, gvqFloat32, 0, comm, NULL));
        step = (long)h.step;
        lr = h.lr;
        if (qsgd) GVQ(gvqCompressorCreate(comm, NP, &ccfg, &cp)); /* as the members do now */
        printf("[%d] joined as rank %d of %d at step %ld\n", first_rank, rank, n, step);
    }
    commit_take(c, step, w, v, cp);
    int faults = 0;
    long lost_total = 0;
    event_t ev = {0};
    double t_step = now_s();
    while (step < steps) {
        for (int k = 0; k < ndie; k++)
            if (die_rank[k] == first_rank && die_at[k] == step) {
                printf("[%d] leaves at step %ld (_exit)\n", first_rank, step);
                fflush(stdout);
                _exit(0);
            }
        t_step = now_s();
        batch(teacher, (uint64_t)first_rank + 1, step, x, y);
        (void)loss_grad(w, x, y, g);
        gvqResult_t res = cp != NULL
                              ? gvqAllReduceCompressed(g, g, NP, gvqFloat32, gvqAvg, cp, comm, NULL)
                              : gvqAllReduce(g, g, NP, gvqFloat32, gvqAvg, comm, NULL);
        if (res != gvqSuccess) { /* a peer died or stalled: shrink, roll back, go on */
            double t_fail = now_s(), t0 = t_fail;
            gvqComm_t nc = NULL;
            GVQ(gvqCommShrink(comm, NULL, 0, &nc, NULL, GVQ_SHRINK_ABORT));
            double t_shrunk = now_s();
            if (cp != NULL) (void)gvqCompressorDestroy(cp);
            (void)gvqCommDestroy(comm);
            comm = nc;
            int m = 0;
            GVQ(gvqCommCount(comm, &m));
            GVQ(gvqCommUserRank(comm, &rank));
            cp = NULL;
            if (qsgd) {
                GVQ(gvqCompressorCreate(comm, NP, &ccfg, &cp));
                GVQ(gvqCompressorLoad(cp, c->cstate, c->cbytes));
            }
            memcpy(w, c->w, sizeof c->w);
            memcpy(v, c->v, sizeof c->v);
            long lost = step - c->step;
            lr *= (float)m / (float)n; /* the global batch shrank by m / n */
            faults++;
            lost_total += lost;
            ev = (event_t){step,   n, m, lost, t_fail - t_step, t_shrunk - t0, now_s() - t_shrunk,
                           now_s()};
            n = m;
            step = c->step; /* the steps since the commit run again */
            continue;
        }
        if (ev.n_from > 0) { /* the first good step after a fault */
            if (rank == 0)
                printf("fault %d at step %ld: %d -> %d ranks; detect %.2f s, shrink %.3f s, "
                       "reload %.4f s, first step %.4f s; rolled back to step %ld (%ld steps "
                       "lost); lr now %.4f\n",
                       faults, ev.step, ev.n_from, ev.n_to, ev.detect, ev.shrink, ev.reload,
                       now_s() - ev.t_loaded, ev.step - ev.lost, ev.lost, lr);
            ev.n_from = 0;
        }
        for (int i = 0; i < NP; i++) {
            v[i] = mu * v[i] + g[i];
            w[i] -= lr * v[i];
        }
        step++;
        if (replace && step % every == 0) { /* replacements join here, at a commit */
            struct {
                int32_t grow, size;
                gvqUniqueId id;
            } j;
            memset(&j, 0, sizeof j);
            double t0 = now_s();
            if (rank == 0 && n < n0 && spawned + (n0 - n) <= MAXDIE) {
                j.grow = 1;
                j.size = n0;
                GVQ(gvqGetUniqueId(&j.id));
                for (int r = n; r < n0; r++, spawned++)
                    kids[spawned] = spawn_replacement(argc, argv, &j.id, r, n0, n0 + spawned);
            }
            GVQ(gvqBroadcast(&j, &j, sizeof j, gvqUint8, 0, comm, NULL));
            if (j.grow) {
                gvqComm_t nc = NULL;
                GVQ(gvqCommGrow(comm, j.size, &j.id, -1, &nc, NULL));
                lr *= (float)j.size / (float)n; /* the global batch grew back */
                handoff_t h = {step, lr, 0};
                GVQ(gvqBroadcast(&h, &h, sizeof h, gvqUint8, 0, nc, NULL));
                GVQ(gvqBroadcast(w, w, NP, gvqFloat32, 0, nc, NULL));
                GVQ(gvqBroadcast(v, v, NP, gvqFloat32, 0, nc, NULL));
                if (cp != NULL) GVQ(gvqCompressorDestroy(cp));
                GVQ(gvqCommDestroy(comm));
                comm = nc;
                cp = NULL; /* every rank's anew: the newcomer has no residual to match */
                if (qsgd) GVQ(gvqCompressorCreate(comm, NP, &ccfg, &cp));
                if (rank == 0)
                    printf("join at step %ld: %d -> %d ranks in %.3f s (spawn, grow, state "
                           "handed over); lr now %.4f\n",
                           step, n, j.size, now_s() - t0, lr);
                n = j.size;
            }
        }
        if (step % every == 0) commit_take(c, step, w, v, cp);
        if (rank == 0 && step % 100 == 0)
            printf("step %ld: held-out loss %.4f (%d ranks)\n", step, loss_grad(w, tx, ty, NULL),
                   n);
    }
    double loss1 = loss_grad(w, tx, ty, NULL);
    uint64_t h = hash_of(w, NP * sizeof *w), *hs = calloc((size_t)n, sizeof *hs);
    GVQ(gvqAllGather(&h, hs, 1, gvqUint64, comm, NULL));
    int differ = 0;
    for (int r = 0; r < n; r++)
        differ += hs[r] != h;
    int ok = differ == 0 && loss1 < 0.5 * loss0 && isfinite(loss1);
    printf("[%d] rank %d of %d at the end: loss %.4f -> %.4f, %d fault(s), %ld step(s) run again, "
           "weights %s: %s\n",
           first_rank, rank, n, loss0, loss1, faults, lost_total,
           differ ? "DIFFER between ranks" : "identical on every rank", ok ? "PASS" : "FAIL");
    if (cp != NULL) GVQ(gvqCompressorDestroy(cp));
    GVQ(gvqCommDestroy(comm));
    for (int k = 0; k < spawned; k++) { /* the replacements this rank started */
        int st = 1;
        if (kids[k] <= 0 || waitpid(kids[k], &st, 0) != kids[k] || !WIFEXITED(st) ||
            WEXITSTATUS(st) != 0) {
            printf("[%d] FAIL: replacement %d ended with status %d\n", first_rank, k, st);
            ok = 0;
        }
    }
    free(c->cstate);
    free(c);
    free(hs);
    free(teacher), free(w), free(v), free(g), free(x), free(tx);
    return ok ? 0 : 1;
}
