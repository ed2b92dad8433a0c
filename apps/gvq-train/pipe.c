/*
 * pipe.c -- gvq-train --stages S [--schedule gpipe|pipedream|dualpipe|spectrain] [--no-flush]
 * [--overlap-transfers]: pipeline model parallelism through the training layer's gvqPipe
 * (include/gvq_train.h; GPipe, or the 1F1B family with an update after every micro-batch:
 * PipeDream's weight stashing, DualPipe's stale weights, SpecTrain's predicted ones, the versions
 * and predictions made by the layer on the stage's parameter ranges). --no-flush: the pipeline
 * runs on across steps, so a step's call also starts the next step's first forwards: stage 0
 * reads them from the other half of the step buffers, loaded a step ahead. --overlap-transfers:
 * the layer sends on two more communicators (MPI_Comm_dup of the pipeline's) from host streams.
 * Every rank builds the whole network (the same seed) and runs
 * the layers of its stage; the layers are cut into S consecutive ranges of about equal compute
 * (a stage gets at least one layer). A step is one global batch cut into M micro-batches:
 *
 *   stage k:  forward(m): in_m (stage 0: the images) -> its layers -> out_m
 *             backward(m): its layers' forward again on in_m (GPipe's re-materialization: a
 *                          layer keeps one batch's state), then backward; the last stage starts
 *                          from the loss (the mean over the global batch); gradients summed
 *                          over the micro-batches
 *             then SGD with momentum on the parameters it owns (PipeDream: after every
 *             micro-batch's backward, from gvqPipe's update callback)
 *
 * With R x S ranks (rank = replica x S + stage), R replicas of the pipeline each take a share of
 * the global batch, and every stage's gradients are averaged over its replicas through the
 * training layer (aggregate.c over the stage's layers: the codec options apply) before its update.
 *
 * For the test accuracy every stage broadcasts its layers' parameters, so that every rank holds
 * the whole current model and evaluates its share of the test set. The printed loss and train
 * accuracy come from the last stage.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "aggregate.h"
#include "gvq_mpi.h"
#include "gvq_train.h"
#include "mnist.h"
#include "net.h"
#include "pipe.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Forward cost of a layer per image (multiply-adds), for the cut. */
static double layer_cost(const layer_t *l) {
    double px = (double)l->out_h * (double)l->out_w;
    if (l->kind == LAYER_CONV) return (double)l->nw * px;
    if (l->kind == LAYER_BLOCK) return ((double)l->sub[0].nw + (double)l->sub[1].nw) * px;
    if (l->kind == LAYER_FC) return (double)l->nw;
    return (double)layer_out_size(l);
}

/* first[k] .. first[k+1]-1: the layers of stage k; cut where the running cost passes k/S of the
 * total, every stage at least one layer. -1 when the network has fewer layers than stages. */
static int cut_stages(const net_t *net, int S, int *first) {
    if (net->nlayers < S) return -1;
    double total = 0, run = 0;
    for (int i = 0; i < net->nlayers; i++)
        total += layer_cost(&net->layers[i]);
    first[0] = 0;
    int k = 1;
    for (int i = 0; i < net->nlayers && k < S; i++) {
        run += layer_cost(&net->layers[i]);
        int left = net->nlayers - (i + 1); /* layers after i */
        if ((run >= total * k / S && i + 1 > first[k - 1]) || left == S - k) first[k++] = i + 1;
    }
    first[S] = net->nlayers;
    return 0;
}

/* The parameter ranges of a layer (its weights, biases, a block's convs). */
static int layer_ranges(const layer_t *l, float **ptr, size_t *len) {
    int n = 0;
    if (l->w != NULL && l->nw > 0) ptr[n] = l->w, len[n++] = l->nw;
    if (l->b != NULL && l->nb > 0) ptr[n] = l->b, len[n++] = l->nb;
    if (l->kind == LAYER_BLOCK)
        for (int s = 0; s < 2; s++)
            if (l->sub[s].w != NULL) ptr[n] = l->sub[s].w, len[n++] = l->sub[s].nw;
    return n;
}

