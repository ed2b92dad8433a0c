/*
 * gvq_train.h -- the training layer: a model registers its variables once, says when each
 * gradient is ready during backprop, and waits for all of them before the optimizer step. The
 * layer routes every variable to the right collective, fuses small tensors into buckets, owns
 * the compressors and runs the aggregation on a host stream of its own, so that a variable's
 * gradient travels while backprop of the layers below goes on (Poseidon's wait-free
 * backpropagation). Host buffers of gvqFloat32.
 *
 *   setup:  gvqTrainCreate -> gvqTrainAddVariable (every variable, in backward order)
 *           -> gvqTrainCommit (collective: every rank registered the same variables; routes
 *              decided, compressors and buckets made, the routing table logged at INFO)
 *   a step: backprop of the top layer -> gvqTrainGradReady(top variables) -> backprop of the
 *           next ... -> gvqTrainWaitAll -> the optimizer reads the aggregated gradients
 *   or, with schedule gvqTrainScheduleForward: ... -> the next step's forward pass, each layer
 *           after gvqTrainWaitVariable(its variables) and its update -> gvqTrainWaitAll
 *
 * Routes (gvqTrainGetVariableInfo says which and why):
 *   conv weight [K][D][H][W]   its own compressor when the variable or config names one
 *                              (GradiVeQ, QSGD, PowerSGD), else as dense
 *   fc weight M x N            likewise (PowerSGD sees the M x N matrix), else as dense; given
 *                              as per-sample factors, sufficient-factor broadcasting when it
 *                              sends fewer bytes (SACP, per step)
 *   dense (bias, other)        fused into a bucket of about bucketBytes with the neighbouring
 *                              small plain tensors; a tensor of bucketBytes or more alone
 * A bucket is sent when its last member is ready. Every rank must make the same calls in the same
 * order (NCCL's rule): the same variables, each ready once per step, then gvqTrainWaitAll.
 * Between gvqTrainGradReady and the end of gvqTrainWaitAll the gradient buffer belongs to the
 * layer (do not read or write it); after it, it holds the sum, or the average with gvqAvg,
 * bitwise identical on every rank. The layer's stream needs MPI_THREAD_MULTIPLE; below it the
 * aggregations run at once on the caller's thread (a WARN at commit says so): correct, without
 * overlap.
 */
#ifndef GVQ_TRAIN_H_
#define GVQ_TRAIN_H_

#include "gvq.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gvqTrainer *gvqTrainer_t;

/* clang-format off */
typedef enum {
    gvqVarConv   = 0, /* conv weight, shape K, D, H, W */
    gvqVarFc     = 1, /* fully connected weight, shape M (outputs), N (inputs) */
    gvqVarDense  = 2, /* anything else dense (biases, scalars), shape: count */
    gvqVarSparse = 3  /* rows x dim table whose steps touch few rows (embeddings), shape: rows,
                         dim; its values live in the layer (gvqTrainSparseLookup) */
} gvqVarKind_t;

typedef enum {
    gvqRouteAllReduce  = 0, /* alone, plain allreduce */
    gvqRouteBucket     = 1, /* fused with other small tensors, plain allreduce */
    gvqRouteCompressed = 2, /* alone, through its own compressor */
    gvqRouteSfb        = 3, /* sufficient factors: every rank's u_j, v_j gathered, the sum
                               rebuilt on every rank (Poseidon) */
    gvqRoutePs         = 4, /* sparse: the layer's parameter server, rows sharded over the
                               ranks, pushed and pulled (Parallax) */
    gvqRouteAllGatherv = 5  /* sparse: every rank's rows gathered, every rank updates its copy
                               of the table (a sparse variable on gvqRouteAllReduce: the whole
                               table's gradient allreduced, the dense baseline) */
} gvqRoute_t;

typedef enum {
    gvqTrainScheduleReady   = 0, /* issued as they become ready (backward order) */
    gvqTrainScheduleForward = 1  /* negotiated: first what the next forward needs first */
} gvqTrainSchedule_t;
/* clang-format on */

