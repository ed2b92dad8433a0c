/*
 * gvq_dwbp.c -- gvq-dwbp: wait-free backprop through the training layer, with an accelerator's
 * compute. Each layer's forward and backward pass is a sleep of the model's measured length, so
 * the compute takes no CPU from the transfers, as on a GPU. (gvq-train's compute shares this
 * machine's cores with them.) Three ways of running the same steps, side by side in one run:
 *
 *   flat       no compute: one gvqAllReduce of all the gradients (the fastest transfer)
 *   after      forward, backward, then gvqTrainWaitAll aggregates (waitFree 0): the step's
 *              compute and its communication, measured apart
 *   wait-free  each layer's gradient handed over as its backward ends (waitFree 1)
 *   overlap    the same, and the update inside the next forward pass: the negotiated order
 *              (gvqTrainScheduleForward), each layer's forward waiting for its own variable
 *
 *     step:  F0 F1 .. F(L-1)  B(L-1) -> ready(L-1) .. B0 -> ready(0)  [after: wait all]
 *     overlap, the next step:  wait(0) F0  wait(1) F1 ..  wait all  B(L-1) ..
 *
 *   mpirun -np P gvq-dwbp [-l SPEC] [-s STEPS] [-c CHUNK_BYTES] [-k BUCKET_BYTES] [-t PREFIX]
 *
 * -t: rank 0 writes the middle step of each mode to PREFIX-MODE.csv in gvq-train's --timeline
 * format (apps/gvq-train/plot_timeline.py draws them).
 *
 * The chunks and buckets are the overlap mode's (the negotiated order needs small ones); the
 * other modes keep the layer's defaults.
 *
 * SPEC lists the layers from the input: floats:forward_us:backward_us,... (0 floats: a layer
 * without weights). The default is ResNet-8 as gvq-train runs it at 32 images per rank: its
 * layers' weights, and the backward times of a step of its --timeline (2-core Intel VM,
 * 2026-11-26), with the 5.54 ms forward pass split in the same proportions. Prints ms per step
 * (the median over the ranks' means) and each mode's ratio to max(compute, comm): the compute of
 * "after", and the faster of its communication and "flat".
 */
#define _GNU_SOURCE
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "gvq.h"
#include "gvq_mpi.h"
#include "gvq_train.h"
#include "perf_common.h"

enum { MAX_LAYERS = 64, MODE_AFTER = 0, MODE_WAIT_FREE, MODE_OVERLAP, MODES };

static const char *const DEFAULT_SPEC =
    "160:82:119,0:136:199,4612:2693:3929,13828:1412:2061,55300:1200:1751,0:14:21,650:3:4";

typedef struct {
    int n;
    long floats[MAX_LAYERS];
    long fwd_us[MAX_LAYERS], bwd_us[MAX_LAYERS];
    float *grad[MAX_LAYERS];
    int id[MAX_LAYERS]; /* the layer's variable, -1: none */
} model_t;

typedef struct {
    double step, compute, comm; /* seconds per step */
} timing_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The accelerator at work: the caller's thread sleeps, the CPU is free. */
static void compute_us(long us) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long ns = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec + us * 1000LL;
    ts.tv_sec = (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

static int parse_spec(const char *spec, model_t *m) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    m->n = 0;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (m->n == MAX_LAYERS) return -1;
        long f, fu, bu;
        if (sscanf(tok, "%ld:%ld:%ld", &f, &fu, &bu) != 3 || f < 0 || fu < 0 || bu < 0) return -1;
        m->floats[m->n] = f;
        m->fwd_us[m->n] = fu;
        m->bwd_us[m->n] = bu;
        m->n++;
    }
    return m->n > 0 ? 0 : -1;
}

