/*
 * train.c -- data-parallel SGD over gvq (see train.h).
 *
 * One step, on each of the N ranks:
 *
 *   global batch t (B images of an epoch's shuffled order, the same order on every rank)
 *     |-- rank n takes images [n B/N, (n+1) B/N) of it
 *   forward, softmax cross-entropy, backward            -> local mean gradient g_n  (compute)
 *   conv layer i weights:  gvqAllReduceCompressed(g_n[i], gvqAvg, compressor i)   (comm)
 *                          (codec none: gvqAllReduce; i runs over net.conv, the convs inside
 *                          residual blocks included)
 *   the rest (biases, fc): gvqAllReduce(gvqAvg)  (or a QSGD compressor; or, with PowerSGD,
 *                          the last fc's weights through a compressor and the values before
 *                          and after them plain)
 *       -- or, zero-code mode: one gvqAllReduce over the whole flat gradient --
 *   v = mu v + g + wd w ;  w -= lr v                     (identical on every rank, because
 *                                                         gvq's results are bitwise identical)
 *
 * Every print_every steps the window's loss, accuracy and timings are summed over the ranks with
 * MPI, the test set is evaluated when due (split over the ranks), the conv compressors' stats
 * are read, and rank 0 prints a line and writes a CSV row. Weight checksums (FNV-1a of the
 * parameter bits) are compared across ranks every check_every steps. With o->progress, rank 0
 * keeps a line with the estimated time left on stderr (progress_draw).
 */
#include "train.h"

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>

#include "gvq.h"
#include "gvq_mpi.h"
#include "aggregate.h"
#include "commit.h"
#include "mnist.h"

/* A failed gvq or MPI call ends the whole job (train_fail): a rank that stopped calling
 * collectives would leave the others waiting for it until gvq's timeout. In an elastic run's
 * steps it goes to the recovery instead (train_fault). */
static jmp_buf *train_fault;

