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
 *   - they agree on the commit to go back to (the least of their latest commits): a step whose
 *     call failed on one survivor may have finished on another, which then took the next
 *     commit already, so each keeps its last two;
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

static long max_l(long a, long b) {
    return a > b ? a : b;
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

typedef struct {
    /* options */
    long steps, every, die_at[MAXDIE];
    int die_rank[MAXDIE], ndie, qsgd, replace, join_rank, join_size, shard, argc;
    const char *join_hex;
    char **argv;
    /* the run */
    gvqComm_t comm;
    gvqCompressor_t cp;
    gvqCompressorConfig_t ccfg;
    int n0, n, rank, spawned, faults;
    pid_t kids[MAXDIE];
    float lr, mu, teacher[NP], w[NP], v[NP], g[NP], x[BATCH * IN], tx[BATCH * IN];
    int y[BATCH], ty[BATCH];
    long step, lost_total;
    commit_t c[2]; /* the last two commits: c[latest] and c[!latest] */
    int latest;
    event_t ev;
    double t_step;
} run_t;

static int parse(run_t *r, int argc, char **argv) {
    r->steps = 600, r->every = 50, r->lr = 0.5f, r->mu = 0.9f, r->join_rank = -1, r->shard = -1;
    r->argc = argc, r->argv = argv;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--replace") == 0)
            r->replace = 1;
        else if (next == NULL)
            return -1;
        else if (strcmp(a, "--join") == 0)
            r->join_hex = next;
        else if (strcmp(a, "--join-rank") == 0)
            r->join_rank = atoi(next);
        else if (strcmp(a, "--join-size") == 0)
            r->join_size = atoi(next);
        else if (strcmp(a, "--shard") == 0)
            r->shard = atoi(next);
        else if (strcmp(a, "--steps") == 0)
            r->steps = atol(next);
        else if (strcmp(a, "--commit") == 0)
            r->every = max_l(atol(next), 1);
        else if (strcmp(a, "--lr") == 0)
            r->lr = (float)atof(next);
        else if (strcmp(a, "--codec") == 0)
            r->qsgd = !strcmp(next, "qsgd");
        else if (strcmp(a, "--die") == 0 && r->ndie < MAXDIE &&
                 sscanf(next, "%d:%ld", &r->die_rank[r->ndie], &r->die_at[r->ndie]) == 2)
            r->ndie++;
        else
            return -1;
        i += strcmp(a, "--replace") != 0;
    }
    return 0;
}

/* A step's allreduce failed: shrink, reload the commit, rescale; the steps since run again. */
static void recover(run_t *r) {
    double t_fail = now_s();
    gvqComm_t nc = NULL;
    GVQ(gvqCommShrink(r->comm, NULL, 0, &nc, NULL, GVQ_SHRINK_ABORT));
    double t_shrunk = now_s();
    if (r->cp != NULL) (void)gvqCompressorDestroy(r->cp);
    (void)gvqCommDestroy(r->comm);
    r->comm = nc;
    int m = 0;
    GVQ(gvqCommCount(r->comm, &m));
    GVQ(gvqCommUserRank(r->comm, &r->rank));
    r->cp = NULL;
    /* the survivors may be a step apart (one finished a step whose call failed on another), so
     * one may have taken a commit the other has not: roll back to the oldest latest commit,
     * which every survivor holds as its latest or the one before */
    int64_t mine = r->c[r->latest].step, back = mine;
    GVQ(gvqAllReduce(&mine, &back, 1, gvqInt64, gvqMin, r->comm, NULL));
    const commit_t *c = &r->c[r->latest];
    if (c->step != back) c = &r->c[!r->latest];
    if (c->step != back) {
        fprintf(stderr, "[%d] no commit of step %lld here\n", first_rank, (long long)back);
        exit(1);
    }
    if (r->qsgd) {
        GVQ(gvqCompressorCreate(r->comm, NP, &r->ccfg, &r->cp));
        GVQ(gvqCompressorLoad(r->cp, c->cstate, c->cbytes));
    }
    memcpy(r->w, c->w, sizeof r->w);
    memcpy(r->v, c->v, sizeof r->v);
    long lost = r->step - c->step;
    r->lr *= (float)m / (float)r->n; /* the global batch shrank by m / n */
    r->faults++;
    r->lost_total += lost;
    double t = now_s();
    r->ev =
        (event_t){r->step, r->n, m, lost, t_fail - r->t_step, t_shrunk - t_fail, t - t_shrunk, t};
    r->n = m;
    r->step = c->step;
}