typedef struct {
    net_t *net;
    int l0, l1, stage, nstages, micro, mb; /* layers [l0, l1), micro-batches of mb images */
    const float *images; /* the step's batch (this replica's share); without a flush two, the
                            step of slot m's micro-batch in the half m / micro */
    const uint8_t *labels;
    size_t share;        /* images of a step's batch per replica */
    const float **in_of; /* the input gvqPipe gave forward(m), valid until backward(m) */
    float *acc;          /* gradients summed over the micro-batches (nparams) */
    double loss;
    long correct;
    /* the update (GPipe: once a step; PipeDream: after every micro-batch's backward) */
    size_t (*ranges)[2]; /* the parameters this stage updates: [from, to) of net->params */
    int nranges;
    float *velocity;
    double lr; /* this step's */
    float mu, wd;
    int replicas;
    agg_t *agg; /* replicas > 1: their average through the training layer */
    int wrank;
} stage_t;

/* SGD with momentum on the stage's parameters from the gradients summed in acc (averaged over
 * the replicas first), acc cleared. */
static gvqResult_t stage_apply(stage_t *s) {
    net_t *net = s->net;
    for (int r = 0; r < s->nranges; r++) /* where the training layer reads them */
        memcpy(net->grads + s->ranges[r][0], s->acc + s->ranges[r][0],
               sizeof(float) * (s->ranges[r][1] - s->ranges[r][0]));
    if (s->replicas > 1) {
        gvqResult_t gr = agg_ready_all_wait(s->agg);
        if (gr != gvqSuccess) {
            fprintf(stderr, "gvq-train: rank %d: averaging over the replicas: %s\n", s->wrank,
                    gvqGetErrorString(gr));
            return gr;
        }
    }
    for (int r = 0; r < s->nranges; r++)
        for (size_t j = s->ranges[r][0]; j < s->ranges[r][1]; j++) {
            s->velocity[j] = s->mu * s->velocity[j] + net->grads[j] + s->wd * net->params[j];
            net->params[j] -=
                (float)(net->lr_scale != NULL ? s->lr * net->lr_scale[j] : s->lr) * s->velocity[j];
            s->acc[j] = 0;
        }
    return gvqSuccess;
}

/* PipeDream's update callback: micro-batch m's gradients applied now. */
static gvqResult_t stage_update(void *user, int m) {
    (void)m;
    return stage_apply(user);
}

/* Slot m's first image (or label) in the step buffers: half m / micro (a pipeline without a
 * flush), micro-batch m mod micro of it. */
static size_t slot_first(const stage_t *s, int m) {
    return (size_t)(m / s->micro) * s->share + (size_t)(m % s->micro) * (size_t)s->mb;
}

/* Micro-batch m's input to the stage: its images on stage 0, else what forward(m) was given. */
static const float *stage_input(const stage_t *s, int m) {
    if (s->l0 > 0) return s->in_of[m];
    return s->images + slot_first(s, m) * layer_in_size(&s->net->layers[0]);
}

static const float *run_layers(stage_t *s, int m) {
    const float *in = stage_input(s, m);
    for (int i = s->l0; i < s->l1; i++) {
        layer_forward(&s->net->layers[i], in, s->mb);
        in = s->net->layers[i].out;
    }
    return in;
}

static gvqResult_t stage_forward(void *user, int m, const float *in, float *out) {
    stage_t *s = user;
    s->in_of[m] = in;
    const float *y = run_layers(s, m);
    if (out != NULL)
        memcpy(out, y, sizeof(float) * (size_t)s->mb * layer_out_size(&s->net->layers[s->l1 - 1]));
    return gvqSuccess;
}