#define GVQ_TRAIN_CONFIG_MAGIC 0x67767154u /* 'gvqT' */
#define GVQ_VARIABLE_MAGIC 0x67767156u     /* 'gvqV' */

/* Versioned layer configuration (GVQ_TRAIN_CONFIG_INITIALIZER; unset fields in brackets). */
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int bucketBytes; /* plain tensors smaller than this are fused into buckets of up to this
                        size; 0: no fusion [GVQ_TRAIN_BUCKET_BYTES or 262144] */
    int waitFree;    /* 1: a variable's aggregation starts when it is ready (wait-free
                        backprop); 0: every aggregation starts at gvqTrainWaitAll, one after the
                        other (backprop, then aggregate) [1] */
    int op;          /* gvqAvg or gvqSum [gvqAvg] */
    const gvqCompressorConfig_t
        *convCompressor;                       /* conv weights without their own: this config,
                                                  the shape filled in by the layer [NULL: plain] */
    const gvqCompressorConfig_t *fcCompressor; /* fc weights likewise [NULL: plain] */
    int sfb;         /* variables whose gradients come as factors (gvqTrainFactorsReady): 1 always
                        sufficient-factor broadcasting, 0 never (the full matrix), or
                        GVQ_CONFIG_UNDEF_INT: SACP, per step, whichever sends fewer bytes [SACP] */
    int sparseRoute; /* sparse variables: gvqRoutePs, gvqRouteAllGatherv or gvqRouteAllReduce,
                        or GVQ_CONFIG_UNDEF_INT: Parallax's rule at the first step, from the
                        largest share of rows a rank touched (alpha) and the rank count N --
                        bytes per rank: PS 4 alpha w (N-1)/N, allgatherv 2 alpha w (N-1),
                        dense 4 w (N-1)/N [the rule] */
    int tunePartitions; /* 1: a sparse variable routed to the parameter server first runs
                           Parallax's partition tuner (gvqPsTunePartitions, 20 steps per sample
                           on its first step's rows) and shards its table over the P chosen;
                           0: one partition per rank [1] */
    int schedule;       /* the order of the step's aggregations, the same on every rank:
                           gvqTrainScheduleReady: each when it is ready, in registration order;
                           gvqTrainScheduleForward (with waitFree): the ranks agree on the order
                           as the step goes (each chunk's allreduce carries every rank's ready
                           flags) and send first what the next forward pass needs first (the
                           latest-registered variable), so that a trainer waiting per variable
                           (gvqTrainWaitVariable) runs its next forward beside this step's
                           transfers. From a step's first hand-over to gvqTrainWaitAll the
                           layer's communicator is busy with the step: make no blocking call on
                           it (give the layer a communicator of its own). A layer with sparse
                           variables keeps the ready schedule [gvqTrainScheduleReady] */
    int chunkBytes;     /* gvqTrainScheduleForward: plain aggregations longer than this are cut into
                           chunks of about this size, so that a tensor the forward pass needs
                           earlier can pass a long one [65536] */
} gvqTrainConfig_t;

#define GVQ_TRAIN_CONFIG_INITIALIZER                                                               \
    {                                                                                              \
        sizeof(gvqTrainConfig_t), GVQ_TRAIN_CONFIG_MAGIC, GVQ_VERSION, GVQ_CONFIG_UNDEF_INT,       \
            GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT, NULL, NULL, GVQ_CONFIG_UNDEF_INT,          \
            GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT, GVQ_CONFIG_UNDEF_INT \
    }

