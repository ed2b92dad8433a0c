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
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gvq.h"
#include "gvq_mpi.h"
#include "aggregate.h"
#include "mnist.h"

/* A failed gvq or MPI call ends the whole job: a rank that stopped calling collectives would
 * leave the others waiting for it until gvq's timeout. */
#define TRAIN_GVQ(call, comm)                                                                    \
    do {                                                                                         \
        gvqResult_t res_ = (call);                                                               \
        if (res_ != gvqSuccess) {                                                                \
            fprintf(stderr, "gvq-train: %s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call, \
                    gvqGetErrorString(res_), gvqGetLastError(comm));                             \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                        \
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
            MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
        }                                                                                          \
    } while (0)

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

/* Test accuracy in percent: each rank evaluates its share of the test set. */
double train_evaluate(net_t *net, const mnist_set_t *test, int rank, int nranks, MPI_Comm comm,
                      float *images, uint8_t *labels, int *idx) {
    int lo = (int)((long)test->n * rank / nranks), hi = (int)((long)test->n * (rank + 1) / nranks);
    long correct = 0;
    for (int i = lo; i < hi; i += net->capacity) {
        int n = hi - i < net->capacity ? hi - i : net->capacity;
        for (int j = 0; j < n; j++)
            idx[j] = i + j;
        mnist_batch(test, idx, n, images, labels);
        correct += net_count_correct(net, images, labels, n);
    }
    long total = 0;
    TRAIN_MPI(MPI_Allreduce(&correct, &total, 1, MPI_LONG, MPI_SUM, comm));
    return 100.0 * (double)total / (double)test->n;
}

/* 1 when every rank holds the same weights (compares the min and max of their hashes). */
static int weights_agree(const net_t *net, MPI_Comm comm) {
    unsigned long long h = hash_floats(net->params, net->nparams), lo = 0, hi = 0;
    TRAIN_MPI(MPI_Allreduce(&h, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, comm));
    TRAIN_MPI(MPI_Allreduce(&h, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm));
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

int train_run(const train_opts_t *o, MPI_Comm comm, train_result_t *res) {
    int rank = 0, nranks = 1;
    TRAIN_MPI(MPI_Comm_rank(comm, &rank));
    TRAIN_MPI(MPI_Comm_size(comm, &nranks));
    FILE *out = o->out != NULL ? o->out : stdout;
    memset(res, 0, sizeof *res);
    res->time_to_stop = -1.0;

    const int batch = o->batch > 0 ? o->batch : 32 * nranks;
    if (batch < nranks || batch % nranks != 0) {
        if (rank == 0)
            fprintf(stderr,
                    "gvq-train: the global batch (%d) must be a multiple of the number of "
                    "ranks (%d)\n",
                    batch, nranks);
        return -1;
    }
    const int local = batch / nranks;

    /* data: every rank loads it; one failure stops all */
    char err[4096] = "";
    mnist_set_t train = {0}, test = {0};
    int bad = mnist_load(&train, o->data_dir, "train", o->train_subset, err, sizeof err) != 0 ||
              mnist_load(&test, o->data_dir, "t10k", o->test_subset, err, sizeof err) != 0;
    int anybad = 0;
    TRAIN_MPI(MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, comm));
    if (anybad) {
        if (bad) fprintf(stderr, "gvq-train: rank %d: %s\n", rank, err);
        mnist_free(&train);
        mnist_free(&test);
        return -1;
    }
    if (train.n < batch) {
        if (rank == 0)
            fprintf(stderr, "gvq-train: %d training images, fewer than one global batch (%d)\n",
                    train.n, batch);
        mnist_free(&train);
        mnist_free(&test);
        return -1;
    }
    const long steps_per_epoch = train.n / batch;
    const long iters = o->iters > 0 ? o->iters : (long)o->epochs * steps_per_epoch;

    /* model */
    net_t net;
    const int capacity = local > 100 ? local : 100; /* evaluation runs in chunks of 100 */
    if (net_create(&net, &o->arch, 1, train.rows, train.cols, capacity, o->seed, err, sizeof err) !=
        0) {
        if (rank == 0) fprintf(stderr, "gvq-train: %s\n", err);
        mnist_free(&train);
        mnist_free(&test);
        return -1;
    }
    float *velocity = calloc(net.nparams, sizeof(float));
    float *images = malloc(sizeof(float) * (size_t)capacity * train.rows * train.cols);
    uint8_t *labels = malloc((size_t)capacity);
    int *perm = malloc(sizeof(int) * (size_t)train.n);
    int *idx = malloc(sizeof(int) * (size_t)capacity);
    res->loss_hist = calloc((size_t)iters, sizeof(double));
    if (velocity == NULL || images == NULL || labels == NULL || perm == NULL || idx == NULL ||
        res->loss_hist == NULL) {
        fprintf(stderr, "gvq-train: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    /* gvq: a communicator, and the training layer with a variable per weight tensor */
    gvqComm_t gcomm;
    TRAIN_GVQ(gvqCommInitMPI(&gcomm, comm, NULL), NULL);
    const int nconv = net.nconv;
    layer_t **conv = net.conv;
    const size_t nrest = net.nparams - net.conv_params;
    char *phases = malloc(2 * (size_t)nconv + 16);
    if (phases == NULL) {
        fprintf(stderr, "gvq-train: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    agg_t agg;
    gvqResult_t agg_res;
    if (agg_setup(&agg, o, &net, gcomm, &agg_res) != 0) TRAIN_GVQ(agg_res, gcomm);
    gvqCompressor_t *comp = agg.conv_comp;

    /* gradient recording */
    dump_t dump = {0};
    int dumping = 0;
    if (o->dump_path != NULL) {
        if (o->dump_layer < 1 || o->dump_layer > nconv) {
            if (rank == 0)
                fprintf(stderr, "gvq-train: --dump-layer %d: the network has conv layers 1..%d\n",
                        o->dump_layer, nconv);
            bad = 1;
        } else if (rank == 0) {
            bad = dump_open(&dump, o->dump_path, conv[o->dump_layer - 1]->nw) != 0;
            dumping = !bad;
        }
        TRAIN_MPI(MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, comm));
        if (anybad) {
            if (dumping) fclose(dump.f);
            dumping = 0;
            goto done;
        }
    }

    dump_hook_t dump_hook = {&dump, dumping ? conv[o->dump_layer - 1] : NULL, &net, 0, 1};
    agg.before_ready = record_grad;
    agg.before_ready_arg = &dump_hook;

    if (rank == 0 && !o->quiet) {
        fprintf(out,
                "# gvq-train: %d ranks, global batch %d (%d per rank), %ld steps (%ld per "
                "epoch), lr %g%s momentum %g wd %g seed %llu\n",
                nranks, batch, local, iters, steps_per_epoch, o->lr,
                o->cosine ? " (cosine decay)" : "", o->momentum, o->weight_decay, o->seed);
        fprintf(out, "# data: %s (%d train, %d test images of %dx%d)\n", o->data_dir, train.n,
                test.n, train.rows, train.cols);
        if (o->arch.model == NET_RESNET)
            fprintf(out, "# model: resnet-%d (Fixup, %d blocks per stage), ",
                    6 * o->arch.blocks + 2, o->arch.blocks);
        else
            fprintf(out, "# model: %s, ", o->arch.model == NET_MLP ? "mlp" : "cnn");
        fprintf(out, "%zu parameters, %zu in conv weights:", net.nparams, net.conv_params);
        for (int i = 0; i < nconv; i++)
            fprintf(out, " conv%d [K=%d][D=%d][%d][%d]%s", i + 1, conv[i]->out_c, conv[i]->in_c,
                    conv[i]->ksize, conv[i]->ksize, conv[i]->stride > 1 ? "/2" : "");
        int depth = o->arch.model == NET_MLP ? o->arch.depth : o->arch.hidden > 0;
        fprintf(out, ", fc %d -> ", (int)layer_in_size(&net.layers[net.nlayers - 2 * depth - 1]));
        for (int d = 0; d < depth; d++)
            fprintf(out, "%d -> ", o->arch.hidden);
        fprintf(out, "%d\n", o->arch.classes);
        if (o->zero_code) {
            const char *e = getenv("GVQ_CODEC");
            fprintf(out,
                    "# aggregation: zero-code mode, one gvqAllReduce of %zu floats "
                    "(GVQ_CODEC=%s)\n",
                    net.nparams, e != NULL ? e : "unset");
        } else {
            fprintf(out,
                    "# aggregation: the training layer, %d variables (%s); conv weights %s, fc "
                    "weights %s, biases and scalars (%zu floats with the fc) plain",
                    agg.nvars, o->no_wait_free ? "after backprop" : "wait-free backprop",
                    codec_name(o->codec), codec_name(o->rest_codec), nrest);
            for (int i = 0; i < nconv && comp[i] != NULL; i++) {
                gvqCompressorStats_t st;
                TRAIN_GVQ(gvqCompressorGetStats(comp[i], &st), gcomm);
                fprintf(out, "%s conv%d L=%d groups=%d", i == 0 ? ";" : ",", i + 1, st.sliceSize,
                        st.groups);
            }
            fprintf(out, "\n");
        }
        fflush(out);
    }

    FILE *csv = NULL;
    if (rank == 0 && o->log_path != NULL) {
        csv = fopen(o->log_path, "w");
        if (csv == NULL)
            fprintf(stderr, "gvq-train: cannot create the log '%s': %s (going on without it)\n",
                    o->log_path, strerror(errno));
        else
            fprintf(csv, "iter,epoch,time_s,loss,train_acc,test_acc,img_per_s,compute_s,comm_s,"
                         "conv_ratio,phase\n"); /* test_acc -1: not evaluated at this row */
    }

    /* the loop */
    double win_loss = 0.0, win_compute = 0.0, win_comm = 0.0, tot_compute = 0.0, tot_comm = 0.0;
    long win_correct = 0, win_seen = 0, win_steps = 0;
    double train_s = 0.0, win_start = now_s();
    progress_t progress = {rank == 0 && o->progress, 0, win_start, 0.0};
    double test_acc = -1.0, win_train_s = 0.0;
    unsigned long long prev_raw = 0, prev_wire = 0;
    const double raw_rest_per_call =
        nranks > 1 ? 2.0 * (nranks - 1) * (double)nrest * 4.0 / nranks : 0.0;
    const double raw_conv_per_call =
        nranks > 1 ? 2.0 * (nranks - 1) * (double)net.conv_params * 4.0 / nranks : 0.0;
    double rest_wire = 0.0;   /* rest bytes on the wire (plain: the raw amount) */
    long pos = (long)train.n; /* forces a shuffle at step 0 */
    int epoch = 0;
    long step;
    /* --overlap-forward: the last step's update, waiting inside this forward pass */
    deferred_t next = {&agg, {&net, velocity, 0, 0, 0}, gvqSuccess, 0.0, NULL, NULL};
    int pending = 0;
    double prev_t0 = 0, prev_fwd = 0, prev_t1 = 0; /* the deferred step's (its timeline) */
    if (o->overlap_forward) {
        next.wait_start = calloc(2 * (size_t)net.nlayers, sizeof(double));
        if (next.wait_start == NULL) TRAIN_GVQ(gvqSystemError, gcomm);
        next.wait_end = next.wait_start + net.nlayers;
        if (!dumping) agg_split_blocks(&agg, update_range, &next); /* dumps read whole blocks */
    }
    for (step = 0; step < iters; step++) {
        double t0 = now_s();
        if (pos + batch > train.n) {
            train_shuffle(perm, train.n, o->seed * 1000003ull + (uint64_t)epoch + 1);
            epoch++;
            pos = 0;
        }
        mnist_batch(&train, perm + pos + (long)rank * local, local, images, labels);
        pos += batch;
        double waited = 0.0; /* for the last step's gradients, inside this forward pass */
        if (pending) {
            next.wait_s = 0.0;
            agg.waiting = 1;
            agg.wait_s = 0.0;
            net_forward_each(&net, images, local, before_layer, &next);
            agg.waiting = 0;
            double fwd_end = now_s();
            TRAIN_GVQ(next.error, gcomm);
            TRAIN_GVQ(agg.wait_error, gcomm);
            double w = now_s();
            TRAIN_GVQ(agg_wait(&agg), gcomm); /* ends the last step: all of it is in */
            waited = next.wait_s + agg.wait_s + (now_s() - w);
            if (o->timeline_path != NULL && rank == 0 && step == o->timeline_step)
                write_timeline(o->timeline_path, &agg, step, prev_t0, prev_fwd, prev_t1, 0, 0,
                               &next, fwd_end);
            pending = 0;
        } else {
            net_forward(&net, images, local);
        }
        long correct = 0;
        double loss = net_loss(&net, labels, local, &correct);
        dump_hook.active = dumping && (o->dump_iters == 0 || (long)dump.iters < o->dump_iters);
        dump_hook.ok = 1;
        double t_fwd = now_s();
        agg_backward(&agg, images, local);
        double t1 = now_s();
        if (dump_hook.active && !dump_hook.ok) {
            fprintf(stderr, "gvq-train: cannot write '%s' (disk full?); recording stopped\n",
                    o->dump_path);
            fclose(dump.f);
            dumping = 0;
        }
        const double lr_step =
            o->cosine
                ? o->lr * 0.5 * (1.0 + cos(3.14159265358979323846 * (double)step / (double)iters))
                : o->lr;
        const sgd_t sgd = {&net, velocity, (float)lr_step, (float)o->momentum,
                           (float)o->weight_decay};
        int last = step + 1 == iters || step + 1 == o->stop_step;
        int printing = (step + 1) % o->print_every == 0 || last;
        int checking = (o->check_every > 0 && (step + 1) % o->check_every == 0) || printing;
        double t2 = t1, t3 = t1;
        if (o->overlap_forward && !checking) { /* the weights are read before they change */
            next.sgd = sgd;
            pending = 1;
            prev_t0 = t0;
            prev_fwd = t_fwd;
            prev_t1 = t1;
        } else {
            TRAIN_GVQ(agg_wait(&agg), gcomm);
            t2 = now_s();
            sgd_range(&sgd, 0, net.nparams);
            t3 = now_s();
            if (o->timeline_path != NULL && rank == 0 && step + 1 == o->timeline_step)
                write_timeline(o->timeline_path, &agg, step + 1, t0, t_fwd, t1, t2, t3, NULL, 0);
        }
        win_compute += (t1 - t0) + (t3 - t2) - waited;
        win_comm += t2 - t1 + waited;
        win_loss += loss;
        win_correct += correct;
        win_seen += local;
        win_steps++;
        res->loss_hist[step] = loss;
        progress_draw(&progress, step + 1, iters);

        if (checking) {
            res->sync_checks++;
            if (!weights_agree(&net, comm)) {
                res->sync_mismatches++;
                progress_clear(&progress);
                if (rank == 0)
                    fprintf(stderr, "gvq-train: step %ld: the ranks hold different weights\n",
                            step + 1);
            }
        }
        if (!printing) continue;

        /* a window ends: sums over the ranks, evaluation, compressor stats, one line */
        double now = now_s();
        win_train_s = now - win_start;
        train_s += win_train_s;
        double sums[5] = {win_loss, (double)win_correct, (double)win_seen, win_compute, win_comm};
        double tot[5];
        TRAIN_MPI(MPI_Allreduce(sums, tot, 5, MPI_DOUBLE, MPI_SUM, comm));
        const long nsteps_win = win_steps;
        double mean_loss = tot[0] / ((double)nsteps_win * nranks);
        double train_acc = 100.0 * tot[1] / tot[2];
        double compute = tot[3] / nranks, commt = tot[4] / nranks;
        tot_compute += compute;
        tot_comm += commt;
        if (step + 1 == nsteps_win) res->first_loss = mean_loss;
        res->last_loss = mean_loss;
        int evaluated = (o->eval_every > 0 && (step + 1) % o->eval_every == 0) || last;
        if (evaluated)
            test_acc = train_evaluate(&net, &test, rank, nranks, comm, images, labels, idx);

        unsigned long long raw = 0, wire = 0;
        phases[0] = '\0';
        for (int i = 0; i < nconv && comp[i] != NULL; i++) {
            gvqCompressorStats_t st;
            TRAIN_GVQ(gvqCompressorGetStats(comp[i], &st), gcomm);
            raw += st.rawBytes;
            wire += st.wireBytes;
            size_t len = strlen(phases);
            snprintf(phases + len, 2 * (size_t)nconv + 16 - len, "%s%c", i ? "," : "",
                     phase_letter(st.phase));
        }
        double ratio =
            wire > prev_wire ? (double)(raw - prev_raw) / (double)(wire - prev_wire) : 1.0;
        prev_raw = raw;
        prev_wire = wire;
        if (comp[0] == NULL)
            snprintf(phases, 2 * (size_t)nconv + 16, "%s", o->zero_code ? "zero-code" : "-");

        if (rank == 0) {
            double ips = (double)batch * (double)nsteps_win / win_train_s;
            char acc[32] = "   -  ";
            if (test_acc >= 0.0) snprintf(acc, sizeof acc, "%5.2f%%", test_acc);
            if (!o->quiet) {
                progress_clear(&progress);
                fprintf(out,
                        "epoch %2d iter %6ld  loss %.4f  train %5.2f%%  test %s  %7.0f img/s"
                        "  compute %6.2fs comm %6.2fs (%2.0f%%)  ratio %5.2f  phase %s\n",
                        epoch, step + 1, mean_loss, train_acc, acc, ips, compute, commt,
                        100.0 * commt / (compute + commt > 0 ? compute + commt : 1), ratio, phases);
                fflush(out);
            }
            if (csv != NULL) {
                fprintf(csv, "%ld,%d,%.4f,%.6f,%.3f,%.3f,%.1f,%.4f,%.4f,%.3f,%s\n", step + 1, epoch,
                        train_s, mean_loss, train_acc, evaluated ? test_acc : -1.0, ips,
                        tot_compute, tot_comm, ratio, phases);
                fflush(csv);
            }
        }
        win_loss = win_compute = win_comm = 0.0;
        win_correct = win_seen = win_steps = 0;
        if (o->stop_at > 0.0 && test_acc >= o->stop_at && res->time_to_stop < 0.0) {
            res->time_to_stop = train_s;
            res->iters = step + 1;
            step++;
            break;
        }
        res->iters = step + 1;
        if (step + 1 == o->stop_step) { /* --stop-step: the rest of the schedule is not run */
            step++;
            break;
        }
        win_start = now_s();
    }

    /* totals */
    progress_clear(&progress);
    res->iters = step;
    res->test_acc = test_acc;
    res->train_s = train_s;
    res->compute_s = tot_compute;
    res->comm_s = tot_comm;
    {
        unsigned long long raw = 0, wire = 0;
        for (int i = 0; i < nconv && comp[i] != NULL; i++) {
            gvqCompressorStats_t st;
            TRAIN_GVQ(gvqCompressorGetStats(comp[i], &st), gcomm);
            raw += st.rawBytes;
            wire += st.wireBytes;
            res->fits += st.fits;
            res->early_exits += st.earlyExits;
        }
        double conv_raw = raw_conv_per_call * (double)step, conv_wire = 0.0;
        rest_wire = 0.0;
        for (int v = 0; v < agg.nvars; v++)
            *(agg.vars[v].conv >= 0 ? &conv_wire : &rest_wire) += (double)agg_wire_bytes(&agg, v);
        res->conv_ratio = conv_wire > 0 ? conv_raw / conv_wire : 1.0;
        double all_raw = conv_raw + raw_rest_per_call * (double)step;
        res->total_ratio = conv_wire + rest_wire > 0 ? all_raw / (conv_wire + rest_wire) : 1.0;
    }
    if (rank == 0 && !o->quiet) {
        fprintf(out,
                "# done: %ld steps in %.1f s of training (%.1f ms/step, %.0f img/s), test accuracy "
                "%.2f%%, compute %.1f s comm %.1f s per rank (comm %.0f%%)\n",
                res->iters, train_s, 1e3 * train_s / (double)(res->iters > 0 ? res->iters : 1),
                (double)batch * (double)res->iters / train_s, test_acc, res->compute_s, res->comm_s,
                100.0 * res->comm_s / (res->compute_s + res->comm_s));
        if (!o->zero_code)
            fprintf(out,
                    "# wire: conv layers %.2fx smaller than a plain fp32 ring over the run, "
                    "the whole gradient %.2fx; weight checksums compared %ld times, %ld "
                    "mismatches\n",
                    res->conv_ratio, res->total_ratio, res->sync_checks, res->sync_mismatches);
        else
            fprintf(out, "# weight checksums compared %ld times, %ld mismatches\n",
                    res->sync_checks, res->sync_mismatches);
        for (int i = 0; i < nconv && comp[i] != NULL; i++) {
            gvqCompressorStats_t st;
            TRAIN_GVQ(gvqCompressorGetStats(comp[i], &st), gcomm);
            fprintf(out,
                    "# conv%d %s: phase %c, L %d, d %d, fits %lld (refused %lld), early "
                    "exits %lld, compressed-phase ratio %.2f, kept energy %.4f, last local "
                    "loss %.4f%s%s\n",
                    i + 1, codec_name(o->codec), phase_letter(st.phase), st.sliceSize, st.dims,
                    st.fits, st.fitsRefused, st.earlyExits, st.ratio, st.keptEnergy, st.lastLoss,
                    st.reason[0] ? "; " : "", st.reason);
        }
        if (o->stop_at > 0.0)
            fprintf(out, "# time to %.2f%% test accuracy: %s\n", o->stop_at,
                    res->time_to_stop >= 0.0 ? "reached" : "not reached");
        fflush(out);
    }
    if (csv != NULL) fclose(csv);
    if (dumping && dump_close(&dump, o->dump_path) != 0) bad = 1;
    if (dumping && rank == 0 && !o->quiet && !bad)
        fprintf(out, "# recorded %llu iterations of conv%d's gradient (%llu floats) in %s\n",
                (unsigned long long)dump.iters, o->dump_layer, (unsigned long long)dump.count,
                o->dump_path);

done:
    agg_free(&agg);
    TRAIN_GVQ(gvqCommDestroy(gcomm), NULL);
    free(phases);
    free(velocity);
    free(next.wait_start);
    free(images);
    free(labels);
    free(perm);
    free(idx);
    net_free(&net);
    mnist_free(&train);
    mnist_free(&test);
    TRAIN_MPI(MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, comm));
    return anybad ? -1 : 0;
}