static gvqResult_t stage_backward(void *user, int m, const float *dout, float *din) {
    stage_t *s = user;
    net_t *net = s->net;
    const float *x = run_layers(s, m); /* re-materialized: the layers hold one batch's state */
    const float *dnext = dout;
    if (dout == NULL) { /* the last stage: the loss, as a mean over the global batch */
        long correct = 0;
        s->loss += softmax_xent(x, s->labels + slot_first(s, m), s->mb, net->classes, net->probs,
                                net->dlogits, &correct) /
                   s->micro;
        s->correct += correct;
        for (size_t j = 0; j < (size_t)s->mb * (size_t)net->classes; j++)
            net->dlogits[j] /= (float)s->micro;
        dnext = net->dlogits;
    }
    for (int i = s->l1 - 1; i >= s->l0; i--) {
        layer_t *l = &net->layers[i];
        layer_backward(l, i > s->l0 ? net->layers[i - 1].out : stage_input(s, m), dnext, s->mb);
        dnext = l->dout;
    }
    for (int r = 0; r < s->nranges; r++)
        for (size_t j = s->ranges[r][0]; j < s->ranges[r][1]; j++)
            s->acc[j] += net->grads[j];
    if (din != NULL)
        memcpy(din, net->layers[s->l0].dout,
               sizeof(float) * (size_t)s->mb * layer_in_size(&net->layers[s->l0]));
    return gvqSuccess;
}

/* ---- the run ----------------------------------------------------------------------------------
 */

/* Every stage sends its layers' parameters to every rank (for the evaluation). */
/* GVQ_PIPE_RMSE=1 (DualPipe, SpecTrain): each stage's RMSE of the weights its tasks ran on
 * against the weights reached s updates later, printed by the last stage of replica 0
 * (world ranks r x S + k). */
static void print_rmse(gvqPipe_t pipe, int S, int wrank, MPI_Comm comm, FILE *out) {
    gvqPipeStats_t st;
    double mine[4] = {0, 0, 0, 0}, *all = NULL;
    if (gvqPipeGetStats(pipe, &st) == gvqSuccess)
        mine[0] = (double)st.samples, mine[1] = st.rmseStale, mine[2] = st.rmsePredicted,
        mine[3] = st.rmsStep;
    int n = 0;
    MPI_Comm_size(comm, &n);
    if (wrank == S - 1) all = calloc((size_t)n * 4, sizeof(double));
    MPI_Gather(mine, 4, MPI_DOUBLE, all, 4, MPI_DOUBLE, S - 1, comm);
    for (int k = 0; all != NULL && out != NULL && k < S; k++)
        if (all[4 * k] > 0)
            fprintf(out,
                    "# stage %d weights: RMSE against the weights s updates later: stale %.4g, "
                    "predicted %.4g (one update moves them %.4g RMS; %.0f tasks)\n",
                    k, all[4 * k + 1], all[4 * k + 2], all[4 * k + 3], all[4 * k]);
    free(all);
}

static void share_parameters(net_t *net, const int *first, int S, MPI_Comm comm) {
    for (int k = 0; k < S; k++)
        for (int i = first[k]; i < first[k + 1]; i++) {
            float *ptr[4];
            size_t len[4];
            int n = layer_ranges(&net->layers[i], ptr, len);
            for (int r = 0; r < n; r++)
                MPI_Bcast(ptr[r], (int)len[r], MPI_FLOAT, k, comm);
        }
}

/* 1 when the stage's replicas hold the same weights (min and max of their hashes agree). */
static int replicas_agree(const float *params, size_t (*ranges)[2], int nranges, MPI_Comm scomm) {
    unsigned long long h = 1469598103934665603ull, lo = 0, hi = 0;
    for (int r = 0; r < nranges; r++)
        for (size_t j = ranges[r][0]; j < ranges[r][1]; j++) {
            uint32_t b;
            memcpy(&b, &params[j], 4);
            h = (h ^ b) * 1099511628211ull;
        }
    MPI_Allreduce(&h, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, scomm);
    MPI_Allreduce(&h, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, scomm);
    return lo == hi;
}

/* What the parts of pipe_run share: the stage (its layers, micro-batches, parameter ranges and
 * buffers: stage_t), the ranks' layout, the data, the model, the pipe, the loop's sums. */