/* One variable (GVQ_VARIABLE_INITIALIZER). */
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    const char *name; /* for the routing table (copied, up to 63 bytes) */
    int kind;         /* gvqVarKind_t */
    int shape[4];     /* conv: K, D, H, W; fc: M, N; dense: the count in shape[0] */
    const gvqCompressorConfig_t *compressor; /* this variable's codec, the shape filled in by the
                                                layer (codec gvqCodecNone: plain); NULL: the
                                                config's for its kind */
    int factors;                 /* fc only: 1 when its gradient comes as per-sample factors
                                    (gvqTrainFactorsReady); such a variable is never fused into a bucket [0] */
    const gvqPsConfig_t *sparse; /* sparse only: initial values and update rule (rule,
                                    learningRate, momentum, adagradInit, epsilon, average, init,
                                    initScale, seed, initValues, partitions), the same on every
                                    route; NULL: the defaults (SGD, lr 0.01, zeros) */
} gvqVariable_t;

#define GVQ_VARIABLE_INITIALIZER                                                            \
    {                                                                                       \
        sizeof(gvqVariable_t), GVQ_VARIABLE_MAGIC, GVQ_VERSION, NULL, GVQ_CONFIG_UNDEF_INT, \
            {0, 0, 0, 0}, NULL, 0, NULL                                                     \
    }

/* What the layer decided for a variable, and its last step. Times are CLOCK_MONOTONIC seconds
 * (0: did not happen in the last step). */
typedef struct {
    char name[64];
    int kind;     /* gvqVarKind_t */
    size_t count; /* floats */
    int route;    /* gvqRoute_t */
    int bucket;   /* the bucket (route gvqRouteBucket), else -1 */
    int codec;    /* gvqCodec_t of its compressor (gvqCodecNone when plain) */
    char why[96]; /* the reason for the route */
    double readyTime, startTime, endTime; /* gvqTrainGradReady; its (bucket's) aggregation */
    unsigned long long wireBytes;         /* bytes this rank sent for it, all steps (compressed: the
                                             compressor's count; plain: the ring's 2(n-1)/n per call;
                                             a bucket's member: its share) */
    long long steps;                      /* steps aggregated */
} gvqTrainVariableInfo_t;

/* Makes a training layer over comm (local). Errors: gvqInvalidArgument (bad comm, NULL, a bad
 * config field, named in the WARN), gvqSystemError. */
GVQ_API gvqResult_t gvqTrainCreate(gvqComm_t comm, const gvqTrainConfig_t *config,
                                   gvqTrainer_t *trainer);

/* Registers a variable (before gvqTrainCommit, in backward order: the order its gradient
 * becomes ready); *id receives its number (0, 1, ...). Errors: gvqInvalidArgument (bad
 * kind or shape, a compressor config the shape does not allow), gvqInvalidUsage (after commit). */
GVQ_API gvqResult_t gvqTrainAddVariable(gvqTrainer_t trainer, const gvqVariable_t *variable,
                                        int *id);

/* Decides the routes, makes the compressors and buckets. Collective: every rank must have
 * registered the same variables (checked: otherwise gvqInvalidArgument on every rank, naming
 * the first that differs on this rank). Errors: as above, gvqInvalidUsage (twice), and the
 * errors of a collective. */
GVQ_API gvqResult_t gvqTrainCommit(gvqTrainer_t trainer);

/* The gradient of variable id (count floats at grad) is ready: its aggregation starts (with
 * waitFree; a bucket's when its last member is ready). Returns at once. Errors:
 * gvqInvalidArgument (bad id, NULL grad), gvqInvalidUsage (before commit; ready twice in one
 * step), and refusals of the queued call. */
GVQ_API gvqResult_t gvqTrainGradReady(gvqTrainer_t trainer, int id, float *grad);

/* Sufficient factors (Poseidon): instead of the M x N gradient of fc variable id (registered
 * with `factors`), this rank's `batch` per-sample factors, u (batch x M, row j = u_j: the error
 * backpropagated to the layer's outputs) and v (batch x N, row j = v_j: the layer's input), whose
 * gradient is sum_j u_j v_j^T; grad (M x N floats, row-major) receives the aggregated gradient
 * (the sum over all ranks, or its average). The layer picks the cheaper exchange per step by
 * SACP (config sfb): the full matrix (built here, then allreduced: 2(P-1)/P MN floats per rank)
 * or the factors (allgathered: (P-1) b (M+N) floats per rank, the sum rebuilt on every rank by
 * one gemm); both give the same gradient up to float summation order, bitwise identical on every
 * rank. u, v and grad belong to the layer until gvqTrainWaitAll returns. Every rank must pass the
 * same batch. A variable with a compressor always takes the full matrix through it. Errors: as
 * gvqTrainGradReady, plus gvqInvalidArgument (not an fc variable registered with factors, NULL
 * factors, batch < 1). */
