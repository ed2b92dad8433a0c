/*
 * gvq_zero_code.h -- zero-code mode (zero_code.c): with GVQ_CODEC=gradiveq|qsgd, a plain float
 * sum/avg gvqAllReduce goes through a compressor attached to the communicator for its
 * (recvbuff, count).
 */
#ifndef GVQ_ZERO_CODE_H_
#define GVQ_ZERO_CODE_H_

#include "gvq_comm.h"

/* *handled = 0 when the call does not qualify (then it runs as a plain allreduce). The caller
 * has entered the communicator. */
gvqResult_t gvq_zero_code_allreduce(gvqComm_t comm, const void *send, void *recv, size_t count,
                                    gvqDataType_t dtype, gvqRedOp_t op, int *handled);

#endif /* GVQ_ZERO_CODE_H_ */
