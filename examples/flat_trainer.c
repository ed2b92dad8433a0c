/*
 * flat_trainer.c -- the smallest complete data-parallel trainer on gvq, the program that
 * docs/PORTING.md walks through. Build it against an installed gvq and run it on N ranks:
 *
 *   gcc flat_trainer.c $(pkg-config --cflags --libs gvq) \
 *       -Wl,-rpath,$(pkg-config --variable=libdir gvq) -lm -o flat_trainer
 *   mpirun -np 2 ./flat_trainer                       # plain, exact gvqAllReduce
 *   GVQ_CODEC=auto mpirun -np 2 -x GVQ_CODEC ./flat_trainer --layout   # compressed per layer
 *
 * The model is a two-layer perceptron (64 inputs -> 128 ReLU units -> 10 classes, softmax
 * cross-entropy) learning a fixed random "teacher" network from synthetic inputs. Like most C
 * trainers it keeps every parameter in one flat array and every gradient in another one of the
 * same shape:
 *
 *   params/grads:  [ W1: 128 x 64 | b1: 128 | W2: 10 x 128 | b2: 10 ]   9610 floats
 *
 * What gvq adds to the single-process trainer, and all it adds:
 *   1. a communicator over MPI_COMM_WORLD (gvqCommInitMPI);
 *   2. one gvqBroadcast of the initial weights from rank 0, so every rank starts identical;
 *   3. one gvqAllReduce(gvqAvg) of the flat gradient per step, so every rank applies the same
 *      update (gvq's results are bitwise identical on every rank, for every codec);
 *   4. a check that the weights really are identical: a hash of their bits, compared with a
 *      gvqMax and a gvqMin allreduce;
 *   5. optionally (--layout) a description of the buffer's layers (gvqCommSetLayout), so that
 *      GVQ_CODEC=auto gives each layer the right codec (docs/ZERO_CODE.md).
 *
 * Each rank draws its own inputs (seeded by its rank): the data is sharded, the model is not.
 * Exit status 0 when the loss fell and the weights agree on every rank, 1 otherwise.
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gvq.h"
#include "gvq_mpi.h"

enum { IN = 64, HID = 128, OUT = 10, BATCH = 32 };

/* offsets of the layers in the flat buffers */
enum {
    OFF_W1 = 0,
    OFF_B1 = OFF_W1 + HID * IN,
    OFF_W2 = OFF_B1 + HID,
    OFF_B2 = OFF_W2 + OUT * HID,
    NPARAMS = OFF_B2 + OUT
};

/* On a gvq error: say what failed and why, then end every rank (a rank that stopped calling
 * collectives would leave the others waiting until gvq's timeout). */
#define CHECK(call)                                                               \
    do {                                                                          \
        gvqResult_t r_ = (call);                                                  \
        if (r_ != gvqSuccess) {                                                   \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, gvqGetErrorString(r_), \
                    gvqGetLastError(comm));                                       \
            MPI_Abort(MPI_COMM_WORLD, 1);                                         \
        }                                                                         \
    } while (0)