GVQ_API gvqResult_t gvqTrainFactorsReady(gvqTrainer_t trainer, int id, const float *u,
                                         const float *v, int batch, float *grad);

/* Sparse variable id's current rows: values + i*dim receives row indices[i] (duplicates
 * allowed). Blocking; collective on the parameter-server route (every rank calls it, in the same
 * order of calls). Call it between steps, or before the variable's gvqTrainSparseReady. Errors:
 * gvqInvalidArgument (not a sparse variable, NULL with n > 0, an index outside [0, rows): values
 * not written), and the errors of a collective. */
GVQ_API gvqResult_t gvqTrainSparseLookup(gvqTrainer_t trainer, int id, const int64_t *indices,
                                         size_t n, float *values);

/* The gradient of sparse variable id: grads + i*dim is the gradient of row indices[i]
 * (duplicates are summed). Its aggregation starts at once (any waitFree); gvqTrainWaitAll waits
 * for it and applies the variable's rule to the rows any rank touched, the same on every route
 * (lazily: rows nobody touched stay as they are). indices and grads belong to the layer until
 * gvqTrainWaitAll returns. The first call decides the route (config sparseRoute), collectively:
 * every rank must make it. Errors: as gvqTrainGradReady; an index outside [0, rows) is refused
 * on every rank at the wait (no row changes). */
GVQ_API gvqResult_t gvqTrainSparseReady(gvqTrainer_t trainer, int id, const int64_t *indices,
                                        const float *grads, size_t n);

/* Starts what has not started and waits until every gradient of the step is aggregated, in its
 * buffer. Every variable must have been made ready in this step: a missing one is reported
 * (gvqInvalidUsage, naming it) after the rest completed here, and the other ranks' calls for it
 * fail by the communicator's timeout. Errors: that, and the first error of the step's calls. */
GVQ_API gvqResult_t gvqTrainWaitAll(gvqTrainer_t trainer);

/* Waits until variable id's aggregation of this step is done (its bucket's, all its chunks'),
 * without waiting for the others: a trainer that waits per layer, and updates that layer, just
 * before the layer's forward pass of the next step overlaps that forward pass with the
 * aggregations still running (best with schedule gvqTrainScheduleForward). gvqTrainWaitAll still
 * ends the step, before the next gradient is ready. Errors: gvqInvalidArgument (bad id),
 * gvqInvalidUsage (before commit; without waitFree; not ready in this step; a sparse variable,
 * which gvqTrainWaitAll completes; a step another rank ended without one of its variables), and
 * the first error of the step's calls up to it. */
GVQ_API gvqResult_t gvqTrainWaitVariable(gvqTrainer_t trainer, int id);

/* The routing decision and last-step timeline of variable id. Errors: gvqInvalidArgument,
 * gvqInvalidUsage (a compressed variable while a negotiated step is open: its byte count waits
 * for the step). */
GVQ_API gvqResult_t gvqTrainGetVariableInfo(gvqTrainer_t trainer, int id,
                                            gvqTrainVariableInfo_t *info);

/* Variables registered so far. Errors: gvqInvalidArgument. */
GVQ_API gvqResult_t gvqTrainGetVariableCount(gvqTrainer_t trainer, int *count);

/* The compressor the layer made for variable id, or NULL (*compressor) when it goes plain: for
 * its stats, and to save and load its state. Errors: gvqInvalidArgument. */
GVQ_API gvqResult_t gvqTrainGetCompressor(gvqTrainer_t trainer, int id,
                                          gvqCompressor_t *compressor);

