/*
 * test_pipe_inproc.c -- gvqPipe (include/gvq_train.h) with its stages as threads over the
 * in-process transport, so that AddressSanitizer and ThreadSanitizer (CI) see the host streams of
 * overlapped transfers:
 *
 *   same bits    every schedule (GPipe; PipeDream, DualPipe, SpecTrain with and without a flush)
 *                at 1-3 stages, a chain of tanh layers (one a stage): the weights after 4 steps
 *                with overlapped transfers (forwardComm/backwardComm) equal bitwise those with
 *                blocking transfers, which tests/mpi/test_pipeline.c checks against an
 *                in-process reference; every input unchanged until its backward
 *   a dead stage the last stage's backward fails in the second step: every stage's step returns
 *                an error within the communicators' timeout, none hangs, every destroy returns
 */
#include <math.h>
#include <string.h>

#include "gvq_test.h"
#include "gvq_train.h"
#include "test_hash.h"

#define N 6      /* a layer's width */
#define MB 4     /* micro-batches */
#define ROWS 3   /* rows per micro-batch */
#define STEPS 4  /* steps */
#define LR 0.05f /* SGD rate */

typedef struct {
    int k, S, flush, step, fail_at; /* fail_at: the step whose backward fails (-1: none) */
    float w[N * N], g[N * N];
    float x[2 * MB][ROWS * N], y[2 * MB][ROWS * N]; /* per slot: input, output */
    const float *in_at[2 * MB];
} stage_t;

/* Slot m's step (a pipeline without a flush numbers 2M slots, the half its step's parity). */
static int step_of(const stage_t *s, int m) {
    return s->flush || (s->step & 1) == m / MB ? s->step : s->step + 1;
}

static gvqResult_t fwd(void *u, int m, const float *in, float *out) {
    stage_t *s = u;
    for (int i = 0; i < ROWS * N; i++)
        s->x[m][i] =
            in != NULL ? in[i] : test_hash_value(1, (uint32_t)(step_of(s, m) * MB + m % MB), i);
    s->in_at[m] = in;
    for (int r = 0; r < ROWS; r++)
        for (int o = 0; o < N; o++) {
            float z = 0;
            for (int i = 0; i < N; i++)
                z += s->w[o * N + i] * s->x[m][r * N + i];
            s->y[m][r * N + o] = tanhf(z);
        }
    if (out != NULL) memcpy(out, s->y[m], sizeof s->y[m]);
    return gvqSuccess;
}

static gvqResult_t bwd(void *u, int m, const float *dout, float *din) {
    stage_t *s = u;
    if (s->step == s->fail_at) return gvqInternalError;
    if (s->in_at[m] != NULL)
        EXPECT(memcmp(s->in_at[m], s->x[m], sizeof s->x[m]) == 0,
               "stage %d: slot %d's input changed before its backward", s->k, m);
    float dz[ROWS * N];
    for (int i = 0; i < ROWS * N; i++) {
        float dy =
            dout != NULL
                ? dout[i]
                : s->y[m][i] - test_hash_value(2, (uint32_t)(step_of(s, m) * MB + m % MB), i);
        dz[i] = dy * (1 - s->y[m][i] * s->y[m][i]);
    }
    for (int r = 0; r < ROWS; r++)
        for (int o = 0; o < N; o++)
            for (int i = 0; i < N; i++)
                s->g[o * N + i] += dz[r * N + o] * s->x[m][r * N + i];
    if (din != NULL)
        for (int r = 0; r < ROWS; r++)
            for (int i = 0; i < N; i++) {
                float v = 0;
                for (int o = 0; o < N; o++)
                    v += s->w[o * N + i] * dz[r * N + o];
                din[r * N + i] = v;
            }
    return gvqSuccess;
}

static gvqResult_t update(void *u, int m) {
    stage_t *s = u;
    (void)m;
    for (int i = 0; i < N * N; i++) {
        s->w[i] -= LR * s->g[i];
        s->g[i] = 0;
    }
    return gvqSuccess;
}

typedef struct {
    int schedule, predict, flush, overlap, fail;
    gvqComm_t *comm[3]; /* the pipe's, forwardComm, backwardComm */
    float w[3][N * N];  /* each stage's weights at the end */
    gvqResult_t res[3]; /* the dead-stage case: each stage's step result */
} run_t;

typedef struct {
    run_t *run;
    int k, S;
} thread_t;

