/*
 * aggregate.c -- gvq-train's gradients into gvq (aggregate.h).
 *
 *   setup:  every weight tensor a variable of the training layer, in backward order
 *           (network layers from the last to the first): conv weights [K][D][k][k] with the
 *           --codec compressor, fc weights [O][I] with the --rest-codec one (QSGD, PowerSGD),
 *           biases and the residual blocks' scalars dense (plain, fused into buckets)
 *   a step: backprop layer L -> hand its gradients over (gvqTrainGradReady) -> backprop layer
 *           L-1 -> ... -> gvqTrainWaitAll -> the optimizer
 *
 * Zero-code mode instead runs one gvqAllReduce of the whole flat gradient after backprop (the
 * environment's GVQ_CODEC compresses it inside the library).
 */
#define _POSIX_C_SOURCE 200809L
#include "aggregate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int agg_gvq_codec(int c) {
    switch (c) {
    case TRAIN_CODEC_GRADIVEQ:
        return gvqCodecGradiveq;
    case TRAIN_CODEC_QSGD:
        return gvqCodecQsgd;
    case TRAIN_CODEC_POWERSGD:
        return gvqCodecPowersgd;
    default:
        return gvqCodecNone;
    }
}

void agg_compressor_config(const train_opts_t *o, int codec, const layer_t *l,
                           gvqCompressorConfig_t *cfg) {
    gvqCompressorConfig_t c = GVQ_COMPRESSOR_CONFIG_INITIALIZER;
    c.codec = agg_gvq_codec(codec);
    if (l != NULL && l->kind == LAYER_FC) {
        c.filters = l->out_c;
        c.depth = (int)layer_in_size(l);
        c.height = c.width = 1;
    } else if (l != NULL) {
        c.filters = l->out_c;
        c.depth = l->in_c;
        c.height = l->ksize;
        c.width = l->ksize;
        if (o->slice != TRAIN_UNSET) {
            /* --slice is rounded up to a multiple of K and capped at the tensor */
            int K = l->out_c;
            long L = ((long)o->slice + K - 1) / K * K;
            if (L > (long)l->nw) L = (long)l->nw;
            c.sliceSize = (int)L;
        }
    }
    if (o->reuse != TRAIN_UNSET) c.reuse = o->reuse;
    if (o->sample_slices != TRAIN_UNSET) c.sampleSlices = o->sample_slices;
    if (o->eps > 0.0) c.lossThreshold = (float)o->eps;
    if (o->vote > 0.0) c.voteThreshold = (float)o->vote;
    if (o->warmup != TRAIN_UNSET) c.warmupIters = o->warmup;
    if (o->sample != TRAIN_UNSET) c.sampleIters = o->sample;
    if (o->compressed != TRAIN_UNSET) c.compressedIters = o->compressed;
    if (o->sample_codec != TRAIN_UNSET)
        c.sampleCodec = o->sample_codec == TRAIN_CODEC_QSGD ? gvqCodecQsgd : gvqCodecNone;
    if (o->qsgd_bits != TRAIN_UNSET) c.qsgdBits = o->qsgd_bits;
    if (o->qsgd_bucket != TRAIN_UNSET) c.qsgdBucket = o->qsgd_bucket;
    if (o->wire_fp16) c.wireType = gvqFloat16;
    if (o->error_feedback != TRAIN_UNSET) c.errorFeedback = o->error_feedback;
    if (o->max_dims != TRAIN_UNSET) c.maxDims = o->max_dims;
    if (o->power_rank != TRAIN_UNSET) c.powerRank = o->power_rank;
    if (o->basis_track && c.codec == gvqCodecGradiveq) c.basisUpdate = gvqBasisTrack;
    if (o->integer_bits != TRAIN_UNSET) c.integerBits = o->integer_bits;
    if (o->ef_bound >= 0.0) c.efBound = (float)o->ef_bound;
    c.seed = (int)(o->seed & 0x7fffffff);
    *cfg = c;
}

/* ---- the model's variables ----------------------------------------------------------------- */

static int conv_index(const net_t *net, const layer_t *l) {
    for (int i = 0; i < net->nconv; i++)
        if (net->conv[i] == l) return i;
    return -1;
}

static void add_var(agg_t *a, int layer, int conv, int kind, float *grad, size_t count,
                    const char *fmt, int n) {
    agg_var_t *v = &a->vars[a->nvars++];
    v->id = -1;
    v->second = 0;
    v->layer = layer;
    v->conv = conv;
    v->kind = kind;
    v->grad = grad;
    v->count = count;
    snprintf(v->name, sizeof v->name, fmt, n);
}

/* A conv layer's weight and bias (the bias of the convs inside blocks is NULL). */
static void add_conv(agg_t *a, int layer, const layer_t *l) {
    int c = conv_index(a->net, l);
    add_var(a, layer, c, gvqVarConv, l->dw, l->nw, "conv%d.w", c + 1);
    if (l->db != NULL && l->nb > 0)
        add_var(a, layer, -1, gvqVarDense, l->db, l->nb, "conv%d.b", c + 1);
}