/* The layer's communication state (every compressor's state, the per-variable counters; the
 * routes follow from the variables and config, and are checked on load), so that a resumed run
 * continues exactly. Between steps, after gvqTrainCommit. A sparse variable's part is its table
 * (and the rule's state), or on the parameter-server route this rank's shards: loading that
 * into a layer whose route is not decided yet makes the server, so then every rank loads at the
 * same call (collective). Save with buf NULL writes the
 * size needed to *size. Load, into a layer made with the same variables and config, is all or
 * nothing. Errors: gvqInvalidUsage (before commit, inside a step), gvqInvalidArgument (buffer
 * too small; a state that is corrupted, of other variables or another config: nothing changes),
 * gvqSystemError (file I/O). Local. */
GVQ_API gvqResult_t gvqTrainSave(gvqTrainer_t trainer, void *buf, size_t *size);
GVQ_API gvqResult_t gvqTrainLoad(gvqTrainer_t trainer, const void *buf, size_t size);
/* The same for a rank that joins (gvqCommGrow): another rank's saved state, of which each
 * compressor takes the part every rank holds alike (gvqCompressorLoadShared: phase, counters,
 * basis; its error-feedback residual starts at zero), with the per-variable counters. A state
 * that holds a sparse variable's table or shards is refused (gvqInvalidUsage: they are their
 * ranks' own). Local; the same checks and errors as gvqTrainLoad otherwise. */
GVQ_API gvqResult_t gvqTrainLoadShared(gvqTrainer_t trainer, const void *buf, size_t size);
GVQ_API gvqResult_t gvqTrainSaveFile(gvqTrainer_t trainer, const char *path);
GVQ_API gvqResult_t gvqTrainLoadFile(gvqTrainer_t trainer, const char *path);

/* Waits for the layer's work, then frees it with its compressors and stream. Local. Errors:
 * gvqInvalidArgument, and an unreported error of the last step. */
GVQ_API gvqResult_t gvqTrainDestroy(gvqTrainer_t trainer);

