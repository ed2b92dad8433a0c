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

int pipe_run(const train_opts_t *o, MPI_Comm comm, train_result_t *res) {
    int wrank = 0, nranks = 1;
    MPI_Comm_rank(comm, &wrank);
    MPI_Comm_size(comm, &nranks);
    FILE *out = o->out != NULL ? o->out : stdout;
    memset(res, 0, sizeof *res);
    res->time_to_stop = -1.0;
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
    const int S = o->stages, R = nranks / S, rank = wrank % S, replica = wrank / S;
    MPI_Comm pcomm, scomm;
    MPI_Comm_split(comm, replica, rank, &pcomm);
    MPI_Comm_split(comm, rank, replica, &scomm);
    const int M = o->micro_batches > 0 ? o->micro_batches : 4;
    const int batch = o->batch > 0 ? o->batch : 32 * nranks;
    if (batch % (M * R) != 0) {
        if (wrank == 0)
            fprintf(stderr,
                    "gvq-train: the global batch %d is not a multiple of --micro-batches "
                    "%d x %d replicas\n",
                    batch, M, R);
        MPI_Comm_free(&pcomm);
        MPI_Comm_free(&scomm);
        return -1;
    }
    const int mb = batch / (M * R);
    char err[4096] = "";
    mnist_set_t train = {0}, test = {0};
    int bad = mnist_load(&train, o->data_dir, "train", o->train_subset, err, sizeof err) != 0 ||
              mnist_load(&test, o->data_dir, "t10k", o->test_subset, err, sizeof err) != 0,
        anybad = 0;
    net_t net;
    const int capacity = mb > 100 ? mb : 100;
    int made = !bad && net_create(&net, &o->arch, 1, train.rows, train.cols, capacity, o->seed, err,
                                  sizeof err) == 0;
    int first[65];
    if (made && (S > 64 || cut_stages(&net, S, first) != 0)) {
        snprintf(err, sizeof err,
                 "the network's %d layers cannot be cut into %d stages of at least one layer",
                 net.nlayers, S);
        bad = 1;
    }
    bad |= !made;
    MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, comm); /* one failure stops every rank */
    if (anybad) {
        if (made) net_free(&net);
        MPI_Comm_free(&pcomm);
        MPI_Comm_free(&scomm);
        if (wrank == 0) fprintf(stderr, "gvq-train: %s\n", err[0] ? err : "data or model missing");
        mnist_free(&train);
        mnist_free(&test);
        return -1;
    }
    const long steps_per_epoch = train.n / batch;
    const long iters = o->iters > 0 ? o->iters : (long)o->epochs * steps_per_epoch;
    size_t img = (size_t)train.rows * (size_t)train.cols;
    size_t held =
        (size_t)(batch > capacity ? batch : capacity); /* a step, or an evaluation chunk */
    float *images = malloc(sizeof(float) * held * img);
    uint8_t *labels = malloc(held);
    int *perm = malloc(sizeof(int) * (size_t)train.n), *idx = malloc(sizeof(int) * held);
    float *velocity = calloc(net.nparams, sizeof(float)), *acc = calloc(net.nparams, sizeof(float));
    const float **in_of = calloc(2 * (size_t)M, sizeof *in_of);
    const size_t share = (size_t)(batch / R); /* a step's images on this replica */
    float *step_images = malloc(sizeof(float) * 2 * share * img); /* two steps: --no-flush */
    uint8_t *step_labels = malloc(2 * share);
    size_t(*ranges)[2] = calloc(4 * (size_t)net.nlayers + 1, sizeof *ranges);
    int nranges = 0;
    if (!images || !labels || !perm || !idx || !velocity || !acc || !in_of || !step_images ||
        !step_labels || !ranges) {
        fprintf(stderr, "gvq-train: rank %d: out of memory\n", wrank);
        MPI_Abort(comm, 1);
    }
    for (int i = first[rank]; i < first[rank + 1]; i++) { /* what this stage updates */
        float *ptr[4];
        size_t len[4];
        int n = layer_ranges(&net.layers[i], ptr, len);
        for (int r = 0; r < n; r++) {
            ranges[nranges][0] = (size_t)(ptr[r] - net.params);
            ranges[nranges][1] = ranges[nranges][0] + len[r];
            nranges++;
        }
    }
    stage_t st;
    memset(&st, 0, sizeof st);
    st.net = &net;
    st.l0 = first[rank];
    st.l1 = first[rank + 1];
    st.stage = rank;
    st.nstages = S;
    st.micro = M;
    st.mb = mb;
    st.images = step_images;
    st.labels = step_labels;
    st.share = share;
    st.ranges = ranges;
    st.nranges = nranges;
    st.in_of = in_of;
    st.acc = acc;
    st.velocity = velocity;
    st.mu = (float)o->momentum;
    st.wd = (float)o->weight_decay;
    st.replicas = R;
    st.wrank = wrank;
    /* the ranges again, as the pipe takes them: versions, predictions (one per range above) */
    float **wptr = malloc(sizeof(float *) * (size_t)(nranges + 1)),
          **gptr = malloc(sizeof(float *) * (size_t)(nranges + 1));
    size_t *wlen = malloc(sizeof(size_t) * (size_t)(nranges + 1));
    if (!wptr || !gptr || !wlen) {
        fprintf(stderr, "gvq-train: rank %d: out of memory\n", wrank);
        MPI_Abort(comm, 1);
    }
    int nw = o->pipe_schedule > 0 ? nranges : 0;
    for (int r = 0; r < nw; r++) {
        wptr[r] = net.params + ranges[r][0];
        gptr[r] = acc + ranges[r][0]; /* where backward sums the gradients */
        wlen[r] = ranges[r][1] - ranges[r][0];
    }
    gvqComm_t gcomm = NULL;
    gvqPipe_t pipe = NULL;
    gvqPipeConfig_t pc = GVQ_PIPE_CONFIG_INITIALIZER;
    pc.microBatches = M;
    static const char *const names[] = {"gpipe", "pipedream", "dualpipe", "spectrain"};
    pc.schedule = o->pipe_schedule; /* gvqPipeSchedule_t's order */
    pc.predictDistance = o->predict_distance;
    const char *sched = names[o->pipe_schedule];
    pc.weightRanges = nw;
    pc.weights = wptr;
    pc.weightCounts = wlen;
    pc.update = stage_update;
    pc.gradients = gptr;
    pc.flush = !o->pipe_no_flush;
    pc.inCount = rank == 0 ? 0 : (size_t)mb * layer_in_size(&net.layers[st.l0]);
    pc.outCount = rank == S - 1 ? 0 : (size_t)mb * layer_out_size(&net.layers[st.l1 - 1]);
    gvqComm_t gstage = NULL;
    agg_t agg; /* R > 1: the stage's weights aggregated over its replicas by the training layer */
    memset(&agg, 0, sizeof agg);
    st.agg = &agg;
    gvqResult_t gr = gvqCommInitMPI(&gcomm, pcomm, NULL);
    MPI_Comm xmpi[2] = {MPI_COMM_NULL, MPI_COMM_NULL}; /* --overlap-transfers */
    gvqComm_t xcomm[2] = {NULL, NULL};
    for (int i = 0; o->pipe_overlap && i < 2 && gr == gvqSuccess; i++) {
        MPI_Comm_dup(pcomm, &xmpi[i]);
        gr = gvqCommInitMPI(&xcomm[i], xmpi[i], NULL);
    }
    pc.forwardComm = xcomm[0];
    pc.backwardComm = xcomm[1];
    if (gr == gvqSuccess && R > 1) gr = gvqCommInitMPI(&gstage, scomm, NULL);
    if (gr == gvqSuccess && R > 1 &&
        agg_setup_layers(&agg, o, &net, gstage, st.l0, st.l1, &gr) != 0) {
        fprintf(stderr, "gvq-train: rank %d: the stage's training layer: %s\n", wrank,
                gvqGetErrorString(gr));
        MPI_Abort(comm, 1);
    }
    if (gr == gvqSuccess) gr = gvqPipeCreate(gcomm, &pc, stage_forward, stage_backward, &st, &pipe);
    if (gr != gvqSuccess) {
        fprintf(stderr, "gvq-train: rank %d: %s\n", wrank, gvqGetErrorString(gr));
        MPI_Abort(comm, 1);
    }
    if (wrank == 0 && !o->quiet) {
        fprintf(out,
                "# gvq-train: %d replica%s of a pipeline of %d stages (%s%s%s), global batch "
                "%d, %d micro-batches of %d per replica, %ld steps, lr %g%s momentum %g seed "
                "%llu\n",
                R, R > 1 ? "s" : "", S, sched, o->pipe_no_flush ? ", no flush" : "",
                o->pipe_overlap ? ", overlapped transfers" : "", batch, M, mb, iters, o->lr,
                o->cosine ? " (cosine decay)" : "", o->momentum, o->seed);
        fprintf(out, "# stages:");
        for (int k = 0; k < S; k++)
            fprintf(out, " %d: layers %d-%d%s", k, first[k], first[k + 1] - 1,
                    k + 1 < S ? "," : "\n");
        fflush(out);
    }
    FILE *csv = NULL;
    if (wrank == S - 1 && o->log_path != NULL && (csv = fopen(o->log_path, "w")) != NULL)
        fprintf(csv, "iter,epoch,time_s,loss,train_acc,test_acc,img_per_s,compute_s,comm_s,"
                     "conv_ratio,phase\n");
    double train_s = 0, win_start = now_s(), win_loss = 0, test_acc = -1;
    long win_correct = 0, win_steps = 0, pos = train.n, step;
    int epoch = 0;
    /* the step's batch in half h of the step buffers (h = step mod 2 without a flush, whose
     * step also runs the next one's first forwards: its batch is loaded a step ahead) */
    int epoch_of[2] = {0, 0}, loaded = -1;
    const int nflush = o->pipe_no_flush;
    for (step = 0; step < iters; step++) {
        for (long want = nflush && step + 1 < iters ? step + 1 : step; loaded < want;) {
            if (pos + batch > train.n) {
                train_shuffle(perm, train.n, o->seed * 1000003ull + (uint64_t)epoch + 1);
                epoch++;
                pos = 0;
            }
            loaded++;
            int h = nflush ? loaded % 2 : 0;
            mnist_batch(&train, perm + pos + (long)replica * (batch / R), batch / R,
                        step_images + (size_t)h * share * img, step_labels + (size_t)h * share);
            epoch_of[h] = epoch;
            pos += batch;
        }
        const int ep = epoch_of[nflush ? step % 2 : 0]; /* this step's epoch */
        st.loss = 0;
        st.correct = 0;
        st.lr = o->cosine ? o->lr * 0.5 *
                                (1.0 + cos(3.14159265358979323846 * (double)step / (double)iters))
                          : o->lr;
        /* SpecTrain's prediction: the layer's v is the (1 - gamma)-damped average of the
         * gradients, this SGD's velocity the undamped one (v' = mu v' + g), so a step moves the
         * weights lr v' = lr / (1 - mu) v: the rate the prediction needs */
        gr = gvqPipeSetLearningRate(pipe, (float)(st.lr / (st.mu < 1 ? 1.0 - st.mu : 1.0)));
        /* all but GPipe update inside it; without a flush the last step drains the pipeline */
        if (gr == gvqSuccess) gr = step + 1 == iters ? gvqPipeStepFlush(pipe) : gvqPipeStep(pipe);
        if (gr == gvqSuccess && o->pipe_schedule == 0) gr = stage_apply(&st);
        if (gr != gvqSuccess) {
            fprintf(stderr, "gvq-train: rank %d: gvqPipeStep: %s\n", wrank, gvqGetErrorString(gr));
            MPI_Abort(comm, 1);
        }
        win_loss += st.loss;
        win_correct += st.correct;
        win_steps++;
        int last = step + 1 == iters;
        if ((step + 1) % o->print_every != 0 && !last) continue;
        double now = now_s(), win_s = now - win_start;
        train_s += win_s;
        int evaluated = (o->eval_every > 0 && (step + 1) % o->eval_every == 0) || last;
        if (evaluated) {
            share_parameters(&net, first, S, pcomm);
            test_acc = train_evaluate(&net, &test, wrank, nranks, comm, images, labels, idx);
        }
        if (rank == S - 1) { /* the last stages saw the losses: their replicas' sum */
            double mine[2] = {win_loss, (double)win_correct}, sum[2];
            MPI_Allreduce(mine, sum, 2, MPI_DOUBLE, MPI_SUM, scomm);
            double loss = sum[0] / ((double)win_steps * R);
            double tacc = 100.0 * sum[1] / ((double)win_steps * batch);
            double ips = (double)batch * (double)win_steps / win_s;
            char accs[32] = "   -  ";
            if (evaluated) snprintf(accs, sizeof accs, "%5.2f%%", test_acc);
            if (!o->quiet && replica == 0)
                fprintf(out,
                        "epoch %2d iter %6ld  loss %.4f  train %5.2f%%  test %s  %7.0f img/s\n", ep,
                        step + 1, loss, tacc, accs, ips);
            fflush(out);
            if (csv != NULL) {
                fprintf(csv, "%ld,%d,%.4f,%.6f,%.3f,%.3f,%.1f,0,0,1,%s\n", step + 1, ep, train_s,
                        loss, tacc, evaluated ? test_acc : -1.0, ips, sched);
                fflush(csv);
            }
            res->last_loss = loss;
            if (res->first_loss == 0) res->first_loss = loss;
        }
        win_loss = 0;
        win_correct = win_steps = 0;
        res->iters = step + 1;
        int stop = o->stop_at > 0 && test_acc >= o->stop_at;
        MPI_Bcast(&stop, 1, MPI_INT, 0, comm);
        if (stop && res->time_to_stop < 0) {
            res->time_to_stop = train_s;
            step++;
            break;
        }
        win_start = now_s();
    }
    if (nflush && step < iters) {    /* stopped early: the next step's forwards are under way */
        gr = gvqPipeStepFlush(pipe); /* one more step, its batch loaded: counted, not timed */
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
    int differ = R > 1 && !replicas_agree(net.params, ranges, nranges, scomm), anydiff = 0;
    MPI_Allreduce(&differ, &anydiff, 1, MPI_INT, MPI_MAX, comm);
    if (wrank == S - 1 && !o->quiet && R > 1)
        fprintf(out, "# replicas: %d; every stage's weights identical across its replicas: %s\n", R,
                anydiff ? "NO" : "yes");
    if (wrank == S - 1 && !o->quiet)
        fprintf(out,
                "# done: %ld steps in %.1f s of training (%.1f ms/step, %.0f img/s), test "
                "accuracy %.2f%%%s\n",
                step, train_s, 1000.0 * train_s / (double)(step > 0 ? step : 1),
                (double)batch * (double)step / (train_s > 0 ? train_s : 1), test_acc,
                res->time_to_stop >= 0 ? "; time to the target accuracy: reached" : "");
    print_rmse(pipe, S, wrank, comm, o->quiet ? NULL : out);
    res->iters = step;
    res->test_acc = test_acc;
    res->train_s = train_s;
    if (csv != NULL) fclose(csv);
    gvqPipeDestroy(pipe);
    if (R > 1) agg_free(&agg);
    gvqCommDestroy(gcomm);
    for (int i = 0; i < 2; i++) {
        if (xcomm[i] != NULL) gvqCommDestroy(xcomm[i]);
        if (xmpi[i] != MPI_COMM_NULL) MPI_Comm_free(&xmpi[i]);
    }
    if (gstage != NULL) gvqCommDestroy(gstage);
    MPI_Comm_free(&pcomm);
    MPI_Comm_free(&scomm);
    free(images), free(labels), free(perm), free(idx), free(velocity), free(acc);
    free(in_of), free(step_images), free(step_labels), free(ranges);
    free(wptr), free(gptr), free(wlen);
    net_free(&net);
    mnist_free(&train);
    mnist_free(&test);
    res->sync_checks = R > 1;
    res->sync_mismatches = anydiff;
    return 0;
}