static void train_fail(void) {
    if (train_fault != NULL) longjmp(*train_fault, 1);
    int mpi = 0;
    MPI_Initialized(&mpi);
    if (mpi) MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

#define TRAIN_GVQ(call, comm)                                                                    \
    do {                                                                                         \
        gvqResult_t res_ = (call);                                                               \
        if (res_ != gvqSuccess) {                                                                \
            fprintf(stderr, "gvq-train: %s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call, \
                    gvqGetErrorString(res_), gvqGetLastError(comm));                             \
            train_fail();                                                                        \
        }                                                                                        \
    } while (0)

#define TRAIN_MPI(call)                                                                            \
    do {                                                                                           \
        int err_ = (call);                                                                         \
        if (err_ != MPI_SUCCESS) {                                                                 \
            char msg_[MPI_MAX_ERROR_STRING];                                                       \
            int len_ = 0;                                                                          \
            MPI_Error_string(err_, msg_, &len_);                                                   \
            fprintf(stderr, "gvq-train: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, msg_); \
            train_fail();                                                                          \
        }                                                                                          \
    } while (0)

/* The small reductions of the run (sums, checks, flags) over gvq's communicator: MPI may not be
 * there (a run started without mpirun). */
#define TRAIN_REDUCE(ptr, n, type, op, comm) \
    TRAIN_GVQ(gvqAllReduce((ptr), (ptr), (n), (type), (op), (comm), NULL), (comm))

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the progress line: rank 0, on stderr, when o->progress (gvq_train.c decides) ----------
 * "gvq-train: step 1234/2811 (44%), 1m02s elapsed, about 1m18s left", rewritten in place at most
 * once a second from PROGRESS_AFTER_S on (short runs never show it), erased before every line
 * on stdout and at the end. The time left assumes the remaining steps cost what the done ones
 * did, evaluations included (with --stop-at it is an upper bound). */
#define PROGRESS_AFTER_S 3.0

typedef struct {
    int on;
    int shown; /* a line is on the terminal */
    double start, last;
} progress_t;

static void fmt_duration(char *buf, size_t len, double s) {
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, len, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(buf, len, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, len, "%lds", t);
}

static void progress_draw(progress_t *p, long done, long total) {
    if (!p->on || done <= 0) return;
    double now = now_s();
    if (now - p->start < PROGRESS_AFTER_S || now - p->last < 1.0) return;
    p->last = now;
    char el[32], left[32];
    fmt_duration(el, sizeof el, now - p->start);
    fmt_duration(left, sizeof left, (now - p->start) * (double)(total - done) / (double)done);
    fprintf(stderr, "\rgvq-train: step %ld/%ld (%.0f%%), %s elapsed, about %s left\033[K", done,
            total, 100.0 * (double)done / (double)total, el, left);
    fflush(stderr);
    p->shown = 1;
}

static void progress_clear(progress_t *p) {
    if (!p->shown) return;
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
    p->shown = 0;
}

void train_opts_default(train_opts_t *o) {
    memset(o, 0, sizeof *o);
    o->data_dir = MNIST_DEFAULT_DIR;
    o->arch.nconv = 3;
    o->arch.channels[0] = 16;
    o->arch.channels[1] = 32;
    o->arch.channels[2] = 64;
    o->arch.ksize = 3;
    o->arch.hidden = 0;
    o->arch.classes = 10;
    o->arch.model = NET_CNN;
    o->arch.blocks = 1;
    o->batch = 64;
    o->epochs = 2;
    o->lr = 0.05;
    o->momentum = 0.9;
    o->predict_distance = 1; /* gvqPredictSchedule: the paper's diverges on this flushed pipeline */
    o->seed = 1;
    o->codec = TRAIN_CODEC_GRADIVEQ;
    o->rest_codec = TRAIN_CODEC_NONE;
    o->slice = o->reuse = o->warmup = o->sample = o->compressed = TRAIN_UNSET;
    o->sample_slices = TRAIN_UNSET;
    o->sample_codec = o->qsgd_bits = o->qsgd_bucket = o->max_dims = TRAIN_UNSET;
    o->eps = -1.0;
    o->vote = -1.0;
    o->power_rank = o->integer_bits = o->error_feedback = TRAIN_UNSET;
    o->ef_bound = -1.0;
    o->bucket_bytes = TRAIN_UNSET;
    o->comm_order = o->chunk_bytes = TRAIN_UNSET;
    o->sfb = TRAIN_UNSET;
    o->sparse_route = GVQ_CONFIG_UNDEF_INT;
    o->ps_staleness = -1;
    o->vocab = 65536;
    o->embed_dim = 32;
    o->timeline_step = 100;
    o->print_every = 50;
    o->eval_every = 200;
    o->dump_layer = 2;
    o->out = stdout;
}

/* ---- gradient recording (gvq-perf --replay's GVQGRAD1 format, see perf/perf_gradsrc.h) --------
 */

typedef struct {
    FILE *f;
    uint64_t count, iters;
} dump_t;

static int dump_open(dump_t *d, const char *path, size_t count) {
    const uint16_t one = 1;
    uint8_t low;
    memcpy(&low, &one, 1);
    if (low != 1) {
        fprintf(stderr, "gvq-train: --dump-grads writes little-endian files; this host is not\n");
        return -1;
    }
    d->f = fopen(path, "wb");
    if (d->f == NULL) {
        fprintf(stderr, "gvq-train: cannot create '%s': %s\n", path, strerror(errno));
        return -1;
    }
    d->count = count;
    d->iters = 0;
    uint64_t hdr[2] = {d->count, 0};
    if (fwrite("GVQGRAD1", 1, 8, d->f) != 8 || fwrite(hdr, 8, 2, d->f) != 2) {
        fprintf(stderr, "gvq-train: cannot write '%s'\n", path);
        fclose(d->f);
        d->f = NULL;
        return -1;
    }
    return 0;
}

static int dump_record(dump_t *d, const float *g) {
    if (fwrite(g, sizeof(float), d->count, d->f) != d->count) return -1;
    d->iters++;
    return 0;
}

/* Patches the iteration count into the header and closes the file. */
static int dump_close(dump_t *d, const char *path) {
    int ok = fseek(d->f, 16, SEEK_SET) == 0 && fwrite(&d->iters, 8, 1, d->f) == 1;
    if (fclose(d->f) != 0) ok = 0;
    d->f = NULL;
    if (!ok) {
        fprintf(stderr, "gvq-train: cannot finish '%s'\n", path);
        return -1;
    }
    return 0;
}

/* ---- helpers -------------------------------------------------------------------------------- */

void train_shuffle(int *perm, int n, uint64_t seed) {
    rng_t r = {seed};
    for (int i = 0; i < n; i++)
        perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(rng_uniform(&r) * (double)(i + 1));
        if (j > i) j = i;
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

long train_count_correct(net_t *net, const mnist_set_t *test, int rank, int nranks, float *images,
                         uint8_t *labels, int *idx) {
    int lo = (int)((long)test->n * rank / nranks), hi = (int)((long)test->n * (rank + 1) / nranks);
    long correct = 0;
    for (int i = lo; i < hi; i += net->capacity) {
        int n = hi - i < net->capacity ? hi - i : net->capacity;
        for (int j = 0; j < n; j++)
            idx[j] = i + j;
        mnist_batch(test, idx, n, images, labels);
        correct += net_count_correct(net, images, labels, n);
    }
    return correct;
}

/* Test accuracy in percent: each rank evaluates its share of the test set. */
double train_evaluate(net_t *net, const mnist_set_t *test, int rank, int nranks, MPI_Comm comm,
                      float *images, uint8_t *labels, int *idx) {
    long correct = train_count_correct(net, test, rank, nranks, images, labels, idx), total = 0;
    TRAIN_MPI(MPI_Allreduce(&correct, &total, 1, MPI_LONG, MPI_SUM, comm));
    return 100.0 * (double)total / (double)test->n;
}

/* 1 when every rank holds the same weights (compares the min and max of their hashes). */
static int weights_agree(const net_t *net, gvqComm_t comm) {
    uint64_t lo = hash_floats(net->params, net->nparams), hi = lo;
    TRAIN_REDUCE(&lo, 1, gvqUint64, gvqMin, comm);
    TRAIN_REDUCE(&hi, 1, gvqUint64, gvqMax, comm);
    return lo == hi;
}

static const char *codec_name(int c) {
    switch (c) {
    case TRAIN_CODEC_GRADIVEQ:
        return "gradiveq";
    case TRAIN_CODEC_QSGD:
        return "qsgd";
    case TRAIN_CODEC_POWERSGD:
        return "powersgd";
    default:
        return "none";
    }
}

static char phase_letter(int phase) {
    switch (phase) {
    case gvqPhaseWarmup:
        return 'W';
    case gvqPhaseSample:
        return 'S';
    case gvqPhaseCompressed:
        return 'C';
    default:
        return 'P';
    }
}

/* Gradient recording (--dump-grads): the recorded conv's local gradient, read after the backward
 * of the network layer holding it and before the training layer takes it over. */
typedef struct {
    dump_t *dump;
    const layer_t *conv;
    const net_t *net;
    int active, ok;
} dump_hook_t;

static void record_grad(int layer, void *arg) {
    dump_hook_t *h = arg;
    if (!h->active || !h->ok || h->conv == NULL) return;
    const layer_t *l = &h->net->layers[layer];
    int holds = l == h->conv ||
                (l->kind == LAYER_BLOCK && (&l->sub[0] == h->conv || &l->sub[1] == h->conv));
    if (holds && dump_record(h->dump, h->conv->dw) != 0) h->ok = 0;
}

/* ---- the update, whole or layer by layer inside the next forward pass (--overlap-forward) -- */

typedef struct {
    net_t *net;
    float *velocity;
    float lr, mu, wd;
} sgd_t;

/* SGD with momentum and weight decay on parameters [off, off + n). */
static void sgd_range(const sgd_t *s, size_t off, size_t n) {
    const net_t *net = s->net;
    float *v = s->velocity, *p = net->params;
    const float *g = net->grads, *scale = net->lr_scale;
    for (size_t j = off; j < off + n; j++) {
        v[j] = s->mu * v[j] + g[j] + s->wd * p[j];
        p[j] -= (scale != NULL ? s->lr * scale[j] : s->lr) * v[j];
    }
}

/* A step's update deferred into the next forward pass: before network layer i runs, its
 * gradients are waited for and its weights updated; the times of each layer's wait. */
typedef struct {
    agg_t *agg;
    sgd_t sgd;
    gvqResult_t error;
    double wait_s;                 /* waited in this forward pass */
    double *wait_start, *wait_end; /* per network layer (the timeline) */
} deferred_t;

static void update_range(size_t off, size_t n, void *arg) {
    sgd_range(&((deferred_t *)arg)->sgd, off, n);
}

static void before_layer(int layer, void *arg) {
    deferred_t *d = arg;
    double t = now_s();
    d->wait_start[layer] = t;
    gvqResult_t r =
        d->error == gvqSuccess ? agg_wait_layer(d->agg, layer, update_range, d) : gvqSuccess;
    if (r != gvqSuccess) d->error = r;
    d->wait_end[layer] = now_s();
    d->wait_s += d->wait_end[layer] - t;
}

/* --timeline: one step as CSV rows (what, name, start, end; seconds from the step's start):
 * the forward pass, each layer's backward, each variable's aggregation (with its ready time),
 * the wait and the update. */
static void write_timeline(const char *path, const agg_t *a, long step, double t0, double t_fwd,
                           double t1, double t2, double t3, const deferred_t *next,
                           double next_fwd_end) {
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "gvq-train: cannot create the timeline '%s': %s\n", path, strerror(errno));
        return;
    }
    fprintf(f, "# step %ld\nwhat,name,start_s,end_s,ready_s\n", step);
    fprintf(f, "forward,net,%.6f,%.6f,\n", 0.0, t_fwd - t0);
    double prev = a->backward_start;
    for (int i = a->net->nlayers - 1; i >= 0; i--) {
        fprintf(f, "backward,layer%d,%.6f,%.6f,\n", i, prev - t0, a->layer_end[i] - t0);
        prev = a->layer_end[i];
    }
    for (int v = 0; v < a->nvars && a->trainer != NULL; v++) {
        gvqTrainVariableInfo_t info;
        if (gvqTrainGetVariableInfo(a->trainer, a->vars[v].id, &info) != gvqSuccess) continue;
        fprintf(f, "aggregate,%s,%.6f,%.6f,%.6f\n", info.name, info.startTime - t0,
                info.endTime - t0, info.readyTime - t0);
    }
    if (next == NULL) {
        fprintf(f, "wait,all,%.6f,%.6f,\nupdate,sgd,%.6f,%.6f,\n", t1 - t0, t2 - t0, t2 - t0,
                t3 - t0);
    } else { /* the next forward pass, each layer after its wait and update */
        int n = a->net->nlayers;
        for (int i = 0; i < n; i++) {
            double end = i + 1 < n ? next->wait_start[i + 1] : next_fwd_end;
            fprintf(f, "wait,layer%d,%.6f,%.6f,\nforward,layer%d,%.6f,%.6f,\n", i,
                    next->wait_start[i] - t0, next->wait_end[i] - t0, i, next->wait_end[i] - t0,
                    end - t0);
        }
    }
    fclose(f);
}

/* ---- the run -------------------------------------------------------------------------------- */

/* What the parts of train_run share: the run's data, model and buffers, gvq's objects, the
 * gradient recording, the log, and the loop's running sums. */
typedef struct {
    const train_opts_t *o;
    MPI_Comm comm;
    train_result_t *res;
    FILE *out, *csv;                /* the progress lines; the log (rank 0) */
    int rank, nranks, batch, local; /* local: a rank's share of the global batch */
    int bad, anybad;                /* this rank failed, some rank did */
    long steps_per_epoch, iters;
    mnist_set_t train, test;
    net_t net;
    float *velocity, *images;
    uint8_t *labels;
    int *perm, *idx;
    char *phases; /* the conv compressors' phase letters of a progress line */
    gvqComm_t gcomm;
    agg_t agg;
    dump_t dump;
    int dumping;
    dump_hook_t dump_hook;
    /* the loop: a window's sums (between two progress lines) and the run's */
    double win_loss, win_compute, win_comm, tot_compute, tot_comm, train_s, win_start, test_acc;
    long win_correct, win_seen, win_steps, pos; /* pos: the next image of the epoch's order */
    unsigned long long prev_raw, prev_wire;
    int epoch;
    progress_t progress;
    /* --overlap-forward: the last step's update, waiting inside this forward pass */
    deferred_t next;
    int pending;
    double prev_t0, prev_fwd, prev_t1; /* the deferred step's (its timeline) */
    /* --elastic: the last two commits (a survivor may be a step ahead of another), the first
     * job's size, this process's rank in it, and the faults ridden through */
    struct {
        long step, pos;
        int epoch;
        float *params, *velocity;
        char *agg;                 /* the aggregation's state (gvqTrainSave: the compressors) */
        size_t agg_bytes, agg_cap; /* agg_bytes 0: none (the compressors are then rebuilt) */
    } commit[2];
    int latest, nranks0, first_rank, faults, after_fault, spawned;
    long steps_lost, start_step; /* start_step: a replacement's first step */
    int joined;                  /* a replacement before its first step: its grow is done */
    long agg_since;              /* the step the aggregation was last set up at (its counts') */
    pid_t kids[8];               /* the replacements rank 0 started */
    double lr_scale, step_start, recovered_at;
    int resumed;                      /* --resume: the state came from a commit on disk */
    long disk_commits, disk_failures; /* --commit-dir */
    double disk_s;                    /* their writing time (rank 0) */
} run_t;

static void elastic_join(run_t *r);

/* The data and the model: the batch checked against the ranks, both image sets loaded (every
 * rank loads them; one failure stops all), the network and its buffers. -1, everything freed,
 * when the run cannot start. */
static int run_load(run_t *r) {
    const train_opts_t *o = r->o;
    if (o->join_hex != NULL) { /* a replacement: joins once its data and model are ready */
        r->rank = o->join_rank;
        r->nranks = o->join_size;
    } else {
        if (r->comm != MPI_COMM_NULL)
            TRAIN_GVQ(gvqCommInitMPI(&r->gcomm, r->comm, NULL), NULL);
        else
            TRAIN_GVQ(gvqCommInitFromEnv(&r->gcomm, NULL), NULL);
        TRAIN_GVQ(gvqCommUserRank(r->gcomm, &r->rank), r->gcomm);
        TRAIN_GVQ(gvqCommCount(r->gcomm, &r->nranks), r->gcomm);
    }
    const int rank = r->rank, nranks = r->nranks;
    r->out = o->out != NULL ? o->out : stdout;
    memset(r->res, 0, sizeof *r->res);
    r->res->time_to_stop = -1.0;

    const int batch = r->batch = o->batch > 0 ? o->batch : 32 * nranks;
    if (batch < nranks || batch % nranks != 0) {
        if (rank == 0)
            fprintf(stderr,
                    "gvq-train: the global batch (%d) must be a multiple of the number of "
                    "ranks (%d)\n",
                    batch, nranks);
        return -1;
    }
    const int local = r->local = batch / nranks;

    /* data: every rank loads it; one failure stops all */
    char err[4096] = "";
    r->bad = mnist_load(&r->train, o->data_dir, "train", o->train_subset, err, sizeof err) != 0 ||
             mnist_load(&r->test, o->data_dir, "t10k", o->test_subset, err, sizeof err) != 0;
    r->anybad = r->bad;
    if (o->join_hex == NULL) TRAIN_REDUCE(&r->anybad, 1, gvqInt32, gvqMax, r->gcomm);
    if (r->anybad) {
        if (r->bad) fprintf(stderr, "gvq-train: rank %d: %s\n", rank, err);
        goto fail;
    }
    const mnist_set_t *train = &r->train;
    if (train->n < batch) {
        if (rank == 0)
            fprintf(stderr, "gvq-train: %d training images, fewer than one global batch (%d)\n",
                    train->n, batch);
        goto fail;
    }
    r->steps_per_epoch = train->n / batch;
    r->iters = o->iters > 0 ? o->iters : (long)o->epochs * r->steps_per_epoch;

    /* model */
    const int capacity = local > 100 ? local : 100; /* evaluation runs in chunks of 100 */
    if (net_create(&r->net, &o->arch, 1, train->rows, train->cols, capacity, o->seed, err,
                   sizeof err) != 0) {
        if (rank == 0) fprintf(stderr, "gvq-train: %s\n", err);
        goto fail;
    }
    r->velocity = calloc(r->net.nparams, sizeof(float));
    r->images = malloc(sizeof(float) * (size_t)capacity * train->rows * train->cols);
    r->labels = malloc((size_t)capacity);
    r->perm = malloc(sizeof(int) * (size_t)train->n);
    r->idx = malloc(sizeof(int) * (size_t)capacity);
    r->res->loss_hist = calloc((size_t)r->iters, sizeof(double));
    if (r->velocity == NULL || r->images == NULL || r->labels == NULL || r->perm == NULL ||
        r->idx == NULL || r->res->loss_hist == NULL) {
        fprintf(stderr, "gvq-train: rank %d: out of memory\n", rank);
        train_fail();
    }
    if (o->join_hex != NULL) elastic_join(r);
    return 0;
fail:
    mnist_free(&r->train);
    mnist_free(&r->test);
    (void)gvqCommDestroy(r->gcomm);
    return -1;
}

static int grow_agg(run_t *r, int newcomer);

/* gvq: a communicator, and the training layer with a variable per weight tensor. */
static void run_connect(run_t *r) {
    r->phases = malloc(2 * (size_t)r->net.nconv + 16);
    if (r->phases == NULL) {
        fprintf(stderr, "gvq-train: rank %d: out of memory\n", r->rank);
        train_fail();
    }
    gvqResult_t agg_res;
    if (agg_setup(&r->agg, r->o, &r->net, r->gcomm, &agg_res) != 0) TRAIN_GVQ(agg_res, r->gcomm);
    /* a replacement: the members' compressors, as they load them after the grow */
    if (r->o->join_hex != NULL) (void)grow_agg(r, 1);
}

/* Gradient recording (--dump-grads): rank 0 opens the file, every rank hooks the recording into
 * the backward pass. -1 when some rank failed (the run ends there). */
static int run_open_dump(run_t *r) {
    const train_opts_t *o = r->o;
    layer_t **conv = r->net.conv;
    if (o->dump_path != NULL) {
        if (o->dump_layer < 1 || o->dump_layer > r->net.nconv) {
            if (r->rank == 0)
                fprintf(stderr, "gvq-train: --dump-layer %d: the network has conv layers 1..%d\n",
                        o->dump_layer, r->net.nconv);
            r->bad = 1;
        } else if (r->rank == 0) {
            r->bad = dump_open(&r->dump, o->dump_path, conv[o->dump_layer - 1]->nw) != 0;
            r->dumping = !r->bad;
        }
        r->anybad = r->bad;
        TRAIN_REDUCE(&r->anybad, 1, gvqInt32, gvqMax, r->gcomm);
        if (r->anybad) {
            if (r->dumping) fclose(r->dump.f);
            r->dumping = 0;
            return -1;
        }
    }
    r->dump_hook =
        (dump_hook_t){&r->dump, r->dumping ? conv[o->dump_layer - 1] : NULL, &r->net, 0, 1};
    r->agg.before_ready = record_grad;
    r->agg.before_ready_arg = &r->dump_hook;
    return 0;
}

/* Rank 0's header: the run, the data, the model, the aggregation. */
static void print_header(const run_t *r) {
    const train_opts_t *o = r->o;
    const net_t *net = &r->net;
    const int nconv = net->nconv;
    layer_t **conv = net->conv;
    gvqCompressor_t *comp = r->agg.conv_comp;
    FILE *out = r->out;
    fprintf(out,
            "# gvq-train: %d ranks, global batch %d (%d per rank), %ld steps (%ld per "
            "epoch), lr %g%s momentum %g wd %g seed %llu\n",
            r->nranks, r->batch, r->local, r->iters, r->steps_per_epoch, o->lr,
            o->cosine ? " (cosine decay)" : "", o->momentum, o->weight_decay, o->seed);
    fprintf(out, "# data: %s (%d train, %d test images of %dx%d)\n", o->data_dir, r->train.n,
            r->test.n, r->train.rows, r->train.cols);
    if (o->arch.model == NET_RESNET)
        fprintf(out, "# model: resnet-%d (Fixup, %d blocks per stage), ", 6 * o->arch.blocks + 2,
                o->arch.blocks);
    else
        fprintf(out, "# model: %s, ", o->arch.model == NET_MLP ? "mlp" : "cnn");
    fprintf(out, "%zu parameters, %zu in conv weights:", net->nparams, net->conv_params);
    for (int i = 0; i < nconv; i++)
        fprintf(out, " conv%d [K=%d][D=%d][%d][%d]%s", i + 1, conv[i]->out_c, conv[i]->in_c,
                conv[i]->ksize, conv[i]->ksize, conv[i]->stride > 1 ? "/2" : "");
    int depth = o->arch.model == NET_MLP ? o->arch.depth : o->arch.hidden > 0;
    fprintf(out, ", fc %d -> ", (int)layer_in_size(&net->layers[net->nlayers - 2 * depth - 1]));
    for (int d = 0; d < depth; d++)
        fprintf(out, "%d -> ", o->arch.hidden);
    fprintf(out, "%d\n", o->arch.classes);
    if (o->zero_code) {
        const char *e = getenv("GVQ_CODEC");
        fprintf(out,
                "# aggregation: zero-code mode, one gvqAllReduce of %zu floats "
                "(GVQ_CODEC=%s)\n",
                net->nparams, e != NULL ? e : "unset");
    } else {
        fprintf(out,
                "# aggregation: the training layer, %d variables (%s); conv weights %s, fc "
                "weights %s, biases and scalars (%zu floats with the fc) plain",
                r->agg.nvars, o->no_wait_free ? "after backprop" : "wait-free backprop",
                codec_name(o->codec), codec_name(o->rest_codec), net->nparams - net->conv_params);
        for (int i = 0; i < nconv && comp[i] != NULL; i++) {
            gvqCompressorStats_t st;
            TRAIN_GVQ(gvqCompressorGetStats(comp[i], &st), r->gcomm);
            fprintf(out, "%s conv%d L=%d groups=%d", i == 0 ? ";" : ",", i + 1, st.sliceSize,
                    st.groups);
        }
        fprintf(out, "\n");
    }
    fflush(out);
}

/* The step's forward pass; with an update pending (--overlap-forward) each layer first waits
 * for the last step's gradients and updates its weights. Returns the time waited for them. */
static double step_forward(run_t *r, long step) {
    const train_opts_t *o = r->o;
    double waited = 0.0; /* for the last step's gradients, inside this forward pass */
    if (r->pending) {
        r->next.wait_s = 0.0;
        r->agg.waiting = 1;
        r->agg.wait_s = 0.0;
        net_forward_each(&r->net, r->images, r->local, before_layer, &r->next);
        r->agg.waiting = 0;
        double fwd_end = now_s();
        TRAIN_GVQ(r->next.error, r->gcomm);
        TRAIN_GVQ(r->agg.wait_error, r->gcomm);
        double w = now_s();
        TRAIN_GVQ(agg_wait(&r->agg), r->gcomm); /* ends the last step: all of it is in */
        waited = r->next.wait_s + r->agg.wait_s + (now_s() - w);
        if (o->timeline_path != NULL && r->rank == 0 && step == o->timeline_step)
            write_timeline(o->timeline_path, &r->agg, step, r->prev_t0, r->prev_fwd, r->prev_t1, 0,
                           0, &r->next, fwd_end);
        r->pending = 0;
    } else {
        net_forward(&r->net, r->images, r->local);
    }
    return waited;
}

/* One step: the batch, forward, loss, backward with the aggregation, the update (now, or
 * deferred into the next forward pass), the window's sums, the weight check when due. Sets
 * *last and *printing (a progress line ends this step). */
static void run_step(run_t *r, long step, int *last, int *printing) {
    const train_opts_t *o = r->o;
    const int batch = r->batch, local = r->local;
    const long iters = r->iters;
    double t0 = now_s();
    if (r->pos + batch > r->train.n) {
        train_shuffle(r->perm, r->train.n, o->seed * 1000003ull + (uint64_t)r->epoch + 1);
        r->epoch++;
        r->pos = 0;
    }
    mnist_batch(&r->train, r->perm + r->pos + (long)r->rank * local, local, r->images, r->labels);
    r->pos += batch;
    double waited = step_forward(r, step);
    long correct = 0;
    double loss = net_loss(&r->net, r->labels, local, &correct);
    r->dump_hook.active = r->dumping && (o->dump_iters == 0 || (long)r->dump.iters < o->dump_iters);
    r->dump_hook.ok = 1;
    double t_fwd = now_s();
    agg_backward(&r->agg, r->images, local);
    double t1 = now_s();
    if (r->dump_hook.active && !r->dump_hook.ok) {
        fprintf(stderr, "gvq-train: cannot write '%s' (disk full?); recording stopped\n",
                o->dump_path);
        fclose(r->dump.f);
        r->dumping = 0;
    }
    const double lr_step =
        o->cosine ? o->lr * 0.5 * (1.0 + cos(3.14159265358979323846 * (double)step / (double)iters))
                  : o->lr;
    const sgd_t sgd = {&r->net, r->velocity, (float)(lr_step * r->lr_scale), (float)o->momentum,
                       (float)o->weight_decay};
    *last = step + 1 == iters || step + 1 == o->stop_step;
    *printing = (step + 1) % o->print_every == 0 || *last;
    int checking = (o->check_every > 0 && (step + 1) % o->check_every == 0) || *printing;
    double t2 = t1, t3 = t1;
    if (o->overlap_forward && !checking) { /* the weights are read before they change */
        r->next.sgd = sgd;
        r->pending = 1;
        r->prev_t0 = t0;
        r->prev_fwd = t_fwd;
        r->prev_t1 = t1;
    } else {
        TRAIN_GVQ(agg_wait(&r->agg), r->gcomm);
        t2 = now_s();
        sgd_range(&sgd, 0, r->net.nparams);
        t3 = now_s();
        if (o->timeline_path != NULL && r->rank == 0 && step + 1 == o->timeline_step)
            write_timeline(o->timeline_path, &r->agg, step + 1, t0, t_fwd, t1, t2, t3, NULL, 0);
    }
    r->win_compute += (t1 - t0) + (t3 - t2) - waited;
    r->win_comm += t2 - t1 + waited;
    r->win_loss += loss;
    r->win_correct += correct;
    r->win_seen += local;
    r->win_steps++;
    r->res->loss_hist[step] = loss;
    progress_draw(&r->progress, step + 1, iters);

    if (checking) {
        r->res->sync_checks++;
        if (!weights_agree(&r->net, r->gcomm)) {
            r->res->sync_mismatches++;
            progress_clear(&r->progress);
            if (r->rank == 0)
                fprintf(stderr, "gvq-train: step %ld: the ranks hold different weights\n",
                        step + 1);
        }
    }
}

/* The conv compressors' phase letters into r->phases, and their wire ratio since the last call. */
static double window_ratio(run_t *r) {
    const int nconv = r->net.nconv;
    gvqCompressor_t *comp = r->agg.conv_comp;
    unsigned long long raw = 0, wire = 0;
    r->phases[0] = '\0';
    for (int i = 0; i < nconv && comp[i] != NULL; i++) {
        gvqCompressorStats_t st;
        TRAIN_GVQ(gvqCompressorGetStats(comp[i], &st), r->gcomm);
        raw += st.rawBytes;
        wire += st.wireBytes;
        size_t len = strlen(r->phases);
        snprintf(r->phases + len, 2 * (size_t)nconv + 16 - len, "%s%c", i ? "," : "",
                 phase_letter(st.phase));
    }
    double ratio =
        wire > r->prev_wire ? (double)(raw - r->prev_raw) / (double)(wire - r->prev_wire) : 1.0;
    r->prev_raw = raw;
    r->prev_wire = wire;
    if (comp[0] == NULL)
        snprintf(r->phases, 2 * (size_t)nconv + 16, "%s", r->o->zero_code ? "zero-code" : "-");
    return ratio;
}

/* A window ends at step: sums over the ranks, evaluation, compressor stats, one line (and a CSV
 * row). Returns 1 when the run stops here (--stop-at reached, --stop-step). */
static int end_window(run_t *r, long step, int last) {
    const train_opts_t *o = r->o;
    const int nranks = r->nranks;
    train_result_t *res = r->res;
    double now = now_s();
    double win_train_s = now - r->win_start;
    r->train_s += win_train_s;
    double sums[5] = {r->win_loss, (double)r->win_correct, (double)r->win_seen, r->win_compute,
                      r->win_comm};
    double tot[5];
    memcpy(tot, sums, sizeof tot);
    TRAIN_REDUCE(tot, 5, gvqFloat64, gvqSum, r->gcomm);
    const long nsteps_win = r->win_steps;
    double mean_loss = tot[0] / ((double)nsteps_win * nranks);
    double train_acc = 100.0 * tot[1] / tot[2];
    double compute = tot[3] / nranks, commt = tot[4] / nranks;
    r->tot_compute += compute;
    r->tot_comm += commt;
    if (step + 1 == nsteps_win) res->first_loss = mean_loss;
    res->last_loss = mean_loss;
    int evaluated = (o->eval_every > 0 && (step + 1) % o->eval_every == 0) || last;
    if (evaluated) {
        int64_t right =
            train_count_correct(&r->net, &r->test, r->rank, nranks, r->images, r->labels, r->idx);
        TRAIN_REDUCE(&right, 1, gvqInt64, gvqSum, r->gcomm);
        r->test_acc = 100.0 * (double)right / (double)r->test.n;
    }

    double ratio = window_ratio(r);

    if (r->rank == 0) {
        double ips = (double)r->batch * (double)nsteps_win / win_train_s;
        char acc[32] = "   -  ";
        if (r->test_acc >= 0.0) snprintf(acc, sizeof acc, "%5.2f%%", r->test_acc);
        if (!o->quiet) {
            progress_clear(&r->progress);
            fprintf(r->out,
                    "epoch %2d iter %6ld  loss %.4f  train %5.2f%%  test %s  %7.0f img/s"
                    "  compute %6.2fs comm %6.2fs (%2.0f%%)  ratio %5.2f  phase %s\n",
                    r->epoch, step + 1, mean_loss, train_acc, acc, ips, compute, commt,
                    100.0 * commt / (compute + commt > 0 ? compute + commt : 1), ratio, r->phases);
            fflush(r->out);
        }
        if (r->csv != NULL) {
            fprintf(r->csv, "%ld,%d,%.4f,%.6f,%.3f,%.3f,%.1f,%.4f,%.4f,%.3f,%s\n", step + 1,
                    r->epoch, r->train_s, mean_loss, train_acc, evaluated ? r->test_acc : -1.0, ips,
                    r->tot_compute, r->tot_comm, ratio, r->phases);
            fflush(r->csv);
        }
    }
    r->win_loss = r->win_compute = r->win_comm = 0.0;
    r->win_correct = r->win_seen = r->win_steps = 0;
    if (o->stop_at > 0.0 && r->test_acc >= o->stop_at && res->time_to_stop < 0.0) {
        res->time_to_stop = r->train_s;
        res->iters = step + 1;
        return 1;
    }
    res->iters = step + 1;
    if (step + 1 == o->stop_step) return 1; /* --stop-step: the rest of the schedule is not run */
    r->win_start = now_s();
    return 0;
}

/* ---- Elastic runs (--elastic K) ---------------------------------------------------------------
 * Every K steps, between two steps, each rank copies what a rollback needs: the step, the
 * epoch's place (its order follows from the seed and the epoch) and the weights and momentum,
 * the same step on every rank. A failed call (a dead, stalled or unreachable peer: gvq's error,
 * seen by every survivor within the timeout) leaves the step (train_fault); then the survivors
 * - shrink: gvqCommShrink with GVQ_SHRINK_ABORT, every survivor the same communicator of the
 *   ranks that answered (a majority of the last one; the rest leave the run);
 * - agree on the commit to go back to, the least of their latest (a survivor may have finished
 *   the step whose call failed on another and taken the next commit: each keeps two);
 * - set the aggregation up anew on the new communicator and load into it the aggregation's
 *   state of that commit (gvqTrainSave at the commit: every compressor's basis, residual and
 *   counters; a survivor's own residual stays its own), or, when any survivor cannot, rebuild
 *   the compressors on every survivor (their error feedback and bases start over);
 * - scale the learning rate by the ranks left: the per-rank batch stays, the global shrinks;
 * - run the lost steps again from the commit's weights and momentum. */

static int elastic_alloc(run_t *r) {
    r->lr_scale = 1.0;
    r->nranks0 = r->nranks;
    r->first_rank = r->o->join_hex != NULL ? r->o->join_first : r->rank;
    if (r->o->elastic <= 0) return 0;
    for (int k = 0; k < 2; k++) {
        r->commit[k].step = -1;
        r->commit[k].params = malloc(sizeof(float) * r->net.nparams);
        r->commit[k].velocity = malloc(sizeof(float) * r->net.nparams);
        if (r->commit[k].params == NULL || r->commit[k].velocity == NULL) return -1;
    }
    return 0;
}

static void elastic_free(run_t *r) {
    for (int k = 0; k < 2; k++) {
        free(r->commit[k].params);
        free(r->commit[k].velocity);
        free(r->commit[k].agg);
    }
}

/* The aggregation's state into commit k (none where it cannot be saved: zero-code mode, or an
 * error; the compressors are then rebuilt after a fault). */
static void commit_agg(run_t *r, int k) {
    gvqTrainer_t t = r->agg.trainer;
    size_t need = 0;
    r->commit[k].agg_bytes = 0;
    if (t == NULL || gvqTrainSave(t, NULL, &need) != gvqSuccess) return;
    if (need > r->commit[k].agg_cap) {
        char *p = realloc(r->commit[k].agg, need);
        if (p == NULL) return;
        r->commit[k].agg = p, r->commit[k].agg_cap = need;
    }
    if (gvqTrainSave(t, r->commit[k].agg, &need) == gvqSuccess) r->commit[k].agg_bytes = need;
}

static void commit_to_disk(run_t *r, int k);

static void elastic_commit(run_t *r, long step) {
    int k = r->commit[r->latest].step < 0 ? r->latest : !r->latest;
    r->commit[k].step = step;
    r->commit[k].pos = r->pos;
    r->commit[k].epoch = r->epoch;
    memcpy(r->commit[k].params, r->net.params, sizeof(float) * r->net.nparams);
    memcpy(r->commit[k].velocity, r->velocity, sizeof(float) * r->net.nparams);
    commit_agg(r, k);
    r->latest = k;
    if (r->o->commit_dir != NULL) commit_to_disk(r, k);
}

/* --die R:S: the process first ranked R leaves at step S as a crash would (no destroy, no
 * goodbye), with status 0 so that a launcher does not stop the others. */
static void elastic_maybe_die(const run_t *r, long step) {
    for (int i = 0; i < r->o->ndie; i++)
        if (r->o->die_rank[i] == r->first_rank && r->o->die_step[i] == step) {
            fprintf(stderr, "gvq-train: rank %d (first rank %d) leaves at step %ld (--die)\n",
                    r->rank, r->first_rank, step);
            fflush(NULL);
            _Exit(0);
        }
}

/* The aggregation set up anew on r->gcomm (fresh compressors), the gradient recording hooked
 * in; gvqSuccess or why not. */
static gvqResult_t agg_renew(run_t *r) {
    gvqResult_t res = gvqSuccess;
    if (agg_setup(&r->agg, r->o, &r->net, r->gcomm, &res) != 0) return res;
    r->agg.before_ready = record_grad;
    r->agg.before_ready_arg = &r->dump_hook;
    return gvqSuccess;
}

/* On a new communicator (r->gcomm, r->nranks set) from step on: the per-rank batch stays, so
 * the global batch and the learning rate scale with the ranks; the aggregation is set up anew
 * (its compressors' counts and the window's ratio start at 0). */
static gvqResult_t elastic_reaggregate(run_t *r, long step) {
    r->batch = r->local * r->nranks;
    r->lr_scale = (double)r->nranks / (double)r->nranks0;
    gvqResult_t res = agg_renew(r);
    if (res != gvqSuccess) return res;
    r->agg_since = step;
    r->prev_raw = r->prev_wire = 0;
    return gvqSuccess;
}

/* A rank that cannot go on (left out of the shrink, or its last commit gone) leaves the run. */
static void elastic_leave(const run_t *r, const char *what, gvqResult_t res) {
    fprintf(stderr, "gvq-train: rank %d (first rank %d) leaves the run: %s: %s\n", r->rank,
            r->first_rank, what, gvqGetErrorString(res));
    fflush(NULL);
    exit(3);
}

/* After a failed call: shrink, agree on the commit, set up anew; returns the step to go on
 * from. */
static long elastic_recover(run_t *r, long failed_step) {
    const double t_fail = now_s();
    agg_free(&r->agg);
    const double t_freed = now_s();
    gvqComm_t nc = NULL;
    gvqResult_t res = gvqCommShrink(r->gcomm, NULL, 0, &nc, NULL, GVQ_SHRINK_ABORT);
    if (res != gvqSuccess) elastic_leave(r, "gvqCommShrink", res);
    const double t_shrunk = now_s();
    (void)gvqCommDestroy(r->gcomm);
    r->gcomm = nc;
    const int before = r->nranks;
    if ((res = gvqCommUserRank(nc, &r->rank)) != gvqSuccess ||
        (res = gvqCommCount(nc, &r->nranks)) != gvqSuccess)
        elastic_leave(r, "the new communicator", res);
    int64_t back = r->commit[r->latest].step;
    if ((res = gvqAllReduce(&back, &back, 1, gvqInt64, gvqMin, nc, NULL)) != gvqSuccess)
        elastic_leave(r, "agreeing on the commit", res);
    if (back < 0) /* a survivor has no commit at all: nothing to roll back to */
        elastic_leave(r, "no commit to roll back to", gvqInternalError);
    int k = r->commit[r->latest].step == back ? r->latest : !r->latest;
    if (r->commit[k].step != back)
        elastic_leave(r, "no commit of that step here", gvqInternalError);
    memcpy(r->net.params, r->commit[k].params, sizeof(float) * r->net.nparams);
    memcpy(r->velocity, r->commit[k].velocity, sizeof(float) * r->net.nparams);
    r->pos = r->commit[k].pos;
    r->epoch = r->commit[k].epoch;
    if (r->epoch > 0)
        train_shuffle(r->perm, r->train.n, r->o->seed * 1000003ull + (uint64_t)r->epoch);
    r->commit[!k].step = -1; /* the other may be a step no other survivor reached */
    r->latest = k;
    if ((res = elastic_reaggregate(r, back)) != gvqSuccess) elastic_leave(r, "agg_setup", res);
    /* the commit's compressors on every survivor, or rebuilt on every survivor */
    int32_t carried =
        r->agg.trainer != NULL && r->commit[k].agg_bytes > 0 &&
        gvqTrainLoad(r->agg.trainer, r->commit[k].agg, r->commit[k].agg_bytes) == gvqSuccess;
    if ((res = gvqAllReduce(&carried, &carried, 1, gvqInt32, gvqMin, nc, NULL)) != gvqSuccess)
        elastic_leave(r, "agreeing on the compressors", res);
    if (!carried && r->agg.trainer != NULL) { /* some loaded, some not: all anew */
        agg_free(&r->agg);
        if ((res = elastic_reaggregate(r, back)) != gvqSuccess) elastic_leave(r, "agg_setup", res);
    }
    const long lost = failed_step - back;
    r->faults++;
    r->steps_lost += lost;
    r->win_loss = r->win_compute = r->win_comm = 0.0;
    r->win_correct = r->win_seen = r->win_steps = 0;
    r->recovered_at = now_s();
    r->after_fault = 1;
    r->train_s += r->recovered_at - r->win_start; /* the window lost and the recovery count */
    r->win_start = r->recovered_at;
    if (r->rank == 0) {
        progress_clear(&r->progress);
        fprintf(r->out,
                "# fault at step %ld: %d -> %d ranks; detected %.3f s into the step, teardown "
                "%.3f s, shrink %.3f s, reload %.3f s; back to step %ld (%ld steps lost), lr x "
                "%.3f, compressors %s\n",
                failed_step + 1, before, r->nranks, t_fail - r->step_start, t_freed - t_fail,
                t_shrunk - t_freed, r->recovered_at - t_shrunk, back, lost, r->lr_scale,
                carried ? "carried from the commit" : "rebuilt");
        fflush(r->out);
    }
    return back;
}

/* ---- replacements (--replace) ----
 * At the first commit after a fault, rank 0 starts one process per rank lost (this program with
 * this run's options and --join: the unique id of the grown set, its rank and size), every rank
 * grows into a communicator of the first job's size (gvqCommGrow; the members keep their ranks),
 * and rank 0 hands the commit (step, epoch's place, weights, momentum) over to the newcomers; the
 * aggregation is set up anew on the grown communicator and the learning rate scales back. */

typedef struct {
    int64_t step, pos;
    int32_t epoch, pad;
} handoff_t;

extern char **environ;

static pid_t spawn_replacement(const run_t *r, const gvqUniqueId *id, int rank, int size,
                               int first) {
    char hex[2 * sizeof *id + 1], rs[16], ns[16], fs[16];
    for (size_t i = 0; i < sizeof *id; i++)
        snprintf(hex + 2 * i, 3, "%02x", ((const unsigned char *)id)[i]);
    snprintf(rs, sizeof rs, "%d", rank);
    snprintf(ns, sizeof ns, "%d", size);
    snprintf(fs, sizeof fs, "%d", first);
    char self[4096]; /* this program's path (spawning /proc/self/exe would name it "exe") */
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return -1;
    self[len] = '\0';
    /* GVQ_TRAIN_SPAWN_WITH: a program that starts the replacement where it should run (a
     * scheduler's hook; perf/chaos.sh's puts it on an emulated host without a rank), given the
     * replacement's command line */
    const char *with = getenv("GVQ_TRAIN_SPAWN_WITH");
    char **args = calloc((size_t)r->o->argc + 10, sizeof *args);
    if (args == NULL) return -1;
    int k = 0;
    if (with != NULL && with[0] != '\0') args[k++] = (char *)with;
    args[k++] = self;
    for (int i = 1; i < r->o->argc; i++) /* --replace too: it takes part in the commits' */
        args[k++] = r->o->argv[i];       /* exchange from then on */
    char *more[] = {"--join", hex, "--join-rank", rs, "--join-size", ns, "--join-first", fs};
    for (int i = 0; i < 8; i++)
        args[k++] = more[i];
    pid_t pid = -1;
    if (posix_spawnp(&pid, args[0], NULL, NULL, args, environ) != 0) pid = -1;
    free(args);
    return pid;
}

static void handoff(run_t *r, handoff_t *h) {
    TRAIN_GVQ(gvqBroadcast(h, h, sizeof *h, gvqUint8, 0, r->gcomm, NULL), r->gcomm);
    TRAIN_GVQ(
        gvqBroadcast(r->net.params, r->net.params, r->net.nparams, gvqFloat32, 0, r->gcomm, NULL),
        r->gcomm);
    TRAIN_GVQ(gvqBroadcast(r->velocity, r->velocity, r->net.nparams, gvqFloat32, 0, r->gcomm, NULL),
              r->gcomm);
}

/* Rank 0's state (h on rank 0; the weights and momentum) to every rank, and the run set to go
 * on from it: a replacement's join, a resume. */
static void take_state(run_t *r, handoff_t *h) {
    handoff(r, h);
    r->start_step = r->agg_since = (long)h->step;
    r->pos = (long)h->pos;
    r->epoch = h->epoch;
    if (r->epoch > 0)
        train_shuffle(r->perm, r->train.n, r->o->seed * 1000003ull + (uint64_t)r->epoch);
}

/* ---- commits on disk (--commit-dir, --resume; commit.h) ----
 * Rank 0 writes each commit (every rank holds the same state: the weight checks say so) and
 * every rank its compressors' state (its residual is its own); a resumed run reads the commit on
 * rank 0 and broadcasts it, as a replacement's handoff does, and each rank loads its own
 * compressors' state, or every rank rebuilds them when one cannot. */

static uint64_t model_sig(const net_t *net) {
    /* every layer's sizes (a model of up to 64 layers hashes as it always did) */
    size_t stack[2 * 64] = {0}, *sizes = stack;
    if (net->nlayers > 64 && (sizes = malloc(sizeof(size_t) * 2 * (size_t)net->nlayers)) == NULL) {
        fprintf(stderr, "gvq-train: out of memory for the model's signature\n");
        exit(1);
    }
    int n = 0;
    for (int i = 0; i < net->nlayers; i++) {
        sizes[n++] = net->layers[i].nw;
        sizes[n++] = net->layers[i].nb;
    }
    uint64_t sig = commit_model_sig(net->nparams, n, sizes);
    if (sizes != stack) free(sizes);
    return sig;
}

/* commit k's compressor state into DIR/gvq-train.agg.RANK (none to write: 0) */
static int agg_to_disk(const run_t *r, int k, char *err, size_t cap) {
    if (r->commit[k].agg_bytes == 0) return 0;
    commit_agg_hdr_t h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, COMMIT_AGG_MAGIC, sizeof h.magic);
    h.version = 1;
    h.header_bytes = sizeof h;
    h.model_sig = model_sig(&r->net);
    h.seed = r->o->seed;
    h.step = r->commit[k].step;
    h.rank = r->rank;
    h.nranks = r->nranks;
    h.bytes = r->commit[k].agg_bytes;
    return commit_agg_write(r->o->commit_dir, &h, r->commit[k].agg, err, cap);
}

static void commit_to_disk(run_t *r, int k) {
    char err[4400];
    const double t0 = now_s();
    int bad = agg_to_disk(r, k, err, sizeof err);
    if (r->rank == 0 && bad == 0) {
        commit_hdr_t h;
        memset(&h, 0, sizeof h);
        memcpy(h.magic, COMMIT_MAGIC, sizeof h.magic);
        h.version = 1;
        h.header_bytes = sizeof h;
        h.nparams = r->net.nparams;
        h.model_sig = model_sig(&r->net);
        h.seed = r->o->seed;
        h.step = r->commit[k].step;
        h.pos = r->commit[k].pos;
        h.epoch = r->commit[k].epoch;
        h.iters = r->iters;
        h.nranks = r->nranks;
        h.compressors =
            r->commit[k].agg_bytes > 0 ? COMMIT_COMPRESSORS_PER_RANK : COMMIT_COMPRESSORS_REBUILT;
        bad = commit_write(r->o->commit_dir, &h, r->commit[k].params, r->commit[k].velocity, err,
                           sizeof err);
    }
    if (bad != 0) {
        progress_clear(&r->progress);
        fprintf(stderr,
                "gvq-train: rank %d: the commit of step %ld is not on disk: %s (it is in "
                "memory; the run goes on)\n",
                r->rank, r->commit[k].step, err);
        r->disk_failures++;
    } else {
        r->disk_commits++;
        r->disk_s += now_s() - t0;
    }
}

/* --resume: each rank's compressors' state of the commit's step, loaded on every rank or on none
 * (then rebuilt on every rank that loaded). commit_nranks and per_rank: the commit's header, the
 * same on every rank (broadcast). A file is taken only from a rank below the commit's count and
 * written at that count: one left by a rank of a larger job (a run that shrank after a fault and
 * committed the same step again) would give its residual twice. gvqTrainLoad is all or nothing,
 * so a rank whose load failed holds its fresh compressors; gvq-train has no sparse variables, for
 * which gvqTrainLoad would be collective. 1 when carried. */
static int resume_agg(run_t *r, int32_t commit_nranks, int per_rank) {
    char err[4400] = "";
    commit_agg_hdr_t h;
    void *state = NULL;
    int32_t carried = 0;
    if (r->agg.trainer != NULL && per_rank) {
        int ok = r->rank < commit_nranks;
        if (!ok)
            snprintf(err, sizeof err, "the commit was made by %d ranks, this is rank %d",
                     commit_nranks, r->rank);
        ok = ok && commit_agg_read(r->o->resume_dir, r->rank, r->start_step, model_sig(&r->net),
                                   r->o->seed, &h, &state, err, sizeof err) == 0;
        if (ok && h.nranks != commit_nranks) {
            snprintf(err, sizeof err, "%s/%s.%d: written by a job of %d ranks, the commit by %d",
                     r->o->resume_dir, COMMIT_AGG_FILE, r->rank, (int)h.nranks, commit_nranks);
            ok = 0;
        }
        if (ok && gvqTrainLoad(r->agg.trainer, state, (size_t)h.bytes) != gvqSuccess) {
            snprintf(err, sizeof err, "%s/%s.%d: not a state of this run's variables and config",
                     r->o->resume_dir, COMMIT_AGG_FILE, r->rank);
            ok = 0;
        }
        carried = ok;
        free(state);
    }
    int32_t agreed[2] = {carried, -carried}; /* min: all loaded; -min of the negation: any */
    TRAIN_GVQ(gvqAllReduce(agreed, agreed, 2, gvqInt32, gvqMin, r->gcomm, NULL), r->gcomm);
    const int all = agreed[0], any = -agreed[1];
    if (per_rank && !carried && r->agg.trainer != NULL) /* a cause worth a line, even quiet */
        fprintf(stderr, "gvq-train: rank %d: --resume: the compressors are rebuilt: %s\n", r->rank,
                err[0] != '\0' ? err : "no state");
    if (any && !all) { /* some loaded, some not: all anew */
        agg_free(&r->agg);
        TRAIN_GVQ(agg_renew(r), r->gcomm);
    }
    return all;
}

/* --resume DIR: rank 0 reads the commit, every rank takes it (or every rank fails: -1). */
static int run_resume(run_t *r) {
    commit_hdr_t h;
    memset(&h, 0, sizeof h);
    char err[4400] = "";
    int32_t bad = 0;
    if (r->rank == 0) {
        bad = commit_read(r->o->resume_dir, &h, r->net.params, r->velocity, r->net.nparams,
                          model_sig(&r->net), r->o->seed, err, sizeof err) != 0;
        if (!bad && (h.pos > (int64_t)r->train.n || h.epoch > 1 << 30 || h.iters != r->iters)) {
            snprintf(err, sizeof err,
                     "%s/%s: made for %lld steps of %s images (this run: %ld "
                     "steps, %d images): give the same --epochs or --iters and --train-subset",
                     r->o->resume_dir, COMMIT_FILE, (long long)h.iters,
                     h.pos > (int64_t)r->train.n ? "more" : "as many", r->iters, r->train.n);
            bad = 1;
        }
        if (bad) fprintf(stderr, "gvq-train: --resume: %s\n", err);
    }
    int32_t said[3] = {bad, h.nranks, h.compressors}; /* rank 0's verdict and header */
    TRAIN_GVQ(gvqBroadcast(said, said, 3, gvqInt32, 0, r->gcomm, NULL), r->gcomm);
    if (said[0]) return -1;
    handoff_t ho = {h.step, h.pos, (int32_t)h.epoch, 0};
    take_state(r, &ho);
    r->resumed = 1;
    const int carried = resume_agg(r, said[1], said[2] == COMMIT_COMPRESSORS_PER_RANK);
    if (r->rank == 0 && !r->o->quiet)
        fprintf(r->out,
                "# resumed from %s/%s: step %ld (epoch %d), written by %d ranks; the "
                "compressors are %s\n",
                r->o->resume_dir, COMMIT_FILE, r->start_step, r->epoch, h.nranks,
                carried ? "carried from the commit (each rank's own state)"
                : h.compressors == COMMIT_COMPRESSORS_PER_RANK
                    ? "rebuilt (some rank could not load its state)"
                    : "rebuilt (the commit holds none)");
    return 0;
}

/* A replacement, at the end of run_load: grow into the survivors' communicator, take the state. */
static void elastic_join(run_t *r) {
    gvqUniqueId id;
    const char *hex = r->o->join_hex;
    int ok = strlen(hex) == 2 * sizeof id;
    for (size_t i = 0; ok && i < sizeof id; i++) {
        unsigned b = 0;
        ok = sscanf(hex + 2 * i, "%2x", &b) == 1;
        ((unsigned char *)&id)[i] = (unsigned char)b;
    }
    if (!ok) {
        fprintf(stderr, "gvq-train: --join: not a unique id\n");
        exit(2);
    }
    TRAIN_GVQ(gvqCommGrow(NULL, r->o->join_size, &id, r->o->join_rank, &r->gcomm, NULL), NULL);
    handoff_t h;
    take_state(r, &h);
    r->joined = 1;
    fprintf(stderr, "gvq-train: replacement %d joined as rank %d of %d at step %ld\n",
            r->o->join_first, r->rank, r->nranks, r->start_step);
}

/* After a grow, on the grown communicator's fresh aggregation: each member loads its own
 * compressors' state of this step's commit (made just before the grow), each newcomer rank 0's
 * without its residual (gvqTrainLoadShared: the basis, phase and counters every rank holds
 * alike); unless every rank loaded, every rank rebuilds, as at a shrink. 1: carried. */
static int grow_agg(run_t *r, int newcomer) {
    gvqTrainer_t t = r->agg.trainer;
    int64_t bytes = 0;
    if (r->rank == 0 && t != NULL) bytes = (int64_t)r->commit[r->latest].agg_bytes;
    TRAIN_GVQ(gvqBroadcast(&bytes, &bytes, 1, gvqInt64, 0, r->gcomm, NULL), r->gcomm);
    if (bytes <= 0) return 0; /* no compressors, or none committed: nothing to carry */
    char *buf = r->rank == 0 ? r->commit[r->latest].agg : malloc((size_t)bytes);
    int32_t room = buf != NULL; /* agreed first: a broadcast needs every rank's buffer */
    TRAIN_GVQ(gvqAllReduce(&room, &room, 1, gvqInt32, gvqMin, r->gcomm, NULL), r->gcomm);
    if (!room) { /* nothing loaded yet: the fresh compressors on every rank */
        if (r->rank != 0) free(buf);
        if (r->rank == 0)
            fprintf(stderr, "gvq-train: a rank had no memory for rank 0's compressors\n");
        return 0;
    }
    int32_t carried = t != NULL;
    TRAIN_GVQ(gvqBroadcast(buf, buf, (size_t)bytes, gvqUint8, 0, r->gcomm, NULL), r->gcomm);
    if (t != NULL) {
        if (newcomer)
            carried = gvqTrainLoadShared(t, buf, (size_t)bytes) == gvqSuccess;
        else /* a member: its own commit of this step, its residual with it */
            carried = r->commit[r->latest].agg_bytes > 0 &&
                      gvqTrainLoad(t, r->commit[r->latest].agg, r->commit[r->latest].agg_bytes) ==
                          gvqSuccess;
    }
    if (r->rank != 0) free(buf);
    TRAIN_GVQ(gvqAllReduce(&carried, &carried, 1, gvqInt32, gvqMin, r->gcomm, NULL), r->gcomm);
    if (!carried && t != NULL) { /* some loaded, some not: all anew */
        agg_free(&r->agg);
        TRAIN_GVQ(agg_renew(r), r->gcomm);
    }
    return carried;
}

static void elastic_maybe_grow(run_t *r, long step) {
    struct {
        int32_t grow, size;
        gvqUniqueId id;
    } j;
    memset(&j, 0, sizeof j);
    const double t0 = now_s();
    if (r->rank == 0 && r->nranks < r->nranks0 &&
        r->spawned + (r->nranks0 - r->nranks) <= (int)(sizeof r->kids / sizeof r->kids[0])) {
        j.grow = 1;
        j.size = r->nranks0;
        TRAIN_GVQ(gvqGetUniqueId(&j.id), r->gcomm);
        int started = r->spawned;
        for (int k = r->nranks; k < r->nranks0; k++, r->spawned++)
            r->kids[r->spawned] =
                spawn_replacement(r, &j.id, k, r->nranks0, r->nranks0 + r->spawned);
        for (int k = started; k < r->spawned; k++)
            if (r->kids[k] <= 0) j.grow = 0;
        if (!j.grow) { /* no grow without every replacement: stop those started */
            fprintf(stderr, "gvq-train: cannot start a replacement: %s; going on with %d ranks\n",
                    strerror(errno), r->nranks);
            for (int k = started; k < r->spawned; k++)
                if (r->kids[k] > 0) kill(r->kids[k], SIGKILL);
        }
    }
    TRAIN_GVQ(gvqBroadcast(&j, &j, sizeof j, gvqUint8, 0, r->gcomm, NULL), r->gcomm);
    if (!j.grow) return;
    const int before = r->nranks;
    agg_free(&r->agg);
    gvqComm_t nc = NULL;
    TRAIN_GVQ(gvqCommGrow(r->gcomm, j.size, &j.id, -1, &nc, NULL), r->gcomm);
    (void)gvqCommDestroy(r->gcomm);
    r->gcomm = nc;
    TRAIN_GVQ(gvqCommCount(nc, &r->nranks), nc);
    handoff_t h = {step, r->pos, r->epoch, 0};
    handoff(r, &h);
    TRAIN_GVQ(elastic_reaggregate(r, step), nc);
    const int carried = grow_agg(r, 0);
    /* this step's commit holds the compressors on the grown communicator, as the newcomers'
     * first commit does: a rollback to it carries the same state on every rank */
    commit_agg(r, r->latest);
    if (r->rank == 0) {
        progress_clear(&r->progress);
        fprintf(r->out,
                "# join at step %ld: %d -> %d ranks in %.3f s (start, grow, state handed "
                "over), lr x %.3f, compressors %s\n",
                step, before, r->nranks, now_s() - t0, r->lr_scale,
                carried ? "carried (a newcomer's residual zero)" : "rebuilt");
        fflush(r->out);
    }
}

/* Rank 0 at the end: waits for the replacements it started and says how each ended. Those still
 * in the run took part in the last reductions (their failure is every rank's); one that left
 * (killed, cut off) was a fault the run rode through, not the job's failure. */
static void elastic_reap(run_t *r) {
    for (int k = 0; k < r->spawned; k++) {
        int st = 0;
        if (r->kids[k] <= 0 || waitpid(r->kids[k], &st, 0) != r->kids[k]) continue;
        if (WIFSIGNALED(st))
            fprintf(stderr, "gvq-train: replacement %d ended by signal %d\n", k, WTERMSIG(st));
        else if (WEXITSTATUS(st) != 0)
            fprintf(stderr, "gvq-train: replacement %d exited with %d\n", k, WEXITSTATUS(st));
    }
}

/* The loop over the steps; returns the number of steps run. */
static long run_loop(run_t *r) {
    const train_opts_t *o = r->o;
    /* the sums, counts and times not set here start at 0 (train_run's memset) */
    r->win_start = now_s();
    r->progress = (progress_t){r->rank == 0 && o->progress, 0, r->win_start, 0.0};
    r->test_acc = -1.0;
    if (o->join_hex == NULL && !r->resumed) r->pos = (long)r->train.n; /* a shuffle at step 0 */
    r->next = (deferred_t){&r->agg, {&r->net, r->velocity, 0, 0, 0}, gvqSuccess, 0.0, NULL, NULL};
    if (o->overlap_forward) {
        r->next.wait_start = calloc(2 * (size_t)r->net.nlayers, sizeof(double));
        if (r->next.wait_start == NULL) TRAIN_GVQ(gvqSystemError, r->gcomm);
        r->next.wait_end = r->next.wait_start + r->net.nlayers;
        if (!r->dumping) /* dumps read whole blocks */
            agg_split_blocks(&r->agg, update_range, &r->next);
    }
    jmp_buf fault;
    volatile long step = r->start_step;
    if (o->elastic > 0) {
        if (setjmp(fault) != 0) {
            train_fault = NULL; /* a failure while recovering ends this rank */
            step = elastic_recover(r, step);
        }
        train_fault = &fault;
    }
    for (; step < r->iters; step++) {
        int last, printing;
        /* a commit every K steps, and one where the run starts: a run resumed (--resume) at a
         * step K does not divide must have a state to roll back to before its first multiple */
        if (o->elastic > 0 && (step % o->elastic == 0 || step == r->start_step)) {
            elastic_commit(r, step);
            /* a replacement's first commit is the one its members grew at */
            if (o->replace && !r->joined && step % o->elastic == 0) elastic_maybe_grow(r, step);
        }
        elastic_maybe_die(r, step);
        r->joined = 0; /* a replacement skips only the grow it joined through */
        r->step_start = now_s();
        run_step(r, step, &last, &printing);
        if (r->after_fault && r->rank == 0) {
            fprintf(r->out, "# first step after the fault done %.3f s after the reload\n",
                    now_s() - r->recovered_at);
            fflush(r->out);
        }
        r->after_fault = 0;
        if (!printing) continue;
        if (end_window(r, step, last)) {
            step++;
            break;
        }
    }
    train_fault = NULL;
    return step;
}

/* The run's totals into r->res after step steps: the compressors' counts, the wire ratios. */
static void run_totals(run_t *r, long step) {
    const int nranks = r->nranks, nconv = r->net.nconv;
    gvqCompressor_t *comp = r->agg.conv_comp;
    train_result_t *res = r->res;
    const size_t nrest = r->net.nparams - r->net.conv_params;
    const double raw_rest_per_call =
        nranks > 1 ? 2.0 * (nranks - 1) * (double)nrest * 4.0 / nranks : 0.0;
    const double raw_conv_per_call =
        nranks > 1 ? 2.0 * (nranks - 1) * (double)r->net.conv_params * 4.0 / nranks : 0.0;
    progress_clear(&r->progress);
    res->iters = step;
    res->test_acc = r->test_acc;
    res->train_s = r->train_s;
    res->compute_s = r->tot_compute;
    res->comm_s = r->tot_comm;
    unsigned long long raw = 0, wire = 0;
    for (int i = 0; i < nconv && comp[i] != NULL; i++) {
        gvqCompressorStats_t st;
        TRAIN_GVQ(gvqCompressorGetStats(comp[i], &st), r->gcomm);
        raw += st.rawBytes;
        wire += st.wireBytes;
        res->fits += st.fits;
        res->early_exits += st.earlyExits;
    }
    if (r->o->commit_dir != NULL) { /* every rank's files: the summary counts them all */
        int64_t failed = r->disk_failures;
        TRAIN_REDUCE(&failed, 1, gvqInt64, gvqSum, r->gcomm);
        r->disk_failures = (long)failed;
    }
    const double counted = (double)(step - r->agg_since); /* the aggregation's counts' steps */
    double conv_raw = raw_conv_per_call * counted, conv_wire = 0.0;
    double rest_wire = 0.0; /* rest bytes on the wire (plain: the raw amount) */
    for (int v = 0; v < r->agg.nvars; v++)
        *(r->agg.vars[v].conv >= 0 ? &conv_wire : &rest_wire) += (double)agg_wire_bytes(&r->agg, v);
    res->conv_ratio = conv_wire > 0 ? conv_raw / conv_wire : 1.0;
    double all_raw = conv_raw + raw_rest_per_call * counted;
    res->total_ratio = conv_wire + rest_wire > 0 ? all_raw / (conv_wire + rest_wire) : 1.0;
}

/* Rank 0's closing lines: the totals, the wire, each conv compressor's state. */
static void print_summary(const run_t *r) {
    const train_opts_t *o = r->o;
    const train_result_t *res = r->res;
    gvqCompressor_t *comp = r->agg.conv_comp;
    FILE *out = r->out;
    const double train_s = r->train_s;
    const long ran = res->iters - r->start_step; /* a resumed run began at start_step */
    char from[64] = "";
    if (r->resumed) snprintf(from, sizeof from, " (resumed at step %ld)", r->start_step);
    fprintf(out,
            "# done: %ld steps%s in %.1f s of training (%.1f ms/step, %.0f img/s), test accuracy "
            "%.2f%%, compute %.1f s comm %.1f s per rank (comm %.0f%%)\n",
            ran, from, train_s, 1e3 * train_s / (double)(ran > 0 ? ran : 1),
            (double)r->batch * (double)ran / train_s, r->test_acc, res->compute_s, res->comm_s,
            100.0 * res->comm_s / (res->compute_s + res->comm_s));
    if (!o->zero_code)
        fprintf(out,
                "# wire: conv layers %.2fx smaller than a plain fp32 ring over the run, "
                "the whole gradient %.2fx; weight checksums compared %ld times, %ld "
                "mismatches\n",
                res->conv_ratio, res->total_ratio, res->sync_checks, res->sync_mismatches);
    else
        fprintf(out, "# weight checksums compared %ld times, %ld mismatches\n", res->sync_checks,
                res->sync_mismatches);
    for (int i = 0; i < r->net.nconv && comp[i] != NULL; i++) {
        gvqCompressorStats_t st;
        TRAIN_GVQ(gvqCompressorGetStats(comp[i], &st), r->gcomm);
        fprintf(out,
                "# conv%d %s: phase %c, L %d, d %d, fits %lld (refused %lld), early "
                "exits %lld, compressed-phase ratio %.2f, kept energy %.4f, last local "
                "loss %.4f%s%s\n",
                i + 1, codec_name(o->codec), phase_letter(st.phase), st.sliceSize, st.dims, st.fits,
                st.fitsRefused, st.earlyExits, st.ratio, st.keptEnergy, st.lastLoss,
                st.reason[0] ? "; " : "", st.reason);
    }
    if (o->elastic > 0)
        fprintf(out,
                "# elastic: %d fault(s) ridden through, %ld step(s) lost and run again, %d of %d "
                "ranks at the end (the wire's ratios: since the last fault or join)\n",
                r->faults, r->steps_lost, r->nranks, r->nranks0);
    if (o->commit_dir != NULL)
        fprintf(out,
                "# commits on disk: %ld in %s/%s (%.3f s writing, %.1f ms each), %ld writes "
                "failed on any rank; "
                "%s\n",
                r->disk_commits, o->commit_dir, COMMIT_FILE, r->disk_s,
                r->disk_commits > 0 ? 1e3 * r->disk_s / (double)r->disk_commits : 0.0,
                r->disk_failures,
                r->agg.trainer != NULL ? "each rank's compressors in " COMMIT_AGG_FILE ".RANK"
                                       : "no compressor state (zero-code mode)");
    fprintf(out, "# final weights: FNV-1a %016llx\n",
            (unsigned long long)hash_floats(r->net.params, r->net.nparams));
    if (o->stop_at > 0.0)
        fprintf(out, "# time to %.2f%% test accuracy: %s\n", o->stop_at,
                res->time_to_stop >= 0.0 ? "reached" : "not reached");
    fflush(out);
}

/* Frees the run; 0, or -1 when some rank failed. */
static int run_free(run_t *r) {
    elastic_free(r);
    agg_free(&r->agg);
    r->anybad = r->bad;
    TRAIN_REDUCE(&r->anybad, 1, gvqInt32, gvqMax, r->gcomm);
    TRAIN_GVQ(gvqCommDestroy(r->gcomm), NULL);
    elastic_reap(r); /* after the last collective: they take part in it */
    free(r->phases);
    free(r->velocity);
    free(r->next.wait_start);
    free(r->images);
    free(r->labels);
    free(r->perm);
    free(r->idx);
    net_free(&r->net);
    mnist_free(&r->train);
    mnist_free(&r->test);
    return r->anybad ? -1 : 0;
}

int train_run(const train_opts_t *o, MPI_Comm comm, train_result_t *res) {
    run_t run;
    memset(&run, 0, sizeof run);
    run_t *r = &run;
    r->o = o;
    r->comm = comm;
    r->res = res;
    if (run_load(r) != 0) return -1;
    run_connect(r);
    if (elastic_alloc(r) != 0) {
        fprintf(stderr, "gvq-train: rank %d: out of memory\n", r->rank);
        train_fail();
    }
    if (run_open_dump(r) != 0) return run_free(r);
    if (o->resume_dir != NULL && o->join_hex == NULL && run_resume(r) != 0) {
        r->bad = 1;
        return run_free(r);
    }

    if (r->rank == 0 && !o->quiet) print_header(r);

    if (r->rank == 0 && o->log_path != NULL) {
        r->csv = fopen(o->log_path, "w");
        if (r->csv == NULL)
            fprintf(stderr, "gvq-train: cannot create the log '%s': %s (going on without it)\n",
                    o->log_path, strerror(errno));
        else
            fprintf(r->csv,
                    "iter,epoch,time_s,loss,train_acc,test_acc,img_per_s,compute_s,"
                    "comm_s,conv_ratio,phase\n"); /* test_acc -1: not evaluated at this row */
    }

    long step = run_loop(r);

    run_totals(r, step);
    if (r->rank == 0 && !o->quiet) print_summary(r);
    if (r->csv != NULL) fclose(r->csv);
    if (r->dumping && dump_close(&r->dump, o->dump_path) != 0) r->bad = 1;
    if (r->dumping && r->rank == 0 && !o->quiet && !r->bad)
        fprintf(r->out, "# recorded %llu iterations of conv%d's gradient (%llu floats) in %s\n",
                (unsigned long long)r->dump.iters, o->dump_layer, (unsigned long long)r->dump.count,
                o->dump_path);
    return run_free(r);
}