/* At a commit with --replace: rank 0 starts a replacement per rank lost, and all grow. */
static void maybe_grow(run_t *r) {
    struct {
        int32_t grow, size;
        gvqUniqueId id;
    } j;
    memset(&j, 0, sizeof j);
    double t0 = now_s();
    if (r->rank == 0 && r->n < r->n0 && r->spawned + (r->n0 - r->n) <= MAXDIE) {
        j.grow = 1;
        j.size = r->n0;
        GVQ(gvqGetUniqueId(&j.id));
        for (int k = r->n; k < r->n0; k++, r->spawned++)
            r->kids[r->spawned] =
                spawn_replacement(r->argc, r->argv, &j.id, k, r->n0, r->n0 + r->spawned);
    }
    GVQ(gvqBroadcast(&j, &j, sizeof j, gvqUint8, 0, r->comm, NULL));
    if (!j.grow) return;
    gvqComm_t nc = NULL;
    GVQ(gvqCommGrow(r->comm, j.size, &j.id, -1, &nc, NULL));
    r->lr *= (float)j.size / (float)r->n; /* the global batch grew back */
    handoff_t h = {r->step, r->lr, 0};
    GVQ(gvqBroadcast(&h, &h, sizeof h, gvqUint8, 0, nc, NULL));
    GVQ(gvqBroadcast(r->w, r->w, NP, gvqFloat32, 0, nc, NULL));
    GVQ(gvqBroadcast(r->v, r->v, NP, gvqFloat32, 0, nc, NULL));
    if (r->cp != NULL) GVQ(gvqCompressorDestroy(r->cp));
    GVQ(gvqCommDestroy(r->comm));
    r->comm = nc;
    r->cp = NULL; /* every rank's anew: the newcomer has no residual to match */
    if (r->qsgd) GVQ(gvqCompressorCreate(r->comm, NP, &r->ccfg, &r->cp));
    if (r->rank == 0)
        printf("join at step %ld: %d -> %d ranks in %.3f s (spawn, grow, state handed over); lr "
               "now %.4f\n",
               r->step, r->n, j.size, now_s() - t0, r->lr);
    r->n = j.size;
}

/* A replacement: grow into the survivors' communicator, then take the state from rank 0. */
static void join(run_t *r, const gvqConfig_t *cfg) {
    gvqUniqueId id;
    if (parse_id(r->join_hex, &id) != 0) exit(2);
    GVQ(gvqCommGrow(NULL, r->join_size, &id, r->join_rank, &r->comm, (gvqConfig_t *)cfg));
    GVQ(gvqCommUserRank(r->comm, &r->rank));
    GVQ(gvqCommCount(r->comm, &r->n0));
    first_rank = r->shard;
    handoff_t h;
    GVQ(gvqBroadcast(&h, &h, sizeof h, gvqUint8, 0, r->comm, NULL));
    GVQ(gvqBroadcast(r->w, r->w, NP, gvqFloat32, 0, r->comm, NULL));
    GVQ(gvqBroadcast(r->v, r->v, NP, gvqFloat32, 0, r->comm, NULL));
    r->step = (long)h.step;
    r->lr = h.lr;
    printf("[%d] joined as rank %d of %d at step %ld\n", first_rank, r->rank, r->n0, r->step);
}

/* One step: 1 when done, 0 when it failed and the run rolled back. */
static int step_once(run_t *r) {
    for (int k = 0; k < r->ndie; k++)
        if (r->die_rank[k] == first_rank && r->die_at[k] == r->step) {
            printf("[%d] leaves at step %ld (_exit)\n", first_rank, r->step);
            fflush(stdout);
            _exit(0);
        }
    r->t_step = now_s();
    batch(r->teacher, (uint64_t)first_rank + 1, r->step, r->x, r->y);
    (void)loss_grad(r->w, r->x, r->y, r->g);
    gvqResult_t res =
        r->cp != NULL
            ? gvqAllReduceCompressed(r->g, r->g, NP, gvqFloat32, gvqAvg, r->cp, r->comm, NULL)
            : gvqAllReduce(r->g, r->g, NP, gvqFloat32, gvqAvg, r->comm, NULL);
    if (res != gvqSuccess) { /* a peer died or stalled */
        recover(r);
        return 0;
    }
    if (r->ev.n_from > 0) { /* the first good step after a fault */
        const event_t *e = &r->ev;
        if (r->rank == 0)
            printf("fault %d at step %ld: %d -> %d ranks; detect %.2f s, shrink %.3f s, reload "
                   "%.4f s, first step %.4f s; rolled back to step %ld (%ld steps lost); lr now "
                   "%.4f\n",
                   r->faults, e->step, e->n_from, e->n_to, e->detect, e->shrink, e->reload,
                   now_s() - e->t_loaded, e->step - e->lost, e->lost, r->lr);
        r->ev.n_from = 0;
    }
    for (int i = 0; i < NP; i++) {
        r->v[i] = r->mu * r->v[i] + r->g[i];
        r->w[i] -= r->lr * r->v[i];
    }
    r->step++;
    return 1;
}

