/*
 * gvq_comm_nccl.h -- NCCL beside a communicator (comm_nccl.c): the NCCL communicator that runs
 * collectives on CUDA buffers, and the device transport of device-resident compressed rings.
 * Both are set up collectively on first use, and every rank agrees on the outcome. In builds
 * without NCCL there is neither, and callers stage CUDA buffers through host memory.
 */
#ifndef GVQ_COMM_NCCL_H_
#define GVQ_COMM_NCCL_H_

#include "gvq_group.h"

/* Whether comm's collectives on CUDA buffers run on NCCL (GVQ_NCCL): set up on the first call,
 * collectively. The caller has entered the communicator. */
int gvq_comm_nccl_ready(gvqComm_t comm);
/* The collective o (kind GVQ_OP_ALLREDUCE .. GVQ_OP_ALLGATHER) on NCCL, enqueued on o's stream;
 * gvq_comm_nccl_ready(comm) must have said yes. */
gvqResult_t gvq_comm_nccl_collective(const gvq_op_t *o);

#endif /* GVQ_COMM_NCCL_H_ */
