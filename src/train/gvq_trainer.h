/*
 * gvq_trainer.h -- the training layer's handle, shared by trainer.c (routes, steps) and
 * trainer_save.c (its saved state).
 */
#ifndef GVQ_TRAINER_H_
#define GVQ_TRAINER_H_

#include <pthread.h>

#include "gvq_train_below.h"
#include "gvq_train.h"

struct gvq_train_sparse; /* trainer_sparse.c */

typedef struct {
    gvqTrainVariableInfo_t info;
    struct gvq_train_sparse *sp; /* a sparse variable's table, rule and route; else NULL */
    int shape[4];
    gvqCompressorConfig_t ccfg; /* its codec (has_ccfg) */
    int has_ccfg;
    gvqCompressor_t comp;
    size_t bucket_off; /* floats into its bucket */
    int fused;         /* its fused tracked-basis group (a bucket of fused kind), or -1 */
    float *grad;       /* this step's buffer; NULL: not ready yet */
    /* sufficient factors (gvqTrainFactorsReady) */
    int factors;          /* registered with factors */
    int sfb_now;          /* this step goes by SFB */
    const float *fu, *fv; /* this step's factors, fbatch rows each */
    int fbatch;
    float *all_u, *all_v; /* every rank's factors, gathered */
    size_t cap_u, cap_v;  /* floats they hold */
    int unit;             /* its unit of issue (trainer_plan.c), or -1 (sparse) */
} tvar_t;

typedef struct {
    int *members; /* variable ids, in registration order */
    int nmembers, pending;
    size_t count;
    float *buf; /* NULL for a fused group: its members' compressed calls in one gvqGroupEnd */
    int fused;
    double start, end;
} tbucket_t;

/* A unit of issue (trainer_plan.c): a variable alone, a bucket or the fused group. */
typedef struct {
    int var, bucket;   /* a variable alone, or a bucket (plain or fused); the other -1 */
    int prio;          /* its highest variable id: the forward pass needs it the soonest */
    size_t count;      /* floats */
    int nchunks;       /* > 1 only for a plain allreduce longer than chunkBytes (negotiated) */
    int ready;         /* this step: every member handed over (atomic: the progress thread reads) */
    int issued;        /* ready schedule: this step's chunks queued */
    gvqEvent_t done;   /* ready schedule: recorded after its last chunk (NULL: calls run inline) */
    int completed;     /* negotiated: its aggregation is done (under the layer's lock) */
    int left;          /* negotiated, progress thread: chunks still to run */
    int agreed;        /* negotiated, progress thread: ready on every rank */
    int dead;          /* negotiated, progress thread: some rank closed its step without it */
    int seen;          /* negotiated, progress thread: some rank had it ready */
    double start, end; /* this step: its first chunk's start, its last one's end */
} tunit_t;

struct gvqTrainer {
    uint32_t magic;
    gvqComm_t comm;
    int nranks, rank;
    gvqStream_t stream;
    size_t bucket_bytes;
    int wait_free;
    int sfb;             /* -1: SACP, 0: never, 1: always */
    int sparse_route;    /* -1: Parallax's rule, else the gvqRoute_t of every sparse variable */
    int tune_partitions; /* run the partition tuner before making a sparse variable's PS */
    gvqRedOp_t op;
    gvqCompressorConfig_t conv_cfg, fc_cfg;
    int has_conv_cfg, has_fc_cfg;
    tvar_t *vars;
    int nvars, cap;
    tbucket_t *buckets;
    int nbuckets;
    int committed;
    int inline_calls;        /* the transport cannot run calls from two threads: every
                                aggregation runs at once on the caller's thread */
    gvqResult_t issue_error; /* the step's first refusal at issue */
    /* the order of issue (trainer_plan.c) */
    int schedule;       /* gvqTrainSchedule_t */
    size_t chunk_bytes; /* 0: units are never cut */
    int negotiate;      /* the negotiated schedule runs (forward, waitFree, a progress thread) */
    tunit_t *units;
    int nunits;
    int job_queued;       /* this step's negotiating job is on the stream */
    int closed;           /* gvqTrainWaitAll was called: nothing more becomes ready (atomic) */
    float *stage;         /* a chunk and the ready flags, allreduced together */
    pthread_mutex_t lock; /* the units' completed, job_over and job_res */
    pthread_cond_t cond;
    int job_over;
    gvqResult_t job_res;
    long steps; /* steps ended (the negotiation compares them across ranks) */
};