typedef struct {
    stage_t st;
    const train_opts_t *o;
    train_result_t *res;
    FILE *out, *csv;
    MPI_Comm comm, pcomm, scomm; /* all ranks; the replica's pipeline; the stage's replicas */
    int nranks, replica, batch;  /* world rank = replica x S + stage (st.wrank, st.stage) */
    mnist_set_t train, test;
    net_t net;
    int first[65]; /* stage k: layers first[k] .. first[k+1]-1 */
    long iters;
    size_t img;                  /* floats per image */
    float *images, *step_images; /* a step or an evaluation chunk; two steps (--no-flush) */
    uint8_t *labels, *step_labels;
    int *perm, *idx;
    float **wptr, **gptr; /* the ranges again, as the pipe takes them */
    size_t *wlen;
    agg_t agg; /* R > 1: the stage's weights aggregated over its replicas by the training layer */
    const char *sched;
    gvqComm_t gcomm, gstage, xcomm[2]; /* xcomm, xmpi: --overlap-transfers */
    MPI_Comm xmpi[2];
    gvqPipe_t pipe;
} prun_t;

/* The ranks' layout (a pipeline communicator per replica, a stage communicator per stage), the
 * data, and the model cut into the stages (every rank builds the whole network; one failure
 * stops every rank). -1, what it made freed, when the run cannot start. */
static int pipe_load(prun_t *p) {
    const train_opts_t *o = p->o;
    stage_t *st = &p->st;
    MPI_Comm_rank(p->comm, &st->wrank);
    MPI_Comm_size(p->comm, &p->nranks);
    const int wrank = st->wrank, nranks = p->nranks;
    p->out = o->out != NULL ? o->out : stdout;
    memset(p->res, 0, sizeof *p->res);
    p->res->time_to_stop = -1.0;
    if (o->stages < 1 || nranks % o->stages != 0) {
        if (wrank == 0)
            fprintf(stderr,
                    "gvq-train: --stages %d needs a multiple of %d ranks (R replicas x S "
                    "stages), not %d\n",
                    o->stages, o->stages, nranks);
        return -1;
    }
    /* rank = replica * S + stage: a pipeline communicator per replica, a stage communicator
     * (the stage's replicas, which average its gradients) per stage */
    const int S = st->nstages = o->stages, R = st->replicas = nranks / S;
    const int rank = st->stage = wrank % S, replica = p->replica = wrank / S;
    MPI_Comm_split(p->comm, replica, rank, &p->pcomm);
    MPI_Comm_split(p->comm, rank, replica, &p->scomm);
    const int M = st->micro = o->micro_batches > 0 ? o->micro_batches : 4;
    const int batch = p->batch = o->batch > 0 ? o->batch : 32 * nranks;
    if (batch % (M * R) != 0) {
        if (wrank == 0)
            fprintf(stderr,
                    "gvq-train: the global batch %d is not a multiple of --micro-batches "
                    "%d x %d replicas\n",
                    batch, M, R);
        MPI_Comm_free(&p->pcomm);
        MPI_Comm_free(&p->scomm);
        return -1;
    }
    const int mb = st->mb = batch / (M * R);
    char err[4096] = "";
    int bad = mnist_load(&p->train, o->data_dir, "train", o->train_subset, err, sizeof err) != 0 ||
              mnist_load(&p->test, o->data_dir, "t10k", o->test_subset, err, sizeof err) != 0,
        anybad = 0;
    const int capacity = mb > 100 ? mb : 100;
    int made = !bad && net_create(&p->net, &o->arch, 1, p->train.rows, p->train.cols, capacity,
                                  o->seed, err, sizeof err) == 0;
    if (made && (S > 64 || cut_stages(&p->net, S, p->first) != 0)) {
        snprintf(err, sizeof err,
                 "the network's %d layers cannot be cut into %d stages of at least one layer",
                 p->net.nlayers, S);
        bad = 1;
    }
    bad |= !made;
    MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, p->comm); /* one failure stops every rank */
    if (anybad) {
        if (made) net_free(&p->net);
        MPI_Comm_free(&p->pcomm);
        MPI_Comm_free(&p->scomm);
        if (wrank == 0) fprintf(stderr, "gvq-train: %s\n", err[0] ? err : "data or model missing");
        mnist_free(&p->train);
        mnist_free(&p->test);
        return -1;
    }
    p->iters = o->iters > 0 ? o->iters : (long)o->epochs * (p->train.n / batch); /* steps */
    return 0;
}