/* Every weight tensor, network layers from the last to the first. */
static void list_vars(agg_t *a) {
    net_t *net = a->net;
    for (int i = a->l1 - 1; i >= a->l0; i--) {
        layer_t *l = &net->layers[i];
        if (l->kind == LAYER_CONV) {
            add_conv(a, i, l);
        } else if (l->kind == LAYER_FC) {
            add_var(a, i, -1, gvqVarFc, l->dw, l->nw, "fc%d.w", i);
            add_var(a, i, -1, gvqVarDense, l->db, l->nb, "fc%d.b", i);
        } else if (l->kind == LAYER_BLOCK) {
            add_conv(a, i, &l->sub[1]);
            a->vars[a->nvars - 1].second = 1;
            add_conv(a, i, &l->sub[0]);
            add_var(a, i, -1, gvqVarDense, l->db, l->nb, "block%d.s", i);
        }
    }
}

/* The layer of network layer li that variable v's shape describes. */
static const layer_t *var_layer(const agg_t *a, const agg_var_t *v) {
    return v->conv >= 0 ? a->net->conv[v->conv] : &a->net->layers[v->layer];
}

/* The variable's stream number: its network layer's index and its place among that layer's
 * variables (at most 5), so that a pipeline stage's variables get the numbers they have in the
 * whole network. */
static uint32_t var_stream(const agg_t *a, const agg_var_t *v) {
    uint32_t k = 0;
    for (const agg_var_t *u = a->vars; u < v; u++)
        k += u->layer == v->layer;
    return (uint32_t)v->layer * 8u + k;
}

static gvqResult_t register_var(agg_t *a, const train_opts_t *o, agg_var_t *v) {
    const layer_t *l = var_layer(a, v);
    gvqVariable_t var = GVQ_VARIABLE_INITIALIZER;
    gvqCompressorConfig_t cc;
    var.name = v->name;
    var.kind = v->kind;
    int codec = TRAIN_CODEC_NONE;
    if (v->kind == gvqVarConv) {
        var.shape[0] = l->out_c;
        var.shape[1] = l->in_c;
        var.shape[2] = var.shape[3] = l->ksize;
        codec = o->codec;
    } else if (v->kind == gvqVarFc) {
        var.shape[0] = l->out_c;
        var.shape[1] = (int)layer_in_size(l);
        codec = o->rest_codec;
        var.factors = v->factors = a->factors;
    } else {
        var.shape[0] = (int)v->count;
    }
    if (codec != TRAIN_CODEC_NONE) {
        agg_compressor_config(o, codec, l, &cc);
        /* a random stream per tensor (QSGD's rounding, the integer wire's, the first Q), from
         * --seed and the variable's place, the same on every rank: with --seed alone every
         * layer rounded its element e with the same draw (until 2026-11-29) */
        cc.seed = (int)(((uint32_t)o->seed * 1000003u + var_stream(a, v)) & 0x7fffffff);
        var.compressor = &cc;
    }
    return gvqTrainAddVariable(a->trainer, &var, &v->id);
}

int agg_setup(agg_t *a, const train_opts_t *o, net_t *net, gvqComm_t comm, gvqResult_t *res) {
    return agg_setup_layers(a, o, net, comm, 0, net->nlayers, res);
}

int agg_setup_layers(agg_t *a, const train_opts_t *o, net_t *net, gvqComm_t comm, int l0, int l1,
                     gvqResult_t *res) {
    memset(a, 0, sizeof *a);
    a->comm = comm;
    a->net = net;
    a->l0 = l0;
    a->l1 = l1;
    a->vars = calloc(4 * (size_t)net->nlayers + 4, sizeof *a->vars);
    a->layer_end = calloc((size_t)net->nlayers, sizeof *a->layer_end);
    a->conv_comp = calloc((size_t)net->nconv + 1, sizeof *a->conv_comp);
    *res = gvqSystemError;
    if (a->vars == NULL || a->layer_end == NULL || a->conv_comp == NULL) return -1;
    list_vars(a);
    if (o->zero_code) {
        *res = gvqSuccess;
        return 0;
    }
    gvqTrainConfig_t cfg = GVQ_TRAIN_CONFIG_INITIALIZER;
    if (o->bucket_bytes != TRAIN_UNSET) cfg.bucketBytes = o->bucket_bytes;
    cfg.waitFree = o->no_wait_free ? 0 : 1;
    cfg.schedule = o->comm_order != TRAIN_UNSET ? o->comm_order
                   : o->overlap_forward         ? gvqTrainScheduleForward
                                                : gvqTrainScheduleReady;
    if (o->chunk_bytes != TRAIN_UNSET) cfg.chunkBytes = o->chunk_bytes;
    cfg.op = gvqAvg;
    a->factors = o->sfb != TRAIN_UNSET && l0 == 0 && l1 == net->nlayers;
    if (a->factors) cfg.sfb = o->sfb == 2 ? GVQ_CONFIG_UNDEF_INT : o->sfb;
    if ((*res = gvqTrainCreate(comm, &cfg, &a->trainer)) != gvqSuccess) return -1;
    for (int v = 0; v < a->nvars; v++)
        if ((*res = register_var(a, o, &a->vars[v])) != gvqSuccess) return -1;
    if ((*res = gvqTrainCommit(a->trainer)) != gvqSuccess) return -1;
    for (int v = 0; v < a->nvars; v++)
        if (a->vars[v].conv >= 0)
            gvqTrainGetCompressor(a->trainer, a->vars[v].id, &a->conv_comp[a->vars[v].conv]);
    return 0;
}

