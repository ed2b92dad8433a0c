/*
 * gvq_pipeline.h -- a pipeline stage (gvqPipe_t) as its two files share it: pipeline_create.c
 * makes, checks and frees it, pipeline.c runs its steps.
 */
#ifndef GVQ_PIPELINE_H_
#define GVQ_PIPELINE_H_

#include "gvq_trainer.h"

#define PIPE_MAGIC 0x67767050u

enum { PIPE_F_SEND, PIPE_F_RECV, PIPE_B_SEND, PIPE_B_RECV };

struct gvqPipe {
    uint32_t magic;
    gvqComm_t comm;
    int stage, nstages, micro, schedule;
    size_t in_count, out_count;
    gvqPipeForwardFn_t forward;
    gvqPipeBackwardFn_t backward;
    void *user;
    float *in, *out, *din, *dout; /* nslots x in_count / out_count each */
    int nslots;                   /* micro-batch g uses slot g mod nslots: M, or 2M without flush */
    int flush;                    /* config flush */
    long long base;               /* the first micro-batch of the current step */
    long long wbase;              /* the first micro-batch of the last warm-up */
    int warm; /* forwards of the next step already made (0, or w without a flush) */
    long long pre_fwd, pre_bwd; /* the next step's first forward and backward whose input's
                                   receive the last step made (or posted); -1: none */
    struct pipe_task {
        int fwd;
        long long g;
    } * tasks; /* one step's, in order */
    /* overlapped transfers: activations on fcomm/fstream, errors on bcomm/bstream; per slot,
     * events after the group that receives its input or sends its output */
    gvqComm_t fcomm, bcomm;
    gvqStream_t fstream, bstream;
    /* GVQ_PIPE_LINKS=1: a communicator of its own per link and direction, split
     * from fcomm and bcomm at create (the pipe's, NULL at the ends), each with a stream, so a
     * send waits for nothing but its own receiver: PIPE_F_SEND (activations to stage + 1),
     * PIPE_F_RECV (from stage - 1), PIPE_B_SEND (errors to stage - 1), PIPE_B_RECV (from
     * stage + 1). fstream and bstream then run only agree_roles. */
    int links;
    gvqComm_t lcomm[4];
    gvqStream_t lstream[4];
    gvqEvent_t *ev; /* 4 x nslots: in, out, dout, din */
    long long steps;
    gvqResult_t failed; /* a step that failed: later steps are refused */
    /* gvqPipePipedream: the weights (copied range list), their versions and the update */
    int nw;
    float **wptr;
    size_t *wlen, wtotal;
    int nversions;
    long long *version_at;  /* PipeDream: the update count when version slot v was taken */
    int predicted;          /* SpecTrain: a prediction is in the ranges, the weights in current */
    float *stash, *current; /* nversions x wtotal, wtotal */
    gvqResult_t (*update)(void *user, int micro);
    /* gvqPipeSpectrain: the gradient ranges, the smoothed gradient v, gamma and lr */
    float **gptr;
    float *v;
    float gamma, lr;
    int predict_distance; /* gvqPipePredictDistance_t */
    /* DualPipe and SpecTrain: tasks waiting for the weights of their target version */
    struct pipe_rec {
        long long target; /* the update count whose weights it is compared with; 0: free */
        float *stale, *pred;
    } * recs;
    int nrecs;
    float *prev; /* the weights before the last update */
    long long updates, samples, steps_rms;
    double sum_stale, sum_pred, sum_step;
};

/* pipeline_create.c: w, the forwards stage k makes ahead of its backwards in the 1F1B family,
 * min(S-k-1, M); p live and its communicator usable (a WARN naming fn otherwise); the weights'
 * ranges into buf (to_ranges 0) or back (1). */
int gvq_pipe_warm_of(const gvqPipe_t p);
gvqResult_t gvq_pipe_check(const char *fn, gvqPipe_t p);
void gvq_pipe_copy_weights(gvqPipe_t p, float *buf, int to_ranges);

#endif /* GVQ_PIPELINE_H_ */