/* A layer over its own communicator, the variables registered in backward order. */
static gvqTrainer_t make_trainer(model_t *m, int mode, int chunk, int bucket, gvqComm_t *comm) {
    GVQTEST(gvqCommInitMPI(comm, MPI_COMM_WORLD, NULL));
    gvqTrainConfig_t cfg = GVQ_TRAIN_CONFIG_INITIALIZER;
    cfg.waitFree = mode != MODE_AFTER;
    cfg.schedule = mode == MODE_OVERLAP ? gvqTrainScheduleForward : gvqTrainScheduleReady;
    if (mode == MODE_OVERLAP) {
        cfg.chunkBytes = chunk;
        cfg.bucketBytes = bucket;
    }
    gvqTrainer_t t;
    GVQTEST(gvqTrainCreate(*comm, &cfg, &t));
    for (int l = m->n - 1; l >= 0; l--) {
        m->id[l] = -1;
        if (m->floats[l] == 0) continue;
        char name[32];
        snprintf(name, sizeof name, "layer%d", l);
        gvqVariable_t v = GVQ_VARIABLE_INITIALIZER;
        v.name = name;
        v.kind = gvqVarDense;
        v.shape[0] = (int)m->floats[l];
        GVQTEST(gvqTrainAddVariable(t, &v, &m->id[l]));
    }
    GVQTEST(gvqTrainCommit(t));
    return t;
}

/* A step's times (CLOCK_MONOTONIC seconds), for --timeline. */
typedef struct {
    double t0, fwd_end, bwd_end[MAX_LAYERS], wait_all[2];
    double wait[MAX_LAYERS][2], fwd[MAX_LAYERS][2]; /* per layer of the forward pass */
    gvqTrainVariableInfo_t info[MAX_LAYERS];        /* the aggregation this step completed */
} steprec_t;

/* What the aggregation just completed did, per variable (snap: record it). */
static void snapshot(gvqTrainer_t t, const model_t *m, steprec_t *r, int snap) {
    for (int l = 0; snap && l < m->n; l++)
        if (m->id[l] >= 0) GVQTEST(gvqTrainGetVariableInfo(t, m->id[l], &r->info[l]));
}

/* One step, its times in *r; *pending: the last step's aggregation is still in flight (overlap
 * only); snap_prev / snap: keep the variables' record of the last step's / this step's
 * aggregation when it completes (the layer keeps only the latest). */
static void step(gvqTrainer_t t, const model_t *m, int mode, int *pending, double *comm_s,
                 steprec_t *r, int snap_prev, steprec_t *prev, int snap) {
    r->t0 = now_s();
    for (int l = 0; l < m->n; l++) {
        r->wait[l][0] = now_s();
        if (*pending && m->id[l] >= 0) GVQTEST(gvqTrainWaitVariable(t, m->id[l]));
        r->wait[l][1] = r->fwd[l][0] = now_s();
        compute_us(m->fwd_us[l]);
        r->fwd[l][1] = now_s();
    }
    if (*pending) {
        GVQTEST(gvqTrainWaitAll(t));
        snapshot(t, m, prev, snap_prev);
    }
    *pending = 0;
    r->fwd_end = now_s();
    for (int l = m->n - 1; l >= 0; l--) {
        compute_us(m->bwd_us[l]);
        r->bwd_end[l] = now_s();
        if (m->id[l] >= 0) GVQTEST(gvqTrainGradReady(t, m->id[l], m->grad[l]));
    }
    r->wait_all[0] = r->wait_all[1] = now_s();
    if (mode == MODE_OVERLAP) {
        *pending = 1;
        return;
    }
    GVQTEST(gvqTrainWaitAll(t));
    r->wait_all[1] = now_s();
    *comm_s += r->wait_all[1] - r->wait_all[0];
    snapshot(t, m, r, snap);
}

/* gvq-train's --timeline format (apps/gvq-train/plot_timeline.py draws it): step r, and with the
 * overlap the next step's forward pass, which waits for r's aggregation layer by layer. */