/* ---- a step -------------------------------------------------------------------------------- */

static void layer_done(int layer, const float *in, const float *dout_next, void *arg) {
    agg_t *a = arg;
    a->layer_end[layer] = now_s();
    if (a->before_ready != NULL) a->before_ready(layer, a->before_ready_arg);
    if (a->trainer == NULL) return;
    for (int v = 0; v < a->nvars; v++) {
        if (a->vars[v].layer != layer || (a->split && a->vars[v].second)) continue;
        gvqResult_t res = a->vars[v].factors /* u_j: the error at the outputs, v_j: the input */
                              ? gvqTrainFactorsReady(a->trainer, a->vars[v].id, dout_next, in,
                                                     a->batch, a->vars[v].grad)
                              : gvqTrainGradReady(a->trainer, a->vars[v].id, a->vars[v].grad);
        if (res != gvqSuccess && a->error == gvqSuccess) a->error = res;
    }
}

void agg_backward(agg_t *a, const float *images, int batch) {
    a->backward_start = now_s();
    a->batch = batch;
    net_backward_each(a->net, images, batch, layer_done, a);
}

gvqResult_t agg_wait(agg_t *a) {
    if (a->trainer == NULL)
        return gvqAllReduce(a->net->grads, a->net->grads, a->net->nparams, gvqFloat32, gvqAvg,
                            a->comm, NULL);
    gvqResult_t res = gvqTrainWaitAll(a->trainer);
    if (res == gvqSuccess) res = a->error;
    a->error = gvqSuccess;
    return res;
}

/* A block's hook: its second conv's gradient written (phase 1: hand it over), or its forward
 * about to run (phase 0: wait for it, then done). */
static void block_hook(int layer, int phase, void *arg) {
    agg_t *a = arg;
    for (int v = 0; v < a->nvars; v++) {
        if (a->vars[v].layer != layer || !a->vars[v].second) continue;
        gvqResult_t res = gvqSuccess;
        if (phase == 1) {
            res = gvqTrainGradReady(a->trainer, a->vars[v].id, a->vars[v].grad);
            if (res != gvqSuccess && a->error == gvqSuccess) a->error = res;
        } else if (a->waiting && a->wait_error == gvqSuccess) {
            double t0 = now_s();
            res = gvqTrainWaitVariable(a->trainer, a->vars[v].id);
            a->wait_s += now_s() - t0;
            if (res == gvqSuccess)
                a->wait_done((size_t)(a->vars[v].grad - a->net->grads), a->vars[v].count,
                             a->wait_arg);
            else
                a->wait_error = res;
        }
    }
}

void agg_split_blocks(agg_t *a, void (*done)(size_t off, size_t n, void *arg), void *arg) {
    if (a->trainer == NULL) return;
    a->split = 1;
    a->wait_done = done;
    a->wait_arg = arg;
    for (int i = a->l0; i < a->l1; i++) {
        layer_t *l = &a->net->layers[i];
        if (l->kind != LAYER_BLOCK) continue;
        l->hook = block_hook;
        l->hook_arg = a;
    }
}

gvqResult_t agg_wait_layer(agg_t *a, int layer, void (*done)(size_t off, size_t n, void *arg),
                           void *arg) {
    for (int v = 0; v < a->nvars; v++) {
        if (a->vars[v].layer != layer || (a->split && a->vars[v].second)) continue;
        gvqResult_t res = gvqTrainWaitVariable(a->trainer, a->vars[v].id);
        if (res != gvqSuccess) return res;
        done((size_t)(a->vars[v].grad - a->net->grads), a->vars[v].count, arg);
    }
    return gvqSuccess;
}

gvqResult_t agg_ready_all_wait(agg_t *a) {
    if (a->trainer == NULL) return gvqInvalidUsage; /* zero-code mode is not for stages */
    for (int v = 0; v < a->nvars; v++) {
        gvqResult_t res = gvqTrainGradReady(a->trainer, a->vars[v].id, a->vars[v].grad);
        if (res != gvqSuccess && a->error == gvqSuccess) a->error = res;
    }
    return agg_wait(a);
}

unsigned long long agg_wire_bytes(const agg_t *a, int v) {
    gvqTrainVariableInfo_t info;
    if (a->trainer == NULL || gvqTrainGetVariableInfo(a->trainer, a->vars[v].id, &info) != 0)
        return 0;
    return info.wireBytes;
}

void agg_free(agg_t *a) {
    if (a->trainer != NULL) gvqTrainDestroy(a->trainer);
    free(a->vars);
    free(a->layer_end);
    free(a->conv_comp);
    memset(a, 0, sizeof *a);
}