/* A small deterministic generator (xorshift64*), so every run gives the same numbers. */
static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static float rng_uniform(uint64_t *s) { /* in [-1, 1) */
    return (float)((double)(rng_next(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* One batch of inputs and the teacher's labels (the teacher: a fixed random linear map). */
static void make_batch(uint64_t *s, const float *teacher, float *x, int *y) {
    for (int b = 0; b < BATCH; b++) {
        float *xb = x + b * IN;
        for (int i = 0; i < IN; i++)
            xb[i] = rng_uniform(s);
        int best = 0;
        float best_v = -INFINITY;
        for (int c = 0; c < OUT; c++) {
            float v = 0.0f;
            for (int i = 0; i < IN; i++)
                v += teacher[c * IN + i] * xb[i];
            if (v > best_v) {
                best_v = v;
                best = c;
            }
        }
        y[b] = best;
    }
}

/* Forward and backward over one batch: writes the mean gradient into g (every element), returns
 * the mean loss. The single-process trainer's code, untouched by the port. */
static float forward_backward(const float *p, const float *x, const int *y, float *g) {
    float h[HID], z[OUT], dh[HID];
    float loss = 0.0f;
    memset(g, 0, NPARAMS * sizeof *g);
    for (int b = 0; b < BATCH; b++) {
        const float *xb = x + b * IN;
        for (int j = 0; j < HID; j++) {
            float a = p[OFF_B1 + j];
            for (int i = 0; i < IN; i++)
                a += p[OFF_W1 + j * IN + i] * xb[i];
            h[j] = a > 0.0f ? a : 0.0f;
        }
        float zmax = -INFINITY, zsum = 0.0f;
        for (int c = 0; c < OUT; c++) {
            z[c] = p[OFF_B2 + c];
            for (int j = 0; j < HID; j++)
                z[c] += p[OFF_W2 + c * HID + j] * h[j];
            if (z[c] > zmax) zmax = z[c];
        }
        for (int c = 0; c < OUT; c++)
            zsum += expf(z[c] - zmax);
        loss += logf(zsum) + zmax - z[y[b]];
        memset(dh, 0, sizeof dh);
        for (int c = 0; c < OUT; c++) {
            float dz = (expf(z[c] - zmax) / zsum - (c == y[b] ? 1.0f : 0.0f)) / BATCH;
            g[OFF_B2 + c] += dz;
            for (int j = 0; j < HID; j++) {
                g[OFF_W2 + c * HID + j] += dz * h[j];
                dh[j] += dz * p[OFF_W2 + c * HID + j];
            }
        }
        for (int j = 0; j < HID; j++) {
            if (h[j] <= 0.0f) continue;
            g[OFF_B1 + j] += dh[j];
            for (int i = 0; i < IN; i++)
                g[OFF_W1 + j * IN + i] += dh[j] * xb[i];
        }
    }
    return loss / BATCH;
}

/* FNV-1a over the bits of the weights: equal on two ranks only if every weight is. */
static uint64_t weights_hash(const float *p) {
    const unsigned char *c = (const unsigned char *)p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < NPARAMS * sizeof *p; i++)
        h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

/* 1 when every rank holds the same weights. Collective. */
static int weights_agree(const float *p, gvqComm_t comm) {
    uint64_t h = weights_hash(p), hmax = 0, hmin = 0;
    CHECK(gvqAllReduce(&h, &hmax, 1, gvqUint64, gvqMax, comm, NULL));
    CHECK(gvqAllReduce(&h, &hmin, 1, gvqUint64, gvqMin, comm, NULL));
    return hmax == hmin;
}

/* Tells gvq where the layers of the flat gradient are (used by GVQ_CODEC's zero-code mode):
 * each tensor's shape in buffer order; gvqLayoutAppend keeps the offsets, and the total must
 * come out as the buffer's length (a layout of another length would go unused). */
static void describe_layers(gvqComm_t comm) {
    gvqLayer_t layers[4];
    int n = 0;
    size_t at = 0;
    CHECK(gvqLayoutAppend(layers, 4, &n, &at, gvqLayerFc, (const int[]){HID, IN}, 0)); /* W1 */
    CHECK(gvqLayoutAppend(layers, 4, &n, &at, gvqLayerOther, NULL, HID)); /* b1: summed exactly */
    CHECK(gvqLayoutAppend(layers, 4, &n, &at, gvqLayerFc, (const int[]){OUT, HID}, 0)); /* W2 */
    CHECK(gvqLayoutAppend(layers, 4, &n, &at, gvqLayerOther, NULL, OUT));               /* b2 */
    if (at != NPARAMS) {
        fprintf(stderr, "the layers add up to %zu floats, the buffer holds %d\n", at, NPARAMS);
        exit(1);
    }
    CHECK(gvqCommSetLayout(comm, NPARAMS, layers, n));
}

int main(int argc, char **argv) {
    int steps = 300, layout = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--layout") == 0)
            layout = 1;
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0)
            steps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: mpirun -np N %s [--steps N] [--layout]\n", argv[0]);
            return 2;
        }
    }
    MPI_Init(&argc, &argv);
    gvqComm_t comm = NULL;
    int rank = 0, nranks = 1;
    CHECK(gvqCommInitMPI(&comm, MPI_COMM_WORLD, NULL)); /* 1. the communicator */
    CHECK(gvqCommUserRank(comm, &rank));
    CHECK(gvqCommCount(comm, &nranks));
    if (layout) describe_layers(comm); /* 5. optional: the layers, for GVQ_CODEC */

    float *params = malloc(NPARAMS * sizeof *params), *grads = malloc(NPARAMS * sizeof *grads);
    float *teacher = malloc(OUT * IN * sizeof *teacher), *x = malloc(BATCH * IN * sizeof *x);
    int *y = malloc(BATCH * sizeof *y);
    if (params == NULL || grads == NULL || teacher == NULL || x == NULL || y == NULL) {
        fprintf(stderr, "out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    uint64_t teacher_seed = 12345, data_seed = 1000003ull * (uint64_t)(rank + 1);
    for (int i = 0; i < OUT * IN; i++)
        teacher[i] = rng_uniform(&teacher_seed);

    /* 2. rank 0 initialises the weights, everyone else receives them. The other ranks' own
     * initialisation (here: none) is overwritten. */
    if (rank == 0) {
        uint64_t s = 42;
        for (int i = 0; i < NPARAMS; i++)
            params[i] = 0.1f * rng_uniform(&s);
        for (int i = OFF_B1; i < OFF_W2; i++)
            params[i] = 0.0f;
        for (int i = OFF_B2; i < NPARAMS; i++)
            params[i] = 0.0f;
    } else {
        memset(params, 0, NPARAMS * sizeof *params);
    }
    CHECK(gvqBroadcast(params, params, NPARAMS, gvqFloat32, 0, comm, NULL));

    const float lr = 0.1f;
    double first = 0.0, last = 0.0;
    int mismatches = 0;
    for (int step = 0; step < steps; step++) {
        make_batch(&data_seed, teacher, x, y);
        float loss = forward_backward(params, x, y, grads);
        /* 3. the one new line per step: the mean of every rank's gradient, in place */
        CHECK(gvqAllReduce(grads, grads, NPARAMS, gvqFloat32, gvqAvg, comm, NULL));
        for (int i = 0; i < NPARAMS; i++)
            params[i] -= lr * grads[i];

        /* for printing only: the mean loss over the ranks (in double, which GVQ_CODEC never
         * compresses) */
        double local_loss = loss, mean_loss = 0.0;
        CHECK(gvqAllReduce(&local_loss, &mean_loss, 1, gvqFloat64, gvqAvg, comm, NULL));
        if (step < 20) first += mean_loss / 20.0;
        if (step >= steps - 20) last += mean_loss / 20.0;
        if ((step + 1) % 100 == 0 || step + 1 == steps) {
            int same = weights_agree(params, comm); /* 4. the check */
            mismatches += !same;
            if (rank == 0)
                printf("step %4d  loss %.4f  weights %s %d ranks\n", step + 1, mean_loss,
                       same ? "identical on all" : "DIFFER between the", nranks);
        }
    }

    gvqCompressorStats_t st;
    CHECK(gvqCommGetCompressionStats(comm, GVQ_STATS_TOTAL, &st));
    int fell = last < 0.7 * first;
    if (rank == 0) {
        printf("loss %.4f -> %.4f over %d steps (%s); ", first, last, steps,
               fell ? "learning" : "NOT learning");
        if (st.iteration > 0)
            printf("zero-code mode: %.2fx fewer bytes than a plain ring\n",
                   st.wireBytes > 0 ? (double)st.rawBytes / (double)st.wireBytes : 1.0);
        else
            printf("plain gvqAllReduce (GVQ_CODEC unset)\n");
    }
    free(params);
    free(grads);
    free(teacher);
    free(x);
    free(y);
    CHECK(gvqCommDestroy(comm));
    MPI_Finalize();
    return mismatches == 0 && fell ? 0 : 1;
}