static void *stage_main(void *arg) {
    thread_t *t = arg;
    run_t *a = t->run;
    stage_t *s = calloc(1, sizeof *s);
    s->k = t->k, s->S = t->S, s->flush = a->flush, s->fail_at = a->fail ? 1 : -1;
    if (!a->fail || s->k != t->S - 1) s->fail_at = -1;
    for (int i = 0; i < N * N; i++)
        s->w[i] = 0.5f * test_hash_value(3, (uint32_t)s->k, (uint32_t)i);
    float *wr[1] = {s->w}, *gr[1] = {s->g};
    size_t wc[1] = {N * N};
    gvqPipeConfig_t c = GVQ_PIPE_CONFIG_INITIALIZER;
    c.microBatches = MB;
    c.schedule = a->schedule;
    c.inCount = s->k == 0 ? 0 : ROWS * N;
    c.outCount = s->k == t->S - 1 ? 0 : ROWS * N;
    c.weightRanges = 1;
    c.weights = wr;
    c.weightCounts = wc;
    c.gradients = gr;
    c.update = update;
    c.predictDistance = a->predict;
    c.flush = a->flush;
    if (a->overlap) c.forwardComm = a->comm[1][s->k], c.backwardComm = a->comm[2][s->k];
    gvqPipe_t p = NULL;
    EXPECT_RES(gvqPipeCreate(a->comm[0][s->k], &c, fwd, bwd, s, &p), gvqSuccess);
    if (p != NULL) EXPECT_RES(gvqPipeSetLearningRate(p, LR), gvqSuccess);
    gvqResult_t res = gvqSuccess;
    for (int step = 0; p != NULL && step < STEPS && res == gvqSuccess; step++) {
        s->step = step;
        res = a->flush || step + 1 < STEPS ? gvqPipeStep(p) : gvqPipeStepFlush(p);
        if (a->schedule == gvqPipeGpipe && res == gvqSuccess) update(s, 0);
    }
    a->res[s->k] = res;
    if (!a->fail) EXPECT_RES(res, gvqSuccess);
    if (a->fail && res != gvqSuccess) /* release the neighbours still waiting on this stage */
        for (int i = 0; i < 3; i++) {
            EXPECT_RES(gvqCommAbort(a->comm[i][s->k]), gvqSuccess);
            a->comm[i][s->k] = NULL; /* an aborted communicator is gone */
        }
    if (p != NULL) gvqPipeDestroy(p);
    memcpy(a->w[s->k], s->w, sizeof s->w);
    free(s);
    return NULL;
}

/* One run on S stages; fresh communicators for it. */
static void run(run_t *a, int S) {
    gvqComm_t comms[3][3];
    gvqConfig_t cfg = GVQ_CONFIG_INITIALIZER;
    cfg.timeoutMs = a->fail ? 3000 : 60000;
    for (int i = 0; i < 3; i++) {
        EXPECT_RES(gvq_comm_init_inproc(S, &cfg, comms[i]), gvqSuccess);
        a->comm[i] = comms[i];
    }
    thread_t th[3];
    pthread_t tid[3];
    for (int k = 0; k < S; k++) {
        th[k] = (thread_t){a, k, S};
        pthread_create(&tid[k], NULL, stage_main, &th[k]);
    }
    for (int k = 0; k < S; k++)
        pthread_join(tid[k], NULL);
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < S; k++)
            if (comms[i][k] != NULL) EXPECT_RES(gvqCommDestroy(comms[i][k]), gvqSuccess);
}

static void same_bits(int S, int schedule, int predict, int flush) {
    static const char *const name[] = {"gpipe", "pipedream", "dualpipe", "spectrain"};
    run_t blocking = {schedule, predict, flush, 0, 0, {NULL}, {{0}}, {0}};
    run_t overlapped = blocking;
    overlapped.overlap = 1;
    run(&blocking, S);
    run(&overlapped, S);
    float w0[N * N];
    for (int k = 0; k < S; k++) {
        for (int i = 0; i < N * N; i++)
            w0[i] = 0.5f * test_hash_value(3, (uint32_t)k, (uint32_t)i);
        EXPECT(memcmp(blocking.w[k], w0, sizeof w0) != 0, "%s: stage %d's weights did not move",
               name[schedule], k);
        EXPECT(memcmp(blocking.w[k], overlapped.w[k], sizeof w0) == 0,
               "%s on %d stages%s: stage %d's weights differ between blocking and overlapped "
               "transfers",
               name[schedule], S, flush ? "" : " without a flush", k);
    }
}

static void dead_stage(int S, int overlap) {
    run_t a = {gvqPipeDualpipe, gvqPredictSchedule, 0, overlap, 1, {NULL}, {{0}}, {0}};
    run(&a, S);
    for (int k = 0; k < S; k++)
        EXPECT(a.res[k] != gvqSuccess, "%d stages%s: stage %d's step succeeded beside a dead stage",
               S, overlap ? ", overlapped" : "", k);
}

int main(void) {
    for (int S = 1; S <= 3; S++) {
        same_bits(S, gvqPipeGpipe, gvqPredictSchedule, 1);
        for (int flush = 1; flush >= 0; flush--) {
            same_bits(S, gvqPipePipedream, gvqPredictSchedule, flush);
            same_bits(S, gvqPipeDualpipe, gvqPredictSchedule, flush);
            same_bits(S, gvqPipeSpectrain, gvqPredictSchedule, flush);
            same_bits(S, gvqPipeSpectrain, gvqPredictPaper, flush);
        }
    }
    for (int overlap = 0; overlap < 2; overlap++)
        dead_stage(3, overlap);
    return gvq_test_finish("test_pipe_inproc");
}