/* The end: the loss fell and the weights agree; the replacements this rank started ended well. */
static int finish(run_t *r, double loss0) {
    double loss1 = loss_grad(r->w, r->tx, r->ty, NULL);
    uint64_t h = hash_of(r->w, sizeof r->w), *hs = calloc((size_t)r->n, sizeof *hs);
    if (hs == NULL) return 0;
    GVQ(gvqAllGather(&h, hs, 1, gvqUint64, r->comm, NULL));
    int differ = 0;
    for (int k = 0; k < r->n; k++)
        differ += hs[k] != h;
    free(hs);
    int ok = differ == 0 && loss1 < 0.5 * loss0 && isfinite(loss1);
    printf("[%d] rank %d of %d at the end: loss %.4f -> %.4f, %d fault(s), %ld step(s) run again, "
           "weights %s: %s\n",
           first_rank, r->rank, r->n, loss0, loss1, r->faults, r->lost_total,
           differ ? "DIFFER between ranks" : "identical on every rank", ok ? "PASS" : "FAIL");
    if (r->cp != NULL) GVQ(gvqCompressorDestroy(r->cp));
    GVQ(gvqCommDestroy(r->comm));
    for (int k = 0; k < r->spawned; k++) {
        int st = 1;
        if (r->kids[k] <= 0 || waitpid(r->kids[k], &st, 0) != r->kids[k] || !WIFEXITED(st) ||
            WEXITSTATUS(st) != 0) {
            printf("[%d] FAIL: replacement %d ended with status %d\n", first_rank, k, st);
            ok = 0;
        }
    }
    return ok;
}

int main(int argc, char **argv) {
    run_t *r = calloc(1, sizeof *r);
    if (r == NULL) return 1;
    if (parse(r, argc, argv) != 0) {
        fprintf(stderr,
                "usage: %s [--steps S] [--commit K] [--lr X] [--codec none|qsgd] "
                "[--die RANK:STEP]... [--replace]\n",
                argv[0]);
        return 2;
    }
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = 2000; /* a dead peer is noticed within this */
    r->ccfg = (gvqCompressorConfig_t)GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    r->ccfg.codec = gvqCodecQsgd;
    r->ccfg.qsgdBits = 4;
    r->ccfg.errorFeedback = 1;
    uint64_t s = 12345;
    for (int i = 0; i < NP; i++)
        r->teacher[i] = 2.0f * unif(&s);
    batch(r->teacher, 999999, 0, r->tx, r->ty); /* the held-out batch, the same on every rank */
    double loss0 = loss_grad(r->w, r->tx, r->ty, NULL);
    if (r->join_hex != NULL) {
        join(r, &cfg);
    } else {
        GVQ(gvqCommInitFromEnv(&r->comm, &cfg));
        GVQ(gvqCommUserRank(r->comm, &r->rank));
        GVQ(gvqCommCount(r->comm, &r->n0));
        first_rank = r->rank;
    }
    r->n = r->n0;
    if (r->qsgd) GVQ(gvqCompressorCreate(r->comm, NP, &r->ccfg, &r->cp));
    commit_take(&r->c[r->latest], r->step, r->w, r->v, r->cp);
    while (r->step < r->steps) {
        if (!step_once(r)) continue;
        if (r->replace && r->step % r->every == 0) maybe_grow(r); /* replacements join here */
        if (r->step % r->every == 0) {
            r->latest = !r->latest;
            commit_take(&r->c[r->latest], r->step, r->w, r->v, r->cp);
        }
        if (r->rank == 0 && r->step % 100 == 0)
            printf("step %ld: held-out loss %.4f (%d ranks)\n", r->step,
                   loss_grad(r->w, r->tx, r->ty, NULL), r->n);
    }
    int ok = finish(r, loss0);
    free(r->c[0].cstate);
    free(r->c[1].cstate);
    free(r);
    return ok ? 0 : 1;
}
