/*
 * gvq_nccl.h -- the NCCL backend (src/transport/nccl/nccl.c, built with GVQ_WITH_NCCL): a NCCL
 * communicator beside a gvq communicator, its native collectives for CUDA device buffers, and a
 * transport ops table whose sends and receives are grouped ncclSend/ncclRecv on a communication
 * stream. No NCCL or CUDA type appears here (streams are void *), so src/ needs no CUDA include
 * path.
 *
 * Bootstrap: rank 0 makes the NCCL unique id (gvq_nccl_get_id) and the gvq communicator's own
 * transport carries it to the other ranks (src/collectives.c, on the first collective whose
 * buffers are CUDA memory), then every rank calls gvq_nccl_init.
 */
#ifndef GVQ_NCCL_H_
#define GVQ_NCCL_H_

#include "gvq_transport.h"

#define GVQ_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

typedef struct gvq_nccl gvq_nccl_t;

typedef enum {
    GVQ_NCCL_ALLREDUCE = 0,
    GVQ_NCCL_BROADCAST,
    GVQ_NCCL_REDUCE,
    GVQ_NCCL_REDUCE_SCATTER,
    GVQ_NCCL_ALLGATHER
} gvq_nccl_coll_t;

/* A new NCCL unique id into id (GVQ_NCCL_ID_BYTES bytes); called on rank 0 only. */
gvqResult_t gvq_nccl_get_id(void *id);
/* ncclCommInitRank on the current CUDA device. */
gvqResult_t gvq_nccl_init(const void *id, int nranks, int rank, gvq_nccl_t **out);
/* ncclCommDestroy, or ncclCommAbort when abort is set (a broken or aborted communicator). */
void gvq_nccl_destroy(gvq_nccl_t *n, int abort);
/* The NCCL collective itself, enqueued on `stream` (a cudaStream_t, NULL: the default stream);
 * returns once enqueued, as NCCL does. gvqAvg is ncclAvg. */
gvqResult_t gvq_nccl_collective(gvq_nccl_t *n, gvq_nccl_coll_t kind, const void *send, void *recv,
                                size_t count, gvqDataType_t dtype, gvqRedOp_t op, int root,
                                void *stream);
/* A transport over n for the ring on device buffers: isend/irecv queue; the first test after
 * posting issues everything queued as one ncclGroupStart/End on the communication stream, after
 * the CUDA device's current stream (so a send reads what the device computed); a request
 * completes when the group's event has fired. Tags are not carried (NCCL matches a pair's
 * messages in issue order). n stays owned by the caller. */
gvqResult_t gvq_nccl_transport_create(gvq_nccl_t *n, gvq_transport_t **t);

#endif /* GVQ_NCCL_H_ */
