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

typedef struct gvq_upper_ops gvq_upper_ops_t;

/* A collective or point-to-point call with its arguments. */
typedef struct gvq_op {
    gvq_op_kind_t kind;
    const void *sendbuff;
    void *recvbuff;
    size_t count;
    gvqDataType_t dtype;
    gvqRedOp_t op;
    int root; /* root, or peer for send/recv */
    gvqComm_t comm;
    gvqStream_t stream;           /* for CUDA buffers */
    gvqCompressor_t compressor;   /* GVQ_OP_COMPRESSED */
    const gvq_upper_ops_t *upper; /* set by the layer above that made the call (NULL: comm's) */
} gvq_op_t;

/* Calls of the layer above (src/compress/) that comm's machinery carries: the compressed calls
 * (gvqAllReduceCompressed, GVQ_OP_COMPRESSED) and zero-code mode's plain float allreduce
 * (gvqAllReduce, GVQ_OP_ALLREDUCE). The layer that makes the op sets its table; collectives.c
 * calls it where the op is signed and run. These are the only calls from comm upward, through
 * function pointers (docs/ARCHITECTURE.md, "Calls that go up"). */
struct gvq_upper_ops {
    /* GVQ_OP_COMPRESSED: the call's signature (its own refusal in `refused`) */
    gvq_call_sig_t (*signature)(const gvq_op_t *o, gvqResult_t refused);
    /* GVQ_OP_COMPRESSED: the consecutive calls ops[0..n) of one communicator under one
     * agreement */
    gvqResult_t (*run_group)(const gvq_op_t *ops, size_t n);
    /* GVQ_OP_ALLREDUCE: what its signature carries of the settings (0: none), and the call run
     * by the layer above when it takes it (*handled = 1; else it runs as a plain allreduce) */
    uint64_t (*identity)(gvqDataType_t dtype, gvqRedOp_t op);
    gvqResult_t (*allreduce)(gvqComm_t comm, const void *send, void *recv, size_t count,
                             gvqDataType_t dtype, gvqRedOp_t op, int *handled);
};

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

/* calls.c: check o, then run it, queue it on its host stream, or queue it inside the calling
 * thread's group (what every public call does with its op). */
gvqResult_t gvq_op_submit(const gvq_op_t *o);

/* collectives.c, for calls.c: the public name of each op kind; the bytes o reads from sendbuff
 * and writes to recvbuff; whether it is a collective (not a send or receive); the device that
 * holds its buffers; a refused collective's part in the agreement, so that the other ranks fail
 * at once (when its communicator can carry it); and a batch run: its collectives in order, then
 * all its sends and receives together. */
extern const char *const gvq_op_fn[];
void gvq_op_lengths(const gvq_op_t *o, size_t *slen, size_t *rlen);
int gvq_op_is_collective(const gvq_op_t *o);
const gvq_device_ops_t *gvq_op_device(const gvq_op_t *o);
void gvq_op_refuse_together(const gvq_op_t *o, gvqResult_t res);
gvqResult_t gvq_op_run_batch(const gvq_op_t *ops, size_t n);
/* calls.c: a plain allreduce (o.upper NULL: never through zero-code mode), for the layers
 * above. */
gvqResult_t gvq_allreduce_plain(const void *sendbuff, void *recvbuff, size_t count,
                                gvqDataType_t datatype, gvqRedOp_t op, gvqComm_t comm,
                                gvqStream_t stream);

#endif /* GVQ_GROUP_H_ */