/* The buffers, the stage's parameter ranges and state, the pipe (gvqPipe on the replica's
 * pipeline), and with R > 1 the training layer over the stage's replicas. */
static void pipe_setup(prun_t *p) {
    const train_opts_t *o = p->o;
    stage_t *st = &p->st;
    net_t *net = &p->net;
    const int wrank = st->wrank, rank = st->stage, M = st->micro, mb = st->mb;
    const int capacity = mb > 100 ? mb : 100;
    size_t img = p->img = (size_t)p->train.rows * (size_t)p->train.cols;
    /* a step, or an evaluation chunk */
    size_t held = (size_t)(p->batch > capacity ? p->batch : capacity);
    p->images = malloc(sizeof(float) * held * img);
    p->labels = malloc(held);
    p->perm = malloc(sizeof(int) * (size_t)p->train.n), p->idx = malloc(sizeof(int) * held);
    st->velocity = calloc(net->nparams, sizeof(float));
    st->acc = calloc(net->nparams, sizeof(float));
    st->in_of = calloc(2 * (size_t)M, sizeof *st->in_of);
    const size_t share = st->share = (size_t)(p->batch / st->replicas); /* a step's images here */
    p->step_images = malloc(sizeof(float) * 2 * share * img);           /* two steps: --no-flush */
    p->step_labels = malloc(2 * share);
    size_t(*ranges)[2] = st->ranges = calloc(4 * (size_t)net->nlayers + 1, sizeof *ranges);
    if (!p->images || !p->labels || !p->perm || !p->idx || !st->velocity || !st->acc ||
        !st->in_of || !p->step_images || !p->step_labels || !ranges) {
        fprintf(stderr, "gvq-train: rank %d: out of memory\n", wrank);
        MPI_Abort(p->comm, 1);
    }
    int nranges = 0;
    for (int i = p->first[rank]; i < p->first[rank + 1]; i++) { /* what this stage updates */
        float *ptr[4];
        size_t len[4];
        int n = layer_ranges(&net->layers[i], ptr, len);
        for (int r = 0; r < n; r++) {
            ranges[nranges][0] = (size_t)(ptr[r] - net->params);
            ranges[nranges][1] = ranges[nranges][0] + len[r];
            nranges++;
        }
    }
    st->net = net;
    st->l0 = p->first[rank];
    st->l1 = p->first[rank + 1];
    st->images = p->step_images;
    st->labels = p->step_labels;
    st->nranges = nranges;
    st->mu = (float)o->momentum;
    st->wd = (float)o->weight_decay;
    /* the ranges again, as the pipe takes them: versions, predictions (one per range above) */
    p->wptr = malloc(sizeof(float *) * (size_t)(nranges + 1));
    p->gptr = malloc(sizeof(float *) * (size_t)(nranges + 1));
    p->wlen = malloc(sizeof(size_t) * (size_t)(nranges + 1));
    if (!p->wptr || !p->gptr || !p->wlen) {
        fprintf(stderr, "gvq-train: rank %d: out of memory\n", wrank);
        MPI_Abort(p->comm, 1);
    }
    int nw = o->pipe_schedule > 0 ? nranges : 0;
    for (int r = 0; r < nw; r++) {
        p->wptr[r] = net->params + ranges[r][0];
        p->gptr[r] = st->acc + ranges[r][0]; /* where backward sums the gradients */
        p->wlen[r] = ranges[r][1] - ranges[r][0];
    }
    gvqPipeConfig_t pc = GVQ_PIPE_CONFIG_INITIALIZER;
    pc.microBatches = M;
    static const char *const names[] = {"gpipe", "pipedream", "dualpipe", "spectrain"};
    pc.schedule = o->pipe_schedule; /* gvqPipeSchedule_t's order */
    pc.predictDistance = o->predict_distance;
    p->sched = names[o->pipe_schedule];
    pc.weightRanges = nw;
    pc.weights = p->wptr;
    pc.weightCounts = p->wlen;
    pc.update = stage_update;
    pc.gradients = p->gptr;
    pc.flush = !o->pipe_no_flush;
    pc.inCount = rank == 0 ? 0 : (size_t)mb * layer_in_size(&net->layers[st->l0]);
    pc.outCount =
        rank == st->nstages - 1 ? 0 : (size_t)mb * layer_out_size(&net->layers[st->l1 - 1]);
    st->agg = &p->agg;
    gvqResult_t gr = gvqCommInitMPI(&p->gcomm, p->pcomm, NULL);
    p->xmpi[0] = p->xmpi[1] = MPI_COMM_NULL; /* --overlap-transfers */
    for (int i = 0; o->pipe_overlap && i < 2 && gr == gvqSuccess; i++) {
        MPI_Comm_dup(p->pcomm, &p->xmpi[i]);
        gr = gvqCommInitMPI(&p->xcomm[i], p->xmpi[i], NULL);
    }
    pc.forwardComm = p->xcomm[0];
    pc.backwardComm = p->xcomm[1];
    if (gr == gvqSuccess && st->replicas > 1) gr = gvqCommInitMPI(&p->gstage, p->scomm, NULL);
    if (gr == gvqSuccess && st->replicas > 1 &&
        agg_setup_layers(&p->agg, o, net, p->gstage, st->l0, st->l1, &gr) != 0) {
        fprintf(stderr, "gvq-train: rank %d: the stage's training layer: %s\n", wrank,
                gvqGetErrorString(gr));
        MPI_Abort(p->comm, 1);
    }
    if (gr == gvqSuccess)
        gr = gvqPipeCreate(p->gcomm, &pc, stage_forward, stage_backward, st, &p->pipe);
    if (gr != gvqSuccess) {
        fprintf(stderr, "gvq-train: rank %d: %s\n", wrank, gvqGetErrorString(gr));
        MPI_Abort(p->comm, 1);
    }
}

