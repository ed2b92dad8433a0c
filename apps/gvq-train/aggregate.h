/*
 * aggregate.h -- how gvq-train hands its gradients to gvq: the training layer (gvq_train.h),
 * one variable per weight tensor, each made ready the moment backprop has written it (wait-free
 * backprop), or zero-code mode (one gvqAllReduce of the whole flat gradient after backprop).
 */
#ifndef GVQ_TRAIN_AGGREGATE_H_
#define GVQ_TRAIN_AGGREGATE_H_

#include "gvq.h"
#include "gvq_train.h"
#include "net.h"
#include "train.h"

/* One variable of the model: a weight tensor of a network layer. */
typedef struct {
    int id;      /* the training layer's */
    int factors; /* an fc weight handed over as sufficient factors */
    int layer;   /* the network layer it belongs to */
    int conv;    /* its index in net_t.conv (a conv weight), or -1 */
    int second;  /* a residual block's second conv (its own hand-over and wait when split) */
    int kind;    /* gvqVarKind_t */
    float *grad; /* where backprop writes its gradient */
    size_t count;
    char name[32];
} agg_var_t;

typedef struct {
    gvqComm_t comm;
    gvqTrainer_t trainer; /* NULL: zero-code mode */
    net_t *net;
    agg_var_t *vars; /* in backward order (the training layer's ids) */
    int nvars;
    gvqCompressor_t *conv_comp; /* per net_t.conv index: its compressor, or NULL */
    /* called with a network layer's index after its backward, before its gradients are handed
     * over (gradient recording reads them here) */
    void (*before_ready)(int layer, void *arg);
    void *before_ready_arg;
    double *layer_end; /* per network layer: when its backward ended in the last step */
    double backward_start;
    int batch;         /* this step's local batch (the factors' rows) */
    int factors;       /* fc weights go as sufficient factors */
    gvqResult_t error; /* the first failure of a hand-over in this step */
    int l0, l1;        /* the network layers whose weights it aggregates (a pipeline stage's) */
    /* agg_split_blocks: a block's second conv handed over and waited for on its own */
    int split;
    int waiting; /* a forward pass with agg_wait_layer's waits is running */
    void (*wait_done)(size_t off, size_t n, void *arg);
    void *wait_arg;
    gvqResult_t wait_error;
    double wait_s; /* spent in those waits since the caller zeroed it */
} agg_t;

/* The codec of a tensor as gvq names it (TRAIN_CODEC_* -> gvqCodec_t), and a compressor config
 * for a tensor: conv layers carry their [K][D][k][k] shape, an fc layer its [O][I][1][1]. */
int agg_gvq_codec(int codec);
void agg_compressor_config(const train_opts_t *o, int codec, const layer_t *l,
                           gvqCompressorConfig_t *cfg);

/* Sets up the aggregation for net over comm (collective: the layer's commit). 0, or -1 with the
 * gvq error in *res. */
int agg_setup(agg_t *a, const train_opts_t *o, net_t *net, gvqComm_t comm, gvqResult_t *res);
/* The same for network layers [l0, l1) only (a pipeline stage's, aggregated over its replicas);
 * no sufficient factors. */
int agg_setup_layers(agg_t *a, const train_opts_t *o, net_t *net, gvqComm_t comm, int l0, int l1,
                     gvqResult_t *res);
/* Hands every variable's gradient over at once (after a pipeline step), then waits like
 * agg_wait. */
gvqResult_t agg_ready_all_wait(agg_t *a);
/* Backprop of the last forward pass, handing each layer's gradients over as they are written. */
void agg_backward(agg_t *a, const float *images, int batch);
/* Waits until every gradient is aggregated (averaged) in place. */
gvqResult_t agg_wait(agg_t *a);
/* Waits until network layer `layer`'s gradients are aggregated (gvqTrainWaitVariable), calling
 * done(offset, count, arg) with each one's floats in net->grads; agg_wait still ends the step.
 * With agg_split_blocks, a block's second conv is waited for (and done) only just before its
 * forward, inside the block, while a->waiting is set. */
gvqResult_t agg_wait_layer(agg_t *a, int layer, void (*done)(size_t off, size_t n, void *arg),
                           void *arg);
/* Residual blocks' second convs on their own: handed over as soon as backprop wrote their
 * gradient (before the block's first conv), waited for just before their forward. */
void agg_split_blocks(agg_t *a, void (*done)(size_t off, size_t n, void *arg), void *arg);
/* Bytes this rank sent for variable v over the run, and whether it is a conv weight. */
unsigned long long agg_wire_bytes(const agg_t *a, int v);
void agg_free(agg_t *a);

#endif /* GVQ_TRAIN_AGGREGATE_H_ */