/* The registry of live layers (trainer_handle.c): add, remove (0: was not live), and check that
 * trainer is live (WARN naming fn otherwise). */
gvqResult_t gvq_train_register(gvqTrainer_t trainer);
int gvq_train_unregister(gvqTrainer_t trainer);
gvqResult_t gvq_train_check(const char *fn, gvqTrainer_t trainer);
/* The checks of a call inside a step: a live, committed layer whose communicator is live, and
 * the caller outside a group (the layer's own collectives would be queued into it). */
gvqResult_t gvq_train_check_step(const char *fn, gvqTrainer_t trainer);
/* The layer's communicator is live and the caller outside a group (the layer's own collectives
 * would be queued into it). */
gvqResult_t gvq_train_check_comm(const char *fn, gvqTrainer_t trainer);
/* "conv", "fc", "sparse" or "dense" */
const char *gvq_train_kind_name(int kind);
/* A hash of variables [0, upto): names, kinds, shapes. */
uint64_t gvq_train_variables_hash(const gvqTrainer_t trainer, int upto);

/* The order of issue (trainer_plan.c): the units at commit (and freeing them), a unit ready
 * (queued now, or picked by the negotiation; the first refusal of what it queued), the step
 * closed (at gvqTrainWaitAll), the step's end, and the wait for one unit. trainer_run.c's
 * gvq_train_issue queues one chunk (whole: 0 of 1). */
gvqResult_t gvq_train_plan_commit(gvqTrainer_t trainer);
void gvq_train_plan_free(gvqTrainer_t trainer);
gvqResult_t gvq_train_plan_ready(gvqTrainer_t trainer, int unit);
void gvq_train_plan_close(gvqTrainer_t trainer);
void gvq_train_plan_end_step(gvqTrainer_t trainer);
gvqResult_t gvq_train_plan_wait(const char *fn, gvqTrainer_t trainer, int unit);
gvqResult_t gvq_train_issue(gvqTrainer_t trainer, int unit, int chunk);
/* Chunk c of unit u: [*off, *off + *count) of its floats (even chunks, the last one shorter). */
static inline void gvq_train_chunk_span(const tunit_t *u, int c, size_t *off, size_t *count) {
    size_t per = (u->count + (size_t)u->nchunks - 1) / (size_t)u->nchunks;
    *off = (size_t)c * per;
    *count = *off + per <= u->count ? per : u->count - *off;
}
/* Seconds of the monotonic clock (the layer's timeline). */
static inline double gvq_train_now(void) {
    return 1e-9 * (double)gvq_now_ns();
}
/* The negotiated schedule runs units itself: a plain one's floats (a bucket packed), its end (a
 * bucket unpacked, bytes and times), or a unit whole (compressed, fused, factors). */
float *gvq_train_unit_data(gvqTrainer_t trainer, int unit);
void gvq_train_unit_finish(gvqTrainer_t trainer, int unit);
gvqResult_t gvq_train_unit_run(gvqTrainer_t trainer, int unit);

/* Sparse variables (trainer_sparse.c): registration (its config checked and kept), the tables
 * at commit (and undoing them), the queued apply before the step's wait and the replicas'
 * rule after it, the bytes sent, and freeing. */
gvqResult_t gvq_train_sparse_add(gvqTrainer_t trainer, tvar_t *x, const gvqPsConfig_t *cfg);
gvqResult_t gvq_train_sparse_commit(gvqTrainer_t trainer);
void gvq_train_sparse_uncommit(gvqTrainer_t trainer);
void gvq_train_sparse_before_wait(gvqTrainer_t trainer);
void gvq_train_sparse_after_wait(gvqTrainer_t trainer, gvqResult_t waited);
unsigned long long gvq_train_sparse_wire(const tvar_t *x);
void gvq_train_sparse_free(tvar_t *x);
/* A sparse variable's part of the layer's saved state (0 bytes for the others): its size, the
 * save, the check that changes nothing, and the load of a checked part (collective when it makes
 * the variable's parameter server). */
gvqResult_t gvq_train_sparse_state_bytes(const tvar_t *x, size_t *n);
gvqResult_t gvq_train_sparse_save(const tvar_t *x, void *out, size_t n);
gvqResult_t gvq_train_sparse_check(const tvar_t *x, const void *blob, size_t n);
gvqResult_t gvq_train_sparse_load(gvqTrainer_t trainer, tvar_t *x, const void *blob, size_t n);

#endif /* GVQ_TRAINER_H_ */