/* ---------------------------------------------------------------------------------------------
 * Pipeline model parallelism (docs/ALGORITHMS.md section 6). The model is cut into S consecutive
 * stages, one per rank of a pipeline communicator (stage k = rank k); a mini-batch is cut into M
 * micro-batches; activations travel forward and errors backward with gvqSend/gvqRecv. The layer
 * runs the schedule; the trainer gives each stage's forward and backward of one micro-batch.
 *
 *   gvqPipeGpipe (synchronous, a flush per mini-batch; GPipe), stage k, one gvqPipeStep:
 *     for m = 0 .. M-1:   in_m <- stage k-1;   forward(m, in_m, out_m);   out_m -> stage k+1
 *     for m = M-1 .. 0:   dout <- stage k+1;   backward(m, dout, din);    din -> stage k-1
 *   then the stage's weight gradients (accumulated by its backward over the M micro-batches) are
 *   the mini-batch's; the trainer applies them (aggregated over replicas first, if any, e.g.
 *   through a gvqTrainer on a communicator per stage). No staleness; bubbles of (S-1)/(M+S-1).
 *
 *   gvqPipePipedream (PipeDream: one forward, one backward, with weight stashing), stage k of S,
 *   w = min(S - k - 1, M) warm-up forwards:
 *     F(0) .. F(w-1);  then for i = 0 .. M-w-1:  F(w+i), B(i);  then B(M-w) .. B(M-1)
 *   every B(m) is followed by update(m): the stage's weights change after every micro-batch.
 *   Weight stashing: F(m) runs on the current weights and the layer keeps a copy of them; B(m)
 *   runs on that copy (the version F(m) saw), then the current weights come back for update(m).
 *   Stage k keeps up to w + 1 = S - k versions. The step ends with every micro-batch's backward
 *   done (a flush). A forward's send and the next backward's receive (and a backward's send and
 *   the next forward's receive) go in one group, so no two neighbours wait on each other's send.
 *
 *   gvqPipeDualpipe and gvqPipeSpectrain (SpecTrain, Chen et al.): the same order of tasks, the
 *   forward and backward of a time unit on the same weights, the update after both. DualPipe
 *   runs both on the current (stale) weights. SpecTrain predicts the weights a micro-batch will
 *   meet: with v the momentum-smoothed gradient (v <- gamma v + (1 - gamma) g after every
 *   backward) and lr the step's learning rate, the forward at stage k of N runs on
 *   W - s lr v with s = 2N - k - 2, the backward with s = k (docs/ALGORITHMS.md section 6; k counts
 *   from 0 here; predictDistance gvqPredictSchedule: the schedule's own distances), and the
 *   current weights come back for the update.
 *
 *   Without a flush (config flush = 0; PipeDream, DualPipe, SpecTrain): the pipeline never
 *   drains between steps, as PipeDream's and SpecTrain's papers run it. A step's call still
 *   finishes its own M micro-batches' backwards on this stage, but its last w units also start
 *   the forwards of the next step's first w micro-batches (stage k: w = S - k - 1), so stage 0's
 *   forward needs the next step's data during this step's call. Micro-batches are then numbered
 *   across steps: the callbacks get micro = g mod 2M for the g-th micro-batch since the pipe's
 *   creation (step g / M, index g mod M in it). The paper's version distances hold there
 *   (gvqPredictSchedule becomes s = w forward, 0 backward). gvqPipeStepFlush runs a step that
 *   starts no forward of the next one: the last step before a checkpoint, an evaluation that
 *   needs every update made, or gvqPipeDestroy.
 *
 *   Overlapped transfers (config forwardComm and backwardComm, two more communicators over the
 *   same ranks in the same order, used by nothing else while the pipe lives): activations
 *   travel on forwardComm and errors on backwardComm, each from a host stream of the pipe; a
 *   task's output leaves with the receive of the next task's input, while the stage computes,
 *   instead of blocking it. With GVQ_PIPE_LINKS=1 (MPI and UCX transports) the pipe splits
 *   from them a communicator per link and direction, each with a stream of its own, so that a
 *   send waits only for its receiver, never behind a receive from the other side (destroyed
 *   with the pipe, aborted when a step fails). Without them, transfers block
 *   between the tasks (a send goes with the next task's receive in one group, so neighbours
 *   never wait on each other's send).
 * ------------------------------------------------------------------------------------------ */

typedef struct gvqPipe *gvqPipe_t;

/* clang-format off */
typedef enum {
    gvqPipeGpipe     = 0, /* synchronous, flush per mini-batch */
    gvqPipePipedream = 1, /* one-forward-one-backward, weights updated after every micro-batch,
                             with weight stashing (below) */
    gvqPipeDualpipe  = 2, /* the same order, no stashing: every forward and backward on the
                             current weights (stale by up to S-k-1 updates), the update after
                             both tasks of a time unit (SpecTrain's DualPipe without prediction) */
    gvqPipeSpectrain = 3  /* DualPipe with SpecTrain's weight prediction (below) */
} gvqPipeSchedule_t;
/* clang-format on */

#define GVQ_PIPE_CONFIG_MAGIC 0x6776714cu /* 'gvqL' */

/* SpecTrain's version distance s (the weights are predicted s updates ahead). */
typedef enum {
    gvqPredictPaper = 0,   /* the paper's (docs/ALGORITHMS.md section 6): forward at stage k of N
                              s = 2N - k - 2, backward s = k: the version at the end of the
                              round trip of a pipeline that never flushes */
    gvqPredictSchedule = 1 /* this layer's schedule, which flushes every step: the forward of
                              micro-batch m at stage k predicts the weights its own backward
                              will run on, s = min(m, w) updates ahead (w = min(N - k - 1, M)
                              forwards in flight), the backward runs on the current weights */
} gvqPipePredictDistance_t;

