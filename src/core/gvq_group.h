/*
 * gvq_group.h -- one queued call and the calling thread's group (group.c): between
 * gvqGroupStart and gvqGroupEnd the public calls are checked and queued here; collectives.c
 * runs the queue at the outermost end.
 */
#ifndef GVQ_GROUP_H_
#define GVQ_GROUP_H_

#include "gvq_comm.h"

typedef enum {
    GVQ_OP_ALLREDUCE,
    GVQ_OP_BROADCAST,
    GVQ_OP_REDUCE,
    GVQ_OP_REDUCE_SCATTER,
    GVQ_OP_ALLGATHER,
    GVQ_OP_SEND,
    GVQ_OP_RECV,
    GVQ_OP_COMPRESSED /* gvqAllReduceCompressed (compressed_call.c runs it) */
} gvq_op_kind_t;

/* A collective or point-to-point call with its arguments. */
typedef struct {
    gvq_op_kind_t kind;
    const void *sendbuff;
    void *recvbuff;
    size_t count;
    gvqDataType_t dtype;
    gvqRedOp_t op;
    int root; /* root, or peer for send/recv */
    gvqComm_t comm;
    gvqStream_t stream;         /* for CUDA buffers */
    gvqCompressor_t compressor; /* GVQ_OP_COMPRESSED */
} gvq_op_t;

/* The calling thread's group. */
typedef struct {
    int depth;     /* open gvqGroupStart calls */
    gvq_op_t *ops; /* queued calls, in call order */
    size_t n, cap;
    gvqResult_t error;    /* the first refused call's result */
    char error_text[256]; /* and its WARN line */
} gvq_group_t;

gvq_group_t *gvq_group_self(void);
/* Queue o (gvqSystemError, remembered as the group's error, when memory runs out). */
gvqResult_t gvq_group_push(gvq_group_t *g, const gvq_op_t *o);
/* Remember a refused call: its result and the last WARN, unless one is remembered already. */
void gvq_group_refuse(gvq_group_t *g, gvqResult_t res);
/* Empty the queue and forget the error (frees the queue: the thread may end). */
void gvq_group_clear(gvq_group_t *g);

/* compressed_call.c: a compressed call's signature (its own refusal in `refused`), and the
 * consecutive compressed calls ops[0..n) of one communicator run under one agreement, the
 * tracked-basis ones on host buffers fused into one call of three rings. */
gvq_call_sig_t gvq_compressed_signature(const gvq_op_t *o, gvqResult_t refused);
gvqResult_t gvq_compressed_run_group(const gvq_op_t *ops, size_t n);

#endif /* GVQ_GROUP_H_ */