/* The steps, a progress line (the last stages) every print_every; returns how many ran. */
static long pipe_loop(prun_t *p) {
    const train_opts_t *o = p->o;
    stage_t *st = &p->st;
    train_result_t *res = p->res;
    const int S = st->nstages, R = st->replicas, rank = st->stage, batch = p->batch;
    const long iters = p->iters;
    double train_s = 0, win_start = now_s(), win_loss = 0, test_acc = -1;
    long win_correct = 0, win_steps = 0, pos = p->train.n, step;
    int epoch = 0;
    /* the step's batch in half h of the step buffers (h = step mod 2 without a flush, whose
     * step also runs the next one's first forwards: its batch is loaded a step ahead) */
    int epoch_of[2] = {0, 0}, loaded = -1;
    const int nflush = o->pipe_no_flush;
    for (step = 0; step < iters; step++) {
        for (long want = nflush && step + 1 < iters ? step + 1 : step; loaded < want;) {
            if (pos + batch > p->train.n) {
                train_shuffle(p->perm, p->train.n, o->seed * 1000003ull + (uint64_t)epoch + 1);
                epoch++;
                pos = 0;
            }
            loaded++;
            int h = nflush ? loaded % 2 : 0;
            mnist_batch(&p->train, p->perm + pos + (long)p->replica * (batch / R), batch / R,
                        p->step_images + (size_t)h * st->share * p->img,
                        p->step_labels + (size_t)h * st->share);
            epoch_of[h] = epoch;
            pos += batch;
        }
        const int ep = epoch_of[nflush ? step % 2 : 0]; /* this step's epoch */
        st->loss = 0;
        st->correct = 0;
        st->lr = o->cosine ? o->lr * 0.5 *
                                 (1.0 + cos(3.14159265358979323846 * (double)step / (double)iters))
                           : o->lr;
        /* SpecTrain's prediction: the layer's v is the (1 - gamma)-damped average of the
         * gradients, this SGD's velocity the undamped one (v' = mu v' + g), so a step moves the
         * weights lr v' = lr / (1 - mu) v: the rate the prediction needs */
        gvqResult_t gr =
            gvqPipeSetLearningRate(p->pipe, (float)(st->lr / (st->mu < 1 ? 1.0 - st->mu : 1.0)));
        /* all but GPipe update inside it; without a flush the last step drains the pipeline */
        if (gr == gvqSuccess)
            gr = step + 1 == iters ? gvqPipeStepFlush(p->pipe) : gvqPipeStep(p->pipe);
        if (gr == gvqSuccess && o->pipe_schedule == 0) gr = stage_apply(st);
        if (gr != gvqSuccess) {
            fprintf(stderr, "gvq-train: rank %d: gvqPipeStep: %s\n", st->wrank,
                    gvqGetErrorString(gr));
            MPI_Abort(p->comm, 1);
        }
        win_loss += st->loss;
        win_correct += st->correct;
        win_steps++;
        int last = step + 1 == iters;
        if ((step + 1) % o->print_every != 0 && !last) continue;
        double now = now_s(), win_s = now - win_start;
        train_s += win_s;
        int evaluated = (o->eval_every > 0 && (step + 1) % o->eval_every == 0) || last;
        if (evaluated) {
            share_parameters(&p->net, p->first, S, p->pcomm);
            test_acc = train_evaluate(&p->net, &p->test, st->wrank, p->nranks, p->comm, p->images,
                                      p->labels, p->idx);
        }
        if (rank == S - 1) { /* the last stages saw the losses: their replicas' sum */
            double mine[2] = {win_loss, (double)win_correct}, sum[2];
            MPI_Allreduce(mine, sum, 2, MPI_DOUBLE, MPI_SUM, p->scomm);
            double loss = sum[0] / ((double)win_steps * R);
            double tacc = 100.0 * sum[1] / ((double)win_steps * batch);
            double ips = (double)batch * (double)win_steps / win_s;
            char accs[32] = "   -  ";
            if (evaluated) snprintf(accs, sizeof accs, "%5.2f%%", test_acc);
            if (!o->quiet && p->replica == 0)
                fprintf(p->out,
                        "epoch %2d iter %6ld  loss %.4f  train %5.2f%%  test %s  %7.0f img/s\n", ep,
                        step + 1, loss, tacc, accs, ips);
            fflush(p->out);
            if (p->csv != NULL) {
                fprintf(p->csv, "%ld,%d,%.4f,%.6f,%.3f,%.3f,%.1f,0,0,1,%s\n", step + 1, ep, train_s,
                        loss, tacc, evaluated ? test_acc : -1.0, ips, p->sched);
                fflush(p->csv);
            }
            res->last_loss = loss;
            if (res->first_loss == 0) res->first_loss = loss;
        }
        win_loss = 0;
        win_correct = win_steps = 0;
        res->iters = step + 1;
        int stop = o->stop_at > 0 && test_acc >= o->stop_at;
        MPI_Bcast(&stop, 1, MPI_INT, 0, p->comm);
        if (stop && res->time_to_stop < 0) {
            res->time_to_stop = train_s;
            step++;
            break;
        }
        win_start = now_s();
    }
    res->test_acc = test_acc;
    res->train_s = train_s;
    return step;
}