/* Versioned pipeline configuration of this rank's stage (GVQ_PIPE_CONFIG_INITIALIZER). A config
 * of the layout before flush, forwardComm and backwardComm (its size ends after
 * predictDistance) is still accepted, those at their defaults. */
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int microBatches; /* M per mini-batch, the same on every stage [1] */
    int schedule;     /* gvqPipeSchedule_t, the same on every stage [gvqPipeGpipe] */
    size_t inCount;   /* floats of one micro-batch's input to this stage: 0 on stage 0, else
                         the previous stage's outCount */
    size_t outCount;  /* floats of one micro-batch's output: 0 on the last stage, else > 0 */
    /* gvqPipePipedream, Dualpipe, Spectrain: the stage's weights, as ranges the layer copies
     * (versions, predictions), and the trainer's optimizer step on them */
    int weightRanges;                             /* [0] */
    float *const *weights;                        /* weightRanges starts */
    const size_t *weightCounts;                   /* their lengths in floats */
    gvqResult_t (*update)(void *user, int micro); /* apply micro-batch `micro`'s gradients (what
                                                      its backward accumulated) to the weights,
                                                      and clear them */
    /* gvqPipeSpectrain: the stage's gradients, ranges parallel to weights (what a backward
     * accumulated, read before update clears it), and the smoothing gamma of
     * v <- gamma v + (1 - gamma) g [0.9]; the learning rate comes from gvqPipeSetLearningRate */
    float *const *gradients;
    float smoothing;
    int predictDistance; /* gvqPipePredictDistance_t: SpecTrain's s [gvqPredictPaper] */
    int flush;           /* 1: every step ends with its micro-batches' backwards done; 0: the
                            pipeline runs on across steps (above; not gvqPipeGpipe, and needs
                            microBatches >= S - 1) [1] */
    gvqComm_t forwardComm, backwardComm; /* both or neither: overlapped transfers (above), the
                                            same communicators in the same roles on every
                                            stage */
} gvqPipeConfig_t;

#define GVQ_PIPE_CONFIG_INITIALIZER                                                             \
    {                                                                                           \
        sizeof(gvqPipeConfig_t), GVQ_PIPE_CONFIG_MAGIC, GVQ_VERSION, GVQ_CONFIG_UNDEF_INT,      \
            GVQ_CONFIG_UNDEF_INT, 0, 0, 0, NULL, NULL, NULL, NULL, -1.0f, GVQ_CONFIG_UNDEF_INT, \
            GVQ_CONFIG_UNDEF_INT, NULL, NULL                                                    \
    }

/* A stage's work on micro-batch `micro` (0 .. M-1; without a flush 0 .. 2M-1, above). forward: in
 * (inCount floats; NULL on stage 0, which reads its own data) -> out (outCount floats; NULL on the
 * last stage, which computes its loss); it keeps what its backward needs. backward: dout (the error
 * at its output, outCount floats; NULL on the last stage) -> din (the error at its input, inCount
 * floats; NULL on stage 0), accumulating the stage's weight gradients. in and out stay valid and
 * unchanged until the micro-batch's backward returns. A non-gvqSuccess return ends the step with
 * that error on this stage (its neighbours' transfers then fail by the communicator's timeout). */
typedef gvqResult_t (*gvqPipeForwardFn_t)(void *user, int micro, const float *in, float *out);
typedef gvqResult_t (*gvqPipeBackwardFn_t)(void *user, int micro, const float *dout, float *din);

/* Makes this rank's stage of a pipeline over comm (S = its rank count). Collective: the stages
 * exchange their configs, and a mismatch is refused on every stage with gvqInvalidArgument and a
 * WARN naming both sides (microBatches, schedule, flush or overlapped transfers differing,
 * stage k's outCount not stage k+1's inCount, an input on stage 0 or an output on the last
 * stage, a stage whose own arguments were refused: NULL config or pipe, NULL functions, M < 1,
 * M x counts above 2^40, a schedule outside gvqPipeSchedule_t, a PipeDream/DualPipe/SpecTrain
 * stage without update or with weightRanges > 0 but NULL weights or weightCounts (a stage of
 * no weights, weightRanges 0, is accepted), SpecTrain without gradients or with a smoothing outside
 * [0, 1), flush 0 with GPipe or with M < S - 1, only one of forwardComm and backwardComm, one
 * whose ranks are not comm's, or the two swapped on some stages, no memory). */