static void write_timeline(const char *path, const model_t *m, int mode, const steprec_t *r,
                           const steprec_t *next) {
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "gvq-dwbp: cannot write '%s'\n", path);
        return;
    }
    double t0 = r->t0;
    fprintf(f, "# gvq-dwbp\nwhat,name,start_s,end_s,ready_s\n");
    fprintf(f, "forward,net,%.6f,%.6f,\n", 0.0, r->fwd_end - t0);
    double prev = r->fwd_end;
    for (int l = m->n - 1; l >= 0; l--) {
        fprintf(f, "backward,layer%d,%.6f,%.6f,\n", l, prev - t0, r->bwd_end[l] - t0);
        prev = r->bwd_end[l];
    }
    for (int l = m->n - 1; l >= 0; l--)
        if (m->id[l] >= 0)
            fprintf(f, "aggregate,%s,%.6f,%.6f,%.6f\n", r->info[l].name, r->info[l].startTime - t0,
                    r->info[l].endTime - t0, r->info[l].readyTime - t0);
    if (mode != MODE_OVERLAP) {
        fprintf(f, "wait,all,%.6f,%.6f,\n", r->wait_all[0] - t0, r->wait_all[1] - t0);
    } else {
        for (int l = 0; l < m->n; l++)
            fprintf(f, "wait,layer%d,%.6f,%.6f,\nforward,layer%d,%.6f,%.6f,\n", l,
                    next->wait[l][0] - t0, next->wait[l][1] - t0, l, next->fwd[l][0] - t0,
                    next->fwd[l][1] - t0);
    }
    fclose(f);
}

static double median_over_ranks(double x, int P) {
    double *all = malloc(sizeof(double) * (size_t)P);
    MPITEST(MPI_Allgather(&x, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, MPI_COMM_WORLD));
    double med = perf_median(all, P);
    free(all);
    return med;
}

/* Seconds per plain allreduce of all the model's floats, without compute. */
static double run_flat(long total, int steps, int P) {
    gvqComm_t comm;
    GVQTEST(gvqCommInitMPI(&comm, MPI_COMM_WORLD, NULL));
    float *buf = calloc((size_t)(total > 0 ? total : 1), sizeof(float));
    for (int s = 0; s < 5; s++)
        GVQTEST(gvqAllReduce(buf, buf, (size_t)total, gvqFloat32, gvqAvg, comm, NULL));
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_s();
    for (int s = 0; s < steps; s++)
        GVQTEST(gvqAllReduce(buf, buf, (size_t)total, gvqFloat32, gvqAvg, comm, NULL));
    double el = now_s() - t0;
    free(buf);
    GVQTEST(gvqCommDestroy(comm));
    return median_over_ranks(el / steps, P);
}

/* The mode's steps; with timeline (rank 0), the middle step written to timeline-MODE.csv. */
static timing_t run_mode(model_t *m, int mode, int steps, int chunk, int bucket, int P,
                         const char *timeline, const char *name) {
    static steprec_t rec[3]; /* the traced step, the one after it, scratch */
    gvqComm_t comm;
    gvqTrainer_t t = make_trainer(m, mode, chunk, bucket, &comm);
    int pending = 0, traced = steps / 2;
    double comm_s = 0.0;
    for (int s = 0; s < 5; s++) /* warm-up: connections, buffers, the negotiation's state */
        step(t, m, mode, &pending, &comm_s, &rec[2], 0, &rec[2], 0);
    if (pending) GVQTEST(gvqTrainWaitAll(t));
    pending = 0;
    comm_s = 0.0;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_s();
    for (int s = 0; s < steps; s++) {
        steprec_t *r = s == traced ? &rec[0] : s == traced + 1 ? &rec[1] : &rec[2];
        step(t, m, mode, &pending, &comm_s, r, s == traced + 1, &rec[0], s == traced);
    }
    if (pending) GVQTEST(gvqTrainWaitAll(t));
    double el = now_s() - t0;
    if (timeline != NULL && (mode != MODE_OVERLAP || traced + 1 < steps)) {
        char path[512];
        snprintf(path, sizeof path, "%s-%s.csv", timeline, name);
        write_timeline(path, m, mode, &rec[0], &rec[1]);
    }
    GVQTEST(gvqTrainDestroy(t));
    GVQTEST(gvqCommDestroy(comm));
    timing_t r;
    r.step = median_over_ranks(el / steps, P);
    r.comm = median_over_ranks(comm_s / steps, P);
    r.compute = r.step - r.comm;
    return r;
}