int pipe_run(const train_opts_t *o, MPI_Comm comm, train_result_t *res) {
    prun_t run;
    memset(&run, 0, sizeof run);
    prun_t *p = &run;
    p->o = o;
    p->comm = comm;
    p->res = res;
    if (pipe_load(p) != 0) return -1;
    pipe_setup(p);
    const int S = p->st.nstages, R = p->st.replicas, wrank = p->st.wrank;
    FILE *out = p->out;
    if (wrank == 0 && !o->quiet) {
        fprintf(out,
                "# gvq-train: %d replica%s of a pipeline of %d stages (%s%s%s), global batch "
                "%d, %d micro-batches of %d per replica, %ld steps, lr %g%s momentum %g seed "
                "%llu\n",
                R, R > 1 ? "s" : "", S, p->sched, o->pipe_no_flush ? ", no flush" : "",
                o->pipe_overlap ? ", overlapped transfers" : "", p->batch, p->st.micro, p->st.mb,
                p->iters, o->lr, o->cosine ? " (cosine decay)" : "", o->momentum, o->seed);
        fprintf(out, "# stages:");
        for (int k = 0; k < S; k++)
            fprintf(out, " %d: layers %d-%d%s", k, p->first[k], p->first[k + 1] - 1,
                    k + 1 < S ? "," : "\n");
        fflush(out);
    }
    if (wrank == S - 1 && o->log_path != NULL && (p->csv = fopen(o->log_path, "w")) != NULL)
        fprintf(p->csv, "iter,epoch,time_s,loss,train_acc,test_acc,img_per_s,compute_s,comm_s,"
                        "conv_ratio,phase\n");
    long step = pipe_loop(p);
    /* stopped early: the next step's forwards are under way; one more step, its batch loaded:
     * counted, not timed */
    if (o->pipe_no_flush && step < p->iters) {
        gvqResult_t gr = gvqPipeStepFlush(p->pipe);
        if (gr != gvqSuccess) {
            fprintf(stderr, "gvq-train: rank %d: gvqPipeStepFlush: %s\n", wrank,
                    gvqGetErrorString(gr));
            MPI_Abort(comm, 1);
        }
        step++;
        if (wrank == S - 1 && !o->quiet)
            fprintf(out, "# the target was reached: one more step drained the pipeline (its "
                         "forwards had begun; not timed, not evaluated)\n");
    }
    int differ = R > 1 && !replicas_agree(p->net.params, p->st.ranges, p->st.nranges, p->scomm),
        anydiff = 0;
    MPI_Allreduce(&differ, &anydiff, 1, MPI_INT, MPI_MAX, comm);
    if (wrank == S - 1 && !o->quiet && R > 1)
        fprintf(out, "# replicas: %d; every stage's weights identical across its replicas: %s\n", R,
                anydiff ? "NO" : "yes");
    if (wrank == S - 1 && !o->quiet)
        fprintf(out,
                "# done: %ld steps in %.1f s of training (%.1f ms/step, %.0f img/s), test "
                "accuracy %.2f%%%s\n",
                step, res->train_s, 1000.0 * res->train_s / (double)(step > 0 ? step : 1),
                (double)p->batch * (double)step / (res->train_s > 0 ? res->train_s : 1),
                res->test_acc,
                res->time_to_stop >= 0 ? "; time to the target accuracy: reached" : "");
    print_rmse(p->pipe, S, wrank, comm, o->quiet ? NULL : out);
    res->iters = step;
    if (p->csv != NULL) fclose(p->csv);
    gvqPipeDestroy(p->pipe);
    if (p->st.replicas > 1) agg_free(&p->agg);
    gvqCommDestroy(p->gcomm);
    for (int i = 0; i < 2; i++) {
        if (p->xcomm[i] != NULL) gvqCommDestroy(p->xcomm[i]);
        if (p->xmpi[i] != MPI_COMM_NULL) MPI_Comm_free(&p->xmpi[i]);
    }
    if (p->gstage != NULL) gvqCommDestroy(p->gstage);
    MPI_Comm_free(&p->pcomm);
    MPI_Comm_free(&p->scomm);
    free(p->images), free(p->labels), free(p->perm), free(p->idx), free(p->st.velocity);
    free(p->st.acc), free(p->st.in_of), free(p->step_images), free(p->step_labels);
    free(p->st.ranges), free(p->wptr), free(p->gptr), free(p->wlen);
    net_free(&p->net);
    mnist_free(&p->train);
    mnist_free(&p->test);
    res->sync_checks = R > 1;
    res->sync_mismatches = anydiff;
    return 0;
}