GVQ_API gvqResult_t gvqPipeCreate(gvqComm_t comm, const gvqPipeConfig_t *config,
                                  gvqPipeForwardFn_t forward, gvqPipeBackwardFn_t backward,
                                  void *user, gvqPipe_t *pipe);

/* Runs one mini-batch through the schedule on this stage (every stage calls it). Returns when
 * this stage's part is done: its weight gradients are complete. Errors: the callbacks', and
 * those of gvqSend/gvqRecv (gvqTimeout when a neighbour stopped); after a failed step the pipe
 * refuses later steps with gvqInvalidUsage (destroy it; gvqCommAbort releases neighbours still
 * waiting on it: abort forwardComm and backwardComm as well with overlapped transfers). */
GVQ_API gvqResult_t gvqPipeStep(gvqPipe_t pipe);

/* gvqPipeStep, but the step starts no forward of the next one: with flush 0, the pipeline is
 * drained when it returns on every stage (no transfer pending, every update made); the next
 * gvqPipeStep fills it again. With flush 1, gvqPipeStep itself. Errors: gvqPipeStep's. */
GVQ_API gvqResult_t gvqPipeStepFlush(gvqPipe_t pipe);

/* The learning rate SpecTrain's prediction uses from the next step on (a schedule's current
 * rate). The layer's v is the damped average v <- gamma v + (1 - gamma) g, as in SpecTrain's
 * paper, whose optimizer steps by lr v; an optimizer with heavy-ball momentum (u <- mu u + g,
 * W <- W - lr u, as PyTorch's SGD) steps by lr u = lr / (1 - mu) v, so pass lr / (1 - mu). Local.
 * Errors: gvqInvalidArgument (not a pipe, lr not finite). */
GVQ_API gvqResult_t gvqPipeSetLearningRate(gvqPipe_t pipe, float lr);

/* How far the weights a DualPipe or SpecTrain task ran on were from the weights this stage
 * actually reached s updates later (s: the task's version distance, as SpecTrain's prediction
 * uses it; SpecTrain's paper measures the same): the root-mean-square difference over the
 * stage's weights, averaged over the tasks measured so far. */
typedef struct {
    long long steps;      /* gvqPipeStep calls that succeeded */
    long long updates;    /* weight updates (update callbacks) so far */
    long long samples;    /* tasks whose target version was reached and measured */
    double rmseStale;     /* mean RMSE of the weights in place before any prediction (DualPipe
                             runs on these) against the weights s updates later */
    double rmsePredicted; /* the same for SpecTrain's W - s lr v (0 without SpecTrain) */
    double rmsStep;       /* mean RMS of one update (the weights' change per update), for scale */
} gvqPipeStats_t;

/* This stage's statistics (local; the RMSE fields stay 0 for GPipe and PipeDream, whose tasks
 * run on the weights of their own version). Errors: gvqInvalidArgument (not a pipe, NULL). */
GVQ_API gvqResult_t gvqPipeGetStats(gvqPipe_t pipe, gvqPipeStats_t *stats);

/* Frees the stage. Local. Forwards of a pipeline without a flush that still wait for their
 * backward are dropped; with overlapped transfers a receive still pending waits for its
 * neighbour's last step, bounded by the communicators' timeout (make the last step
 * gvqPipeStepFlush on every stage: then nothing is pending). Errors: gvqInvalidArgument, and a
 * failed transfer of the last step that no step reported (with a WARN). */
GVQ_API gvqResult_t gvqPipeDestroy(gvqPipe_t pipe);

#ifdef __cplusplus
}
#endif

#endif /* GVQ_TRAIN_H_ */