int main(int argc, char **argv) {
    int provided = 0;
    MPITEST(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided)); /* the layer's thread */
    MPITEST(MPI_Comm_rank(MPI_COMM_WORLD, &perf_rank));
    MPITEST(MPI_Comm_size(MPI_COMM_WORLD, &perf_nranks));
    const int rank = perf_rank, P = perf_nranks;
    prctl(PR_SET_TIMERSLACK, 1UL); /* sleeps to the microsecond, not the default 50 */
    const char *spec = DEFAULT_SPEC;
    const char *timeline = NULL;
    int steps = 200, chunk = 16384, bucket = 16384, bad = 0;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "-l"))
            spec = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "-s"))
            steps = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "-c"))
            chunk = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "-k"))
            bucket = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "-t"))
            timeline = argv[++i];
        else
            bad = 1;
    }
    static model_t m;
    if (bad || steps < 1 || chunk < 0 || bucket < 0 || parse_spec(spec, &m) != 0) {
        if (rank == 0)
            fprintf(stderr, "usage: gvq-dwbp [-l floats:fwd_us:bwd_us,...] [-s STEPS] "
                            "[-c CHUNK_BYTES] [-k BUCKET_BYTES] [-t TIMELINE_PREFIX]\n");
        MPI_Finalize();
        return 2;
    }
    long total = 0, fwd = 0, bwd = 0;
    for (int l = 0; l < m.n; l++) {
        total += m.floats[l];
        fwd += m.fwd_us[l];
        bwd += m.bwd_us[l];
        m.grad[l] = malloc(sizeof(float) * (size_t)(m.floats[l] > 0 ? m.floats[l] : 1));
        for (long i = 0; i < m.floats[l]; i++)
            m.grad[l][i] = (float)((i + rank) % 13) * 0.01f;
    }
    if (rank == 0)
        printf("# gvq-dwbp: %d ranks, %d layers, %ld floats, compute %.2f ms forward + %.2f ms "
               "backward (sleeps), %d steps, overlap chunks and buckets %d / %d bytes\n"
               "%-10s %10s %12s %10s %16s\n",
               P, m.n, total, fwd / 1e3, bwd / 1e3, steps, chunk, bucket, "mode", "ms/step",
               "compute_ms", "comm_ms", "step/max(c,comm)");
    static const char *const names[MODES] = {"after", "wait-free", "overlap"};
    double flat = run_flat(total, steps, P);
    if (rank == 0)
        printf("%-10s %10.2f %12s %10.2f %16s\n", "flat", 1e3 * flat, "-", 1e3 * flat, "-");
    timing_t after = {0, 0, 0};
    for (int mode = 0; mode < MODES; mode++) {
        timing_t r =
            run_mode(&m, mode, steps, chunk, bucket, P, rank == 0 ? timeline : NULL, names[mode]);
        if (mode == MODE_AFTER) after = r;
        double comm = after.comm < flat ? after.comm : flat;
        double floor = after.compute > comm ? after.compute : comm;
        if (rank == 0) {
            if (mode == MODE_AFTER)
                printf("%-10s %10.2f %12.2f %10.2f %16.2f\n", names[mode], 1e3 * r.step,
                       1e3 * r.compute, 1e3 * r.comm, r.step / floor);
            else
                printf("%-10s %10.2f %12s %10s %16.2f\n", names[mode], 1e3 * r.step, "-", "-",
                       r.step / floor);
        }
    }
    /* every step averaged the gradients in place: they hold the ranks' mean of what each began
     * with, whatever the mode */
    long wrong = 0;
    for (int l = 0; l < m.n; l++) {
        for (long i = 0; i < m.floats[l]; i++) {
            double want = 0.0;
            for (int r = 0; r < P; r++)
                want += (double)((float)((i + r) % 13) * 0.01f) / P;
            if (fabs((double)m.grad[l][i] - want) > 1e-5) wrong++;
        }
        free(m.grad[l]);
    }
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0 && wrong > 0)
        printf("FAIL: %ld gradient values are not the ranks' mean\n", wrong);
    MPI_Finalize();
    return wrong > 0;
}
